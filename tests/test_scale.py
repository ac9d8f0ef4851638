"""poolsim at any scale: ``match``, ``naive_pool`` and ``subsample`` on data from 1e-300 to 1e300 (float64)
and 1e-35 to 1e35 (float32) -- where squared norms overflow or underflow to zero unless the data are
rescaled -- and the refusal of complex, object and string arrays.

References: scaling equivariance itself (the same call at scale 1, with the l2 radius and the tolerance
scaled alike; cosine and geodesic radii are angles and stay); the exactness of scaling by a power of two
in IEEE arithmetic (mantissas unchanged: bitwise equal results); np.mean for the pooled mean."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from optional_torch import needs_torch, torch

import poolsim
from poolsim._strategies import pow2_exponent
from poolsim.testing import examples

TAUS = {"l2": 1.0, "cosine": 0.08, "geodesic": 0.4}  # tests/test_strategies.py: each separates the groups


def _data(seed=0):
    """X: (6, 5, 3), four domains near (2, 0, 0) and two off (tests/test_strategies.py's data, full)."""
    rng = np.random.default_rng(seed)
    mu = np.array([2.0, 0, 0]) + 0.25 * rng.normal(size=(6, 3))
    mu[2] = [2.0, 2.5, 0.0]
    mu[4] = [-0.5, 1.5, 0.5]
    return mu[:, None, :] + 0.3 * rng.normal(size=(6, 5, 3))


def _scaled_call(X, s, metric, level):
    return poolsim.match(X * s, TAUS[metric] * (s if metric == "l2" else 1.0), metric=metric, level=level,
                         tol=1e-4 * s)


def _check_equivariant(base, got, s, rtol):
    np.testing.assert_array_equal(np.asarray(got.included), np.asarray(base.included))
    assert int(got.n_iter) == int(base.n_iter) and bool(got.converged) == bool(base.converged)
    want = np.asarray(base.mean, dtype=np.float64)
    np.testing.assert_allclose(np.asarray(got.mean, dtype=np.float64) / s, want, rtol=rtol,
                               atol=rtol * float(np.max(np.abs(want))))


@settings(max_examples=examples(60), deadline=None)
@given(exponent=st.floats(-300, 300), metric=st.sampled_from(sorted(TAUS)), level=st.sampled_from(["domain", "sample"]))
def test_match_is_equivariant_to_scaling_over_the_float64_range(exponent, metric, level):
    """Scale s = 10**exponent (not a power of two: the data are rounded once, far below the groups'
    margins). Unscaled, l2 squares overflow above ~1e154 (nothing matched) and underflow below ~1e-154
    (every distance 0, everything matched); cosine and geodesic divide by norms that do the same."""
    X = _data()
    base = poolsim.match(X, TAUS[metric], metric=metric, level=level)
    assert 0 < float(np.sum(base.included)) < base.included.size  # the radius separates, at scale 1
    s = 10.0 ** exponent
    _check_equivariant(base, _scaled_call(X, s, metric, level), s, rtol=1e-12)


@settings(max_examples=examples(30), deadline=None)
@given(exponent=st.floats(-35, 35), metric=st.sampled_from(sorted(TAUS)))
def test_match_is_equivariant_to_scaling_over_the_float32_range(exponent, metric):
    X = _data().astype(np.float32)
    base = poolsim.match(X, TAUS[metric], metric=metric)
    s = np.float32(10.0 ** exponent)
    got = poolsim.match(X * s, np.float32(TAUS[metric]) * (s if metric == "l2" else 1), metric=metric,
                        tol=np.float32(1e-4) * s)
    _check_equivariant(base, got, float(s), rtol=1e-5)


@pytest.mark.parametrize("k", [-1000, -700, -300, 300, 700, 1000])
@pytest.mark.parametrize("metric", sorted(TAUS))
def test_power_of_two_scales_give_bitwise_the_scaled_result(k, metric):
    """X * 2**k is exact, and so is every step on it: the result is 2**k times the unscaled one, bit for bit."""
    X = _data()
    base = poolsim.match(X, TAUS[metric], metric=metric, level="sample")
    s = 2.0 ** k
    got = poolsim.match(X * s, TAUS[metric] * (s if metric == "l2" else 1.0), metric=metric, level="sample",
                        tol=1e-4 * s)
    assert np.array_equal(got.included, base.included) and int(got.n_iter) == int(base.n_iter)
    assert np.array_equal(got.mean, base.mean * s)


def test_ordinary_data_take_the_unscaled_path():
    """The safe range of the largest |value| is [2**-(q+1), 2**q) with q = maxexp // 4 (256 for float64,
    32 for float32): data inside it get exponent 0 and go through the core as they are; outside, the
    exponent brings the largest |value| into [0.5, 1)."""
    for dtype, q in ((np.float64, 256), (np.float32, 32)):
        assert pow2_exponent(np.array([0.75 * 2.0 ** q], dtype)) == 0
        assert pow2_exponent(np.array([2.0 ** -(q + 1)], dtype)) == 0
        assert pow2_exponent(np.array([-(2.0 ** q)], dtype)) == -(q + 1)
        assert pow2_exponent(np.array([2.0 ** -(q + 2)], dtype)) == q + 1
    assert pow2_exponent(_data()) == 0 and pow2_exponent(np.zeros((1, 1, 1))) == 0


@pytest.mark.parametrize("s", [1e-320, 1e-300, 1e300, 1e307])
def test_pooled_and_subsampled_means_stay_finite_up_to_the_dtype_range(s):
    """Reference: np.mean of the same inputs brought near 1 by np.ldexp (exact; at 1e-320 the inputs and
    the mean are subnormal, with few digits: the reference starts from the inputs, and the result is
    compared to one subnormal step, its resolution)."""
    Xs = _data() * s
    k = -int(np.round(np.log2(s)))
    step = 2 * np.ldexp(np.finfo(np.float64).smallest_subnormal, k)
    pooled = poolsim.naive_pool(Xs).mean
    np.testing.assert_allclose(np.ldexp(pooled, k), np.ldexp(Xs, k).reshape(-1, 3).mean(axis=0), rtol=1e-12,
                               atol=step)
    sub = poolsim.subsample(7, Xs, 3, 4)
    rows = np.asarray(sub.domains)[:, None] * 5 + np.asarray(sub.indices)
    ref = np.ldexp(Xs, k).reshape(-1, 3)[rows.reshape(-1)].mean(axis=0)
    np.testing.assert_allclose(np.ldexp(np.asarray(sub.mean), k), ref, rtol=1e-12, atol=step)


@needs_torch
def test_torch_gradients_and_jax_jit_through_the_rescale():
    """torch: d(sum of the matched mean)/dX is scale-free (the mean is linear in the matched samples), so
    the gradient at scale 1e200 equals the one at scale 1. jax.jit: the traced call (no rescale: values
    unknown) equals the eager one on ordinary data."""
    X = _data()
    grads = []
    for s in (1.0, 1e200):
        Xt = torch.tensor(X * s, requires_grad=True)
        poolsim.match(Xt, TAUS["l2"] * s, tol=1e-4 * s).mean.sum().backward()
        grads.append(Xt.grad.numpy())
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-12, atol=0)
    assert float(np.abs(grads[0]).sum()) > 0
    jitted = jax.jit(lambda a: poolsim.match(a, TAUS["l2"]).mean)(jnp.asarray(X))
    np.testing.assert_allclose(np.asarray(jitted), np.asarray(poolsim.match(jnp.asarray(X), TAUS["l2"]).mean),
                               rtol=1e-12)


