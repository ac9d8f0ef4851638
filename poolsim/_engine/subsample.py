"""Def. 2 on the first K domains of a seed: uniform subsampling of domains, then of points.

The m = ceil(m_frac K) domains are the m valid ones of smallest random priority. Which ones: a
domain is chosen when fewer than m valid priorities lie strictly below its own, i.e. when its
priority is at most the m-th smallest one -- the same set (ties included) computed two ways, picked
by size (:data:`PAIRWISE_MAX`): pairwise comparison (O(W^2), no sort: cheapest at the paper's
sizes) or a sort of the W priorities and the m-th smallest as a threshold (O(W log W)).
"""
from __future__ import annotations

import jax.numpy as jnp

from .draws import SubDraws
from .select import kth_smallest
from .spec import Spec

# Widths up to this rank the domains by pairwise comparison, larger ones by the threshold. Measured on
# the 2-core CPU (benchmarks/engine_bigk.py, sufficient path, 1,024 seeds): at W = 128 the W^2
# comparisons still cost less; at W = 1,000 they were the 8.5 GB and most of the time of
# ``Ks=(10, 1000)``.
PAIRWISE_MAX = 128


def chosen_domains(priority, mask, m):
    """``(W,)`` 0/1 flags of the ``m`` valid domains (``mask > 0``) of smallest ``priority``
    (``priority, mask: (W,)``, ``m`` a traced int): ranks by pairwise comparison up to
    :data:`PAIRWISE_MAX` domains, else by the m-th smallest priority as a threshold -- the same set."""
    p = jnp.where(mask > 0, priority, 2.0)  # invalid domains rank last
    if p.shape[-1] <= PAIRWISE_MAX:
        rank = jnp.sum(p[None, :] < p[:, None], axis=1)
        return (rank < m) & (mask > 0)
    threshold = kth_smallest(p, m)  # the m-th smallest priority (m <= number of valid domains)
    return (p <= threshold) & (mask > 0)


def subsample_mean(r: SubDraws, xbar, samples, mask, K, spec: Spec, dtype):
    """Def. 2 on the first K domains of W (``r``'s fields ``(W, ...)``, ``xbar: (W, d)``,
    ``samples: (W, n, d)`` or None, ``mask: (W,)`` 1 for the first K): m = ceil(m_frac K)
    distinct domains uniformly (:func:`chosen_domains`), then n_sub indices with replacement
    inside each. Returns ``(estimate (d,), m)``."""
    n, n_sub = spec.n, spec.n_sub
    m = jnp.clip(jnp.ceil(spec.m_frac * K).astype(jnp.int32), 1, K)
    chosen = chosen_domains(r.priority, mask, m).astype(dtype)
    if samples is not None:
        dom = jnp.take_along_axis(samples, r.idx[:, :, None], axis=1).mean(axis=1)
    else:
        spread = spec.sigma * jnp.sqrt(jnp.maximum(r.q / n_sub**2 - 1.0 / n, 0.0))
        dom = xbar + spread[:, None] * r.z
    est = jnp.sum(chosen[:, None] * dom, axis=0) / jnp.sum(chosen)
    return est, m
