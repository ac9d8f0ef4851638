"""Accuracy of adsim's matching numerics against a high-precision oracle (``mpmath``, 50 digits).

* The Triton gate kernels (``adsim.model.gate_triton``, run under Triton's interpreter in one child
  process, ``_triton_interpret.py``): the chords kernel's slerp, whose angle comes from a polynomial
  ``atan``, against the exact slerp for angles from ``1e-8`` to ``pi - 1e-6`` and several ``alpha``;
  the fixed-radius geodesic gate of both kernels (chords: ``y cos(tau/2) < x sin(tau/2)``; dots:
  ``-cos`` against ``-cos(tau)``) near ``tau``: the exact decision whenever the angle is farther
  from ``tau`` than the kernel's error bound.
* The polynomial itself (coefficients read from the kernel's source): its error against ``atan``
  over the whole reduced range, exactly (mpmath) and in float32.
* The batched gate's chord comparison (``matching._batched``, geodesic, adaptive radius): the exact
  decision whenever the two angles differ by more than the chords' error bound.

Bounds are multiples of the float32 unit roundoff ``u = 2^-24`` derived in each docstring (see also
``tests/test_core_accuracy.py``, whose geodesic bound ``(2d + 16) u`` is reused and derived there).
"""
import math
import re
from pathlib import Path

import mpmath
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from poolsim import _core
from poolsim.testing import examples, finite_floats

pytest.importorskip("triton")

from adsim.model import gate_triton  # noqa: E402
from adsim.model.matching import match  # noqa: E402

U = 2.0 ** -24  # float32 unit roundoff
DPS = 50


def geodesic_bound(d):
    """``(2d + 16) u``: the error of the core's chord-form angle (derived in
    ``tests/test_core_accuracy.py::geodesic_bound``); the kernels compute the same chords."""
    return (2 * d + 16) * U


def _mp(v):
    return [mpmath.mpf(float(x)) for x in np.asarray(v, dtype=np.float64).ravel()]


def _norm(v):
    return mpmath.sqrt(mpmath.fsum(x * x for x in v))


def _angle(a, b):
    na, nb = _norm(a), _norm(b)
    ua, ub = [x / na for x in a], [x / nb for x in b]
    return 2 * mpmath.atan2(_norm([p - q for p, q in zip(ua, ub)]), _norm([p + q for p, q in zip(ua, ub)]))


# ---------------------------------------------------------------- the polynomial atan

def _kernel_atan_source():
    """The reduction threshold and the five Horner coefficients of the chords kernel's ``atan``, read
    from its source (so this test checks the kernel's numbers, not a copy)."""
    src = Path(gate_triton.__file__).read_text()
    big = re.search(r"big = z > ([0-9.]+)", src)
    q = re.search(r"q = \(\(\((-?[0-9.]+) \* w2 \+ ([0-9.]+)\) \* w2 - ([0-9.]+)\) \* w2\s*"
                  r"\+ ([0-9.]+)\) \* w2 - ([0-9.]+)", src)
    assert big and q, "the kernel's atan polynomial changed form: update this test's parser"
    c = [float(v) for v in q.groups()]
    return float(big.group(1)), (c[0], c[1], -c[2], c[3], -c[4])


