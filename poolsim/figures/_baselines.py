"""Robust location estimators a statistician would put next to matching (figure ``baselines``).

Every estimator maps the domain sample means of one seed, ``x: (K, d)``, to a location ``(d,)``;
:func:`estimate_all` applies them to the same draws the engine used (``SeedResult.xbar``) for every
K prefix. Library implementations where one exists (NumPy median, ``scipy.stats.trim_mean``,
``sklearn.covariance.MinCovDet``); the geometric median and the multivariate Huber estimator are
written here because neither SciPy nor scikit-learn offers them (each says so below).
"""
from __future__ import annotations

import math
import warnings

import numpy as np
from scipy import stats

TRIM = 0.2  # 20% trimmed mean (cut from each end, per coordinate): the usual default (Wilcox)
HUBER_Q = 0.9  # Huber threshold: the 90% quantile of the Gaussian radius (chi_d)
MCD_MIN_RATIO = 10  # MinCovDet only where K >= 10 d ("K >> d") ...
# ... and only at the final K (and, in the figure, on its first MCD_SEEDS seeds): one sklearn fit
# costs ~0.1 s, a whole curve (S x nK fits) would dominate the figure run's time budget.

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


def geometric_median(x: np.ndarray, *, tol: float = 1e-9, max_iter: int = 1000) -> np.ndarray:
    """argmin_y sum_i ||x_i - y||, ``x: (K, d)``, by Weiszfeld's iteration from the coordinate-wise
    median. Written here: SciPy and scikit-learn have no geometric median. Distances are floored at
    1e-12 so an iterate that lands on a data point stays finite (that point then dominates the
    weights, which is the right limit)."""
    y = np.median(x, axis=0)
    for _ in range(max_iter):
        w = 1.0 / np.maximum(np.linalg.norm(x - y, axis=1), 1e-12)
        y_new = w @ x / w.sum()
        if np.linalg.norm(y_new - y) < tol:
            return y_new
        y = y_new
    return y


def huber(x: np.ndarray, *, q: float = HUBER_Q, tol: float = 1e-9, max_iter: int = 500) -> np.ndarray:
    """Multivariate Huber M-estimator of location with radial weights ``min(1, k s / ||x_i - y||)``
    by iteratively re-weighted means. Written here: scikit-learn's ``HuberRegressor`` is a
    univariate-response regression and SciPy has no M-estimator of location.

    Scale ``s`` is fixed at the start from the median distance to the coordinate-wise median,
    divided by the median of chi_d (so s estimates the per-coordinate spread for Gaussian data);
    ``k = sqrt(chi2_d.ppf(q))``."""
    d = x.shape[1]
    y = np.median(x, axis=0)
    s = np.median(np.linalg.norm(x - y, axis=1)) / math.sqrt(stats.chi2.ppf(0.5, d))
    if s <= 0:
        return y
    k = math.sqrt(stats.chi2.ppf(q, d)) * s
    for _ in range(max_iter):
        r = np.linalg.norm(x - y, axis=1)
        w = np.minimum(1.0, k / np.maximum(r, 1e-12))
        y_new = w @ x / w.sum()
        if np.linalg.norm(y_new - y) < tol:
            return y_new
        y = y_new
    return y


def mcd(x: np.ndarray, *, seed: int) -> np.ndarray:
    """``sklearn.covariance.MinCovDet`` location (raw MCD, re-weighted); NaN where K < 10 d."""
    from sklearn.covariance import MinCovDet

    K, d = x.shape
    if K < MCD_MIN_RATIO * d:
        return np.full(d, np.nan)
    with warnings.catch_warnings():
        # sklearn warns when a small support's covariance is near-singular; the location is still
        # defined, and the figure only uses the location.
        warnings.simplefilter("ignore", RuntimeWarning)
        warnings.simplefilter("ignore", UserWarning)
        return MinCovDet(random_state=seed).fit(x).location_


def median_of_means(x: np.ndarray, *, seed: int) -> np.ndarray:
    """Median of means (Minsker 2015 form): shuffle the K domains (seeded), cut them into
    ``B = ceil(sqrt(K))`` near-equal blocks, return the geometric median of the block means."""
    K = x.shape[0]
    perm = np.random.default_rng([seed, K]).permutation(K)
    blocks = np.array_split(perm, math.ceil(math.sqrt(K)))
    return geometric_median(np.stack([x[b].mean(axis=0) for b in blocks]))


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
    for s in range(S):
        for i, K in enumerate(Ks):
            xs, seed = x[s, :K], int(seeds[s])
            out["median"][s, i] = np.median(xs, axis=0)
            out["trimmed"][s, i] = stats.trim_mean(xs, TRIM, axis=0)
            out["geomedian"][s, i] = geometric_median(xs)
            out["huber"][s, i] = huber(xs)
            use_mcd = K == Ks[-1] and (mcd_seeds is None or s < mcd_seeds)
            out["mcd"][s, i] = mcd(xs, seed=seed) if use_mcd else np.nan
            out["mom"][s, i] = median_of_means(xs, seed=seed)
            out["oracle"][s, i] = oracle(xs, outlier[s, :K])
    return out
