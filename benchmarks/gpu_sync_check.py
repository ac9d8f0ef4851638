"""Training steps of every method and gate on a CUDA GPU under ``torch.cuda.set_sync_debug_mode("error")``:
a step that synchronises the host with the GPU raises, except the documented host reads
(``tests/adsim/test_adsim_step_syncs.py``), which are expected to raise here. Tiny backbone (a functional
check, not a timing). Appends ``name|measured|target|ok`` rows to ``--targets``. Not a test.

    python benchmarks/gpu_sync_check.py --targets /tmp/targets.txt
"""
from __future__ import annotations

import argparse
import inspect
import sys
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "adsim")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--targets", required=True)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_sync_check: needs CUDA", file=sys.stderr)
        return 1
    from test_adsim_step_syncs import CASES, _batches, _setup  # the tests' cases and set-up

    from adsim.model.backbone import build_backbone
    from adsim.training.train import _epoch_steps, make_optimizer, train_epoch

    warnings.simplefilter("ignore")
    lines, first = inspect.getsourcelines(_epoch_steps)
    epoch_end = next(f"train.py:{first + i}" for i, line in enumerate(lines)
                     if line.strip().startswith("return {\"steps\""))
    dev = torch.device("cuda")
    tiny = build_backbone("tiny", seed=0, device=dev)
    rows = []
    for recipe, over, expected in CASES:
        name = f"{recipe} {'/'.join(over.values()) or '(recipe)'}"
        try:
            cfg, module, forward, loss_fn = _setup(tiny, recipe, over)
            module = module.to(dev)
            opt = make_optimizer(cfg, module)
            scaler = torch.amp.GradScaler("cuda", enabled=False)
            batches = [{k: v.to(dev) for k, v in b.items()} for b in _batches(tiny.spec, 2)]
            train_epoch(cfg, module, opt, scaler, batches[:1], forward, tiny.spec.grid, dev, torch.bfloat16,
                        loss_fn=loss_fn)  # warm-up (Triton/JAX compilation, optimiser state)
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("warn")
            try:  # one step without its epoch's end (which reads the means: syncs by design)
                from adsim.model.head import deferred_finite_checks
                with warnings.catch_warnings(record=True) as caught, deferred_finite_checks() as pending:
                    warnings.simplefilter("always")
                    _epoch_steps(cfg, module, opt, scaler, batches[1:], lambda x: forward(x), tiny.spec.grid, dev,
                                 torch.bfloat16, "sync", False, None, loss_fn, pending)
                    torch.cuda.set_sync_debug_mode(0)
                    pending.flag = None
                # each synchronising call is reported with the Python line that made it, except the
                # return of _epoch_steps: it reads the epoch's means (the epoch's end, a host read by design)
                sites = sorted({f"{Path(w.filename).name}:{w.lineno}" for w in caught
                                if "synchroniz" in str(w.message)} - {epoch_end})
                syncs = f"sync at {', '.join(sites)}" if sites else "none"
            finally:
                torch.cuda.set_sync_debug_mode(0)
        except Exception as err:  # noqa: BLE001 - a failing method is a row
            syncs = f"error: {type(err).__name__}: {str(err).splitlines()[0][:80] if str(err) else ''}"
        ok = (syncs == "none") == (expected == 0)
        rows.append(f"sync debug mode, one step: {name}|{syncs}|{'no sync' if expected == 0 else 'documented sync'}|"
                    f"{'yes' if ok else 'NO'}")
        print(rows[-1], flush=True)
    with open(args.targets, "a") as f:
        f.write("".join(r + "\n" for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
