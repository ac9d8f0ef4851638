"""Few-shot mode (issue 13, item 5): memory-bank size and the per-image cost of the nearest-neighbour
search, at the sizes of the real backbone, against a straightforward NumPy reference. Not part of the tests.

For ViT-L-14-336 (``N = 24 x 24 = 576`` patches, ``E = 768`` features, ``L = 4`` layers) and each k, the
bank holds ``k N E L`` float32 (closed form, checked against the tensors built); one test image costs
``L`` products ``(N, E) x (E, k N)``. Timed in the same run on random unit features (no weights needed):

* ``adsim``: :func:`adsim.methods.fewshot.nn_distance` (torch, chunked, float32), one layer after the other;
* ``numpy``: ``1 - (P @ bank.T).max(1)`` in NumPy float32 -- the reference the tests check
  ``nn_distance`` against is ``scipy.spatial.distance.cdist`` (too slow to time at this size).

Both must agree to 1e-5 (checked, printed). Times are the median of ``--repeats`` calls.

    python benchmarks/adsim_fewshot.py                 # k = 2 8 16, ~1 minute on 2 shared cores
    python benchmarks/adsim_fewshot.py --shots 2 --no-write
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from montecarlo import call_times, machine_info, write_section  # noqa: E402

from adsim.methods.fewshot import nn_distance  # noqa: E402

TITLE = "adsim few-shot memory bank (CPU, ViT-L-14-336 sizes, random features)"
N, E, L = 576, 768, 4


def unit(rng, *shape) -> np.ndarray:
    x = rng.standard_normal(shape).astype(np.float32)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def main(argv=None) -> str:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shots", type=int, nargs="+", default=[2, 8, 16])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "RESULTS.md"))
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    rows = ["| k | bank [MiB] (k N E L x 4 B) | adsim [ms / image] | NumPy [ms / image] | NumPy / adsim | "
            "max abs diff |", "|---|---|---|---|---|---|"]
    for k in args.shots:
        banks = [unit(rng, k * N, E) for _ in range(L)]
        test = [unit(rng, 1, N, E) for _ in range(L)]
        tb, tt = [torch.from_numpy(b) for b in banks], [torch.from_numpy(p) for p in test]
        assert sum(b.numel() for b in tb) * 4 == k * N * E * L * 4
        with torch.inference_mode():
            ours = torch.stack([nn_distance(p, b) for p, b in zip(tt, tb)]).numpy()
            t_ours = statistics.median(call_times(lambda: [nn_distance(p, b) for p, b in zip(tt, tb)],
                                                  iters=args.repeats))
        ref = np.stack([1.0 - (p[0] @ b.T).max(1) for p, b in zip(test, banks)])[:, None]
        t_ref = statistics.median(call_times(lambda: [1.0 - (p[0] @ b.T).max(1) for p, b in zip(test, banks)],
                                             iters=args.repeats))
        diff = float(np.abs(ours - ref).max())
        if diff > 1e-5:
            raise SystemExit(f"nn_distance differs from the NumPy reference by {diff:.2e} at k={k}")
        rows.append(f"| {k} | {k * N * E * L * 4 / 2 ** 20:.1f} | {1e3 * t_ours:.0f} | {1e3 * t_ref:.0f} | "
                    f"{t_ref / t_ours:.2f} | {diff:.1e} |")
        print(rows[-1], flush=True)
    load = Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() else "?"
    body = (f"`python benchmarks/adsim_fewshot.py --shots {' '.join(map(str, args.shots))} --repeats {args.repeats}`"
            f" on {time.strftime('%Y-%m-%d')}. Machine: {machine_info()}, torch {torch.__version__} "
            f"({torch.get_num_threads()} threads); 1-minute load average at the end {load} (shared machine).\n\n"
            "One test image = the L = 4 layer searches (N = 576 patches against k N bank rows, E = 768). "
            "The few-shot mode adds this to the zero-shot forward pass; the bank itself is built once per "
            "target. Memory: the bank (column 2) plus at most ~256 MiB of similarities per chunk.\n\n"
            + "\n".join(rows) + "\n")
    if not args.no_write:
        write_section(args.out, TITLE, body)
    print(body)
    return body


if __name__ == "__main__":
    main()