def test_kernel_atan_polynomial_against_mpmath():
    """The chords kernel's ``atan(z)``, ``z = min(y, x) / max(y, x)`` in ``[0, 1]``: for ``z >
    tan(pi/8)`` it is ``pi/4 + atan((z - 1)/(z + 1))``, so the odd polynomial ``w + w^3 q(w^2)`` is only
    used on ``|w| <= tan(pi/8)``.

    * Exact arithmetic (mpmath, 20001 points of ``[0, tan(pi/8)]``): the approximation error is below
      the module docstring's ``2e-8`` (a float32 rounding of ``pi/4`` is ``~3e-8``).
    * The kernel's float32 operations in its order (NumPy float32, 200001 points of ``[0, 1]``), the
      angle ``2 atan2(y, x)`` it feeds: ``|error| <= 2 (2e-8 + 4u)`` -- the polynomial, and four
      roundings of size ``<= u`` on the way (the division ``z``, the reduction ``(z - 1)/(z + 1)``,
      Horner's last step, the ``pi/4`` or ``pi/2`` addition), doubled."""
    thr, c = _kernel_atan_source()
    assert thr == pytest.approx(math.tan(math.pi / 8), abs=1e-15)
    with mpmath.workdps(DPS):
        worst = 0
        for z in np.linspace(0.0, thr, 20001):
            w = mpmath.mpf(float(z))
            w2 = w * w
            q = (((c[0] * w2 + c[1]) * w2 + c[2]) * w2 + c[3]) * w2 + c[4]
            worst = max(worst, abs(w + w * w2 * q - mpmath.atan(w)))
    assert worst <= 2e-8, float(worst)

    f32 = np.float32
    z = np.linspace(0.0, 1.0, 200001, dtype=np.float32)
    big = z > f32(thr)
    w = np.where(big, (z - f32(1)) / (z + f32(1)), z).astype(f32)
    w2 = w * w
    q = (((f32(c[0]) * w2 + f32(c[1])) * w2 + f32(c[2])) * w2 + f32(c[3])) * w2 + f32(c[4])
    at = w + w * w2 * q
    at = np.where(big, at + f32(math.pi / 4), at)
    # y <= x: t = 2 atan(z); y > x: t = 2 (pi/2 - atan(z))
    for t_hat, exact in ((2 * at, [2 * mpmath.atan(mpmath.mpf(float(v))) for v in z[::1000]]),
                         (2 * (f32(math.pi / 2) - at), [mpmath.pi - 2 * mpmath.atan(mpmath.mpf(float(v)))
                                                        for v in z[::1000]])):
        err = max(abs(mpmath.mpf(float(a)) - e) for a, e in zip(t_hat[::1000], exact))
        assert err <= 2 * (2e-8 + 4 * U), float(err)


# ---------------------------------------------------------------- the kernels, interpreted

D_SLERP = 24
SLERP_ANGLES = [1e-8, 1e-7, 1e-6, 3e-6, 1e-4, 1e-2, 0.3, 1.0, 1.7, 2.5, 3.0,
                math.pi - 1e-2, math.pi - 1e-4, math.pi - 1e-5, math.pi - 1e-6]
SLERP_ALPHAS = (0.1, 0.3, 0.7, 0.95)
GATE_TAUS = (1e-2, 0.5, 2.0, math.pi - 1e-2)
GATE_KS = (2.0, 4.0, 10.0)  # angles tau -+ k * margin
D_GATE = (24, 768)


def _basis_pair(angles, d, seed):
    """Centroids ``e_0`` (exact unit vectors) and unit features at the given angles from it in a
    random plane through ``e_0``: ``(c (S, d), f (S, 1, d))`` float32."""
    rng = np.random.default_rng(seed)
    S = len(angles)
    c = np.zeros((S, d))
    c[:, 0] = 1.0
    w = rng.standard_normal((S, d))
    w[:, 0] = 0.0
    w /= np.linalg.norm(w, axis=1, keepdims=True)
    t = np.asarray(angles)[:, None]
    f = np.cos(t) * c + np.sin(t) * w
    return torch.tensor(c, dtype=torch.float32), torch.tensor(f[:, None, :], dtype=torch.float32)


def _case(f, c, *, kernel, **kw):
    """``match_sequential`` arguments: one normal feature per slot, the normal centroid ``c``
    (initialised), the anomaly centroid uninitialised (so it never blocks)."""
    S = f.shape[0]
    args = [f, torch.zeros(1), torch.ones(1), c, torch.zeros_like(c), torch.ones(S), torch.zeros(S)]
    return {"args": args, "kw": kw, "kernel": kernel}


def _gate_margins(kernel, d, tau):
    """``(below, above)``: how far below and above ``tau`` an angle must be for a kernel's fixed-radius
    geodesic decision to be the exact one.

    * chords: the chords ``y, x`` carry :func:`geodesic_bound`'s error (the same formulas in float32,
      reduced in another order, within the same ``gamma_d``); ``sin(tau/2), cos(tau/2)`` rounded to
      float32 and the two products add ``4u`` relative to the compared quantities, i.e. ``<= 4u`` of
      angle: ``(2d + 20) u`` on both sides.
    * dots: ``cos = f.c / sqrt(ff cc)``: the dot products are sums of ``BLOCK_D`` products
      (``gamma_{BLOCK_D}``, ``<= BLOCK_D u`` absolute for unit vectors: the worst case of any
      reduction order), ``ff cc``, its square root and the division ``3u``, and ``cos(tau)`` rounded
      to float32 ``u``: the compared cosines are off by ``e <= (2 BLOCK_D + 5) u``. The angles whose
      cosine is more than ``e`` from ``cos(tau)`` are beyond ``arccos(cos(tau) -+ e)``, computed
      exactly (no first-order step: near 0 the key cannot resolve angles below ``~sqrt(2 e)``, and
      ``below`` is then all of ``tau``)."""
    if kernel == "chords":
        b = (2 * d + 20) * U
        return b, b
    e = (2 * (1 << (d - 1).bit_length()) + 5) * U
    below = tau - math.acos(min(math.cos(tau) + e, 1.0))
    above = math.acos(max(math.cos(tau) - e, -1.0)) - tau
    return below, above