COMPLEX = {"numpy complex": np.ones((2, 3, 2), complex), "numpy object": np.ones((2, 3, 2), object),
           "numpy string": np.full((2, 3, 2), "1.5"), "list of complex": [[[1j, 2.0]]],
           **({"torch complex": torch.ones((2, 3, 2), dtype=torch.complex64)} if torch else {}),
           "jax complex": jnp.ones((2, 3, 2), jnp.complex64)}
COMPLEX_NAMES = ["numpy complex", "numpy object", "numpy string", "list of complex",
                 pytest.param("torch complex", marks=needs_torch), "jax complex"]


@pytest.mark.parametrize("name", COMPLEX_NAMES)
@pytest.mark.parametrize("call", ["match", "naive_pool", "subsample", "match_multimodal"])
def test_non_real_arrays_are_a_type_error_naming_the_argument(name, call):
    X = COMPLEX[name]
    run = {"match": lambda: poolsim.match(X, 1.0), "naive_pool": lambda: poolsim.naive_pool(X),
           "subsample": lambda: poolsim.subsample(0, X, 1, 1), "match_multimodal": lambda: poolsim.match_multimodal(
               X, [1.0], init="kmeans++", key=0)}[call]
    with pytest.raises(TypeError, match=r"^X must hold real numbers"):
        run()


def test_complex_init_and_counts_are_a_type_error_naming_them():
    X = _data()
    with pytest.raises(TypeError, match=r"^init must hold real numbers"):
        poolsim.match(X, 1.0, init=np.array([1 + 1j, 0, 0]))
    with pytest.raises(TypeError, match=r"^counts must hold real numbers"):
        poolsim.match(X, 1.0, counts=np.full(6, 5 + 0j))
