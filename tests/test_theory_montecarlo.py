"""Monte-Carlo checks of the theorems against :mod:`poolsim.theory` (fixed seeds; tolerances are
K_SE standard errors computed from the simulated sample)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import poolsim
from poolsim import _core, _mc, metadist, theory

K_SE = 4.0
SIGMA = 0.8
# Thm 2 / MSE set-up: the paper's symmetric experiment (K = 15, gamma = 1.5, tau = 1.0), N = 20
S, K, N, D, TAU, M_SUB, N_SUB = 2000, 15, 20, 2, 1.0, 5, 10


def _run(md, seed, sigma=SIGMA, init=jnp.zeros(D)):
    X = _mc.domains(md, seed, S, K, N, sigma)
    keys = jax.random.split(jax.random.key(seed + 1), S)
    pooled, sub, matched, _ = _mc.estimates(X, keys, TAU, init, m=M_SUB, n=N_SUB)
    return {"pool": np.asarray(pooled), "subsample": np.asarray(sub).mean(axis=1),
            "match": np.asarray(matched)}


@pytest.mark.slow
def test_thm2_all_three_unbiased_under_symmetry():
    """Thm 2: symmetric D_mu about mu* = 0 and c0 = mu* -> E[estimate] = mu* (expected 0)."""
    est = _run(metadist.symmetric_gaussian(1.5, d=D), seed=11)
    for name, values in est.items():
        e = _mc.mean_se(values)
        assert np.all(np.abs(e.mean) < K_SE * e.se), (name, e)


@pytest.mark.slow
def test_thm2_check_has_power_skewed_matching_is_biased():
    """Negative control for the test above: same code, skewed mean-preserving D_mu (E mu = 0).
    Pooling stays unbiased (E[mean] = E mu = 0), matching from c0 = mu* moves towards the mode
    (-v side, see theory.match_limit), by many standard errors."""
    est = _run(metadist.skewed(1.0, d=D), seed=12)
    pool, match = _mc.mean_se(est["pool"]), _mc.mean_se(est["match"])
    assert np.all(np.abs(pool.mean) < K_SE * pool.se)
    assert match.mean[0] < -10 * match.se[0]


@pytest.mark.slow
@pytest.mark.parametrize("md,sigma", [
    (metadist.contaminated(0.2, 2.0, d=D, gamma=0.5), SIGMA),  # biased, anisotropic Sigma_mu
    (metadist.symmetric_gaussian(0.1, d=D), 2.0),              # within-domain noise dominates
])
def test_mse_formulas(md, sigma):
    """MSE of pooling Tr Sigma/K + d sigma^2/(K N) (+ bias^2) and of subsampling with n draws from
    N stored samples (theory.mse_subsample); expected values from those closed forms."""
    est = _run(md, seed=13, sigma=sigma)
    for name, want in (("pool", theory.mse_pool(md, sigma=sigma, K=K, N=N)),
                       ("subsample", theory.mse_subsample(md, sigma=sigma, m=M_SUB, n=N_SUB, N=N))):
        e = _mc.mean_se(np.sum((est[name] - md.mu_star) ** 2, axis=1))
        assert abs(e.mean - want) < K_SE * e.se, (name, e, want)
    if sigma == 2.0:  # the paper's fresh-sample d sigma^2/(m n) is rejected here
        e = _mc.mean_se(np.sum(est["subsample"] ** 2, axis=1))
        fresh = theory.mse_subsample(md, sigma=sigma, m=M_SUB, n=N_SUB)
        assert e.mean - fresh > K_SE * e.se


# ---------------------------------------------------------------- Thm 1 at large K
S_BIG, K_BIG, N_BIG = 12, 3000, 20


def _limits(md, seed):
    X = _mc.domains(md, seed, S_BIG, K_BIG, N_BIG, SIGMA)
    keys = jax.random.split(jax.random.key(seed + 1), S_BIG)
    _, pts, matched, included = _mc.estimates(X, keys, TAU, None, m=K_BIG // 2, n=5)
    return {"pool": _mc.mean_se(_mc.pooled_cov(X)[:, 0, 0]),
            "subsample": _mc.mean_se(np.var(np.asarray(pts)[..., 0], axis=1)),
            "match_cov": _mc.mean_se(_mc.pooled_cov(X, included)[:, 0, 0]),
            "match_centroid": _mc.mean_se(np.asarray(matched)[:, 0])}


@pytest.mark.slow
@pytest.mark.parametrize("md", [metadist.symmetric_gaussian(1.0, d=1), metadist.skewed(1.0, d=1)],
                         ids=["symmetric", "skewed"])
def test_thm1_covariance_limits_at_large_K(md):
    """Thm 1(a,b): pooled and subsampled (m = K/2) laws have variance sigma^2 + Sigma_mu
    (theory.pool_limit). Thm 1(c) at fixed tau: the matched law has the variance and centre of
    theory.match_limit (exact truncated normal / 1-D integration, N = 20), not the paper's sigma^2."""
    got = _limits(md, seed=21)
    want = float(theory.pool_limit(md, sigma=SIGMA).cov[0, 0])
    for name in ("pool", "subsample"):
        assert abs(got[name].mean - want) < K_SE * got[name].se, (name, got[name], want)
    lim = theory.match_limit(md, sigma=SIGMA, tau=TAU, N=N_BIG)
    c, v = got["match_centroid"], got["match_cov"]
    assert abs(c.mean - lim.centroid[0]) < K_SE * c.se, (c, lim)
    assert abs(v.mean - lim.cov[0, 0]) < K_SE * v.se, (v, lim)
    assert v.mean - SIGMA ** 2 > 20 * v.se  # the paper's sigma^2 I is far off at fixed tau


