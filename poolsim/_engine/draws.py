"""Every random number of a seed: domain means, samples or sufficient statistics, subsampling's draws."""
from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .. import _rng
from .spec import Group, Spec, widths

class SubDraws(NamedTuple):
    """Subsampling randomness for one K step, drawn for all steps at once before the scan
    (one vectorised draw is much cheaper on CPU than a split-and-draw inside every step)."""

    priority: Any  # (W,) uniform; the m valid domains with the smallest values are chosen
    idx: Any  # (W, n_sub) sample indices, with replacement (materialised path)
    q: Any  # (W,) sum of squared multiplicities of idx (sufficient-statistics path)
    z: Any  # (W, d) standard normals (sufficient-statistics path)
    # Entries of domains >= K are never read: drawn as 0 (see :func:`sub_draws`).


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


def sub_draws(key, spec: Spec, dtype, prefix: bool = True) -> SubDraws:
    """Subsampling's random numbers for every K step: a :class:`SubDraws` with fields
    ``(nK, K_max, ...)``, or with ``prefix`` (the default) only the entries that are read.

    Step k reads only its first ``Ks[k]`` domains, so with ``prefix`` only those entries are drawn
    (:func:`poolsim._rng.prefix_draw`: fields ``(sum(Ks), ...)``, the same values; 455 of 780 per
    array at K = 5..30) and :func:`full_sub` puts them in place (0 elsewhere) in the program that
    reads them; ``prefix=False`` draws every entry (the tests' oracle: same results). ``z`` is
    drawn on the sufficient-statistics path only (the materialised path resamples actual points:
    ``idx``). ``priority`` is drawn for the first ``W`` domains of each step, ``W`` its width
    (:func:`poolsim._engine.spec.widths`): every entry when all widths are ``K_max`` (the ranks
    read each value W times: measured cheaper drawn in place than put in place), else
    ``(sum(widths),)`` entries, the same values."""
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
    w = widths(spec)
    uniform = functools.partial(jax.random.uniform, dtype=dtype)
    if not prefix or all(W == spec.K_max for W in w):
        priority = uniform(kp, shape)
    else:
        priority = _rng.prefix_draw(uniform, kp, w, spec.K_max)
    return SubDraws(priority, idx, q, z)


def full_sub(r: SubDraws, spec: Spec, axis: int = 0) -> SubDraws:
    """:func:`sub_draws`'s fields in the ``(nK, K_max, ...)`` layout at ``axis`` (``axis=1``
    with a leading seed axis), 0 where nothing was drawn; fields drawn in that layout already
    (``prefix=False``) are unchanged. The per-seed oracle's layout (:func:`one_seed`)."""
    def full(a, drawn_full, lengths):
        return a if drawn_full else _rng.expand_prefix(a, lengths, spec.K_max, axis)

    flat = r.q.ndim == axis + 1  # idx, q, z drawn for the steps' prefixes only
    return SubDraws(full(r.priority, r.priority.ndim == axis + 2, widths(spec)),
                    *(full(getattr(r, f), not flat, spec.Ks) for f in ("idx", "q", "z")))


def group_sub(r: SubDraws, spec: Spec, g: Group, axis: int = 1) -> SubDraws:
    """The fields of :func:`sub_draws` for the K steps of group ``g``, in the ``(nK_g, W, ...)``
    layout at ``axis`` (after a leading seed axis by default): entries of domains ``>= K`` are
    0 (never read)."""
    flat = r.q.ndim == axis + 1  # idx, q, z drawn for the steps' prefixes only

    def rows(a, lengths, start, stop, full):
        if full:  # drawn in the (nK, K_max, ...) layout
            sl = (slice(None),) * axis + (slice(g.start, g.stop), slice(0, g.W))
            return a[sl]
        off = [0, *np.cumsum(lengths)]
        part = jax.lax.slice_in_dim(a, int(off[start]), int(off[stop]), axis=axis)
        return _rng.expand_prefix(part, lengths[start:stop], g.W, axis)

    w = widths(spec)
    pr = r.priority
    if pr.ndim == axis + 1:  # (sum(widths),): every entry of the group's rows is drawn
        off = [0, *np.cumsum(w)]
        pr = jax.lax.slice_in_dim(pr, int(off[g.start]), int(off[g.stop]), axis=axis)
        pr = pr.reshape(pr.shape[:axis] + (g.stop - g.start, g.W) + pr.shape[axis + 1:])
    else:
        pr = rows(pr, w, g.start, g.stop, True)
    return SubDraws(pr, *(rows(getattr(r, f), spec.Ks, g.start, g.stop, not flat)
                          for f in ("idx", "q", "z")))


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

class Draws(NamedTuple):
    """Every random number of a batch of seeds (leading axis S): the output of the engine's first
    program, :func:`draw_batch`."""

    means: Any  # (S, K_max, d)
    samples: Any  # (S, K_max, n, d) or None (sufficient statistics)
    xbar: Any  # (S, K_max, d)
    sub: Any  # SubDraws with fields (S, sum(Ks), ...) (see :func:`sub_draws`)


def draw_batch(spec: Spec, dtype, seeds, prefix: bool = True) -> Draws:
    """First program of the engine: all draws of seeds ``seeds: (S,) uint32`` (seed s uses
    :func:`poolsim._rng.fast_key`, i.e. ``jax.random.key(s)``'s numbers; vmap of :func:`draw` and
    :func:`sub_draws`, the same numbers as in :func:`one_seed`). A separate program on purpose:
    inside one program XLA fuses the Threefry hash and the inverse normal CDF into consumers that
    read each value many times (once per K, or K_max times in the subsampling ranks) and
    recomputes it there -- ``optimization_barrier`` does not stop this on the CPU backend; the
    program boundary does (measured 4-10x on the subsampling step). ``prefix``: see
    :func:`sub_draws`."""
    keys = jax.vmap(_rng.fast_key)(seeds)
    means, samples, xbar, k_sub = jax.vmap(functools.partial(draw, spec, dtype))(keys)
    return Draws(means, samples, xbar,
                  jax.vmap(lambda k: sub_draws(k, spec, dtype, prefix))(k_sub))