def _gate_angles(kernel, d, tau):
    below, above = _gate_margins(kernel, d, tau)
    out = [tau - k * below for k in GATE_KS if tau - k * below > 0]
    return out + [tau + k * above for k in GATE_KS if tau + k * above < math.pi]


def _cases():
    cases = {}
    for alpha in SLERP_ALPHAS:
        c, f = _basis_pair(SLERP_ANGLES, D_SLERP, seed=1)
        cases[f"slerp-{alpha}"] = _case(f, c, kernel="chords", metric="geodesic", tau=None, update="slerp",
                                         alpha=alpha)
    for kernel in ("chords", "dots"):
        for d in D_GATE:
            for tau in GATE_TAUS:
                c, f = _basis_pair(_gate_angles(kernel, d, tau), d, seed=2)
                cases[f"gate-{kernel}-{d}-{tau}"] = _case(f, c, kernel=kernel, metric="geodesic", tau=tau,
                                                          update="ema", alpha=0.5)
    return cases


CASES = _cases()


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory, triton_interpreter):
    """``{case: Decisions}`` from one interpreter child process (``_triton_interpret.py``)."""
    out = triton_interpreter(list(CASES.values()), tmp_path_factory.mktemp("triton_accuracy"))
    return {name: gate_triton.Decisions(*o["decisions"]) for name, o in zip(CASES, out)}


@pytest.mark.slow
@pytest.mark.parametrize("alpha", SLERP_ALPHAS)
def test_kernel_slerp_against_mpmath(interpreted, alpha):
    """The chords kernel's own slerp of ``c = e_0`` towards each feature (``c_out``) lies at angle
    ``(1 - alpha) t`` from ``c`` and ``alpha t`` from ``f`` (``t`` the exact angle of the float32 inputs
    the kernel sees, i.e. the features after ``match_sequential``'s normalisation).

    Bound: ``tests/test_core_accuracy.py::test_slerp_update_against_mpmath``'s budget with the
    kernel's angle error ``dt = geodesic_bound + 2u + 2 (2e-8 + 4u)`` (the chords, the second
    normalisation, the polynomial ``atan`` of :func:`test_kernel_atan_polynomial_against_mpmath`).
    Near ``pi`` (``sin t`` within the rounding of ``t`` of ``1e-6``) the kernel may take the
    antipodal EMA fallback instead; there the result must be the EMA's direction within the EMA's
    own bound (``test_ema_update_against_mpmath``)."""
    dec = interpreted[f"slerp-{alpha}"]
    f = _core.normalize(CASES[f"slerp-{alpha}"]["args"][0].float())[:, 0]  # what the kernel reads
    assert torch.equal(dec.acc_pos[:, 0], torch.ones(len(SLERP_ANGLES)))  # every feature moved c
    d = D_SLERP
    dt = geodesic_bound(d) + 2 * U + 2 * (2e-8 + 4 * U)
    branches = set()
    with mpmath.workdps(DPS):
        al = mpmath.mpf(alpha)
        for s in range(len(SLERP_ANGLES)):
            mc, mf, mo = _mp(torch.eye(d)[0]), _mp(f[s]), _mp(dec.c_pos[s])
            t = _angle(mc, mf)
            st_ = mpmath.sin(t)
            g = al * mpmath.sin((1 - al) * t) * mpmath.cos(al * t) - (1 - al) * mpmath.sin(al * t) * mpmath.cos((1 - al) * t)
            cond = abs(g) / st_ if st_ > 0 else 0
            bound = 2 * (cond * dt + 9 * U + (d / 2 + 3) * U / mpmath.cos(t / 2))
            if float(t) < 2e-6:
                bound += t ** 3
            if float(t) > 1 and st_ <= 1e-6 + 2 * dt:
                ema = [al * p + (1 - al) * q for p, q in zip(mc, mf)]
                r = _norm(ema)
                if _angle(mo, ema) <= 3 * U / r + 2 * U + dt:
                    branches.add("fallback")
                    continue
            assert abs(_angle(mc, mo) - (1 - al) * t) <= bound, (SLERP_ANGLES[s], float(_angle(mc, mo)), float(t))
            assert abs(_angle(mf, mo) - al * t) <= bound, (SLERP_ANGLES[s], float(_angle(mf, mo)), float(t))
            assert abs(_norm(mo) - 1) <= (d / 2 + 3) * U
            branches.add("slerp")
    assert "slerp" in branches


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ("chords", "dots"))
@pytest.mark.parametrize("d", D_GATE)
@pytest.mark.parametrize("tau", GATE_TAUS)
def test_kernel_fixed_radius_gate_near_tau(interpreted, kernel, d, tau):
    """Features at ``tau -+ k * margin`` (``k`` in ``{2, 4, 10}``, :func:`_gate_margins`; angles in
    ``(0, pi)`` only) from the normal centroid: the kernel accepts exactly those whose exact angle
    (mpmath, on the float32 inputs) is below ``tau``. Rounding the features to float32 moves the angle
    by ``~2u``, less than the margin left (checked)."""
    dec = interpreted[f"gate-{kernel}-{d}-{tau}"]
    f = _core.normalize(CASES[f"gate-{kernel}-{d}-{tau}"]["args"][0].float())[:, 0]
    below, above = _gate_margins(kernel, d, tau)
    e0 = _mp(torch.eye(d)[0])
    with mpmath.workdps(DPS):
        exact = [_angle(e0, _mp(f[s])) for s in range(f.shape[0])]
    assert all(t < tau - below or t > tau + above for t in exact)
    want = [float(t < tau) for t in exact]
    assert dec.acc_pos[:, 0].tolist() == want
    # both sides are tested where they exist (the dots kernel cannot resolve angles near 0 and pi)
    assert (sum(want) > 0 or tau - below <= 0) and (sum(want) < len(want) or tau + above >= math.pi)


