"""poolsim._threefry: JAX's Threefry draws in NumPy, checked bit for bit against JAX itself (the
oracle: jax.random with the default threefry2x32 implementation), under both x64 settings; and
poolsim.subsample's promise "same seed, same draw on every backend" through it."""
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from optional_torch import needs_torch, torch

import poolsim
from poolsim import _threefry as T

ROOT = Path(__file__).resolve().parents[1]
X64 = pytest.mark.parametrize("x64", [False, True], ids=["x32", "x64"])


def _words(seed):
    return np.asarray(jax.random.key_data(jax.random.key(seed)), np.uint32)


@pytest.mark.parametrize("seed", [0, 1, 7, 2**31 - 1, 2**31, 2**32 + 5, -1, -(2**40)])
@X64
def test_key_words_are_jax_key_data(seed, x64):
    with jax.enable_x64(x64):
        np.testing.assert_array_equal(T.key_words(seed, "threefry2x32"), _words(seed))
        np.testing.assert_array_equal(T.key_words(np.int64(seed), "threefry2x32"), _words(seed))
        typed = jax.random.key(seed)
        np.testing.assert_array_equal(T.key_words(typed, "threefry2x32"), _words(seed))
        np.testing.assert_array_equal(T.key_words(jax.random.key_data(typed), "threefry2x32"), _words(seed))


PERMUTED = (1, 2, 17, 1625, 1626, 5000)  # one shuffle round up to n = 1625, two from 1626


@X64
def test_split_bits_permutation_uniform_equal_jax(x64):
    """Each piece of the draw against jax.random (jitted: one compile for all of them)."""

    @jax.jit
    def want(key):
        out = {"split": jax.random.key_data(jax.random.split(key, 3)),
               "bits32": jax.random.bits(key, (40_000,), np.uint32),
               "perm": [jax.random.permutation(key, n) for n in PERMUTED],
               "uniform32": jax.random.uniform(key, (1000,), np.float32)}
        if x64:  # 64-bit words need x64 in JAX
            out["bits64"] = jax.random.bits(key, (40_000,), np.uint64)
            out["uniform64"] = jax.random.uniform(key, (1000,), np.float64)
        return out

    with jax.enable_x64(x64):
        for seed in (0, 2026):
            words, ref = _words(seed), want(jax.random.key(seed))
            np.testing.assert_array_equal(T.split(words, 3), ref["split"])
            np.testing.assert_array_equal(T.random_bits(words, 32, 40_000), ref["bits32"])
            for n, perm in zip(PERMUTED, ref["perm"]):
                np.testing.assert_array_equal(T.permutation(words, n), perm)
            np.testing.assert_array_equal(T.uniform(words, 1000, np.float32), ref["uniform32"])
            if x64:
                np.testing.assert_array_equal(T.random_bits(words, 64, 40_000), ref["bits64"])
                np.testing.assert_array_equal(T.uniform(words, 1000, np.float64), ref["uniform64"])


@X64
def test_subsample_draw_equals_the_jax_draw(x64, rng):
    """Every backend gets the JAX-input draw (``subsample_indices``, JAX's own samplers), bit for bit,
    at random (m, n, seed) and ragged counts, for K = 1, 50 and one past a single shuffle round."""
    from poolsim._strategies import subsample_indices

    dtype = np.float64 if x64 else np.float32
    want = jax.jit(subsample_indices, static_argnums=(2, 3))
    with jax.enable_x64(x64):
        for K in (1, 50, 3000):
            counts = rng.integers(1, 300, size=K)
            m, n, seed = int(rng.integers(1, K + 1)), int(rng.integers(1, 60)), int(rng.integers(0, 2**31))
            ref = want(jax.random.key(seed), jnp.asarray(counts.astype(dtype)), m, n)
            got = T.subsample_draw(T.key_words(seed, "threefry2x32"), counts, m, n, dtype)
            for a, b in zip(got, ref):
                np.testing.assert_array_equal(a, np.asarray(b))


