"""``poolsim.advise`` and its plausible worlds (``poolsim._worlds``): the fits, the reduced-dimension
draws against their closed forms, the batched matching against the core, and -- slow tier -- the
regret of following the advice on data with a known target, the true risk from the plain loops of
``poolsim._reference``."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

import poolsim
from poolsim import _advise, _core, _scenarios, _worlds, advise
from poolsim._reference import ref_true_risks

SIGMA = 0.8


def _observe(rng, mu, n):
    n = np.asarray(n, float)
    return mu + SIGMA / np.sqrt(n)[:, None] * rng.normal(size=mu.shape), n


def test_advise_bad_input():
    with pytest.raises(ValueError, match="either X"):
        advise()
    with pytest.raises(ValueError, match="sizes"):
        advise(means=np.zeros((5, 2)), sigma=1.0)
    with pytest.raises(ValueError, match="sigma"):
        advise(means=np.zeros((5, 2)), sizes=[10] * 5)
    with pytest.raises(ValueError, match="NaN"):
        advise(np.full((5, 4, 2), np.nan))
    with pytest.raises(ValueError, match="seeds"):
        advise(np.zeros((5, 4, 2)), seeds=10)
    with pytest.raises(ValueError, match="seed must"):
        advise(np.zeros((5, 4, 2)), seed=-1)
    with pytest.raises(ValueError, match="K >= 3"):
        advise(np.zeros((2, 4, 2)))


@pytest.mark.slow
def test_fits_recover_the_outlier_share_at_30_percent():
    """30 of K = 100 domain means shifted by 8 inlier standard deviations. The robust fit flags the 30 and
    the inliers beyond its chi2_2 0.975 cut: expected share in [0.3, 0.3 + 0.7 x 0.025] (the cut is at the
    fitted spread, not the true one); the BIC-best mixture's share is 0.3. Tolerance: 3 standard errors
    of the mean over 40 data sets, plus that range."""
    rng = np.random.default_rng(0)
    robust, mixture = [], []
    for _ in range(40):
        mu = 0.5 * rng.normal(size=(100, 2))
        mu[:30, 0] += 4.0
        m, n = _observe(rng, mu, np.full(100, 100))
        robust.append(_worlds.robust(m, n, SIGMA).share)
        mixture.append(min(_worlds.mixtures(m, n, SIGMA), key=lambda w: w.bic).share)
    for shares, lo, hi in ((robust, 0.3, 0.3 + 0.7 * 0.025), (mixture, 0.3, 0.3)):
        se = np.std(shares, ddof=1) / math.sqrt(len(shares))
        assert lo - 3 * se - 1e-9 <= np.mean(shares) <= hi + 3 * se + 1e-9, (np.mean(shares), se)


def test_isotropic_draw_in_r_plus_K_dimensions_has_the_law_of_d_dimensions():
    """d = 300, K = 5 (r = 1 outlier direction): drawn in 1 + 5 dimensions. Closed forms for an inlier
    mean m (N(0, (b + sigma^2 / n) I_d)): E||m||^2 = d (b + sigma^2 / n), Var ||m||^2 = 2 d (b + sigma^2/n)^2,
    E<m_i, m_j> = 0 with Var = d v^2; an outlier is exactly its observed offset. 3-5 standard errors."""
    rng = np.random.default_rng(1)
    K, d, b = 5, 300, 0.04
    means = np.zeros((K, d))
    means[0, 0] = 3.0
    sizes = np.full(K, 100.0)
    w = _worlds.World("test", np.zeros(d), b, 0.2, np.eye(K)[0], 0.0)
    M, n = _worlds.draw(w, means, sizes, SIGMA, rng, 20000)
    assert M.shape == (20000, K, 1 + K)
    v = b + SIGMA ** 2 / 100
    sq = np.sum(M ** 2, axis=-1)
    out = np.isclose(sq, 9.0, atol=1e-12)  # outliers: the observed offset (3, 0, ...)
    assert abs(out.mean() - 0.2) < 4 * math.sqrt(0.2 * 0.8 / out.size)
    inl = sq[~out]
    assert abs(inl.mean() - d * v) < 4 * math.sqrt(2 * d) * v / math.sqrt(inl.size)
    assert abs(inl.var() - 2 * d * v * v) < 5 * (2 * d * v * v) * math.sqrt(2 / inl.size) * 2
    both = ~out[:, 1] & ~out[:, 2]
    dots = np.einsum("sd,sd->s", M[both, 1], M[both, 2])
    assert abs(dots.mean()) < 4 * math.sqrt(d) * v / math.sqrt(both.sum())


@pytest.mark.slow
def test_goodness_of_fit_p_values_are_exact_under_the_world():
    """Data drawn from a world itself: with N draws the Monte Carlo p-value (1 + #{as extreme}) / (1 + N)
    of a continuous statistic is uniform on {1, ..., N + 1} / (N + 1) (the observed value is one more
    exchangeable draw), so P(p <= 0.05) = floor(0.05 (N + 1)) / (N + 1) = 0.05 for N = 99. 300 data sets
    per statistic; tolerance 3 binomial standard errors."""
    rng = np.random.default_rng(7)
    K, d = 30, 2
    w = _worlds.World("clean", np.zeros(d), 0.25, 0.0, np.zeros(K), 0.0)
    sizes = np.full(K, 100.0)
    p = np.array([_worlds.fit_p_values(w, _worlds.draw(w, np.zeros((K, d)), sizes, SIGMA, rng, 1)[0][0], sizes,
                                       SIGMA, rng, draws=99) for _ in range(300)])
    assert p.shape == (300, 2)
    rate = (p <= 0.05).mean(axis=0)
    assert np.all(np.abs(rate - 0.05) <= 3 * math.sqrt(0.05 * 0.95 / 300)), rate


def test_fit_statistics_have_the_law_of_d_in_r_plus_K_dimensions():
    """The asymmetry and anisotropy are rotation invariant, so a world drawn in r + K = 9 dimensions gives
    them the law of d = 40: their means over 4000 data sets each way agree within 4 standard errors of the
    difference. The direct draw: inliers N(0, (b + sigma^2 / n) I_40), outliers at the observed offset."""
    rng = np.random.default_rng(8)
    K, d, b, S = 8, 40, 0.05, 4000
    means = np.zeros((K, d))
    means[0, :2] = (2.0, 1.0)
    sizes = np.full(K, 50.0)
    w = _worlds.World("test", np.zeros(d), b, 0.25, np.eye(K)[0], 0.0)
    M, n = _worlds.draw(w, means, sizes, SIGMA, rng, S)
    assert M.shape == (S, K, 1 + K)
    out = rng.random((S, K)) < 0.25
    direct = np.sqrt(b + SIGMA ** 2 / 50) * rng.normal(size=(S, K, d))
    direct = np.where(out[..., None], means[0], direct)
    a, c = _worlds.fit_statistics(M, n), _worlds.fit_statistics(direct, np.full((S, K), 50.0))
    se = np.sqrt(a.var(axis=0, ddof=1) / S + c.var(axis=0, ddof=1) / S)
    assert np.all(np.abs(a.mean(axis=0) - c.mean(axis=0)) <= 4 * se), (a.mean(0), c.mean(0), se)


@pytest.mark.slow
def test_plausible_drops_a_world_the_data_reject_and_says_so():
    """The paper's asymptotic law at K = 200 (30% shifted by 1.5 = 3 inlier sds along e1): one isotropic
    cloud with no outliers and the data's own scatter cannot make data this anisotropic (its p-value is
    at the floor 1 / 200 with 199 draws), nor can the robust fit, whose 0.975 cut keeps the nearer outliers
    as inliers (p = 0.001-0.002 on five data sets of this law, far below :data:`GOF_LEVEL`; the two-cluster
    mixture 0.25-0.74). ``advise`` drops it, names every dropped world in ``fitted["rejected"]`` and in its
    reason, and keeps only worlds that pass."""
    m, n = _scenarios.observe(np.random.default_rng(1), _scenarios.contaminated(200, 150, 2, 0.5, 0.3, 1.5))
    cloud = _worlds.World("one cloud", m.mean(axis=0), float(m.var(axis=0, ddof=1).mean()), 0.0, np.zeros(200), 0.0)
    assert _worlds.fit_p_values(cloud, m, n, SIGMA, np.random.default_rng(0), draws=199)[1] == 1 / 200
    a = advise(means=m, sizes=n, sigma=SIGMA, seeds=60)
    rejected = dict(a.fitted["rejected"])
    assert "robust" in rejected and a.worlds and a.fitted["share"] > 0  # the robust fit still scales the taus
    assert all(p < _worlds.GOF_LEVEL for p in rejected.values())
    assert all(r.fit_p >= _worlds.GOF_LEVEL for r in a.worlds) and not set(rejected) & {r.name for r in a.worlds}
    assert all(f"{name} (goodness-of-fit p = " in a.reason for name in rejected)


def test_undecided_when_no_world_fits():
    """Twelve domain means on a line (K = 12: too few for a mixture, so the isotropic robust world is the
    only fit): no isotropic world makes a scatter with 99.9% of its variance on one axis (p at the floor
    1 / 1001), so the answer is "undecided", saying the data are outside the worlds' family."""
    rng = np.random.default_rng(10)
    m = np.column_stack([np.linspace(-1.0, 1.0, 12), 0.01 * rng.normal(size=12)])
    a = advise(means=m, sizes=np.full(12, 10000.0), sigma=SIGMA, seeds=60)
    assert [r.name for r in a.worlds] == ["robust"] and a.worlds[0].fit_p == 1 / 1001
    assert a.strategy == "undecided" and "outside the worlds' family" in a.reason
    assert a.estimator in ("pool", "match") and np.all(np.isfinite(a.estimate))


