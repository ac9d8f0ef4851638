"""The engine's static description of a run (:class:`Spec`) and its per-seed result (:class:`SeedResult`)."""
from __future__ import annotations

import os
from typing import Any, Callable, NamedTuple

STRATEGIES = ("pool", "subsample", "match")


class Spec(NamedTuple):
    """Static description of one experiment run (hashable: it keys the compiled-function cache).

    ``sample_means``: ``key -> (K_max, d)`` (the meta-distribution's sampler); a sampler with a
    ``store_key`` string attribute (equal strings: samplers that trace alike in every process with
    the same poolsim source) lets the compiled programs be stored across processes
    (:func:`store_ident`, :mod:`poolsim._programs`). ``Ks``: increasing K
    values. ``init``: "median" | "mean" | "target". ``m_frac``: subsampling takes
    ``m = ceil(m_frac K)`` domains, ``n_sub`` points each.
    """

    sample_means: Callable
    K_max: int
    d: int
    Ks: tuple
    n: int
    sigma: float
    tau: float
    metric: str
    init: str
    tol: float
    max_iter: int
    m_frac: float
    n_sub: int
    mu_star: tuple
    materialize: bool


PATH_ENV = "POOLSIM_ENGINE_PATH"
PATHS = ("auto", "cpu", "accelerator")


def accelerator_path() -> bool:
    """Whether the engine runs its accelerator path: the materialised path's sample medians inside
    the estimates program (pure XLA, :func:`poolsim._engine.medians.prefix_medians`) instead of on
    the host between the two programs, matching's loop without compaction stages, and every chunk's
    results kept on the device and copied to the host once at the end. Chosen by the environment
    variable :data:`PATH_ENV` (``POOLSIM_ENGINE_PATH``): ``auto`` (default) -- on an accelerator
    backend, not on a CPU; ``accelerator`` -- on any backend, so the path a GPU runs is run, tested
    and its programs counted on a CPU; ``cpu`` -- the CPU path everywhere. Both paths give the same
    numbers (the same order statistics and per-seed operations; the test compares them)."""
    value = os.environ.get(PATH_ENV, "auto").strip().lower() or "auto"
    if value not in PATHS:
        raise ValueError(f"environment variable {PATH_ENV} must be one of {PATHS}, got {value!r}")
    if value == "auto":
        import jax

        return jax.default_backend() != "cpu"
    return value == "accelerator"


class SeedResult(NamedTuple):
    """Per seed (leading axis S after vmap): ``estimates (nK, 3, d)`` for pool/subsample/match,
    ``n_domains (nK, 3)`` domains used, ``converged (nK,)``, ``n_iter (nK,)`` for matching,
    ``included (nK, K_max)`` matching's domain flags (bool: a quarter of float32's bytes, and the largest
    per-seed field -- 780 of 2,326 bytes per seed at the paper's parameters), ``means (K_max, d)`` the true domain means,
    ``xbar (K_max, d)`` the domain sample means."""

    estimates: Any
    n_domains: Any
    converged: Any
    n_iter: Any
    included: Any
    means: Any
    xbar: Any


# The K steps' layout. Step K reads the first K domains; it is evaluated over the first W >= K of
# them, masked, with W one of a few widths, so that a step costs O(W) <= O(2 K) and the number of
# distinct widths (traced code paths) is at most log2(K_max) + 1. Up to ``FULL_WIDTH`` domains every
# step is evaluated over all K_max of them (one width: the paper's sizes, where one masked layout
# is cheapest and the programs stay small).
FULL_WIDTH = 128
MIN_WIDTH = 8


def widths(spec: Spec) -> tuple:
    """The width W of every K step (see :data:`FULL_WIDTH`): ``K_max`` for all steps when
    ``K_max <= FULL_WIDTH``, else the power of two ``>= K`` (at least :data:`MIN_WIDTH`), capped at
    ``K_max``."""
    if spec.K_max <= FULL_WIDTH:
        return (spec.K_max,) * len(spec.Ks)
    return tuple(min(spec.K_max, max(MIN_WIDTH, 1 << (K - 1).bit_length())) for K in spec.Ks)


class Group(NamedTuple):
    """K steps ``start:stop`` (indices into ``Ks``), all of width ``W``; ``Ks`` their K values."""

    start: int
    stop: int
    W: int
    Ks: tuple


def groups(spec: Spec) -> tuple:
    """The runs of consecutive K steps of one width (:func:`widths`), in order: :class:`Group`\\ s."""
    w = widths(spec)
    out, start = [], 0
    for i in range(1, len(w) + 1):
        if i == len(w) or w[i] != w[start]:
            out.append(Group(start, i, w[start], tuple(spec.Ks[start:i])))
            start = i
    return tuple(out)
