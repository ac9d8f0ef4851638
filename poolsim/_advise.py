"""``poolsim.advise``: pool or match -- and with which tau -- for a user's own domains.

Advice is an estimator like any other, so it is chosen by its risk where the truth is known: in
*plausible worlds* fitted to the user's K domain means (:mod:`poolsim._worlds`: a high-breakdown
isotropic fit whose outliers are the observed outlying domains resampled as they are, in any
direction and shape; and every spherical Gaussian-mixture fit within a BIC margin of the best, whose
outliers are drawn from its other components), each kept only if the data look like a draw
from it (a goodness-of-fit check on their asymmetry and anisotropy, :func:`poolsim._worlds.plausible`).

In each world, ``seeds`` simulated data sets (common random numbers across the candidates) give
the mean error ``||estimate - target||`` of pooling and of matching at each tau of a grid scaled by
the inliers' root mean square distance (:data:`TAU_SCALES`); a candidate's *regret* in a world is
its mean error over the best candidate's there. The advice is the candidate with the smallest
worst-case regret over the plausible worlds:

* ``"match"`` (with its tau) or ``"pool"`` when that worst case is at most
  :data:`UNDECIDED_REGRET`: whichever plausible law is true, following it costs at most 25%;
* ``"undecided"`` otherwise: the data fit laws that want different estimators; the estimate is
  still the minimax-regret one (never pooling by default), and ``reason`` names the worlds and
  what would decide between them;
* ``"undecided"`` too when no fitted world passes the goodness-of-fit check (all are then kept,
  and the estimate is the minimax one over them): the data are outside the worlds' family, and
  ``reason`` says so with the worlds' p-values.

Then, on ``seeds`` fresh data sets per world (so tau is not chosen and judged on the same draws),
the paired verdicts of eps(pooling) - eps(advice) and eps(subsampling) - eps(advice)
(:func:`poolsim.decide_claim`'s rule); ``vs_pool`` and ``vs_subsample`` report the world least
favourable to the advice. Matching here starts at the geometric median of the domain means
(rotation invariant, so the worlds can be drawn in ``r + K`` dimensions whatever ``d``: d enters
only through distances) and is domain-level L2 with tolerance 1e-4; :attr:`Advice.init` is that
start, so ``poolsim.match(X, advice.tau, init=advice.init)`` reproduces ``advice.estimate``.
Subsampling (half the domains, 10 draws each) is simulated with a Gaussian resampling noise.

How good the advice is, measured by following it on data with a known target from an independent
simulation (including laws outside these worlds): ``benchmarks/advise_validation.py`` and the
documentation page "How good is the advice?".
"""
from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import numpy as np

from . import _checks, _core, _verdict, _worlds

TAU_SCALES = tuple(float(x) for x in np.geomspace(0.3, 4.0, 16))  # tau grid / inliers' rms distance (ours)
UNDECIDED_REGRET = 1.25  # a worst-case regret above this is "undecided" (the validation's target)
SUBSAMPLE_FRACTION, SUBSAMPLE_DRAWS = 0.5, 10  # subsampling as in the decision map (m = K / 2, n = 10)
TOL, MAX_ITER = 1e-4, 100


class WorldResult(NamedTuple):
    """The advice seen from one plausible world: its ``name``, outlier ``share``, the ``best``
    candidate there (``"pool"`` or ``"tau=..."``), the advice's ``regret`` there (mean error
    over the best's, on the seeds that chose it) and ``fit_p``, the world's goodness-of-fit p-value
    (the smaller of two, :func:`poolsim._worlds.fit_p_values`; a world below
    :data:`poolsim._worlds.GOF_LEVEL` is dropped, unless every world is)."""

    name: str
    share: float
    best: str
    regret: float
    fit_p: float


class Advice(NamedTuple):
    """What :func:`advise` recommends and why (module :mod:`poolsim._advise` for the method).

    ``strategy``: ``"match"``, ``"pool"`` or ``"undecided"``; ``estimator``: what ``estimate``
    is (``"match"`` or ``"pool"``; for ``"undecided"`` the minimax-regret one). ``tau``: the
    matching radius of the advice (for ``"pool"`` the best tau, for reference); ``tau_range``:
    the grid taus whose worst-case regret is within 5% of the advice's. ``worst_regret``: the
    advice's largest regret over the plausible ``worlds`` (:class:`WorldResult` each).
    ``vs_pool``/``vs_subsample``: paired verdicts of eps(pooling) - eps(advice) and
    eps(subsampling) - eps(advice) on fresh seeds, in the world least favourable to the advice.
    ``eps``: mean simulated eps of pooling, subsampling and the advice there. ``estimate (d,)``:
    the advice applied to the user's data; ``init (d,)``: matching's start (the geometric median
    of the domain means). ``fitted``: the robust fit (centre, spread, share, outliers) and the
    ``rejected`` worlds' names and goodness-of-fit p-values. Everything
    but ``estimate`` and ``init`` is SIMULATED."""

    strategy: str
    estimator: str
    tau: float
    tau_range: tuple
    worst_regret: float
    worlds: tuple
    vs_pool: _verdict.Verdict
    vs_subsample: _verdict.Verdict
    eps: dict
    estimate: np.ndarray
    init: np.ndarray
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