def test_batched_matching_equals_the_core():
    """:func:`poolsim._advise._match_batched` against :func:`poolsim._core.iterate_match`, pair by pair."""
    rng = np.random.default_rng(2)
    M = rng.normal(size=(7, 9, 3))
    M[:, :3] += 2.0
    n = rng.integers(5, 50, size=(7, 9)).astype(float)
    c0 = _worlds.geometric_median(M)
    taus = np.array([0.4, 1.0, 2.5, 10.0])
    got = _advise._match_batched(M, n, c0, taus)
    for t, tau in enumerate(taus):
        for s in range(7):
            want = _core.iterate_match(M[s], n[s], c0[s], tau, "l2", tol=_advise.TOL, max_iter=_advise.MAX_ITER)[0]
            np.testing.assert_allclose(got[t, s], np.asarray(want), rtol=1e-12, atol=1e-12)


def test_geometric_median_minimises_the_sum_of_distances():
    """The Weiszfeld iterate against scipy's minimiser of sum_k ||m_k - c||."""
    from scipy.optimize import minimize

    m = np.random.default_rng(3).standard_t(2, size=(15, 3))
    c = _worlds.geometric_median(m, iters=500)
    ref = minimize(lambda x: np.linalg.norm(m - x, axis=1).sum(), m.mean(0), method="Nelder-Mead",
                   options=dict(xatol=1e-10, fatol=1e-12, maxiter=20000)).x
    np.testing.assert_allclose(c, ref, atol=1e-5)


