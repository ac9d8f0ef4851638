"""Meta-distributions: each factory's documented E[mu_k] and Cov[mu_k] by Monte Carlo (fixed keys,
tolerances of a few standard errors computed from the draws), symmetry through odd moments,
balanced's exact mean, the outlier schedule, and parameter validation."""
import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from poolsim import metadist

K_MC = 4000  # draws per Monte-Carlo check (one call, one jit-free JAX draw)
Z = 4.5  # tolerance in standard errors; fixed keys make each check deterministic


def _assert_moments(draws, mean, cov):
    """Sample mean and covariance of ``draws: (n, d)`` within Z standard errors of ``mean``/``cov``.

    SE of a mean: s / sqrt(n). SE of a covariance entry S_ij = mean(a_i a_j) (a = centred draws):
    the standard deviation of the products a_i a_j over sqrt(n) (delta method, from the sample)."""
    n = draws.shape[0]
    m = draws.mean(axis=0)
    se_m = draws.std(axis=0, ddof=1) / np.sqrt(n)
    assert np.all(np.abs(m - mean) < Z * se_m), (m, mean, se_m)
    a = draws - m
    prods = a[:, :, None] * a[:, None, :]
    S = prods.mean(axis=0)
    se_S = prods.std(axis=0, ddof=1) / np.sqrt(n)
    assert np.all(np.abs(S - cov) < Z * se_S + 1e-12), (S, cov, se_S)


def _third_moment(x, about):
    """E[(x - about)^3] per coordinate and its standard error (sample SD of the cubes / sqrt(n))."""
    cubes = (x - about) ** 3
    return cubes.mean(axis=0), cubes.std(axis=0, ddof=1) / np.sqrt(len(x))


def test_symmetric_gaussian_moments_and_symmetry():
    mu = np.array([1.0, -2.0, 0.5])
    md = metadist.symmetric_gaussian(1.5, d=3, mu_star=mu)
    # Documented: E = mu_*, Cov = gamma^2 I = 2.25 I, symmetric, i.i.d.
    np.testing.assert_array_equal(md.mean, mu)
    np.testing.assert_array_equal(md.cov, 2.25 * np.eye(3))
    assert md.symmetric and md.iid and md.d == 3
    draws = np.asarray(md(jax.random.key(11), K_MC))
    _assert_moments(draws, md.mean, md.cov)
    # Symmetric about mu_*: every odd central moment vanishes; check the third.
    m3, se = _third_moment(draws, mu)
    assert np.all(np.abs(m3) < Z * se), (m3, se)


def test_contaminated_moments_and_asymmetry():
    p, alpha, gamma = 0.3, 1.5, 0.5
    v = np.array([1.0, 1.0]) / np.sqrt(2)
    md = metadist.contaminated(p, alpha, d=2, gamma=gamma, direction=[2.0, 2.0])
    # Documented: E = mu_* + p alpha v, Cov = gamma^2 I + p (1-p) alpha^2 v v^T (Bernoulli(p)
    # variance times alpha^2 along v, plus the Gaussian part).
    np.testing.assert_allclose(md.mean, p * alpha * v)
    np.testing.assert_allclose(md.cov, gamma ** 2 * np.eye(2) + p * (1 - p) * alpha ** 2 * np.outer(v, v))
    assert not md.symmetric and md.iid
    draws = np.asarray(md(jax.random.key(12), K_MC))
    _assert_moments(draws, md.mean, md.cov)
    # Asymmetric: along v the third central moment is that of alpha B, B ~ Bernoulli(p):
    # alpha^3 p (1-p) (1-2p) = 3.375 * 0.21 * 0.4 = 0.2835 (the Gaussian part adds 0).
    proj = draws @ v
    m3, se = _third_moment(proj, proj.mean())
    assert abs(m3 - alpha ** 3 * p * (1 - p) * (1 - 2 * p)) < Z * se
    assert m3 > Z * se  # and it is detectably non-zero, unlike the symmetric case
    # p = 0 (nobody shifted) or alpha = 0 is symmetric again.
    assert metadist.contaminated(0.0, 1.5, d=2).symmetric
    assert metadist.contaminated(0.3, 0.0, d=2).symmetric


