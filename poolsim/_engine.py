"""Vectorised JAX Monte Carlo: one seed is a pure function, ``vmap`` runs many, ``lax.scan`` walks K.

For each seed: draw ``K_max`` domain means from the meta-distribution, then the per-domain data
(either materialised samples ``(K_max, n, d)`` or their sufficient statistics), then scan over the
requested K values -- every K is the prefix ``1..K`` of the same domains, handled with 0/1 masks so
shapes never change and the whole experiment is traced once. ``simulate(...,
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

from . import _core

STRATEGIES = ("pool", "subsample", "match")


class Spec(NamedTuple):
    """Static description of one experiment run (hashable: it keys the compiled-function cache).

    ``sample_means``: ``key -> (K_max, d)`` (the meta-distribution's sampler). ``Ks``: increasing K
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
    ``included (nK, K_max)`` matching's domain flags, ``means (K_max, d)`` the true domain means,
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
    idx: Any  # (K_max, n_sub) sample indices, with replacement
    q: Any  # (K_max,) sum of squared multiplicities of idx (sufficient-statistics path)
    z: Any  # (K_max, d) standard normals (sufficient-statistics path)


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


def _sub_draws(key, spec: Spec, dtype) -> _SubDraws:
    kp, ki, kz = jax.random.split(key, 3)
    shape = (len(spec.Ks), spec.K_max)
    if spec.materialize:
        idx = jax.random.randint(ki, shape + (spec.n_sub,), 0, spec.n)
        q = jnp.zeros(shape, dtype)
    else:  # only q matters: one uniform through the exact inverse CDF
        values, prob = collision_law(spec.n, spec.n_sub)
        cdf = jnp.asarray(np.cumsum(prob)[:-1], dtype)
        q = jnp.asarray(values, dtype)[jnp.searchsorted(cdf, jax.random.uniform(ki, shape, dtype))]
        idx = jnp.zeros(shape + (0,), jnp.int32)
    return _SubDraws(jax.random.uniform(kp, shape, dtype), idx, q,
                     jax.random.normal(kz, shape + (spec.d,), dtype))


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


def host_prefix_medians(x: np.ndarray, n: int, Ks, block: int = 64) -> np.ndarray:
    """NumPy twin of :func:`prefix_medians` for rows grouped in consecutive runs of ``n``
    (row r belongs to group ``r // n``, so ``group < K`` is the first ``K n`` rows).

    ``x: (..., R, d)`` -> ``(..., nK, d)``, exactly the order statistics :func:`prefix_medians`
    picks. Why hand-written and on the host: XLA's CPU sort calls a generated comparator per
    comparison and was ~10x slower than NumPy's SIMD sort here, and the ``(nK, R)`` running
    count (a log-depth scan in XLA) cost more than the sort. Instead: one NumPy sort per column,
    then block counts -- ``np.bincount`` of (block, group) gives how many rows of each group lie
    in each block of ``block`` sorted positions, so the block holding the j-th valid row is found
    from ``R / block`` partial sums and only that block is scanned. O(R log R) for the sort plus
    O(R + nK (R / block + block)) per column, instead of O(nK R).
    """
    x = np.asarray(x)
    Ks = np.asarray(Ks, dtype=np.int64)
    *lead, R, d = x.shape
    G = -(-R // n)  # groups; G itself marks padding, which no prefix contains
    cols = np.moveaxis(x, -1, -2).reshape(-1, R)  # (M, R)
    M = cols.shape[0]
    order = np.argsort(cols, axis=-1)
    srt = np.take_along_axis(cols, order, axis=-1)
    nb = -(-R // block)
    g = np.full((M, nb * block), G, dtype=np.int32)
    np.floor_divide(order, n, out=g[:, :R])
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
        return np.take_along_axis(srt, pos, axis=1)

    med = 0.5 * (pick((count - 1) // 2) + pick(count // 2))  # (M, nK)
    return np.moveaxis(med.reshape(*lead, d, len(Ks)), -1, -2).astype(x.dtype)


def _grouped_medians(pts, n: int, Ks: tuple):
    """Prefix medians ``(nK, d)`` of one seed's ``pts: (G n, d)`` in groups of ``n`` consecutive
    rows (the samples of a domain): on a CPU backend through
    :func:`host_prefix_medians` (a ``pure_callback``, batched over the seeds by ``vmap``),
    elsewhere with the pure-XLA :func:`prefix_medians`. Both pick the same order statistics."""
    if jax.default_backend() != "cpu":
        return prefix_medians(pts, jnp.arange(pts.shape[0]) // n, jnp.asarray(Ks, jnp.int32))
    out = jax.ShapeDtypeStruct((len(Ks), pts.shape[1]), pts.dtype)
    return jax.pure_callback(functools.partial(host_prefix_medians, n=n, Ks=Ks),
                             out, pts, vmap_method="expand_dims")


def _one_seed(spec: Spec, dtype, key) -> SeedResult:
    """One seed: draws, the matching starts for every K, then a ``lax.scan`` over the K values
    (pooling, subsampling and matching on the first K domains). Vectorising the K axis instead
    (one vmapped ``while_loop`` for all K) was measured slower on CPU: the loop then runs over
    26x bigger arrays, max(n_iter) times, and XLA's code for them vectorised worse."""
    means, samples, xbar, k_sub = draw(spec, dtype, key)
    mu_star = jnp.asarray(spec.mu_star, dtype)
    Ks = jnp.asarray(spec.Ks, jnp.int32)
    if spec.init == "median":
        medians = _grouped_medians(samples.reshape(-1, spec.d), spec.n, spec.Ks) \
            if samples is not None else prefix_medians(xbar, jnp.arange(spec.K_max), Ks)
        # (K_max domain means: XLA's sort of ~30 rows beats a host round trip -- measured)
    else:
        medians = jnp.zeros((len(spec.Ks), spec.d), dtype)
    n = jnp.asarray(spec.n, dtype)
    sub = _sub_draws(k_sub, spec, dtype)

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
    return SeedResult(est, used, conv, it, inc, means, xbar)


@functools.lru_cache(maxsize=64)
def _compiled(spec: Spec, dtype_name: str):
    """One jitted, vmapped function per (spec, dtype): the compile-count test checks it traces once."""
    dtype = jnp.dtype(dtype_name)
    return jax.jit(jax.vmap(functools.partial(_one_seed, spec, dtype)))


def _shard(keys):
    """Place the seed axis across this process's devices (no-op on one device)."""
    devices = jax.local_devices()
    if len(devices) == 1:
        return keys
    mesh = jax.sharding.Mesh(np.array(devices), ("seeds",))
    return jax.device_put(keys, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("seeds")))


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


def simulate(spec: Spec, seeds: np.ndarray, *, dtype: str = "float32", chunk: int = 2048,
             shard: bool = True, progress: Callable[[int], None] | None = None,
             distributed: bool = False) -> SeedResult:
    """Run ``spec`` for every seed in ``seeds`` (int array). Seed s uses ``jax.random.key(s)``, so a
    seed's result does not depend on the other seeds, the chunking, the sharding or the process.

    Seeds are processed in chunks of ``chunk`` (the last one padded, so one trace serves all;
    ~2k seeds per chunk was fastest on a 2-core CPU, larger ones fall out of cache);
    with several local devices each chunk is sharded over them (chunk rounded up to a multiple of
    the device count). ``distributed=True`` (every process of a ``jax.distributed`` job calls
    this with the same arguments): each process runs its own block of seeds
    (:func:`process_block`) and ``multihost_utils.process_allgather`` gathers the blocks, so
    every process, process 0 included, returns all seeds in order. Returns a
    :class:`SeedResult` of NumPy arrays with leading axis ``len(seeds)``.
    """
    seeds = np.asarray(seeds, dtype=np.int64)
    S = len(seeds)
    if distributed:
        if not jax.distributed.is_initialized():
            raise RuntimeError(f"distributed=True but jax.distributed is not initialised: "
                               f"{DISTRIBUTED_HELP}")
        start, per = process_block(S)
        padded = np.concatenate([seeds, np.full(per * jax.process_count() - S, seeds[-1])])
        local = simulate(spec, padded[start:start + per], dtype=dtype, chunk=chunk, shard=shard,
                         progress=progress)
        from jax.experimental import multihost_utils

        ctx = jax.enable_x64(True) if dtype == "float64" else contextlib.nullcontext()
        with ctx:
            full = multihost_utils.process_allgather(local, tiled=True)
        return SeedResult(*(np.asarray(a)[:S] for a in full))
    ndev = len(jax.local_devices()) if shard else 1
    # Fewer seeds than `chunk`: round up to a power of two, so runs of similar size share one
    # compiled shape; the last chunk is padded.
    chunk = min(chunk, 1 << (S - 1).bit_length())
    chunk = -(-chunk // ndev) * ndev
    ctx = jax.enable_x64(True) if dtype == "float64" else contextlib.nullcontext()
    parts = []
    with ctx:
        fn = _compiled(spec, dtype)
        for start in range(0, S, chunk):
            block = seeds[start:start + chunk]
            padded = np.concatenate([block, np.full(chunk - len(block), block[-1])])
            keys = jax.vmap(jax.random.key)(jnp.asarray(padded, dtype=jnp.uint32))
            out = fn(_shard(keys) if shard else keys)
            parts.append(jax.tree.map(lambda a, k=len(block): np.asarray(a)[:k], out))
            if progress is not None:
                progress(len(block))
    return SeedResult(*(np.concatenate([getattr(p, f) for p in parts]) for f in SeedResult._fields))

