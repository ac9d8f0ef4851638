#!/usr/bin/env bash
# Every open GPU measurement and everything a user runs, in one call, for a lent GPU machine with a
# short time budget. Run from the repository root:
#
#     OUT=/some/dir bash benchmarks/gpu_session.sh
#
# Needs python3 with torch (CUDA) and jax (CUDA); packages the GPU image lacks (open_clip_torch,
# ftfy, wcwidth, array_api_compat, platformdirs, filelock) are installed from wheels in ./.whl if that folder exists
# (`pip download --no-deps -d .whl open_clip_torch ftfy wcwidth array_api_compat platformdirs filelock`; the
# machine has no network). Writes into $OUT: env.txt, mc.md / mc.log (Monte-Carlo engine, 10^6
# seeds, with the per-program split), cuda_tests.log (the gate kernels' decisions on the GPU against
# the literal loop), ad.md / ad.log (ViT-L-14-336 steps, gates and targets), e2e.log (toy data, train
# eager and default-mode for every method, eval, predict, an engine run on all local devices) and
# targets.md: ONE table of every target, measured vs target, met or not (also printed last). Nothing is
# written into benchmarks/RESULTS.md: copy the tables there with the card's name.
# The toy data and run folders of section 4 go to $E2E_DIR (default /tmp/adsim_e2e), not $OUT: the device
# tool brings back at most 8 files (call 1 writes 8 into $OUT, call 2 seven).
# The engine's rows are compared with the workplace's JAX anchor (../shared/anchors/jax_da_anchor.py, run by
# gpu_montecarlo.py in the same run on the same card; ANCHORS=DIR points elsewhere). The device tool copies the
# repository only: put a transient copy in the git-ignored .anchors/ and carry it (never commit it):
#     mkdir -p .anchors && cp ../shared/anchors/jax_da_anchor.py .anchors/   # here, before the device call
#     run(command="ANCHORS=.anchors OUT=$OUT SECTIONS='mc ad' bash benchmarks/gpu_session.sh", carry=[".anchors"])
# Each section has its own timeout so that a slow one cannot eat the others' time. A session's 15 minutes
# of device time hold two calls on one warm machine (the start-up, 1-2 minutes, counts too):
#
#     SECTIONS="gate sync exact ad" bash benchmarks/gpu_session.sh   # env 10 + 60 + 60 + 60 + 240 s = 430 s at most
#     SECTIONS="e2e bl" bash benchmarks/gpu_session.sh               # env 10 + 300 + 60 + 60 + 120 s = 550 s at most
#
# Both calls write a warm compile cache (adsim.runtime.compile_cache) into $HOME's cache: the second call's
# compiled steps are its warm measurement. The targets table prints even when a section is cut (trap).
#
# The engine / anchor ratios, the compiled exact step, every Table-1 method and the ViT-L cell take two calls of
# up to ~550 s each (SECTIONS="mc ad": 10 + 120 + 180 + 240 s; SECTIONS="cell bl": 10 + 300 + 240 s): more than
# one session's 15 minutes of device time with its start-up, so one call per session, "mc ad" first.
# (measured on an H200, 2026-11-26: the first call took 400 s with its ad section cut short at 210 s, the
# e2e section needed ~300 s at 60 s per command and did not finish, "bl" took 60 s). SECTIONS="mc gate ad
# e2e" (the default) runs the four in one call (up to 700 s: over one call's 600 s, so name the sections);
# "bl" adds the baselines' costs (section 5); "mcchunk" a 524,288-seed chunk of the engine (its compilation
# alone outlasted 60 s on the H200).
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
SECTIONS=${SECTIONS:-mc gate ad e2e}
TARGETS="$OUT/targets.txt"
: > "$TARGETS"
trap 'python3 benchmarks/gpu_targets.py "$TARGETS" | tee "$OUT/targets.md"' EXIT
on() { [[ " $SECTIONS " == *" $1 "* ]]; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  git log --oneline -1 2>/dev/null
  python3 -c "import sys, jax, torch; print(sys.version); print('jax', jax.__version__, jax.devices()); print('torch', torch.__version__)"
  python3 -c "import triton; print('triton', triton.__version__)"
} 2>&1 | tee "$OUT/env.txt"

