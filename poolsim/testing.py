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
:func:`metric_cases` (a metric with its bi-Lipschitz constants and the set where they hold),
:func:`admissible_pairs` (a centroid and a point inside that set) and :func:`finite_floats` (the
one float strategy the others use, whose domain is explicit). :func:`examples` scales a test's
example budget with the active hypothesis profile.

Profiles. Importing this module registers the hypothesis profile ``deep`` (:data:`DEEP`: 50x the
examples, fresh random ones on every run, failures kept in hypothesis' example database and replayed
first; for hunting counterexamples, not for CI). :func:`load_profile` loads the profile named by the
environment variable ``HYPOTHESIS_PROFILE``, so a test suite's ``conftest.py`` makes it selectable with::

    import poolsim.testing

    poolsim.testing.load_profile()     # HYPOTHESIS_PROFILE=deep python -m pytest ...

(or ``pytest --hypothesis-profile=deep`` with ``import poolsim.testing`` in ``conftest.py``).

Float domains. Every float these strategies draw is finite (no NaN, no inf) and inside the stated
bounds, so huge values (overflowing squares, ``x * x = inf`` beyond ~1.3e154) are out of the domain
unless a bound lets them in. Zero is in the domain whenever the bounds contain it (zero vectors and
coinciding points are exactly the singular cases the core must handle). Subnormals
(``0 < |x| < 2.2e-308``) are *out* of the domain by default: XLA on CPU flushes them to zero (JAX
computes ``5e-324 * 1.0 = 0.0`` where NumPy keeps 5e-324), so a claim checked across backends
cannot hold for them, and in float64 they carry fewer than 53 significant bits, so a bound built
from them (a product, a norm) loses its relative precision. A test whose claim does hold for them
passes ``subnormal=True`` to :func:`finite_floats` and says so in its docstring.
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
           "metric_cases", "admissible_pairs", "unit_vectors", "finite_floats", "examples", "DEEP",
           "register_profiles", "load_profile"]

DEEP = "deep"
"""The name of the hypothesis profile :func:`register_profiles` registers: ``max_examples = 5000``
(50x hypothesis' default, so every :func:`examples` budget times 50), ``derandomize=False``, no deadline,
the too-slow health check off, failures saved to and replayed from the example database."""


def register_profiles() -> None:
    """Register the :data:`DEEP` hypothesis profile (done on import of this module; again is harmless)."""
    from hypothesis import HealthCheck, settings

    settings.register_profile(DEEP, max_examples=100 * 50, derandomize=False, deadline=None,
                              print_blob=True, suppress_health_check=[HealthCheck.too_slow])


def load_profile(name: str | None = None) -> str:
    """Load the hypothesis profile ``name`` (default: the environment variable ``HYPOTHESIS_PROFILE``,
    else hypothesis' ``default``) and return its name; ValueError if no such profile is registered."""
    import os

    from hypothesis import settings
    from hypothesis.errors import InvalidArgument

    register_profiles()
    chosen = name if name is not None else os.environ.get("HYPOTHESIS_PROFILE", "default")
    try:
        settings.get_profile(chosen)  # first: a failed load_profile would leave the name set
    except InvalidArgument:
        raise ValueError(f"hypothesis profile {chosen!r} is not registered (this module registers "
                         f"{DEEP!r}; hypothesis has 'default'; settings.register_profile adds one)") from None
    settings.load_profile(chosen)
    return chosen


register_profiles()


def examples(n: int) -> int:
    """A test's example budget ``n`` scaled by the active profile: ``n * max_examples / 100``.

    ``@settings(max_examples=n)`` on a test overrides the profile, so a profile alone cannot ask for
    more examples; write ``@settings(max_examples=examples(n))`` instead. Under hypothesis' default
    ``max_examples = 100`` this is ``n``; under the :data:`DEEP` profile (``max_examples = 5000``,
    ``HYPOTHESIS_PROFILE=deep`` with :func:`load_profile`) it is ``50 n``.
    """
    from hypothesis import settings

    return max(1, round(n * settings().max_examples / 100))


def finite_floats(lo: float, hi: float, *, subnormal: bool = False):
    """Floats in ``[lo, hi]``: never NaN or inf, zero included iff ``lo <= 0 <= hi``, subnormals
    (``0 < |x| < 2.2e-308``) only with ``subnormal=True`` (see the module docstring for why they
    are out by default)."""
    return st.floats(lo, hi, allow_nan=False, allow_infinity=False, allow_subnormal=subnormal)


def _floats(bound: float):
    return finite_floats(-bound, bound)


def domain_collections(K: int, N: int, d: int, *, bound: float = 10.0):
    """``(K, N, d)`` float64 arrays with entries in ``[-bound, bound]``: zero included, no
    subnormals, no NaN/inf, nothing beyond ``bound``."""
    return hnp.arrays(np.float64, (K, N, d), elements=_floats(bound))


def permutations(K: int):
    """A permutation of ``range(K)`` as an int array ``(K,)``."""
    return st.permutations(range(K)).map(np.asarray)


def meta_distributions(d: int, *, kinds=("symmetric_gaussian", "balanced", "contaminated", "skewed")):
    """A :class:`~poolsim.metadist.MetaDist` of dimension ``d``, one of ``kinds``, with drawn
    parameters (spreads in [0.1, 2], contamination p in [0, 0.5], shift in [0, 5]; p = 0 and
    shift = 0, i.e. no contamination, are included, subnormals are not)."""
    spread = finite_floats(0.1, 2.0)
    makers = {
        "symmetric_gaussian": st.builds(lambda g: metadist.symmetric_gaussian(g, d=d), spread),
        "balanced": st.builds(lambda g: metadist.balanced(g, d=d), spread),
        "contaminated": st.builds(lambda p, a, g: metadist.contaminated(p, a, d=d, gamma=g),
                                  finite_floats(0.0, 0.5), finite_floats(0.0, 5.0), spread),
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
    scaled = finite_floats(0.1, 10.0).map(lambda s: MetricCase(f"{s:.3g}*l2", "l2", s, s, s, False, 0.0,
                                                           math.pi))

    def sphere(metric, th, frac):
        th0 = frac * th
        m, L = cap_constants(metric, th, theta_min=th0)
        return MetricCase(f"{metric}@cap", metric, 1.0, m, L, True, th0, th)

    angle = finite_floats(0.2, math.pi)
    geo = st.builds(lambda th: sphere("geodesic", th, 0.0), angle)
    cos = st.builds(lambda th, f: sphere("cosine", th, f), angle, finite_floats(0.05, 0.5))
    return st.one_of(l2, scaled, geo, cos)


def unit_vectors(d: int):
    """Unit vectors of ``R^d`` (normalised draws of norm > 0.1; coordinates may be exactly 0)."""
    return hnp.arrays(np.float64, (d,), elements=_floats(1.0)).filter(
        lambda v: np.linalg.norm(v) > 0.1).map(lambda v: v / np.linalg.norm(v))


@st.composite
def admissible_pairs(draw, case: MetricCase, d: int, *, bound: float = 5.0):
    """``(c, x)`` of shape ``(d,), (d,)`` inside the set where ``case``'s constants hold. For a
    sphere case ``c`` is a unit vector and ``x`` the unit vector at a drawn angle in
    ``[theta_min, theta]`` from it (``d >= 2``). Off the sphere the coordinates are in
    ``[-bound, bound]``, zero included (``c = x`` and zero vectors are drawn), no subnormals."""
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
    t = draw(finite_floats(case.theta_min, case.theta))
    return c, math.cos(t) * c + math.sin(t) * w
