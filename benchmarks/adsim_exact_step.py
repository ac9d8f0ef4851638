"""Where the exact sequential gate's training step spends its time, against the batched gate's: a CPU
profile on ViT-L-sized random features. Not a test.

No backbone: the adapter bottlenecks are random leaf tensors of ViT-L-14-336's shapes at the recipe's
238 px (L = 4 layers, B images, N = 17 x 17 = 289 patches, E = 768), so the step measured is everything
after the adapters -- VACA and text scoring (``adsim.model.head.features_from_bottlenecks``), the
objective (``adsim.model.objective.objective``: matching gate, centroid trajectory, ``L_intra`` /
``L_inter``, Dice / Focal / BCE) and the backward pass -- for the batched gate and the exact gate
(EMA and slerp). Every call starts from the same centroid state.

Per step kind it reports: the median wall time; the split by phase (``torch.profiler`` with
``record_function`` ranges put around the gate's pieces by this script: the gate's decisions -- the
JAX scan on the CPU, with its torch -> NumPy -> JAX -> torch copies --, the EMA trajectory or the
slerp replay, the rest of the forward, the backward); the number of host synchronisations the step
asks for (aten ``_local_scalar_dense`` / ``item`` / ``nonzero`` / ``is_nonzero`` calls, the reads that
stall a GPU stream); and the number of compute aten ops (kernel launches on a GPU).

``--baseline REV`` also measures a git revision (exported with ``git archive``) in its own child process,
the rounds alternating, so a change of machine load hits both.

    python benchmarks/adsim_exact_step.py --batch 16 --iters 5 --out benchmarks/results/adsim_exact_step.md
    python benchmarks/adsim_exact_step.py --batch 2 --iters 1 --no-write      # smoke run
    python benchmarks/adsim_exact_step.py --kinds batched "exact, EMA"        # without the slerp replay
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from adsim_step import cpu_name  # the sibling script (benchmarks/ is on sys.path when a script runs)

ROOT = Path(__file__).resolve().parents[1]
KINDS = {"batched": dict(gate_mode="batched", update="ema"),
         "exact, EMA": dict(gate_mode="sequential", update="ema"),
         "exact, slerp": dict(gate_mode="sequential", update="slerp")}
SYNC_OPS = ("_local_scalar_dense", "item", "nonzero", "is_nonzero", "equal")
# aten ops that only allocate or change metadata (no kernel on a GPU)
_NO_KERNEL = {"as_strided", "empty", "empty_strided", "empty_like", "view", "_unsafe_view", "_reshape_alias",
              "reshape", "expand", "slice", "select", "t", "transpose", "unsqueeze", "squeeze", "permute",
              "alias", "detach", "to", "resolve_conj", "resolve_neg", "promote_types", "result_type",
              "scalar_tensor", "lift_fresh", "resize_", "unbind", "split", "narrow", "contiguous", "_to_copy",
              "clone", "copy_", "lift_fresh_copy", "zeros", "zeros_like", "ones_like", "full_like", "fill_",
              "zero_", "new_zeros", "new_empty", "_has_compatible_shallow_copy_type", "is_same_size"}
PHASES = ("gate decisions", "EMA trajectory", "slerp replay", "backward")


def _child(args) -> None:
    """Measures the adsim importable from ``args.child``; prints ``RESULT {json}``."""
    sys.path.insert(0, args.child)
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function
    from torch.utils._python_dispatch import TorchDispatchMode

    from adsim.config.run import TrainConfig
    from adsim.model import matching
    from adsim.model.head import features_from_bottlenecks, make_head
    from adsim.model.objective import objective

    torch.set_num_threads(args.threads)

    def labelled(fn, label):
        def wrapped(*a, **k):
            with record_function(label):
                return fn(*a, **k)
        return wrapped

    # the phases of the exact gate, as profiler ranges (looked up as module globals at call time)
    matching.ema_trajectory = labelled(matching.ema_trajectory, "EMA trajectory")
    matching.slerp_trajectory = labelled(matching.slerp_trajectory, "slerp replay")
    matching._compiled_scan = (lambda inner: lambda *a, **k: labelled(inner(*a, **k), "gate decisions"))(
        matching._compiled_scan)
    for name in ("_to_jax", "_to_torch"):
        setattr(matching, name, labelled(getattr(matching, name), "gate decisions"))
    L, b, grid, e, size = 4, args.batch, 17, 768, 238
    gen = torch.Generator().manual_seed(0)
    text = torch.nn.functional.normalize(torch.randn(2, e, generator=gen), dim=-1)
    masks = torch.zeros(b, size, size)
    masks[1::2, size // 4: size // 2, size // 4: size // 2] = 1.0  # every other image: a lesion
    batch = {"mask": masks, "has_mask": torch.ones(b), "label": torch.tensor([float(i % 2) for i in range(b)])}
    mids = [torch.randn(b, grid * grid, e, generator=gen).requires_grad_(True) for _ in range(2 * L)]
    cents = torch.nn.functional.normalize(torch.randn(2, 2 * L, e, generator=gen), dim=-1)
    out = {}

    class Syncs(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.n = 0

        def __torch_dispatch__(self, func, types, args_=(), kwargs=None):
            if func.__name__.split(".")[0] in SYNC_OPS:
                self.n += 1
            return func(*args_, **(kwargs or {}))

    for kind, over in ((k, KINDS[k]) for k in args.kinds):
        cfg = TrainConfig(data="", target="Brain", out="")._replace(method="match", vaca=True, **over)
        torch.manual_seed(0)
        head = make_head(cfg, e, e, text, n_layers=L).train()

        def step():
            with torch.no_grad():
                head.centroids.c_pos.copy_(cents[0])
                head.centroids.c_neg.copy_(cents[1])
                head.centroids.init_pos.fill_(1.0)
                head.centroids.init_neg.fill_(1.0)
            for t in mids:
                t.grad = None
            head.zero_grad(set_to_none=True)
            feats = features_from_bottlenecks(head, mids[:L], mids[L:], check=False)
            loss, parts = objective(cfg, head, feats, batch, grid)
            with record_function("backward"):
                loss.backward()
            return loss

        loss = float(step())
        for _ in range(args.warmup - 1):
            step()
        times = []
        for _ in range(args.iters):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step()
        events = prof.events()
        phases = {p: sum(ev.cpu_time_total for ev in events if ev.name == p) / 1e3 for p in PHASES}
        ops = sum(1 for ev in events if ev.name.startswith("aten::") and ev.name[6:] not in _NO_KERNEL
                  and not any(ch.name.startswith("aten::") for ch in ev.cpu_children))
        with Syncs() as counter:
            step()
        out[kind] = {"times": times, "phases": phases, "ops": ops, "syncs": counter.n, "loss": loss,
                     "grad": sum(float(t.grad.double().abs().sum()) for t in mids)}
    print("RESULT " + json.dumps(out))


def _run_child(root: Path, args) -> dict:
    cmd = [sys.executable, __file__, "--child", str(root), "--threads", str(args.threads), "--iters", str(args.iters),
           "--warmup", str(args.warmup), "--batch", str(args.batch), "--kinds", *args.kinds]
    path = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"child for {root} failed:\n{proc.stderr[-4000:]}")
    return json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))[len("RESULT "):])


def _rev(rev: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", rev], check=True, capture_output=True,
                          text=True).stdout.strip()


def run(args) -> str:
    load0 = os.getloadavg()[0]
    dirty = bool(subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "adsim", "poolsim"],
                                capture_output=True, text=True).stdout.strip())
    impls = {"after": (ROOT, f"working tree (HEAD {_rev('HEAD')}{', uncommitted changes' if dirty else ''})")}
    with tempfile.TemporaryDirectory() as tmp:
        if args.baseline:
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.baseline, "adsim", "poolsim"],
                                     check=True, capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
            impls = {"before": (Path(tmp), f"{_rev(args.baseline)}"), **impls}
        runs = {k: [] for k in impls}
        for _ in range(args.rounds):
            for key, (root, _) in impls.items():
                runs[key].append(_run_child(root, args))
    load1 = os.getloadavg()[0]
    lines = [f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M UTC}; {cpu_name()}, nproc {os.cpu_count()}, torch "
             f"threads {args.threads}, Python {platform.python_version()}, torch {__import__('torch').__version__}; "
             f"1-minute load average {load0:.1f} at start, {load1:.1f} at end (shared machine). Random bottlenecks of "
             f"ViT-L-14-336's shapes (L=4, B={args.batch}, N=289, E=768, 238 px masks), fp32, everything after the "
             f"adapters forward + backward; median of {args.rounds} x {args.iters} calls after {args.warmup} warm-up. "
             "Implementations: " + "; ".join(f"**{k}** = {d}" for k, (_, d) in impls.items()) + ".", "",
             "| step | impl. | median [ms] | gate decisions [ms] | EMA trajectory [ms] | slerp replay [ms] | "
             "backward [ms] | host syncs | aten compute ops | loss | sum abs grad |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for kind in args.kinds:
        for key in impls:
            r0 = runs[key][0][kind]
            med = statistics.median(t for r in runs[key] for t in r[kind]["times"]) * 1e3
            ph = r0["phases"]
            lines.append(f"| {kind} | {key} | {med:.1f} | " + " | ".join(f"{ph[p]:.1f}" for p in PHASES)
                         + f" | {r0['syncs']} | {r0['ops']} | {r0['loss']:.6f} | {r0['grad']:.6e} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--baseline", default="", help="git revision measured as 'before' ('' = working tree only)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "adsim_exact_step.md"))
    p.add_argument("--no-write", action="store_true")
    p.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS),
                   help="step kinds to measure (default all; 'exact, slerp' is the slow one on a CPU)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name in ("batch", "iters", "warmup", "rounds", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.child:
        _child(args)
        return 0
    table = run(args)
    print(table)
    if not args.no_write:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "a") as f:
            f.write(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