# 1. Monte-Carlo engine: both paths at 10^6 seeds, per seed and as an on-device summary (rows "summary on
#    device"; targets <= 0.5 s per seed, <= 0.2 s summary, first call <= 20 s), then one chunk split by
#    program; section "mcchunk" tries larger chunks (fewer matching-loop trips per seed), sufficient path only.
on mc && timeout 120 python3 benchmarks/gpu_montecarlo.py --profile --out "$OUT/mc.md" \
    --anchor "${ANCHORS:-../shared/anchors}/jax_da_anchor.py" 2>&1 | tee "$OUT/mc.log"
# 1b. Compile once per machine and the user-facing frame: two fresh processes share a new program store
#    (POOLSIM_CACHE_DIR); each times its first and second `experiments.run` (10^6 seeds, sufficient path,
#    frame built: target <= 2 s once compiled), cold store then warm (targets <= 20 s / <= 5 s), split into
#    start-up, store loads, compiles, the run and the frame (benchmarks/engine_first_call.py).
on mc && timeout 180 python3 benchmarks/engine_first_call.py --seeds 1000000 --chunk 131072 --timeout 85 \
    --targets "$TARGETS" 2>&1 | tee -a "$OUT/mc.log"
on mcchunk && timeout 120 python3 benchmarks/gpu_montecarlo.py --chunk 524288 --no-write 2>&1 | tee "$OUT/mc_chunk512k.log"

# 2. Exact sequential gate on the GPU: Triton kernels (the default "auto" = dots for the EMA, chords for
#    slerp, and each kernel by name) and JAX scan vs the literal loop.
if on gate; then
    JAX_PLATFORMS=cuda,cpu timeout 60 python3 -m pytest -q -p no:cacheprovider -p no:benchmark -o addopts="" \
        tests/adsim/test_adsim_gate_triton.py tests/adsim/test_adsim_gate.py -k "cuda" 2>&1 \
        | tail -15 | tee "$OUT/cuda_tests.log"
    tail -1 "$OUT/cuda_tests.log" | grep -q " passed" && ! tail -1 "$OUT/cuda_tests.log" | grep -q "failed" \
        && ok=yes || ok=NO
    echo "gate kernels on CUDA equal the literal loop (pytest -k cuda)|$(tail -1 "$OUT/cuda_tests.log")|all pass|$ok" \
        >> "$TARGETS"
fi

# 3. adsim at ViT-L-14-336, B = 16: eager steps, gates (JAX; Triton chords and dots kernels, 6 rows of a
#    warps sweep, ~1-3 s each with its compile), then the steps in the default mode on CUDA (compiled,
#    reduce-overhead: bare, naive, matching+VACA with the batched and the exact gate; their compile time
#    is a row of its own), targets (also into targets.txt). Every row is printed to ad.log as it is
#    measured, so a timeout during the compiled steps keeps the rows before it.
on ad && timeout 240 python3 benchmarks/gpu_adsim.py --results "$OUT/ad.md" --warmup 2 --iters 6 \
    --skip-literal --batch-sizes 16 --sweep --targets "$TARGETS" 2>&1 | grep -v "^WARNING:root" | tee "$OUT/ad.log"

# 4. End to end, what a user runs (tiny backbone: a functional check; ViT-L's timings are section 3):
#    make-toy-bmad (480 PNGs at 256 px, timed), train in the default mode (eager) and compiled
#    (--compile default: inductor, no CUDA graphs; 75 s per compiled command, 45 s per other command) for
#    naive, match (batched and exact gate), anomalyclip and bilora, eval and predict of the default
#    recipe's run, and the Monte-Carlo engine on all local devices; one row per check into targets.txt,
#    written as it is checked.
on e2e && rm -rf "${E2E_DIR:-/tmp/adsim_e2e}" && timeout 300 python3 benchmarks/gpu_e2e.py --out "${E2E_DIR:-/tmp/adsim_e2e}" --targets "$TARGETS" --timeout 45 \
    --compile default --compile-timeout 75 --n-per-class 16 --size 256 --image-size 64 --seeds 100000 2>&1 \
    | grep -v "^WARNING:root" | tee "$OUT/e2e.log"

