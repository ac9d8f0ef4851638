"""Def. 2 on the first K domains of a seed: uniform subsampling of domains, then of points."""
from __future__ import annotations

import jax.numpy as jnp

from .draws import SubDraws
from .spec import Spec

def subsample_mean(r: SubDraws, xbar, samples, mask, K, spec: Spec, dtype):
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
