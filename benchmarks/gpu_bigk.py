"""The engine at large K on the device: ``experiments.simulate("asymptotic", Ks=(10, K))``, sufficient
statistics, at 1,000 seeds for K up to 10^6 (issue 42's GPU target), with the engine's default memory
budget (3/4 of the device's free memory on an accelerator; ``--budget`` sets one).

Per K: the first call (compiles), the warm call, seeds/s, the chunk plan, and the device's peak memory
(``jax.local_devices()[0].memory_stats()["peak_bytes_in_use"]`` where the backend reports it, else the
process's ``ru_maxrss``). Prints a Markdown table and the fitted slope of warm time in K
(``np.polyfit`` of log10 over the K values >= 10^4); ``--targets FILE`` appends
``name|measured|target|ok`` rows (benchmarks/gpu_targets.py). Runs on a CPU too (small ``--Ks``).

    python benchmarks/gpu_bigk.py [--Ks 1000,10000,100000,1000000] [--seeds 1000] [--budget 4GB]
        [--targets targets.txt]
"""
from __future__ import annotations

import argparse
import os
import resource
import time

import numpy as np


def peak_bytes() -> tuple[float, str]:
    import jax

    stats = jax.local_devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        return float(stats["peak_bytes_in_use"]), "device peak"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0, "process ru_maxrss"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--Ks", default="1000,10000,100000,1000000")
    ap.add_argument("--seeds", type=int, default=1000)
    ap.add_argument("--budget", default=None, help="memory budget (default: the engine's own)")
    ap.add_argument("--targets", default=None, help="append name|measured|target|ok rows here")
    a = ap.parse_args()
    if a.budget:
        os.environ["POOLSIM_MEMORY_BUDGET"] = a.budget
    import jax

    from poolsim import experiments as ex
    from poolsim._engine import chunk_plan

    Ks = [int(k) for k in a.Ks.split(",")]
    print(f"device {jax.devices()[0].device_kind}, backend {jax.default_backend()}, seeds {a.seeds}", flush=True)
    print("| K | chunks | first s | warm s | seeds/s | peak GB | peak of |")
    print("|---|---|---:|---:|---:|---:|---|")
    rows = []
    for K in Ks:
        kw = dict(Ks=(10, K), materialize=False)
        try:
            spec, _ = ex.spec("asymptotic", **kw)
            plan = chunk_plan(a.seeds, spec, included=False)  # FRAME_FIELDS: no `included`
            t = time.perf_counter()
            ex.simulate("asymptotic", seeds=a.seeds, fields=ex.FRAME_FIELDS, **kw)
            first = time.perf_counter() - t
            t = time.perf_counter()
            ex.simulate("asymptotic", seeds=a.seeds, fields=ex.FRAME_FIELDS, **kw)
            warm = time.perf_counter() - t
        except Exception as e:  # a size that fails is a row of the table, not the end of the sweep
            print(f"| {K} | - | failed: {type(e).__name__}: {str(e)[:120]} | | | | |", flush=True)
            rows.append((K, None))
            continue
        peak, what = peak_bytes()
        print(f"| {K} | {len(plan.sizes)} x {plan.sizes[0]} | {first:.2f} | {warm:.2f} | "
              f"{a.seeds / warm:.0f} | {peak / 1e9:.2f} | {what} |", flush=True)
        rows.append((K, warm))
    ok = [(K, w) for K, w in rows if w is not None and K >= 10**4]
    if len(ok) >= 2:
        slope = np.polyfit(np.log10([K for K, _ in ok]), np.log10([w for _, w in ok]), 1)[0]
        print(f"\nwarm time slope in K (K >= 10^4): {slope:.2f}")
    if a.targets:
        with open(a.targets, "a") as f:
            for K, w in rows:
                if K == 10**6:
                    f.write(f"engine K=10^6 at {a.seeds} seeds (sufficient)|"
                            f"{'failed' if w is None else f'{w:.2f} s warm'}|runs within the budget|"
                            f"{'NO' if w is None else 'yes'}\n")


if __name__ == "__main__":
    main()