def test_advice_estimate_is_poolsim_match_from_its_start():
    rng = np.random.default_rng(4)
    mu = 0.5 * rng.normal(size=(20, 2))
    mu[:5, 0] += 4.0
    X = mu[:, None, :] + SIGMA * rng.normal(size=(20, 40, 2))
    a = advise(X, seeds=60)
    assert a.strategy == "match" and a.estimator == "match" and a.worst_regret <= _advise.UNDECIDED_REGRET
    assert a.vs_pool.verdict == "holds"
    ref = poolsim.match(X, a.tau, init=a.init, tol=_advise.TOL)
    np.testing.assert_allclose(a.estimate, np.asarray(ref.mean), rtol=1e-10, atol=1e-12)
    assert a.tau_range[0] <= a.tau <= a.tau_range[1]
    assert all(w.regret >= 1.0 - 0.2 for w in a.worlds)  # regret is measured on the choosing seeds


# --- slow tier: regret of following the advice, the true risk from a plain loop -------------------------

# what each scenario family is held to: within 1.25 of the best, beating pooling (a paired 95% interval
# above 0), or no worse than pooling (the interval not below 0); the measured regrets behind these
# choices are in docs/advice.md (the weak families are held to what they do reach)
CLAIMS = {
    "paper asymptotic (K=50)": 1.25, "paper asymptotic (K=30)": "beats pool",
    "paper domain addition": 1.25, "heavy-tailed means (t2)": 1.25, "outliers along two directions": 1.25,
    "clean (no outliers)": 1.25, "larger d (d=20)": 1.25, "few domains (K=8)": "beats pool",
    "unequal domain sizes": "beats pool", "gradual drift": "beats pool", "tight outlier cluster": "not worse",
    "anisotropic (d=64)": "beats pool", "CLIP width (d=768, K=6)": 1.25,
    "paper asymptotic (K=100)": 1.25, "scattered outliers (d=5)": 1.25, "near breakdown (40% at 3)": 1.25,
    "outliers at two distances (d=3)": 1.25,
    "anisotropic inliers, clean (d=2)": "not worse", "anisotropic inliers, 20% at 2 on the short axis": "not worse",
    "K=20, 20% at 2": 1.25, "K=80, 20% at 1.2 (overlapping)": "not worse", "d=5, 30% at 2": 1.25,
    "d=10, 10% at 1.5": 1.25, "K=12, 25% at 2": "not worse", "Laplace means (d=3)": 1.25,
    "25% on a ring of radius 2": "not worse", "large domains (n=2000), 20% at 1": "not worse",
    "small domains (n=10), 20% at 1.5": 1.25, "clean (K=60, d=3)": 1.25,
}
# a known weakness, kept as a strict expected failure so that a fix shows: the worlds assume the paper's
# isotropic inliers, and for one anisotropic cloud with no outliers they advise a tau that loses to pooling
KNOWN_WEAK = {"anisotropic inliers, clean (d=2)": "isotropic worlds: a tau that loses to pooling (docs/advice.md)"}


