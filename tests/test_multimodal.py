"""match_multimodal: the paper's exclusive assignment rule, the Lemma (multimodal reduction) and
bad input. Oracle: poolsim._reference.ref_match_multimodal (plain loops, no shared code)."""
import jax.numpy as jnp
import numpy as np
import pytest
from optional_torch import needs_torch, torch
from hypothesis import given, settings
from hypothesis import strategies as st

import poolsim
from poolsim._reference import ref_match_multimodal
from poolsim.testing import examples, finite_floats


def _as_domains(points):
    """(n, d) points -> X (n, 1, d): each point is a one-sample domain."""
    return np.asarray(points, dtype=float)[:, None, :]


def _unit(rng, d):
    v = rng.normal(size=d)
    return v / np.linalg.norm(v)


def _lemma_config(seed, M, d, R, eps, extra, gap):
    """Modes, points and centroids satisfying the Lemma's hypotheses exactly.

    Coverage: tau_m = R + eps + extra_m >= R_max + eps_m. Separation: every pair of modes is at
    least S = 2 (tau_max + R + eps)(1 + gap) apart. Points lie within R of their mode -- random
    ones and, for every pair (i, j), the worst one at distance exactly R from mu_i towards mu_j;
    centroids sit at distance eps from their mode, pointing at the nearest other mode (worst case).
    """
    rng = np.random.default_rng(seed)
    taus = R + eps + np.asarray(extra[:M])
    S = 2 * (taus.max() + R + eps) * (1 + gap)
    mu = rng.normal(size=(M, d))
    pair = min(np.linalg.norm(mu[i] - mu[j]) for i in range(M) for j in range(i))
    mu *= S / pair  # min pairwise distance is now exactly S
    pts, labels = [], []
    for i in range(M):
        for _ in range(6):
            pts.append(mu[i] + R * rng.uniform() ** (1 / d) * _unit(rng, d))
            labels.append(i)
        for j in range(M):
            if j != i:
                towards = (mu[j] - mu[i]) / np.linalg.norm(mu[j] - mu[i])
                pts.append(mu[i] + R * (1 - 1e-12) * towards)
                labels.append(i)
    C = []
    for i in range(M):
        j = min((j for j in range(M) if j != i), key=lambda j: np.linalg.norm(mu[j] - mu[i]))
        C.append(mu[i] + eps * (mu[j] - mu[i]) / np.linalg.norm(mu[j] - mu[i]))
    return mu, np.array(pts), np.array(labels), np.array(C), taus


@settings(max_examples=examples(60), deadline=None)
@given(seed=st.integers(0, 2**32 - 1), M=st.integers(2, 4), d=st.integers(1, 4),
       R=finite_floats(0.05, 2.0), eps=finite_floats(0.0, 1.0, subnormal=True),
       extra=st.lists(finite_floats(0.0, 1.5, subnormal=True), min_size=4, max_size=4),
       gap=finite_floats(1e-6, 1.0))
def test_lemma_separation_no_wrong_mode(seed, M, d, R, eps, extra, gap):
    """Lemma (multimodal reduction) (a) + coverage. Domain: R in [0.05, 2], centroid error eps and
    radius slack extra_m in [0, 1] and [0, 1.5] -- zero (centroid exactly on its mode, tau exactly
    R + eps) and subnormals included: they enter only through sums with R >= 0.05, where they
    round away without touching the margins -- separation slack gap in [1e-6, 1]."""
    mu, pts, truth, C, taus = _lemma_config(seed, M, d, R, eps, extra, gap)
    X = _as_domains(pts)
    # Lemma (a) + coverage, at the given centroids (one assignment step): every point goes to its
    # own mode -- none to a wrong one, none left unassigned.
    one = poolsim.match_multimodal(X, taus, init=C, max_iter=1)
    np.testing.assert_array_equal(np.asarray(one.labels), truth)
    # Iterated to a fixed point: centroids stay means of own-mode points (within R of mu_m), so by
    # the same triangle inequality no point is ever pulled into a wrong mode.
    full = poolsim.match_multimodal(X, taus, init=C)
    lab = np.asarray(full.labels)
    assert np.all((lab == truth) | (lab == -1))


