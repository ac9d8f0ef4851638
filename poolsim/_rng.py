"""JAX's default random keys (Threefry-2x32) with a random-bits generator that fuses on CPU.

The bits are JAX's own, bit for bit: same key data, same ``split``/``fold_in`` (JAX's functions),
and ``random_bits`` computes JAX's partitionable Threefry stream -- word ``i`` of a request is
``h1 ^ h2`` for ``(h1, h2) = threefry2x32(key, (0, i))`` (``jax_threefry_partitionable``, the
default). So ``jax.random.normal(fast_key(s), ...)`` equals ``jax.random.normal(jax.random.key(s),
...)`` exactly (tested for normal, uniform, randint, bits, under ``vmap``, float32 and float64).

Why hand-written: on a CPU backend JAX lowers the hash as a rolled 5-step loop, each step one
pass over the whole array; written out here as 20 unrolled rounds XLA fuses it into a single
loop over the array (measured 3x faster for the engine's normals and 8x for its ``randint``
indices, 2,048 seeds, 2-core CPU). The hash is :mod:`poolsim._threefry`'s (the one the NumPy draws of
``poolsim.subsample`` use): written with array operators only, it traces under JAX as it runs on NumPy.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend import random as _jex_random

from ._threefry import threefry2x32

_BASE = _jex_random.threefry_prng_impl


def _bits_at(key, bit_width: int, lo):
    """Words ``lo`` (uint32 counters, any shape) of the partitionable Threefry stream of ``key``."""
    h1, h2 = threefry2x32(key[0], key[1], jnp.zeros_like(lo), lo)
    if bit_width == 64:
        return (h1.astype(np.uint64) << np.uint64(32)) | h2.astype(np.uint64)
    return (h1 ^ h2).astype(f"uint{bit_width}")


def _random_bits(key, bit_width: int, shape: tuple):
    size = math.prod(shape)
    if not jax.config.jax_threefry_partitionable or size >= 2**32:
        return _BASE.random_bits(key, bit_width, shape)  # JAX's own code path
    return _bits_at(key, bit_width, lax.iota(np.uint32, size).reshape(shape))


FUSED_THREEFRY = _jex_random.define_prng_impl(
    key_shape=(2,), seed=_BASE.seed, split=_BASE.split, random_bits=_random_bits,
    fold_in=_BASE.fold_in, name="threefry2x32_fused")


def fast_key(seed):
    """``jax.random.key(seed)`` with the fused bits generator (same draws, faster on CPU)."""
    return jax.random.wrap_key_data(jax.random.key_data(jax.random.key(seed)), impl=FUSED_THREEFRY)


@functools.lru_cache(maxsize=64)
def _impl_at(positions: tuple) -> object:
    """A PRNG implementation whose ``random_bits(key, w, (P,))`` are the words at flat
    ``positions`` (length P) of the fused stream; split and fold_in are JAX's."""
    lo = np.asarray(positions, np.uint32)

    def random_bits(key, bit_width, shape):
        if math.prod(shape) != lo.size:
            raise ValueError(f"this key draws exactly {lo.size} values, not shape {shape}")
        return _bits_at(key, bit_width, jnp.asarray(lo).reshape(shape))

    return _jex_random.define_prng_impl(
        key_shape=(2,), seed=_BASE.seed, split=_BASE.split, random_bits=random_bits,
        fold_in=_BASE.fold_in, name="threefry2x32_fused_at")


def _prefix_positions(lengths: tuple, width: int, inner_size: int) -> np.ndarray:
    if any(not 0 <= n <= width for n in lengths):
        raise ValueError(f"lengths must lie in [0, {width}], got {lengths}")
    return np.concatenate([r * width * inner_size + np.arange(n * inner_size, dtype=np.int64)
                           for r, n in enumerate(lengths)])


def prefix_draw(draw, key, lengths: tuple, width: int, inner: tuple = ()):
    """The entries of ``draw(key, (len(lengths), width) + inner)`` that lie in the first
    ``lengths[r]`` places of each row ``r`` (along the ``width`` axis), computed alone: shape
    ``(sum(lengths),) + inner``, rows in order (:func:`expand_prefix` puts them back in place).

    ``draw(key, shape)`` is a ``jax.random`` sampler (``normal``, ``uniform``, ``randint`` with its
    bounds bound, ...) and ``key`` one of :func:`fast_key`'s keys (or split from one). Why: the
    engine's subsampling draws a value for every (K step, domain) pair but reads only the first K
    domains of each step -- for K = 5..30, 455 of 780. Counter-based bits make the skipped
    entries free: the kept entries' counters are their flat positions in the full array, and every
    sampler is elementwise on its bits, so each kept value is computed by the same operations on
    the same bits (tested bitwise against the full draw). When JAX's Threefry is not
    partitionable: the full draw, then the kept entries picked from it."""
    inner = tuple(inner)
    inner_size = math.prod(inner)
    positions = _prefix_positions(tuple(lengths), width, inner_size)
    if not jax.config.jax_threefry_partitionable:
        flat = draw(key, (len(lengths), width) + inner).reshape(-1)
        return flat[positions].reshape((-1,) + inner)
    sub = jax.random.wrap_key_data(jax.random.key_data(key), impl=_impl_at(tuple(positions.tolist())))
    return draw(sub, (len(positions),)).reshape((-1,) + inner)


def expand_prefix(vals, lengths: tuple, width: int, axis: int = 0):
    """:func:`prefix_draw`'s values back in place: ``vals`` with ``sum(lengths)`` entries along
    ``axis`` -> the ``(len(lengths), width)`` layout there, 0 where nothing was drawn. Row ``r``
    is the window of ``width`` entries from row ``r``'s offset (a gather with constant indices,
    which XLA fuses into the readers), masked. Meant for the program that reads the values: in
    the program that draws them XLA fuses it with the hash and the sampler's arithmetic
    (measured ~3x the draw itself)."""
    axis = axis % vals.ndim
    lengths = np.asarray(lengths)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    pad = [(0, 0)] * vals.ndim
    pad[axis] = (0, width)
    window = offsets[:, None] + np.arange(width)[None, :]  # (rows, width)
    full = jnp.take(jnp.pad(vals, pad), window, axis=axis)
    keep = (np.arange(width)[None, :] < lengths[:, None]).reshape(
        window.shape + (1,) * (vals.ndim - axis - 1))
    return jnp.where(keep, full, jnp.zeros((), vals.dtype))