def _match_batched(M: np.ndarray, n: np.ndarray, c0: np.ndarray, taus: np.ndarray) -> np.ndarray:
    """:func:`poolsim._core.iterate_match`'s iteration (domain level, L2, masses ``n``) for every
    tau and data set at once: ``M (S, K, D)``, ``n (S, K)``, ``c0 (S, D)``, ``taus (T,)`` ->
    ``(T, S, D)``. Vectorised here rather than through the core because every (tau, data set)
    pair stops at its own trip; a stopped pair is frozen by a select."""
    T, S = len(taus), M.shape[0]
    sq = np.sum(M * M, axis=-1)  # (S, K)
    t2 = (np.asarray(taus, float) ** 2)[:, None, None]
    c = np.broadcast_to(c0, (T,) + c0.shape).copy()
    done = np.zeros((T, S), bool)
    for _ in range(MAX_ITER):
        d2 = sq[None] - 2 * np.einsum("tsd,skd->tsk", c, M) + np.sum(c * c, axis=-1)[..., None]
        w = (d2 < t2) * n[None]
        total = w.sum(axis=-1)
        has = total > 0
        nxt = np.einsum("tsk,skd->tsd", w, M) / np.where(has, total, 1.0)[..., None]
        nxt = np.where(has[..., None], nxt, c)
        stop = ~has | (np.sum((nxt - c) ** 2, axis=-1) < TOL * TOL)
        c = np.where(done[..., None], c, nxt)
        done |= stop
        if done.all():
            break
    return c


def _errors(M: np.ndarray, n: np.ndarray, taus: np.ndarray, sigma: float, rng) -> np.ndarray:
    """Per data set errors ``||estimate||`` (the target is 0) of pooling, subsampling and matching
    at each tau: ``(S, 2 + T)``."""
    S, K, D = M.shape
    pool = np.einsum("sk,skd->sd", n, M) / n.sum(axis=1)[:, None]
    m = max(1, math.ceil(SUBSAMPLE_FRACTION * K))
    pick = np.argsort(rng.random((S, K)), axis=1)[:, :m]
    chosen_n = np.take_along_axis(n, pick, axis=1)
    # each chosen domain contributes the mean of SUBSAMPLE_DRAWS draws with replacement from its
    # n_k samples: its sample mean plus resampling noise of variance sigma^2 (1 - 1/n_k) / draws
    noise = sigma * np.sqrt(np.sum(1.0 - 1.0 / chosen_n, axis=1) / SUBSAMPLE_DRAWS) / m
    sub = np.take_along_axis(M, pick[..., None], axis=1).mean(axis=1) + noise[:, None] * rng.standard_normal((S, D))
    match = _match_batched(M, n, _worlds.geometric_median(M), taus)
    errs = [np.linalg.norm(pool, axis=-1), np.linalg.norm(sub, axis=-1)]
    return np.column_stack(errs + list(np.linalg.norm(match, axis=-1)))


def _simulate(world, m, sz, sig, taus, seeds: int, seed: int) -> np.ndarray:
    """``(seeds, 2 + T)`` errors of the candidates in ``world`` (chunks of seeds bound memory)."""
    rng = np.random.default_rng(seed)
    chunks = _worlds.draw_chunks(world, m, sz, sig, rng, seeds, 2e7, per_draw=len(taus) + 4)
    return np.concatenate([_errors(M, n, taus, sig, rng) for M, n in chunks])


def _verdict_of(diff: np.ndarray) -> _verdict.Verdict:
    return _verdict.from_moments(float(diff.mean()), float(diff.std(ddof=1)), diff.size)


