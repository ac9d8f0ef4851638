"""The matching core (distances, the inclusion gate, centroid updates, the median): the implementation
of :mod:`poolsim.core`, whose docstring states its rules (array API, traceable, differentiable)."""
from __future__ import annotations

import functools
from typing import Any

import numpy as np
from array_api_compat import array_namespace, is_jax_namespace, is_numpy_namespace

METRICS = ("l2", "cosine", "geodesic")
"""The distances :func:`distance` computes (``metric=``)."""


def namespace(*arrays: Any):
    """The array-API namespace shared by ``arrays`` (NumPy, jax.numpy or torch)."""
    return array_namespace(*arrays)


def sum_squares(x, *, axis: int = -1):
    """``sum(x * x)`` along ``axis``: ``(..., d) -> (...)`` for the default ``axis=-1``."""
    xp = namespace(x)
    return xp.sum(x * x, axis=axis)


def safe_norm(x, *, axis: int = -1):
    """Euclidean norm along ``axis`` whose gradient at ``x = 0`` is 0 instead of NaN.

    The double-``where`` keeps ``sqrt`` away from 0 in both the forward and the backward pass.
    """
    xp = namespace(x)
    s = sum_squares(x, axis=axis)
    positive = s > 0
    safe = xp.where(positive, s, xp.ones_like(s))
    return xp.where(positive, xp.sqrt(safe), xp.zeros_like(s))


def normalize(x, *, axis: int = -1):
    """``x / ||x||`` along ``axis``; a zero vector stays zero (no NaN, finite gradient).

    Written as ``x / sqrt(where(s > 0, s, 1))`` with ``s = ||x||^2``: the same values as dividing by
    :func:`safe_norm` where it is positive and by 1 elsewhere, with fewer array operations (it runs on
    every feature tensor of an adsim training step, where each operation is a GPU kernel).
    """
    xp = namespace(x)
    s = xp.expand_dims(sum_squares(x, axis=axis), axis=axis)
    return x / xp.sqrt(xp.where(s > 0, s, xp.ones_like(s)))


def cosine_similarity(a, b):
    """``<a, b> / (||a|| ||b||)`` over the last axis, clipped to [-1, 1]; 0 if either is zero."""
    xp = namespace(a, b)
    cos = xp.sum(normalize(a) * normalize(b), axis=-1)
    return xp.clip(cos, -1.0, 1.0)


def chord_angle(y, x):
    """Angle between unit vectors ``u, v`` from their chords ``y = ||u - v||``, ``x = ||u + v||``.

    ``2 * atan2(y, x)`` (``y = 2 sin(t/2)``, ``x = 2 cos(t/2)``): accurate near 0 and pi, where
    ``arccos(<u, v>)`` loses half the digits, with finite gradients there (arccos' is infinite at
    +-1). The one formula of the geodesic metric: :func:`geodesic` feeds it chords of normalised
    vectors; ``adsim`` feeds it chords of unit features computed by one fused torch kernel.
    """
    xp = namespace(y, x)
    # Both are 0 only when u = v = 0; there cos = 0 (cosine_similarity's convention), so the
    # angle is arccos(0) = pi/2 = 2 atan2(1, 1), not 2 atan2(0, 0) = 0.
    both_zero = (y == 0) & (x == 0)
    one = xp.ones_like(y)
    return 2.0 * xp.atan2(xp.where(both_zero, one, y), xp.where(both_zero, one, x))


def geodesic(a, b):
    """Great-circle angle between the directions of ``a`` and ``b`` (radians, in [0, pi]).

    Mathematically ``arccos(clip(cos(a, b), -1, 1))``; computed by :func:`chord_angle` on the unit
    vectors ``u, v``, i.e. ``2 * atan2(||u - v||, ||u + v||)``.
    """
    namespace(a, b)  # one array library (TypeError otherwise) before any arithmetic mixes them
    u, v = normalize(a), normalize(b)
    return chord_angle(safe_norm(u - v), safe_norm(u + v))