# 5. The baselines at ViT-L-14-336, B = 16 (not in the default SECTIONS: run it with e2e in the second
#    call): inference of the head, WinCLIP, AnomalyCLIP, APRIL-GAN, AdaCLIP, Mao et al. and BiLoRA, then one
#    training step (forward, loss, backward) of the head, BiLoRA and every registered trainer.
on bl && timeout 60 python3 benchmarks/adsim_baselines.py --backbones ViT-L-14-336 --device cuda --batch 16 \
    --iters 5 2>&1 | grep -v "^WARNING:root" | tee "$OUT/baselines.log"
on bl && timeout 60 python3 benchmarks/adsim_baselines.py --backbones ViT-L-14-336 --device cuda --batch 16 \
    --iters 5 --train-step 2>&1 | grep -v "^WARNING:root" | tee "$OUT/baselines_step.log"
# 5b. BiLoRA compiled across its domains (train --recipe bilora, 3 domains, --compile auto = reduce-overhead):
#    graphs compiled per domain (target: 0 after the first) and compile seconds, in a cold-cache process and
#    a warm second process (tiny backbone: the graph count does not depend on it; 55 s per process). The
#    ViT-L-14-336 version (minutes cold): SECTIONS=blvit, not in the two calls above.
on bl && timeout 120 python3 benchmarks/adsim_bilora_compile.py --device cuda --mode auto --timeout 55 \
    --targets "$TARGETS" 2>&1 | grep -v "^WARNING:root" | tee "$OUT/bilora_compile.log"
on blvit && timeout 400 python3 benchmarks/adsim_bilora_compile.py --backbone ViT-L-14-336 --device cuda \
    --mode auto --batch 4 --timeout 190 --targets "$TARGETS" 2>&1 | grep -v "^WARNING:root" \
    | tee "$OUT/bilora_compile_vitl.log"

# 6. Host syncs: one training step of every method and gate under torch.cuda.set_sync_debug_mode("error").
on sync && timeout 60 python3 benchmarks/gpu_sync_check.py --targets "$TARGETS" 2>&1 | grep -v "^WARNING:root" \
    | tee "$OUT/sync.log"

# 7. The exact vs batched post-adapter step, profiled (phases, host syncs, aten ops). CPU profile only today:
#    benchmarks/adsim_exact_step.py runs its child on CPU tensors.
on exact && timeout 60 python3 benchmarks/adsim_exact_step.py --batch 16 --iters 3 --out "$OUT/exact.md" 2>&1 \
    | tee "$OUT/exact.log"

# 8. One Table-1 cell end to end at ViT-L-14-336 (random weights: times only): the default recipe's train (2
#    epochs, the first the warm-up) and eval on a toy copy, seconds per epoch and per cell, and the grid's
#    projected hours on one GPU and over the machine's GPUs (--executor processes). The projection uses the
#    toy's image counts unless CELL_DATA names a BMAD copy; it is labelled so.
on cell && timeout 300 python3 benchmarks/gpu_cell.py --backbone ViT-L-14-336 --device cuda --epochs 2 \
    --out "${E2E_DIR:-/tmp/adsim_e2e}/cell" ${CELL_DATA:+--data "$CELL_DATA"} --targets-file "$TARGETS" 2>&1 \
    | grep -v "^WARNING:root" | tee "$OUT/cell.log"

# 9. The engine at large K on the device (issue 42): Ks = (10, K) for K = 10^3 ... 10^6 at 1,000 seeds, sufficient
#    statistics, the default budget (3/4 of the device's free memory): first and warm seconds, device peak, the
#    slope in K, and the K = 10^6 target row. Not in the two calls above; ~120 s on a CPU at K <= 10^5.
on bigk && timeout 240 python3 benchmarks/gpu_bigk.py --seeds 1000 --targets "$TARGETS" 2>&1 | tee "$OUT/bigk.log"

# The table of every target (measured vs target, met or not) prints from the EXIT trap above.
