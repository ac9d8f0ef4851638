"""Benchmark: the JAX Monte-Carlo engine vs the plain NumPy reference on `domain_addition`.

Not a test. Measures, in one run and on this machine:

1. seeds/s of the NumPy loop reference (``poolsim._reference.ref_domain_addition``, samples drawn,
   sample-median init -- the paper's set-up) and of the engine, both paths: ``materialize=True``
   (same work as the reference) and the sufficient-statistics path (``materialize=False``), at
   100, 1 000 and 10 000 seeds; engine times exclude compilation (reported separately);
2. the sufficient-statistics path at n = 1e2 ... 1e5 samples per domain (its cost should be flat).

With ``--baseline REV`` the engine as committed at git revision REV (``poolsim/_engine.py``
only) is timed in the same run, so before/after ratios share the machine's load.

Writes a Markdown table with machine info and the load average to ``benchmarks/RESULTS.md``
(section "Monte-Carlo engine", replaced in place) unless ``--no-write``.

    python benchmarks/montecarlo.py [--seeds 100 1000 10000] [--ref-max-seeds N] [--baseline REV]
                                    [--no-write]
"""
from __future__ import annotations

import argparse
import os
import platform
import re
import sys
import time

import numpy as np


NOTE = ("What changed for issue 11: on a CPU backend the paper's sample-median init is computed "
        "on the host (one NumPy sort per column + block counts, `_engine.host_prefix_medians`, exact) "
        "instead of an XLA sort (a comparator call per comparison) and an (nK, R) running count; "
        "per-seed results are bit-identical to the baseline (checked on all three experiments, both "
        "paths, 300 seeds). Tried and dropped: evaluating all K at once (one vmapped `while_loop` "
        "for every K instead of the scan over K) and a seed-minor hand-batched matching loop -- both "
        "measured slower. The materialised path is now bound by random-number generation (6,000 "
        "normals and 15,600 random words for the subsampling indices per seed; fewer draws would "
        "change every seed's results). The sufficient path (~1,600 floats per seed) is "
        "overhead-bound in XLA's CPU code and unchanged: it runs the same code before and now, so "
        "the gap between those two columns is this shared machine's run-to-run noise (up to ~60% "
        "seen today). Engine times are the best of two warm "
        "calls; the reference is timed once (on at most --ref-max-seeds seeds, then scaled).")


def machine_info() -> str:
    import jax

    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"jax {jax.__version__} ({jax.devices()[0].platform}), NumPy {np.__version__}")


def time_reference(S: int) -> float:
    from poolsim import _reference, experiments as ex

    P = {**ex.COMMON, **ex.EXPERIMENTS["domain_addition"].defaults}
    kw = {k: P[k] for k in ("Ks", "n", "sigma", "tau", "every", "radius", "gamma", "jitter", "d",
                            "m_frac", "n_sub", "tol", "max_iter")}
    rng = np.random.default_rng(0)
    t = time.perf_counter()
    for _ in range(S):
        _reference.ref_domain_addition(rng, **kw)
    return time.perf_counter() - t


def load_engine(rev: str | None):
    """``poolsim._engine``, or its version at git revision ``rev`` loaded as a separate module."""
    import importlib.util
    import subprocess
    import tempfile

    from poolsim import _engine

    if rev is None:
        return _engine
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    src = subprocess.run(["git", "show", f"{rev}:poolsim/_engine.py"], cwd=root, check=True,
                         capture_output=True, text=True).stdout
    path = os.path.join(tempfile.mkdtemp(), "_engine_baseline.py")
    with open(path, "w") as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location("poolsim._engine_baseline", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def time_engine(S: int, engine=None, **params) -> tuple[float, float]:
    """(first call incl. compile, best of two warm calls) in seconds."""
    from poolsim import _engine as current, experiments as ex

    spec, P = ex.spec("domain_addition", **params)
    _engine = engine or current

    seeds = np.arange(S)
    t = time.perf_counter()
    _engine.simulate(spec, seeds, dtype=P["dtype"], chunk=P["chunk"])
    first = time.perf_counter() - t
    warm = []
    for _ in range(2):
        t = time.perf_counter()
        _engine.simulate(spec, seeds, dtype=P["dtype"], chunk=P["chunk"])
        warm.append(time.perf_counter() - t)
    return first, min(warm)


def targets(rows) -> str:
    """Issue 11's targets (>= 30x materialised, >= 300x sufficient at 10,000 seeds), met or not,
    for the current engine in this run."""
    big = [r for r in rows if r[0] == 10_000]
    if not big:
        return ""
    S, r, _, *eng = big[0]
    mat, suf = eng[-4] / r, eng[-2] / r
    return (f"Issue 11 targets at 10,000 seeds (this run): materialised >= 30x: "
            f"{'met' if mat >= 30 else 'NOT met'} ({mat:.1f}x); sufficient statistics >= 300x: "
            f"{'met' if suf >= 300 else 'NOT met'} ({suf:.1f}x).\n\n")


def write_section(path: str, title: str, body: str) -> None:
    """Replace (or append) the ``## title`` section of a Markdown file, atomically."""
    text = open(path).read() if os.path.exists(path) else "# Benchmark results\n"
    section = f"## {title}\n\n{body.strip()}\n"
    pattern = re.compile(rf"^## {re.escape(title)}\n.*?(?=^## |\Z)", re.S | re.M)
    text = pattern.sub(section + "\n", text) if pattern.search(text) else text.rstrip() + "\n\n" + section
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def append_table(path: str, table: str) -> None:
    """Append ``table`` to a Markdown results file, atomically (the adsim benchmarks' tables)."""
    text = open(path).read() if os.path.exists(path) else "# Benchmark results\n"
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text.rstrip("\n") + "\n\n" + table)
    os.replace(tmp, path)
    print(f"appended to {path}")


