"""``make-toy-bmad`` (``adsim.data.toy.make_toy_bmad``): the current writer against a reference revision's,
in the same process, alternating (best of ``--repeat`` wall times each), plus a pixel-for-pixel check
that both write the same images.

The reference is the module as it was at ``--reference`` (default: the last revision before the
vectorised writer), read with ``git show`` and loaded as a module of its own.

    PYTHONPATH=$PWD python benchmarks/adsim_toy.py [--n-per-class 48] [--size 256] [--repeat 2]
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from adsim.data import toy  # noqa: E402

REFERENCE = "e165439"  # main before the vectorised toy writer


def _reference(rev: str):
    src = subprocess.run(["git", "show", f"{rev}:adsim/data/toy.py"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    path = Path(tempfile.mkdtemp()) / "toy_reference.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("toy_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _time(make, n: int, size: int) -> tuple[float, Path]:
    out = Path(tempfile.mkdtemp())
    t0 = time.perf_counter()
    make(out, n_per_class=n, size=size, seed=0)
    return time.perf_counter() - t0, out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n-per-class", type=int, nargs="+", default=[16, 48])
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--reference", default=REFERENCE)
    args = ap.parse_args(argv)
    ref = _reference(args.reference)
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load "
          f"{os.getloadavg()[0]:.2f}; reference {args.reference}; size {args.size} px; best of {args.repeat}")
    print("| images per class | images written | reference (s) | current (s) | speed-up | same pixels |")
    print("|---:|---:|---:|---:|---:|---|")
    for n in args.n_per_class:
        best = {"ref": float("inf"), "cur": float("inf")}
        outs = {}
        for _ in range(args.repeat):
            for key, make in (("ref", ref.make_toy_bmad), ("cur", toy.make_toy_bmad)):
                t, outs[key] = _time(make, n, args.size)
                best[key] = min(best[key], t)
        files = sorted(p.relative_to(outs["ref"]) for p in outs["ref"].rglob("*.png"))
        same = files == sorted(p.relative_to(outs["cur"]) for p in outs["cur"].rglob("*.png")) and all(
            np.array_equal(np.asarray(Image.open(outs["ref"] / f)), np.asarray(Image.open(outs["cur"] / f)))
            for f in files)
        print(f"| {n} | {len(files)} | {best['ref']:.2f} | {best['cur']:.2f} | {best['ref'] / best['cur']:.2f}x | "
              f"{'yes' if same else 'NO'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
