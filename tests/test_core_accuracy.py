"""Accuracy of the matching core (poolsim._core) against a high-precision oracle.

Every routine with a guarded or approximated branch is compared with the same formula evaluated by
``mpmath`` at 50 significant digits on the *same* floating-point inputs (a float32 input is the
float32 number, converted exactly), over the whole range the core is used on: angles between
``1e-8`` and ``pi - 1e-6``, EMA/slerp fractions ``alpha`` over ``[0, 1]``, widths ``d = 2 .. 768``,
float32 and float64, NumPy and torch.

Each tolerance is a bound derived from the routine's formula, written as a multiple of the unit
roundoff ``u`` (``2^-24`` in float32, ``2^-53`` in float64) in the test's docstring. The bounds use
the worst-case error of a floating-point sum of ``d`` terms, ``gamma_d = d u / (1 - d u) ~ d u``
(recursive summation; the pairwise and blocked sums that NumPy and torch use are within it), and
first-order terms only: every bound below is far above ``u^2`` terms (``d u <= 768 * 2^-24 ~ 5e-5``).
A bound is a statement about the formula, not about today's output; where the formula is
ill-conditioned (cosine distance near 0, the EMA and slerp near antipodal inputs) the bound grows
with the condition number as derived, and is then vacuous rather than fitted.
"""
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="these tests bound the core's error on NumPy and torch: the adsim extra")
import mpmath  # noqa: E402
from hypothesis import given, settings
from hypothesis import strategies as st

from poolsim import _core
from poolsim.testing import examples, finite_floats

DPS = 50  # mpmath's working precision (decimal digits) for every oracle below
U = {np.float32: 2.0 ** -24, np.float64: 2.0 ** -53}  # unit roundoff
BACKENDS = ("numpy", "torch")


def _to(backend, a):
    return torch.from_numpy(np.array(a)) if backend == "torch" else np.array(a)


def _host(a):
    return a.numpy() if torch.is_tensor(a) else np.asarray(a)


# ---------------------------------------------------------------- the oracle (mpmath, 50 digits)

def _mp(v):
    """Exact mpmath copy of a float vector (float32 and float64 numbers are exact in mpmath)."""
    return [mpmath.mpf(float(x)) for x in np.asarray(v).ravel()]


def _norm(v):
    return mpmath.sqrt(mpmath.fsum(x * x for x in v))


def _unit(v):
    n = _norm(v)
    return [x / n for x in v]


def _angle(a, b):
    """Exact angle between the directions of mpmath vectors ``a, b`` (chord form: well-conditioned
    at 0 and pi at 50 digits)."""
    ua, ub = _unit(a), _unit(b)
    y = _norm([p - q for p, q in zip(ua, ub)])
    x = _norm([p + q for p, q in zip(ua, ub)])
    return 2 * mpmath.atan2(y, x)


# ---------------------------------------------------------------- inputs

@st.composite
def angles(draw):
    """An angle in ``[1e-8, pi - 1e-6]``: log-uniform near 0, log-uniform near pi, or uniform."""
    kind = draw(st.sampled_from(("near0", "nearpi", "uniform")))
    if kind == "near0":
        return 10.0 ** draw(finite_floats(-8.0, 0.0))
    if kind == "nearpi":
        return math.pi - 10.0 ** draw(finite_floats(-6.0, 0.0))
    return draw(finite_floats(1e-8, math.pi - 1e-6))


@st.composite
def pairs(draw, *, scaled=True):
    """``(a, b, dtype, d)``: two vectors of ``R^d`` at (about) a drawn angle, cast to the dtype.

    Built in float64 as ``a = s_a u``, ``b = s_b (cos t u + sin t w)`` with ``u, w`` random
    orthonormal, then rounded to the dtype; the oracle uses the rounded vectors, so the drawn angle
    only steers where the inputs lie. ``scaled``: norms ``s`` in ``[2^-10, 2^10]``, else 1."""
    d = draw(st.sampled_from((2, 3, 5, 17, 64, 768)) | st.integers(2, 768))
    dtype = draw(st.sampled_from((np.float32, np.float64)))
    t = draw(angles())
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    q, _ = np.linalg.qr(rng.standard_normal((d, 2)))
    u, w = q[:, 0], q[:, 1]
    sa, sb = (2.0 ** draw(st.integers(-10, 10)) for _ in range(2)) if scaled else (1.0, 1.0)
    a = (sa * u).astype(dtype)
    b = (sb * (math.cos(t) * u + math.sin(t) * w)).astype(dtype)
    return a, b, dtype, d


