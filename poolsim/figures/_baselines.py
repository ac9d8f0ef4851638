"""Robust location estimators a statistician would put next to matching (figure ``baselines``).

Every estimator maps the domain sample means of one seed, ``x: (K, d)``, to a location ``(d,)``
(the geometric median and Huber also take a batch ``(..., K, d)``, one independent iteration per
element, so the figure runs them over all seeds at once);
:func:`estimate_all` applies them to the same draws the engine used (``SeedResult.xbar``) for every
K prefix. Library implementations where one exists (NumPy median, ``scipy.stats.trim_mean``,
``sklearn.covariance.MinCovDet``, whose fits over many seeds run batched with the same results,
:mod:`poolsim.figures._mcd`); the geometric median and the multivariate Huber estimator are
written here because neither SciPy nor scikit-learn offers them (each says so below).
"""
from __future__ import annotations

import math

import numpy as np
from scipy import stats

from . import _mcd

TRIM = 0.2  # 20% trimmed mean (cut from each end, per coordinate): the usual default (Wilcox)
HUBER_Q = 0.9  # Huber threshold: the 90% quantile of the Gaussian radius (chi_d)
MCD_MIN_RATIO = 10  # MinCovDet only where K >= 10 d ("K >> d"), and only at the final K (and, in
# the figure, on its first MCD_SEEDS seeds)

LABELS = {
    "median": "coord.-wise median",
    "trimmed": f"trimmed mean ({TRIM:.0%})",
    "geomedian": "geometric median",
    "huber": "Huber M-estimator",
    "mcd": "MCD location (final K)",
    "mom": "median of means",
    "oracle": "oracle: mean of inliers",
}
COLORS = {"median": "tab:purple", "trimmed": "tab:brown", "geomedian": "tab:pink",
          "huber": "tab:olive", "mcd": "tab:cyan", "mom": "tab:gray", "oracle": "black"}


def _fixed_point(step, x: np.ndarray, y: np.ndarray, tol: float, max_iter: int) -> np.ndarray:
    """Iterate ``y <- step(x, y)`` on a batch (``x: (..., K, d)``, ``y: (..., d)``), each element
    until its step is below ``tol`` (at most ``max_iter`` steps): exactly the iteration it would
    follow alone; only the unfinished elements are computed."""
    shape = y.shape
    x, y = x.reshape(-1, *x.shape[-2:]), y.reshape(-1, shape[-1]).copy()
    idx = np.arange(len(y))
    for _ in range(max_iter):
        y_new = step(x[idx], y[idx], idx)
        done = np.linalg.norm(y_new - y[idx], axis=-1) < tol
        y[idx] = y_new
        idx = idx[~done]
        if idx.size == 0:
            break
    return y.reshape(shape)


