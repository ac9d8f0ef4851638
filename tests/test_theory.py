"""Unit tests of poolsim.theory: closed forms against independent computations, bad input."""
import math

import jax
import numpy as np
import pytest
from scipy import integrate, stats

from poolsim import metadist, theory


def test_pool_limit_adds_within_and_between_covariance():
    md = metadist.contaminated(0.2, 2.0, d=2, gamma=0.5)
    lim = theory.pool_limit(md, sigma=0.8)
    # Sigma_mu = gamma^2 I + p(1-p) alpha^2 e1 e1^T (metadist docstring) plus sigma^2 I
    np.testing.assert_allclose(lim.cov, np.diag([0.25 + 0.16 * 4 + 0.64, 0.25 + 0.64]))
    np.testing.assert_allclose(lim.mean, [0.4, 0.0])  # E mu = mu* + p alpha v
    np.testing.assert_allclose(theory.subsample_limit(md, sigma=0.8).cov, lim.cov)


def test_mse_closed_forms():
    md = metadist.symmetric_gaussian(1.5, d=2)
    # Tr Sigma / K + d sigma^2 / (K N) = 2*2.25/15 + 2*0.64/300
    assert math.isclose(theory.mse_pool(md, sigma=0.8, K=15, N=20), 4.5 / 15 + 1.28 / 300)
    # fresh samples: Tr/m + d sigma^2/(m n); stored N: w = 1/N + (N-1)/(N n)
    assert math.isclose(theory.mse_subsample(md, sigma=0.8, m=5, n=10), 4.5 / 5 + 1.28 / 50)
    w = 1 / 20 + 19 / 200
    assert math.isclose(theory.mse_subsample(md, sigma=0.8, m=5, n=10, N=20), 4.5 / 5 + 1.28 * w / 5)


def test_match_limit_1d_gaussian_is_truncated_normal_variance():
    md = metadist.symmetric_gaussian(1.0, d=1)
    lim = theory.match_limit(md, sigma=0.8, tau=1.0)
    # Var of N(0,1) truncated to (-1, 1), plus sigma^2 (scipy.stats.truncnorm, independent of the code path)
    assert lim.method == "exact" and abs(lim.centroid[0]) < 1e-12
    assert math.isclose(lim.cov[0, 0], stats.truncnorm.var(-1, 1) + 0.64, rel_tol=1e-10)


@pytest.mark.slow
def test_match_limit_chi2_formula_agrees_with_quadrature_in_2d():
    md = metadist.symmetric_gaussian(1.0, d=2)
    exact = theory.match_limit(md, sigma=0.8, tau=1.0, N=20)
    quad = theory.match_limit(md, sigma=0.8, tau=1.0, N=20, init=np.array([0.05, 0.0]),
                              n_quad=400_000, key=3)
    assert exact.method == "exact" and quad.method == "quadrature"
    # per-coordinate var of N(0, s^2 I) inside the ball, by 2-D polar integration:
    s2 = 1 + 0.64 / 20
    num = integrate.quad(lambda r: r ** 3 * np.exp(-r * r / (2 * s2)), 0, 1)[0]
    den = integrate.quad(lambda r: r * np.exp(-r * r / (2 * s2)), 0, 1)[0]
    assert math.isclose(exact.cov[0, 0], num / den / 2 + 0.64 * (1 - 1 / 20), rel_tol=1e-9)
    np.testing.assert_allclose(quad.cov, exact.cov, atol=0.01)  # O(n_quad^-1/2), amplified by the fixed point
    np.testing.assert_allclose(quad.centroid, exact.centroid, atol=0.02)