# ---------------------------------------------------------------- geodesic / chord angle

def geodesic_bound(d, u):
    """``|theta_hat - theta| <= (2d + 16) u`` for :func:`_core.geodesic` of two nonzero vectors.

    ``theta`` is the exact angle of the inputs. Error budget of ``2 atan2(||u^ - v^||, ||u^ + v^||)``:

    * ``normalize``: each coordinate of ``u^ = a / sqrt(sum a_i^2)`` is ``(a_i / ||a||)(1 + rho)(1 +
      delta_i)`` with one scalar ``|rho| <= (d/2 + 1) u`` (the sum of squares ``gamma_d``, halved by
      the square root, plus its rounding) and ``|delta_i| <= u`` (the division). ``delta`` turns each
      direction by at most ``u``: ``2u``.
    * ``rho`` leaves the directions alone but makes the norms ``r_a, r_b`` differ by
      ``e = |rho_a - rho_b| <= (d + 2) u``; then ``||u^ -+ v^||^2 = e^2 + 4 r_a r_b {sin, cos}^2(theta/2)``,
      which moves ``2 atan(y / x)`` by at most ``e``: ``(d + 2) u``.
    * each chord is a difference (``u``), a sum of ``d`` squares (``gamma_d``) and a square root
      (halves it, plus ``u``): relative ``(d/2 + 2.5) u``; relative errors ``eps_y, eps_x`` move the
      angle by ``sin(theta) |eps_y - eps_x| <= (d + 5) u``.
    * ``atan2`` (libm, sleef: within 2 ulp) on a result ``<= pi/2``, doubled exactly: ``<= 2 pi u``.

    Sum: ``(2d + 9 + 2 pi) u < (2d + 16) u``. It is absolute, not relative: for tiny angles the
    rounding of the inputs' norms alone is ``~d u`` (an ``arccos`` of the cosine would be off by
    ``sqrt(2 d u)`` there, far beyond it)."""
    return (2 * d + 16) * u


@settings(max_examples=examples(60))
@given(pairs(), st.sampled_from(BACKENDS))
def test_geodesic_against_mpmath(case, backend):
    a, b, dtype, d = case
    got = _host(_core.geodesic(_to(backend, a), _to(backend, b)))
    assert got.dtype == dtype
    with mpmath.workdps(DPS):
        exact = _angle(_mp(a), _mp(b))
        err = abs(mpmath.mpf(float(got)) - exact)
    assert err <= geodesic_bound(d, U[dtype]), (float(exact), float(got), float(err))
    # the same number through distance() and chord_angle() (one formula, three entry points)
    assert _host(_core.distance(_to(backend, a), _to(backend, b), "geodesic")) == got


def test_geodesic_exact_cases():
    """Closed forms: identical vectors (0), opposite (pi), orthogonal (pi/2), a zero vector (pi/2 by
    ``cosine_similarity``'s convention, ``chord_angle``'s both-zero rule)."""
    for dtype in (np.float32, np.float64):
        e0, e1 = np.eye(3, dtype=dtype)[:2]
        got = [float(_core.geodesic(p, q)) for p, q in ((e0, e0), (e0, -e0), (e0, e1), (0 * e0, e1),
                                                         (0 * e0, 0 * e0))]
        assert got[0] == 0.0
        assert abs(got[1] - math.pi) <= 2 * math.pi * U[dtype]  # pi rounded to the dtype, 2 ulp atan2
        for g in got[2:]:
            assert abs(g - math.pi / 2) <= math.pi * U[dtype]


# ---------------------------------------------------------------- cosine distance, norms

def cosine_bound(d, u):
    """``|(1 - cos)_hat - (1 - cos)| <= (2d + 8) u`` (absolute) for ``distance(., ., "cosine")``.

    ``cos = sum u^_i v^_i`` of the normalised vectors: each ``u^_i`` has relative error ``(d/2 + 2) u``
    (:func:`geodesic_bound`'s ``rho`` and ``delta``), so each product ``(d + 5) u`` with its rounding,
    and the sum adds ``gamma_d``; with ``sum |u_i v_i| <= 1`` that is ``(2d + 5) u`` absolute. The clip
    to ``[-1, 1]`` only moves the value towards the exact one; ``1 - cos`` adds ``u (1 - cos) <= 2u``.
    Total ``(2d + 7) u``. Absolute: near ``theta = 0`` the distance ``~theta^2 / 2`` is below it, the
    cancellation of ``1 - cos`` (the reason the geodesic metric uses chords)."""
    return (2 * d + 8) * u


