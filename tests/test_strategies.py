"""The public strategies (naive_pool, subsample, match) against independent oracles:
poolsim._reference (plain NumPy loops sharing no code with the core), scikit-learn's MeanShift
(domain-level L2 matching), and the closed-form law of Def. 2 for subsampling."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from optional_torch import needs_torch, torch
from sklearn.cluster import MeanShift

import poolsim
from poolsim import _reference as ref

BACKENDS = {"numpy": np.asarray, "jax": jnp.asarray, **({"torch": torch.tensor} if torch else {})}
ARRAY_TYPE = {"numpy": np.ndarray, "jax": jax.Array, **({"torch": torch.Tensor} if torch else {})}
BACKEND_NAMES = ["numpy", "jax", pytest.param("torch", marks=needs_torch)]
# Thresholds per metric: on the data below each excludes the two outlying domains but keeps the
# core group (checked in the test, so a tau that matches everything or nothing would fail).
TAUS = {"l2": 1.0, "cosine": 0.08, "geodesic": 0.4}
COUNTS = np.array([5, 3, 4, 5, 2, 5])  # ragged: the first counts[k] rows of X[k] are real


def _host(a):
    return a.detach().cpu().numpy() if torch is not None and torch.is_tensor(a) else np.asarray(a)


def _data(seed=0):
    """X: (6, 5, 3). Four domains near mu* = (2, 0, 0), one at (2, 2.5, 0) (off in angle and L2),
    one at (-0.5, 1.5, 0.5); within-domain spread 0.3. Padding rows (beyond COUNTS) are zeros."""
    rng = np.random.default_rng(seed)
    mu = np.array([2.0, 0, 0]) + 0.25 * rng.normal(size=(6, 3))
    mu[2] = [2.0, 2.5, 0.0]
    mu[4] = [-0.5, 1.5, 0.5]
    X = mu[:, None, :] + 0.3 * rng.normal(size=(6, 5, 3))
    return X * (np.arange(5)[None, :, None] < COUNTS[:, None, None])


CASES = ([("naive_pool", None, None), ("subsample", None, None)]
         + [("match", m, lvl) for m in TAUS for lvl in ("domain", "sample")])


@pytest.mark.parametrize("ragged", [False, True], ids=["full", "ragged"])
@pytest.mark.parametrize("backend", BACKEND_NAMES)
@pytest.mark.parametrize("strategy,metric,level", CASES)
def test_strategy_matches_reference(strategy, metric, level, backend, ragged):
    X = _data()
    counts = COUNTS if ragged else None
    Xb = BACKENDS[backend](X)
    cb = None if counts is None else BACKENDS[backend](counts)
    valid = np.arange(5)[None, :] < (COUNTS if ragged else np.full(6, 5))[:, None]

    if strategy == "naive_pool":
        res = poolsim.naive_pool(Xb, counts=cb)
        expected = ref.ref_naive_pool(X, counts)  # oracle: loop over valid samples
        assert float(_host(res.n_samples)) == valid.sum()
    elif strategy == "subsample":
        res = poolsim.subsample(123, Xb, 4, 7, counts=cb)
        dom, idx = _host(res.domains), _host(res.indices)
        assert dom.shape == (4,) and idx.shape == (4, 7) and len(set(dom.tolist())) == 4
        assert np.all(idx >= 0) and np.all(idx < valid.sum(axis=1)[dom][:, None])  # never padding
        # Oracle: the loop mean of exactly the draws poolsim reports (shared draws -> exact).
        expected = ref.ref_subsample_mean(X, dom, idx)
        # The same seed draws the same domains and indices on every backend (JAX does the draw).
        jres = poolsim.subsample(123, jnp.asarray(X), 4, 7, counts=counts)
        np.testing.assert_array_equal(dom, np.asarray(jres.domains))
        np.testing.assert_array_equal(idx, np.asarray(jres.indices))
    else:
        tau = TAUS[metric]
        res = poolsim.match(Xb, tau, metric=metric, level=level, counts=cb)
        c, inc, n_iter, conv = ref.ref_match(X, tau, metric=metric, level=level, counts=counts)
        expected = c  # oracle: ref_match (loops, np.median init, np.arccos geodesic)
        got_inc = _host(res.included)
        if level == "domain":
            assert got_inc.shape == (6,)
            np.testing.assert_array_equal(got_inc, inc)
            assert got_inc[[2, 4]].sum() == 0 and got_inc.sum() >= 3  # the data has a real choice
            matched = (got_inc[:, None] * valid).sum()
        else:
            assert got_inc.shape == (6, 5)
            assert np.all(got_inc[~valid] == 0)  # padding is never matched
            np.testing.assert_array_equal(got_inc[valid], inc)  # same domain-major order
            assert 0 < got_inc.sum() < valid.sum()
            matched = got_inc.sum()
        assert int(_host(res.n_iter)) == n_iter and bool(_host(res.converged)) == conv
        assert conv, "the fixed-seed data converges for every metric/level"
        assert float(_host(res.n_matched)) == matched
        np.testing.assert_allclose(_host(res.centroid), _host(res.mean), rtol=0, atol=0)

    assert isinstance(res.mean, ARRAY_TYPE[backend])  # results come back in the input's library
    np.testing.assert_allclose(_host(res.mean), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.slow
def test_match_and_pool_trace_under_jit():
    # Two combinations (each jit compile costs ~1 s); eager results of all combinations are
    # checked against the reference above, here only that tracing gives the same numbers.
    X = jnp.asarray(_data(1))
    for metric, level in (("geodesic", "domain"), ("l2", "sample")):
        tau = TAUS[metric]
        f = jax.jit(lambda x: poolsim.match(x, tau, metric=metric, level=level, counts=COUNTS))
        jitted, eager = f(X), poolsim.match(X, tau, metric=metric, level=level, counts=COUNTS)
        for a, b in zip(jitted, eager):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(jax.jit(lambda x: poolsim.naive_pool(x).mean)(X),
                               poolsim.naive_pool(X).mean, rtol=1e-12)
    # an explicit init of X's library is used as is, so it may be a tracer too
    c0 = jnp.asarray([2.0, 0.0, 0.0])
    traced = jax.jit(lambda x, c: poolsim.match(x, 1.0, init=c).centroid)(X, c0)
    np.testing.assert_allclose(traced, poolsim.match(X, 1.0, init=c0).centroid, rtol=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_domain_level_l2_match_equals_sklearn_meanshift(seed):
    """Flat-kernel mean shift from one seed is Def. 3 at domain level with equal domain sizes: the
    next centroid is the mean of the domain means within the bandwidth."""
    rng = np.random.default_rng(seed)
    K, N, d, tau, tol = 40, 4, 2, 1.0, 1e-4
    X = rng.normal(size=(K, 1, d)) * 1.2 + 0.2 * rng.normal(size=(K, N, d))
    means = X.mean(axis=1)
    c0 = np.median(X.reshape(-1, d), axis=0)  # the same start: the coordinate-wise median init
    res = poolsim.match(X, tau, metric="l2", level="domain", init="median", tol=tol)
    ms = MeanShift(bandwidth=tau, seeds=c0[None, :], cluster_all=False, bin_seeding=False).fit(means)
    # Tolerance: sklearn stops once a step is <= 1e-3 * bandwidth, we once a step is < tol. With a
    # flat kernel the iteration reaches an exact fixed point (the gated set stops changing, the
    # step becomes exactly 0) after finitely many steps, and both runs follow the same iterates, so
    # their stopping points differ by at most the last step either rule accepts:
    # 1e-3 * tau + tol = 1.1e-3.
    np.testing.assert_allclose(np.asarray(res.centroid), ms.cluster_centers_[0], rtol=0,
                               atol=1e-3 * tau + tol)
    # Membership: sklearn labels a point 0 iff it lies within the bandwidth of the final center
    # (cluster_all=False leaves the rest at -1) -- the same set as our included domains.
    np.testing.assert_array_equal(np.asarray(res.included), (ms.labels_ == 0).astype(float))
    assert 3 <= res.included.sum() < K


@pytest.mark.parametrize("backend", BACKEND_NAMES)
@pytest.mark.parametrize("level", ["domain", "sample"])
def test_empty_matched_set_keeps_previous_centroid(backend, level):
    X = BACKENDS[backend](_data())
    far = [50.0, 50.0, 50.0]  # an explicit start no domain mean or sample is within tau of
    # init as a list / a NumPy vector: also checks it is accepted whatever the library of X.
    init = far if level == "domain" else np.array(far)
    res = poolsim.match(X, 1.0, metric="l2", level=level, init=init)
    np.testing.assert_array_equal(_host(res.mean), far)  # the previous (= initial) centroid
    np.testing.assert_array_equal(_host(res.centroid), far)
    assert not bool(_host(res.converged)) and int(_host(res.n_iter)) == 1
    assert float(_host(res.n_matched)) == 0 and np.all(_host(res.included) == 0)
    assert np.all(np.isfinite(_host(res.mean)))


def _subsample_moments(X, counts, m, n):
    """Closed-form mean and variance (per coordinate) of the Def. 2 estimate.

    With xbar_k, s_k^2 the mean and (1/N_k) variance of domain k's N_k real rows:
    E = (1/K) sum_k xbar_k. Var = between + within: the mean of m domain means drawn without
    replacement has variance (sigma_b^2 / m) (K - m) / (K - 1), sigma_b^2 the (1/K) variance of the
    xbar_k; given the domains, the n-draw mean of domain k has variance s_k^2 / n, averaged over
    the m domains: (1 / (m n)) (1/K) sum_k s_k^2."""
    K = X.shape[0]
    rows = [X[k, : counts[k]] for k in range(K)]
    xbar = np.stack([r.mean(axis=0) for r in rows])
    s2 = np.stack([r.var(axis=0) for r in rows])
    between = xbar.var(axis=0) / m * (K - m) / (K - 1)
    return xbar.mean(axis=0), between + s2.mean(axis=0) / (m * n)


@pytest.mark.slow
def test_subsample_law_matches_reference_and_closed_form():
    # Ragged domains whose rows trend with the row index, so that drawing rows non-uniformly (or
    # from the padding) moves the mean and variance.
    X = _data(3)[:, :, :2] + np.arange(5)[None, :, None] * 0.5
    X = X * (np.arange(5)[None, :, None] < COUNTS[:, None, None])
    m, n, R = 3, 4, 2000
    mean, var = _subsample_moments(X, COUNTS, m, n)
    Xj = jnp.asarray(X)
    keys = jax.random.split(jax.random.key(2026), R)
    # jitted: one compile, not one per operation of the vmapped draw
    ours = np.asarray(jax.jit(jax.vmap(lambda k: poolsim.subsample(k, Xj, m, n, counts=COUNTS).mean))(
        keys))
    gen = np.random.default_rng(2026)
    theirs = np.stack([ref.ref_subsample(gen, X, m, n, counts=COUNTS) for _ in range(R)])
    for draws in (ours, theirs):
        # Mean within 4 standard errors, SE computed from the draws.
        se = draws.std(axis=0, ddof=1) / np.sqrt(R)
        assert np.all(np.abs(draws.mean(axis=0) - mean) < 4 * se), (draws.mean(axis=0), mean, se)
        # Variance within 4 SE of the sample variance: SE^2 = (m4 - s^4) / R from the draws.
        dev = draws - draws.mean(axis=0)
        s2 = (dev ** 2).mean(axis=0)
        se_var = np.sqrt(((dev ** 4).mean(axis=0) - s2 ** 2) / R)
        assert np.all(np.abs(draws.var(axis=0, ddof=1) - var) < 4 * se_var), (draws.var(axis=0), var)


def test_same_int_seed_and_jax_key_give_same_subsample():
    X = _data()
    a = poolsim.subsample(7, X, 3, 5)
    b = poolsim.subsample(jax.random.key(7), X, 3, 5)
    c = poolsim.subsample(jax.random.PRNGKey(7), X, 3, 5)  # raw uint32 key
    for other in (b, c):
        np.testing.assert_array_equal(a.domains, other.domains)
        np.testing.assert_array_equal(a.indices, other.indices)
        np.testing.assert_array_equal(a.mean, other.mean)
    d = poolsim.subsample(8, X, 3, 5)  # a different seed gives a different draw
    assert not np.array_equal(a.indices, d.indices)


_X = _data()


def _bad_x(value, where=(1, 2, 0)):
    X = _X.copy()
    X[where] = value
    return X


# (call, argument the message must name). Every bad input listed in issue 2.
BAD = {
    "tau=0": (lambda: poolsim.match(_X, 0.0), "tau"),
    "tau<0": (lambda: poolsim.match(_X, -1.0), "tau"),
    "tau=nan": (lambda: poolsim.match(_X, float("nan")), "tau"),
    "tau=inf": (lambda: poolsim.match(_X, float("inf")), "tau"),
    "tau=str": (lambda: poolsim.match(_X, "1"), "tau"),
    "K=0 pool": (lambda: poolsim.naive_pool(np.zeros((0, 3, 2))), "K"),
    "K=0 subsample": (lambda: poolsim.subsample(0, np.zeros((0, 3, 2)), 1, 1), "K"),
    "K=0 match": (lambda: poolsim.match(np.zeros((0, 3, 2)), 1.0), "K"),
    "N=0 pool": (lambda: poolsim.naive_pool(np.zeros((3, 0, 2))), "N"),
    "N=0 match": (lambda: poolsim.match(np.zeros((3, 0, 2)), 1.0), "N"),
    "nan in X pool": (lambda: poolsim.naive_pool(_bad_x(np.nan)), "X"),
    "inf in X subsample": (lambda: poolsim.subsample(0, _bad_x(np.inf), 2, 2), "X"),
    "-inf in X match": (lambda: poolsim.match(_bad_x(-np.inf), 1.0), "X"),
    "nan in X torch": (lambda: poolsim.match(torch.tensor(_bad_x(np.nan)), 1.0), "X"),
    "nan in X jax": (lambda: poolsim.naive_pool(jnp.asarray(_bad_x(np.nan))), "X"),
    "X 2-D": (lambda: poolsim.naive_pool(np.zeros((3, 2))), "X"),
    "X 4-D": (lambda: poolsim.match(np.zeros((2, 3, 2, 1)), 1.0), "X"),
    "counts length": (lambda: poolsim.naive_pool(_X, counts=[5, 5]), "counts"),
    "counts > N": (lambda: poolsim.match(_X, 1.0, counts=[6, 5, 5, 5, 5, 5]), "counts"),
    "counts = 0": (lambda: poolsim.subsample(0, _X, 2, 2, counts=[0, 5, 5, 5, 5, 5]), "counts"),
    "counts non-int": (lambda: poolsim.naive_pool(_X, counts=[2.5, 5, 5, 5, 5, 5]), "counts"),
    "metric": (lambda: poolsim.match(_X, 1.0, metric="manhattan"), "metric"),
    "level": (lambda: poolsim.match(_X, 1.0, level="pixel"), "level"),
    "init name": (lambda: poolsim.match(_X, 1.0, init="mode"), "init"),
    "init shape": (lambda: poolsim.match(_X, 1.0, init=np.zeros(2)), "init"),
    "init nan": (lambda: poolsim.match(_X, 1.0, init=np.array([0.0, np.nan, 0.0])), "init"),
    "tol": (lambda: poolsim.match(_X, 1.0, tol=0.0), "tol"),
    "max_iter": (lambda: poolsim.match(_X, 1.0, max_iter=0), "max_iter"),
    "m > K": (lambda: poolsim.subsample(0, _X, 7, 2), "m"),
    "m = 0": (lambda: poolsim.subsample(0, _X, 0, 2), "m"),
    "m float": (lambda: poolsim.subsample(0, _X, 2.0, 2), "m"),
    "n = 0": (lambda: poolsim.subsample(0, _X, 2, 0), "n"),
    "n < 0": (lambda: poolsim.subsample(0, _X, 2, -3), "n"),
    "key": (lambda: poolsim.subsample("seed", _X, 2, 2), "key"),
    "DA weights length": (lambda: poolsim.da_score([70, 72, 71, 75, 80], weights=[0.5, 0.5]), "weights"),
}


@pytest.mark.parametrize("case", [pytest.param(c, marks=needs_torch) if "torch" in c else c
                                  for c in BAD])
def test_bad_input_raises_value_error_naming_argument(case):
    call, name = BAD[case]
    with pytest.raises(ValueError, match=rf"\b{name}\b") as err:
        call()
    # ... and says what is allowed (a range, a set of choices, or "finite").
    msg = str(err.value)
    assert any(word in msg for word in ("must", "one of", ">=", "finite")), msg


# ---------------------------------------------------------------- issue 16: padding and stopping
@pytest.mark.parametrize("backend", BACKEND_NAMES)
@pytest.mark.parametrize("metric", list(TAUS))
def test_sample_level_never_reports_padding_as_included(backend, metric):
    """Ragged counts, level="sample": padding rows are never in ``included``, even when the
    padding (any finite values are allowed) lies on top of the matched samples. Issue 16's
    example: counts = [5, 2, 3] with the padding equal to each domain's first sample."""
    rng = np.random.default_rng(16)
    counts = np.array([5, 2, 3])
    X = np.array([2.0, 0.5, 0.0]) + 0.01 * rng.normal(size=(3, 5, 3))
    valid = np.arange(5)[None, :] < counts[:, None]
    X = np.where(valid[..., None], X, X[:, :1, :])  # padding = a copy of a real, matched sample
    res = poolsim.match(BACKENDS[backend](X), TAUS[metric], metric=metric, level="sample",
                        counts=BACKENDS[backend](counts))
    inc = _host(res.included)
    # all 10 real samples lie within 0.1 of each other, far inside every tau: all matched
    np.testing.assert_array_equal(inc, valid.astype(float))
    assert float(_host(res.n_matched)) == counts.sum()
    np.testing.assert_allclose(_host(res.mean), X[valid].mean(axis=0), rtol=1e-12)


