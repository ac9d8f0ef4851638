"""Prefix medians: the coordinate-wise median of the first K domains' points for every K at once."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from .select import kth_smallest
from .spec import Spec, accelerator_path

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


# :func:`domain_medians` selects per prefix (:func:`selected_prefix_medians`) where the prefixes' total
# length is at most this many times the width, and sorts once (:func:`prefix_medians`) otherwise.
# Measured (2-core CPU, 1,024 seeds, d = 2): Ks = (10, 1000): 0.05 s selecting vs 0.29 s sorting;
# Ks = (5, 10, ..., 50) (total 3.1 W): 0.010 vs 0.013 s. A selection costs 2 x 32 passes over its
# prefix, so many prefixes of one width (e.g. 200 prefixes of 1,000 domains) are cheaper sorted.
SELECT_WIDTHS = 4


def selected_prefix_medians(x, Ks):
    """:func:`prefix_medians` of ``x: (S, W, d)`` with row r in group r (prefix K = the first K
    rows), for each K in ``Ks`` (a tuple) -> ``(S, nK, d)``: the same two middle order statistics
    of each prefix, each found by :func:`poolsim._engine.select.kth_smallest` (no sort)."""
    out = []
    for K in Ks:
        cols = jnp.swapaxes(x[:, :K], 1, 2)[..., None, :]  # (S, d, 1, K)
        mid = kth_smallest(cols, jnp.array([(K - 1) // 2 + 1, K // 2 + 1]))  # (S, d, 2)
        out.append(0.5 * (mid[..., 0] + mid[..., 1]))
    return jnp.stack(out, axis=1)


def domain_medians(x, Ks):
    """Coordinate-wise medians of the first K rows of ``x: (S, W, d)`` (domain means) for each K in
    ``Ks`` (a tuple) -> ``(S, nK, d)``, by size: :func:`few_prefix_medians` up to 32 rows,
    :func:`selected_prefix_medians` while the prefixes total at most :data:`SELECT_WIDTHS` ``W``
    rows, else one sort per seed (:func:`prefix_medians`). The same values every way."""
    W = x.shape[1]
    if W <= 32:
        return few_prefix_medians(x, Ks)
    if sum(min(K, W) for K in Ks) <= SELECT_WIDTHS * W:
        return selected_prefix_medians(x, Ks)
    Kj = jnp.asarray(Ks, jnp.int32)
    return jax.vmap(lambda p: prefix_medians(p, jnp.arange(W), Kj))(x)

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
    # Rows counted per (block, bin), bin i = the rows of groups in [Ks[i-1], Ks[i]) (the last bin:
    # groups >= Ks[-1] and the padding): O(R + nK R / block), not a count per group (K_max R / block).
    nK = len(Ks)
    bins = np.searchsorted(Ks, np.arange(G + 1), side="right").astype(np.int64)[gb]
    offset = (np.arange(M * nb, dtype=np.int64) * (nK + 1)).reshape(M, nb, 1)
    hist = np.bincount((bins + offset).ravel(), minlength=M * nb * (nK + 1)).reshape(M, nb, nK + 1)
    below = np.cumsum(hist, axis=2, dtype=np.int32)[:, :, :nK]  # (M, nb, nK) rows of group < K
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


def selected_medians(cols: np.ndarray, n: int, Ks) -> np.ndarray:
    """Prefix medians of ``cols: (M, R)`` by one selection per prefix (``np.partition`` of the first
    ``min(K n, R)`` values at the lower middle rank; the upper one is the smallest value above it)
    -> ``(M, nK)``: the same order statistics, and the same ``0.5 (a + b)``, as
    :func:`_medians_of_columns`, in O(sum of the prefix lengths)."""
    R = cols.shape[1]
    out = np.empty((cols.shape[0], len(Ks)), cols.dtype)
    for i, K in enumerate(Ks):
        c = min(int(K) * n, R)
        lo, hi = (c - 1) // 2, c // 2
        # one selection (rank lo); the next order statistic is the smallest value after it
        # (measured 1.6x faster than partitioning at both ranks, 150,000 rows)
        part = np.partition(cols[:, :c], lo, axis=1)
        a = part[:, lo]
        out[:, i] = 0.5 * (a + (a if hi == lo else part[:, hi:].min(axis=1)))
    return out


# :func:`host_prefix_medians` selects per prefix (:func:`selected_medians`) where the prefixes' total
# length is at most this many times the column length, and sorts otherwise. Measured (2-core CPU,
# float32, one thread): 256 columns of 50,000 rows, Ks = (5, ..., 50), n = 1000 (total 3.1 R): 0.28 s
# selecting vs 1.16 s sorting; 512 columns of 7,500 rows, the same Ks, n = 150: 0.08 vs 0.15 s; the
# paper's 26 prefixes of 4,500 rows (total 15 R): 0.23 vs 0.10 s.
SELECT_ROWS = 6


def host_prefix_medians(x: np.ndarray, n: int, Ks, block: int = 64, batch: int = 256,
                        threads: int = 2, select: bool | None = None) -> np.ndarray:
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
    idle while this callback runs). A batch is at most ``COLUMN_ROWS`` rows' worth of columns, and
    each batch's columns are copied out of ``x`` on their own, so the working memory is bounded
    (``threads`` batches, ~24 bytes per row each) whatever the size of ``x``. ``select`` (default:
    by size, :data:`SELECT_ROWS`): one selection per prefix instead of the sort (the same values).
    """
    x = np.asarray(x)
    Ks = np.asarray(Ks, dtype=np.int64)
    *lead, R, d = x.shape
    x = x.reshape(-1, R, d)
    L = x.shape[0]
    out = np.empty((L, d, len(Ks)), x.dtype)
    if select is None:
        select = int(np.minimum(Ks * n, R).sum()) <= SELECT_ROWS * R
    batch = max(1, min(batch, COLUMN_ROWS // R))
    if d >= batch:  # columns j0:j1 of one leading row l
        tasks = [(l, l + 1, j, min(d, j + batch)) for l in range(L) for j in range(0, d, batch)]
    else:  # every column of leading rows l0:l1
        per = batch // d
        tasks = [(l, min(L, l + per), 0, d) for l in range(0, L, per)]

    def run(task):
        l0, l1, j0, j1 = task
        cols = np.ascontiguousarray(np.swapaxes(x[l0:l1, :, j0:j1], 1, 2)).reshape(-1, R)
        med = selected_medians(cols, n, Ks) if select else _medians_of_columns(cols, n, Ks, block)
        out[l0:l1, j0:j1] = med.reshape(l1 - l0, j1 - j0, -1)

    if threads > 1 and len(tasks) > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(run, tasks))
    else:
        for task in tasks:
            run(task)
    return np.swapaxes(out, 1, 2).reshape(*lead, len(Ks), d)


# Rows (column length times columns) of one batch of :func:`host_prefix_medians` at most: its
# working arrays (packed keys, groups, counts: ~24 bytes a row) stay near 100 MB per thread.
COLUMN_ROWS = 1 << 22


def chunk_medians(samples: np.ndarray, k: int, spec: Spec) -> np.ndarray:
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


def grouped_medians(pts, n: int, Ks: tuple, host: bool = True):
    """Prefix medians ``(nK, d)`` of one seed's ``pts: (G n, d)`` in groups of ``n`` consecutive
    rows (the samples of a domain): on a CPU backend with ``host`` through
    :func:`host_prefix_medians` (a ``pure_callback``, batched over the seeds by ``vmap``),
    elsewhere with the pure-XLA :func:`prefix_medians`. Both pick the same order statistics.
    ``host=False`` on several CPU devices: each device's program would call back into Python at
    once, and those concurrent callbacks hang the CPU runtime (seen with 4 forced host devices
    on 2 cores)."""
    if not host or accelerator_path():
        return prefix_medians(pts, jnp.arange(pts.shape[0]) // n, jnp.asarray(Ks, jnp.int32))
    out = jax.ShapeDtypeStruct((len(Ks), pts.shape[1]), pts.dtype)
    return jax.pure_callback(functools.partial(host_prefix_medians, n=n, Ks=Ks),
                             out, pts, vmap_method="expand_dims")

def host_medians_outside(spec: Spec, ndev: int = 1) -> bool:
    """Whether the paper's sample medians (materialised samples, ``init="median"``) are computed
    on the host between the engine's two programs (one CPU device) rather than inside the second
    (XLA's :func:`prefix_medians`, accelerators and several devices). On the host they take
    :func:`host_prefix_medians` (NumPy's sort, ~10x XLA's CPU sort); between the programs rather
    than as a callback inside, because JAX's persistent compilation cache does not store programs
    that call back into Python."""
    return spec.materialize and spec.init == "median" and ndev == 1 and not accelerator_path()
