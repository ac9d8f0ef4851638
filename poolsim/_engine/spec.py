"""The engine's static description of a run (:class:`Spec`) and its per-seed result (:class:`SeedResult`)."""
from __future__ import annotations

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