def advise(X: Any = None, *, means: Any = None, sizes: Any = None, sigma: float | None = None,
           seeds: int = 1000, seed: int = 0, progress: Callable[[int], None] | None = None) -> Advice:
    """Recommend pooling or matching (and tau) for ``X (K, N, d)`` domains, or for their
    ``means (K, d)`` with ``sizes (K,)`` and the within-domain ``sigma`` (what a feature
    extractor's users have: per-domain feature means, counts and spread). ``seeds`` simulated
    data sets per plausible world to choose the advice, and as many fresh ones to judge it
    (>= 30 each); ``seed`` seeds the simulation's NumPy generator (the advice is a function of the
    data and ``seed``). ``progress(n)`` is called with the data sets done. A few seconds on a
    2-core CPU at the paper's sizes; d = 768 with K up to 100 within a minute (d enters only through
    distances, :mod:`poolsim._worlds`). The method, and what the answer means: module
    :mod:`poolsim._advise`; how good it is: the documentation page "How good is the advice?".

    Host code: the data are read as NumPy, so ``advise`` is not traced by JAX (``jit``, ``vmap``, ``grad``)
    nor differentiated by torch autograd."""
    m, sz, sig = _inputs(X, means, sizes, sigma)
    seeds = _checks.integer("seeds", seeds, _verdict.MIN_SEEDS)
    seed = _checks.integer("seed", seed, 0)
    K, d = m.shape
    if K < 3:
        raise ValueError(f"advise needs K >= 3 domains, got K = {K}")
    fit = _worlds.plausible(m, sz, sig, np.random.default_rng([seed, 2]))
    robust, worlds = fit.robust, fit.worlds
    scale = math.sqrt(robust.spread ** 2 + d * float(np.mean(sig * sig / sz)))
    taus = np.array(TAU_SCALES) * max(scale, 1e-300)
    risks, fresh = [], []
    for w in worlds:  # the same seed in every world: common random numbers across worlds too
        risks.append(np.delete(_simulate(w, m, sz, sig, taus, seeds, seed), 1, axis=1).mean(axis=0))
        fresh.append(_simulate(w, m, sz, sig, taus, seeds, seed + 1))
        if progress is not None:
            progress(2 * seeds)
    R = np.array(risks)  # (W, 1 + T): pooling, then matching at each tau
    regret = R / np.maximum(R.min(axis=1, keepdims=True), 1e-300)
    worst = regret.max(axis=0)
    best = int(np.argmin(worst))
    estimator = "pool" if best == 0 else "match"
    tau = float(taus[best - 1] if best else taus[int(np.argmin(worst[1:]))])
    near = [float(t) for t, w in zip(taus, worst[1:]) if w <= 1.05 * worst[best]]
    tau_range = (min(near), max(near)) if near else (tau, tau)
    names = ["pool"] + [f"tau={t:.4g}" for t in taus]
    results = tuple(WorldResult(w.name, float(w.share), names[int(np.argmin(r))], float(g[best]), w.fit_p)
                    for w, r, g in zip(worlds, R, regret))
    dropped = "".join(f"; {w.name} (goodness-of-fit p = {w.fit_p:.3f}) was dropped: the data are more asymmetric "
                      f"or anisotropic than it makes them" for w in fit.rejected)

    col = 0 if best == 0 else best + 1  # the advice's column in the fresh (pool, sub, taus) errors
    v_pool = [_verdict_of(f[:, 0] - f[:, col]) for f in fresh]
    v_sub = [_verdict_of(f[:, 1] - f[:, col]) for f in fresh]
    hard = int(np.argmin([v.estimate for v in v_pool]))
    f = fresh[hard]
    eps = {"pool": float(f[:, 0].mean()), "subsample": float(f[:, 1].mean()), "advice": float(f[:, col].mean())}

    misfit = all(w.fit_p < _worlds.GOF_LEVEL for w in worlds)  # plausible() keeps all when none passes
    if misfit:
        strategy = "undecided"
        fits = ", ".join(f"{w.name} p = {w.fit_p:.3f}" for w in worlds)
        reason = (f"SIMULATED: no fitted world makes domain means as asymmetric or anisotropic as these ({fits}): "
                  f"the data are outside the worlds' family (isotropic inliers about one centre, plus outliers; "
                  f"anisotropic inliers are outside it), so the simulated regrets do not describe them. The "
                  f"estimate is the one with the smallest worst-case regret over all the fits "
                  f"({'matching at tau = %.4g' % tau if best else 'pooling'}, {worst[best]:.2f})")
    elif worst[best] <= UNDECIDED_REGRET:
        strategy = estimator
        reason = (f"SIMULATED: {'matching at tau = %.4g' % tau if best else 'pooling'} is within "
                  f"{100 * (worst[best] - 1):.0f}% of the best estimator in every plausible world "
                  f"({len(worlds)}: {', '.join(w.name for w in worlds)}){dropped}")
    else:
        strategy = "undecided"
        wants = "; ".join(f"{r.name} (outlier share {r.share:.2f}) wants {r.best}" for r in results)
        reason = (f"SIMULATED: the data fit laws that want different estimators ({wants}); no estimator is within "
                  f"{100 * (UNDECIDED_REGRET - 1):.0f}% of the best in all of them, so the estimate is the one "
                  f"with the smallest worst-case regret ({worst[best]:.2f}). More domains (K) would decide "
                  f"between the fits, as would knowing which domains are off target{dropped}")
    init = _worlds.geometric_median(m)
    if estimator == "match":
        res = _core.iterate_match(m, sz, init, tau, "l2", tol=TOL, max_iter=MAX_ITER)
        estimate = np.asarray(res[0], float)
    else:
        estimate = (sz[:, None] * m).sum(axis=0) / sz.sum()
    fitted = dict(K=K, d=d, n=float(np.median(sz)), sigma=sig, centre=robust.centre, spread=robust.spread,
                  share=robust.share, outliers=np.flatnonzero(robust.weights > 0), scale=scale,
                  rejected=tuple((w.name, w.fit_p) for w in fit.rejected))
    return Advice(strategy, estimator, tau, tau_range, float(worst[best]), results, v_pool[hard], v_sub[hard],
                  eps, estimate, init, fitted, seeds, reason)


__all__ = ["Advice", "WorldResult", "advise"]
