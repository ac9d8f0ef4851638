"""Hypothesis strategies for property-testing pooling rules (needs ``pip install hypothesis``).

Import it explicitly (``import poolsim.testing``); ``import poolsim`` does not pull in hypothesis.
Every strategy draws arrays of a *fixed* shape, so a JIT-compiled rule under test compiles once::

    from hypothesis import given, settings
    from poolsim.testing import domain_collections

    @settings(deadline=None, max_examples=50)
    @given(domain_collections(K=6, N=4, d=2))
    def test_my_rule_is_permutation_invariant(X):
        ...

Strategies: :func:`domain_collections` ``(K, N, d)`` arrays, :func:`permutations` of domains,
:func:`meta_distributions` (:class:`poolsim.metadist.MetaDist`), :func:`metrics` (names),
:func:`metric_cases` (a metric with its bi-Lipschitz constants and the set where they hold) and
:func:`admissible_pairs` (a centroid and a point inside that set).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from . import _core, metadist
from .theory import cap_constants

__all__ = ["domain_collections", "permutations", "meta_distributions", "metrics", "MetricCase",
           "metric_cases", "admissible_pairs", "unit_vectors"]


def _floats(bound: float):
    return st.floats(-bound, bound, allow_nan=False, allow_infinity=False, allow_subnormal=False)


def domain_collections(K: int, N: int, d: int, *, bound: float = 10.0):
    """``(K, N, d)`` float64 arrays with entries in ``[-bound, bound]`` (no NaN/inf)."""
    return hnp.arrays(np.float64, (K, N, d), elements=_floats(bound))


def permutations(K: int):
    """A permutation of ``range(K)`` as an int array ``(K,)``."""
    return st.permutations(range(K)).map(np.asarray)


def meta_distributions(d: int, *, kinds=("symmetric_gaussian", "balanced", "contaminated", "skewed")):
    """A :class:`~poolsim.metadist.MetaDist` of dimension ``d``, one of ``kinds``, with drawn
    parameters (spreads in [0.1, 2], contamination p in [0, 0.5], shift in [0, 5])."""
    spread = st.floats(0.1, 2.0)
    makers = {
        "symmetric_gaussian": st.builds(lambda g: metadist.symmetric_gaussian(g, d=d), spread),
        "balanced": st.builds(lambda g: metadist.balanced(g, d=d), spread),
        "contaminated": st.builds(lambda p, a, g: metadist.contaminated(p, a, d=d, gamma=g),
                                  st.floats(0.0, 0.5), st.floats(0.0, 5.0), spread),
        "skewed": st.builds(lambda s, g: metadist.skewed(s, d=d, gamma=g), spread, spread),
    }
    unknown = set(kinds) - set(makers)
    if unknown:
        raise ValueError(f"kinds must be among {tuple(makers)}, got unknown {sorted(unknown)}")
    return st.one_of(*(makers[k] for k in kinds))


def metrics():
    """One of :data:`poolsim._core.METRICS`."""
    return st.sampled_from(_core.METRICS)


class MetricCase(NamedTuple):
    """A matching function ``M(x, c) = scale * distance(x, c, metric)`` with constants
    ``m_M ||x - c|| <= M <= L_M ||x - c||`` valid for the pairs :func:`admissible_pairs` draws:
    any pair for L2; unit vectors at an angle in ``[theta_min, theta]`` for cosine/geodesic."""

    name: str
    metric: str
    scale: float
    m_M: float
    L_M: float
    on_sphere: bool
    theta_min: float
    theta: float

    def __call__(self, x, c):
        return self.scale * _core.distance(x, c, self.metric)


def metric_cases():
    """L2, scaled L2 (``M = s ||.||``, s in [0.1, 10]), and the cap-restricted geodesic and cosine
    metrics (cap angle theta in [0.2, pi]; cosine on an annulus theta_min in [0.05, theta/2])."""
    l2 = st.just(MetricCase("l2", "l2", 1.0, 1.0, 1.0, False, 0.0, math.pi))
    scaled = st.floats(0.1, 10.0).map(lambda s: MetricCase(f"{s:.3g}*l2", "l2", s, s, s, False, 0.0,
                                                           math.pi))

    def sphere(metric, th, frac):
        th0 = frac * th
        m, L = cap_constants(metric, th, theta_min=th0)
        return MetricCase(f"{metric}@cap", metric, 1.0, m, L, True, th0, th)

    geo = st.builds(lambda th: sphere("geodesic", th, 0.0), st.floats(0.2, math.pi))
    cos = st.builds(lambda th, f: sphere("cosine", th, f), st.floats(0.2, math.pi), st.floats(0.05, 0.5))
    return st.one_of(l2, scaled, geo, cos)


def unit_vectors(d: int):
    """Unit vectors of ``R^d`` (normalised draws bounded away from 0)."""
    return hnp.arrays(np.float64, (d,), elements=_floats(1.0)).filter(
        lambda v: np.linalg.norm(v) > 0.1).map(lambda v: v / np.linalg.norm(v))


@st.composite
def admissible_pairs(draw, case: MetricCase, d: int, *, bound: float = 5.0):
    """``(c, x)`` of shape ``(d,), (d,)`` inside the set where ``case``'s constants hold. For a
    sphere case ``c`` is a unit vector and ``x`` the unit vector at a drawn angle in
    ``[theta_min, theta]`` from it (``d >= 2``)."""
    if not case.on_sphere:
        c = draw(hnp.arrays(np.float64, (d,), elements=_floats(bound)))
        x = draw(hnp.arrays(np.float64, (d,), elements=_floats(bound)))
        return c, x
    if d < 2:
        raise ValueError("sphere metric cases need d >= 2")
    c = draw(unit_vectors(d))
    w = draw(unit_vectors(d).filter(lambda w: abs(float(w @ c)) < 0.95))
    w = w - (w @ c) * c
    w = w / np.linalg.norm(w)
    t = draw(st.floats(case.theta_min, case.theta))
    return c, math.cos(t) * c + math.sin(t) * w