# ---------------------------------------------------------------- matched-set geometric decay
@pytest.mark.parametrize("d", [1, 2, 3])
def test_matched_set_size_scales_as_tau_to_the_d(d):
    """Property 3: P(M(mu - c) < tau) ~ tau^d for small tau. Independent draws per tau, log-log
    weighted least squares; expected slope = the same fit of the exact curve (theory.ball_mass, a
    chi^2_d cdf) on the same grid, which itself is d up to O(tau^2)."""
    md, n = metadist.symmetric_gaussian(1.0, d=d), 200_000
    taus = np.geomspace(0.1, 0.3, 5)
    draws = np.asarray(md(jax.random.key(30 + d), n * len(taus))).reshape(len(taus), n, d)
    counts = np.array([np.sum(_core.gate(_core.distance(x, np.zeros(d), "l2"), t))
                       for x, t in zip(draws, taus)])
    p_exact = [theory.ball_mass(md, t) for t in taus]
    slope, se, exact = _mc.loglog_slope(taus, counts, n, p_exact)
    assert abs(slope - exact) < K_SE * se, (slope, se, exact)
    assert abs(exact - d) < 0.1


# ---------------------------------------------------------------- exchangeability of subsampling
@pytest.mark.slow
def test_subsample_exchangeable_in_law():
    """Cor. exchangeability (b): permuting domains leaves the law of the subsampled mean unchanged
    (two-sample KS test, independent keys) and the chosen domains stay uniform (chi^2 test)."""
    X = np.asarray(metadist.contaminated(0.3, 3.0, d=1)(jax.random.key(40), 6))[:, None, :] \
        + np.arange(4.0)[None, :, None] * 0.1
    perm = np.array([3, 5, 0, 1, 4, 2])
    Xj, Xp = jnp.asarray(X), jnp.asarray(X[perm])
    draw = jax.jit(jax.vmap(lambda k, x: poolsim.subsample(k, x, 2, 3)[:2], in_axes=(0, None)))
    a_mean, a_dom = draw(jax.random.split(jax.random.key(41), 3000), Xj)
    b_mean, _ = draw(jax.random.split(jax.random.key(42), 3000), Xp)
    assert stats.ks_2samp(np.asarray(a_mean)[:, 0], np.asarray(b_mean)[:, 0]).pvalue > 1e-3
    freq = np.bincount(np.asarray(a_dom).ravel(), minlength=6)
    assert stats.chisquare(freq).pvalue > 1e-3
