"""Matching (Algorithm 1) for a batch of seeds at once."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from .. import _core
from .spec import Spec, accelerator_path

# Matching stages (see :func:`batched_match`): ``(trips, divisor)`` -- after ``trips`` more loop
# trips the seeds still iterating are compacted into a batch of ``chunk // divisor`` rows.
# Measured on the paper's domain_addition (2,048 seeds, 26 K values; an iteration count includes
# the final, converging one): every seed needs >= 2 iterations per K, the mean seed 2.6; after
# 3 trips at most 22% of the seeds still iterate (mean 11%), after 5 at most 1.6%, and the
# slowest need 4-9, so most trips of a whole-chunk loop only froze converged seeds.
STAGES = ((3, 4), (2, 8))


def batched_match(x, mass, c0, spec: Spec, stages: tuple | None = None):
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
    default ``STAGES`` on a CPU backend, none on accelerators, where the seeds of a trip run in
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
        stages = () if accelerator_path() else STAGES
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
