"""Benchmark: the figure ``baselines``' MinCovDet fits, batched (:func:`poolsim.figures._mcd.mcd_locations`)
against one scikit-learn ``MinCovDet`` fit per seed in this process (the straightforward reference), on
the figure's own inputs (the first 200 seeds' domain sample means of ``asymptotic`` and
``domain_addition`` at their final K); also the whole ``estimate_all`` of each. Prints process CPU
and wall time, the ratio, whether the locations are equal, and the load average. Not a test;
numbers in benchmarks/results/figures_run.md.

    python benchmarks/baselines_mcd.py
"""
import os
import time

import numpy as np

from poolsim.figures import _baselines, _data, _mcd, baselines


def timed(f):
    w, c = time.perf_counter(), time.process_time()
    out = f()
    return out, time.perf_counter() - w, time.process_time() - c


def main():
    S, Sb = 1000, baselines.MAX_SEEDS  # the default run's seeds and the figure's cap
    for name in baselines.EXPERIMENTS:
        res, P = _data.simulation(name, seeds=S)
        x = np.asarray(res.xbar[:Sb], dtype=float)
        seeds = np.asarray(P["seeds"][:Sb])
        xk = x[:, :P["Ks"][-1]]
        got, wb, cb = timed(lambda: _mcd.mcd_locations(xk, seeds))
        want, ws, cs = timed(lambda: np.stack([_mcd.sklearn_location(a, int(s)) for a, s in zip(xk, seeds)]))
        outlier = _data.labels(name, seeds=S)[:Sb]
        _, we, ce = timed(lambda: _baselines.estimate_all(x, P["Ks"], seeds, outlier, mcd_seeds=baselines.MCD_SEEDS))
        print(f"{name}: {len(xk)} MCD fits of {xk.shape[1:]}: batched {wb:.2f} s wall / {cb:.2f} s CPU, "
              f"sklearn loop {ws:.2f} s / {cs:.2f} s CPU ({cs / cb:.0f}x CPU), equal: {np.array_equal(got, want)}; "
              f"estimate_all (every estimator, {len(P['Ks'])} K) {we:.2f} s wall / {ce:.2f} s CPU")
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