def main(argv=None) -> str:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[100, 1000, 10000])
    ap.add_argument("--ref-max-seeds", type=int, default=None,
                    help="time the reference on at most this many seeds and extrapolate linearly "
                         "(marked 'extrapolated' in the table); default: run them all")
    ap.add_argument("--n-values", type=int, nargs="+", default=[100, 1000, 10000, 100000])
    ap.add_argument("--n-seeds", type=int, default=10000, help="seeds for the n sweep")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "RESULTS.md"))
    ap.add_argument("--baseline", default=None, metavar="REV",
                    help="also time poolsim/_engine.py as of git revision REV (before/after)")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    from tqdm import tqdm

    load = [os.getloadavg()[0]]
    base = load_engine(args.baseline) if args.baseline else None
    rows = []
    for S in tqdm(args.seeds, desc="seed counts"):
        S_ref = S if args.ref_max_seeds is None else min(S, args.ref_max_seeds)
        ref = time_reference(S_ref) * S / S_ref
        row = [S, S / ref, S_ref < S]
        for engine in ([base] if base else []) + [None]:
            for mat in (True, False):
                first, warm = time_engine(S, engine, materialize=mat)
                row += [S / warm, first]
        rows.append(row)
        load.append(os.getloadavg()[0])
    versions = ([f"before ({args.baseline})"] if base else []) + ["engine" + (" (now)" if base else "")]
    head = "| seeds | reference seeds/s |" + "".join(
        f" {v}, materialised: seeds/s (ratio) | compile+first (s) | {v}, sufficient stats: seeds/s "
        "(ratio) | compile+first (s) |" for v in versions)
    lines = [head, "|---:|---:|" + "---:|---:|---:|---:|" * len(versions)]
    for S, r, extra, *eng in rows:
        cells = "".join(f" {v:,.0f} ({v / r:,.1f}x) | {c:.2f} |" for v, c in zip(eng[::2], eng[1::2]))
        lines.append(f"| {S:,} | {r:,.1f}{' (extrapolated)' if extra else ''} |{cells}")
    nrows = []
    for n in tqdm(args.n_values, desc="n sweep"):
        _, t = time_engine(args.n_seeds, materialize=False, n=n)
        nrows.append((n, t))
    base = nrows[0][1]
    lines += ["", f"Sufficient-statistics path, {args.n_seeds:,} seeds, cost vs samples per domain n:", "",
              "| n | time (s) | relative to n = %d |" % nrows[0][0], "|---:|---:|---:|"]
    lines += [f"| {n:,} | {t:.3f} | {t / base:.2f} |" for n, t in nrows]
    body = (f"Measured {time.strftime('%Y-%m-%d %H:%M')} on {machine_info()}; 1-min load average "
            f"{min(load):.1f} to {max(load):.1f} during the run (shared machine).\n"
            f"Command: `python benchmarks/montecarlo.py {' '.join(sys.argv[1:] if argv is None else argv)}`.\n"
            "Experiment `domain_addition` with the paper's parameters (K 5..30, n = 100, tau = 1.1, "
            "sigma = 0.8, d = 2), float32 engine; the reference is the NumPy loop version in "
            "`poolsim/_reference.py` (float64). Ratios are engine / reference seeds/s in this run.\n\n"
            + "\n".join(lines) + "\n\n" + targets(rows) + NOTE)
    print(body)
    if not args.no_write:
        write_section(args.out, "Monte-Carlo engine (CPU)", body)
    return body


if __name__ == "__main__":
    main()