@pytest.mark.parametrize("backend", BACKEND_NAMES)
@pytest.mark.parametrize("level", ["domain", "sample"])
def test_match_stops_at_the_first_step_below_tol(backend, level):
    """``converged`` means the last step moved less than ``tol`` and no earlier one did: checked by
    re-running with ``max_iter`` cut at every earlier iteration (the result of a cut run is the
    iterate c_t). Data: domain 0 has 899 samples at 0, domain 1 one sample at 0.9 (ragged), tau = 1,
    init 0: the first step moves to 0.9 / 900 = 1e-3 (in [tol, 100 tol) for tol = 1e-4), the
    second by exactly 0 -- the same iterates at both levels, since the samples of domain 0 coincide."""
    tol = 1e-4
    X = np.zeros((2, 899, 1))
    X[1, 0, 0] = 0.9
    counts = np.array([899, 1])
    Xb, cb = BACKENDS[backend](X), BACKENDS[backend](counts)

    def cut(max_iter):
        return poolsim.match(Xb, 1.0, level=level, init=np.zeros(1), tol=tol, max_iter=max_iter,
                             counts=cb)

    res = cut(100)
    assert bool(_host(res.converged)) and int(_host(res.n_iter)) == 2
    first = cut(1)
    assert not bool(_host(first.converged)) and int(_host(first.n_iter)) == 1
    step1 = abs(float(_host(first.centroid)[0]))
    step2 = abs(float(_host(res.centroid)[0]) - float(_host(first.centroid)[0]))
    assert tol <= step1 < 100 * tol and step2 < tol
    np.testing.assert_allclose(_host(res.centroid), [0.9 / 900], rtol=1e-12)