def test_violated_separation_assigns_to_wrong_mode():
    # Modes 2 apart; tau = 1; centroid 1 is off by eps = 0.5 away from mode 2; a mode-1 point at
    # distance R = 1.3 from mu_1 towards mu_2. Separation 2 < 2 (tau + R + eps) = 5.6 (violated).
    mu = np.array([[0.0, 0.0], [2.0, 0.0]])
    C = np.array([[-0.5, 0.0], [2.0, 0.0]])
    taus = np.array([1.0, 1.0])
    x = np.array([[1.3, 0.0]])
    assert np.linalg.norm(mu[0] - mu[1]) < 2 * (taus.max() + 1.3 + 0.5)
    res = poolsim.match_multimodal(_as_domains(x), taus, init=C, max_iter=1)
    # ||x - c_1|| = 1.8 >= 1 and ||x - c_2|| = 0.7 < 1: the mode-1 point goes to mode 2.
    assert int(np.asarray(res.labels)[0]) == 1


def test_violated_separation_random_mixture_has_wrong_assignments(rng):
    # Two overlapping Gaussian modes (separation 1.5, within-mode sd 1, tau 1.2): the Lemma does
    # not apply and a positive share of points lands in the wrong mode.
    mu = np.array([[0.0, 0.0], [1.5, 0.0]])
    truth = np.repeat([0, 1], 400)
    pts = mu[truth] + rng.normal(size=(800, 2))
    res = poolsim.match_multimodal(_as_domains(pts), [1.2, 1.2], init=mu, max_iter=1)
    lab = np.asarray(res.labels)
    wrong = np.mean((lab != truth) & (lab != -1))
    # P(||z|| >= 1.2, ||z - (1.5, 0)|| < 1.2) for z ~ N(0, I) is 0.106 (numerical integration,
    # scipy dblquad); 0.05 is 5 standard errors (sqrt(0.106 * 0.894 / 800) = 0.011) below it.
    assert wrong > 0.05


def test_exclusive_rule_and_unassigned_reporting():
    C = np.array([[0.0, 0.0], [1.0, 0.0]])
    pts = np.array([[-0.5, 0.0],   # only in ball 0 -> 0
                    [0.5, 0.0],    # in both balls -> unassigned
                    [1.6, 0.0],    # only in ball 1 -> 1
                    [5.0, 5.0]])   # in none -> unassigned
    res = poolsim.match_multimodal(_as_domains(pts), [0.8, 0.8], init=C, max_iter=1)
    np.testing.assert_array_equal(np.asarray(res.labels), [0, -1, 1, -1])
    np.testing.assert_array_equal(np.asarray(res.unassigned), [0, 1, 0, 1])
    np.testing.assert_array_equal(np.asarray(res.assigned), [[1, 0], [0, 0], [0, 1], [0, 0]])
    # per-mode update: each centroid is the mean of its own points only
    np.testing.assert_allclose(np.asarray(res.centroids), [[-0.5, 0.0], [1.6, 0.0]])
    np.testing.assert_array_equal(np.asarray(res.n_matched), [1, 1])