def test_skewed_is_mean_preserving_but_skewed():
    s, gamma = 0.8, 0.3
    md = metadist.skewed(s, d=2, gamma=gamma, mu_star=[0.5, 0.5])
    # Documented: E = mu_* (E[Exp(1) - 1] = 0), Cov = gamma^2 I + s^2 e1 e1^T (Var Exp(1) = 1).
    np.testing.assert_array_equal(md.mean, [0.5, 0.5])
    np.testing.assert_allclose(md.cov, np.diag([gamma ** 2 + s ** 2, gamma ** 2]))
    assert not md.symmetric and md.iid
    draws = np.asarray(md(jax.random.key(13), K_MC))
    _assert_moments(draws, md.mean, md.cov)
    # Third central moment along e1: s^3 * 2 (Exp(1)'s third central moment is 2) = 1.024.
    m3, se = _third_moment(draws[:, 0], 0.5)
    assert abs(m3 - 2 * s ** 3) < Z * se
    # The mass piles up on the -v side: P(mu_1 < mu_*1) > 1/2 (without the noise it would be
    # P(E < 1) = 1 - 1/e = 0.632); check it exceeds 1/2 by more than Z binomial SEs.
    below = np.mean(draws[:, 0] < 0.5)
    assert below - 0.5 > Z * np.sqrt(0.25 / K_MC), below
    assert metadist.skewed(0.0, d=2).symmetric