@settings(max_examples=examples(40))
@given(pairs(), st.sampled_from(BACKENDS))
def test_cosine_distance_against_mpmath(case, backend):
    a, b, dtype, d = case
    got = _host(_core.distance(_to(backend, a), _to(backend, b), "cosine"))
    assert got.dtype == dtype
    with mpmath.workdps(DPS):
        ua, ub = _unit(_mp(a)), _unit(_mp(b))
        exact = 1 - mpmath.fsum(p * q for p, q in zip(ua, ub))
        err = abs(mpmath.mpf(float(got)) - exact)
    assert err <= cosine_bound(d, U[dtype]), (float(exact), float(got))
    assert 0.0 <= float(got) <= 2.0


@settings(max_examples=examples(40))
@given(pairs(), st.sampled_from(BACKENDS))
def test_norm_and_normalize_against_mpmath(case, backend):
    """``safe_norm``: relative error ``<= (d/2 + 2) u`` (a sum of ``d`` squares, ``gamma_d``, halved by
    the square root, plus the square root's rounding; ``+ u`` of slack for the squares' own rounding).
    ``normalize``: every coordinate relative ``<= (d/2 + 3) u`` (that norm and one division). The
    ``l2`` distance is ``safe_norm(x - c)``: the same bound on the rounded difference, whose rounding
    adds at most ``u`` per coordinate: ``(d/2 + 3) u`` of ``||x - c||``."""
    a, b, dtype, d = case
    u = U[dtype]
    A, B = _to(backend, a), _to(backend, b)
    n = float(_host(_core.safe_norm(A)))
    unit = _host(_core.normalize(A))
    l2 = float(_host(_core.distance(A, B, "l2")))
    with mpmath.workdps(DPS):
        ma, mb = _mp(a), _mp(b)
        exact_n = _norm(ma)
        assert abs(n - exact_n) <= (d / 2 + 2) * u * exact_n
        for got, ex in zip(unit, _unit(ma)):
            assert abs(mpmath.mpf(float(got)) - ex) <= (d / 2 + 3) * u * abs(ex)
        exact_l2 = _norm([p - q for p, q in zip(ma, mb)])
        assert abs(l2 - exact_l2) <= (d / 2 + 3) * u * exact_l2


def test_zero_vectors_norm_normalize_and_gradient():
    """The guarded branches at ``x = 0``: ``||0|| = 0`` with gradient 0 (``safe_norm``'s double
    ``where``), and ``normalize(0) = 0 / sqrt(1) = 0`` whose Jacobian there is the identity (finite,
    from the same formula), so ``d sum(normalize(x)) / dx = 1`` at 0."""
    for dtype in (torch.float32, torch.float64):
        z = torch.zeros(4, dtype=dtype, requires_grad=True)
        n = _core.safe_norm(z)
        (gn,) = torch.autograd.grad(n, z)
        unit = _core.normalize(z)
        (gu,) = torch.autograd.grad(unit.sum(), z)
        assert n.item() == 0.0 and torch.equal(unit.detach(), torch.zeros(4, dtype=dtype))
        assert torch.equal(gn, torch.zeros(4, dtype=dtype)) and torch.equal(gu, torch.ones(4, dtype=dtype))


# ---------------------------------------------------------------- EMA update