@pytest.mark.parametrize("level", ["domain", "sample"])
@pytest.mark.parametrize("metric", ["l2", "cosine", "geodesic"])
def test_matches_loop_reference(rng, level, metric):
    mu = np.array([[3.0, 0.5], [0.5, 3.0], [-2.0, -2.5]])
    X = mu[np.arange(9) % 3][:, None, :] + 0.4 * rng.normal(size=(9, 1, 2)) + 0.6 * rng.normal(
        size=(9, 12, 2))
    taus = [1.5, 1.2, 1.8] if metric == "l2" else [0.2, 0.3, 0.25]
    init = mu + 0.3 * rng.normal(size=mu.shape)
    res = poolsim.match_multimodal(X, taus, init=init, metric=metric, level=level)
    C, labels, n_iter = ref_match_multimodal(X, taus, init, metric=metric, level=level)
    np.testing.assert_allclose(np.asarray(res.centroids), C, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(np.asarray(res.labels).ravel(), labels)
    assert res.n_iter == n_iter


@pytest.mark.slow
@needs_torch
def test_backends_agree(rng):
    mu = np.array([[3.0, 0.0], [0.0, 3.0]])
    X = mu[np.arange(6) % 2][:, None, :] + 0.7 * rng.normal(size=(6, 15, 2))
    ref = poolsim.match_multimodal(X, [1.0, 1.0], init=mu)
    for arr in (jnp.asarray(X), torch.tensor(X)):
        out = poolsim.match_multimodal(arr, [1.0, 1.0], init=mu)
        np.testing.assert_allclose(np.asarray(out.centroids), np.asarray(ref.centroids),
                                   rtol=1e-12)
        np.testing.assert_array_equal(np.asarray(out.labels), np.asarray(ref.labels))


def test_kmeanspp_init_is_keyed_and_finds_separated_modes(rng):
    mu = np.array([[0.0, 0.0], [8.0, 0.0], [0.0, 8.0]])
    X = mu[np.arange(30) % 3][:, None, :] + 0.5 * rng.normal(size=(30, 10, 2))
    a = poolsim.match_multimodal(X, [2.0] * 3, init="kmeans++", key=3)
    b = poolsim.match_multimodal(X, [2.0] * 3, init="kmeans++", key=3)
    np.testing.assert_array_equal(np.asarray(a.centroids), np.asarray(b.centroids))
    # every true mode ends up with exactly one centroid within 1 of it
    dist = np.linalg.norm(np.asarray(a.centroids)[:, None] - mu[None], axis=-1)
    assert sorted(np.argmin(dist, axis=1).tolist()) == [0, 1, 2]
    assert dist.min(axis=1).max() < 1.0
    assert a.converged


@pytest.mark.parametrize("kwargs, match", [
    (dict(taus=[], init=np.zeros((0, 2))), "M must be >= 1"),
    (dict(taus=[1.0, 1.0], init=np.zeros((3, 2))), r"len\(taus\) = 2 does not match M = 3"),
    (dict(taus=[1.0], init=np.zeros((1, 3))), "dimension"),
    (dict(taus=[1.0, 0.0], init=np.zeros((2, 2))), "taus must all be > 0"),
    (dict(taus=[1.0, -2.0], init=np.zeros((2, 2))), "taus must all be > 0"),
    (dict(taus=[np.nan], init=np.zeros((1, 2))), "taus contains NaN"),
    (dict(taus=[1.0], init=np.array([[np.nan, 0.0]])), "init contains NaN"),
    (dict(taus=[1.0], init="kmeans++"), "needs key"),
    (dict(taus=[1.0], init="kmeans++median"), "needs key"),
    (dict(taus=[1.0], init="random"), "init must be one of"),
    (dict(taus=[1.0], init=np.zeros((1, 2)), metric="l1"), "metric must be one of"),
])
def test_bad_input(kwargs, match):
    X = np.ones((3, 4, 2))
    with pytest.raises(ValueError, match=match):
        poolsim.match_multimodal(X, **kwargs)


def test_nan_in_data_is_rejected():
    X = np.ones((3, 4, 2))
    X[1, 2, 0] = np.nan
    with pytest.raises(ValueError, match="X contains NaN"):
        poolsim.match_multimodal(X, [1.0], init=np.zeros((1, 2)))


def test_kmeanspp_median_with_one_mode_is_matching_from_the_median(rng):
    # M = 1: every point is in the single seed's cell, so the refined seed is the coordinate-wise
    # median of all samples -- the paper's unimodal initialisation; with one mode the exclusive
    # rule is the plain gate, so the result must equal poolsim.match(init="median").
    X = rng.normal(size=(8, 20, 2)) + np.array([3.0, 0.0]) * (np.arange(8) % 4 == 0)[:, None, None]
    multi = poolsim.match_multimodal(X, [1.5], init="kmeans++median", key=5, level="sample")
    single = poolsim.match(X, 1.5, level="sample", init="median")
    np.testing.assert_allclose(np.asarray(multi.centroids)[0], np.asarray(single.centroid),
                               rtol=1e-12)
    np.testing.assert_array_equal(np.asarray(multi.assigned)[..., 0], np.asarray(single.included))