def _assert_same_draw(got, want, X, m, n):
    """The same domains and indices, bit for bit; the means of the same points, equal up to the order each
    library sums in: two orders of a sum of M = m n terms differ by at most 2 (M - 1) eps sum|x|, so the
    means by at most 2 M eps max|x| (a bound, eps of the data's dtype)."""
    got, want = [np.asarray(a) for a in got], [np.asarray(a) for a in want]
    for a, b in zip(got[1:], want[1:]):
        np.testing.assert_array_equal(a, b)
    assert got[0].dtype == want[0].dtype == X.dtype
    np.testing.assert_allclose(got[0], want[0], rtol=0, atol=2 * m * n * np.finfo(X.dtype).eps * np.abs(X).max())


def _draws(key, X, m, n):
    return [tuple(np.asarray(a.detach() if torch.is_tensor(a) else a) for a in poolsim.subsample(key, conv(X), m, n))
            for conv in (np.asarray, torch.tensor, jnp.asarray)]


@needs_torch
@X64
@pytest.mark.parametrize("shape,m,n", [((50, 100, 2), 25, 50), ((300, 5, 3), 1, 9)])
def test_subsample_same_seed_same_result_on_every_backend(x64, shape, m, n, rng):
    """Same seed, same domains and indices on NumPy, torch and JAX input (see _assert_same_draw)."""
    dtype = np.float64 if x64 else np.float32  # JAX's default float: the dtype jnp.asarray gives X
    with jax.enable_x64(x64):
        X = rng.normal(size=shape).astype(dtype)
        for key in (11, jax.random.key(11)):
            numpy_res, torch_res, jax_res = _draws(key, X, m, n)
            _assert_same_draw(numpy_res, jax_res, X, m, n)
            _assert_same_draw(torch_res, jax_res, X, m, n)


@pytest.mark.slow  # compiles JAX's draw under other settings (~2 s)
def test_other_jax_settings_draw_through_jax(rng):
    """Where the NumPy stream is not JAX's (non-partitionable Threefry, an rbg key, a key of another
    implementation), NumPy input is drawn by JAX itself: still the JAX-input result."""
    X = rng.normal(size=(20, 6, 2))
    with jax.threefry_partitionable(False):
        assert T.settings()[1] is False
        _assert_same_draw(poolsim.subsample(5, X, 4, 3), poolsim.subsample(5, jnp.asarray(X), 4, 3), X, 4, 3)
    rbg = jax.random.key(5, impl="rbg")
    assert T.key_words(rbg, "threefry2x32") is None
    _assert_same_draw(poolsim.subsample(rbg, X, 4, 3), poolsim.subsample(rbg, jnp.asarray(X), 4, 3), X, 4, 3)
    assert T.key_words(5, "rbg") is None


@pytest.mark.slow
def test_numpy_subsample_imports_no_jax_and_draws_jax_numbers(tmp_path):
    """A fresh process: NumPy input is drawn without importing JAX (JAX's defaults assumed), and the draw
    is the one JAX makes once imported -- so the assumed defaults are this JAX's."""
    code = (
        "import sys, numpy as np, poolsim\n"
        "X = np.random.default_rng(0).normal(size=(50, 100, 2))\n"
        "a = poolsim.subsample(3, X, 25, 50)\n"
        "assert 'jax' not in sys.modules, 'jax was imported'\n"
        "import jax, jax.numpy as jnp\n"
        "b = poolsim.subsample(3, jnp.asarray(X), 25, 50)\n"
        "for u, v in zip(a[1:], b[1:]):\n"
        "    assert np.array_equal(np.asarray(u), np.asarray(v))\n"
        "print('ok')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_ENABLE_X64", "JAX_THREEFRY_PARTITIONABLE",
                                                             "JAX_DEFAULT_PRNG_IMPL")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                         env={**env, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr
