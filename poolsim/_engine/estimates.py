"""The estimates of pooling, subsampling and matching for one seed (:func:`one_seed`, the oracle) and
for a batch of seeds (:func:`estimate_batch`, the engine's second program)."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from .. import _core
from .draws import Draws, draw, full_sub, group_sub, sub_draws
from .matching import batched_match
from .medians import domain_medians, grouped_medians, prefix_medians
from .spec import SeedResult, Spec, groups
from .subsample import subsample_mean

def one_seed(spec: Spec, dtype, key, host_medians: bool = True) -> SeedResult:
    """One seed: draws, the matching starts for every K, then a ``lax.scan`` over the K values
    (pooling, subsampling and matching on the first K domains). Vectorising the K axis instead
    (one vmapped ``while_loop`` for all K) was measured slower on CPU: the loop then runs over
    26x bigger arrays, max(n_iter) times, and XLA's code for them vectorised worse."""
    means, samples, xbar, k_sub = draw(spec, dtype, key)
    mu_star = jnp.asarray(spec.mu_star, dtype)
    Ks = jnp.asarray(spec.Ks, jnp.int32)
    if spec.init == "median":
        medians = grouped_medians(samples.reshape(-1, spec.d), spec.n, spec.Ks,
                                   host_medians) \
            if samples is not None else prefix_medians(xbar, jnp.arange(spec.K_max), Ks)
        # (K_max domain means: XLA's sort of ~30 rows beats a host round trip -- measured)
    else:
        medians = jnp.zeros((len(spec.Ks), spec.d), dtype)
    n = jnp.asarray(spec.n, dtype)
    sub = full_sub(sub_draws(k_sub, spec, dtype), spec)

    def step(_, inp):
        K, r, median = inp
        mask = (jnp.arange(spec.K_max) < K).astype(dtype)
        pool = jnp.sum(mask[:, None] * xbar, axis=0) / jnp.sum(mask)
        sub_est, m = subsample_mean(r, xbar, samples, mask, K, spec, dtype)
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

# A group's matching loop and selections (:mod:`poolsim._engine.select`) pass over the seeds' domain
# means many times; they run on blocks of seeds whose means take at most this many bytes, so that
# each pass rereads them from cache, not from memory. Measured (2-core CPU, 32 MiB L3, sufficient
# path, 128 seeds): the estimates at K = 10^5 took 4.7 s in one block, 2.1 s in blocks of 10 seeds
# (blocks of 2-20 seeds: within 1.3x of that). Below the limit (every size of the paper) a chunk is
# one block, as before.
CACHE_BYTES = 8 << 20