@settings(max_examples=examples(50))
@given(pairs(scaled=False), finite_floats(0.0, 1.0), st.sampled_from(BACKENDS))
def test_ema_update_against_mpmath(case, alpha, backend):
    """``alpha c + (1 - alpha) f``, then renormalised (``ema_update``), for unit ``c, f`` (rounded to
    the dtype) and ``alpha`` over ``[0, 1]``.

    Without renormalisation each coordinate is ``fl(fl(alpha) c_i) + fl(fl(beta) f_i)`` (``beta = 1 -
    alpha`` in float64, whose own rounding is ``<= u``): ``alpha`` and ``beta`` rounded to the dtype,
    two products, one sum: ``|error_i| <= 3u (alpha |c_i| + beta |f_i|)``; in norm ``<= 3u (alpha ||c|| +
    beta ||f||)``. Renormalised: that vector error turns the direction by at most ``3u (alpha ||c|| +
    beta ||f||) / ||alpha c + beta f||`` (the condition number of the direction: large where the sum
    cancels, ``alpha`` near 1/2 and ``c, f`` near antipodal) plus ``u`` for the division, and the
    result's norm is 1 within ``(d/2 + 2) u`` (``normalize``)."""
    c, f, dtype, d = case
    u = U[dtype]
    C, F = _to(backend, c), _to(backend, f)
    raw = _host(_core.ema_update(C, F, alpha, renormalize=False))
    out = _host(_core.ema_update(C, F, alpha))
    assert raw.dtype == out.dtype == dtype
    with mpmath.workdps(DPS):
        mc, mf = _mp(c), _mp(f)
        al = mpmath.mpf(alpha)
        exact = [al * p + (1 - al) * q for p, q in zip(mc, mf)]
        for got, ex, p, q in zip(raw, exact, mc, mf):
            assert abs(mpmath.mpf(float(got)) - ex) <= 3 * u * (al * abs(p) + (1 - al) * abs(q))
        r = _norm(exact)
        if r == 0:
            return  # alpha c + beta f cancels exactly: ema_update keeps c (test_ema_antipodal_keeps_c)
        cond = 3 * u * (al * _norm(mc) + (1 - al) * _norm(mf)) / r
        err = _angle(_mp(out), exact)
        assert err <= cond + 2 * u, (float(err), float(cond))
        assert abs(_norm(_mp(out)) - 1) <= (d / 2 + 2) * u


def test_ema_antipodal_keeps_c_and_zero_c_becomes_unit_f():
    """The two guarded branches of the renormalised EMA, exactly: ``c~ = 0`` (``c = -f``, alpha 1/2:
    0/0) returns ``c``; a zero ``c`` gives ``f / ||f||``."""
    for dtype in (np.float32, np.float64):
        c = np.array([0.6, -0.8, 0.0], dtype=dtype)
        assert np.array_equal(_core.ema_update(c, -c, 0.5), c)
        f = np.array([3.0, 4.0, 0.0], dtype=dtype)
        assert np.array_equal(_core.ema_update(0 * c, f, 0.3), f / dtype(5.0))


# ---------------------------------------------------------------- slerp

def _slerp_case(c, f, alpha, dtype, d, out, ema):
    """Check one ``slerp_update`` output against the exact slerp (see the test's docstring)."""
    u = U[dtype]
    with mpmath.workdps(DPS):
        mc, mf, mo = _mp(c), _mp(f), _mp(out)
        t = _angle(mc, mf)
        st_, tf = mpmath.sin(t), float(t)
        margin = (geodesic_bound(d, u) + 2 * u) * 2  # how far the computed sin t may be from sin t
        if tf > 1.0 and st_ < 1e-6 - margin:  # antipodal: the documented EMA fallback, exactly
            assert np.array_equal(out, ema)
            return "fallback"
        if tf > 1.0 and st_ <= 1e-6 + margin:  # either branch, depending on the rounding of t
            if np.array_equal(out, ema):
                return "either"
        al = mpmath.mpf(alpha)
        g = al * mpmath.sin((1 - al) * t) * mpmath.cos(al * t) - (1 - al) * mpmath.sin(al * t) * mpmath.cos((1 - al) * t)
        dt = geodesic_bound(d, u) + 2 * u
        cond = abs(g) / st_ if st_ > 0 else 0  # g / sin t -> 0 as t -> 0 (g = O(t^3))
        bound = 2 * (cond * dt + 9 * u + (d / 2 + 3) * u / mpmath.cos(t / 2))
        if tf < 2e-6:
            bound += t ** 3  # the small-angle branch's linear weights
        phi_c, phi_f = _angle(mc, mo), _angle(mf, mo)
        assert abs(phi_c - (1 - al) * t) <= bound, (tf, alpha, float(phi_c), float((1 - al) * t), float(bound))
        assert abs(phi_f - al * t) <= bound, (tf, alpha, float(phi_f), float(al * t), float(bound))
        assert abs(_norm(mo) - 1) <= (d / 2 + 2) * u
    return "slerp"