@needs_torch
def test_subsample_indices_are_int64_on_numpy_and_torch():
    """``subsample``'s ``domains`` and ``indices`` come back in the input's library with that library's
    index dtype, int64 (NumPy's ``intp``, torch's ``long``; the JAX draw itself is int32), so they
    index the caller's arrays without a cast; the same values as the JAX draw."""
    X = np.arange(5 * 3 * 2, dtype=float).reshape(5, 3, 2)
    jres = poolsim.subsample(7, jnp.asarray(X), 3, 4)
    for name, conv in (("numpy", np.asarray), ("torch", torch.tensor)):
        res = poolsim.subsample(7, conv(X), 3, 4)
        for got, want in ((res.domains, jres.domains), (res.indices, jres.indices)):
            assert str(got.dtype) in ("int64", "torch.int64"), (name, got.dtype)
            assert np.array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_empty_axis_message_names_the_axis(axis):
    shape = [2, 3, 4]
    shape[axis] = 0
    name = "KNd"[axis]
    with pytest.raises(ValueError, match=rf"X has {name} = 0 \(shape \({shape[0]}, {shape[1]}, {shape[2]}\)\)"):
        poolsim.naive_pool(np.zeros(shape))


@pytest.mark.parametrize("backend", BACKEND_NAMES)
def test_integer_X_is_pooled_in_the_library_default_float(backend):
    """An integer ``X`` is converted to its library's default float (NumPy float64, torch float32,
    JAX float64 under x64, as ``xp.asarray(0.0)``) before any arithmetic: the mean of 1 and 2 is 1.5
    (``naive_pool`` and ``match``; torch's ``astype(x, None)`` would keep int32)."""
    X = BACKENDS[backend](np.array([[[1], [2]]], dtype=np.int32))
    want = {"numpy": "float64", "jax": "float64", "torch": "float32"}[backend]
    for pooled in (poolsim.naive_pool(X).mean, poolsim.match(X, 10.0).centroid):  # one domain: its mean
        assert str(pooled.dtype).removeprefix("torch.") == want
        assert float(pooled[0]) == 1.5


