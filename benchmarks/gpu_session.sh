#!/usr/bin/env bash
# Every open GPU measurement in one call (issues 12 and 14), for a lent GPU machine with a short
# time budget. Run from the repository root:
#
#     OUT=/some/dir bash benchmarks/gpu_session.sh
#
# Needs python3 with torch (CUDA) and jax (CUDA); packages the GPU image lacks (open_clip_torch,
# ftfy, wcwidth, array_api_compat) are installed from wheels in ./.whl if that folder exists
# (`pip download --no-deps -d .whl open_clip_torch ftfy wcwidth array_api_compat` beforehand; the
# machine has no network). Writes into $OUT: env.txt, mc.md / mc.log (Monte-Carlo engine, 10^6
# seeds, with the per-program split), cuda_tests.log (the gate kernels' decisions on the GPU against
# the literal loop), ad.md / ad.log (ViT-L-14-336 steps, gates and targets). Nothing is written
# into benchmarks/RESULTS.md: copy the tables there with the card's name.
# Each step has its own timeout so that a slow one cannot eat the others' time; together they stay
# under the device tool's 10-minute limit per command (9 min at most).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:?set OUT to a folder for the results}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  git log --oneline -1 2>/dev/null
  python3 -c "import sys, jax, torch; print(sys.version); print('jax', jax.__version__, jax.devices()); print('torch', torch.__version__)"
  python3 -c "import triton; print('triton', triton.__version__)"
} 2>&1 | tee "$OUT/env.txt"

# 1. Monte-Carlo engine (issue 14): both paths at 10^6 seeds, then one chunk split by program.
#    Issue 22: the sufficient path also as an on-device summary (rows "summary on device"); targets
#    <= 0.5 s per-seed, <= 0.2 s summary, first call <= 20 s. The second line: larger chunks
#    (fewer matching loop trips per seed on a GPU), sufficient path only via --chunk.
timeout 110 python3 benchmarks/gpu_montecarlo.py --profile --out "$OUT/mc.md" 2>&1 | tee "$OUT/mc.log"
timeout 90 python3 benchmarks/gpu_montecarlo.py --chunk 524288 --no-write 2>&1 | tee "$OUT/mc_chunk512k.log"

# 2. Exact sequential gate on the GPU (issue 12): Triton kernel and JAX scan vs the literal loop.
JAX_PLATFORMS=cuda,cpu timeout 90 python3 -m pytest -q -p no:cacheprovider \
    tests/adsim/test_adsim_gate_triton.py tests/adsim/test_adsim_gate.py -k "cuda" 2>&1 \
    | tail -15 | tee "$OUT/cuda_tests.log"

# 3. adsim at ViT-L-14-336 (issues 12, 14), B = 16: eager steps, gates (JAX; Triton chords and dots kernels,
#    6 rows of a warps sweep, ~1-3 s each with its compile), then the compiled steps (CUDA graphs; ~1 min
#    of compilation each, not yet measured), targets. Every row is printed to ad.log as it is measured,
#    so a timeout during the compiled steps keeps the rows before it.
timeout 360 python3 benchmarks/gpu_adsim.py --results "$OUT/ad.md" --warmup 2 --iters 6 \
    --skip-literal --batch-sizes 16 --sweep 2>&1 | grep -v "^WARNING:root" | tee "$OUT/ad.log"

# 4. The baselines at ViT-L-14-336, B = 16: inference of the head, WinCLIP, AnomalyCLIP, APRIL-GAN, then one
#    training step (forward, loss, backward) of the head and of every registered trainer.
timeout 120 python3 benchmarks/adsim_baselines.py --backbones ViT-L-14-336 --device cuda --batch 16 --iters 5 \
    2>&1 | grep -v "^WARNING:root" | tee "$OUT/baselines.log"
timeout 120 python3 benchmarks/adsim_baselines.py --backbones ViT-L-14-336 --device cuda --batch 16 --iters 5 \
    --train-step 2>&1 | grep -v "^WARNING:root" | tee "$OUT/baselines_step.log"