def seed_block(S: int, W: int, d: int, dtype) -> int:
    """Seeds per block for a group of width ``W`` (see :data:`CACHE_BYTES`): ``S`` (one block)
    when the chunk's ``(S, W, d)`` domain means fit, else the largest divisor of ``S`` whose block
    fits (at least 1), so that the blocks are a reshape of the chunk, not a copy."""
    limit = max(1, CACHE_BYTES // (W * d * jnp.dtype(dtype).itemsize))
    return S if S <= limit else max(b for b in range(1, limit + 1) if S % b == 0)


def in_blocks(f, a, block: int):
    """``f(a)`` for a pytree ``a`` of arrays with a leading seed axis of length ``S`` (``None``
    leaves allowed), as a ``lax.map`` of ``f`` over ``S / block`` consecutive blocks (``block``
    divides ``S``): the same result when each seed's outputs depend on that seed alone."""
    S = jax.tree.leaves(a)[0].shape[0]
    if block >= S:
        return f(a)
    nb = S // block
    if nb * block != S:
        raise ValueError(f"block = {block} must divide the {S} seeds")
    out = jax.lax.map(f, jax.tree.map(lambda x: x.reshape((nb, block) + x.shape[1:]), a))
    return jax.tree.map(lambda y: y.reshape((S,) + y.shape[2:]), out)


def estimate_batch(spec: Spec, dtype, draws: Draws, medians=None) -> SeedResult:
    """Second program: the estimates for a batch of seeds from their :func:`draw_batch` draws,
    seed axis leading: the same results as ``vmap`` of :func:`one_seed` (tested), organised for
    speed. ``medians (S, nK, d)``: the paper's sample-median starts, computed on the host between
    the two programs (:func:`host_medians_outside`), or ``None`` (computed here: XLA's
    :func:`prefix_medians`, or the domain means' medians on the sufficient path).

    The K steps go in groups of one width W (:func:`poolsim._engine.spec.groups`): each group reads
    the first W domains only, so a step costs O(W) <= O(2 K), not O(K_max). Within a group, pooling
    and subsampling -- no loops, nothing carried between K values -- are evaluated for all its K at
    once (``vmap`` over K, measured 3.5x cheaper than inside the scan); only matching runs in a
    ``lax.scan`` over the K values, as one batched loop per K (:func:`batched_match`) instead of
    a vmapped ``while_loop``."""
    means, samples, xbar, sub = draws
    S = xbar.shape[0]
    n = jnp.asarray(spec.n, dtype)
    parts = []
    for g in groups(spec):
        # The group's subsampling draws put in place once, here, not inside every reader
        # (measured: fused into the readers the gathers cost ~15% of this program).
        r = jax.lax.optimization_barrier(group_sub(sub, spec, g))
        Ks = jnp.asarray(g.Ks, jnp.int32)
        masks = (jnp.arange(g.W)[None, :] < Ks[:, None]).astype(dtype)  # (nK_g, W)

        def one_group(a, g=g, Ks=Ks, masks=masks):
            """Group ``g``'s estimates for a batch of seeds (every array's leading axis)."""
            xb, smp, r, med = a
            B = xb.shape[0]
            pool = jax.vmap(lambda mask: jnp.sum(mask[None, :, None] * xb, axis=1) / jnp.sum(mask))(
                masks)  # (nK_g, B, d)
            per_k = jax.vmap(lambda r, x, sm, mask, K: subsample_mean(r, x, sm, mask, K, spec, dtype),
                             in_axes=(0, None, None, 0, 0))
            sub_est, m = jax.vmap(per_k, in_axes=(0, 0, 0 if smp is not None else None, None, None))(
                r, xb, smp, masks, Ks)  # (B, nK_g, d), (B, nK_g)
            if spec.init == "median":
                if med is not None:
                    c0 = med
                elif smp is not None:
                    c0 = jax.vmap(lambda p: grouped_medians(p, spec.n, g.Ks, host=False))(
                        smp.reshape(B, -1, spec.d))
                else:
                    c0 = domain_medians(xb, g.Ks)
                c0 = jnp.swapaxes(c0, 0, 1)  # (nK_g, B, d)
            elif spec.init == "mean":
                c0 = pool
            else:
                c0 = jnp.broadcast_to(jnp.asarray(spec.mu_star, dtype), pool.shape)

            def step(_, inp):
                mask, start = inp
                c, inc, it, conv = batched_match(xb, mask * n, start, spec)
                return None, (c, conv, it, inc)

            _, (c, conv, it, inc) = jax.lax.scan(step, None, (masks, c0))
            pool, c, conv, it, inc = (jnp.swapaxes(a, 0, 1) for a in (pool, c, conv, it, inc))
            return jnp.stack([pool, sub_est, c], axis=2), m, conv, it, inc > 0

        a = (xbar[:, :g.W], None if samples is None else samples[:, :g.W], r,
             None if medians is None else medians[:, g.start:g.stop])
        block = seed_block(S, g.W, spec.d, dtype)
        est, m, conv, it, inc = in_blocks(one_group, a, block)
        if g.W < spec.K_max:
            inc = jnp.pad(inc, ((0, 0), (0, 0), (0, spec.K_max - g.W)))
        used = jnp.stack([jnp.broadcast_to(Ks, (S, len(g.Ks))), m,
                          jnp.sum(inc, axis=2).astype(jnp.int32)], axis=2)
        parts.append((est, used, conv, it, inc))
    est, used, conv, it, inc = (jnp.concatenate(a, axis=1) if len(parts) > 1 else a[0]
                                for a in zip(*parts))
    return SeedResult(est, used, conv, it, inc, means, xbar)
