"""CPU benchmark of adsim's training-step objective on precomputed random features (issue 14, item 4).

No backbone: the adapter bottleneck outputs are random leaf tensors of the real shapes, so only what
follows them is timed (the part the matching method adds):

* ``matching losses``: ``adsim.training.train.matching_losses`` (8 centroid slots, gates, centroid updates,
  ``L_intra``, ``L_inter``) forward + backward on unit features (L x (B, N, E), normalised random
  leaves; the normalisation is timed too);
* ``objective, match+VACA``: VACA + text scoring (``adsim.model.head.features_from_bottlenecks``) + the
  full ``objective`` + backward, the matching method's step after the adapters;
* ``objective, naive``: the same for the naive-pooling baseline (no VACA, no centroids).

Besides the CPU time, each measurement reports its number of compute aten ops (leaf ops of forward +
backward from ``torch.profiler``, without allocation/view ops): each is a kernel launch on a GPU,
where the small-batch step is launch-bound, and the count does not depend on the machine's load.

Shapes: ``vitl`` = ViT-L-14-336 at 238 px (L=4, B=16, N=17*17=289, E=768, 238 px masks) and ``tiny``
(the tiny backbone: L=4, B=16, N=8*8, E=32, 64 px masks). The centroids start every timed call from
the same random unit state, so every call does the same work.

Before/after in one run: every implementation is measured in its own child process that imports
``adsim``/``poolsim`` from either this working tree or a ``git archive`` of ``--baseline`` (a commit;
default: the last commit before the fast batched path). Rounds alternate baseline and working tree,
so a change in machine load hits both. The children also report the loss values and a gradient
checksum, and the table states how far the two implementations differ.

    python benchmarks/adsim_step.py                        # both shapes, writes to benchmarks/RESULTS.md
    python benchmarks/adsim_step.py --shapes tiny --iters 3 --rounds 1 --no-write

``--compile`` (issue 14): instead, eager vs compiled on the real tiny backbone (working tree only, one
child process with a fresh inductor cache, so the compile time is a cold one): the compiled region of
``adsim.training.compiled_step`` (everything after the frozen trunk, forward + backward, what ``train --compile``
runs) against the same code eager, for the matching+VACA step (batched gate) and the naive step;
timed calls alternate eager and compiled. Reports the first compiled call (compilation + one step), the
median times, their ratio, the kernels per call (eager: compute aten ops; compiled: inductor's fused C++
kernels plus the aten ops it still calls, e.g. matmuls) and the agreement of loss and gradients. CPU
timings only indicate the direction: the GPU lever is CUDA graphs (``benchmarks/gpu_adsim.py``).

    python benchmarks/adsim_step.py --compile --iters 10 --no-write
"""
from __future__ import annotations

import argparse
import datetime as dt
import importlib
import inspect
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINE = "b995362"  # adsim before the fast batched gate (objective's matching block already factored out)
SHAPES = {  # name: (layers, batch, grid, embed dim, mask size)
    "vitl": (4, 16, 17, 768, 238),
    "tiny": (4, 16, 8, 32, 64),
}
MEASURES = ("matching losses", "objective, match+VACA", "objective, naive")


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else ``platform.processor()``."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


# ----------------------------------------------------------------------------------------------------
# child: measures one implementation (imports adsim/poolsim from --child ROOT)
# ----------------------------------------------------------------------------------------------------

