"""Multimodal matching (paper §"Extension to Multimodal Settings", Lemma "Multimodal Reduction").

M centroids ``c_m`` with radii ``tau_m``; a point goes to mode m iff ``M(x - c_m) < tau_m`` and
``M(x - c_j) >= tau_j`` for every ``j != m`` (:func:`poolsim._core.exclusive_gate`); each centroid
is then the mean of the samples assigned to it (:func:`poolsim._core.multi_match_step`). Points
in no ball or in several balls are unassigned and reported. Built on :mod:`poolsim._core`.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from . import _checks, _core
from ._checks import to_numpy
from ._strategies import LEVELS, as_key, asarray_like, domain_means, prepare_domains, real_array

INITS = ("kmeans++", "kmeans++median")


class MultiMatched(NamedTuple):
    """Result of :func:`match_multimodal`.

    ``centroids: (M, d)`` -- each the mean of every sample assigned to its mode in the last step
    (or its previous value if the mode got nothing). ``assigned``: 0/1 weights ``(K, M)`` for
    ``level="domain"``, ``(K, N, M)`` for ``level="sample"``. ``labels``: mode index per point,
    ``-1`` for unassigned (``(K,)`` or ``(K, N)``). ``unassigned``: 0/1 per point (padding rows
    count as neither). ``n_matched: (M,)`` samples per mode. ``n_iter``: iterations run.
    ``converged``: the centroids moved less than ``tol`` and no mode is empty.
    """

    centroids: Any
    assigned: Any
    labels: Any
    unassigned: Any
    n_matched: Any
    n_iter: int
    converged: bool


def _taus(taus: Any) -> np.ndarray:
    t = np.atleast_1d(np.asarray(to_numpy(taus), dtype=float))
    if t.ndim != 1:
        raise ValueError(f"taus must be a 1-D sequence of M radii, got shape {t.shape}")
    if t.size == 0:
        raise ValueError("taus is empty: the number of modes M must be >= 1")
    if not np.all(np.isfinite(t)):
        raise ValueError("taus contains NaN or inf; every radius must be a finite number > 0")
    if np.any(t <= 0):
        raise ValueError(f"taus must all be > 0, got {t.tolist()}")
    return t


def _seed_from(key: Any) -> int:
    import jax

    return int(jax.random.randint(as_key(key), (), 0, 2**31 - 1))


def kmeanspp_init(points: np.ndarray, mass: np.ndarray, M: int, key: Any) -> np.ndarray:
    """k-means++ seeding (scikit-learn's ``kmeans_plusplus``, greedy variant, sample weights =
    ``mass``) of ``M`` centroids among ``points: (n, d)``; the random state is drawn from ``key``
    (int seed or JAX key), so the same key gives the same seeds."""
    from sklearn.cluster import kmeans_plusplus

    keep = mass > 0
    if int(keep.sum()) < M:
        raise ValueError(f"init='kmeans++' needs at least M = {M} points with mass > 0, "
                         f"got {int(keep.sum())}")
    centers, _ = kmeans_plusplus(points[keep], M, sample_weight=mass[keep],
                                 random_state=_seed_from(key))
    return centers


def _median_refine(points, mass, C, metric: str):
    """Replace each seed by the coordinate-wise median of the points nearest to it (its Voronoi
    cell, :func:`poolsim._core.weighted_median`); a seed whose cell is empty stays."""
    xp = _core.namespace(points, C)
    dist = _core.distance(points[:, None, :], C[None, :, :], metric)
    nearest = xp.argmin(dist, axis=1)
    rows = []
    for m in range(C.shape[0]):
        w = xp.astype(nearest == m, points.dtype) * xp.astype(mass > 0, points.dtype)
        rows.append(_core.weighted_median(points, w) if float(xp.sum(w)) > 0 else C[m])
    return xp.stack(rows)


def match_multimodal(X: Any, taus: Any, *, init: Any, metric: str = "l2", level: str = "domain",
                     key: Any = None, tol: float = 1e-4, max_iter: int = 100,
                     counts: Any = None) -> MultiMatched:
    """Multimodal matching of ``X: (K, N, d)`` with ``M = len(taus)`` modes.

    ``level="domain"``: each domain's sample mean is assigned (a domain belongs to one mode, all
    its samples follow); ``level="sample"``: every sample is assigned on its own (the paper's
    wording). ``init``: ``(M, d)`` initial centroids, or ``"kmeans++"`` -- k-means++ seeding
    (:func:`kmeanspp_init`) on the points being assigned, which needs ``key``; for
    ``metric="cosine"``/``"geodesic"`` the seeding runs on the unit-normalised points;
    ``"kmeans++median"`` (ours, the multimodal analogue of the paper's median initialisation) then
    moves each seed to the coordinate-wise median of the points nearest to it, so a seed that
    landed on an outlier returns to its cell's majority. Iterates
    exclusive assignment + per-mode means until every centroid moves less than ``tol`` (L2).

    The loop decides on the host (k-means++ seeding, the stopping rule), so JAX cannot trace it: under
    ``jax.jit``, ``vmap``, ``grad`` or ``jacfwd`` it raises ``TypeError``. On concrete arrays it runs
    on NumPy, JAX and torch, and torch autograd differentiates the centroids (the assignment is locally
    constant, as for :func:`poolsim.match`).
    """
    if any(_checks.is_tracer(a) for a in (X, taus, init, key, counts)):
        raise TypeError("match_multimodal cannot run under jax.jit, vmap, grad or jacfwd (its loop decides on "
                        "the host): call it on concrete NumPy, JAX or torch arrays (torch autograd works)")
    X, valid, cnt, xp = prepare_domains(X, counts)
    K, N, d = X.shape
    t = _taus(taus)
    M = t.size
    _checks.choice("metric", metric, _core.METRICS)
    _checks.choice("level", level, LEVELS)
    _checks.positive("tol", tol)
    max_iter = _checks.integer("max_iter", max_iter, 1)
    if level == "domain":
        points, mass = domain_means(X, valid, cnt), cnt
    else:
        points, mass = xp.reshape(X, (K * N, d)), xp.reshape(valid, (K * N,))
    if isinstance(init, str):
        _checks.choice("init", init, INITS)
        if key is None:
            raise ValueError(f"init={init!r} needs key (an int seed or a JAX key)")
        host = to_numpy(points)
        if metric != "l2":
            host = to_numpy(_core.normalize(points))
        C = asarray_like(X, kmeanspp_init(host, to_numpy(mass), M, key))
        if init == "kmeans++median":
            C = _median_refine(points, mass, C, metric)
    else:
        real_array("init", init if hasattr(init, "dtype") else np.asarray(init))
        c0 = np.asarray(to_numpy(init), dtype=float)
        if c0.ndim != 2:
            raise ValueError(f"init must be 'kmeans++' or an array of shape (M, d), got shape "
                             f"{c0.shape}")
        if c0.shape[0] != M:
            raise ValueError(f"len(taus) = {M} does not match M = {c0.shape[0]} (rows of init); "
                             "give one radius per mode")
        if c0.shape[1] != d:
            raise ValueError(f"init has dimension {c0.shape[1]} but X has dimension d = {d}")
        _checks.finite("init", c0)
        C = asarray_like(X, c0)
    tau = asarray_like(X, t)
    converged, n_iter = False, max_iter
    for n_iter in range(1, max_iter + 1):
        C_next, w, matched = _core.multi_match_step(points, mass, C, tau, metric)
        moved = float(to_numpy(xp.max(_core.safe_norm(C_next - C))))  # detached: no autograd warning
        C = C_next
        if moved < tol:
            converged = bool(xp.all(matched > 0))
            break
    labels = xp.where(xp.sum(w, axis=-1) > 0, xp.argmax(w, axis=-1),
                      xp.full(w.shape[:-1], -1, dtype=xp.argmax(w, axis=-1).dtype))
    live = xp.astype(mass > 0, w.dtype)
    unassigned = (1.0 - xp.sum(w, axis=-1)) * live
    if level == "sample":
        w, labels, unassigned = (xp.reshape(w, (K, N, M)), xp.reshape(labels, (K, N)),
                                 xp.reshape(unassigned, (K, N)))
    return MultiMatched(C, w, labels, unassigned, matched, n_iter, converged)