def test_every_scenario_has_a_claim():
    assert set(CLAIMS) == set(_scenarios.SCENARIOS)


@pytest.mark.slow
@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=KNOWN_WEAK[n])) if n in KNOWN_WEAK else n
    for n in CLAIMS])
def test_regret_of_following_the_advice(name):
    """Two observed data sets per scenario (:mod:`poolsim._scenarios`); the true risk of the advice (its
    estimator, tau and start) and of the best of pooling and matching over 24 taus, on 200 fresh data
    sets (paired), from the plain loops of :mod:`poolsim._reference`. Held to :data:`CLAIMS`: a regret
    (ratio of mean errors) of at most 1.25 + 3 standard errors (delta method on the paired ratio), or
    the advice against pooling by the paired 95% interval of eps(pool) - eps(advice)."""
    family, claim = _scenarios.SCENARIOS[name], CLAIMS[name]
    rng = np.random.default_rng(5)
    observed = [_scenarios.observe(rng, family) for _ in range(2)]
    advice = [advise(means=m, sizes=n, sigma=SIGMA, seeds=300) for m, n in observed]
    scale = float(np.median([a.fitted["scale"] for a in advice]))
    grid = scale * np.geomspace(0.05, 8.0, 24)
    fresh_rng = np.random.default_rng(6)
    pool, errors = ref_true_risks(lambda: _scenarios.observe(fresh_rng, family),
                                  np.concatenate([grid, [a.tau for a in advice]]), 200)
    match = errors[:, :grid.size]
    followed = np.column_stack([pool if a.estimator == "pool" else errors[:, grid.size + j]
                                for j, a in enumerate(advice)])
    candidates = np.column_stack([pool, match])
    best = candidates[:, np.argmin(candidates.mean(axis=0))]
    for j in range(len(advice)):
        f = followed[:, j]
        ratio = f.mean() / best.mean()
        se = np.std(f - ratio * best, ddof=1) / math.sqrt(f.size) / best.mean()
        diff = pool - f
        half = stats.t.ppf(0.975, diff.size - 1) * diff.std(ddof=1) / math.sqrt(diff.size)
        if claim == "beats pool":
            assert diff.mean() - half > 0, (j, diff.mean(), half)
        elif claim == "not worse":
            assert diff.mean() + half >= 0, (j, diff.mean(), half)
        else:
            assert ratio <= claim + 3 * se, (j, ratio, se, advice[j].strategy, advice[j].tau)