# ---------------------------------------------------------------- the batched gate's chords

@settings(max_examples=examples(30))
@given(finite_floats(1e-3, 3.0), st.sampled_from((-1.0, 1.0)), finite_floats(2.0, 10.0),
       st.sampled_from((3, 16, 768)), st.integers(0, 2 ** 32 - 1))
def test_batched_geodesic_gate_compares_angles_exactly_outside_the_bound(theta, side, k, d, seed):
    """The batched adaptive gate accepts a normal feature iff ``||f - c+^|| < ||f - c-^||`` (chords of
    the unit vectors, ``torch.cdist``'s direct form), which orders like the angles (``chord = 2
    sin(angle / 2)``). Each chord is a difference, ``d`` squares summed and a square root: relative
    error ``<= (d/2 + 3) u``, so two chords ``<= 2`` compare exactly when they differ by more than
    ``4 (d/2 + 3) u``, i.e. when the angles differ by more than that over ``cos(angle / 2)`` (the
    chord's derivative), taken at the larger angle, here ``<= 3.1``. With ``f`` at ``theta`` from ``c+``
    and ``theta +- k * bound`` (``k`` in ``[2, 10]``) from ``c-``, the decision is the exact
    ``angle+ < angle-`` (mpmath, on the float32 vectors; rounding them moves the angles by ``~2u``,
    within the margin, asserted)."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.standard_normal((d, 3)))
    bound = 4 * (d / 2 + 3) * U / math.cos(3.1 / 2)
    th2 = theta + side * k * bound
    f = q[:, 0]
    cp = math.cos(theta) * f + math.sin(theta) * q[:, 1]
    cn = math.cos(th2) * f + math.sin(th2) * q[:, 2]
    F, CP, CN = (torch.tensor(v, dtype=torch.float32) for v in (f, cp, cn))
    with mpmath.workdps(DPS):
        a_pos, a_neg = _angle(_mp(F), _mp(CP)), _angle(_mp(F), _mp(CN))
    assert abs(a_pos - a_neg) > bound
    out = match(F[None], torch.zeros(1), torch.ones(1), CP, CN, torch.tensor(1.0), torch.tensor(1.0),
                metric="geodesic", mode="batched")
    assert float(out.acc_pos[0]) == float(a_pos < a_neg)