@settings(max_examples=examples(60))
@given(pairs(), finite_floats(0.0, 1.0), st.sampled_from(BACKENDS))
def test_slerp_update_against_mpmath(case, alpha, backend):
    """``slerp_update(c, f, alpha)`` is the point at angle ``(1 - alpha) t`` from ``c`` and ``alpha t``
    from ``f`` on their great circle (``t`` the exact angle of the inputs); checking both angles
    pins it to the arc (only points of the minor arc have ``phi_c + phi_f = t``).

    Error budget for each angle, first order (doubled for the neglected second-order terms):

    * the angle ``t_hat``: :func:`geodesic_bound` on the normalised inputs, plus ``2u`` for their
      directions: ``dt = (2d + 18) u``. The output direction ``sin(alpha t_hat) u + sin(beta t_hat) v``
      (``beta = 1 - alpha``) has, differentiating ``atan2`` of its two coordinates in the plane of
      ``u, v``, ``d phi / d t_hat = g / sin t`` with ``g = alpha sin(beta t) cos(alpha t) - beta
      sin(alpha t) cos(beta t)`` (computed here per example): ill-conditioned near antipodal
      inputs, where the two weights are large and nearly cancel.
    * the weights ``sin(alpha t) / sin t``: ``sin`` within an ulp, a product, a division:
      ``<= 4u`` relative each, ``<= 9u`` on the direction.
    * ``wa u^ + wb v^``: norm errors of ``u^, v^`` (``(d/2 + 1) u``), a product and a sum per
      coordinate (``2u``), relative to a sum of norm 1 with ``wa + wb <= 1 / cos(t/2)`` (concavity
      of sine): ``(d/2 + 3) u / cos(t/2)``; the final normalisation adds ``u``.
    * the small-angle branch (``sin t_hat < 1e-6``) uses the weights ``alpha, beta``; its exact
      angle differs from ``beta t`` by ``O(t^3)``.

    Inside the antipodal fallback (``sin t < 1e-6``, ``t > 1``: no unique arc) the result is
    ``ema_update(c, f, alpha)`` bit for bit; within the rounding of ``t`` of the threshold, either.
    Near ``pi`` in float32 the bound is vacuous (the arc itself is determined to ``~u / sin t``)."""
    c, f, dtype, d = case
    C, F = _to(backend, c), _to(backend, f)
    out = _host(_core.slerp_update(C, F, alpha))
    assert out.dtype == dtype
    _slerp_case(c, f, alpha, dtype, d, out, _host(_core.ema_update(C, F, alpha)))


def test_slerp_branches_are_all_reached():
    """The property test above is not vacuous: fixed inputs reach the generic, small-angle and
    antipodal branches in both dtypes, at alpha away from 1/2 (where slerp is not the renormalised
    EMA), and each passes the same check."""
    seen = set()
    rng = np.random.default_rng(3)
    q, _ = np.linalg.qr(rng.standard_normal((5, 2)))
    for dtype in (np.float32, np.float64):
        for t in (1e-8, 3e-7, 1e-3, 1.0, 3.0, math.pi - 1e-3, math.pi - 1e-8):
            c = q[:, 0].astype(dtype)
            f = (math.cos(t) * q[:, 0] + math.sin(t) * q[:, 1]).astype(dtype)
            for alpha in (0.0, 0.2, 0.9):
                out = _core.slerp_update(c, f, alpha)
                seen.add(_slerp_case(c, f, alpha, dtype, 5, out, _core.ema_update(c, f, alpha)))
    assert seen >= {"slerp", "fallback"}


def test_slerp_small_angle_branch_is_within_its_t_cubed_error():
    """At ``t = 1e-7`` (below the ``sin t < 1e-6`` switch) in float64 the linear weights land
    ``|phi - beta t| <= alpha beta |alpha - beta| t^3 / 3 + rounding`` from the exact slerp point (the
    Taylor expansion of ``atan(beta sin t / (alpha + beta cos t))``), i.e. at rounding level; and
    just above the switch (``t = 2e-6``) the sine weights are used and exact to rounding. A switch
    moved to a larger angle (e.g. ``sin t < 1e-3``) leaves ``~t^3 ~ 1e-10`` at ``t = 5e-4``: caught."""
    e0, e1 = np.eye(2)
    for t in (1e-7, 2e-6, 5e-4, 0.1):
        f = np.array([math.cos(t), math.sin(t)])
        for alpha in (0.1, 0.3):
            out = _core.slerp_update(e0, f, alpha)
            with mpmath.workdps(DPS):
                tt = _angle(_mp(e0), _mp(f))
                phi = _angle(_mp(e0), _mp(out))
                assert abs(phi - (1 - alpha) * tt) <= 64 * U[np.float64] * max(float(tt), 1e-300) + 1e-22


def test_slerp_zero_c_becomes_unit_f():
    f = np.array([3.0, 0.0, 4.0])
    assert np.array_equal(_core.slerp_update(np.zeros(3), f, 0.3), f / 5.0)