def _weighted(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``sum_k w_k x_k / sum_k w_k`` over axis -2: ``x (B, K, d)``, ``w (B, K)`` -> ``(B, d)``."""
    return np.einsum("bk,bkd->bd", w, x) / w.sum(axis=-1)[:, None]


def geometric_median(x: np.ndarray, *, tol: float = 1e-9, max_iter: int = 1000) -> np.ndarray:
    """argmin_y sum_i ||x_i - y||, ``x: (..., K, d)`` -> ``(..., d)`` (batched over leading axes),
    by Weiszfeld's iteration from the coordinate-wise median. Written here: SciPy and scikit-learn
    have no geometric median. Distances are floored at 1e-12 so an iterate that lands on a data
    point stays finite (that point then dominates the weights, which is the right limit)."""
    x = np.asarray(x, dtype=float)

    def step(xb, yb, _):
        return _weighted(xb, 1.0 / np.maximum(np.linalg.norm(xb - yb[:, None], axis=-1), 1e-12))

    return _fixed_point(step, x, np.median(x, axis=-2), tol, max_iter)


def huber(x: np.ndarray, *, q: float = HUBER_Q, tol: float = 1e-9, max_iter: int = 500) -> np.ndarray:
    """Multivariate Huber M-estimator of location with radial weights ``min(1, k s / ||x_i - y||)``
    by iteratively re-weighted means; ``x: (..., K, d)`` -> ``(..., d)`` (batched). Written here:
    scikit-learn's ``HuberRegressor`` is a univariate-response regression and SciPy has no
    M-estimator of location.

    Scale ``s`` is fixed at the start from the median distance to the coordinate-wise median,
    divided by the median of chi_d (so s estimates the per-coordinate spread for Gaussian data);
    ``k = sqrt(chi2_d.ppf(q))``. Where ``s = 0`` the coordinate-wise median is returned."""
    x = np.asarray(x, dtype=float)
    d = x.shape[-1]
    y0 = np.median(x, axis=-2)
    s = np.median(np.linalg.norm(x - y0[..., None, :], axis=-1), axis=-1) / math.sqrt(
        stats.chi2.ppf(0.5, d))
    # s = 0 (over half the points tied): the median is returned; iterate those with k = 1 instead
    # of 0 (0/0 weights), their result is discarded below
    k = np.where(s > 0, math.sqrt(stats.chi2.ppf(q, d)) * s, 1.0).reshape(-1, 1)

    def step(xb, yb, idx):
        r = np.linalg.norm(xb - yb[:, None], axis=-1)
        return _weighted(xb, np.minimum(1.0, k[idx] / np.maximum(r, 1e-12)))

    y = _fixed_point(step, x, y0, tol, max_iter)
    return np.where((s > 0)[..., None], y, y0)


def mcd(x: np.ndarray, *, seed: int) -> np.ndarray:
    """``sklearn.covariance.MinCovDet`` location (raw MCD, re-weighted); NaN where K < 10 d."""
    K, d = x.shape
    if K < MCD_MIN_RATIO * d:
        return np.full(d, np.nan)
    return _mcd.sklearn_location(x, seed)


def _block_means(x: np.ndarray, seed: int) -> np.ndarray:
    """Median of means' blocks: shuffle the K domains (seeded by ``[seed, K]``), cut them into
    ``B = ceil(sqrt(K))`` near-equal blocks, ``(B, d)`` block means."""
    K = x.shape[0]
    perm = np.random.default_rng([seed, K]).permutation(K)
    return np.stack([x[b].mean(axis=0) for b in np.array_split(perm, math.ceil(math.sqrt(K)))])


def block_means(x: np.ndarray, seeds) -> np.ndarray:
    """:func:`_block_means` of every ``x[s]`` with seed ``seeds[s]``: ``x: (S, K, d)`` -> ``(S, B, d)``.
    The shuffles are drawn per seed; the blocks are gathered and averaged for all seeds at once,
    the longer blocks first as ``np.array_split`` cuts them (each block mean is the same
    ``mean(axis=0)`` reduction as the per-seed one, so the numbers are equal)."""
    S, K, d = x.shape
    B = math.ceil(math.sqrt(K))
    if K < 1:
        raise ValueError(f"x: need at least one domain (K >= 1), got shape {x.shape}")
    if S == 0:
        return np.empty((0, B, d))
    perm = np.stack([np.random.default_rng([int(s), K]).permutation(K) for s in seeds])
    xp = np.take_along_axis(x, perm[..., None], axis=1)  # (S, K, d) in shuffled order
    q, r = divmod(K, B)  # r blocks of q + 1 domains, then B - r blocks of q
    long = xp[:, :r * (q + 1)].reshape(S, r, q + 1, d).mean(axis=2)
    short = xp[:, r * (q + 1):].reshape(S, B - r, q, d).mean(axis=2)
    return np.concatenate([long, short], axis=1)


def median_of_means(x: np.ndarray, *, seed: int) -> np.ndarray:
    """Median of means (Minsker 2015 form): the geometric median of :func:`_block_means`."""
    return geometric_median(_block_means(x, seed))


def oracle(x: np.ndarray, outlier: np.ndarray) -> np.ndarray:
    """Mean of the domains the meta-distribution did not make outliers (needs the ground truth)."""
    keep = ~outlier
    return x[keep].mean(axis=0) if keep.any() else np.full(x.shape[1], np.nan)


def estimate_all(xbar: np.ndarray, Ks, seeds, outlier: np.ndarray,
                 mcd_seeds: int | None = None) -> dict[str, np.ndarray]:
    """Every baseline on every seed and K prefix: ``xbar (S, K_max, d)``, ``outlier (S, K_max)``
    -> ``{name: (S, nK, d)}`` (NaN where an estimator is not used: MCD except at the final K, and
    there only if K >= 10 d, and only for the first ``mcd_seeds`` seeds (default: all))."""
    x = xbar.astype(float)
    S, _, d = x.shape
    out = {name: np.empty((S, len(Ks), d)) for name in LABELS}
    for i, K in enumerate(Ks):  # every estimator batched over the seeds, except MCD (sklearn)
        xs = x[:, :K]
        out["median"][:, i] = np.median(xs, axis=1)
        out["trimmed"][:, i] = stats.trim_mean(xs, TRIM, axis=1)
        out["geomedian"][:, i] = geometric_median(xs)
        out["huber"][:, i] = huber(xs)
        out["mom"][:, i] = geometric_median(block_means(xs, seeds))
        out["mcd"][:, i] = np.nan
        if K == Ks[-1]:
            n = S if mcd_seeds is None else min(S, mcd_seeds)
            out["mcd"][:n, i] = _mcd_many(xs[:n], seeds[:n])
        for s in range(S):
            out["oracle"][s, i] = oracle(xs[s], outlier[s, :K])
    return out


def _mcd_many(x: np.ndarray, seeds) -> np.ndarray:
    """:func:`mcd` of every ``x[s]`` (``x: (S, K, d)`` -> ``(S, d)``), seeded by ``seeds[s]``: the
    fits run batched (:func:`poolsim.figures._mcd.mcd_locations`, scikit-learn's numbers)."""
    S, K, d = x.shape
    if K < MCD_MIN_RATIO * d:
        return np.full((S, d), np.nan)
    return _mcd.mcd_locations(x, seeds)