def distance(x, c, metric: str):
    """Matching function ``M(x - c)`` over the last axis.

    * ``"l2"``: ``||x - c||_2``
    * ``"cosine"``: ``1 - cos(x, c)`` (in [0, 2]; not a metric, kept for the paper's ablation)
    * ``"geodesic"``: ``arccos(cos(x, c))`` (in [0, pi]; see :func:`geodesic`)

    ``x`` and ``c`` must come from one array library (TypeError otherwise, for every metric).
    """
    namespace(x, c)
    if metric == "l2":
        return safe_norm(x - c)
    if metric == "cosine":
        return 1.0 - cosine_similarity(x, c)
    if metric == "geodesic":
        return geodesic(x, c)
    raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")


def gate(dist, tau):
    """Inclusion weights ``1[M(v) < tau]`` as 0/1 floats of ``dist``'s dtype (no boolean masks)."""
    xp = namespace(dist)
    return xp.astype(dist < tau, dist.dtype)


def weighted_mean(x, w, fallback):
    """``sum_i w_i x_i / sum_i w_i`` over axis 0 of ``x: (n, d)`` with ``w: (n,)``.

    Returns ``(mean (d,), total weight ())``. Where the total weight is 0 the result is
    ``fallback`` (d,) -- never 0/0.
    """
    xp = namespace(x, w, fallback)
    total = xp.sum(w)
    has = total > 0
    num = xp.sum(w[:, None] * x, axis=0)
    mean = num / xp.where(has, total, xp.ones_like(total))
    return xp.where(has, mean, fallback), total


def ema_update(c, f, alpha: float = 0.5, *, renormalize: bool = True):
    """The paper's centroid update (§"Centroid Initialization and Update").

    ``c~ = alpha c + (1 - alpha) f`` and, with ``renormalize``, ``c = c~ / ||c~||`` so the centroid
    stays on the unit sphere. A zero-initialised ``c`` therefore becomes ``f / ||f||`` on the first
    update. If ``c~ = 0`` (antipodal ``c`` and ``f`` with alpha 0.5) ``c`` is returned unchanged.
    """
    xp = namespace(c, f)
    new = alpha * c + (1.0 - alpha) * f
    if not renormalize:
        return new
    n = xp.expand_dims(safe_norm(new), axis=-1)
    return xp.where(n > 0, new / xp.where(n > 0, n, xp.ones_like(n)), c)


def slerp_update(c, f, alpha: float = 0.5):
    """Move unit centroid ``c`` a fraction ``1 - alpha`` of the great-circle arc towards ``f``.

    ``c' = sin(a t)/sin t * c^ + sin((1-a) t)/sin t * f^`` with ``t`` the angle between them, here
    ``a = alpha``. For ``t -> 0`` the weights tend to ``alpha, 1 - alpha`` (linear interpolation,
    then renormalised); a zero ``c`` becomes ``f^``; antipodal inputs (no unique arc) fall back to
    :func:`ema_update`.
    """
    xp = namespace(c, f)
    u, v = normalize(c), normalize(f)
    t = xp.expand_dims(geodesic(u, v), axis=-1)
    s = xp.sin(t)
    small = s < 1e-6
    s_safe = xp.where(small, xp.ones_like(s), s)
    wa = xp.where(small, alpha * xp.ones_like(t), xp.sin(alpha * t) / s_safe)
    wb = xp.where(small, (1.0 - alpha) * xp.ones_like(t), xp.sin((1.0 - alpha) * t) / s_safe)
    out = normalize(wa * u + wb * v)
    zero_c = xp.expand_dims(safe_norm(c), axis=-1) == 0
    antipodal = small & (t > 1.0)
    out = xp.where(antipodal, ema_update(c, f, alpha), out)
    return xp.where(zero_c, v, out)