def _compile_child(args) -> None:
    """Eager vs compiled post-trunk step on the tiny backbone (B=16); prints ``RESULT {json}``."""
    sys.path.insert(0, args.child)
    import copy
    import warnings

    import torch

    torch.set_num_threads(args.threads)
    torch._inductor.config.cpp.enable_kernel_profile = True  # each fused kernel a profiler event
    from adsim.config.prompts import prompt_ensemble
    from adsim.config.run import TrainConfig
    from adsim.model.backbone import RandomWeightsWarning, build_backbone
    from adsim.model.head import make_head, text_embeddings, trunk_tokens
    from adsim.training import compiled_step

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RandomWeightsWarning)
        bb = build_backbone("tiny", seed=0)
    spec, b, s = bb.spec, 16, bb.spec.image_size
    gen = torch.Generator().manual_seed(0)
    masks = torch.zeros(b, s, s)
    masks[1::2, s // 4: s // 2, s // 4: s // 2] = 1.0  # every other image: a lesion
    batch = {"mask": masks, "has_mask": torch.ones(b), "label": torch.tensor([float(i % 2) for i in range(b)])}
    images = torch.randn(b, 3, s, s, generator=gen)
    tokens = trunk_tokens(bb, images)
    trunk = []
    for _ in range(args.iters):  # the eager frozen trunk, for the whole step's share
        t0 = time.perf_counter()
        trunk_tokens(bb, images)
        trunk.append(time.perf_counter() - t0)
    text = text_embeddings(bb, prompt_ensemble())
    base = TrainConfig(data="", target="Brain", out="")
    out = {"trunk_s": statistics.median(trunk), "shape": f"tiny backbone (L={len(spec.adapter_layers)}, B={b}, N={spec.grid ** 2}, "
                    f"W={spec.width}, E={spec.embed_dim}, {s} px)"}
    for name, cfg in (("match+VACA", base._replace(method="match", vaca=True, gate_mode="batched")),
                      ("naive", base._replace(method="naive", vaca=False))):
        torch.manual_seed(0)
        heads = {"eager": make_head(cfg, spec.width, spec.embed_dim, text).train()}
        heads["compiled"] = copy.deepcopy(heads["eager"])
        compiled = compiled_step.compiled_loss(cfg, heads["compiled"], bb, spec.grid, mode="default", backend="inductor")
        state = copy.deepcopy(heads["eager"].state_dict())

        def reset(kind):  # every call from the same centroids / VACA statistics, not timed
            heads[kind].load_state_dict(state)
            heads[kind].zero_grad(set_to_none=True)

        def call(kind):
            if kind == "eager":
                loss = compiled_step.post_trunk_loss(cfg, heads[kind], bb, tokens, batch, spec.grid)[0]
            else:
                loss = compiled(cfg, heads[kind], tokens, batch)[0]
            loss.backward()
            return loss

        def grads(kind):
            return {n: p.grad.clone() for n, p in heads[kind].named_parameters() if p.grad is not None}

        reset("eager")
        loss_e = float(call("eager"))
        reset("compiled")
        t0 = time.perf_counter()
        loss_c = float(call("compiled"))
        first = time.perf_counter() - t0
        grad_e, grad_c = grads("eager"), grads("compiled")
        state_diff = max(float((heads["compiled"].state_dict()[k] - v).abs().max())  # centroids, VACA statistics
                         for k, v in heads["eager"].state_dict().items() if v.is_floating_point())
        times, ops = {"eager": [], "compiled": []}, {}
        for kind in ("eager", "compiled") * (args.warmup - 1):
            reset(kind)
            call(kind)
        for _ in range(args.iters):
            for kind in times:
                reset(kind)
                t0 = time.perf_counter()
                call(kind)
                times[kind].append(time.perf_counter() - t0)
        for kind in times:
            reset(kind)
            ops[kind] = _count_ops(lambda kind=kind: call(kind), fused=kind == "compiled")
        out[name] = {"first_compiled_s": first, "times": times, "ops": ops,
                     "loss_rel": abs(loss_c - loss_e) / abs(loss_e), "state_abs": state_diff,
                     "grad_rel": max(float((grad_c[n] - g).abs().max() / g.abs().max().clamp_min(1e-30))
                                     for n, g in grad_e.items())}
    print("RESULT " + json.dumps(out))


def _compile_run(args) -> str:
    with tempfile.TemporaryDirectory() as cache:
        load0 = os.getloadavg()[0]
        cmd = [sys.executable, __file__, "--child", str(ROOT), "--compile", "--threads", str(args.threads),
               "--iters", str(args.iters), "--warmup", str(args.warmup)]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "TORCHINDUCTOR_CACHE_DIR": cache}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        load1 = os.getloadavg()[0]
    if proc.returncode != 0:
        raise RuntimeError(f"compile child failed:\n{proc.stderr[-4000:]}")
    res = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))[len("RESULT "):])
    lines = ["## adsim compiled training step on CPU (benchmarks/adsim_step.py --compile)", "",
             f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M UTC}; {cpu_name()}, nproc {os.cpu_count()}, "
             f"torch threads {args.threads}, Python {platform.python_version()}, torch {__import__('torch').__version__}"
             f"; 1-minute load average {load0:.1f} at start, {load1:.1f} at end (shared machine). "
             f"{res['shape']}, random weights and images, fp32; everything after the frozen trunk "
             f"(adsim.training.compiled_step.post_trunk_loss), forward + backward; eager vs `torch.compile` (inductor, "
             f"mode default, cold cache); median of {args.iters} timed calls each, alternating, after "
             f"{args.warmup} warm-up.", "",
             "| step | compile + first call [s] | eager [ms] | compiled [ms] | eager / compiled | "
             "kernels eager | kernels compiled | loss rel. diff | grad rel. diff | state abs. diff |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name in ("match+VACA", "naive"):
        r = res[name]
        e, c = (statistics.median(r["times"][k]) * 1e3 for k in ("eager", "compiled"))
        lines.append(f"| {name} | {r['first_compiled_s']:.1f} | {e:.1f} | {c:.1f} | {e / c:.2f}x | "
                     f"{r['ops']['eager']} | {r['ops']['compiled']} | {r['loss_rel']:.1e} | {r['grad_rel']:.1e} | "
                     f"{r['state_abs']:.1e} |")
    m = {k: statistics.median(res["match+VACA"]["times"][k]) / statistics.median(res["naive"]["times"][k])
         for k in ("eager", "compiled")}
    lines += ["", f"match+VACA / naive: eager {m['eager']:.2f}, compiled {m['compiled']:.2f}. The eager frozen trunk "
              f"(not compiled, the same for both) takes {res['trunk_s'] * 1e3:.1f} ms per batch. Differences: "
              "largest relative difference of the loss and of any gradient entry (relative to its tensor's "
              "largest), largest absolute difference of any parameter or buffer (centroids, VACA statistics) "
              "after the first call."]
    return "\n".join(lines) + "\n"


