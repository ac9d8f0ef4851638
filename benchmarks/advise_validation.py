"""How good is ``poolsim.advise``? Follow its advice on data with a known target and measure the regret.

For each scenario -- a generating process of K domains with target mu* = 0, inside the paper's model
family or outside it -- ``--datasets`` observed data sets are handed to ``advise``; the *true* risk
``E||estimate - mu*||`` of what it returns (its estimator and tau, started where it starts) is then
computed over ``--fresh`` new data sets from the same process, by the plain one-data-set-at-a-time
loop of ``poolsim._reference.ref_true_risks`` (which shares no code with advise), and divided by the best of pooling and of matching over a fine tau grid
(60 taus, log-spaced, same start) on the same fresh data sets: the regret (1.0 is perfect).

Domain means are drawn as ``mu_k + sigma / sqrt(n_k) z`` (the exact law of a Gaussian domain's
sample mean), so d = 768 costs no more than its means. Writes a Markdown table to stdout and, with
``--out``, the per-data-set rows as CSV.

    python benchmarks/advise_validation.py [--datasets 8] [--fresh 300] [--seeds 400] [--only a,b] [--out F]
"""
from __future__ import annotations

import argparse
import math
import platform
import sys
import time

import numpy as np

import poolsim
from poolsim._reference import ref_true_risks
from poolsim._scenarios import PAPER, SCENARIOS, SIGMA, observe


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", type=int, default=8)
    ap.add_argument("--fresh", type=int, default=300)
    ap.add_argument("--seeds", type=int, default=400, help="advise's seeds per world")
    ap.add_argument("--only", default="", help="comma-separated scenario name prefixes")
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    names = [s for s in SCENARIOS if not a.only or any(s.startswith(p) for p in a.only.split(","))]
    print(f"# advise validation: {a.datasets} observed data sets per scenario, true risk over {a.fresh} fresh "
          f"ones; advise seeds={a.seeds}; {platform.processor() or platform.machine()}, "
          f"{time.strftime('%Y-%m-%d')}, poolsim {poolsim.__version__ if hasattr(poolsim, '__version__') else ''}")
    print("\n| scenario | pool / best | best tau | regret per data set (answer) | max | advise s |")
    print("|---|---:|---:|---|---:|---:|")
    rows, all_regrets = [], []
    for name in names:
        si = list(SCENARIOS).index(name)  # the same data sets whichever scenarios are run
        scenario = SCENARIOS[name]
        rng = np.random.default_rng(1000 + si)
        advice, secs = [], []
        for _ in range(a.datasets):
            m, n = observe(rng, scenario)
            t0 = time.perf_counter()
            adv = poolsim.advise(means=m, sizes=n, sigma=SIGMA, seeds=a.seeds)
            secs.append(time.perf_counter() - t0)
            advice.append(adv)
        scale = float(np.median([adv.fitted["scale"] for adv in advice]))
        grid = scale * np.geomspace(0.05, 8.0, 60)
        followed = np.array([adv.tau for adv in advice])
        fresh_rng = np.random.default_rng(2000 + si)
        pool, match = ref_true_risks(lambda: observe(fresh_rng, scenario), np.concatenate([grid, followed]),
                                     a.fresh)
        risk_pool, risk_match = pool.mean(), match.mean(axis=0)
        best = min(risk_pool, risk_match[:60].min())
        regrets = []
        for i, adv in enumerate(advice):
            r = (risk_pool if adv.estimator == "pool" else risk_match[60 + i]) / best
            regrets.append(r)
            rows.append((name, i, adv.strategy, adv.estimator, adv.tau, r, adv.worst_regret, secs[i]))
        all_regrets += regrets
        answers = ", ".join(f"{r:.2f} ({adv.strategy[0]})" for r, adv in zip(regrets, advice))
        print(f"| {name} | {risk_pool / best:.2f} | {grid[np.argmin(risk_match[:60])]:.3g} | {answers} | "
              f"{max(regrets):.2f} | {np.median(secs):.1f} |", flush=True)
    allr = np.array(all_regrets)
    paper = np.array([r[5] for r in rows if r[0] in PAPER])
    print(f"\nregret <= 1.25 on {np.mean(allr <= 1.25):.0%} of {allr.size} data sets (target >= 90%); "
          f"median {np.median(allr):.3f} (target <= 1.10); paper set-ups: max {paper.max() if paper.size else math.nan:.2f}"
          f" (target <= 1.25 on every data set). Answers: m = match, p = pool, u = undecided.")
    if a.out:
        import pandas as pd
        pd.DataFrame(rows, columns=["scenario", "dataset", "strategy", "estimator", "tau", "regret",
                                    "worst_regret_simulated", "advise_s"]).to_csv(a.out, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
