"""Benchmark: ``poolsim.advise`` in one process vs its two simulations as scheduler jobs
(``resources=Resources(executor="processes", max_concurrent=J)``), both in the same run.

Not a test. Each measurement is a fresh driver process, timed from before ``import poolsim`` to the
returned advice (imports and compiles included, as a user pays them); the advice of every run is
compared with the first local one (it must be the same, bit for bit). The runs alternate local / jobs
so that a change of the machine's load hits both; the 1-minute load average is printed with each.
A fresh JAX compile cache per run (``POOLSIM_CACHE_DIR``) unless ``--warm-cache``: then the jobs may
load the program the local run compiled.

    python benchmarks/cluster_advise.py [--seeds 1000] [--workers 2] [--repeat 2] [--warm-cache]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import sys, time, pickle
t0 = time.perf_counter()
import numpy as np
import poolsim
from poolsim import cluster
seeds, workers, jobs_dir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
rng = np.random.default_rng(3)
X = rng.normal(size=(12, 50, 2))
X[:3] += 4.0
res = None if workers == 0 else cluster.Resources(executor="processes", max_concurrent=workers, poll_s=0.2)
a = poolsim.advise(X, seeds=seeds, resources=res, jobs_dir=jobs_dir if res else None)
print(f"{time.perf_counter() - t0:.2f}")
sys.stdout.flush()
sys.stderr.write(repr((a.strategy, a.tau, a.tau_range, a.eps, a.vs_pool, a.vs_subsample)) + "\n")
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=1000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--warm-cache", action="store_true")
    args = ap.parse_args(argv)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    shared_cache = tempfile.mkdtemp(prefix="advise-cache-")
    first = None
    print(f"| run | seeds | wall s | load |\n|---|---|---|---|")
    for _ in range(args.repeat):
        for workers in (0, args.workers):
            cache = shared_cache if args.warm_cache else tempfile.mkdtemp(prefix="advise-cache-")
            env = {**os.environ, "PYTHONPATH": root, "POOLSIM_CACHE_DIR": cache, "JAX_PLATFORMS": "cpu"}
            with tempfile.TemporaryDirectory(prefix="advise-jobs-") as jobs:
                r = subprocess.run([sys.executable, "-c", CHILD, str(args.seeds), str(workers), jobs], env=env,
                                   capture_output=True, text=True, check=True)
            advice = r.stderr.strip().splitlines()[-1]
            first = first or advice
            if advice != first:
                raise SystemExit(f"the advice differs between runs:\n{first}\n{advice}")
            label = "local" if workers == 0 else f"processes, {workers} workers"
            print(f"| {label} | {args.seeds} | {float(r.stdout.split()[-1]):.1f} | {os.getloadavg()[0]:.1f} |",
                  flush=True)
    print("every run gave the same advice")
    return 0


if __name__ == "__main__":
    sys.exit(main())
