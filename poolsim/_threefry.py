"""JAX's Threefry-2x32 random draws computed with NumPy, bit for bit, without importing JAX.

:func:`poolsim.subsample` promises the same draw for the same seed whatever the array library of
``X``. JAX draws it for JAX input; for NumPy and torch input this module draws the same bits on the
host, so a call on a new shape compiles nothing (a JAX draw on the host costs one XLA compile per
shape, seconds on a 2-core CPU) and a first call does not import JAX.

What is reproduced (JAX's partitionable Threefry stream, the default since JAX 0.5): word ``i`` of a
``random_bits`` request of ``size`` words is ``h1 ^ h2`` (32 bits) or ``h1 << 32 | h2`` (64 bits) for
``(h1, h2) = threefry2x32(key, (0, i))``; ``split(key, num)`` is key ``i = threefry2x32(key, (0, i))``;
``jax.random.permutation`` is JAX's ``_shuffle`` (rounds of a stable sort of the values by fresh 32-bit
words); ``jax.random.uniform`` sets the mantissa bits of a float in [1, 2) and subtracts 1. The
equality is tested bitwise against JAX (``tests/test_threefry.py``) under both ``jax_enable_x64``
settings; where JAX is configured otherwise (non-partitionable Threefry, another default PRNG) the
caller draws with JAX (:func:`settings` says which).

Why hand-written: NumPy's own generators give other numbers than JAX for the same seed, and the hash
is the published Threefry-2x32 (Salmon et al., SC 2011: rotation constants, key schedule with parity
0x1BD11BDA, key injection every 4 rounds).
"""
from __future__ import annotations

import functools
import importlib.metadata
import os
import sys

import numpy as np

ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
PARITY = np.uint32(0x1BD11BDA)
# words hashed per NumPy pass: the ~100 temporaries of one chunk stay in cache (measured 3-5x faster per
# word than whole-array passes at 10^6 words on the 2-core CPU)
_CHUNK = 1 << 14
# counters hashed as Python ints rather than arrays (a split's two keys): ~8 us each, against ~65 us for
# one NumPy pass of any small size, on the 2-core CPU
_FEW = 6
# environment variables that change the JAX settings read here (JAX reads them when it is imported)
_JAX_ENV = ("JAX_ENABLE_X64", "JAX_THREEFRY_PARTITIONABLE", "JAX_DEFAULT_PRNG_IMPL")


def threefry2x32(k1, k2, x1, x2):
    """The Threefry-2x32 hash (20 rounds) of counters ``(x1, x2)`` under key ``(k1, k2)``, all uint32
    arrays (broadcast; NumPy or jax.numpy), or all Python ints in ``[0, 2**32)`` (one counter pair, wrapped
    to 32 bits here: a few pairs hash ~7x faster so than as NumPy arrays, where each of the ~120 operations
    is a NumPy call). Returns ``(y1, y2)``. NumPy callers pass arrays, not NumPy scalars: uint32 scalar
    arithmetic that wraps around warns, array arithmetic wraps silently."""
    wrap, const = (_low32, int) if isinstance(x1, int) else (_same, np.uint32)
    ks = (k1, k2, k1 ^ k2 ^ const(PARITY))
    x1, x2 = wrap(x1 + ks[0]), wrap(x2 + ks[1])
    for i in range(5):
        for r in ROTATIONS[i % 2]:
            x1 = wrap(x1 + x2)
            x2 = (wrap(x2 << const(r)) | (x2 >> const(32 - r))) ^ x1
        x1 = wrap(x1 + ks[(i + 1) % 3])
        x2 = wrap(x2 + ks[(i + 2) % 3] + const(i + 1))
    return x1, x2


def _low32(x: int) -> int:
    return x & 0xFFFFFFFF


def _same(x):
    return x