@pytest.mark.slow
def test_balanced_exact_mean_pairs_and_marginal():
    mu = np.array([0.3, -1.0])
    md = metadist.balanced(1.2, d=2, mu_star=mu)
    assert md.symmetric and not md.iid
    np.testing.assert_array_equal(md.mean, mu)
    for K in (1, 2, 7, 10):
        x = np.asarray(md(K, K))
        # Documented: the sample mean of the K means is exactly mu_* for every draw.
        np.testing.assert_allclose(x.mean(axis=0), mu, rtol=0, atol=1e-14)
        # Mirrored pairs (rows 2j, 2j+1 average to mu_*) and, for odd K, the last row at mu_*.
        pairs = x[: K - K % 2].reshape(-1, 2, 2)
        np.testing.assert_allclose(pairs.mean(axis=1), np.broadcast_to(mu, (K // 2, 2)), atol=1e-15)
        if K % 2:
            np.testing.assert_array_equal(x[-1], mu)
    # Marginally each paired mean is N(mu_*, gamma^2 I): the "+" rows of one large draw.
    plus = np.asarray(md(jax.random.key(14), 2 * K_MC))[0::2]
    _assert_moments(plus, mu, 1.44 * np.eye(2))


@pytest.mark.slow
def test_outlier_schedule_positions_and_radius():
    mu = np.array([1.0, 0.0, -1.0])
    md = metadist.outlier_schedule(every=3, radius=2.5, d=3, gamma=0.5, mu_star=mu)
    assert md.mean is None and md.cov is None and not md.symmetric and not md.iid
    x = np.asarray(md(5, 12))
    r = np.linalg.norm(x - mu, axis=1)
    outlier = np.arange(1, 13) % 3 == 0  # domains k = 3, 6, 9, 12 (1-based)
    np.testing.assert_allclose(r[outlier], 2.5, rtol=1e-12)  # exactly on the sphere
    assert np.all(np.abs(r[~outlier] - 2.5) > 1e-6)
    # One-sided: every outlier lies in the half-space of the direction v = e1 (jitter 0.2).
    assert np.all((x[outlier] - mu) @ np.eye(3)[0] > 0)
    # Inliers: mu_* + gamma z, i.e. N(mu_*, 0.25 I); pool many draws of the inlier rows.
    inl = np.asarray(md(jax.random.key(15), 3 * K_MC))
    keep = np.arange(1, 3 * K_MC + 1) % 3 != 0
    _assert_moments(inl[keep], mu, 0.25 * np.eye(3))


@pytest.mark.parametrize("md", [
    metadist.symmetric_gaussian(1.0, d=2),
    metadist.contaminated(0.3, 1.5, d=2),
    metadist.skewed(0.5, d=2),
    metadist.outlier_schedule(d=2),
], ids=lambda m: m.name)
def test_prefix_of_a_longer_draw_is_the_shorter_draw(md):
    # Domains arrive in order: with one key, the first K rows of a draw of K_max rows are exactly
    # the draw of K rows (JAX's partitionable threefry makes a row's bits depend on its index only).
    np.testing.assert_array_equal(np.asarray(md(3, 10))[:7], np.asarray(md(3, 7)))
    # An int seed and the JAX key of that seed give the same draw.
    np.testing.assert_array_equal(np.asarray(md(3, 7)), np.asarray(md(jax.random.key(3), 7)))


def test_from_callable_wraps_and_checks_shape():
    def fn(key, K):
        return jax.random.uniform(key, (K, 2))

    md = metadist.from_callable(fn, d=2, name="uniform", mean=[0.5, 0.5], cov=np.eye(2) / 12)
    x = np.asarray(md(1, 5))
    np.testing.assert_array_equal(x, np.asarray(jax.random.uniform(jax.random.key(1), (5, 2))))
    # Documented moments of U[0, 1]^2 (mean 1/2, variance 1/12), checked by Monte Carlo.
    _assert_moments(np.asarray(md(jax.random.key(16), K_MC)), md.mean, md.cov)
    with pytest.raises(ValueError, match=r"\(K, d\) = \(5, 3\)"):
        metadist.from_callable(fn, d=3)(1, 5)  # fn returns (5, 2), d says 3
    with pytest.raises(ValueError, match="shape"):
        metadist.from_callable(lambda key, K: jax.random.uniform(key, (K,)), d=1)(1, 5)
    with pytest.raises(ValueError, match="fn"):
        metadist.from_callable("not callable", d=2)
    with pytest.raises(ValueError, match="mean"):
        metadist.from_callable(fn, d=2, mean=[0.5, 0.5, 0.5])
    with pytest.raises(ValueError, match="cov"):
        metadist.from_callable(fn, d=2, cov=np.eye(3))


BAD = {
    "gamma<0": (lambda: metadist.symmetric_gaussian(-1.0, d=2), "gamma"),
    "gamma nan": (lambda: metadist.balanced(float("nan"), d=2), "gamma"),
    "d=0": (lambda: metadist.symmetric_gaussian(1.0, d=0), "d"),
    "d float": (lambda: metadist.skewed(1.0, d=2.0), "d"),
    "mu_star shape": (lambda: metadist.symmetric_gaussian(1.0, d=3, mu_star=[0.0, 1.0]), "mu_star"),
    "mu_star inf": (lambda: metadist.balanced(1.0, d=2, mu_star=[0.0, np.inf]), "mu_star"),
    "p>1": (lambda: metadist.contaminated(1.5, 1.0, d=2), "p"),
    "p<0": (lambda: metadist.contaminated(-0.1, 1.0, d=2), "p"),
    "alpha<0": (lambda: metadist.contaminated(0.2, -1.0, d=2), "alpha"),
    "direction zero": (lambda: metadist.contaminated(0.2, 1.0, d=2, direction=[0.0, 0.0]), "direction"),
    "direction shape": (lambda: metadist.skewed(1.0, d=2, direction=[1.0, 0.0, 0.0]), "direction"),
    "scale inf": (lambda: metadist.skewed(np.inf, d=2), "scale"),
    "scale str": (lambda: metadist.skewed("big", d=2), "scale"),
    "gamma None": (lambda: metadist.symmetric_gaussian(None, d=2), "gamma"),
    "every=0": (lambda: metadist.outlier_schedule(every=0, d=2), "every"),
    "radius<0": (lambda: metadist.outlier_schedule(radius=-2.5, d=2), "radius"),
    "jitter nan": (lambda: metadist.outlier_schedule(jitter=float("nan"), d=2), "jitter"),
    "K=0": (lambda: metadist.symmetric_gaussian(1.0, d=2)(0, 0), "K"),
    "key": (lambda: metadist.symmetric_gaussian(1.0, d=2)("seed", 3), "key"),
    # a number given as a string or a bool is refused, not converted (float("0.3"), float(True))
    "p str": (lambda: metadist.contaminated("0.3", 1.0, d=2), "p"),
    "gamma bool": (lambda: metadist.symmetric_gaussian(True, d=2), "gamma"),
    "mu_star shape skewed": (lambda: metadist.skewed(1.0, d=2, mu_star=[0.0, 0.0, 0.0]), "mu_star"),
    "mu_star shape contaminated": (lambda: metadist.contaminated(0.2, 1.0, d=2, mu_star=[1.0] * 3),
                                   "mu_star"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_parameters_raise_value_error_naming_them(case):
    call, name = BAD[case]
    with pytest.raises(ValueError, match=rf"\b{name}\b"):
        call()


@pytest.mark.slow
def test_every_factory_records_name_target_and_parameters_in_any_dimension():
    """The fields theory.py and the engine read (name, mu_star, params, flags) are what each
    factory documents, for d = 1 (the 1-D closed forms) and d = 3; from_callable's defaults are
    not symmetric, i.i.d., moments unknown."""
    for d in (1, 3):
        mu = np.arange(1.0, d + 1.0)
        e1 = np.eye(d)[0]
        cases = [
            (metadist.symmetric_gaussian(1.5, d=d, mu_star=mu), "symmetric_gaussian",
             {"gamma": 1.5}, True, True),
            (metadist.balanced(1.5, d=d, mu_star=mu), "balanced", {"gamma": 1.5}, True, False),
            (metadist.contaminated(0.2, 3.0, d=d, mu_star=mu), "contaminated",
             {"p": 0.2, "alpha": 3.0, "gamma": 0.5, "direction": e1}, False, True),
            (metadist.skewed(1.0, d=d, mu_star=mu), "skewed",
             {"scale": 1.0, "gamma": 0.3, "direction": e1}, False, True),
            (metadist.outlier_schedule(d=d, mu_star=mu), "outlier_schedule",
             {"every": 3, "radius": 2.5, "gamma": 0.5, "jitter": 0.2, "direction": e1}, False, False),
        ]
        for md, name, params, symmetric, iid in cases:
            assert md.name == name and md.d == d
            np.testing.assert_array_equal(md.mu_star, mu)
            assert md.params.keys() == params.keys()
            for k, v in params.items():
                np.testing.assert_array_equal(md.params[k], v)
            assert md.symmetric is symmetric and md.iid is iid
            assert np.asarray(md(0, 4)).shape == (4, d)
        custom = metadist.from_callable(lambda key, K: jax.random.normal(key, (K, d)), d=d)
        assert custom.name == "custom" and custom.symmetric is False and custom.iid is True
        assert custom.mean is None and custom.cov is None and custom.params == {}
        np.testing.assert_array_equal(custom.mu_star, np.zeros(d))


# A sampler as a new user writes it in NumPy (issue 51): its draws ignore the key, so traced once they
# would be every seed's domain means.
NUMPY_T = lambda key, K: 0.5 * np.random.default_rng().standard_t(2, size=(K, 2))  # noqa: E731

REFUSED = {
    "numpy t": (NUMPY_T, "ignores its key"),
    "python random": (lambda key, K: jnp.full((K, 2), random.random()), "ignores its key"),
    "numpy constant as jax": (lambda key, K: jnp.asarray(np.random.default_rng(0).normal(size=(K, 2))),
                              "ignores its key"),
    "numpy seeded from the key": (lambda key, K: np.random.default_rng(np.asarray(jax.random.key_data(key)))
                                  .normal(size=(K, 2)), r"cannot be traced by JAX \(TracerArrayConversionError\)"),
    "int of a draw": (lambda key, K: jnp.full((K, 2), float(jax.random.normal(key))),
                      r"cannot be traced by JAX \(ConcretizationTypeError\)"),
    "not an array": (lambda key, K: None, r"returned NoneType, not a \(K, d\) array"),
    "a bug of its own": (lambda key, K: jax.random.normal(key, (K, 2)) @ jnp.ones((3, 3)),
                         r"failed when traced by JAX \(TypeError: dot_general"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_from_callable_refuses_a_sampler_the_engine_would_run_wrong(case):
    """One line naming the sampler, the reason and how to write it (JAX random functions of the key)."""
    fn, reason = REFUSED[case]
    with pytest.raises(ValueError, match=rf"^sampler 'mine' (.*){reason}") as err:
        metadist.from_callable(fn, d=2, name="mine")
    msg = str(err.value)
    assert "\n" not in msg and msg.endswith("e.g. lambda key, K: jax.random.t(key, 2.0, (K, 2))"), msg


def test_from_callable_accepts_jax_samplers_whose_draws_follow_the_key():
    """Student-t means and a two-cluster mixture, as JAX samplers: accepted; the mixture (drawn jitted, as the
    engine draws; one compile) gives a different draw per key and the same draw for the same key."""
    t = metadist.from_callable(lambda key, K: 0.5 * jax.random.t(key, 2.0, (K, 2)), d=2)
    assert t.name == "custom" and t.d == 2

    def two_clusters(key, K):
        kc, kz = jax.random.split(key)
        centre = jnp.where(jax.random.bernoulli(kc, 0.3, (K, 1)), jnp.array([2.5, 0.0]), 0.0)
        return centre + 0.3 * jax.random.normal(kz, (K, 2))

    mix = metadist.from_callable(two_clusters, d=2)
    a, b, again = np.asarray(jax.jit(jax.vmap(lambda k: mix(k, 50)))(jax.vmap(jax.random.key)(jnp.array([1, 2, 1]))))
    assert a.shape == (50, 2) and not np.any(a == b)
    np.testing.assert_array_equal(a, again)


def test_reads_input_follows_the_data_through_the_program():
    """The dependence test behind "ignores its key", on programs whose answer is known by construction."""
    from poolsim.metadist import _reads_input

    def program(f, *args):
        return jax.make_jaxpr(f)(*args).jaxpr

    x = jnp.ones(3)
    assert _reads_input(program(lambda a: jnp.sin(a) * 2.0, x))
    assert _reads_input(program(lambda a: jax.lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * a),
                                                              (0, a))[1], x))  # through an inner program
    assert not _reads_input(program(lambda a: jnp.full(3, 2.0) + 1.0, x))
    assert not _reads_input(program(lambda a: jnp.asarray(np.arange(3.0)) * 2.0, x))  # a captured constant
    assert not _reads_input(program(lambda a: (jnp.sin(a), jnp.zeros(3))[1], x))