def test_match_limit_skewed_integration_matches_a_grid_fixed_point():
    md = metadist.skewed(1.0, d=1)
    integ = theory.match_limit(md, sigma=0.8, tau=1.0, N=20)
    assert integ.method == "integration" and integ.converged
    # a different route: the fixed point on a fine grid of the exponnorm pdf (init 0 is in the
    # same basin as the median init here; the law is gamma z + (E - 1) + noise of var sigma^2/N)
    s = math.sqrt(0.09 + 0.64 / 20)
    dist = stats.exponnorm(1 / s, loc=-1.0, scale=s)
    y = np.linspace(-4, 8, 200_001)
    f = dist.pdf(y)
    c = 0.0
    for _ in range(2000):
        inside = np.abs(y - c) < 1.0
        c_new = np.sum(y * f * inside) / np.sum(f * inside)
        if abs(c_new - c) < 1e-12:
            break
        c = c_new
    assert abs(integ.centroid[0] - c) < 1e-4
    inside = np.abs(y - c) < 1.0
    var = np.sum((y - c) ** 2 * f * inside) / np.sum(f * inside)
    assert abs(integ.cov[0, 0] - (var + 0.64 * 19 / 20)) < 1e-4


def test_match_limit_contaminated_2d_is_a_fixed_point_of_a_2d_integral():
    # The asymptotic experiment's set-up (contaminated p=0.3, alpha=1.5, gamma=0.5; sigma=0.8,
    # n=150, tau=1.2). Independent route: the gated mean E[xbar 1{||xbar - c*|| < tau}] / P(gate)
    # of the 2-D mixture density, integrated in polar coordinates around c* (scipy dblquad), must
    # give back c* (the fixed point), and the gate mass and covariance must agree.
    md = metadist.contaminated(0.3, 1.5, d=2, gamma=0.5)
    lim = theory.match_limit(md, sigma=0.8, tau=1.2, N=150)
    assert lim.method == "integration" and lim.converged and lim.centroid[1] == 0.0
    s = math.sqrt(0.25 + 0.64 / 150)
    c = lim.centroid

    def phi(z):  # N(0, s^2) density
        return math.exp(-0.5 * (z / s) ** 2) / (s * math.sqrt(2 * math.pi))

    def moment(g):
        def f(r, t):
            x, y = c[0] + r * math.cos(t), c[1] + r * math.sin(t)
            return r * (0.7 * phi(x) + 0.3 * phi(x - 1.5)) * phi(y) * g(x, y)
        return integrate.dblquad(f, 0, 2 * math.pi, 0, 1.2, epsabs=1e-12, epsrel=1e-10)[0]

    mass = moment(lambda x, y: 1.0)
    mx, my = moment(lambda x, y: x) / mass, moment(lambda x, y: y) / mass
    assert math.isclose(mass, lim.mass, rel_tol=1e-7)
    assert abs(mx - c[0]) < 1e-7 and abs(my) < 1e-9
    vx = moment(lambda x, y: (x - mx) ** 2) / mass + 0.64 * (1 - 1 / 150)
    vy = moment(lambda x, y: y * y) / mass + 0.64 * (1 - 1 / 150)
    np.testing.assert_allclose(np.diag(lim.cov), [vx, vy], rtol=1e-6)


def test_match_limit_contaminated_3d_gate_agrees_with_monte_carlo():
    # Fresh draws of the domain sample means xbar = gamma z + B alpha e1 + (sigma / sqrt(N)) e in
    # d = 3 (the chi^2_2 gate of the integration): at c* the gated share and the gated mean must
    # agree with the theory within 4 standard errors (binomial SE of the share; SE of the gated
    # mean from the gated sample's spread). 1e6 draws, seed fixed.
    md = metadist.contaminated(0.3, 1.5, d=3, gamma=0.5)
    lim = theory.match_limit(md, sigma=0.8, tau=1.2, N=150)
    assert lim.method == "integration" and lim.converged
    rng = np.random.default_rng(42)
    M = 1_000_000
    x = 0.5 * rng.standard_normal((M, 3)) + 0.8 / math.sqrt(150) * rng.standard_normal((M, 3))
    x[:, 0] += 1.5 * (rng.random(M) < 0.3)
    inside = np.sum((x - lim.centroid) ** 2, axis=1) < 1.2 ** 2
    share = inside.mean()
    assert abs(share - lim.mass) < 4 * math.sqrt(lim.mass * (1 - lim.mass) / M)
    g = x[inside]
    se = g.std(axis=0, ddof=1) / math.sqrt(len(g))
    assert np.all(np.abs(g.mean(axis=0) - lim.centroid) < 4 * se)
    cov_se = np.sqrt(2 / len(g)) * g.var(axis=0)  # SE of a normal-ish sample variance
    assert np.all(np.abs(g.var(axis=0) + 0.64 * (1 - 1 / 150) - np.diag(lim.cov)) < 4 * cov_se)


