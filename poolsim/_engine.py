"""Vectorised JAX Monte Carlo: a batch of seeds at once, ``lax.scan`` walks K.

For each seed: draw ``K_max`` domain means from the meta-distribution, then the per-domain data
(either materialised samples ``(K_max, n, d)`` or their sufficient statistics), then scan over the
requested K values -- every K is the prefix ``1..K`` of the same domains, handled with 0/1 masks so
shapes never change and the whole experiment is traced once. :func:`_one_seed` states one seed's
computation; the engine (:func:`_batch`) computes the same numbers for a whole chunk of seeds with
the seed axis leading (one scan, one batched matching loop per K), and the random keys come from
:mod:`poolsim._rng` (JAX's Threefry numbers, faster bits on CPU). ``simulate(...,
distributed=True)`` splits the seeds over the processes of a ``jax.distributed`` job.

Sufficient-statistics path (``materialize=False``): with ``x_{k,i} ~ N(mu_k, s^2 I)``,

* the domain sample mean is exactly ``xbar_k = mu_k + s / sqrt(n) z_k``;
* the mean of ``n'`` points drawn with replacement from domain k's ``n`` samples is jointly
  Gaussian with ``xbar_k``: given the draw's index multiset with ``q = sum_i c_i^2`` (c_i = times
  sample i was drawn; ``q`` itself is drawn from its exact law, :func:`collision_law`),
  ``Cov(xbar, sub) = s^2 / n`` and ``Var(sub) = s^2 q / n'^2``, hence
  ``sub = xbar_k + s sqrt(q / n'^2 - 1 / n) z'`` exactly (q/n'^2 >= 1/n by Cauchy-Schwarz);
* the matching init ``"median"`` is the coordinate-wise median of the *domain means* (the sample
  median needs the samples -- use ``materialize=True`` for the paper's sample-wise median).

So the cost does not grow with n. ``materialize=True`` draws every sample (needed for the paper's
sample median init and for resampling actual points).
"""
from __future__ import annotations

import contextlib
import functools
import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from . import _cache, _core, _programs, _rng

STRATEGIES = ("pool", "subsample", "match")


class Spec(NamedTuple):
    """Static description of one experiment run (hashable: it keys the compiled-function cache).

    ``sample_means``: ``key -> (K_max, d)`` (the meta-distribution's sampler); a sampler with a
    ``store_key`` string attribute (equal strings: samplers that trace alike in every process with
    the same poolsim source) lets the compiled programs be stored across processes
    (:func:`store_ident`, :mod:`poolsim._programs`). ``Ks``: increasing K
    values. ``init``: "median" | "mean" | "target". ``m_frac``: subsampling takes
    ``m = ceil(m_frac K)`` domains, ``n_sub`` points each.
    """

    sample_means: Callable
    K_max: int
    d: int
    Ks: tuple
    n: int
    sigma: float
    tau: float
    metric: str
    init: str
    tol: float
    max_iter: int
    m_frac: float
    n_sub: int
    mu_star: tuple
    materialize: bool


class SeedResult(NamedTuple):
    """Per seed (leading axis S after vmap): ``estimates (nK, 3, d)`` for pool/subsample/match,
    ``n_domains (nK, 3)`` domains used, ``converged (nK,)``, ``n_iter (nK,)`` for matching,
    ``included (nK, K_max)`` matching's domain flags (bool: a quarter of float32's bytes, and the largest
    per-seed field -- 780 of 2,326 bytes per seed at the paper's parameters), ``means (K_max, d)`` the true domain means,
    ``xbar (K_max, d)`` the domain sample means."""

    estimates: Any
    n_domains: Any
    converged: Any
    n_iter: Any
    included: Any
    means: Any
    xbar: Any


class _SubDraws(NamedTuple):
    """Subsampling randomness for one K step, drawn for all steps at once before the scan
    (one vectorised draw is much cheaper on CPU than a split-and-draw inside every step)."""

    priority: Any  # (K_max,) uniform; the m valid domains with the smallest values are chosen
    idx: Any  # (K_max, n_sub) sample indices, with replacement (materialised path)
    q: Any  # (K_max,) sum of squared multiplicities of idx (sufficient-statistics path)
    z: Any  # (K_max, d) standard normals (sufficient-statistics path)
    # Entries of domains >= K are never read: drawn as 0 (see :func:`_sub_draws`).


