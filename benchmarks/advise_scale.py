"""``poolsim.advise`` at CLIP's width: wall time and peak memory of one call, each in a fresh process.

Per-domain feature means (the ``means=`` path adsim's users have), d = 768, K from 6 to 100, n up to
1000, default 1000 seeds; one domain in six far off. Targets: within 60 s and 4 GB on a 2-core CPU.
With ``--x`` also the ``X (K, N, d)`` path at the given N.

    python benchmarks/advise_scale.py [--Ks 6,20,50,100] [--n 1000] [--d 768] [--seeds 1000]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import json, resource, sys, time
import numpy as np
import poolsim
K, n, d, seeds, x = (int(v) for v in sys.argv[1:6])
rng = np.random.default_rng(0)
mu = 0.1 * rng.normal(size=(K, d))
mu[::6] += 8.0 / np.sqrt(d)
t0 = time.perf_counter()
if x:
    X = (mu[:, None, :] + 0.8 * rng.normal(size=(K, x, d))).astype(np.float32)
    t0 = time.perf_counter()
    a = poolsim.advise(X, seeds=seeds)
else:
    m = mu + 0.8 / np.sqrt(n) * rng.normal(size=(K, d))
    a = poolsim.advise(means=m, sizes=np.full(K, n), sigma=0.8, seeds=seeds)
dt = time.perf_counter() - t0
print(json.dumps(dict(K=K, n=x or n, d=d, seeds=seeds, path="X" if x else "means", seconds=dt,
                      peak_gb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                      strategy=a.strategy, worlds=len(a.worlds))))
"""


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--Ks", default="6,20,50,100")
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--d", type=int, default=768)
    ap.add_argument("--seeds", type=int, default=1000)
    ap.add_argument("--x", type=int, default=0, help="also the X path with this many samples per domain")
    a = ap.parse_args(argv)
    print("| path | K | n | d | seeds | wall s | peak GB | worlds | answer |\n|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for K in (int(k) for k in a.Ks.split(",")):
        for x in ([0, a.x] if a.x else [0]):
            out = subprocess.run([sys.executable, "-c", CHILD, str(K), str(a.n), str(a.d), str(a.seeds), str(x)],
                                 capture_output=True, text=True, check=True).stdout
            r = json.loads(out.strip().splitlines()[-1])
            print(f"| {r['path']} | {K} | {r['n']} | {r['d']} | {r['seeds']} | {r['seconds']:.1f} | "
                  f"{r['peak_gb']:.2f} | {r['worlds']} | {r['strategy']} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