def test_cap_constants_bound_the_ratio_on_a_grid():
    t = np.linspace(0.3, 2.5, 2001)  # angles in [theta_min, theta]
    chord = 2 * np.sin(t / 2)
    for metric, value in (("geodesic", t), ("cosine", 1 - np.cos(t)), ("l2", chord)):
        m, L = theory.cap_constants(metric, 2.5, theta_min=0.3)
        ratio = value / chord
        assert np.all(ratio >= m - 1e-12) and np.all(ratio <= L + 1e-12)
        assert math.isclose(ratio.min(), m, rel_tol=1e-9) and math.isclose(ratio.max(), L, rel_tol=1e-9)
    assert math.isclose(theory.cap_constants("geodesic", math.pi).L_M, math.pi / 2)


def test_tau_band_and_recommend_tau():
    band = theory.tau_band(0.1, 1.0, 0.5, 2.0)
    assert band == theory.TauBand(0.1 + 1.0 / 0.5, 1.0 / 2.0 - 0.1, True)
    assert not theory.tau_band(0.6, 1.0, 0.5, 2.0).nonempty  # tau < L_M eps_K
    ch = theory.recommend_tau(0.1, 0.5, 2.0, harmful_distance=3.0)
    assert ch.low < ch.tau < ch.high
    b = theory.tau_band(0.1, ch.tau, 0.5, 2.0)
    assert b.nonempty and b.exclude_beyond < 3.0
    assert theory.recommend_tau(0.1, 1.0, 1.0).tau == pytest.approx(0.2)


@pytest.mark.parametrize("call,match", [
    (lambda: theory.match_limit(metadist.symmetric_gaussian(1.0, d=1), sigma=0.8, tau=0.0), "tau"),
    (lambda: theory.match_limit(metadist.symmetric_gaussian(1.0, d=1), sigma=0.8, tau=-1.0), "tau"),
    (lambda: theory.match_limit(metadist.outlier_schedule(d=2), sigma=0.8, tau=1.0), "i.i.d."),
    (lambda: theory.match_limit(metadist.symmetric_gaussian(1.0, d=1), sigma=0.8, tau=1.0, N=0), "N"),
    (lambda: theory.match_limit(metadist.symmetric_gaussian(1.0, d=1), sigma=0.8, tau=1e-3,
                                init=np.array([50.0])), "empty"),
    (lambda: theory.match_limit("gauss", sigma=0.8, tau=1.0), "MetaDist"),
    (lambda: theory.pool_limit(metadist.balanced(1.0, d=2), sigma=0.8), "i.i.d."),
    (lambda: theory.pool_limit(metadist.from_callable(lambda k, K: jax.random.normal(k, (K, 2)), d=2), sigma=0.8),
     "Cov"),
    (lambda: theory.mse_pool(metadist.symmetric_gaussian(1.0, d=2), sigma=-1, K=3, N=3), "sigma"),
    (lambda: theory.tau_band(0.1, 1.0, 2.0, 1.0), "m_M <= L_M"),
    (lambda: theory.tau_band(0.1, 1.0, 0.0, 1.0), "m_M"),
    (lambda: theory.tau_band(-0.1, 1.0, 1.0, 1.0), "eps_K"),
    (lambda: theory.tau_band(0.1, 0.0, 1.0, 1.0), "tau"),
    (lambda: theory.recommend_tau(1.0, 1.0, 1.0, harmful_distance=1.5), "no tau"),
    (lambda: theory.recommend_tau(0.0, 1.0, 1.0), "eps_K = 0"),
    (lambda: theory.cap_constants("cosine", 1.0), "theta_min"),
    (lambda: theory.cap_constants("geodesic", 4.0), "theta"),
    (lambda: theory.ball_mass(metadist.skewed(1.0, d=1), 0.1), "symmetric_gaussian"),
])
def test_bad_input_raises_value_error_with_reason(call, match):
    with pytest.raises(ValueError, match=match):
        call()