def _hash(key: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """``threefry2x32(key, (0, i))`` for ``i < size`` (``size < 2**32``): up to ``_FEW`` counters as Python
    ints, more in cache-sized chunks of arrays."""
    if size <= _FEW:
        k1, k2 = int(key[0]), int(key[1])
        h1, h2 = zip(*(threefry2x32(k1, k2, 0, i) for i in range(size))) if size else ((), ())
        return np.array(h1, np.uint32), np.array(h2, np.uint32)
    k1, k2 = key[:1], key[1:2]
    h1 = np.empty(size, np.uint32)
    h2 = np.empty(size, np.uint32)
    for start in range(0, size, _CHUNK):
        lo = np.arange(start, min(size, start + _CHUNK), dtype=np.uint32)
        h1[start:start + lo.size], h2[start:start + lo.size] = threefry2x32(k1, k2, np.zeros_like(lo), lo)
    return h1, h2


def split(key: np.ndarray, num: int = 2) -> np.ndarray:
    """``jax.random.split`` of raw key data ``key: (2,)`` uint32 -> ``(num, 2)`` uint32."""
    return np.stack(_hash(key, num), axis=1)


def random_bits(key: np.ndarray, bit_width: int, size: int) -> np.ndarray:
    """``size`` words of ``bit_width`` (32 or 64) bits of ``key``'s stream, as JAX's ``random_bits``."""
    return _random_words([(key, bit_width, size)])[0]


def _random_words(requests: list) -> list[np.ndarray]:
    """:func:`random_bits` of each ``(key, bit_width, size)`` in ``requests``. Requests of more than
    ``_FEW`` words that add up to at most ``_CHUNK`` go through one hash, each counter with its request's
    key: a small hash costs its ~120 NumPy calls whatever its size, so they are paid once, not per request."""
    hashed: list = [None] * len(requests)
    batch = [i for i, (_, _, size) in enumerate(requests) if size > _FEW]
    sizes = [requests[i][2] for i in batch]
    if len(batch) > 1 and sum(sizes) <= _CHUNK:
        keys = np.array([requests[i][0] for i in batch], np.uint32)
        k1, k2 = np.repeat(keys[:, 0], sizes), np.repeat(keys[:, 1], sizes)
        lo = np.concatenate([np.arange(size, dtype=np.uint32) for size in sizes])
        h1, h2 = threefry2x32(k1, k2, np.zeros_like(lo), lo)
        cuts = np.cumsum(sizes)[:-1]
        for i, a, b in zip(batch, np.split(h1, cuts), np.split(h2, cuts)):
            hashed[i] = (a, b)
    out = []
    for (key, bit_width, size), h in zip(requests, hashed):
        h1, h2 = _hash(key, size) if h is None else h
        out.append((h1.astype(np.uint64) << np.uint64(32)) | h2.astype(np.uint64) if bit_width == 64 else h1 ^ h2)
    return out


def permutation(key: np.ndarray, n: int) -> np.ndarray:
    """``jax.random.permutation(key, n)``: ``ceil(3 ln n / ln(2**32 - 1))`` rounds, each a stable sort of
    the values by fresh 32-bit words (JAX's ``_shuffle``) -> ``(n,)`` int64."""
    return _shuffled(n, _random_words([(sub, 32, n) for sub in _round_keys(key, n)]))


def _round_keys(key: np.ndarray, n: int) -> list[np.ndarray]:
    """The keys of :func:`permutation`'s rounds: each round splits its key off the previous one."""
    subs = []
    for _ in range(int(np.ceil(3 * np.log(max(1, n)) / np.log(np.iinfo(np.uint32).max)))):
        key, sub = split(key)
        subs.append(sub)
    return subs


def _shuffled(n: int, words: list[np.ndarray]) -> np.ndarray:
    """``arange(n)`` stably sorted by each round's 32-bit ``words: (n,)`` in turn."""
    x = np.arange(n)
    for w in words:
        x = x[np.argsort(w, kind="stable")]
    return x


def uniform(key: np.ndarray, size: int, dtype) -> np.ndarray:
    """``jax.random.uniform(key, (size,), dtype)`` on [0, 1) for float32 or float64."""
    dtype = np.dtype(dtype)
    return _to_uniform(random_bits(key, 8 * dtype.itemsize, size), dtype)


def _to_uniform(bits: np.ndarray, dtype) -> np.ndarray:
    """Words of ``dtype``'s width -> :func:`uniform`'s floats: the top mantissa bits of a float in [1, 2), less 1."""
    dtype = np.dtype(dtype)
    nbits, nmant = 8 * dtype.itemsize, np.finfo(dtype).nmant
    uint = np.dtype(f"uint{nbits}")
    bits = (bits >> uint.type(nbits - nmant)) | np.array(1.0, dtype).view(uint)
    return bits.view(dtype) - dtype.type(1.0)


def subsample_draw(key: np.ndarray, counts: np.ndarray, m: int, n: int, dtype) -> tuple[np.ndarray, np.ndarray]:
    """Def. 2's draw as ``poolsim._strategies.subsample_indices`` makes it in JAX, here in NumPy.

    ``key: (2,)`` uint32 key data, ``counts: (K,)`` integers >= 1, ``dtype`` JAX's default float
    (float64 under ``jax_enable_x64``, else float32) -> ``(domains (m,), indices (m, n))`` int64: ``m``
    distinct domains (the first ``m`` of a permutation), then ``n`` indices per domain, each
    ``min(floor(u * counts[k]), counts[k] - 1)`` for a uniform ``u`` computed in ``dtype``."""
    dtype = np.dtype(dtype)
    kd, ks = split(np.asarray(key, np.uint32))
    K = counts.shape[0]
    # the permutation's words and the uniforms' do not depend on each other: requested together
    *rounds, bits = _random_words([(sub, 32, K) for sub in _round_keys(kd, K)] + [(ks, 8 * dtype.itemsize, m * n)])
    domains = _shuffled(K, rounds)[:m]
    size = np.asarray(counts)[domains].astype(np.int32)
    u = _to_uniform(bits, dtype).reshape(m, n)
    idx = np.minimum(np.floor(u * size.astype(dtype)[:, None]).astype(np.int32), size[:, None] - 1)
    return domains.astype(np.int64), idx.astype(np.int64)


@functools.lru_cache(maxsize=1)
def _jax_version() -> tuple[int, ...]:
    try:
        text = importlib.metadata.version("jax")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - jax is a hard dependency
        return (0,)
    parts = []
    for piece in text.split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def settings() -> tuple[bool, bool, str]:
    """``(x64, partitionable, default_prng_impl)``: the JAX settings in effect, which decide JAX's draw.

    Read from ``jax.config`` when JAX is imported (thread-local ``jax.enable_x64`` included) or when an
    environment variable JAX reads them from is set (then JAX is imported to read them); otherwise JAX
    would start with its defaults, which for JAX >= 0.5 are ``(False, True, "threefry2x32")`` -- known
    without importing JAX (a second or more on a first call)."""
    if "jax" not in sys.modules and not any(v in os.environ for v in _JAX_ENV) and _jax_version() >= (0, 5):
        return False, True, "threefry2x32"
    import jax

    return (bool(jax.config.jax_enable_x64), bool(jax.config.jax_threefry_partitionable),
            str(jax.config.jax_default_prng_impl))


def key_words(key, default_impl: str) -> np.ndarray | None:
    """Raw Threefry key data ``(2,)`` uint32 of ``key`` as :func:`poolsim._strategies.as_key` reads it, or
    ``None`` where this module cannot draw JAX's numbers for it (another PRNG implementation, a traced
    key, anything that is not a key: the caller then goes through JAX, which also reports bad keys).

    An int seed in ``[0, 2**31)`` is ``(0, seed)`` under either ``jax_enable_x64`` setting (JAX's
    ``threefry_seed``); other ints are converted by JAX itself."""
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        if default_impl != "threefry2x32":
            return None
        if 0 <= int(key) < 2**31:
            return np.array([0, int(key)], np.uint32)
        import jax

        return np.asarray(jax.random.key_data(jax.random.key(int(key))), np.uint32)
    jax = sys.modules.get("jax")
    if jax is None or not isinstance(key, jax.Array) or isinstance(key, jax.core.Tracer):
        return None
    if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        if key.shape != () or str(jax.random.key_impl(key)) != "threefry2x32":
            return None
        return np.asarray(jax.random.key_data(key), np.uint32)
    if key.shape == (2,) and key.dtype == np.uint32 and default_impl == "threefry2x32":
        return np.asarray(key, np.uint32)
    return None
