"""The engine at large K, n, d against the NumPy loop ``../shared/anchors/naive_bigK.py`` (run as a
separate process in the same run; never imported): seeds/s, the ratio, and each case's peak memory
(``ru_maxrss`` of a child process running only that case, warm time = a second call in the child).

    python benchmarks/engine_bigk.py [--anchor PATH] [--quick]

Cases (issue 42's targets): Ks=(10, 1000) sufficient and materialised vs the loop; Ks up to 10^4 at
1,000 seeds within a 4 GB budget; K = 10^5; d = 768, n = 1000 materialised at 100 seeds within 4 GB.
"""
import argparse
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHILD = r"""
import json, resource, sys, time
from poolsim import experiments as ex
kw = json.loads(sys.argv[1]); S = kw.pop("seeds")
t = time.perf_counter(); ex.simulate("asymptotic", seeds=S, fields=ex.FRAME_FIELDS, **kw)
first = time.perf_counter() - t
t = time.perf_counter(); ex.simulate("asymptotic", seeds=S, fields=ex.FRAME_FIELDS, **kw)
warm = time.perf_counter() - t
print(json.dumps({"first": first, "warm": warm,
                  "peak_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}))
"""


def engine(budget=None, **kw):
    env = dict(os.environ, PYTHONPATH=ROOT)
    if budget:
        env["POOLSIM_MEMORY_BUDGET"] = budget
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(kw)], env=env, check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def anchor(path, S, Ks, d=2):
    out = subprocess.run([sys.executable, path, str(S), ",".join(map(str, Ks)), str(d)], check=True,
                         capture_output=True, text=True).stdout
    return float(re.search(r"seeds_per_s=([0-9.]+)", out).group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--anchor", default=os.path.join(ROOT, "..", "shared", "anchors", "naive_bigK.py"))
    ap.add_argument("--quick", action="store_true", help="leave out the d = 768 case")
    a = ap.parse_args()
    print(f"load {os.getloadavg()}, commit {subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=ROOT, capture_output=True, text=True).stdout.strip()}", flush=True)
    loop = anchor(a.anchor, 20, (10, 1000))
    print(f"loop Ks=(10, 1000): {loop:.1f} seeds/s", flush=True)
    cases = [("Ks=(10,1000) sufficient", 1000, None, dict(Ks=(10, 1000), materialize=False), True),
             ("Ks=(10,1000) materialised", 200, None, dict(Ks=(10, 1000), materialize=True), True),
             ("Ks=(10,100,1000,10^4) sufficient", 1000, "4GB",
              dict(Ks=(10, 100, 1000, 10**4), materialize=False), False),
             ("Ks=(10,10^5) sufficient", 100, "4GB", dict(Ks=(10, 10**5), materialize=False), False)]
    if not a.quick:
        cases.append(("d=768 n=1000 materialised (Ks 5..50)", 100, "4GB",
                      dict(d=768, n=1000, materialize=True), False))
    print("| case | seeds | budget | first s | warm s | seeds/s | vs loop | peak GB |")
    print("|---|---|---|---|---|---|---|---|")
    for name, S, budget, kw, ratio in cases:
        r = engine(budget, seeds=S, **kw)
        sps = S / r["warm"]
        print(f"| {name} | {S} | {budget or 'default'} | {r['first']:.2f} | {r['warm']:.2f} | "
              f"{sps:.0f} | {f'{sps / loop:.0f}x' if ratio else '-'} | {r['peak_gb']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
