"""The one matching core: distances, the inclusion gate, centroid updates, the median.

Everything here is written against the Python array API (through ``array-api-compat``) so the same
function runs on NumPy arrays, ``jax.numpy`` arrays (also under ``jax.jit``/``jax.vmap``) and torch
tensors (with autograd). Rules that keep it traceable and differentiable:

* no boolean-mask indexing -- inclusion is a 0/1 *weight* array of the input's float dtype;
* no in-place writes;
* every ``sqrt``/``arccos``/division has a guarded input, so values and gradients stay finite at
  identical vectors, at zero vectors and at cosine = +-1.

Transformations: every function here runs under ``jax.jit``, ``jax.vmap``, ``jax.grad`` and
``jax.jacfwd`` and with torch autograd (:func:`iterate_match`'s ``lax.while_loop`` through a
``custom_jvp``). The functions check no values: the public strategies do.

Shapes: ``x: (..., d)`` points, ``c: (d,)`` or ``(..., d)`` centroids (broadcast), ``w: (...,)``
weights. The functions never look at values on the host, so they also work on tracers -- except
:func:`weighted_median` on NumPy arrays (never traced), which selects rather than sorts (the same
values). All array arguments of one call must come from one library: mixing them is
array-api-compat's TypeError ("Multiple namespaces"), never a silent conversion.
"""
from __future__ import annotations

from ._core import (
    METRICS as METRICS,
    namespace as namespace,
    sum_squares as sum_squares,
    safe_norm as safe_norm,
    normalize as normalize,
    cosine_similarity as cosine_similarity,
    chord_angle as chord_angle,
    geodesic as geodesic,
    distance as distance,
    gate as gate,
    weighted_mean as weighted_mean,
    ema_update as ema_update,
    slerp_update as slerp_update,
    weighted_median as weighted_median,
    match_step as match_step,
    iterate_match as iterate_match,
    running_update as running_update,
    exclusive_gate as exclusive_gate,
    multi_match_step as multi_match_step,
)

__all__ = ["METRICS", "namespace", "sum_squares", "safe_norm", "normalize", "cosine_similarity", "chord_angle",
           "geodesic", "distance", "gate", "weighted_mean", "ema_update", "slerp_update", "weighted_median",
           "match_step", "iterate_match", "running_update", "exclusive_gate", "multi_match_step"]
