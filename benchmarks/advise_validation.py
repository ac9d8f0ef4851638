"""How good is ``poolsim.advise``? Follow its advice on data with a known target and measure the regret.

For each scenario -- a generating process of K domains with target mu* = 0, inside the paper's model
family or outside it -- ``--datasets`` observed data sets are handed to ``advise``; the *true* risk
``E||estimate - mu*||`` of what it returns (its estimator and tau, started where it starts) is then
computed over ``--fresh`` new data sets from the same process, by a plain NumPy loop written here
(not advise's simulation), and divided by the best of pooling and of matching over a fine tau grid
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

SIGMA = 0.8


def _contaminated(rng, K, n, d, gamma, p, shift):
    mu = gamma * rng.normal(size=(K, d))
    mu[rng.random(K) < p, 0] += shift
    return mu, np.full(K, n)


def paper_asymptotic(rng):  # the asymptotic figure's law (experiments.EXPERIMENTS["asymptotic"]) at K = 50
    return _contaminated(rng, 50, 150, 2, 0.5, 0.3, 1.5)


def paper_asymptotic_k30(rng):
    return _contaminated(rng, 30, 100, 2, 0.5, 0.3, 1.5)


def paper_domain_addition(rng, K=30, n=100, d=2):  # every third domain at radius 2.5 (Fig. domain addition)
    mu = 0.5 * rng.normal(size=(K, d))
    for k in range(2, K, 3):
        v = np.eye(d)[0] + 0.2 * rng.normal(size=d)
        mu[k] = 2.5 * v / np.linalg.norm(v)
    return mu, np.full(K, n)


def heavy_tailed(rng, K=30, n=100, d=2):  # Student t (2 dof) means, scale 0.5: symmetric, no "outliers"
    return 0.5 * rng.standard_t(2, size=(K, d)), np.full(K, n)


def two_directions(rng, K=40, n=50, d=2):
    mu = 0.5 * rng.normal(size=(K, d))
    u = rng.random(K)
    mu[u < 0.15, 0] += 2.0
    mu[(u >= 0.15) & (u < 0.3), 1] += 2.0
    return mu, np.full(K, n)


def clean(rng, K=30, n=100, d=2):
    return 0.5 * rng.normal(size=(K, d)), np.full(K, n)


def larger_d(rng):
    return _contaminated(rng, 30, 100, 20, 0.3, 0.2, 2.0)


def few_domains(rng, K=8, n=100, d=2):  # 2 of 8 shifted by 3
    mu = 0.5 * rng.normal(size=(K, d))
    mu[:2, 0] += 3.0
    return mu, np.full(K, n)


def unequal_sizes(rng, K=30, d=2):
    mu = 0.5 * rng.normal(size=(K, d))
    mu[rng.random(K) < 0.2, 0] += 2.0
    return mu, rng.integers(20, 500, size=K)


def gradual_drift(rng, K=30, n=100, d=2):  # the last 40% of the domains drift away linearly to 3
    mu = 0.4 * rng.normal(size=(K, d))
    t = np.arange(K) / (K - 1)
    mu[:, 0] += 3.0 * np.clip((t - 0.6) / 0.4, 0.0, None)
    return mu, np.full(K, n)


def tight_cluster(rng, K=30, n=100, d=2):  # 25% in a tight cluster (spread 0.05) at 1.5
    mu = 0.5 * rng.normal(size=(K, d))
    out = rng.random(K) < 0.25
    mu[out] = np.eye(d)[0] * 1.5 + 0.05 * rng.normal(size=(out.sum(), d))
    return mu, np.full(K, n)


def anisotropic(rng, K=20, n=200, d=64):  # power-law spectrum inliers, 25% shifted by 5 along a random direction
    ev = 1.0 / np.arange(1, d + 1)
    ev *= 0.25 * d / ev.sum()
    mu = rng.normal(size=(K, d)) * np.sqrt(ev)
    v = rng.normal(size=d)
    mu[rng.random(K) < 0.25] += 5.0 * v / np.linalg.norm(v)
    return mu, np.full(K, n)


def clip_width(rng, K=6, n=50, d=768):  # six modalities at CLIP's width, one far off (anisotropic)
    ev = 1.0 / np.arange(1, d + 1)
    ev *= 0.01 * d / ev.sum()
    mu = rng.normal(size=(K, d)) * np.sqrt(ev)
    v = rng.normal(size=d)
    mu[0] += 8.0 * v / np.linalg.norm(v)
    return mu, np.full(K, n)


SCENARIOS = {
    "paper asymptotic (K=50)": paper_asymptotic,
    "paper asymptotic (K=30)": paper_asymptotic_k30,
    "paper domain addition": paper_domain_addition,
    "heavy-tailed means (t2)": heavy_tailed,
    "outliers along two directions": two_directions,
    "clean (no outliers)": clean,
    "larger d (d=20)": larger_d,
    "few domains (K=8)": few_domains,
    "unequal domain sizes": unequal_sizes,
    "gradual drift": gradual_drift,
    "tight outlier cluster": tight_cluster,
    "anisotropic (d=64)": anisotropic,
    "CLIP width (d=768, K=6)": clip_width,
}
PAPER = ("paper asymptotic (K=50)", "paper domain addition")


def observe(rng, scenario):
    mu, n = scenario(rng)
    n = np.asarray(n, float)
    return mu + SIGMA / np.sqrt(n)[:, None] * rng.normal(size=mu.shape), n


# --- the plain reference: one data set at a time ----------------------------------------------------
def geometric_median(m):
    c = m.mean(axis=0)
    for _ in range(200):
        r = np.linalg.norm(m - c, axis=1)
        if np.any(r < 1e-12):
            return m[np.argmin(r)]
        c_new = (m / r[:, None]).sum(axis=0) / (1.0 / r).sum()
        if np.linalg.norm(c_new - c) < 1e-12:
            return c_new
        c = c_new
    return c


def matched_mean(m, n, tau, c, tol=1e-4, max_iter=100):
    for _ in range(max_iter):
        inside = np.linalg.norm(m - c, axis=1) < tau
        if not inside.any():
            return c
        new = (n[inside, None] * m[inside]).sum(axis=0) / n[inside].sum()
        if np.linalg.norm(new - c) < tol:
            return new
        c = new
    return c


def true_risks(scenario, taus, fresh, seed):
    """Mean ||error|| of pooling and of matching at each tau over ``fresh`` new data sets."""
    rng = np.random.default_rng(seed)
    pool, match = np.zeros(fresh), np.zeros((fresh, len(taus)))
    for i in range(fresh):
        m, n = observe(rng, scenario)
        pool[i] = np.linalg.norm((n[:, None] * m).sum(axis=0) / n.sum())
        c0 = geometric_median(m)
        match[i] = [np.linalg.norm(matched_mean(m, n, t, c0)) for t in taus]
    return pool, match


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
        pool, match = true_risks(scenario, np.concatenate([grid, followed]), a.fresh, 2000 + si)
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
