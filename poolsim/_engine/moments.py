"""On-device reduction of a batch's results to moments, and their merge into a summary."""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .spec import STRATEGIES, SeedResult, Spec

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


def moments(spec: Spec, res: SeedResult, valid) -> Moments:
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
