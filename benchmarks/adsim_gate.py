"""CPU benchmark of Algorithm 1's gate (issue 12, item 2). Not part of the tests.

One 32-image toy batch (``adsim.data.toy``, the five training domains of target Brain), the tiny backbone
(random weights) and a fresh matching+VACA head; the gate's inputs are captured from
``adsim.training.train.objective`` itself (4 patch slots of ``32 * 64`` features and 4 image slots of 32, E = 32).
Times per training step (all 8 slots, forward + backward of the centroids), median of ``--iters``:

* ``batched`` -- the vectorised approximation (``CentroidBank(mode="batched")``),
* ``exact fast`` -- ``CentroidBank(mode="sequential")`` = ``match_sequential`` (compiled scan + weighted
  sum); its one-off compilation per input shape is reported separately,
* ``literal loop`` -- ``match(..., mode="sequential")`` slot by slot (the test oracle),
* ``NumPy loop`` -- a from-scratch NumPy loop of Algorithm 1 (arccos distances, decisions only, no
  gradient): the project's straightforward reference, also used to check the exact gate's decisions.

and the disagreement of the batched gate with the exact one: the fraction of labelled patch/image
features whose decision differs, and the angle between the two gates' final centroids next to the
angle between the normal and the anomaly centroid, from (a) uninitialised centroids and (b)
centroids set by the exact gate on a first batch of the same size. Writes a markdown table with machine
info (``--results``, appended atomically).

    PYTHONPATH=$PWD python benchmarks/adsim_gate.py [--iters 20] [--no-write]
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from montecarlo import append_table, call_times  # noqa: E402  (benchmarks/, the script's folder)

from adsim.config.prompts import prompt_ensemble
from adsim.config.run import TrainConfig  # noqa: E402
from adsim.data import bmad  # noqa: E402
from adsim.data.domains import DOMAINS
from adsim.data.toy import make_toy_bmad  # noqa: E402
from adsim.model.backbone import RandomWeightsWarning, build_backbone  # noqa: E402
from adsim.model.head import features, make_head, text_embeddings  # noqa: E402
from adsim.model.matching import CentroidBank, match  # noqa: E402
from adsim.model.objective import objective


def _median_s(fn, *, warmup: int, iters: int) -> float:
    return statistics.median(call_times(fn, iters=iters, warmup=warmup))


def gate_inputs(root: Path, n_images: int, seed: int) -> list:
    """Two batches' ``[(start, f (S, n, E), y (n,), valid (n,)), ...]`` exactly as training passes them
    to ``CentroidBank.step`` (captured from ``objective``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RandomWeightsWarning)
        bb = build_backbone("tiny", seed=seed)
    cfg = TrainConfig(data=str(root), target="Brain", out="")
    head = make_head(cfg, bb.spec.width, bb.spec.embed_dim, text_embeddings(bb, prompt_ensemble()))
    samples = [s for d in DOMAINS if d != "Brain" for sp in cfg.train_splits for s in bmad.list_split(root, d, sp)]
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(samples))
    ds = bmad.ImageDataset([samples[i] for i in order[: 2 * n_images]], bb.spec.image_size)
    batches, calls = [], []
    original = head.centroids.step

    def capture(start, f, y, v, **kw):
        calls.append((start, f.detach().clone(), y.clone(), v.clone()))
        return original(start, f, y, v, **kw)

    head.centroids.step = capture
    for k in range(2):
        items = [ds[i] for i in range(k * n_images, (k + 1) * n_images)]
        batch = {key: torch.stack([it[key] for it in items]) for key in ("image", "mask", "has_mask", "label")}
        with torch.no_grad():
            objective(cfg, head, features(bb, head, batch["image"]), batch, bb.spec.grid)
        batches.append(calls[-2:])
    return batches


def numpy_loop(f, y, valid, c_pos, c_neg, init_pos, init_neg, alpha=0.5):
    """Algorithm 1 from scratch in NumPy for one slot: geodesic arccos distances, an uninitialised
    centroid is infinitely far (and accepts its first feature), EMA then renormalisation."""
    f = f / np.maximum(np.linalg.norm(f, axis=1, keepdims=True), 1e-30)
    c = [c_pos.copy(), c_neg.copy()]
    init = [bool(init_pos), bool(init_neg)]
    acc = np.zeros((2, len(f)))
    for j in range(len(f)):
        if not valid[j]:
            continue
        own = int(y[j])
        dist = [np.arccos(np.clip(f[j] @ c[k], -1, 1)) if init[k] else np.inf for k in (0, 1)]
        if init[own] and not dist[own] < dist[1 - own]:
            continue
        u = alpha * c[own] + (1 - alpha) * f[j]
        if np.linalg.norm(u) > 0:
            c[own] = u / np.linalg.norm(u)
        init[own] = True
        acc[own, j] = 1.0
    return acc, c


def _bank(mode, n_slots, dim, state=None):
    bank = CentroidBank(n_slots, dim, mode=mode)
    if state is not None:
        for name, value in state.items():
            getattr(bank, name)[:] = value
    return bank


def _step(bank, calls):
    out = []
    for start, f, y, v in calls:
        f = f.detach().requires_grad_(True)
        m = bank.step(start, f, y, v)
        (m.c_pos.sum() + m.c_neg.sum()).backward()
        out.append(m)
    return out


def _angle(a, b):
    return np.degrees(np.arccos(np.clip(np.sum(a * b, -1), -1, 1)))