@functools.lru_cache(maxsize=32)
def collision_law(n: int, draws: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact law of ``q = sum_i c_i^2`` for ``c ~ Multinomial(draws, (1/n, ..., 1/n))`` -- the
    sum of squared multiplicities when ``draws`` indices are taken with replacement from ``n``.

    Returns ``(values, probabilities)``. A sequence of draws that occupies ``l`` distinct samples
    with counts ``j_1..j_l`` (ordered) has ``n!/(n-l)!/l! * draws! * prod 1/j_i!`` index sequences
    out of ``n^draws``; a dynamic programme over ordered parts ``(balls used, q, parts)`` sums
    ``prod 1/j_i!`` in O(draws^5). Lets the sufficient-statistics path draw ``q`` with one uniform
    instead of ``draws`` random indices per domain (checked against exhaustive enumeration in the
    tests).
    """
    from math import lgamma, log

    qmax = draws * draws
    # D[b, q, l] = sum over ordered parts (j_1..j_l), sum j = b, sum j^2 = q, of prod 1/j!
    D = np.zeros((draws + 1, qmax + 1, draws + 1))
    D[0, 0, 0] = 1.0
    inv_fact = np.array([np.exp(-lgamma(j + 1)) for j in range(draws + 1)])
    for b in range(draws):
        for l in range(b + 1):
            row = D[b, :, l]
            if not row.any():
                continue
            for j in range(1, draws - b + 1):
                D[b + j, j * j:, l + 1] += row[: qmax + 1 - j * j] * inv_fact[j]
    ls = np.arange(draws + 1)
    log_w = np.array([lgamma(n + 1) - lgamma(n - l + 1) - lgamma(l + 1) if l <= n else -np.inf
                      for l in ls]) + lgamma(draws + 1) - draws * log(n)
    prob = (D[draws] * np.exp(log_w)[None, :]).sum(axis=1)
    values = np.nonzero(prob > 0)[0]
    return values.astype(float), prob[values] / prob[values].sum()


def _sub_draws(key, spec: Spec, dtype, prefix: bool = True) -> _SubDraws:
    """Subsampling's random numbers for every K step: a :class:`_SubDraws` with fields
    ``(nK, K_max, ...)``, or with ``prefix`` (the default) only the entries that are read.

    Step k reads only its first ``Ks[k]`` domains, so with ``prefix`` only those entries are drawn
    (:func:`poolsim._rng.prefix_draw`: fields ``(sum(Ks), ...)``, the same values; 455 of 780 per
    array at K = 5..30) and :func:`_full_sub` puts them in place (0 elsewhere) in the program that
    reads them; ``prefix=False`` draws every entry (the tests' oracle: same results). ``z`` is
    drawn on the sufficient-statistics path only (the materialised path resamples actual points:
    ``idx``)."""
    kp, ki, kz = jax.random.split(key, 3)
    shape = (len(spec.Ks), spec.K_max)
    lead = (sum(spec.Ks),) if prefix else shape

    def rows(draw, k, inner=()):
        if prefix:
            return _rng.prefix_draw(draw, k, spec.Ks, spec.K_max, inner)
        return draw(k, shape + inner)

    if spec.materialize:
        idx = rows(functools.partial(jax.random.randint, minval=0, maxval=spec.n), ki,
                   (spec.n_sub,))
        q = jnp.zeros(lead, dtype)
        z = jnp.zeros(lead + (0,), dtype)
    else:  # only q matters: one uniform through the exact inverse CDF
        values, prob = collision_law(spec.n, spec.n_sub)
        cdf = jnp.asarray(np.cumsum(prob)[:-1], dtype)

        def draw_q(k, shp):  # compare_all: same index, no loop of gathers
            u = jax.random.uniform(k, shp, dtype)
            return jnp.asarray(values, dtype)[jnp.searchsorted(cdf, u, method="compare_all")]

        q = rows(draw_q, ki)
        idx = jnp.zeros(lead + (0,), jnp.int32)
        z = rows(functools.partial(jax.random.normal, dtype=dtype), kz, (spec.d,))
    # priority: every entry (the pairwise ranks read each value K_max times: measured cheaper
    # drawn in place than put in place)
    return _SubDraws(jax.random.uniform(kp, shape, dtype), idx, q, z)


def _full_sub(r: _SubDraws, spec: Spec, axis: int = 0) -> _SubDraws:
    """:func:`_sub_draws`'s fields in the ``(nK, K_max, ...)`` layout at ``axis`` (``axis=1``
    with a leading seed axis); drawn in that layout already (``prefix=False``): unchanged."""
    if r.q.ndim == axis + 2:
        return r
    return r._replace(**{f: _rng.expand_prefix(getattr(r, f), spec.Ks, spec.K_max, axis)
                         for f in ("idx", "q", "z")})


def _subsample_mean(r: _SubDraws, xbar, samples, mask, K, spec: Spec, dtype):
    """Def. 2 on the first K domains: m = ceil(m_frac K) distinct domains uniformly (the m valid
    ones of smallest random priority; ranks by pairwise comparison, cheaper than a sort at this
    size), then n_sub indices with replacement inside each. Returns ``(estimate (d,), m)``."""
    n, n_sub = spec.n, spec.n_sub
    m = jnp.clip(jnp.ceil(spec.m_frac * K).astype(jnp.int32), 1, K)
    p = jnp.where(mask > 0, r.priority, 2.0)  # invalid domains rank last
    rank = jnp.sum(p[None, :] < p[:, None], axis=1)
    chosen = ((rank < m) & (mask > 0)).astype(dtype)
    if samples is not None:
        dom = jnp.take_along_axis(samples, r.idx[:, :, None], axis=1).mean(axis=1)
    else:
        spread = spec.sigma * jnp.sqrt(jnp.maximum(r.q / n_sub**2 - 1.0 / n, 0.0))
        dom = xbar + spread[:, None] * r.z
    est = jnp.sum(chosen[:, None] * dom, axis=0) / jnp.sum(chosen)
    return est, m


def draw(spec: Spec, dtype, key):
    """One seed's data: ``(means (K_max, d), samples (K_max, n, d) or None, xbar (K_max, d),
    key for subsampling)``. Also used by the tests to hand the engine's draws to the reference."""
    k_means, k_noise, k_sub = jax.random.split(key, 3)
    means = spec.sample_means(k_means).astype(dtype)
    noise = jax.random.normal(k_noise, (spec.K_max, spec.n, spec.d) if spec.materialize
                              else (spec.K_max, spec.d), dtype)
    if spec.materialize:
        samples = means[:, None, :] + spec.sigma * noise
        return means, samples, samples.mean(axis=1), k_sub
    return means, None, means + spec.sigma / math.sqrt(spec.n) * noise, k_sub


