"""``sklearn.covariance.MinCovDet(random_state=seed).fit(x).location_`` for many small samples at once.

The figure ``baselines`` fits the MCD on hundreds of seeds of ``K <= 500`` points. scikit-learn's
FastMCD runs 30 random starts and 10 refinements per fit as Python loops over ``(K, d)`` arrays:
~0.1 s of interpreter and input-validation overhead a fit, while the arithmetic is microseconds.
This module runs the same algorithm on every seed and start at once as array operations
(written here for that reason: scikit-learn has no batched MCD). It follows scikit-learn's FastMCD
for ``K <= 500`` step by step: the same random starts (``RandomState(seed).permutation``, 30 of
them), two C-steps each, the 10 smallest determinants refined by C-steps until the determinant
stops falling (at most 30), the smallest kept, the consistency correction and the re-weighting
at the 97.5% chi-square quantile. Products of the batched arrays may round differently in the last
bit from scikit-learn's per-fit BLAS calls; that changes a support only if two distances or
determinants tie within rounding, so the returned locations (means of the re-weighted support,
taken exactly as scikit-learn takes them) are equal to scikit-learn's, which
tests/test_figures_batched.py checks exactly. Seeds where a support's covariance is singular (then
scikit-learn takes other branches) are fitted by scikit-learn itself.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
from scipy import stats

N_TRIALS = 30  # scikit-learn's FastMCD for n_samples <= 500: random starts ...
N_BEST = 10  # ... the best of which are refined
N_ITER_START, N_ITER_REFINE = 2, 30  # C-steps per start / at most per refinement
REWEIGHT_Q = 0.025  # re-weighting keeps the points below the chi2_d (1 - REWEIGHT_Q) quantile
MAX_SAMPLES = 500  # above this scikit-learn's FastMCD works on subsets (not reproduced here)


def sklearn_location(x: np.ndarray, seed: int) -> np.ndarray:
    """``MinCovDet(random_state=seed).fit(x).location_`` for one sample ``x: (K, d)`` -> ``(d,)``
    (scikit-learn's warnings about near-singular supports silenced: only the location is used)."""
    from sklearn.covariance import MinCovDet

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        warnings.simplefilter("ignore", UserWarning)
        return MinCovDet(random_state=seed).fit(x).location_


def _support_stats(x: np.ndarray, idx: np.ndarray):
    """Mean, covariance (``np.cov(bias=True)``) and log-determinant of ``x[e, idx[e]]``:
    ``x: (E, n, d)``, ``idx: (E, h)`` -> ``(E, d)``, ``(E, d, d)``, ``(E,)`` (-inf where the
    covariance is not positive definite)."""
    xs = np.take_along_axis(x, idx[..., None], axis=1)
    loc = xs.mean(axis=1)
    xc = xs - loc[:, None]
    cov = np.matmul(np.swapaxes(xc, 1, 2), xc) * (1.0 / idx.shape[1])
    sign, logdet = np.linalg.slogdet(cov)
    return loc, cov, np.where(sign > 0, logdet, -np.inf)


def _mahalanobis(x: np.ndarray, loc: np.ndarray, prec: np.ndarray) -> np.ndarray:
    """Squared Mahalanobis distances ``(E, n)`` of ``x: (E, n, d)`` to ``loc: (E, d)``."""
    xc = x - loc[:, None]
    return (np.matmul(xc, prec) * xc).sum(axis=-1)


def _inv(cov: np.ndarray) -> np.ndarray:
    """Inverses of ``cov: (E, d, d)``; the identity where a matrix is singular (such elements are
    flagged by :func:`_c_steps` and refitted by scikit-learn)."""
    ok = np.linalg.slogdet(cov)[0] > 0
    return np.linalg.inv(np.where(ok[:, None, None], cov, np.eye(cov.shape[-1])))


def _c_steps(x: np.ndarray, h: int, n_iter: int, *, start_idx=None, start=None):
    """scikit-learn's C-step loop on every element: from a support ``start_idx: (E, h)`` or from
    estimates ``start = (loc (E, d), cov (E, d, d))``, move to the ``h`` points nearest in
    Mahalanobis distance while the log-determinant falls (at most ``n_iter`` steps); an element
    whose determinant rises keeps its previous step. ``x: (E, n, d)`` -> location ``(E, d)``,
    covariance ``(E, d, d)``, log-determinant ``(E,)``, distances ``(E, n)``, and ``(E,)``
    whether the element met a singular covariance (its numbers are then not scikit-learn's)."""
    E, n, _ = x.shape
    if start_idx is None:
        dist = _mahalanobis(x, start[0], _inv(start[1]))
        start_idx = np.argpartition(dist, h - 1, axis=-1)[:, :h]
    else:
        dist = np.full((E, n), np.inf)
    loc, cov, det = _support_stats(x, start_idx)
    singular = np.isinf(det)
    prev_loc, prev_cov, prev_det = loc, cov, np.full(E, np.inf)
    prec = np.zeros_like(cov)
    remaining = np.full(E, n_iter)
    for _ in range(n_iter):
        moving = (det < prev_det) & (remaining > 0) & ~singular
        if not moving.any():
            break
        m, mm = moving[:, None], moving[:, None, None]
        prev_loc, prev_cov, prev_det = (np.where(m, loc, prev_loc), np.where(mm, cov, prev_cov),
                                        np.where(moving, det, prev_det))
        prec = np.where(mm, _inv(np.where(mm, cov, np.eye(cov.shape[-1]))), prec)
        new_dist = _mahalanobis(x, loc, prec)
        new_loc, new_cov, new_det = _support_stats(
            x, np.argpartition(new_dist, h - 1, axis=-1)[:, :h])
        dist, loc = np.where(m, new_dist, dist), np.where(m, new_loc, loc)
        cov, det = np.where(mm, new_cov, cov), np.where(moving, new_det, det)
        singular |= moving & np.isinf(new_det)
        remaining = remaining - moving
    last_dist = _mahalanobis(x, loc, prec)
    close = np.isclose(det, prev_det)  # np.allclose of two scalars, as scikit-learn compares them
    back = ~close & (det > prev_det) & (remaining > 0)  # the determinant rose: keep the step before
    b = back[:, None]
    return (np.where(b, prev_loc, loc), np.where(back[:, None, None], prev_cov, cov),
            np.where(back, prev_det, det), np.where(b, dist, last_dist), singular)


def consistency_factor(d: int, alpha: float) -> float:
    """The MCD covariance's consistency factor at the normal (Croux & Haesbroeck 1999):
    ``alpha / F_{chi2_{d+2}}(F^{-1}_{chi2_d}(alpha))``, as scikit-learn corrects it."""
    return alpha / stats.chi2.cdf(stats.chi2.ppf(alpha, df=d), d + 2)


def mcd_locations(x: np.ndarray, seeds) -> np.ndarray:
    """``MinCovDet(random_state=seeds[s]).fit(x[s]).location_`` for every ``s``, batched:
    ``x: (S, K, d)``, ``seeds: (S,)`` ints -> ``(S, d)`` float64. Equal to scikit-learn's
    (:func:`sklearn_location`) fit by fit; ``K > 500`` or ``d = 1`` (other FastMCD branches) and
    seeds whose supports meet a singular covariance are fitted by scikit-learn."""
    x = np.asarray(x, dtype=float)
    S, n, d = x.shape
    if len(seeds) != S:
        raise ValueError(f"seeds: need one per sample ({S}), got {len(seeds)}")
    if S == 0:
        return np.empty((0, d))
    if n > MAX_SAMPLES or d == 1 or n < 2:
        return np.stack([sklearn_location(xs, int(s)) for xs, s in zip(x, seeds)])
    h = min(math.ceil(0.5 * (n + d + 1)), n)
    starts = np.stack([np.stack([rs.permutation(n)[:h] for _ in range(N_TRIALS)])
                       for rs in (np.random.RandomState(int(s)) for s in seeds)])  # (S, T, h)
    xt = np.broadcast_to(x[:, None], (S, N_TRIALS, n, d)).reshape(S * N_TRIALS, n, d)
    loc, cov, det, _, bad = _c_steps(xt, h, N_ITER_START, start_idx=starts.reshape(-1, h))
    # the N_BEST smallest determinants of each seed, in np.argsort's order as scikit-learn takes them
    best = np.argsort(det.reshape(S, N_TRIALS), axis=-1)[:, :N_BEST]
    pick = (np.arange(S)[:, None] * N_TRIALS + best).ravel()
    xb = np.broadcast_to(x[:, None], (S, N_BEST, n, d)).reshape(S * N_BEST, n, d)
    _, _, det2, dist2, bad2 = _c_steps(xb, h, N_ITER_REFINE, start=(loc[pick], cov[pick]))
    first = np.argsort(det2.reshape(S, N_BEST), axis=-1)[:, 0]
    dist = dist2.reshape(S, N_BEST, n)[np.arange(S), first]
    dist /= consistency_factor(d, h / n)
    keep = dist < stats.chi2(d).isf(REWEIGHT_Q)
    bad_seed = bad.reshape(S, N_TRIALS).any(axis=1) | bad2.reshape(S, N_BEST).any(axis=1)
    return np.stack([sklearn_location(x[s], int(seeds[s])) if bad_seed[s] else x[s][keep[s]].mean(0)
                     for s in range(S)])
