"""Closed forms and numerical predictions for the paper's theorems (each formula in its docstring).

Notation: domain means ``mu_k ~ D_mu`` i.i.d. with ``E[mu] = m`` and ``Cov[mu] = Sigma_mu``; samples
``x_{k,i} ~ N(mu_k, sigma^2 I_d)``, ``N`` per domain; ``mu_*`` the target mean. The paper assumes
``m = mu_*`` (Assumption 2(a)); the formulas here keep the bias ``m - mu_*`` so they stay right for
meta-distributions that are not mean-preserving (``contaminated``).

Finite ``N`` matters for matching: at domain level the gate looks at the domain *sample mean*
``xbar_k = mu_k + ebar_k``, ``ebar_k ~ N(0, sigma^2/N I)``, not at ``mu_k``. Functions that depend
on this take ``N`` (``None`` = the paper's ``N -> infinity``).
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
import scipy  # its submodules load on first use (scipy.stats alone is ~1 s of import)

from . import _checks, _core
from .metadist import MetaDist

__all__ = ["GaussianLimit", "MatchLimit", "TauBand", "TauChoice", "CapConstants", "pool_limit",
           "subsample_limit", "mse_pool", "mse_subsample", "match_limit", "ball_mass", "tau_band",
           "recommend_tau", "cap_constants"]


class GaussianLimit(NamedTuple):
    """``N(mean (d,), cov (d, d))``."""

    mean: np.ndarray
    cov: np.ndarray


class MatchLimit(NamedTuple):
    """K -> infinity limit of matching at fixed tau.

    ``centroid (d,)``: the fixed point c*; ``cov (d, d)``: covariance of the matched pooled samples;
    ``mass``: P(domain gated in) at c*; ``n_iter``/``converged``: the limit iteration;
    ``method``: ``"exact"`` (closed form / truncated normal), ``"integration"`` (1-D numerical
    integration) or ``"quadrature"`` (large fixed-key sample).
    """

    centroid: np.ndarray
    cov: np.ndarray
    mass: float
    n_iter: int
    converged: bool
    method: str


class TauBand(NamedTuple):
    """Corollary "optimal tau": domains farther than ``exclude_beyond`` from mu_* are rejected,
    domains within ``include_within`` are accepted; ``nonempty`` iff ``include_within >= 0``."""

    exclude_beyond: float
    include_within: float
    nonempty: bool


class TauChoice(NamedTuple):
    """A recommended ``tau`` inside the admissible interval ``(low, high)``."""

    tau: float
    low: float
    high: float


class CapConstants(NamedTuple):
    """``m_M <= M / chord <= L_M`` on the stated set of pairs of unit vectors."""

    m_M: float
    L_M: float


# ----------------------------------------------------------------------------- validation
def _metadist(md: Any) -> MetaDist:
    if not isinstance(md, MetaDist):
        raise ValueError(f"metadist must be a poolsim.metadist.MetaDist, got {type(md).__name__}")
    return md


def _moments(md: MetaDist, what: str):
    """``(E[mu], Cov[mu])``; ValueError when the law does not define them."""
    _metadist(md)
    if not md.iid:
        raise ValueError(f"{what} assumes i.i.d. domain means; meta-distribution {md.name!r} is not "
                         "i.i.d. (its law depends on the domain index or on K)")
    if md.mean is None or md.cov is None:
        raise ValueError(f"{what} needs E[mu] and Cov[mu]; meta-distribution {md.name!r} does not "
                         "define them (pass mean= and cov= to metadist.from_callable)")
    return np.asarray(md.mean, float), np.asarray(md.cov, float)


def _nonneg(name: str, value: Any) -> float:
    return float(_checks.NONNEGATIVE.check(name, value))


def _samples_N(N: Any) -> float:
    return math.inf if N is None else float(_checks.integer("N", N, 1))


# ----------------------------------------------------------------------------- Thm 1 (a), (b)
def pool_limit(metadist: MetaDist, *, sigma: float) -> GaussianLimit:
    """Thm 1(a): the pooled empirical law tends (K -> inf, balanced domains) to the mixture
    ``E_mu N(mu, sigma^2 I)``, whose mean and covariance are

        mean = E[mu]  (= mu_* under Assumption 2(a)),   cov = sigma^2 I + Sigma_mu.

    The paper calls the limit ``N(mu_*, sigma^2 I + Sigma_mu)``; it is Gaussian only when D_mu is.
    Holds for every N: the within-domain spread of N samples around their mean,
    sigma^2 (1 - 1/N), plus Cov[xbar_k] = Sigma_mu + sigma^2/N gives the same total.
    """
    mean, cov = _moments(metadist, "pool_limit")
    sigma = _nonneg("sigma", sigma)
    return GaussianLimit(mean, sigma * sigma * np.eye(metadist.d) + cov)


def subsample_limit(metadist: MetaDist, *, sigma: float) -> GaussianLimit:
    """Thm 1(b): uniform subsampling with fixed ``n`` has the same limit as pooling,
    ``mean = E[mu]``, ``cov = sigma^2 I + Sigma_mu`` -- provided the number of subsampled domains
    ``m -> infinity`` with K (for fixed m the m n points have no limiting law). Drawing ``n`` of the
    N stored samples with replacement keeps the total: within sigma^2 (1-1/N)(1-1/n), between-group
    Sigma_mu + sigma^2/N + sigma^2 (1-1/N)/n."""
    return pool_limit(metadist, sigma=sigma)


# ----------------------------------------------------------------------------- MSE
def mse_pool(metadist: MetaDist, *, sigma: float, K: int, N: int) -> float:
    """MSE of the naive pooled mean with K balanced domains of N samples:

        E||xbar_pool - mu_*||^2 = ||E[mu] - mu_*||^2 + Tr(Sigma_mu)/K + d sigma^2/(K N).

    (xbar_pool is the average of K i.i.d. domain sample means, each with covariance
    Sigma_mu + sigma^2/N I.) The bias term is 0 under Assumption 2(a).
    """
    mean, cov = _moments(metadist, "mse_pool")
    sigma = _nonneg("sigma", sigma)
    K, N = _checks.integer("K", K, 1), _checks.integer("N", N, 1)
    bias2 = float(np.sum((mean - metadist.mu_star) ** 2))
    return bias2 + float(np.trace(cov)) / K + metadist.d * sigma ** 2 / (K * N)


def mse_subsample(metadist: MetaDist, *, sigma: float, m: int, n: int, N: int | None = None) -> float:
    """MSE of the subsampled mean (m domains, n samples each):

        E||xbar_sub - mu_*||^2 = ||E[mu] - mu_*||^2 + Tr(Sigma_mu)/m + d sigma^2 w / m,
        w = 1/N + (N - 1)/(N n)   (n draws with replacement from N stored samples),
        w = 1/n                   (N = None: fresh draws, the paper's d sigma^2/(m n)).

    The m chosen domains of K i.i.d. ones are themselves i.i.d. draws of D_mu, so K drops out.
    """
    mean, cov = _moments(metadist, "mse_subsample")
    sigma = _nonneg("sigma", sigma)
    m, n = _checks.integer("m", m, 1), _checks.integer("n", n, 1)
    Nf = _samples_N(N)
    w = 1.0 / n if math.isinf(Nf) else 1.0 / Nf + (Nf - 1.0) / (Nf * n)
    bias2 = float(np.sum((mean - metadist.mu_star) ** 2))
    return bias2 + float(np.trace(cov)) / m + metadist.d * sigma ** 2 * w / m


# ----------------------------------------------------------------------------- Thm 1 (c) at fixed tau
def _law_1d(md: MetaDist, extra_var: float):
    """1-D law of ``y = v (xbar - mu_*)`` as ``[(weight, frozen scipy dist, is_normal)]``, or None."""
    p = md.params
    if md.name == "symmetric_gaussian":
        s = math.sqrt(p["gamma"] ** 2 + extra_var)
        return [(1.0, scipy.stats.norm(0.0, s), True)] if s > 0 else None
    if md.name == "contaminated":
        s = math.sqrt(p["gamma"] ** 2 + extra_var)
        if s == 0:
            return None
        comps = [(1.0 - p["p"], scipy.stats.norm(0.0, s), True), (p["p"], scipy.stats.norm(p["alpha"], s), True)]
        return [c for c in comps if c[0] > 0]
    if md.name == "skewed":
        s = math.sqrt(p["gamma"] ** 2 + extra_var)
        if s == 0:
            return None
        if p["scale"] == 0:
            return [(1.0, scipy.stats.norm(0.0, s), True)]
        # gamma z + scale (E - 1): a normal plus an exponential of mean `scale`, shifted by -scale
        return [(1.0, scipy.stats.exponnorm(p["scale"] / s, loc=-p["scale"], scale=s), False)]
    return None


def _direction_1d(md: MetaDist) -> float:
    v = md.params.get("direction")
    return 1.0 if v is None else float(np.sign(np.asarray(v)[0]))


def _truncated_moments(law, a: float, b: float):
    """``(P(a<y<b), E[y 1], E[y^2 1])`` for the mixture ``law``."""
    mass = m1 = m2 = 0.0
    for w, dist, normal in law:
        pm = float(dist.cdf(b) - dist.cdf(a))
        if pm <= 0:
            continue
        if normal:
            loc, s = dist.mean(), dist.std()
            mu, var = (float(v) for v in scipy.stats.truncnorm.stats((a - loc) / s, (b - loc) / s,
                                                                loc=loc, scale=s, moments="mv"))
            e1, e2 = mu, var + mu * mu
        else:
            e1 = float(dist.expect(lambda y: y, lb=a, ub=b, conditional=True))
            e2 = float(dist.expect(lambda y: y * y, lb=a, ub=b, conditional=True))
        mass += w * pm
        m1 += w * pm * e1
        m2 += w * pm * e2
    return mass, m1, m2


def _median_1d(law) -> float:
    lo = min(d.ppf(1e-12) for _, d, _ in law)
    hi = max(d.ppf(1 - 1e-12) for _, d, _ in law)
    return float(scipy.optimize.brentq(lambda y: sum(w * d.cdf(y) for w, d, _ in law) - 0.5, lo, hi,
                                 xtol=1e-14))


def _empty(tau, where):
    raise ValueError(f"tau = {tau} gates in no mass around c = {where}: the matched set is empty in "
                     "the K -> infinity limit (increase tau, or n_quad for the quadrature)")


def _gated_fixed_point(moments, y: float, *, tol: float, max_iter: int, empty):
    """Iterate ``y <- E[u 1{gate}] / P(gate)`` from ``y``, ``moments(y) -> (P(gate), E[u 1{gate}], ...)``,
    until a step moves less than ``tol`` or ``max_iter`` steps; ``empty(y)`` raises where the gate holds
    no mass. Returns ``(y, steps, converged, moments(y))``."""
    converged, t = False, 0
    for t in range(1, max_iter + 1):
        mass, m1 = moments(y)[:2]
        if mass <= 0:
            empty(y)
        y_next = m1 / mass
        moved, y = abs(y_next - y), y_next
        if moved < tol:
            converged = True
            break
    return y, t, converged, moments(y)


def _limit_1d(md, law, sample_law, *, tau, init, within, tol, max_iter):
    v, mu0 = _direction_1d(md), float(md.mu_star[0])
    if isinstance(init, str):
        y = _median_1d(sample_law) if init == "median" else v * (float(_moments(md, "init='mean'")[0][0]) - mu0)
    else:
        y = v * (float(np.asarray(init, float).reshape(-1)[0]) - mu0)
    y, t, converged, (mass, m1, m2) = _gated_fixed_point(
        lambda y: _truncated_moments(law, y - tau, y + tau), y, tol=tol, max_iter=max_iter,
        empty=lambda y: _empty(tau, mu0 + v * y))
    var = max(m2 / mass - (m1 / mass) ** 2, 0.0)
    exact = all(normal for _, _, normal in law)
    return MatchLimit(np.array([mu0 + v * y]), np.array([[var + within]]), mass, t, converged,
                      "exact" if exact else "integration")


def _axis(md: MetaDist) -> np.ndarray | None:
    """The law's direction ``v (d,)`` when it is a signed standard basis vector, else None."""
    v = md.params.get("direction")
    v = np.eye(md.d)[0] if v is None else np.asarray(v, float)
    j = int(np.argmax(np.abs(v)))
    return v if abs(abs(v[j]) - 1.0) < 1e-12 and np.count_nonzero(v) == 1 else None


def _gated_moments_axial(law, s_perp: float, d: int, y: float, tau: float):
    """``(P(gate), E[u 1], E[u^2 1], E[w_1^2 1])`` for ``xbar - mu_* = u v + w``, ``u ~ law``,
    ``w ~ N(0, s_perp^2 I_{d-1})`` independent, gate ``(u - y)^2 + ||w||^2 < tau^2``.

    Given u the gate is ``||w||^2 / s_perp^2 < h^2 / s_perp^2``, ``h^2 = tau^2 - (u - y)^2``, a
    chi^2_{d-1} event, and ``E[w_1^2 1{.}] = s_perp^2 F_{d+1}(h^2 / s_perp^2)`` (F_k: the chi^2_k
    cdf), so each moment is a 1-D integral over ``u in (y - tau, y + tau)``; with
    ``u = y + tau sin(theta)`` (``h = tau cos(theta)``) the integrands are smooth at the ends
    (``scipy.integrate.quad``).
    """
    from scipy import integrate, special

    def pdf_of(dist, normal):
        if not normal:
            return dist.pdf
        loc, sd = float(dist.mean()), float(dist.std())
        return lambda u: math.exp(-0.5 * ((u - loc) / sd) ** 2) / (sd * math.sqrt(2 * math.pi))

    out = np.zeros(4)
    for w, dist, normal in law:
        pdf = pdf_of(dist, normal)

        def f(theta, i):
            u, h = y + tau * math.sin(theta), tau * math.cos(theta)
            a = h * h / (2.0 * s_perp ** 2)
            g = special.gammainc((d + 1) / 2.0, a) * s_perp ** 2 if i == 3 else special.gammainc((d - 1) / 2.0, a)
            return pdf(u) * (1.0, u, u * u, 1.0)[i] * g * h  # du = tau cos(theta) dtheta = h dtheta

        for i in range(4):
            out[i] += w * integrate.quad(f, -math.pi / 2, math.pi / 2, args=(i,), epsabs=1e-14,
                                         epsrel=1e-12, limit=200)[0]
    return tuple(float(x) for x in out)


def _limit_axial(md, v, law, sample_law, s_perp, *, tau, init, within, tol, max_iter):
    """The fixed point for a law symmetric about the line ``mu_* + t v`` (``v`` a signed basis
    vector) in d >= 2: the centroid stays on that line (the gated mean of ``w`` is 0 by symmetry),
    so the iteration is 1-D in ``y`` with :func:`_gated_moments_axial`'s moments."""
    d, mu0 = md.d, md.mu_star
    if isinstance(init, str):
        # coordinate-wise median of the per-sample law: median_1d along v (sign-flipped with v),
        # mu_* in the other (centred normal) coordinates
        y = _median_1d(sample_law) if init == "median" else float(v @ (_moments(md, "init='mean'")[0] - mu0))
    else:
        y = float(v @ (init - mu0))
    y, t, converged, (mass, m1, m2, w2) = _gated_fixed_point(
        lambda y: _gated_moments_axial(law, s_perp, d, y, tau), y, tol=tol, max_iter=max_iter,
        empty=lambda y: _empty(tau, mu0 + y * v))
    var_v = max(m2 / mass - (m1 / mass) ** 2, 0.0)
    cov = (w2 / mass) * (np.eye(d) - np.outer(v, v)) + var_v * np.outer(v, v) + within * np.eye(d)
    return MatchLimit(mu0 + y * v, cov, mass, t, converged, "integration")


def _gate_draws(md: MetaDist, key: Any, n: int, extra_var: float, sample_sigma: float):
    """Fixed-key draws: ``xbar (n, d)`` for the gate and per-sample points ``(n, d)`` for a median."""
    import jax

    from ._strategies import as_key

    k1, k2, k3 = jax.random.split(as_key(key), 3)
    mu = np.asarray(md(k1, n), dtype=float)
    xbar = mu + math.sqrt(extra_var) * np.asarray(jax.random.normal(k2, mu.shape), dtype=float)
    samples = mu + sample_sigma * np.asarray(jax.random.normal(k3, mu.shape), dtype=float)
    return xbar, samples


def match_limit(metadist: MetaDist, *, sigma: float, tau: float, metric: str = "l2",
                N: int | None = None, init: Any = "median", n_quad: int = 400_000, key: Any = 0,
                tol: float = 1e-12, max_iter: int = 1000) -> MatchLimit:
    """Fixed-tau K -> infinity limit of domain-level matching (the paper's Thm 1(c) treats only
    tau -> 0).

    With ``xbar = mu + ebar``, ``ebar ~ N(0, sigma^2/N I)`` the gated domain mean (``N = None``:
    ``xbar = mu``), the centroid iteration becomes, as K -> infinity,

        c_{t+1} = E[xbar | M(xbar - c_t) < tau],   started at ``init``,

    and c* is its fixed point (a flat-kernel mean shift: for skewed D_mu it drifts towards the mode,
    not to mu_*). Because ``x - xbar`` is independent of ``xbar`` for Gaussian samples, the matched
    pooled samples have

        cov = sigma^2 (1 - 1/N) I + Cov(xbar | M(xbar - c*) < tau)
            -> sigma^2 I + Cov(mu | M(mu - c*) < tau)   (N -> infinity),

    not the paper's sigma^2 I; the limit law is a mixture, not Gaussian. ``init``: ``"median"``
    (coordinate-wise median of the per-sample law ``D_mu * N(0, sigma^2 I)``, as
    :func:`poolsim.match`), ``"mean"`` or a ``(d,)`` vector.

    Methods: d = 1 with L2 and a symmetric_gaussian / contaminated / skewed law -> exact
    truncated-normal moments (``scipy.stats.truncnorm``) or 1-D numerical integration (skewed);
    symmetric_gaussian in any d, L2, init at mu_* -> exact (c* = mu_*, per-coordinate variance
    ``s^2 F_{d+2}(tau^2/s^2) / F_d(tau^2/s^2)``, F_k the chi^2_k cdf, s^2 = gamma^2 + sigma^2/N);
    contaminated / skewed in d >= 2 with L2, a direction along a coordinate
    axis and ``init`` on the line ``mu_* + t v`` -> 1-D numerical integration (the centroid stays
    on that line by symmetry; the gate, given the coordinate along v, is a chi^2_{d-1} event);
    otherwise iterating :func:`poolsim._core.match_step` on ``n_quad`` fixed-key draws (error
    O(n_quad^-1/2)).
    """
    md = _metadist(metadist)
    if not md.iid:
        raise ValueError(f"match_limit assumes i.i.d. domain means; {md.name!r} is not i.i.d.")
    sigma = _nonneg("sigma", sigma)
    _checks.positive("tau", tau)
    tau = float(tau)
    _checks.choice("metric", metric, _core.METRICS)
    Nf = _samples_N(N)
    n_quad = _checks.integer("n_quad", n_quad, 100)
    _checks.positive("tol", tol)
    max_iter = _checks.integer("max_iter", max_iter, 1)
    if isinstance(init, str):
        _checks.choice("init", init, ("median", "mean"))
    else:
        init = np.asarray(init, dtype=float)
        if init.shape != (md.d,) or not np.all(np.isfinite(init)):
            raise ValueError(f"init must be 'median', 'mean' or a finite vector of shape ({md.d},)")
    extra = 0.0 if math.isinf(Nf) else sigma ** 2 / Nf
    within = sigma ** 2 * (1.0 if math.isinf(Nf) else 1.0 - 1.0 / Nf)
    d = md.d

    if metric == "l2" and d == 1:
        law, sample_law = _law_1d(md, extra), _law_1d(md, sigma ** 2)
        if law is not None and sample_law is not None:
            return _limit_1d(md, law, sample_law, tau=tau, init=init, within=within, tol=tol,
                             max_iter=max_iter)
    at_target = isinstance(init, str) or np.allclose(init, md.mu_star, rtol=0, atol=0)
    if metric == "l2" and md.name == "symmetric_gaussian" and at_target:
        s2 = md.params["gamma"] ** 2 + extra
        if s2 > 0:
            a = tau * tau / s2
            mass = float(scipy.stats.chi2.cdf(a, d))
            if mass <= 0:
                _empty(tau, md.mu_star)
            var = s2 * float(scipy.stats.chi2.cdf(a, d + 2)) / mass
            return MatchLimit(md.mu_star.copy(), (var + within) * np.eye(d), mass, 1, True, "exact")

    v = _axis(md) if metric == "l2" and d > 1 and md.name in ("contaminated", "skewed") else None
    on_line = v is not None and (isinstance(init, str) or np.allclose(
        init - md.mu_star, v * float(v @ (init - md.mu_star)), rtol=0, atol=1e-12))
    if on_line:
        law, sample_law = _law_1d(md, extra), _law_1d(md, sigma ** 2)
        s_perp = math.sqrt(md.params["gamma"] ** 2 + extra)
        if law is not None and sample_law is not None and s_perp > 0:
            return _limit_axial(md, v, law, sample_law, s_perp, tau=tau, init=init, within=within,
                                tol=tol, max_iter=max_iter)

    xbar, samples = _gate_draws(md, key, n_quad, extra, sigma)
    if isinstance(init, str):
        c0 = np.median(samples, axis=0) if init == "median" else np.mean(samples, axis=0)
    else:
        c0 = init
    c, inc, n_iter, conv, total = _core.iterate_match(xbar, np.ones(n_quad), c0, tau, metric,
                                                      tol=tol, max_iter=max_iter)
    if float(total) <= 0:
        _empty(tau, c)
    dev = xbar - c
    cov = (inc[:, None] * dev).T @ dev / float(total) + within * np.eye(d)
    return MatchLimit(np.asarray(c), cov, float(total) / n_quad, int(n_iter), bool(conv), "quadrature")


def ball_mass(metadist: MetaDist, tau: float, *, center: Any = None, sigma: float = 0.0,
              N: int | None = None) -> float:
    """``P(||xbar - c|| < tau)`` for ``symmetric_gaussian`` (exact):
    ``||xbar - c||^2 / s^2 ~ noncentral chi^2_d(lambda = ||mu_* - c||^2 / s^2)``,
    ``s^2 = gamma^2 + sigma^2/N``. As tau -> 0 it is ~ f(c) vol(B_1) tau^d: the matched-set
    "geometric decay" E|S| = K P ~ tau^d. ``center`` defaults to mu_*."""
    md = _metadist(metadist)
    if md.name != "symmetric_gaussian":
        raise ValueError(f"ball_mass has a closed form only for symmetric_gaussian, got {md.name!r}")
    _checks.positive("tau", tau)
    Nf = _samples_N(N)
    s2 = md.params["gamma"] ** 2 + (0.0 if math.isinf(Nf) else _nonneg("sigma", sigma) ** 2 / Nf)
    if s2 <= 0:
        raise ValueError("ball_mass needs gamma > 0 or a finite N with sigma > 0 (a density)")
    c = md.mu_star if center is None else np.asarray(center, dtype=float)
    lam = float(np.sum((md.mu_star - c) ** 2)) / s2
    a = float(tau) ** 2 / s2
    return float(scipy.stats.chi2.cdf(a, md.d) if lam == 0 else scipy.stats.ncx2.cdf(a, md.d, lam))


# ----------------------------------------------------------------------------- Corollary "optimal tau"
def _constants(m_M: Any, L_M: Any):
    _checks.positive("m_M", m_M)
    _checks.positive("L_M", L_M)
    if float(m_M) > float(L_M):
        raise ValueError(f"need m_M <= L_M (Assumption 1), got m_M = {m_M} > L_M = {L_M}")
    return float(m_M), float(L_M)


def tau_band(eps_K: float, tau: float, m_M: float, L_M: float) -> TauBand:
    """Corollary (optimal tau) with ``eps_K = ||c_K - mu_*||``:

    (a) safe exclusion: ``||mu - mu_*|| > eps_K + tau/m_M``  =>  ``M(mu - c_K) > tau`` (rejected);
    (b) guaranteed inclusion: ``||mu - mu_*|| <= tau/L_M - eps_K``  =>  ``M(mu - c_K) <= tau``;
    the band is nonempty iff ``tau >= L_M eps_K``. Note the gate is strict (``M < tau``), so (b)
    guarantees acceptance only for ``||mu - mu_*|| < tau/L_M - eps_K``.

    Domain: every finite ``eps_K >= 0``, ``tau > 0``, ``0 < m_M <= L_M``, zero and subnormals
    included; huge ratios give ``inf``. Each bound is computed in float64 with two roundings
    (``/`` then ``-`` or ``+``), so it is exact when those operations are (e.g. the
    subnormal case ``tau_band(5e-324, 5e-324, 1, 1) = (1e-323, 0.0, True)``), otherwise within an
    ulp; ``nonempty`` read off ``include_within >= 0`` shares that rounding at the boundary
    ``tau = L_M eps_K``. A caller who builds ``||mu - mu_*||`` in floats must keep its own rounding
    (e.g. underflow of the squares in a norm below ~1e-154) out of the comparison.
    """
    eps = _nonneg("eps_K", eps_K)
    _checks.positive("tau", tau)
    m, L = _constants(m_M, L_M)
    inside = float(tau) / L - eps
    return TauBand(eps + float(tau) / m, inside, inside >= 0)


def recommend_tau(eps_K: float, m_M: float, L_M: float, *, harmful_distance: float | None = None,
                  fraction: float = 0.5, margin: float = 2.0) -> TauChoice:
    """A tau for which the Corollary's inclusion band is nonempty: ``tau > low = L_M eps_K``.

    With ``harmful_distance = r`` (domains at ``||mu - mu_*|| >= r`` must be rejected) tau must also
    satisfy ``eps_K + tau/m_M < r``, i.e. ``tau < high = m_M (r - eps_K)``; the choice is
    ``low + fraction (high - low)``. Without it, ``tau = margin * low``. ValueError when no tau
    exists (``r <= eps_K (1 + L_M/m_M)``) or when ``eps_K = 0`` and no ``r`` pins tau down.
    """
    eps = _nonneg("eps_K", eps_K)
    m, L = _constants(m_M, L_M)
    low = L * eps
    if harmful_distance is None:
        _checks.number("margin", margin, 1.0, lo_open=True)
        if eps == 0:
            raise ValueError("eps_K = 0: every tau > 0 gives a nonempty band; pass harmful_distance "
                             "to choose one")
        return TauChoice(margin * low, low, math.inf)
    r = _nonneg("harmful_distance", harmful_distance)
    _checks.number("fraction", fraction, 0.0, 1.0, lo_open=True, hi_open=True)
    high = m * (r - eps)
    if high <= low:
        raise ValueError(f"no tau both keeps the inclusion band nonempty (tau > L_M eps_K = {low:.4g}) "
                         f"and rejects domains at distance {r} (tau < m_M (r - eps_K) = {high:.4g}); "
                         f"need harmful_distance > eps_K (1 + L_M/m_M) = {eps * (1 + L / m):.4g}")
    return TauChoice(low + fraction * (high - low), low, high)


def cap_constants(metric: str, theta: float, *, theta_min: float = 0.0) -> CapConstants:
    """Bi-Lipschitz constants of a direction metric against the chord ``||u - v||_2`` of unit vectors.

    The cap: pairs of *unit* vectors ``u, v`` whose angle t lies in ``[theta_min, theta]``, e.g. all
    pairs inside a spherical cap of angular radius theta/2 (theta <= pi). Off the sphere no constants
    exist (``M(x, 2x) = 0`` for cosine and geodesic), so data must be normalised. With
    chord = 2 sin(t/2):

    * ``"l2"``: M = chord, (1, 1);
    * ``"geodesic"``: M = t, ratio t / (2 sin(t/2)) increasing in t:
      ``m_M = ratio(theta_min)`` (1 at 0), ``L_M = ratio(theta)`` (pi/2 at theta = pi);
    * ``"cosine"``: M = 1 - cos t = chord^2 / 2, ratio sin(t/2): ``m_M = sin(theta_min/2)``,
      ``L_M = sin(theta/2)``. It is quadratic at 0, so it is bi-Lipschitz only on an annulus
      ``theta_min > 0`` -- ValueError otherwise.
    """
    _checks.choice("metric", metric, _core.METRICS)
    th = float(_checks.number("theta", theta, 0.0, math.pi, lo_open=True))
    th0 = _nonneg("theta_min", theta_min)
    if th0 >= th:
        raise ValueError(f"theta_min must be < theta = {th}, got {theta_min!r}")

    def ratio(t):
        return 1.0 if t == 0 else t / (2.0 * math.sin(t / 2.0))

    if metric == "l2":
        return CapConstants(1.0, 1.0)
    if metric == "geodesic":
        return CapConstants(ratio(th0), ratio(th))
    if th0 == 0:
        raise ValueError("the cosine distance 1 - cos t = chord^2/2 has no m_M > 0 near t = 0; "
                         "pass theta_min > 0 (an annulus of angles) to get bi-Lipschitz constants")
    return CapConstants(math.sin(th0 / 2.0), math.sin(th / 2.0))