def prefix_medians(x, group, Ks):
    """Coordinate-wise medians of the rows of ``x: (R, d)`` with ``group < K``, for each K in
    ``Ks: (nK,)`` -> ``(nK, d)``; NumPy's convention (mean of the two middle values).

    Same result as ``_core.weighted_median(x, group < K)`` for every K, but one sort serves all
    prefixes: after sorting a column, the j-th smallest valid row is where the running count of
    valid rows first exceeds j. O(R log R + nK R) instead of O(nK R log R). Pure XLA: used on
    accelerators (fast sort) and for small R; the CPU engine uses :func:`host_prefix_medians`.
    """
    order = jnp.argsort(x, axis=0)  # (R, d)
    srt = jnp.take_along_axis(x, order, axis=0)
    g = group[order]  # (R, d) group of each sorted entry
    valid = g[None, :, :] < Ks[:, None, None]  # (nK, R, d)
    run = jnp.cumsum(valid, axis=1)
    count = run[:, -1:, :]  # (nK, 1, d)
    lo = jnp.argmax(run > (count - 1) // 2, axis=1)  # first index where > (count-1)//2 valid seen
    hi = jnp.argmax(run > count // 2, axis=1)
    pick = lambda i: jnp.take_along_axis(srt, i, axis=0)  # noqa: E731  (nK, d)
    return 0.5 * (pick(lo) + pick(hi))


def few_prefix_medians(x, Ks):
    """:func:`prefix_medians` of ``x: (S, R, d)`` with row r in group r (the prefix K is the
    first K rows), for ``R <= 32`` -> ``(S, nK, d)``: the same order statistics, picked by rank
    instead of a sort. Why hand-written: XLA's CPU sort of the 30 domain means per seed and
    coordinate (a comparator call per comparison, then the ``(nK, R)`` running counts) cost ~30%
    of the sufficient-statistics path; this costs ~1/7 of it (measured, 2,048 seeds).

    Rows are totally ordered by (value, row) -- the order of a stable sort. Row i's bitmask
    ``b_i = sum_j [row j precedes row i] 2^j`` (R^2 comparisons) gives its rank inside prefix K
    as ``popcount(b_i & (2^K - 1))``; the r-th smallest of the prefix is the row i < K of rank r.
    """
    R = x.shape[1]
    if R > 32:
        raise ValueError(f"few_prefix_medians: at most 32 rows, got R={R}")
    xt = jnp.swapaxes(x, 1, 2)  # (S, d, R)
    a, b = xt[..., :, None], xt[..., None, :]  # row i, row j
    i = jnp.arange(R)
    before = (b < a) | ((b == a) & (i[None, :] < i[:, None]))  # (S, d, i, j)
    one = jnp.uint32(1)
    bits = jnp.sum(jnp.where(before, jnp.left_shift(one, i.astype(jnp.uint32)), jnp.uint32(0)),
                   axis=-1, dtype=jnp.uint32)  # (S, d, R)
    Ks = jnp.asarray(Ks, jnp.int32)
    prefix = jnp.where(Ks >= 32, jnp.uint32(0xFFFFFFFF),
                       jnp.left_shift(one, jnp.minimum(Ks, 31).astype(jnp.uint32)) - one)  # (nK,)
    rank = jax.lax.population_count(bits[..., None, :] & prefix[:, None]).astype(jnp.int32)
    inside = i[None, :] < Ks[:, None]  # (nK, R)

    def pick(r):  # (nK,) rank -> (S, d, nK) the row of that rank in each prefix
        hit = inside & (rank == r[:, None])  # (S, d, nK, R), one row per (S, d, nK)
        return jnp.max(jnp.where(hit, xt[..., None, :], -jnp.inf), axis=-1)

    return jnp.swapaxes(0.5 * (pick((Ks - 1) // 2) + pick(Ks // 2)), 1, 2)


def _sortable_u32(bits):
    """Order-preserving map of float32 bit patterns (uint32) to uint32: negative floats have
    all bits flipped, non-negative ones the sign bit set (so -0.0 sorts just below +0.0; both
    compare equal as floats and give the same median). Its inverse is :func:`_float_from_key`."""
    return np.where(bits >= np.uint32(0x80000000), ~bits, bits | np.uint32(0x80000000))


def _float_from_key(k):
    return np.where(k >= np.uint32(0x80000000), k ^ np.uint32(0x80000000), ~k).view(np.float32)


def _medians_of_columns(cols, n: int, Ks, block: int):
    """Prefix medians ``(M, nK)`` of the rows of ``cols: (M, R)`` (see
    :func:`host_prefix_medians`). float32: each value and its group are packed into one uint64
    key (order-preserving value bits above the group bits) and sorted with ``np.sort`` -- one
    SIMD sort instead of an ``argsort`` plus two gathers (values, groups); other dtypes:
    ``argsort``."""
    M, R = cols.shape
    G = -(-R // n)  # groups; G itself marks padding, which no prefix contains
    nb = -(-R // block)
    g = np.full((M, nb * block), G, dtype=np.int32)
    if cols.dtype == np.float32:
        shift = np.uint64(int(G).bit_length())
        key = _sortable_u32(cols.view(np.uint32)).astype(np.uint64) << shift
        key |= (np.arange(R, dtype=np.uint64) // np.uint64(n))
        key.sort(axis=-1)
        g[:, :R] = key & np.uint64((1 << int(shift)) - 1)

        def value(pos):
            return _float_from_key((np.take_along_axis(key, pos, axis=1) >> shift).astype(np.uint32))
    else:
        order = np.argsort(cols, axis=-1)
        srt = np.take_along_axis(cols, order, axis=-1)
        np.floor_divide(order, n, out=g[:, :R])

        def value(pos):
            return np.take_along_axis(srt, pos, axis=1)
    gb = g.reshape(M, nb, block)
    offset = (np.arange(M * nb, dtype=np.int64) * (G + 1)).reshape(M, nb, 1)
    hist = np.bincount((gb + offset).ravel(), minlength=M * nb * (G + 1)).reshape(M, nb, G + 1)
    below = np.cumsum(hist, axis=2, dtype=np.int32)[:, :, Ks - 1]  # (M, nb, nK) rows of group < K
    upto = np.cumsum(below, axis=1, dtype=np.int32)  # valid rows in blocks 0..b
    count = np.minimum(Ks * n, R)  # valid rows per prefix

    def pick(j):  # j: (nK,) 0-based rank among the valid rows -> (M, nK) values
        b = np.sum(upto <= j, axis=1)  # (M, nK) block holding rank j
        before = np.where(b > 0, np.take_along_axis(upto, np.maximum(b - 1, 0)[:, None, :],
                                                    axis=1)[:, 0, :], 0)
        inside = np.take_along_axis(gb, b[:, :, None], axis=1) < Ks[:, None]  # (M, nK, block)
        rank = np.cumsum(inside, axis=2, dtype=np.int32)
        pos = b * block + np.sum(rank <= (j - before)[:, :, None], axis=2)
        return value(pos)

    return 0.5 * (pick((count - 1) // 2) + pick(count // 2))


def host_prefix_medians(x: np.ndarray, n: int, Ks, block: int = 64, batch: int = 256,
                        threads: int = 2) -> np.ndarray:
    """NumPy twin of :func:`prefix_medians` for rows grouped in consecutive runs of ``n``
    (row r belongs to group ``r // n``, so ``group < K`` is the first ``K n`` rows).

    ``x: (..., R, d)`` -> ``(..., nK, d)``, exactly the order statistics :func:`prefix_medians`
    picks. Why hand-written and on the host: XLA's CPU sort calls a generated comparator per
    comparison and was ~10x slower than NumPy's SIMD sort here, and the ``(nK, R)`` running
    count (a log-depth scan in XLA) cost more than the sort. Instead: one NumPy sort per column
    (float32: of packed value-and-group keys, :func:`_medians_of_columns`), then block counts --
    ``np.bincount`` of (block, group) gives how many rows of each group lie in each block of
    ``block`` sorted positions, so the block holding the j-th valid row is found from
    ``R / block`` partial sums and only that block is scanned. O(R log R) for the sort plus
    O(R + nK (R / block + block)) per column, instead of O(nK R). Columns go in batches of
    ``batch`` (the working arrays stay in cache: ~2x faster than all at once, measured) spread
    over ``threads`` threads (NumPy's sort releases the GIL; the CPU engine's XLA threads are
    idle while this callback runs).
    """
    x = np.asarray(x)
    Ks = np.asarray(Ks, dtype=np.int64)
    *lead, R, d = x.shape
    cols = np.ascontiguousarray(np.moveaxis(x, -1, -2).reshape(-1, R))  # (M, R)
    out = np.empty((cols.shape[0], len(Ks)), x.dtype)

    def run(start):
        out[start:start + batch] = _medians_of_columns(cols[start:start + batch], n, Ks, block)

    starts = range(0, cols.shape[0], batch)
    if threads > 1 and len(starts) > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(run, starts))
    else:
        for start in starts:
            run(start)
    return np.moveaxis(out.reshape(*lead, d, len(Ks)), -1, -2)


def _chunk_medians(samples: np.ndarray, k: int, spec: Spec) -> np.ndarray:
    """:func:`host_prefix_medians` of a chunk's ``samples: (chunk, K_max, n, d)`` whose first
    ``k`` rows are its own seeds and the rest padding: copies of row ``k - 1``'s seed
    (:func:`_simulate_local` pads with the last seed), whose medians are therefore row
    ``k - 1``'s. Computed for the ``k`` rows only (each row's medians depend on that row alone)
    -> ``(chunk, nK, d)``, the same array as for every row."""
    chunk = samples.shape[0]
    med = host_prefix_medians(samples[:k].reshape(k, -1, spec.d), spec.n, spec.Ks)
    if k == chunk:
        return med
    return np.concatenate([med, np.broadcast_to(med[-1:], (chunk - k,) + med.shape[1:])])


def _grouped_medians(pts, n: int, Ks: tuple, host: bool = True):
    """Prefix medians ``(nK, d)`` of one seed's ``pts: (G n, d)`` in groups of ``n`` consecutive
    rows (the samples of a domain): on a CPU backend with ``host`` through
    :func:`host_prefix_medians` (a ``pure_callback``, batched over the seeds by ``vmap``),
    elsewhere with the pure-XLA :func:`prefix_medians`. Both pick the same order statistics.
    ``host=False`` on several CPU devices: each device's program would call back into Python at
    once, and those concurrent callbacks hang the CPU runtime (seen with 4 forced host devices
    on 2 cores)."""
    if not host or jax.default_backend() != "cpu":
        return prefix_medians(pts, jnp.arange(pts.shape[0]) // n, jnp.asarray(Ks, jnp.int32))
    out = jax.ShapeDtypeStruct((len(Ks), pts.shape[1]), pts.dtype)
    return jax.pure_callback(functools.partial(host_prefix_medians, n=n, Ks=Ks),
                             out, pts, vmap_method="expand_dims")


def _one_seed(spec: Spec, dtype, key, host_medians: bool = True) -> SeedResult:
    """One seed: draws, the matching starts for every K, then a ``lax.scan`` over the K values
    (pooling, subsampling and matching on the first K domains). Vectorising the K axis instead
    (one vmapped ``while_loop`` for all K) was measured slower on CPU: the loop then runs over
    26x bigger arrays, max(n_iter) times, and XLA's code for them vectorised worse."""
    means, samples, xbar, k_sub = draw(spec, dtype, key)
    mu_star = jnp.asarray(spec.mu_star, dtype)
    Ks = jnp.asarray(spec.Ks, jnp.int32)
    if spec.init == "median":
        medians = _grouped_medians(samples.reshape(-1, spec.d), spec.n, spec.Ks,
                                   host_medians) \
            if samples is not None else prefix_medians(xbar, jnp.arange(spec.K_max), Ks)
        # (K_max domain means: XLA's sort of ~30 rows beats a host round trip -- measured)
    else:
        medians = jnp.zeros((len(spec.Ks), spec.d), dtype)
    n = jnp.asarray(spec.n, dtype)
    sub = _full_sub(_sub_draws(k_sub, spec, dtype), spec)

    def step(_, inp):
        K, r, median = inp
        mask = (jnp.arange(spec.K_max) < K).astype(dtype)
        pool = jnp.sum(mask[:, None] * xbar, axis=0) / jnp.sum(mask)
        sub_est, m = _subsample_mean(r, xbar, samples, mask, K, spec, dtype)
        if spec.init == "median":
            c0 = median
        elif spec.init == "mean":
            c0 = pool
        else:
            c0 = mu_star
        c, inc, it, conv, _ = _core.iterate_match(xbar, mask * n, c0, spec.tau, spec.metric,
                                                  tol=spec.tol, max_iter=spec.max_iter)
        est = jnp.stack([pool, sub_est, c])
        used = jnp.stack([K, m, jnp.sum(inc).astype(jnp.int32)])
        return None, (est, used, conv, it, inc)

    _, (est, used, conv, it, inc) = jax.lax.scan(step, None, (Ks, sub, medians))
    return SeedResult(est, used, conv, it, inc > 0, means, xbar)


# Matching stages (see :func:`_batched_match`): ``(trips, divisor)`` -- after ``trips`` more loop
# trips the seeds still iterating are compacted into a batch of ``chunk // divisor`` rows.
# Measured on the paper's domain_addition (2,048 seeds, 26 K values; an iteration count includes
# the final, converging one): every seed needs >= 2 iterations per K, the mean seed 2.6; after
# 3 trips at most 22% of the seeds still iterate (mean 11%), after 5 at most 1.6%, and the
# slowest need 4-9, so most trips of a whole-chunk loop only froze converged seeds.
_STAGES = ((3, 4), (2, 8))


def _batched_match(x, mass, c0, spec: Spec, stages: tuple | None = None):
    """:func:`_core.iterate_match` for a batch of seeds at once, the same iteration seed by seed.

    ``x: (S, K_max, d)`` domain means, ``mass: (K_max,)`` (shared: the prefix mask times n),
    ``c0: (S, d)``. Returns ``(c (S, d), included (S, K_max), n_iter (S,), converged (S,))``.

    Batched ``lax.while_loop`` trips; a finished seed's state is frozen by a select (exactly what
    ``vmap`` of the per-seed ``while_loop`` does), and the arrays are laid out ``(S, d, K_max)``
    so that both reductions of an iteration -- the distance over d for the L2 gate and the
    weighted sum over the domains -- run over a contiguous axis: measured ~2x faster than the
    vmapped loop (whose ``(S, K_max, d)`` sum over domains strides by d) and ~8x faster than a
    seed-minor ``(d, K_max, S)`` layout on XLA's CPU backend.

    Stages, so that converged seeds stop costing work (``stages``: pairs ``(trips, divisor)``;
    default ``_STAGES`` on a CPU backend, none on accelerators, where the seeds of a trip run in
    parallel anyway and each ``lax.cond`` would read its predicate back to the host): after
    ``trips`` batched trips, if at most ``S // divisor`` seeds are still iterating, their rows are
    gathered into a batch of that many rows (padding rows marked done), the next stage runs on it
    and the rows are scattered back; otherwise (``lax.cond``) the current batch iterates to the
    end. After the last stage the loop runs to the end. Same
    operations and reduction axes per seed in every stage, so the same numbers (tested against
    the per-seed loop, including the all-converged-early and the fallback cases).
    """
    S = x.shape[0]
    if stages is None:
        stages = _STAGES if jax.default_backend() == "cpu" else ()
    xt = jnp.swapaxes(x, 1, 2)  # (S, d, K_max)
    valid = (mass > 0).astype(x.dtype)

    def running(state):
        t, _, _, _, done, _ = state
        return ~done & (t < spec.max_iter)

    def body(xt, state):
        n = xt.shape[0]
        t, c, _, _, _, _ = state
        active = running(state)
        if spec.metric == "l2":
            dist = _core.safe_norm(xt - c[:, :, None], axis=1)  # (n, K_max)
        else:
            dist = _core.distance(jnp.swapaxes(xt, 1, 2), c[:, None, :], spec.metric)
        inc_n = _core.gate(dist, spec.tau) * valid
        w = inc_n * mass
        total_n = jnp.sum(w, axis=1)
        has = total_n > 0
        mean = jnp.sum(w[:, None, :] * xt, axis=2) / jnp.where(has, total_n, 1.0)[:, None]
        c_next = jnp.where(has[:, None], mean, c)
        empty = total_n <= 0
        moved = _core.safe_norm(c_next - c) < spec.tol
        new = (t + 1, jnp.where(empty[:, None], c, c_next), inc_n, total_n, empty | moved,
               moved & ~empty)
        return tuple(jnp.where(active.reshape((n,) + (1,) * (a.ndim - 1)), a, b)
                     for a, b in zip(new, state))

    def loop(xt, state, trips=None):
        """Trips of ``body`` while any seed runs (and at most ``trips`` of them)."""
        if trips is None:
            return jax.lax.while_loop(lambda s: jnp.any(running(s)), functools.partial(body, xt),
                                      state)
        _, state = jax.lax.while_loop(
            lambda a: (a[0] < trips) & jnp.any(running(a[1])),
            lambda a: (a[0] + 1, body(xt, a[1])), (jnp.int32(0), state))
        return state

    def staged(xt, state, stages):
        if not stages:
            return loop(xt, state)
        (trips, divisor), rest = stages[0], stages[1:]
        state = loop(xt, state, trips)
        size = max(1, S // divisor)
        if size >= xt.shape[0]:
            return staged(xt, state, rest)

        def compacted(state):
            idx = jnp.nonzero(running(state), size=size, fill_value=xt.shape[0])[0]
            take = lambda a: jnp.take(a, idx, axis=0, mode="clip")  # noqa: E731
            sub = tuple(take(a) for a in state)
            sub = sub[:4] + (sub[4] | (idx >= xt.shape[0]),) + sub[5:]  # padding: done
            sub = staged(take(xt), sub, rest)
            return tuple(a.at[idx].set(b, mode="drop") for a, b in zip(state, sub))

        return jax.lax.cond(jnp.sum(running(state)) <= size, compacted,
                            functools.partial(loop, xt), state)

    state = (jnp.zeros(S, jnp.int32), c0, jnp.zeros(x.shape[:2], x.dtype),
             jnp.zeros(S, x.dtype), jnp.zeros(S, bool), jnp.zeros(S, bool))
    state = staged(xt, state, tuple(stages))
    t, c, inc, _, _, conv = state
    return c, inc, t, conv


class _Draws(NamedTuple):
    """Every random number of a batch of seeds (leading axis S): the output of the engine's first
    program, :func:`_draw_batch`."""

    means: Any  # (S, K_max, d)
    samples: Any  # (S, K_max, n, d) or None (sufficient statistics)
    xbar: Any  # (S, K_max, d)
    sub: Any  # _SubDraws with fields (S, sum(Ks), ...) (see :func:`_sub_draws`)


def _draw_batch(spec: Spec, dtype, seeds, prefix: bool = True) -> _Draws:
    """First program of the engine: all draws of seeds ``seeds: (S,) uint32`` (seed s uses
    :func:`poolsim._rng.fast_key`, i.e. ``jax.random.key(s)``'s numbers; vmap of :func:`draw` and
    :func:`_sub_draws`, the same numbers as in :func:`_one_seed`). A separate program on purpose:
    inside one program XLA fuses the Threefry hash and the inverse normal CDF into consumers that
    read each value many times (once per K, or K_max times in the subsampling ranks) and
    recomputes it there -- ``optimization_barrier`` does not stop this on the CPU backend; the
    program boundary does (measured 4-10x on the subsampling step). ``prefix``: see
    :func:`_sub_draws`."""
    keys = jax.vmap(_rng.fast_key)(seeds)
    means, samples, xbar, k_sub = jax.vmap(functools.partial(draw, spec, dtype))(keys)
    return _Draws(means, samples, xbar,
                  jax.vmap(lambda k: _sub_draws(k, spec, dtype, prefix))(k_sub))


def _batch(spec: Spec, dtype, draws: _Draws, medians=None) -> SeedResult:
    """Second program: the estimates for a batch of seeds from their :func:`_draw_batch` draws,
    seed axis leading: the same results as ``vmap`` of :func:`_one_seed` (tested), organised for
    speed. ``medians (S, nK, d)``: the paper's sample-median starts, computed on the host between
    the two programs (:func:`host_medians_outside`), or ``None`` (computed here: XLA's
    :func:`prefix_medians`, or the domain means' medians on the sufficient path). Pooling and
    subsampling -- no loops, nothing carried between K values -- are evaluated for all K at once
    (``vmap`` over K, measured 3.5x cheaper than inside the scan); only matching runs in a
    ``lax.scan`` over the K values, as one batched loop per K (:func:`_batched_match`) instead of
    a vmapped ``while_loop``."""
    means, samples, xbar, sub = draws
    # The subsampling draws put in place once, here, not inside every reader (measured: fused
    # into the readers the gathers cost ~15% of this program).
    sub = jax.lax.optimization_barrier(_full_sub(sub, spec, axis=1))
    S = xbar.shape[0]
    Ks = jnp.asarray(spec.Ks, jnp.int32)
    masks = (jnp.arange(spec.K_max)[None, :] < Ks[:, None]).astype(dtype)  # (nK, K_max)
    pool = jax.vmap(lambda mask: jnp.sum(mask[None, :, None] * xbar, axis=1) / jnp.sum(mask))(
        masks)  # (nK, S, d)
    per_k = jax.vmap(lambda r, xb, smp, mask, K: _subsample_mean(r, xb, smp, mask, K, spec, dtype),
                     in_axes=(0, None, None, 0, 0))
    sub_est, m = jax.vmap(per_k, in_axes=(0, 0, 0 if samples is not None else None, None, None))(
        sub, xbar, samples, masks, Ks)  # (S, nK, d), (S, nK)
    if spec.init == "median":
        if medians is not None:
            c0 = medians
        elif samples is not None:
            c0 = jax.vmap(lambda p: _grouped_medians(p, spec.n, spec.Ks, host=False))(
                samples.reshape(S, -1, spec.d))
        else:
            c0 = few_prefix_medians(xbar, spec.Ks) if spec.K_max <= 32 else \
                jax.vmap(lambda p: prefix_medians(p, jnp.arange(spec.K_max), Ks))(xbar)
        c0 = jnp.swapaxes(c0, 0, 1)  # (nK, S, d)
    elif spec.init == "mean":
        c0 = pool
    else:
        c0 = jnp.broadcast_to(jnp.asarray(spec.mu_star, dtype), pool.shape)
    n = jnp.asarray(spec.n, dtype)

    def step(_, inp):
        mask, start = inp
        c, inc, it, conv = _batched_match(xbar, mask * n, start, spec)
        return None, (c, conv, it, inc)

    _, (c, conv, it, inc) = jax.lax.scan(step, None, (masks, c0))
    pool, c, conv, it, inc = (jnp.swapaxes(a, 0, 1) for a in (pool, c, conv, it, inc))
    est = jnp.stack([pool, sub_est, c], axis=2)
    used = jnp.stack([jnp.broadcast_to(Ks, (S, len(spec.Ks))), m,
                      jnp.sum(inc, axis=2).astype(jnp.int32)], axis=2)
    return SeedResult(est, used, conv, it, inc > 0, means, xbar)


# The paired per-seed differences of eps that the summary reports (first minus second): the
# comparisons the figures' verdicts make at a given K (:func:`poolsim.decide_claim` on them).
PAIRS = (("pool", "match"), ("subsample", "match"), ("subsample", "pool"))
QUANTITIES = STRATEGIES + tuple(f"{a} - {b}" for a, b in PAIRS)


class Moments(NamedTuple):
    """Per-seed sums behind a summary, over the valid seeds of one device's batch (leading axis:
    one row per batch): ``n (B,)`` seeds, ``mean (B, nK, Q)`` and ``m2 (B, nK, Q)`` (sum of
    squared deviations from ``mean``) of the Q = ``len(QUANTITIES)`` per-seed quantities: eps of
    pool, subsample, match, then the differences ``PAIRS``."""

    n: Any
    mean: Any
    m2: Any


class Summary(NamedTuple):
    """Per K and quantity (:data:`QUANTITIES`): ``n_seeds`` (int), ``mean (nK, Q)`` and
    ``var (nK, Q)`` (``ddof=1``; NaN for one seed) over the seeds, in float64."""

    n_seeds: int
    mean: np.ndarray
    var: np.ndarray


def _moments(spec: Spec, res: SeedResult, valid) -> Moments:
    """Third program (``summary=True``): :class:`Moments` of one batch's results, ``valid (S,)``
    masking the padding seeds. eps is computed as :func:`poolsim.experiments.frame` does (the norm
    of estimate minus mu_*), in float64 when x64 is enabled, else in float32; two passes (mean,
    then squared deviations) inside the batch."""
    acc = jax.dtypes.canonicalize_dtype(jnp.float64)
    est = res.estimates.astype(acc)
    eps = jnp.sqrt(jnp.sum((est - jnp.asarray(spec.mu_star, acc)) ** 2, axis=-1))  # (S, nK, 3)
    j = {s: i for i, s in enumerate(STRATEGIES)}
    vals = jnp.concatenate([eps] + [eps[..., j[a], None] - eps[..., j[b], None] for a, b in PAIRS],
                           axis=-1)  # (S, nK, Q)
    w = valid[:, None, None]
    n = jnp.sum(valid, dtype=jnp.int32)
    mean = jnp.sum(jnp.where(w, vals, 0), axis=0) / jnp.maximum(n, 1).astype(acc)
    m2 = jnp.sum(jnp.where(w, (vals - mean) ** 2, 0), axis=0)
    return Moments(n[None], mean[None], m2[None])


def combine(m: Moments) -> Summary:
    """Merge :class:`Moments` rows (NumPy, float64) into one :class:`Summary`: the pooled mean and
    ``M2 = sum_b (m2_b + n_b (mean_b - mean)^2)`` (Chan, Golub & LeVeque's pairwise update, exact
    in exact arithmetic)."""
    n = np.asarray(m.n, np.int64)
    mean_b, m2_b = np.asarray(m.mean, np.float64), np.asarray(m.m2, np.float64)
    keep = n > 0
    n, mean_b, m2_b = n[keep], mean_b[keep], m2_b[keep]
    total = int(n.sum())
    if total == 0:
        raise ValueError("combine: no seeds in the moments")
    w = n[:, None, None].astype(np.float64)
    mean = np.sum(w * mean_b, axis=0) / total
    m2 = np.sum(m2_b + w * (mean_b - mean) ** 2, axis=0)
    var = m2 / (total - 1) if total > 1 else np.full_like(m2, np.nan)
    return Summary(total, mean, var)


def _mesh(ndev: int):
    return jax.sharding.Mesh(np.array(jax.local_devices()[:ndev]), ("seeds",))


def host_medians_outside(spec: Spec, ndev: int = 1) -> bool:
    """Whether the paper's sample medians (materialised samples, ``init="median"``) are computed
    on the host between the engine's two programs (one CPU device) rather than inside the second
    (XLA's :func:`prefix_medians`, accelerators and several devices). On the host they take
    :func:`host_prefix_medians` (NumPy's sort, ~10x XLA's CPU sort); between the programs rather
    than as a callback inside, because JAX's persistent compilation cache does not store programs
    that call back into Python."""
    return spec.materialize and spec.init == "median" and ndev == 1 and \
        jax.default_backend() == "cpu"


def _compiled(spec: Spec, dtype_name: str, ndev: int = 1) -> tuple[Callable, Callable]:
    """The engine's two programs per (spec, dtype, devices), :func:`_draw_batch` and
    :func:`_batch` (``est(draw(seeds))``, or ``est(draws, medians)`` where
    :func:`host_medians_outside`): the compile-count test checks each traces once. Each is a
    :class:`poolsim._programs.Program` around the ``jax.jit`` of the function: on one device, for
    a spec with a storable sampler (:func:`store_ident`), its compiled executables are kept in
    the per-user program store, so another process loads them instead of tracing and compiling.

    On ``ndev > 1`` local devices each program is a ``shard_map`` over the seed axis: every device
    runs the whole computation on its own block of seeds (its own matching loops, its own trip
    counts), so the programs contain no cross-device collective -- seeds are independent. The
    materialised path's sample medians then use the pure-XLA :func:`prefix_medians` (see
    :func:`_grouped_medians`)."""
    return _compiled_cached(spec, dtype_name, ndev)


@functools.lru_cache(maxsize=64)
def _compiled_cached(spec: Spec, dtype_name: str, ndev: int) -> tuple[Callable, Callable]:
    dtype = jnp.dtype(dtype_name)
    fns = (functools.partial(_draw_batch, spec, dtype), functools.partial(_batch, spec, dtype))
    ident = store_ident(spec, dtype_name, ndev)
    return tuple(_programs.Program(jax.jit(_per_device(f, ndev)), name, ident)
                 for f, name in zip(fns, ("draws", "estimates")))


def store_ident(spec: Spec, dtype_name: str | None, ndev: int) -> str | None:
    """What decides the engine's programs for ``spec`` apart from the argument shapes and the
    environment (:mod:`poolsim._programs`): the spec with its sampler's ``store_key``, the dtype
    and the device count. ``None`` (the programs are not stored across processes) when the sampler
    has no ``store_key`` string -- nothing then says two processes' samplers trace alike -- or
    on several devices."""
    key = getattr(spec.sample_means, "store_key", None)
    if not isinstance(key, str) or ndev != 1:
        return None
    return repr((tuple(spec._replace(sample_means=key)), dtype_name, ndev))


@functools.lru_cache(maxsize=8)
def _compiled_vmapped(spec: Spec, dtype_name: str, ndev: int = 1):
    """The plain ``vmap`` of :func:`_one_seed` (seeds in, as :func:`_draw_batch`): the batched
    engine's oracle in the tests."""
    one = functools.partial(_one_seed, spec, jnp.dtype(dtype_name), host_medians=ndev == 1)
    return jax.jit(_per_device(jax.vmap(lambda s: one(_rng.fast_key(s))), ndev))


@functools.lru_cache(maxsize=64)
def _compiled_moments(spec: Spec, ndev: int = 1):
    return _programs.Program(jax.jit(_per_device(functools.partial(_moments, spec), ndev)),
                             "moments", store_ident(spec, None, ndev))


def _per_device(f: Callable, ndev: int) -> Callable:
    """``f`` itself on one device; else ``f`` on each device's block of the leading (seed) axis of
    every argument and result (``shard_map``; nothing is communicated between devices)."""
    if ndev == 1:
        return f
    spec = jax.sharding.PartitionSpec("seeds")
    return jax.shard_map(f, mesh=_mesh(ndev), in_specs=spec, out_specs=spec, check_vma=False)


DISTRIBUTED_HELP = (
    "call jax.distributed.initialize(coordinator_address='HOST:PORT', num_processes=N, "
    "process_id=I) in every process before any other JAX call (HOST:PORT may instead come from "
    "the environment variable JAX_COORDINATOR_ADDRESS; on Slurm, Open MPI and TPU pods "
    "jax.distributed.initialize() detects all three); or use poolsim.experiments.init_distributed(), "
    "which checks them first")


def process_block(S: int) -> tuple[int, int]:
    """``(start, length)`` of this process's equal block of ``S`` seeds (the seed list padded to a
    multiple of ``jax.process_count()``), for :func:`simulate` with ``distributed=True``."""
    per = -(-S // jax.process_count())
    return jax.process_index() * per, per


# Batches dispatched ahead of the oldest unfinished one: the device queue never runs dry, and
# the draws of at most this many batches wait in memory (the CPU runtime would otherwise run
# every batch's independent draws program at once).
_AHEAD = 2


def _gather(outs: list, S: int, chunk: int, on_device: bool):
    """One pytree of NumPy arrays with leading axis ``S`` from the per-batch device results
    ``outs`` (each with leading axis ``chunk``; the last one padded; ``None`` leaves -- fields
    not asked for -- stay ``None``). Every transfer is started (``copy_to_host_async``) before
    the first is waited on. ``on_device``: the batches are concatenated on the device and each
    field crosses once; else each batch's arrays are copied into preallocated host arrays
    (several devices: a batch's array is spread over them; CPU: the copy is the host's own
    memory, and the result stays writeable)."""
    last = S - (len(outs) - 1) * chunk
    if on_device:
        outs = outs[:-1] + [jax.tree.map(lambda a: a[:last], outs[-1])] if last < chunk else outs
        whole = jax.tree.map(lambda *a: jnp.concatenate(a) if len(a) > 1 else a[0], *outs)
        leaves, tree = jax.tree.flatten(whole)
        for a in leaves:
            a.copy_to_host_async()
        return jax.tree.unflatten(tree, [np.asarray(a) for a in leaves])
    flat = [jax.tree.flatten(o) for o in outs]
    tree = flat[0][1]
    for leaves, _ in flat:
        for a in leaves:
            a.copy_to_host_async()
    host = [np.empty((S,) + a.shape[1:], a.dtype) for a in flat[0][0]]
    for i, (leaves, _) in enumerate(flat):
        k = min(chunk, S - i * chunk)
        for dst, a in zip(host, leaves):
            dst[i * chunk:i * chunk + k] = np.asarray(a)[:k]
    return jax.tree.unflatten(tree, host)


# Seed counts up to this run in one chunk of this many seeds; larger ones in chunks of ``chunk``.
# Two compiled shapes per experiment at most, whatever the seed counts (a test counts them).
SMALL_CHUNK = 64


def chunk_size(S: int, chunk: int, ndev: int = 1) -> int:
    """Seeds per program call for a run of ``S`` seeds: ``SMALL_CHUNK`` when ``S`` is at most
    that (and ``chunk`` is larger), else ``chunk``; rounded up to a multiple of the device count
    ``ndev``. Fixed shapes, the last chunk padded: a new seed count does not recompile."""
    if S <= SMALL_CHUNK < chunk:
        chunk = SMALL_CHUNK
    return -(-chunk // ndev) * ndev


def simulate(spec: Spec, seeds: np.ndarray, *, dtype: str = "float32", chunk: int = 1024,
             shard: bool = True, progress: Callable[[int], None] | None = None,
             distributed: bool = False, batched: bool = True,
             summary: bool = False, fields: tuple | None = None) -> SeedResult | Summary:
    """Run ``spec`` for every seed in ``seeds`` (int array). Seed s uses ``jax.random.key(s)``'s
    numbers (through :func:`poolsim._rng.fast_key`), so a seed's result does not depend on the
    other seeds, the sharding or the process, and -- up to float32 rounding, XLA fusing
    reductions differently for another batch shape -- not on the chunking either.
    ``batched=False`` runs the plain ``vmap`` of :func:`_one_seed` instead (same results, slower;
    the tests' oracle).

    Seeds are processed in chunks of :func:`chunk_size` seeds (``chunk``, or
    :data:`SMALL_CHUNK` for small runs; the last chunk padded, so one compiled program serves
    every seed count above ``SMALL_CHUNK``); with several local devices each chunk is split over
    them (chunk rounded up to a multiple of the device count), each device running its block
    alone (:func:`_compiled`). Chunks are dispatched without waiting for their results (at most
    ``_AHEAD`` unfinished ahead of the oldest); the results stay on the device until all are
    done and cross to the host once (:func:`_gather`).

    ``fields``: names of the :class:`SeedResult` fields to bring to the host (default: all);
    the others are ``None`` in the result (:func:`poolsim.experiments.run` asks only for what its
    frame reads).

    ``summary=True``: no per-seed results leave the device; each chunk is reduced there to the
    :class:`Moments` of eps per K and strategy and of the paired differences :data:`PAIRS`, and a
    :class:`Summary` of all seeds is returned (host memory independent of the seed count).

    ``distributed=True`` (every process of a ``jax.distributed`` job calls this with the same
    arguments): each process runs its own block of seeds (:func:`process_block`) and
    ``multihost_utils.process_allgather`` gathers the blocks (or the moments), so every process,
    process 0 included, returns all seeds in order. Returns a :class:`SeedResult` of NumPy arrays
    with leading axis ``len(seeds)`` (read-only where they come straight from an accelerator), or
    a :class:`Summary`.
    """
    seeds = np.asarray(seeds, dtype=np.int64)
    S = len(seeds)
    if fields is not None:
        fields = tuple(fields)
        unknown = [f for f in fields if f not in SeedResult._fields]
        if unknown:
            raise ValueError(f"fields must be names among {SeedResult._fields}, got {unknown}")
    if distributed:
        if not jax.distributed.is_initialized():
            raise RuntimeError(f"distributed=True but jax.distributed is not initialised: "
                               f"{DISTRIBUTED_HELP}")
        start, per = process_block(S)
        padded = np.concatenate([seeds, np.full(per * jax.process_count() - S, seeds[-1])])
        local = _simulate_local(spec, padded[start:start + per], max(0, min(per, S - start)),
                                dtype=dtype, chunk=chunk, shard=shard, progress=progress,
                                batched=batched, summary=summary, fields=fields)
        from jax.experimental import multihost_utils

        ctx = jax.enable_x64(True) if dtype == "float64" or summary else contextlib.nullcontext()
        with ctx:
            full = multihost_utils.process_allgather(local, tiled=True)
        if summary:
            return combine(Moments(*(np.asarray(a) for a in full)))
        return SeedResult(*(None if a is None else np.asarray(a)[:S] for a in full))
    out = _simulate_local(spec, seeds, S, dtype=dtype, chunk=chunk, shard=shard,
                          progress=progress, batched=batched, summary=summary, fields=fields)
    return combine(out) if summary else out


def _simulate_local(spec: Spec, seeds: np.ndarray, n_valid: int, *, dtype: str, chunk: int,
                    shard: bool, progress, batched: bool, summary: bool,
                    fields: tuple | None = None):
    """:func:`simulate` on this process's devices; the first ``n_valid`` seeds count (the rest
    pad a distributed block). Returns a :class:`SeedResult` or, with ``summary``, the
    :class:`Moments` (NumPy, one row per chunk and device; float64)."""
    _cache.enable_jax_cache()
    S = len(seeds)
    ndev = len(jax.local_devices()) if shard else 1
    chunk = chunk_size(S, chunk, ndev)
    n_chunks = -(-S // chunk)
    seeds = seeds.astype(np.uint32)
    seeds = np.concatenate([seeds, np.full(n_chunks * chunk - S, seeds[-1], np.uint32)])
    place = (jax.sharding.NamedSharding(_mesh(ndev), jax.sharding.PartitionSpec("seeds"))
             if ndev > 1 else None)
    ctx = jax.enable_x64(True) if dtype == "float64" else contextlib.nullcontext()
    outside = batched and host_medians_outside(spec, ndev)
    keep = None if fields is None or summary else set(fields)
    outs, waiting = [], []
    with ctx:
        fns = _compiled(spec, dtype, ndev) if batched else (_compiled_vmapped(spec, dtype, ndev),)
        moments = _compiled_moments(spec, ndev) if summary else None
        for i in range(n_chunks):
            out = jax.device_put(seeds[i * chunk:(i + 1) * chunk], place)
            if outside:
                draw_fn, est_fn = fns
                out = draw_fn(out)
                medians = _chunk_medians(np.asarray(out.samples), min(chunk, S - i * chunk), spec)
                out = est_fn(out, medians)
            else:
                for fn in fns:
                    out = fn(out)
            if summary:
                valid = np.arange(i * chunk, (i + 1) * chunk) < n_valid
                out = moments(out, jax.device_put(valid, place))
            elif keep is not None:
                out = out._replace(**{f: None for f in out._fields if f not in keep})
            outs.append(out)
            waiting.append((out, min(chunk, S - i * chunk)))
            if len(waiting) > _AHEAD:
                done, k = waiting.pop(0)
                jax.block_until_ready(done)
                if progress is not None:
                    progress(k)
        on_device = ndev == 1 and jax.default_backend() != "cpu"
        if summary:
            res = _gather(outs, n_chunks * ndev, ndev, on_device)
            res = Moments(*(np.asarray(a, np.float64) if a.dtype.kind == "f" else a for a in res))
        else:
            res = _gather(outs, S, chunk, on_device)
    if progress is not None:
        for _, k in waiting:
            progress(k)
    return res