def test_numpy_fast_paths_give_the_array_api_bits(rng, monkeypatch):
    """On NumPy input the median selects instead of sorting, full C-ordered domains are summed without
    a masked copy and naive_pool without counts skips the array-API layer; the oracle is the array-API code path the other libraries take, run on the same NumPy
    arrays (the fast paths switched off): equal bit for bit, at both levels, both inits, every metric,
    ragged and full, C and Fortran order, float32 and float64, and data scaled far from 1."""
    from poolsim import _core, _strategies

    def run(X, counts, scale):
        out = [poolsim.naive_pool(X, counts=counts)]
        for metric in TAUS:
            for level in ("domain", "sample"):
                for init in ("median", "mean"):
                    tau = TAUS[metric] * (scale if metric == "l2" else 1.0)  # l2 radii are in data units
                    out.append(poolsim.match(X, tau, metric=metric, level=level, init=init, counts=counts))
        return [np.asarray(a) for res in out for a in res]

    cases = []
    for dtype, scale in ((np.float64, 1.0), (np.float32, 1.0), (np.float64, 2.0 ** 300)):
        X = (_data(4) * scale).astype(dtype)
        cases += [(X, None, scale), (X, COUNTS, scale), (np.asfortranarray(X), None, scale)]
    fast = [run(*case) for case in cases]
    monkeypatch.setattr(_core, "is_numpy_namespace", lambda xp: False)
    monkeypatch.setattr(_strategies, "is_numpy_namespace", lambda xp: False)
    monkeypatch.setattr(_strategies, "_numpy_plain_pool", lambda X: None)
    for case, want in zip(cases, fast):
        got = run(*case)
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)