def disagreement(calls, state) -> list:
    """Rows ``(slot kind, % decisions differing, mean angle batched-vs-exact centroid, mean angle
    normal-vs-anomaly centroid)``."""
    dim = calls[0][1].shape[-1]
    rows = []
    outs = {mode: _step(_bank(mode, 8, dim, state), calls)
            for mode in ("batched", "sequential")}
    for k, kind in enumerate(("patch", "image")):
        b, e = outs["batched"][k], outs["sequential"][k]
        labelled = calls[k][3] > 0
        lab = labelled.float().sum() * b.acc_pos.shape[0]
        differ = ((b.acc_pos != e.acc_pos) | (b.acc_neg != e.acc_neg)).float()[:, labelled].sum()
        drift = np.concatenate([_angle(b.c_pos.detach().numpy(), e.c_pos.detach().numpy()),
                                _angle(b.c_neg.detach().numpy(), e.c_neg.detach().numpy())])
        gap = _angle(e.c_pos.detach().numpy(), e.c_neg.detach().numpy())
        rows.append((kind, 100.0 * float(differ / lab), float(drift.mean()), float(gap.mean())))
    return rows


def run(args) -> str:
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        root = make_toy_bmad(Path(tmp), n_per_class=4, size=64, seed=1)
        first, second = gate_inputs(root, args.images, seed=0)
    dim = first[0][1].shape[-1]
    kw = {"warmup": 2, "iters": args.iters}

    # compilation of the exact gate's scan (first call per shape)
    t0 = time.perf_counter()
    _step(_bank("sequential", 8, dim), second)
    t_compile = time.perf_counter() - t0
    t_batched = _median_s(lambda: _step(_bank("batched", 8, dim), second), **kw)
    t_exact = _median_s(lambda: _step(_bank("sequential", 8, dim), second), **kw)

    def literal():
        for start, f, y, v in second:
            f = f.detach().requires_grad_(True)
            ms = [match(f[s], y, v, torch.zeros(dim), torch.zeros(dim), torch.zeros(()), torch.zeros(()),
                        mode="sequential") for s in range(f.shape[0])]
            sum(m.c_pos.sum() + m.c_neg.sum() for m in ms).backward()
    t_literal = _median_s(literal, warmup=0, iters=max(1, args.iters // 10))

    np_calls = [(f.numpy(), y.numpy(), v.numpy()) for _, f, y, v in second]

    def numpy_all():
        return [numpy_loop(f[s], y, v, np.zeros(dim), np.zeros(dim), 0, 0)
                for f, y, v in np_calls for s in range(f.shape[0])]
    t_numpy = _median_s(numpy_all, warmup=0, iters=max(1, args.iters // 10))

    # decisions of the exact gate vs the NumPy loop (independent implementation)
    exact = _step(_bank("sequential", 8, dim), second)
    ref = numpy_all()
    same = all(np.array_equal(np.stack([e.acc_pos[s].numpy(), e.acc_neg[s].numpy()]), ref[k * 4 + s][0])
               for k, e in enumerate(exact) for s in range(4))

    warm = _bank("sequential", 8, dim)
    _step(warm, first)
    warm_state = {name: getattr(warm, name).clone() for name in ("c_pos", "c_neg", "init_pos", "init_neg")}
    dis = {"uninitialised centroids": disagreement(second, None),
           "centroids after one exact batch": disagreement(second, warm_state)}

    n_patch = second[0][1].shape[1]
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else "?"
    import jax
    lines = [
        "### adsim gate (CPU): exact fast sequential vs batched, one 32-image toy batch",
        "",
        f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M UTC}; `PYTHONPATH=$PWD python benchmarks/adsim_gate.py`; "
        f"CPU {cpu}, nproc {os.cpu_count()}, load average {os.getloadavg()[0]:.1f} at the end (machine shared "
        f"with other jobs); Python {platform.python_version()}, torch {torch.__version__} "
        f"({torch.get_num_threads()} thread), JAX {jax.__version__}, NumPy {np.__version__}. Tiny backbone "
        f"(random weights), {args.images} toy images: 4 patch slots x {n_patch} features + 4 image slots x "
        f"{args.images}, E = {dim}; all 8 slots of one training step, forward + backward of the centroids, "
        f"median of {args.iters} (literal/NumPy loops: {max(1, args.iters // 10)}).",
        "",
        "| gate | ms per step | / batched |",
        "|---|---:|---:|",
    ]
    for label, t in (("batched (approximation)", t_batched), ("exact fast sequential (scan + weighted sum)", t_exact),
                     ("literal loop (torch, test oracle)", t_literal), ("NumPy loop (reference, no grad)", t_numpy)):
        lines.append(f"| {label} | {1e3 * t:.2f} | {t / t_batched:.2f} |")
    lines += ["",
              f"Exact fast gate: {t_literal / t_exact:.0f}x faster than the literal loop, {t_numpy / t_exact:.0f}x "
              f"faster than the NumPy loop; one-off compilation for these two shapes {t_compile:.2f} s; decisions "
              f"identical to the NumPy loop: {'yes' if same else 'NO'}. Target (issue 12): exact <= 2x batched -> "
              f"{t_exact / t_batched:.2f}x, {'met' if t_exact <= 2 * t_batched else 'NOT met'}.",
              "",
              "| batched vs exact | slots | decisions differing | centroid angle batched vs exact | "
              "angle normal vs anomaly centroid (exact) |",
              "|---|---|---:|---:|---:|"]
    for start, rows in dis.items():
        for kind, pct, drift, gap in rows:
            lines.append(f"| {start} | {kind} | {pct:.1f}% | {drift:.1f} deg | {gap:.1f} deg |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=32)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--results", default=str(ROOT / "benchmarks" / "RESULTS.md"))
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)
    if args.images < 1 or args.iters < 1:
        p.error("--images and --iters must be >= 1")
    torch.set_num_threads(1)
    table = run(args)
    print(table)
    if not args.no_write:
        append_table(str(args.results), table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
