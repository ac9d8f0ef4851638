"""``poolsim.advise``: pool, subsample or match -- and with which tau -- for a user's own domains.

Fit (ours, stated in :class:`Advice.fitted`): the user's K domain means ``m_k`` (sizes ``N_k``,
within-domain spread ``sigma``) are read as a ``contaminated`` meta-distribution,
``mu_k = gamma z_k + B_k alpha v``:

* centre: the coordinate-wise median of the ``m_k``; total inlier spread per coordinate
  ``s = median_k ||m_k - centre|| / sqrt(chi2_d median)`` (Gaussian inliers: ``||m_k - c||^2 / s^2
  ~ chi2_d``), ``gamma^2 = max(s^2 - sigma^2 / n, 0)``;
* outliers: ``||m_k - centre|| > s sqrt(chi2_d 0.99-quantile)``; share ``p`` = their fraction,
  ``alpha`` = the norm of their mean offset from the inliers' mean, ``v`` its direction (the
  model is rotation invariant, so only ``alpha`` enters the simulation);
* ``n``: the median domain size; ``sigma``: the pooled within-domain standard deviation per
  coordinate (from ``X``) or the user's value (means only).

Check: the decision map's engine (:mod:`poolsim._phase`) at the user's own K, n and fitted
(gamma, p, alpha), plus the 3 x 3 neighbourhood ``p +- 1/K``, ``alpha x (1 +- 0.25)`` (the fit is
uncertain). Seeds ``0..S-1`` pick the tau on a grid scaled by ``s`` that minimises mean eps;
fresh seeds ``S..2S-1`` decide eps(pooling) - eps(matching) and eps(subsampling) - eps(matching)
at that tau with the project's paired rule (:func:`poolsim.decide_claim`'s), so the tau is not
chosen and judged on the same draws.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from . import _checks, _core, _verdict

TAU_SCALES = (0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 6.0)  # tau grid / s (ours)
OUTLIER_QUANTILE = 0.99  # chi2_d quantile beyond which a domain mean counts as an outlier (ours)


class Advice(NamedTuple):
    """What :func:`advise` recommends and why.

    ``strategy``: "match" when matching beats both pooling and subsampling (both verdicts hold,
    at the fitted point and at every neighbouring one), else "pool" (the simplest estimator;
    ``reason`` says whether pooling was shown better or matching was just not shown better).
    ``tau``: the recommended tau (also given when the strategy is "pool", for reference);
    ``tau_range``: the grid taus whose mean eps was not significantly above the best's (paired
    95% interval). ``vs_pool``/``vs_subsample``: the verdicts of eps(pooling) - eps(matching) and
    eps(subsampling) - eps(matching) at ``tau`` on fresh seeds (at the fitted point);
    ``neighbourhood``: the pool-vs-match verdicts at the 3 x 3 neighbouring (p, alpha).
    ``eps``: mean simulated eps of each strategy at the fitted point. ``estimate``: the
    recommended estimator applied to the user's data (the matched or pooled mean, (d,)).
    ``fitted``: the fitted parameters. Everything is SIMULATED from the fitted model."""

    strategy: str
    tau: float
    tau_range: tuple
    vs_pool: _verdict.Verdict
    vs_subsample: _verdict.Verdict
    neighbourhood: tuple
    eps: dict
    estimate: np.ndarray
    fitted: dict
    seeds: int
    reason: str


def _inputs(X, means, sizes, sigma):
    if (X is None) == (means is None):
        raise ValueError("pass either X (K, N, d) domains or means (K, d) with sizes and sigma")
    if X is not None:
        X = np.asarray(X, float)
        if X.ndim != 3 or min(X.shape) < 1:
            raise ValueError(f"X must have shape (K, N, d) with K, N, d >= 1, got {X.shape}")
        if not np.all(np.isfinite(X)):
            raise ValueError("X contains NaN or inf; all values must be finite")
        K, N, d = X.shape
        if N < 2:
            raise ValueError(f"X needs N >= 2 samples per domain to estimate sigma, got N = {N}")
        m = X.mean(axis=1)
        sizes = np.full(K, N, float)
        s = float(np.sqrt(np.sum((X - m[:, None]) ** 2) / (d * K * (N - 1))))
        if sigma is not None:
            s = float(_checks.positive("sigma", sigma))
        return m, sizes, s
    m = np.asarray(means, float)
    if m.ndim != 2 or min(m.shape) < 1:
        raise ValueError(f"means must have shape (K, d), got {m.shape}")
    if not np.all(np.isfinite(m)):
        raise ValueError("means contains NaN or inf; all values must be finite")
    K = m.shape[0]
    if sizes is None:
        raise ValueError("sizes (K,) samples per domain are needed with means")
    sizes = np.asarray(sizes, float).ravel()
    if sizes.shape != (K,) or not np.all(np.isfinite(sizes)) or np.any(sizes < 1) or np.any(
            sizes != np.round(sizes)):
        raise ValueError(f"sizes must be K = {K} integers >= 1, got {sizes.tolist()}")
    if sigma is None:
        raise ValueError("sigma (the within-domain standard deviation) is needed with means")
    return m, sizes, float(_checks.positive("sigma", sigma))


def fit(means: np.ndarray, n: int, sigma: float) -> dict:
    """The fitted contaminated model of the module docstring (ours)."""
    from scipy import stats

    K, d = means.shape
    centre = np.median(means, axis=0)
    r = np.linalg.norm(means - centre, axis=1)
    s = float(np.median(r) / math.sqrt(stats.chi2.ppf(0.5, d)))
    cut = s * math.sqrt(stats.chi2.ppf(OUTLIER_QUANTILE, d))
    out = r > cut
    inl = means[~out].mean(axis=0) if (~out).any() else centre
    if out.any():
        off = means[out].mean(axis=0) - inl
        alpha = float(np.linalg.norm(off))
        v = off / alpha if alpha > 0 else np.eye(d)[0]
    else:
        alpha, v = 0.0, np.eye(d)[0]
    gamma = math.sqrt(max(s * s - sigma * sigma / n, 0.0))
    return dict(K=K, d=d, n=n, sigma=sigma, gamma=gamma, p=float(out.mean()), alpha=alpha,
                direction=v, centre=centre, spread=s, outliers=np.flatnonzero(out))


def advise(X: Any = None, *, means: Any = None, sizes: Any = None, sigma: float | None = None,
           seeds: int = 1000, progress=None, resources=None, jobs_dir=None) -> Advice:
    """Recommend pooling or matching (and tau) for ``X (K, N, d)`` domains, or for their
    ``means (K, d)`` with ``sizes (K,)`` and the within-domain ``sigma``. ``seeds`` Monte-Carlo
    seeds for choosing tau and as many fresh ones for the verdicts (>= 30 each). Takes ~10-30 s
    on a CPU (one compile of the map's program at the user's K, n). See the module docstring for
    the fit and the check.

    ``resources`` (:class:`poolsim.cluster.Resources`, executor ``processes`` or ``slurm``) with
    ``jobs_dir`` (a folder every job can reach): both simulations (choosing tau, then the verdicts on
    fresh seeds) split their seeds into ``resources.max_concurrent`` scheduler jobs
    (:func:`poolsim._phase.run_grid`); the same advice, bit for bit. Each job pays its own start and
    compile, so this pays off only for many seeds (docs/cluster.md).

    Host code: the data are read as NumPy, so ``advise`` is not traced by JAX (``jit``, ``vmap``, ``grad``)
    nor differentiated by torch autograd."""
    from . import _phase  # JAX: imported on first use, so `import poolsim` stays light

    m, sz, sig = _inputs(X, means, sizes, sigma)
    seeds = _checks.integer("seeds", seeds, _verdict.MIN_SEEDS)
    K, d = m.shape
    if K < 3:
        raise ValueError(f"advise needs K >= 3 domains, got K = {K}")
    n = max(2, int(np.median(sz)))
    f = fit(m, n, sig)
    spread = max(f["spread"], 1e-12)
    taus = tuple(float(spread * c) for c in TAU_SCALES)
    spec = _phase.GridSpec("contaminated", (K,), (n,), taus, sigma=sig, gamma=f["gamma"], d=d)
    p_grid = np.clip(f["p"] + np.array([-1.0, 0.0, 1.0]) / K, 0.0, 1.0)
    a_grid = f["alpha"] * np.array([0.75, 1.0, 1.25])

    def jobs(step: str) -> dict:
        if resources is None or resources.executor == "local":
            return {}
        return {"resources": resources, "jobs_dir": None if jobs_dir is None else Path(jobs_dir) / step}

    choose = _phase.run_grid(spec, p_grid, a_grid, seeds=seeds, progress=progress, **jobs("choose"))
    check = _phase.run_grid(spec, p_grid, a_grid, seeds=np.arange(seeds, 2 * seeds),
                            progress=progress, **jobs("check"))

    def at(mom, i, j):  # cell (i, j) of the single n and K
        return _phase.Moments(mom.sums[0, 0, i, j], mom.gram[0, 0, i, j], mom.n,
                              mom.aux[0, 0, i, j])

    c = at(choose, 1, 1)
    grid = [2 + t for t in range(len(taus))]
    means_t = np.array([c.mean(i) for i in grid])
    best = int(np.argmin(means_t))
    ok = []
    for t, i in enumerate(grid):
        e, v = c.paired(i, grid[best])
        ok.append(_verdict.from_moments(e, math.sqrt(v), c.n).ci_low <= 0 or t == best)
    tau_range = (min(t for t, k in zip(taus, ok) if k), max(t for t, k in zip(taus, ok) if k))

    def verdict(mom, other):
        e, v = mom.paired(other, grid[best])
        return _verdict.from_moments(e, math.sqrt(v), mom.n)

    fresh = at(check, 1, 1)
    vs_pool, vs_sub = verdict(fresh, 0), verdict(fresh, 1)
    hood = tuple(verdict(at(check, i, j), 0).verdict for i in range(3) for j in range(3))
    eps = {"pool": float(fresh.mean(0)), "subsample": float(fresh.mean(1)),
           "match": float(fresh.mean(grid[best]))}
    tau = taus[best]
    wins = vs_pool.verdict == _verdict.HOLDS and vs_sub.verdict == _verdict.HOLDS
    if wins and all(h == _verdict.HOLDS for h in hood):
        strategy, reason = "match", "matching beats pooling and subsampling at the fitted " \
                                    "heterogeneity and at every neighbouring (p, alpha)"
    elif wins:
        strategy, reason = "pool", "matching beats pooling at the fitted point but not at every " \
                                   "neighbouring (p, alpha): the advantage is not robust to the " \
                                   "fit's uncertainty"
    elif vs_pool.verdict == _verdict.DOES_NOT_HOLD:
        strategy, reason = "pool", "pooling is better than matching at the fitted heterogeneity"
    else:
        strategy, reason = "pool", "matching is not shown better than pooling (inconclusive)"
    if strategy == "match":
        res = _core.iterate_match(m, sz, np.median(m, axis=0), tau, "l2", tol=1e-4, max_iter=100)
        estimate = np.asarray(res[0], float)
    else:
        estimate = (sz[:, None] * m).sum(axis=0) / sz.sum()
    fitted = {k: v for k, v in f.items()}
    return Advice(strategy, float(tau), tau_range, vs_pool, vs_sub, hood, eps, estimate, fitted,
                  seeds, reason)


__all__ = ["Advice", "advise", "fit"]
