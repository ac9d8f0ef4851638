"""CPU benchmark of the streaming pixel metrics (issue 13, deliverable 2). Not part of the tests.

Simulated maps (NOT a model's output): ``--images`` maps of ``--size`` x ``--size`` pixels, bilinear
upsampling of a 15 x 15 Gaussian field plus anomalous blobs (half the images; several regions each),
Gaussian-smoothed, float32 -- shaped like upsampled patch logits. Two ways to get pixel AUROC, AP,
F1-max and AUPRO (FPR <= 0.3):

* **accumulator** -- ``adsim.metrics.Accumulator`` fed ``--batch`` images at a time (histograms),
* **exact** -- the straightforward NumPy/sklearn reference on all pixels at once: sklearn
  ``roc_auc_score`` / ``average_precision_score`` / ``precision_recall_curve`` and a sort-based exact
  AUPRO (one global sort, per-region weights ``1 / (region size x number of regions)``, cumulative sums,
  one point per distinct score, as the MVTec AD evaluation code does it).

Reports wall time (accumulator: median of ``--repeat``) and the peak of the memory each one allocates on top of the maps already in RAM
(``tracemalloc``, which NumPy reports its buffers to), the differences accumulator - exact and the
accumulator's stated bounds. Appends a Markdown table with machine info to ``--results`` (atomically).

    PYTHONPATH=$PWD python benchmarks/adsim_metrics.py [--images 200] [--size 240] [--no-write]
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
from scipy.ndimage import gaussian_filter, label, zoom
from sklearn.metrics import average_precision_score, precision_recall_curve, roc_auc_score

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from montecarlo import append_table  # noqa: E402  (benchmarks/, the script's folder)

from adsim.metrics.accumulator import DEFAULT_BINS, FPR_LIMIT, Accumulator, area_to  # noqa: E402

KEYS = ("pixel_auroc", "pixel_ap", "pixel_f1max", "aupro")


def simulate(n: int, size: int, seed: int):
    """``(maps (n, size, size) float32, masks (n, size, size) bool)``: SIMULATED maps, see the module doc."""
    rng = np.random.default_rng(seed)
    maps = np.empty((n, size, size), np.float32)
    masks = np.zeros((n, size, size), bool)
    for i in range(n):
        field = zoom(rng.normal(size=(15, 15)), size / 15, order=1)[:size, :size]
        if i % 2:
            blobs = zoom(rng.normal(size=(12, 12)), size / 12, order=1)[:size, :size]
            masks[i] = blobs > 1.5
        maps[i] = gaussian_filter(2.0 * field + 4.0 * masks[i] + 0.3 * rng.normal(size=(size, size)), 2.0)
    return maps, masks


def exact_metrics(maps: np.ndarray, masks: np.ndarray, fpr_limit: float = FPR_LIMIT) -> dict:
    """The reference on all pixels at once (percent)."""
    y, s = masks.ravel(), maps.ravel()
    p, r, _ = precision_recall_curve(y, s)
    f1 = np.divide(2 * p * r, p + r, out=np.zeros_like(p), where=(p + r) > 0)
    # exact AUPRO: weight of an anomalous pixel = 1 / (its region's size x number of regions)
    weights = np.zeros(s.shape)
    structure = np.ones((3, 3, 3), int) * np.array([0, 1, 0])[:, None, None]  # 8-connected per image only
    regions, n_regions = label(masks, structure=structure)
    regions = regions.ravel()
    sizes = np.bincount(regions)
    anomalous = regions > 0
    weights[anomalous] = 1.0 / (sizes[regions[anomalous]] * n_regions)
    order = np.argsort(-s, kind="stable")
    s_sorted = s[order]
    fpr = np.cumsum(~y[order]) / np.sum(~y)
    pro = np.cumsum(weights[order])
    last = np.append(np.diff(s_sorted) != 0, True)  # one point per distinct score (after all its ties)
    fpr, pro = np.concatenate([[0.0], fpr[last]]), np.concatenate([[0.0], np.minimum(pro[last], 1.0)])
    return {"pixel_auroc": 100 * roc_auc_score(y, s), "pixel_ap": 100 * average_precision_score(y, s),
            "pixel_f1max": 100 * float(f1.max()), "aupro": 100 * area_to(fpr, pro, fpr_limit) / fpr_limit}


def streamed(maps, masks, batch: int, bins: int) -> dict:
    acc = Accumulator(pixel=True, bins=bins)
    labels = masks.any(axis=(1, 2)).astype(int)
    for i in range(0, len(maps), batch):
        part = slice(i, i + batch)
        acc.update(maps[part].max(axis=(1, 2)), labels[part], maps[part], masks[part])
    return acc.compute()


def timed(fn, *args, repeat: int = 1):
    """``(result, median wall seconds over repeat calls)``, without tracemalloc (it slows allocations)."""
    walls = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn(*args)
        walls.append(time.perf_counter() - t0)
    return out, statistics.median(walls)


def peak_bytes(fn, *args) -> int:
    """Peak memory allocated while ``fn(*args)`` runs (tracemalloc; NumPy reports its buffers)."""
    tracemalloc.start()
    try:
        fn(*args)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def report(args, m_acc, t_acc, mem_acc, m_ex, t_ex, mem_ex, data_bytes) -> str:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else "?"
    import scipy
    import sklearn
    n_pix = args.images * args.size ** 2
    lines = [
        "## adsim pixel metrics: streaming Accumulator vs exact (benchmarks/adsim_metrics.py)",
        "",
        f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M UTC}; `PYTHONPATH=$PWD python benchmarks/adsim_metrics.py "
        f"--images {args.images} --size {args.size}`; CPU {cpu}, nproc {os.cpu_count()}, load average "
        f"{os.getloadavg()[0]:.1f} at the end (shared machine); Python {platform.python_version()}, NumPy "
        f"{np.__version__}, SciPy {scipy.__version__}, scikit-learn {sklearn.__version__}. SIMULATED maps "
        f"(not a model's output): {args.images} images of {args.size} x {args.size} = {n_pix / 1e6:.1f} M pixels "
        f"(float32 maps + bool masks in RAM: {data_bytes / 2**20:.0f} MiB), {m_acc['n_regions']} anomalous "
        f"regions; accumulator: {args.bins} bins, batches of {args.batch} images. Wall: accumulator median of "
        f"{args.repeat} runs, exact one run. Memory = peak allocated by the metric computation on top of the "
        f"data (tracemalloc, separate runs).",
        "",
        "| implementation | wall [s] | peak extra memory [MiB] |",
        "|---|---:|---:|",
        f"| Accumulator (streaming, all four pixel metrics + image metrics) | {t_acc:.2f} | {mem_acc / 2**20:.1f} |",
        f"| exact: sklearn on all pixels + sort-based AUPRO (reference) | {t_ex:.2f} | {mem_ex / 2**20:.1f} |",
        f"| exact / Accumulator | {t_ex / t_acc:.2f}x | {mem_ex / mem_acc:.1f}x |",
        f"| Accumulator on the first {args.images // 2} images only | | {args.mem_half / 2**20:.1f} |",
        "",
        "| metric [%] | exact | Accumulator | difference | stated bound |",
        "|---|---:|---:|---:|---:|",
    ]
    for k in KEYS:
        d = m_acc[k] - m_ex[k]
        lines.append(f"| {k} | {m_ex[k]:.4f} | {m_acc[k]:.4f} | {d:+.2e} | {m_acc['pixel_error_bounds'][k]:.2e} |")
    within = all(abs(m_acc[k] - m_ex[k]) <= m_acc["pixel_error_bounds"][k] + 1e-9 for k in KEYS)
    lines += ["", f"All differences within the stated bounds: {'yes' if within else 'NO'}. Bin width "
              f"{m_acc['pixel_bin_width']:.3g} (score range {args.range_:.3g})."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=200)
    p.add_argument("--size", type=int, default=240)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--bins", type=int, default=DEFAULT_BINS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=5, help="timed runs of the accumulator (median); exact: 1")
    p.add_argument("--results", default=str(ROOT / "benchmarks" / "RESULTS.md"))
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)
    if args.images < 2 or args.size < 16 or args.batch < 1 or args.repeat < 1:
        p.error("--images >= 2, --size >= 16, --batch >= 1 and --repeat >= 1 required")
    maps, masks = simulate(args.images, args.size, args.seed)
    args.range_ = float(maps.max() - maps.min())
    half = len(maps) // 2
    args.mem_half = peak_bytes(streamed, maps[:half], masks[:half], args.batch, args.bins)
    mem_acc = peak_bytes(streamed, maps, masks, args.batch, args.bins)
    mem_ex = peak_bytes(exact_metrics, maps, masks)
    m_acc, t_acc = timed(streamed, maps, masks, args.batch, args.bins, repeat=args.repeat)
    m_ex, t_ex = timed(exact_metrics, maps, masks)
    table = report(args, m_acc, t_acc, mem_acc, m_ex, t_ex, mem_ex, maps.nbytes + masks.nbytes)
    print(table)
    if not args.no_write:
        append_table(args.results, table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