# ---------------------------------------------------------------- the gate near tau

@settings(max_examples=examples(40))
@given(st.sampled_from((np.float32, np.float64)), finite_floats(1e-3, math.pi - 1e-3),
       st.sampled_from((-1.0, 1.0)), finite_floats(2.0, 10.0), st.integers(2, 64), st.integers(0, 2 ** 32 - 1),
       st.sampled_from(BACKENDS))
def test_geodesic_gate_near_tau_is_exact_outside_the_error_bound(dtype, tau, side, k, d, seed, backend):
    """``gate(distance(f, c, "geodesic"), tau)`` takes the exact decision ``theta < tau`` whenever
    ``|theta - tau|`` exceeds :func:`geodesic_bound` (the gate itself is an exact comparison, below).
    Inputs at ``theta = tau +- k * bound`` with ``k`` in ``[2, 10]``; rounding the vectors to the dtype
    moves the exact angle by ``<= 2u`` (checked), so ``|theta - tau| > bound`` holds."""
    u = U[dtype]
    bound = geodesic_bound(d, u)
    th = tau + side * k * bound
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.standard_normal((d, 2)))
    c = q[:, 0].astype(dtype)
    f = (math.cos(th) * q[:, 0] + math.sin(th) * q[:, 1]).astype(dtype)
    with mpmath.workdps(DPS):
        exact = _angle(_mp(c), _mp(f))
    assert abs(exact - tau) > bound
    got = _host(_core.gate(_core.distance(_to(backend, f), _to(backend, c), "geodesic"), tau))
    assert float(got) == float(exact < tau)


@pytest.mark.parametrize("backend", ("numpy", "jax", "torch"))
@pytest.mark.parametrize("dtype", (np.float32, np.float64))
def test_gate_is_the_exact_comparison_with_tau_in_the_dtype(backend, dtype):
    """``gate(dist, tau) = 1[dist < tau]`` exactly for the distances one ulp either side of ``tau`` (as
    a number of the dtype: the array libraries round a Python ``tau`` to the array's dtype before
    comparing) and at ``tau`` itself (strict: 0)."""
    import jax.numpy as jnp

    conv = {"numpy": np.asarray, "jax": jnp.asarray, "torch": torch.from_numpy}[backend]
    for tau in (0.1, 1.0, math.pi / 3, 2.5):
        t = dtype(tau)
        dist = np.array([np.nextafter(t, dtype(-np.inf)), t, np.nextafter(t, dtype(np.inf))], dtype=dtype)
        got = _host(_core.gate(conv(dist), float(t)))
        assert got.dtype == dtype and got.tolist() == [1.0, 0.0, 0.0]


# ---------------------------------------------------------------- the median

@settings(max_examples=examples(50))
@given(st.sampled_from((np.float32, np.float64)), st.integers(1, 40), st.integers(1, 4),
       st.integers(0, 2 ** 32 - 1), st.sampled_from(("numpy", "torch")), st.integers(-30, 30))
def test_weighted_median_against_exact_median(dtype, n, d, seed, backend, scale):
    """Against the exact median of the kept rows (Python fractions): an odd count gives the middle
    value bit for bit (``0.5 (m + m)`` is exact); an even count is ``fl(a + b) / 2`` of the two
    middle values, one rounding: ``<= u |(a + b) / 2|`` (halving is exact for normal numbers; values
    here are normal and below ``max / 4``, so ``a + b`` cannot overflow). Ties and masked rows
    (weights 0, including negative weights, which count as not kept) included."""
    from fractions import Fraction

    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n, d)) * 2.0 ** scale).astype(dtype)
    x[rng.random((n, d)) < 0.2] = dtype(1.5)  # ties
    w = rng.choice(np.array([0.0, 1.0, 2.5, -1.0], dtype=dtype), size=n, p=[0.25, 0.5, 0.15, 0.1])
    if not (w > 0).any():
        w[rng.integers(n)] = 1.0
    got = _host(_core.weighted_median(_to(backend, x), _to(backend, w)))
    kept = x[w > 0]
    m = len(kept)
    for j in range(d):
        col = sorted(Fraction(float(v)) for v in kept[:, j])
        exact = (col[(m - 1) // 2] + col[m // 2]) / 2
        if m % 2:
            assert Fraction(float(got[j])) == exact
        else:
            assert abs(Fraction(float(got[j])) - exact) <= Fraction(U[dtype]) * abs(exact)
