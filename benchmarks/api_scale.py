"""Benchmark: the public API (`poolsim.match`, `subsample`, `naive_pool`) on NumPy input vs the plain loop.

Not a test. In one run, on the same arrays: the anchor loop's `match`, `subsample` and `naive_pool`
(`../shared/anchors/naive_poolsim.py`, imported by path here only -- never by the package) against
poolsim's, at several sizes up to X: (1000, 200, 768) float32; then the first call on a new shape of
each public function, in a fresh process (JAX not imported beforehand): the first call of the process
and a call on a second new shape.

Set-up per size (the anchors' `asymptotic` data): domain means `0.5 N(0, I)`, 30% shifted by 1.5 along
e1, samples `N(mu_k, 0.8^2 I)`; `tau = 1.2 sqrt(d / 2)` (the anchor's 1.2 at d = 2, grown with the
typical norm), median start, `tol = 1e-4`, `max_iter = 100` on both sides; subsampling `m = K // 2`,
`n = N // 2`. Each cell is the minimum over `--repeat` runs (one run where a call takes over 2 s).

With `--before REV` the same first-call probes and the large `match` also run poolsim as committed at
git revision REV (`git archive REV poolsim`, same venv), so before/after share the machine's load.

    python benchmarks/api_scale.py [--repeat 5] [--before REV] [--sizes small,mid,wide,big]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
ANCHORS = ROOT.parent / "shared" / "anchors"
SIZES = {"small": ((50, 100, 2), np.float64), "mid": ((1000, 1000, 2), np.float64),
         "wide": ((200, 100, 256), np.float64), "big": ((1000, 200, 768), np.float32)}

PROBE = r"""
import json, sys, time
t0 = time.perf_counter()
import numpy as np
import poolsim
out = {"import": time.perf_counter() - t0}
rng = np.random.default_rng(0)
for tag, shape in (("first", (50, 100, 2)), ("new shape", (60, 90, 3))):
    X = rng.normal(size=shape)
    K, N, _ = shape
    for name, call in (("match", lambda: poolsim.match(X, 1.2)),
                       ("subsample", lambda: poolsim.subsample(1, X, K // 2, N // 2)),
                       ("naive_pool", lambda: poolsim.naive_pool(X))):
        t = time.perf_counter(); call(); out[f"{name} {tag}"] = time.perf_counter() - t
out["jax imported"] = "jax" in sys.modules
print(json.dumps(out))
"""


def load_anchor():
    spec = importlib.util.spec_from_file_location("naive_poolsim_anchor", ANCHORS / "naive_poolsim.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def make_data(shape, dtype, seed=0):
    K, N, d = shape
    rng = np.random.default_rng(seed)
    mus = 0.5 * rng.normal(size=(K, d))
    mus[rng.random(K) < 0.3, 0] += 1.5
    X = rng.standard_normal((K, N, d), dtype=np.float32 if dtype == np.float32 else np.float64)
    X *= 0.8
    X += mus[:, None, :].astype(dtype)
    return X


def best(call, repeat):
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = call()
        times.append(time.perf_counter() - t)
        if times[-1] > 2.0:
            break
    return min(times), out


def before_tree(rev: str) -> Path:
    folder = Path(tempfile.mkdtemp(prefix="api_scale_before_"))
    data = subprocess.run(["git", "archive", rev, "poolsim"], cwd=ROOT, capture_output=True, check=True).stdout
    with tempfile.TemporaryFile() as f:
        f.write(data)
        f.seek(0)
        tarfile.open(fileobj=f).extractall(folder, filter="data")
    return folder


def probe(path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_") or k == "JAX_PLATFORMS"}
    env["PYTHONPATH"] = str(path)
    res = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, cwd=path,
                         check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def big_match_before(path: Path, shape, dtype) -> float:
    code = ("import time, numpy as np, sys\nsys.path.insert(0, sys.argv[1])\nimport poolsim\n"
            f"sys.path.insert(0, {str(ROOT / 'benchmarks')!r})\nfrom api_scale import make_data\n"
            f"X = make_data({shape!r}, np.{np.dtype(dtype).name})\n"
            f"t = time.perf_counter(); poolsim.match(X, {1.2 * np.sqrt(shape[2] / 2)!r}); "
            "print(time.perf_counter() - t)")
    res = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True,
                         cwd=path)
    return float(res.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--before", default=None, help="git revision of poolsim to time alongside")
    ap.add_argument("--sizes", default=",".join(SIZES))
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    import poolsim

    anchor = load_anchor()
    load0 = os.getloadavg()[0]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, NumPy {np.__version__}; commit {commit}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load before {load0:.2f}")
    print("\n| X (K, N, d) dtype | call | loop [s] | poolsim [s] | poolsim / loop | check |")
    print("|---|---|---:|---:|---:|---|")
    big = None
    for name in args.sizes.split(","):
        shape, dtype = SIZES[name]
        K, N, d = shape
        X = make_data(shape, dtype)
        tau = 1.2 * np.sqrt(d / 2)
        t_loop, c_loop = best(lambda: anchor.match(X, tau), args.repeat)
        t_ours, res = best(lambda: poolsim.match(X, tau), args.repeat)
        diff = float(np.max(np.abs(np.asarray(res.centroid, float) - c_loop)))
        label = f"{shape} {np.dtype(dtype).name}"
        print(f"| {label} | match (tau {tau:.3g}: {int(res.included.sum())}/{K} domains, {res.n_iter} iter) "
              f"| {t_loop:.4f} | {t_ours:.4f} | {t_ours / t_loop:.2f} | centroids differ by {diff:.1e} |")
        gen = np.random.default_rng(1)
        t_loop, _ = best(lambda: anchor.subsample(gen, X, K // 2, N // 2), args.repeat)
        t_ours, _ = best(lambda: poolsim.subsample(1, X, K // 2, N // 2), args.repeat)
        print(f"| {label} | subsample (m {K // 2}, n {N // 2}) | {t_loop:.4f} | {t_ours:.4f} | "
              f"{t_ours / t_loop:.2f} | |")
        t_loop, p_loop = best(lambda: anchor.naive_pool(X), args.repeat)
        t_ours, p_ours = best(lambda: poolsim.naive_pool(X), args.repeat)
        diff = float(np.max(np.abs(np.asarray(p_ours.mean, float) - p_loop)))
        print(f"| {label} | naive_pool | {t_loop:.4f} | {t_ours:.4f} | {t_ours / t_loop:.2f} | "
              f"means differ by {diff:.1e} |")
        if name == "big":
            big = (shape, dtype)
    trees = [("now", ROOT)]
    if args.before:
        trees.append((f"before ({args.before})", before_tree(args.before)))
    print("\nFirst calls in a fresh process (seconds; JAX not imported beforehand):\n")
    rows = [(label, probe(path)) for label, path in trees]
    keys = list(rows[0][1])
    print("| code | " + " | ".join(keys) + " |")
    print("|---|" + "---:|" * len(keys))
    for label, r in rows:
        print(f"| {label} | " + " | ".join(str(v) if isinstance(v, bool) else f"{v:.3f}" for v in r.values()) + " |")
    if args.before and big is not None:
        t = big_match_before(trees[1][1], *big)
        print(f"\nbefore ({args.before}): poolsim.match on {big[0]} {np.dtype(big[1]).name}: {t:.2f} s")
    print(f"\nload after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
