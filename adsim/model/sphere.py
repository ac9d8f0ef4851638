"""Geodesic distances of many unit features to a few centroids in one fused torch kernel.

``poolsim.core.geodesic`` is the array-API definition (any backend, any inputs): it normalises both
inputs and builds ``u - v`` and ``u + v`` explicitly, i.e. about ten full-size elementwise passes per
centroid, forward and backward. The training step compares ``(L, B*N, E)`` *unit* features with two
centroids per slot, so here the chords ``||f - c||`` and ``||f + c||`` for all centroids come from one
``torch.cdist`` call against ``[c, -c]`` (one pass over the features, a fused backward), and the angle
from :func:`poolsim.core.chord_angle`, the same formula as ``core.geodesic``.

``compute_mode="donot_use_mm_for_euclid_dist"`` matters: cdist's default for more than 25 rows is
the matmul expansion ``||f||^2 + ||c||^2 - 2 <f, c>``, which cancels catastrophically for close
vectors (the very arccos problem the chord form avoids); the direct form sums ``(f - c)^2``.
"""
from __future__ import annotations

import torch

from poolsim import core


def chords(f: torch.Tensor, c: torch.Tensor, *, both: bool = True) -> tuple:
    """``f: (..., n, d)``, ``c: (..., k, d)`` (same leading axes) -> ``(||f - c||, ||f + c||)``,
    each ``(..., n, k)``; ``both=False``: ``(||f - c||,)`` only (half the work). Gradients are finite
    everywhere (cdist's gradient at distance 0 is 0)."""
    k, dt = c.shape[-2], torch.promote_types(f.dtype, c.dtype)  # cdist wants one dtype
    dirs = torch.cat([c, -c], dim=-2) if both else c
    dist = torch.cdist(f.to(dt), dirs.to(dt), compute_mode="donot_use_mm_for_euclid_dist")
    return tuple(dist.split(k, dim=-1)) if both else (dist,)  # split: one op in the backward pass


def unit_geodesic(f: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """``(..., n, k)`` angles between *unit* rows ``f: (..., n, d)`` and *unit* (or zero) rows
    ``c: (..., k, d)``; equal to ``core.geodesic(f[..., :, None, :], c[..., None, :, :])`` for such
    inputs (to float rounding; a zero centroid gives pi/2 like there). Non-unit ``f`` gives wrong
    angles: callers normalise first or know their features are unit."""
    return core.chord_angle(*chords(f, c))
