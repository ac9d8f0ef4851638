"""Small JAX Monte-Carlo helpers for the theory tests and the claims audit.

Seeds are vmapped: every function takes ``S`` keys and returns arrays with a leading seed axis.
They call the public strategies (``naive_pool``, ``subsample``, ``match``) on jax arrays, so what is
checked is the shipped code. Shapes: ``X: (S, K, N, d)``.
"""
from __future__ import annotations

from functools import partial
from typing import Any, NamedTuple

import jax
import numpy as np

from . import _strategies
from .metadist import MetaDist


class Estimate(NamedTuple):
    """Mean over seeds with its standard error (both ``(...)`` like one seed's value)."""

    mean: np.ndarray
    se: np.ndarray
    n: int


def mean_se(values: Any) -> Estimate:
    """Mean and standard error over axis 0 (``ddof=1``)."""
    v = np.asarray(values, dtype=float)
    return Estimate(v.mean(axis=0), v.std(axis=0, ddof=1) / np.sqrt(v.shape[0]), v.shape[0])


def domains(md: MetaDist, seed: int, S: int, K: int, N: int, sigma: float):
    """``S`` independent draws of ``X: (S, K, N, d)``: ``mu_k ~ md`` (one call of ``md`` for all
    ``S K`` means, so it is valid only for i.i.d. laws), ``x = mu_k + sigma z``."""
    if not md.iid:
        raise ValueError(f"domains() draws all seeds in one call; {md.name!r} is not i.i.d.")
    k1, k2 = jax.random.split(jax.random.key(seed))
    mu = md(k1, S * K).reshape(S, K, 1, md.d)
    return mu + sigma * jax.random.normal(k2, (S, K, N, md.d), dtype=mu.dtype)


@partial(jax.jit, static_argnames=("m", "n", "metric"))
def estimates(X, keys, tau, init, *, m: int, n: int, metric: str = "l2"):
    """Per seed: pooled mean ``(S, d)``, the ``m n`` subsampled points ``(S, m n, d)`` (their mean
    is the subsampling estimate), matched mean ``(S, d)``, matched-domain weights ``(S, K)``.

    ``init: (d,)`` explicit start of the matching iteration (the same for every seed) or ``None``
    for the coordinate-wise median.
    """
    def one(x, key):
        pooled = _strategies.naive_pool(x).mean
        sub = _strategies.subsample(key, x, m, n)
        points = x[sub.domains[:, None], sub.indices].reshape(m * n, x.shape[-1])
        mt = _strategies.match(x, tau, metric=metric, init="median" if init is None else init)
        return pooled, points, mt.mean, mt.included

    return jax.vmap(one)(X, keys)


def pooled_cov(X, weights=None):
    """Per seed: covariance ``(S, d, d)`` of the pooled samples of the domains with weight 1
    (all domains when ``weights`` is None), around their own mean (population form)."""
    X = np.asarray(X, dtype=float)
    S, K, N, d = X.shape
    w = np.ones((S, K)) if weights is None else np.asarray(weights, dtype=float)
    wn = np.repeat(w, N, axis=1)[..., None]  # (S, K N, 1)
    flat = X.reshape(S, K * N, d)
    tot = wn.sum(axis=1)
    mean = (wn * flat).sum(axis=1) / tot
    dev = flat - mean[:, None, :]
    return np.einsum("ski,skj->sij", wn * dev, dev) / tot[..., None]


@partial(jax.jit, static_argnames=("m", "n"))
def subsample_points(X, keys, *, m: int, n: int):
    """Per seed: the ``m n`` points uniform subsampling picks, ``(S, m n, d)``."""
    def one(x, key):
        sub = _strategies.subsample(key, x, m, n)
        return x[sub.domains[:, None], sub.indices].reshape(m * n, x.shape[-1])

    return jax.vmap(one)(X, keys)


def loglog_slope(taus: Any, counts: Any, n: int, p_exact: Any):
    """Weighted least-squares slope of ``log(counts / n)`` on ``log(taus)`` (independent binomial
    counts, one per tau) with its standard error, and the slope of ``log(p_exact)`` under the same
    weights ``n p/(1-p)`` (1/Var of log p-hat, delta method, taken at ``p_exact`` so both fits use
    identical weights and the comparison has no curvature bias). Returns ``(slope, se, exact)``."""
    taus, p_exact = np.asarray(taus, float), np.asarray(p_exact, float)
    w = n * p_exact / (1 - p_exact)
    A = np.stack([np.ones_like(taus), np.log(taus)], axis=1)
    cov = np.linalg.inv(A.T @ (w[:, None] * A))
    fit = cov @ A.T @ (w[:, None] * np.log(np.stack([np.asarray(counts, float) / n, p_exact], 1)))
    return float(fit[1, 0]), float(np.sqrt(cov[1, 1])), float(fit[1, 1])