def _child(args) -> None:
    sys.path.insert(0, args.child)
    import torch

    T = importlib.import_module("adsim.training.train")  # the package re-exports a function named train
    _score = _scoring(importlib.import_module("adsim.model.head"))

    torch.set_num_threads(args.threads)
    for mod in (T,):
        if not str(Path(mod.__file__).resolve()).startswith(str(Path(args.child).resolve())):
            raise RuntimeError(f"imported {mod.__file__}, not from {args.child}")
    out = {}
    for name in args.shapes:
        n_layers, b, grid, e, size = SHAPES[name]
        gen = torch.Generator().manual_seed(0)
        text = torch.nn.functional.normalize(torch.randn(2, e, generator=gen), dim=-1)
        masks = torch.zeros(b, size, size)
        masks[1::2, size // 4: size // 2, size // 4: size // 2] = 1.0  # every other image: a lesion
        batch = {"mask": masks, "has_mask": torch.ones(b), "label": torch.tensor([float(i % 2) for i in range(b)])}
        mids = [torch.randn(b, grid * grid, e, generator=gen) for _ in range(2 * n_layers)]
        cents = torch.nn.functional.normalize(torch.randn(2, 2 * n_layers, e, generator=gen), dim=-1)
        base = T.TrainConfig(data="", target="Brain", out="")._replace(gate_mode="batched")  # both versions
        cfgs = {"match": base._replace(method="match", vaca=True), "naive": base._replace(method="naive", vaca=False)}
        torch.manual_seed(0)  # the VACA MLPs' initial weights
        heads = {k: T.make_head(c, e, e, text, n_layers=n_layers).train() for k, c in cfgs.items()}

        def reset(head):
            if head.centroids is not None:
                with torch.no_grad():
                    head.centroids.c_pos.copy_(cents[0])
                    head.centroids.c_neg.copy_(cents[1])
                    head.centroids.init_pos.fill_(1.0)
                    head.centroids.init_neg.fill_(1.0)

        leaves = [m.clone().requires_grad_(True) for m in mids]

        def matching():  # unit features = normalize(leaf), so that gradients compare across versions
            reset(heads["match"])
            for t in leaves:
                t.grad = None
            unit = [torch.nn.functional.normalize(t, dim=-1) for t in leaves]
            f = _FakeFeats(unit[:n_layers], unit[n_layers:])
            intra, inter = _matching_losses(T, cfgs["match"], heads["match"], f, batch, grid)
            (intra + inter).backward()
            return intra, inter, sum(float(t.grad.double().abs().sum()) for t in leaves)

        def step(kind):
            def run():
                head = heads[kind]
                reset(head)
                for t in leaves:
                    t.grad = None
                head.zero_grad(set_to_none=True)
                feats = _score(head, leaves[:n_layers], leaves[n_layers:])
                loss, parts = T.objective(cfgs[kind], head, feats, batch, grid)
                loss.backward()
                return loss, parts, sum(float(t.grad.double().abs().sum()) for t in leaves)
            return run

        fns = {"matching losses": matching, "objective, match+VACA": step("match"), "objective, naive": step("naive")}
        res = {}
        for label, fn in fns.items():
            first = fn()
            for _ in range(args.warmup - 1):
                fn()
            times = []
            for _ in range(args.iters):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            res_ops = _count_ops(fn)
            if label == "matching losses":
                check = {"intra": float(first[0]), "inter": float(first[1]), "grad_abs_sum": first[2]}
            else:
                check = {"loss": float(first[0]), "grad_abs_sum": first[2],
                         **{k: float(v) for k, v in first[1].items()}}
            res[label] = {"times": times, "check": check, "ops": res_ops}
        out[name] = res
    print("RESULT " + json.dumps(out))


# aten ops that only allocate or change metadata (no kernel on a GPU)
_NO_KERNEL = {"as_strided", "empty", "empty_strided", "empty_like", "view", "_unsafe_view", "_reshape_alias",
              "reshape", "expand", "slice", "select", "t", "transpose", "unsqueeze", "squeeze", "permute",
              "alias", "detach", "to", "resolve_conj", "resolve_neg", "promote_types", "result_type",
              "scalar_tensor", "lift_fresh", "resize_", "unbind", "split", "narrow", "contiguous"}


def _count_ops(fn, fused: bool = False) -> int:
    """Leaf aten ops (no aten op below them) of one call, forward and backward, without the ops that
    only allocate or reshape: on a GPU each is a kernel launch (the small-batch step is launch-bound);
    unlike CPU time the count does not depend on the machine's load. ``fused=True``: plus inductor's
    fused C++ kernels (profiler events ``cpp_fused_*``, with ``cpp.enable_kernel_profile``)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sum(1 for ev in prof.events() if (ev.name.startswith("aten::")
               and ev.name[len("aten::"):] not in _NO_KERNEL
               and not any(ch.name.startswith("aten::") for ch in ev.cpu_children))
               or (fused and "cpp_fused" in ev.name))


def _scoring(head_module):
    """VACA + text scoring ``(head, seg_mid, det_mid) -> Features`` of either version of ``adsim.model.head``:
    ``features_from_bottlenecks`` without its NaN check (a host sync), or ``_score`` at the old baselines."""
    if not hasattr(head_module, "features_from_bottlenecks"):
        return head_module._score
    return lambda head, seg, det: head_module.features_from_bottlenecks(head, seg, det, check=False)


def _matching_losses(T, cfg, head, feats, batch, grid):
    """``(L_intra, L_inter)`` through either signature of ``matching_losses`` (``adsim.training.train``, later
    ``adsim.model.objective``): ``(head, feats, batch, grid)`` at the old baseline, ``(cfg, head, feats, labels,
    masks, has_mask, grid)`` since the recipes (which also return the per-sample weights)."""
    fn = getattr(T, "matching_losses", None) or importlib.import_module("adsim.model.objective").matching_losses
    if "cfg" in inspect.signature(fn).parameters:
        return fn(cfg, head, feats, batch["label"], batch["mask"], batch["has_mask"], grid)[:2]
    return fn(head, feats, batch, grid)


class _FakeFeats:
    """The two fields of ``adsim.model.head.Features`` that ``matching_losses`` reads."""

    def __init__(self, seg, det):
        self.seg, self.det = seg, det


# ----------------------------------------------------------------------------------------------------
# parent: exports the baseline, alternates child runs, writes the table
# ----------------------------------------------------------------------------------------------------

def _export(rev: str, dest: Path) -> None:
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "adsim", "poolsim"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)


def _run_child(root: Path, args) -> dict:
    cmd = [sys.executable, __file__, "--child", str(root), "--threads", str(args.threads), "--iters",
           str(args.iters), "--warmup", str(args.warmup), "--shapes", *args.shapes]
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"child for {root} failed:\n{proc.stderr[-4000:]}")
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def _rev_name(rev: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", rev], check=True, capture_output=True,
                          text=True).stdout.strip()


def run(args) -> str:
    from tqdm.auto import tqdm

    load0 = os.getloadavg()[0]
    head = _rev_name("HEAD")
    dirty = bool(subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "adsim", "poolsim"],
                                capture_output=True, text=True).stdout.strip())
    impls = {"after": (ROOT, f"working tree (HEAD {head}{', uncommitted changes' if dirty else ''})")}
    with tempfile.TemporaryDirectory() as tmp:
        if args.baseline:
            _export(args.baseline, Path(tmp))
            impls = {"before": (Path(tmp), f"baseline {_rev_name(args.baseline)}"), **impls}
        runs = {k: [] for k in impls}
        for _ in tqdm(range(args.rounds), desc="rounds", disable=args.rounds < 2):
            for key, (root, _) in impls.items():
                runs[key].append(_run_child(root, args))
    load1 = os.getloadavg()[0]

    def med(key, shape, label):
        return statistics.median(t for r in runs[key] for t in r[shape][label]["times"]) * 1e3

    lines = ["## adsim training step on CPU (benchmarks/adsim_step.py)", "",
             f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M UTC}; {cpu_name()}, nproc {os.cpu_count()}, "
             f"torch threads {args.threads}, Python {platform.python_version()}, "
             f"torch {__import__('torch').__version__}; 1-minute load average {load0:.1f} at start, "
             f"{load1:.1f} at end (shared machine). Median of {args.rounds} x {args.iters} timed calls "
             f"(after {args.warmup} warm-up) per implementation, rounds alternating the implementations. "
             "Random features, not a real model; fp32.", "",
             "Implementations: " + "; ".join(f"**{k}** = {desc}" for k, (_, desc) in impls.items()) + ".", "",
             "| shape | measurement | " + " | ".join(f"{k} [ms]" for k in impls)
             + (" | before / after |" if "before" in impls else " |")
             + " | ".join(f" {k}: aten ops" for k in impls) + " |",
             "|---|---|" + "---:|" * len(impls) + ("---:|" if "before" in impls else "") + "---:|" * len(impls)]
    for shape in args.shapes:
        L_, B, g, E, S = SHAPES[shape]
        for label in MEASURES:
            ms = {k: med(k, shape, label) for k in impls}
            row = f"| {shape} (L={L_}, B={B}, N={g * g}, E={E}) | {label} | " + " | ".join(
                f"{ms[k]:.1f}" for k in impls) + " |"
            if "before" in impls:
                row += f" {ms['before'] / ms['after']:.2f}x |"
            row += " | ".join(f" {runs[k][0][shape][label]['ops']}" for k in impls) + " |"
            lines.append(row)
    lines += ["", "| shape | implementation | match+VACA / naive (objective+backward) | overhead over naive [ms] |",
              "|---|---|---:|---:|"]
    for shape in args.shapes:
        for k in impls:
            m, n = med(k, shape, "objective, match+VACA"), med(k, shape, "objective, naive")
            lines.append(f"| {shape} | {k} | {m / n:.2f} | {m - n:.1f} |")
    if "before" in impls:
        lines += ["", "Agreement of the two implementations (first call, same inputs and centroid state): "
                  "largest relative difference of the loss values and of the sum |gradient| over the "
                  "feature leaves:"]
        for shape in args.shapes:
            worst = 0.0
            for label in MEASURES:
                a, b = runs["before"][0][shape][label]["check"], runs["after"][0][shape][label]["check"]
                for key in a:
                    worst = max(worst, abs(a[key] - b[key]) / max(abs(a[key]), 1e-12))
            lines.append(f"- {shape}: {worst:.1e}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=["vitl", "tiny"])
    p.add_argument("--baseline", default=BASELINE,
                   help=f"git revision measured as 'before' (default {BASELINE}); '' = working tree only")
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds per implementation")
    p.add_argument("--iters", type=int, default=3, help="timed calls per measurement and round")
    p.add_argument("--warmup", type=int, default=1, help="untimed calls first (>= 1)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1: shared machine)")
    p.add_argument("--results", default=str(ROOT / "benchmarks" / "RESULTS.md"), help="markdown file to append to")
    p.add_argument("--no-write", action="store_true", help="print the table only")
    p.add_argument("--compile", action="store_true",
                   help="eager vs compiled step on the tiny backbone (working tree only; see above)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name in ("rounds", "iters", "warmup", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.child:
        (_compile_child if args.compile else _child)(args)
        return 0
    table = _compile_run(args) if args.compile else run(args)
    print(table)
    if not args.no_write:
        from montecarlo import append_table  # benchmarks/, the script's folder

        append_table(str(args.results), table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