def weighted_median(x, w=None):
    """Coordinate-wise median over axis 0 of ``x: (n, d)`` counting only rows with ``w > 0``.

    NumPy's convention (mean of the two middle values for an even count). Written by sorting
    rather than calling a library median because ``torch.median`` returns the *lower* middle
    value, not the average, and because masked rows must be ignored without boolean indexing:
    they are pushed to the top of the sort with the dtype's largest finite value. With no row kept the
    result is not a median (the top of the sort: inf): callers check ``sum(w > 0) > 0`` first.

    On NumPy floats the same two order statistics are found by selection instead
    (:func:`_numpy_median`): the same values, bit for bit, in linear time.
    """
    xp = namespace(x)
    if is_numpy_namespace(xp) and xp.isdtype(x.dtype, "real floating") and x.ndim == 2:
        rows = None if w is None else np.flatnonzero(w > 0)
        if rows is None or rows.size:
            return _numpy_median(x, None if rows is None or rows.size == x.shape[0] else rows)
    if w is None:
        w = xp.ones(x.shape[0], dtype=x.dtype)
    big = xp.finfo(x.dtype).max
    keep = w[:, None] > 0
    filled = xp.where(keep, x, xp.full_like(x, big))
    srt = xp.sort(filled, axis=0)
    count = xp.sum(xp.astype(w > 0, xp.int32))
    count = xp.where(count > 0, count, xp.ones_like(count))
    lo = xp.reshape((count - 1) // 2, (1,))
    hi = xp.reshape(count // 2, (1,))
    return 0.5 * (xp.take(srt, lo, axis=0)[0] + xp.take(srt, hi, axis=0)[0])


# Selection works on a (columns, rows) copy of this many elements at a time (16 MB of float32), filled in
# tiles of about _TILE elements so that the transposing reads stay in cache.
_MEDIAN_BLOCK = 1 << 22
_TILE = 1 << 16


def _numpy_median(x, rows):
    """:func:`weighted_median` of NumPy ``x: (n, d)`` over ``rows`` (int indices; ``None``: all rows).

    The two middle order statistics ``lo = (count - 1) // 2`` and ``hi = count // 2`` of each column, as
    the sort finds them: ``np.partition`` puts the ``hi``-th in place with every smaller value before
    it, so the ``lo``-th is the largest of those (the same element when ``count`` is odd); the result is
    the same ``0.5 * (lo + hi)``. Selection is linear where the sort is ``n log n``, and it runs on
    contiguous copies of a block of columns at a time, as a selection along the strided axis 0 (NumPy's
    ``median``) reads a cache line per element (measured for (200000, 768) float32, 2-core CPU: sort
    16.1 s, ``np.median`` 5.2 s, this 1.6 s, load ~3.8).
    """
    count = x.shape[0] if rows is None else rows.size
    d = x.shape[1]
    lo, hi = (count - 1) // 2, count // 2
    width = max(1, min(d, _MEDIAN_BLOCK // count))
    tile = max(1, _TILE // width)
    buf = np.empty((width, count), dtype=x.dtype)
    out = np.empty(d, dtype=x.dtype)
    for j in range(0, d, width):
        cols = slice(j, min(d, j + width))
        block = buf[: cols.stop - j]
        for r in range(0, count, tile):
            src = x[r:r + tile, cols] if rows is None else x[rows[r:r + tile], cols]
            block[:, r:r + tile] = src.T
        block.partition(hi, axis=1)
        below = block[:, :hi].max(axis=1) if lo < hi else block[:, hi]
        out[cols] = 0.5 * (below + block[:, hi])
    return out


def match_step(points, mass, c, tau, metric: str):
    """One centroid iteration of Def. 3.

    ``points: (n, d)`` are what the gate looks at (domain sample means, or single samples),
    ``mass: (n,)`` how many samples each point stands for (``N_k`` for domains, 1 for samples, 0 for
    padding). Returns ``(c_next (d,), included (n,) 0/1, matched mass ())`` where ``c_next`` is the
    mean of all samples of the included points, or ``c`` itself when nothing is included.
    """
    xp = namespace(points, mass, c)
    inc = gate(distance(points, c, metric), tau) * xp.astype(mass > 0, points.dtype)
    c_next, total = weighted_mean(points, inc * mass, c)
    return c_next, inc, total


def iterate_match(points, mass, c0, tau, metric: str, *, tol: float, max_iter: int):
    """Iterate :func:`match_step` from ``c0`` to a fixed point ``||c_{t+1} - c_t||_2 < tol``.

    Returns ``(centroid (d,), included (n,), n_iter, converged, matched_mass)``. The centroid is
    the mean of the last matched set. If an iteration matches nothing, the loop stops, keeps the
    previous centroid and reports ``converged = False`` with an all-zero ``included`` -- an empty
    matched set never produces NaN. On jax.numpy the loop is a ``lax.while_loop`` (traceable under
    jit/vmap); on NumPy and torch it is a Python loop (torch keeps the autograd graph).

    Derivatives. The gate is a step function of the distances, so the included set is locally
    constant: near inputs where no point sits exactly on the radius, the centroid is the weighted
    mean of the points of the matched set that produced it, ``sum_i w_i p_i / sum_i w_i`` with
    ``w = included * mass`` fixed, and its derivative is that mean's (with respect to ``points``
    and ``mass``; 0 with respect to ``tau``, and to ``c0`` unless nothing was ever matched, when
    the centroid is ``c0`` itself). At the fixed point ``c* = F(c*)`` the implicit function
    theorem gives the same, since ``F`` does not vary with ``c`` where the set is constant. torch
    autograd through the Python loop computes exactly this; on JAX a ``custom_jvp`` gives it to
    ``jax.jvp``/``jacfwd`` and, by transposition, to ``jax.grad``/``vjp``/``jacrev`` (reverse
    mode, which a ``while_loop`` does not support by itself). The primal values are the loop's.
    """
    xp = namespace(points, mass, c0)
    if is_jax_namespace(xp):
        return _jax_iterate()(points, mass, c0, tau, tol, metric, max_iter)

    c = c0
    inc = xp.zeros(points.shape[0], dtype=points.dtype)
    total = xp.zeros((), dtype=points.dtype)
    for t in range(1, max_iter + 1):
        c_next, inc, total = match_step(points, mass, c, tau, metric)
        if bool(total <= 0):
            return c, inc, t, False, total
        moved = safe_norm(c_next - c)
        c = c_next
        if bool(moved < tol):
            return c, inc, t, True, total
    return c, inc, max_iter, False, total


def _jax_loop(points, mass, c0, tau, tol, metric: str, max_iter: int, *, track: bool):
    """:func:`iterate_match`'s ``lax.while_loop`` on jax.numpy arrays -> its five results, and with
    ``track`` also ``used (n,)``: the included set of the last step that matched something (all zeros
    if none did), the set whose weighted mean the centroid is."""
    import jax.numpy as xp
    from jax import lax

    n = points.shape[0]

    def cond(state):
        t, _, _, _, done, _ = state[:6]
        return (~done) & (t < max_iter)

    def body(state):
        t, c = state[:2]
        c_next, inc, total = match_step(points, mass, c, tau, metric)
        empty = total <= 0
        conv = safe_norm(c_next - c) < tol
        out = (t + 1, xp.where(empty, c, c_next), inc, total, empty | conv, conv & ~empty)
        return out + (xp.where(empty, state[6], inc),) if track else out

    zero = xp.zeros((), dtype=points.dtype)
    none = xp.zeros(n, dtype=points.dtype)
    init = (xp.asarray(0), c0, none, zero, xp.asarray(False), xp.asarray(False)) + ((none,) if track else ())
    state = lax.while_loop(cond, body, init)
    t, c, inc, total, _, converged = state[:6]
    return ((c, inc, t, converged, total), state[6]) if track else (c, inc, t, converged, total)


@functools.cache
def _jax_iterate():
    """:func:`_jax_loop` as a ``jax.custom_jvp`` function ``(points, mass, c0, tau, tol, metric,
    max_iter)``: the loop's values, the derivative of :func:`iterate_match`'s docstring. Built on first
    use, so that importing this module does not import JAX."""
    import jax
    import jax.numpy as jnp

    @functools.partial(jax.custom_jvp, nondiff_argnums=(5, 6))
    def iterate(points, mass, c0, tau, tol, metric, max_iter):
        return _jax_loop(points, mass, c0, tau, tol, metric, max_iter, track=False)

    @iterate.defjvp
    def iterate_jvp(metric, max_iter, primals, tangents):
        points, mass, c0, tau, tol = primals
        d_points, d_mass, d_c0 = tangents[:3]
        out, used = _jax_loop(points, mass, c0, tau, tol, metric, max_iter, track=True)
        c, inc, t, converged, total = out
        # c = sum_i w_i p_i / W (w = used * mass, W = sum w) where W > 0, else c0:
        # dc = (sum_i w_i dp_i + sum_i used_i dm_i (p_i - c)) / W
        w, dw = used * mass, used * d_mass
        W = jnp.sum(w)
        has = W > 0
        num = jnp.sum(w[:, None] * d_points, axis=0) + jnp.sum(dw[:, None] * (points - c), axis=0)
        dc = jnp.where(has, num / jnp.where(has, W, jnp.ones_like(W)), d_c0)
        float0 = jax.dtypes.float0
        tangent_out = (dc, jnp.zeros_like(inc), np.zeros(t.shape, float0), np.zeros(converged.shape, float0),
                       jnp.sum(inc * d_mass))
        return out, tangent_out

    return iterate


def running_update(c, count, x, tau, metric: str):
    """One step of the *running-mean* matching update analysed in the proof of Thm 3(3).

    A new point ``x: (d,)`` is accepted iff ``M(x - c) < tau``; then the centroid of a matched set
    of ``count`` points moves to ``(count c + x) / (count + 1)``, otherwise nothing changes.
    Returns ``(c_next (d,), count_next (), accepted () 0/1)``; leading batch axes broadcast
    (``c, x: (S, d)``, ``count: (S,)``). Unlike :func:`iterate_match` this
    never revisits earlier decisions, so an accepted step moves ``c`` by exactly
    ``||x - c|| / (count + 1)`` and a rejected step not at all.
    """
    xp = namespace(c, x)
    acc = gate(distance(x, c, metric), tau)
    c_next = c + xp.expand_dims(acc / (count + 1.0), axis=-1) * (x - c)
    return c_next, count + acc, acc


def exclusive_gate(dist, taus):
    """The paper's multimodal assignment (§"Extension to Multimodal Settings").

    ``dist: (n, M)`` distances of n points to M centroids, ``taus: (M,)`` radii -> ``(n, M)`` 0/1
    weights: point i goes to mode m iff ``dist[i, m] < taus[m]`` and ``dist[i, j] >= taus[j]``
    for every ``j != m`` (``g_m prod_{j != m} (1 - g_j)``, i.e. ``g_m`` times "exactly one gate
    open"). A point inside several balls, or none, gets an all-zero row (unassigned).
    """
    xp = namespace(dist)
    g = gate(dist, taus)
    only = xp.astype(xp.sum(g, axis=-1, keepdims=True) == 1, dist.dtype)
    return g * only


def multi_match_step(points, mass, C, taus, metric: str):
    """One iteration of multimodal matching: exclusive assignment, then a per-mode update.

    ``points: (n, d)``, ``mass: (n,)`` as in :func:`match_step`, ``C: (M, d)`` centroids,
    ``taus: (M,)``. Returns ``(C_next (M, d), assigned (n, M) 0/1, matched mass (M,))``; a mode
    that gets nothing keeps its centroid (the :func:`weighted_mean` fallback).
    """
    xp = namespace(points, mass, C)
    w = exclusive_gate(distance(points[:, None, :], C[None, :, :], metric), taus)
    w = w * xp.astype(mass > 0, points.dtype)[:, None]
    out = [weighted_mean(points, w[:, m] * mass, C[m]) for m in range(C.shape[0])]
    return xp.stack([c for c, _ in out]), w, xp.stack([t for _, t in out])

__all__ = [
    "METRICS", "namespace", "sum_squares", "safe_norm", "normalize", "cosine_similarity", "chord_angle",
    "geodesic", "distance", "gate", "weighted_mean", "ema_update", "slerp_update", "weighted_median",
    "match_step", "iterate_match", "running_update", "exclusive_gate", "multi_match_step"]