def test_pooled_sum_of_two_dimensional_data_is_numpys_sum_bit_for_bit(rng):
    """For ``d = 2`` NumPy input the pooled sum is a ``cumsum`` along the rows; the oracle is
    ``np.sum(axis=(0, 1))`` on the same array: equal bit for bit where the order of the additions shows
    (mixed scales with cancellation, signed zeros, subnormals, sums near overflow), in float32 and
    float64, and ``naive_pool`` equals the same sum over the count (or, where its docstring says the
    plain mean does not stand, the same sum of the data scaled by ``pow2_exponent``): ragged counts and
    NaN/inf (the same error) included."""
    from poolsim import _strategies

    for dtype in (np.float64, np.float32):
        info = np.finfo(dtype)
        big, tiny = float(info.max) / 4, float(info.smallest_subnormal)
        arrays = [rng.normal(size=(50, 100, 2)) * 10.0 ** rng.integers(-8, 9, size=(50, 100, 1)),
                  np.array([[[big, 1.0], [-big, -0.0], [3 * tiny, -0.0]]]),
                  np.array([[[1.0, tiny], [1e-30, -tiny], [-1.0, 2 * tiny]]]),
                  np.array([[[big, big / 2]], [[big, -big]], [[-big, big / 3]]]),
                  np.full((2, 3, 2), -0.0)]
        for X in arrays:
            X = X.astype(dtype)
            want = np.sum(X, axis=(0, 1))
            np.testing.assert_array_equal(_strategies._sample_sum(X, np), want)
            assert np.array_equal(np.signbit(_strategies._sample_sum(X, np)), np.signbit(want))
            total = dtype(X.shape[0] * X.shape[1])
            k = _strategies.pow2_exponent(X)
            expected = want / total
            if not _plain_mean_stands(expected):
                expected = _strategies.times_pow2(np.sum(_strategies.times_pow2(X, k), axis=(0, 1)) / total, -k)
            np.testing.assert_array_equal(poolsim.naive_pool(X).mean, expected)
        X = arrays[0].astype(dtype)
        counts = rng.integers(1, 101, size=50)
        valid = (np.arange(100)[None, :] < counts[:, None]).astype(dtype)
        np.testing.assert_array_equal(poolsim.naive_pool(X, counts=counts).mean,
                                      np.sum(valid[..., None] * X, axis=(0, 1)) / dtype(counts.sum()))
        for bad in (np.nan, np.inf, -np.inf):
            for where in ((0, 0, 0), (49, 99, 1), (20, 3, 0)):
                Y = X.copy()
                Y[where] = bad
                with pytest.raises(ValueError, match="X"):
                    poolsim.naive_pool(Y)


# ---------------------------------------------------------------- naive_pool: the plain sum first
def _plain_mean_stands(mean):
    """naive_pool's rule (its docstring): the unscaled mean stands where every component is finite and the
    largest |component| is at least 2**-q, q = maxexp // 4 of the dtype (256 for float64, 32 for float32)."""
    mean = np.asarray(mean)
    q = np.finfo(mean.dtype).maxexp // 4
    return bool(np.all(np.isfinite(mean))) and float(np.max(np.abs(mean))) >= 2.0 ** -q


def _scaled_pool(X, counts=None):
    """Oracle: the pooled mean computed on X * 2**pow2_exponent(X) (the scaled path every strategy takes)
    with np.sum over the masked samples, scaled back; ``valid * X`` as naive_pool forms it (the same layout,
    hence NumPy's same order of additions)."""
    from poolsim._strategies import pow2_exponent, times_pow2

    K, N, _ = X.shape
    cnt = np.full(K, N) if counts is None else np.asarray(counts)
    valid = (np.arange(N)[None, :] < cnt[:, None]).astype(X.dtype)
    k = pow2_exponent(X)
    Xk = times_pow2(X, k)
    A = valid[..., None] * Xk  # for a C-ordered X with every row valid: X's values in X's layout
    return times_pow2(np.sum(A, axis=(0, 1)) / X.dtype.type(cnt.sum()), -k)


SAFE = [((50, 100, 2), np.float64, 1.0), ((50, 100, 2), np.float32, 1.0), ((7, 30, 3), np.float64, 2.0 ** -200),
        ((20, 10, 64), np.float32, 2.0 ** -20), ((20, 10, 64), np.float64, 1e3),
        # largest |value| >= 2**q: the oracle scales these down (by 2**-42, 2**-305) yet no value gets near
        # the smallest normal, so the bits agree
        ((7, 30, 3), np.float32, 1e12), ((20, 10, 64), np.float64, 1e90)]


@pytest.mark.parametrize("layout", ["C", "F", "reversed"])
@pytest.mark.parametrize("ragged", [False, True], ids=["full", "ragged"])
@pytest.mark.parametrize("shape,dtype,scale", SAFE, ids=[f"{s}-{np.dtype(t).name}-{c:g}" for s, t, c in SAFE])
def test_naive_pool_plain_sum_is_the_scaled_paths_bits(shape, dtype, scale, ragged, layout):
    """Away from the smallest normal number the plain sum and the sum of X scaled by an exact power of two are
    the same additions, rounded alike (docstring of naive_pool): equal bit for bit to the scaled oracle, for
    d = 2 (cumsum path) and d >= 3, full and ragged counts, C, Fortran and reversed-stride layouts."""
    rng = np.random.default_rng(sum(shape))
    K, N, d = shape
    X = (scale * (rng.normal(size=shape) + rng.normal(size=(K, 1, d)))).astype(dtype)
    X = {"C": X, "F": np.asfortranarray(X), "reversed": X[::-1, ::-1]}[layout]
    counts = rng.integers(1, N + 1, size=K) if ragged else None
    res = poolsim.naive_pool(X, counts=counts)
    want = _scaled_pool(X, counts)
    assert res.mean.dtype == want.dtype
    np.testing.assert_array_equal(res.mean, want)
    assert float(res.n_samples) == (K * N if counts is None else counts.sum())


@pytest.mark.parametrize("backend", BACKEND_NAMES)
@pytest.mark.parametrize("d", [2, 3])
@pytest.mark.parametrize("where", ["sample", "padding"])
@pytest.mark.parametrize("bad", ["nan", "inf", "-inf", "inf and -inf"])
def test_naive_pool_non_finite_X_raises_even_in_padding(bad, where, d, backend):
    """NaN/inf anywhere in X is a ValueError naming X, also where it sits beyond counts (padding: 0 * inf
    is NaN, so the plain sum is not finite) and where +inf and -inf would cancel to NaN."""
    X = _data()[:, :, :d].copy()
    pos = (1, 0, 0) if where == "sample" else (4, 3, 0)  # COUNTS[4] = 2: row 3 of domain 4 is padding
    if bad == "inf and -inf":
        X[pos], X[(0, 0, 0) if where == "sample" else (1, 4, 0)] = np.inf, -np.inf  # COUNTS[1] = 3
    else:
        X[pos] = float(bad)
    counts = None if where == "sample" else COUNTS
    with pytest.raises(ValueError, match=r"\bX\b.*finite"):
        poolsim.naive_pool(BACKENDS[backend](X), counts=None if counts is None else BACKENDS[backend](counts))


