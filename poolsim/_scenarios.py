"""Generating processes of K domain means with a known target mu* = 0, inside the paper's model family
and outside it: the scenarios on which :func:`poolsim.advise` is validated (``benchmarks/advise_validation.py``,
``tests/test_advise.py``, the documentation page "How good is the advice?").

Each scenario is ``f(rng) -> (mu (K, d), sizes (K,))``: the domains' true means and sample sizes; a data
set observes ``mu_k + sigma / sqrt(n_k) z`` (the exact law of a Gaussian domain's sample mean). The
parameters are the paper's where a scenario is named after it, else ours.
"""
from __future__ import annotations

import numpy as np

SIGMA = 0.8  # the within-domain standard deviation of every scenario (the paper's)


def contaminated(K, n, d, gamma, p, shift):
    """The paper's contaminated law: K domain means ``N(0, gamma^2 I_d)`` of ``n`` samples each, a share
    ``p`` of them shifted by ``shift`` along the first axis."""
    def scenario(rng):
        mu = gamma * rng.normal(size=(K, d))
        mu[rng.random(K) < p, 0] += shift
        return mu, np.full(K, n)
    return scenario


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


def scattered(rng, K=40, n=100, d=5):  # 20% of the domains from a wide law centred on the target
    mu = 0.5 * rng.normal(size=(K, d))
    out = rng.random(K) < 0.2
    mu[out] = 2.0 * rng.normal(size=(out.sum(), d))
    return mu, np.full(K, n)


def two_distances(rng, K=50, n=100, d=3):  # 10% at distance 1.5 and 10% at 4, random directions
    mu = 0.5 * rng.normal(size=(K, d))
    u = rng.random(K)
    for sel, r in ((u < 0.1, 1.5), ((u >= 0.1) & (u < 0.2), 4.0)):
        v = rng.normal(size=(sel.sum(), d))
        mu[sel] += r * v / np.linalg.norm(v, axis=1, keepdims=True)
    return mu, np.full(K, n)


def anisotropic_inliers(p, shift, K=40, n=100):  # inliers' sds 0.8 and 0.25; outliers along the short axis
    def scenario(rng):
        mu = rng.normal(size=(K, 2)) * np.array([0.8, 0.25])
        mu[rng.random(K) < p, 1] += shift
        return mu, np.full(K, n)
    return scenario


def laplace_means(rng, K=40, n=100, d=3):
    return 0.4 * rng.laplace(size=(K, d)), np.full(K, n)


def ring(rng, K=40, n=100, d=2):  # 25% on a circle of radius 2 about the target: symmetric, pooling unbiased
    mu = 0.5 * rng.normal(size=(K, d))
    out = rng.random(K) < 0.25
    v = rng.normal(size=(out.sum(), d))
    mu[out] = 2.0 * v / np.linalg.norm(v, axis=1, keepdims=True)
    return mu, np.full(K, n)


SCENARIOS = {
    # the asymptotic figure's law (experiments.EXPERIMENTS["asymptotic"]) at K = 50, and at K = 30
    "paper asymptotic (K=50)": contaminated(50, 150, 2, 0.5, 0.3, 1.5),
    "paper asymptotic (K=30)": contaminated(30, 100, 2, 0.5, 0.3, 1.5),
    "paper domain addition": paper_domain_addition,
    "heavy-tailed means (t2)": heavy_tailed,
    "outliers along two directions": two_directions,
    "clean (no outliers)": clean,
    "larger d (d=20)": contaminated(30, 100, 20, 0.3, 0.2, 2.0),
    "few domains (K=8)": few_domains,
    "unequal domain sizes": unequal_sizes,
    "gradual drift": gradual_drift,
    "tight outlier cluster": tight_cluster,
    "anisotropic (d=64)": anisotropic,
    "CLIP width (d=768, K=6)": clip_width,
    # added after the goodness-of-fit check was chosen on the scenarios above, and run once with it
    "paper asymptotic (K=100)": contaminated(100, 150, 2, 0.5, 0.3, 1.5),
    "scattered outliers (d=5)": scattered,
    "near breakdown (40% at 3)": contaminated(40, 100, 2, 0.5, 0.4, 3.0),
    "outliers at two distances (d=3)": two_distances,
    # a wider held-out set, written and run once after that: variations of K, d, n, share and shift
    # inside the paper's family, and laws outside it (anisotropic inliers, Laplace, a ring)
    "anisotropic inliers, clean (d=2)": anisotropic_inliers(0.0, 0.0),
    "anisotropic inliers, 20% at 2 on the short axis": anisotropic_inliers(0.2, 2.0),
    "K=20, 20% at 2": contaminated(20, 100, 2, 0.5, 0.2, 2.0),
    "K=80, 20% at 1.2 (overlapping)": contaminated(80, 100, 2, 0.5, 0.2, 1.2),
    "d=5, 30% at 2": contaminated(40, 100, 5, 0.5, 0.3, 2.0),
    "d=10, 10% at 1.5": contaminated(40, 100, 10, 0.3, 0.1, 1.5),
    "K=12, 25% at 2": contaminated(12, 100, 2, 0.5, 0.25, 2.0),
    "Laplace means (d=3)": laplace_means,
    "25% on a ring of radius 2": ring,
    "large domains (n=2000), 20% at 1": contaminated(30, 2000, 2, 0.2, 0.2, 1.0),
    "small domains (n=10), 20% at 1.5": contaminated(30, 10, 2, 0.2, 0.2, 1.5),
    "clean (K=60, d=3)": contaminated(60, 100, 3, 0.5, 0.0, 0.0),
}
PAPER = ("paper asymptotic (K=50)", "paper domain addition")
"""The scenarios that are the paper's own set-ups."""


def observe(rng: np.random.Generator, scenario) -> tuple[np.ndarray, np.ndarray]:
    """One observed data set of ``scenario``: ``(means (K, d), sizes (K,) as floats)``."""
    mu, n = scenario(rng)
    n = np.asarray(n, float)
    return mu + SIGMA / np.sqrt(n)[:, None] * rng.normal(size=mu.shape), n


__all__ = ["PAPER", "SCENARIOS", "SIGMA", "contaminated", "observe"]
