"""JAX's default random keys (Threefry-2x32) with a random-bits generator that fuses on CPU.

The bits are JAX's own, bit for bit: same key data, same ``split``/``fold_in`` (JAX's functions),
and ``random_bits`` computes JAX's partitionable Threefry stream -- word ``i`` of a request is
``h1 ^ h2`` for ``(h1, h2) = threefry2x32(key, (0, i))`` (``jax_threefry_partitionable``, the
default). So ``jax.random.normal(fast_key(s), ...)`` equals ``jax.random.normal(jax.random.key(s),
...)`` exactly (tested for normal, uniform, randint, bits, under ``vmap``, float32 and float64).

Why hand-written: on a CPU backend JAX lowers the hash as a rolled 5-step loop, each step one
pass over the whole array; written out here as 20 unrolled rounds XLA fuses it into a single
loop over the array (measured 3x faster for the engine's normals and 8x for its ``randint``
indices, 2,048 seeds, 2-core CPU). The hash is the published Threefry-2x32 (Salmon et al., SC
2011: rotation constants, key schedule with parity 0x1BD11BDA, injection every 4 rounds).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend import random as _jex_random

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = np.uint32(0x1BD11BDA)
_BASE = _jex_random.threefry_prng_impl


def threefry2x32(k1, k2, x1, x2):
    """The Threefry-2x32 hash (20 rounds) of counters ``(x1, x2)`` under key ``(k1, k2)``, all
    uint32 (broadcast). Returns ``(y1, y2)``."""
    ks = (k1, k2, k1 ^ k2 ^ _PARITY)
    x1, x2 = x1 + ks[0], x2 + ks[1]
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            x1 = x1 + x2
            x2 = ((x2 << np.uint32(r)) | (x2 >> np.uint32(32 - r))) ^ x1
        x1 = x1 + ks[(i + 1) % 3]
        x2 = x2 + ks[(i + 2) % 3] + np.uint32(i + 1)
    return x1, x2


def _random_bits(key, bit_width: int, shape: tuple):
    size = math.prod(shape)
    if not jax.config.jax_threefry_partitionable or size >= 2**32:
        return _BASE.random_bits(key, bit_width, shape)  # JAX's own code path
    lo = lax.iota(np.uint32, size).reshape(shape)
    h1, h2 = threefry2x32(key[0], key[1], jnp.zeros_like(lo), lo)
    if bit_width == 64:
        return (h1.astype(np.uint64) << np.uint64(32)) | h2.astype(np.uint64)
    return (h1 ^ h2).astype(f"uint{bit_width}")


FUSED_THREEFRY = _jex_random.define_prng_impl(
    key_shape=(2,), seed=_BASE.seed, split=_BASE.split, random_bits=_random_bits,
    fold_in=_BASE.fold_in, name="threefry2x32_fused")


def fast_key(seed):
    """``jax.random.key(seed)`` with the fused bits generator (same draws, faster on CPU)."""
    return jax.random.wrap_key_data(jax.random.key_data(jax.random.key(seed)), impl=FUSED_THREEFRY)