@pytest.mark.parametrize("backend", BACKEND_NAMES)
@pytest.mark.parametrize("d", [2, 5])
def test_naive_pool_falls_back_when_the_plain_float32_sum_overflows(d, backend):
    """float32 values near 3e38: the plain sum overflows to inf (no warning), naive_pool falls back to the
    scaled sum and returns the finite mean. Reference: the same mean computed in float64 (rounded once to
    float32: within float32 rounding of the scaled float32 sums, rtol 1e-6 for 6 * 4 terms)."""
    rng = np.random.default_rng(d)
    X = (3e38 * rng.uniform(0.5, 1.0, size=(6, 4, d)) * np.where(rng.random((1, 1, d)) < 0.5, 1, -1))
    X = X.astype(np.float32)
    with np.errstate(over="ignore"):
        assert not np.all(np.isfinite(np.sum(X, axis=(0, 1))))  # the plain sum overflows
    mean = _host(poolsim.naive_pool(BACKENDS[backend](X)).mean)
    assert mean.dtype == np.float32 and np.all(np.isfinite(mean))
    np.testing.assert_allclose(mean, X.astype(np.float64).mean(axis=(0, 1)), rtol=1e-6)
    if backend == "numpy":
        np.testing.assert_array_equal(mean, _scaled_pool(X))


@pytest.mark.parametrize("backend", BACKEND_NAMES)
@pytest.mark.parametrize("shape", [(3, 4, 2), (3, 4, 5)])
def test_naive_pool_of_all_zero_X_is_zero(shape, backend):
    """Mean of zeros: 0 (the definition), not NaN; the zero mean takes the fallback (exponent 0 for zeros)."""
    res = poolsim.naive_pool(BACKENDS[backend](np.zeros(shape)), counts=BACKENDS[backend](np.array([4, 1, 2])))
    np.testing.assert_array_equal(_host(res.mean), np.zeros(shape[-1]))
    assert float(_host(res.n_samples)) == 7


@pytest.mark.parametrize("dtype,q", [(np.float64, 256), (np.float32, 32)])
@pytest.mark.parametrize("offset", [-3, -2, -1, 0, 1])
def test_naive_pool_near_the_threshold_2_to_the_minus_q(dtype, q, offset):
    """Data of magnitude 2**(offset - q), around the threshold 2**-q below which the plain mean does not stand
    (and below 2**-(q+1) X is scaled up, pow2_exponent): mantissas in [1, 2) with random low bits, a mean
    of the data's size. On either side the result is the scaled oracle's bits, and within float rounding
    (30 terms, rtol 8 eps) of the float64 mean of the same values."""
    rng = np.random.default_rng(q - offset)
    X = np.ldexp(rng.uniform(1.0, 2.0, size=(5, 6, 3)), offset - q).astype(dtype)
    mean = poolsim.naive_pool(X).mean
    np.testing.assert_array_equal(mean, _scaled_pool(X))
    np.testing.assert_allclose(mean, X.astype(np.float64).mean(axis=(0, 1)), rtol=8 * np.finfo(dtype).eps)
    assert _plain_mean_stands(mean) == (offset >= 0)  # the data sit on the intended side of 2**-q


@pytest.mark.parametrize("backend", BACKEND_NAMES + ["numpy array-API"])
def test_naive_pool_mixed_scales_documented_behaviour(backend, monkeypatch):
    """X = [2^40, -2^40, 2^-100 + 2^-120] (float32; benchmarks/RESULTS.md). Alone (d = 1) the mean,
    2^-100 / 3, is below 2^-32: the plain mean does not stand and the result is the scaled one, 85 * 2^-108
    (by hand: scaled by 2^-41, 2^-141 + 2^-161 is a subnormal rounded to 2^-141 (quantum 2^-149), / 3 rounds
    to 85 * 2^-149, times 2^41). Beside a component of ones (d = 2) the mean stands; the first component is
    then the plain float32 mean (2^-100 + 2^-120) / 3 rounded once (computed in float64, exact to 2^-53):
    the documented case where the result is not the scaled one. The same values on every backend and on
    NumPy arrays through the array-API code (except the scaled d = 1 case on JAX, see below)."""
    if backend == "numpy array-API":
        from poolsim import _core, _strategies

        monkeypatch.setattr(_core, "is_numpy_namespace", lambda xp: False)
        monkeypatch.setattr(_strategies, "is_numpy_namespace", lambda xp: False)
        monkeypatch.setattr(_strategies, "_numpy_plain_pool", lambda X: None)
    conv = BACKENDS["numpy" if backend == "numpy array-API" else backend]
    col = np.array([2.0 ** 40, -(2.0 ** 40), 2.0 ** -100 + 2.0 ** -120], np.float32)
    alone = _host(poolsim.naive_pool(conv(col.reshape(1, 3, 1))).mean)
    # JAX on the CPU flushes subnormal results to zero (XLA's setting): its scaled path gives 0 here
    assert alone.dtype == np.float32 and alone[0] == (0.0 if backend == "jax" else np.float32(85 * 2.0 ** -108))
    pair = np.stack([col, np.ones(3, np.float32)], axis=1).reshape(1, 3, 2)
    mean = _host(poolsim.naive_pool(conv(pair)).mean)
    want = np.array([(2.0 ** -100 + 2.0 ** -120) / 3, 1.0], np.float32)
    if backend == "jax":  # XLA's float32 division is within one unit in the last place of the rounded quotient
        np.testing.assert_allclose(mean, want, rtol=np.finfo(np.float32).eps, atol=0)
    else:
        np.testing.assert_array_equal(mean, want)
    if backend == "numpy":
        assert _scaled_pool(pair)[0] == np.float32(85 * 2.0 ** -108)  # what the scaled path would give


def _scaled_subsample_mean(X, flat_idx):
    """Oracle: the mean of the picked rows scaled by 2**pow2_exponent(X), scaled back (the scaled path)."""
    from poolsim._strategies import pow2_exponent, times_pow2

    k = pow2_exponent(X)
    picked = times_pow2(X.reshape(-1, X.shape[-1])[flat_idx], k)
    return times_pow2(np.mean(picked, axis=0), -k)


@pytest.mark.parametrize("shape,dtype,scale", SAFE, ids=[f"{s}-{np.dtype(t).name}-{c:g}" for s, t, c in SAFE])
def test_subsample_plain_mean_is_the_scaled_paths_bits(shape, dtype, scale):
    """subsample keeps the plain mean of the picked points where it stands (naive_pool's rule): away from
    the smallest normal number the same bits as the scaled oracle, the draw unchanged."""
    rng = np.random.default_rng(sum(shape) + 1)
    X = (scale * rng.normal(size=shape)).astype(dtype)
    K, N, _ = shape
    res = poolsim.subsample(7, X, max(1, K // 2), N // 2)
    flat = (np.asarray(res.domains)[:, None] * N + np.asarray(res.indices)).reshape(-1)
    want = _scaled_subsample_mean(X, flat)
    np.testing.assert_array_equal(res.mean, want)
    assert res.mean.dtype == np.dtype(dtype)


@pytest.mark.parametrize("backend", BACKEND_NAMES)
@pytest.mark.parametrize("bad", ["nan", "inf", "-inf"])
def test_subsample_non_finite_X_raises_even_outside_the_picked_rows(bad, backend):
    """NaN/inf anywhere in X is a ValueError naming X, also in a domain the draw does not pick (m = 1)."""
    X = _data()
    res = poolsim.subsample(3, X, 1, 2)
    other = (int(np.asarray(res.domains)[0]) + 1) % X.shape[0]
    X = X.copy()
    X[other, 0, 0] = float(bad)
    with pytest.raises(ValueError, match=r"\bX\b.*finite"):
        poolsim.subsample(3, BACKENDS[backend](X), 1, 2)


def test_subsample_squares_that_overflow_take_the_full_check():
    """float32 values of 1e30: their squares overflow (the one-pass check cannot tell), so X is checked in
    full (min and max); the plain mean of the picked points stands and equals the scaled one. Reference: the
    picked points' mean in float64, and the scaled-path oracle."""
    rng = np.random.default_rng(5)
    X = (1e30 * rng.uniform(0.5, 1.0, size=(6, 4, 3))).astype(np.float32)
    res = poolsim.subsample(11, X, 3, 4)
    flat = (np.asarray(res.domains)[:, None] * 4 + np.asarray(res.indices)).reshape(-1)
    want = X.reshape(-1, 3)[flat].astype(np.float64).mean(axis=0)
    np.testing.assert_allclose(res.mean, want, rtol=1e-6)
    np.testing.assert_array_equal(res.mean, _scaled_subsample_mean(X, flat))


# ---------------------------------------------------------------- the checks under jit; derivatives
def _jit_error(f, *args):
    """The message of the run-time error ``f(*args)`` raises (``pytest.fail`` if it returns): JAX reports
    equinox's error_if as a JaxRuntimeError (a RuntimeError) at the call, or as a ValueError where it
    surfaces when the result is waited for."""
    with pytest.raises((RuntimeError, ValueError)) as err:
        jax.block_until_ready(f(*args))
    return str(err.value)


@pytest.mark.slow  # the quick tier has its user-level twin in tests/test_user_hour_api.py
def test_input_checks_hold_under_jit():
    """The eager ValueErrors' value checks become run-time errors with the same message under jax.jit: one
    compiled program per strategy, run on good and on bad inputs (NaN/inf in X, tau and tol not > 0,
    counts out of range, a NaN init). Good inputs give the eager numbers."""
    X = jnp.asarray(_data())
    bad_X = jnp.asarray(_bad_x(np.nan))
    counts = jnp.asarray(COUNTS)
    fm = jax.jit(lambda x, tau, tol, c, init: poolsim.match(x, tau, tol=tol, counts=c, init=init).mean)
    good = (X, 1.0, 1e-4, counts, jnp.asarray([2.0, 0.0, 0.0]))
    np.testing.assert_allclose(fm(*good), poolsim.match(_data(), 1.0, counts=COUNTS, init=np.array([2.0, 0, 0])).mean,
                               rtol=1e-12)
    for i, value, message in [(0, bad_X, "X contains NaN or inf"), (0, X.at[0, 0, 0].set(-np.inf), "X contains NaN"),
                              (1, 0.0, "tau must be a finite number in \\(0, inf\\)"), (1, -1.0, "tau must be"),
                              (1, np.nan, "tau must be"), (2, 0.0, "tol must be a finite number in \\(0, inf\\)"),
                              (3, counts.at[1].set(0), r"counts must be integers in \[1, N=5\]"),
                              (3, counts.at[1].set(6), "counts must be integers"),
                              (4, jnp.asarray([np.nan, 0.0, 0.0]), "init contains NaN or inf")]:
        args = list(good)
        args[i] = value
        assert re.search(message, _jit_error(fm, *args)), (i, value)
    fp = jax.jit(lambda x: poolsim.naive_pool(x).mean)
    np.testing.assert_allclose(fp(X), poolsim.naive_pool(_data()).mean, rtol=1e-12)
    assert "X contains NaN or inf" in _jit_error(fp, bad_X)
    fs = jax.jit(lambda x: poolsim.subsample(3, x, 2, 4).mean)
    assert "X contains NaN or inf" in _jit_error(fs, bad_X)
    # vmap over a batch of data sets: one bad member is enough
    assert "X contains NaN" in _jit_error(jax.jit(jax.vmap(lambda x: poolsim.match(x, 1.0).mean)),
                                          jnp.stack([X, bad_X]))


@pytest.mark.slow  # the quick tier has its user-level twin in tests/test_user_hour_api.py
def test_traced_tau_with_numpy_X_is_traced_by_jax():
    """A NumPy X with a traced tau (jit or vmap over tau, X fixed) is computed by JAX: the eager numbers."""
    X = _data()
    taus = np.array([0.5, 1.0, 2.0])
    swept = jax.jit(jax.vmap(lambda t: poolsim.match(X, t).mean))(jnp.asarray(taus))
    for t, got in zip(taus, np.asarray(swept)):
        np.testing.assert_allclose(got, poolsim.match(X, t).mean, rtol=1e-12)


def _samples_included(res, level):
    """``(K, N)`` 0/1: the samples of the matched set (padding excluded by COUNTS)."""
    valid = np.arange(5)[None, :] < COUNTS[:, None]
    inc = _host(res.included)
    return (inc[:, None] if level == "domain" else inc) * valid


@pytest.mark.parametrize("metric,level", [("l2", "domain"), pytest.param("geodesic", "sample", marks=pytest.mark.slow),
                                          pytest.param("cosine", "domain", marks=pytest.mark.slow)])
def test_reverse_mode_through_match_is_the_matched_sets_mean(metric, level):
    """jax.grad through match: at the fixed point the matched set is locally constant (no domain within
    1e-6 of the radius on this data), so the matched mean is the plain mean of the matched samples and
    d(w . mean)/dX[k, i] = w / n_matched for a matched sample, 0 otherwise (closed form). torch autograd
    through the Python loop, central finite differences on NumPy float64 (step 1e-6; the function is
    linear there, so only rounding remains: ~1e-16 * |w . mean| / 1e-6 ~ 1e-10) and jax.jacfwd agree."""
    X = _data()
    tau = TAUS[metric]
    w = np.array([0.3, -0.7, 1.1])
    res = poolsim.match(X, tau, metric=metric, level=level, counts=COUNTS)
    assert res.converged
    expected = _samples_included(res, level)[..., None] * w / float(res.n_matched)
    assert 0 < expected.any(axis=-1).sum() < (np.arange(5)[None, :] < COUNTS[:, None]).sum()  # a real choice

    def mean(x, t=tau):
        return poolsim.match(x, t, metric=metric, level=level, counts=COUNTS).mean

    def f(x, t=tau):
        return mean(x, t) @ w

    # jitted: one compile for the three derivatives (op by op, each JAX operation compiles on its own)
    g, g_tau, jf = (np.asarray(a) for a in jax.jit(lambda x, t: (*jax.grad(f, argnums=(0, 1))(x, t),
                                                                  jax.jacfwd(mean)(x, t)))(jnp.asarray(X), tau))
    np.testing.assert_allclose(g, expected, rtol=1e-12, atol=1e-15)
    if torch is not None:  # the torch comparison where the adsim extra is installed (optional_torch)
        Xt = torch.tensor(X, requires_grad=True)
        (poolsim.match(Xt, tau, metric=metric, level=level, counts=torch.tensor(COUNTS)).mean
         @ torch.tensor(w)).backward()
        np.testing.assert_allclose(Xt.grad.numpy(), expected, rtol=1e-12, atol=1e-15)
    h = 1e-6
    fd = np.zeros_like(X)
    for idx in np.ndindex(X.shape):
        e = np.zeros_like(X)
        e[idx] = h
        fd[idx] = (float(f(X + e)) - float(f(X - e))) / (2 * h)
    np.testing.assert_allclose(g, fd, atol=1e-8)
    np.testing.assert_allclose(np.einsum("j,j...->...", w, jf), expected, rtol=1e-12, atol=1e-15)
    # tau moves the matched mean only by jumps (a domain crossing the radius): its derivative is 0
    assert float(g_tau) == 0.0


@pytest.mark.slow  # the quick tier has its user-level twin in tests/test_user_hour_api.py
def test_reverse_mode_when_nothing_is_matched_is_the_starts():
    """An empty first step keeps the start: the result is ``init`` (derivative: the identity in init, 0 in X)
    or, with init="median", the median of the samples (JAX's and torch's derivatives of the median's sort
    agree, and equal finite differences: the median is one of the samples, or the mean of two)."""
    X = _data()
    far = np.array([9.0, 9.0, 9.0])
    res = poolsim.match(X, 0.01, init=far)
    assert float(res.n_matched) == 0 and not res.converged
    w = np.array([0.3, -0.7, 1.1])

    def f(x):  # nothing lies within 1e-3 of the median
        return poolsim.match(x, 1e-3, counts=COUNTS).mean @ w

    assert float(poolsim.match(X, 1e-3, counts=COUNTS).n_matched) == 0
    derivs = jax.jit(lambda x, c: (jax.jacrev(lambda x, c: poolsim.match(x, 0.01, init=c).mean, argnums=(0, 1))(x, c),
                                   jax.grad(f)(x)))
    (gx, gi), g = derivs(jnp.asarray(X), jnp.asarray(far))
    np.testing.assert_array_equal(np.asarray(gx), 0.0)
    np.testing.assert_array_equal(np.asarray(gi), np.eye(3))
    g = np.asarray(g)
    if torch is not None:  # the torch comparison where the adsim extra is installed (optional_torch)
        Xt = torch.tensor(X, requires_grad=True)
        (poolsim.match(Xt, 1e-3, counts=torch.tensor(COUNTS)).mean @ torch.tensor(w)).backward()
        np.testing.assert_allclose(g, Xt.grad.numpy(), rtol=1e-12, atol=1e-15)
    assert np.count_nonzero(g) > 0
    h, fd = 1e-7, np.zeros_like(X)
    for idx in zip(*np.nonzero(g)):
        e = np.zeros_like(X)
        e[idx] = h
        fd[idx] = (float(f(X + e)) - float(f(X - e))) / (2 * h)
    np.testing.assert_allclose(g, fd, atol=1e-7)


@needs_torch
def test_match_multimodal_refuses_tracers_and_torch_autograd_works():
    """Its host loop cannot be traced: one line naming what works. torch autograd: the centroids are
    the means of the assigned samples (closed form), without a warning (filterwarnings=error)."""
    X = _data()
    init = np.array([[2.0, 0.0, 0.0], [-0.5, 1.5, 0.5]])
    for transform in (jax.jit, jax.jacfwd, jax.grad):
        with pytest.raises(TypeError, match=r"^match_multimodal cannot run under jax.jit, vmap, grad or jacfwd"
                                            r" .*torch autograd works\)\n"):
            transform(lambda x: poolsim.match_multimodal(x, [1.0, 1.0], init=init).centroids.sum())(jnp.asarray(X))
    Xt = torch.tensor(X, requires_grad=True)
    res = poolsim.match_multimodal(Xt, [1.0, 1.0], init=init, counts=torch.tensor(COUNTS))
    res.centroids[0].sum().backward()
    valid = np.arange(5)[None, :] < COUNTS[:, None]
    a = res.assigned.detach().numpy()[:, 0][:, None] * valid
    assert a.sum() > 0
    np.testing.assert_allclose(Xt.grad.numpy(), np.repeat((a / a.sum())[..., None], 3, axis=-1), rtol=1e-12)
