"""Algorithm 1's exact sequential gate as one fused Triton kernel, in two variants.

:func:`gate_decisions` returns what ``matching._scan_decisions`` (a ``jax.lax.scan``) returns -- the
0/1 decisions and the EMA normalisers of every feature, for ``S`` slots -- from ONE kernel launch:
one program (thread block) per slot loops over the slot's ``n`` features in order and keeps the slot's
two centroids (normal, anomaly) in registers. The JAX scan on a GPU is launch-bound (~12 us per
dependent step, ``benchmarks/RESULTS.md``); here a step costs no launch, only its arithmetic and its
reductions. Two kernels (``kernel=``; their GPU times are in ``benchmarks/RESULTS.md``):

* ``"chords"`` (:func:`_gate_kernel`). The core's formulas step by step, EMA and slerp: per step one to three block-wide
  reductions of a joined ``(2, BLOCK_D, 2, 2)`` tile (l2 with the EMA one, the other EMA gates two,
  slerp one more) and elementwise IEEE divisions. sm_90, ``d = 768`` (``BLOCK_D = 1024``), 4 warps:
  80-128 registers, no spills with the EMA; at 1 warp the geodesic gate spills (ptxas).
* ``"dots"`` (:func:`_dots_kernel`, EMA only). Per step ONE reduction of ``c+.c+, c-.c-, f.c+, f.c-``
  (``f.f``, which does not depend on the centroids, is a second ``tl.sum`` beside it: two sums of
  ``(BLOCK_D,)``-wide operands instead of one padded 8-wide tile), everything else scalar, and the
  update ``c <- (alpha g / r) c + (beta / r) f`` only for a centroid that moves (a branch). One warp
  by default: a warp reduction is shuffles without block synchronisation; the feature loads run two
  steps ahead (Triton's pipeliner, ``DOTS_STAGES``). sm_90 at ``d = 768``: 138-142 registers at 1
  warp, 93 at 2, 64-66 at 4, no spills (``tests/adsim/test_adsim_gate_triton.py`` checks 1, 2, 4);
  its loop body is ~840 SASS instructions at 1 warp (both update branches and the division slow
  paths included) against ~1400 per warp at 4 warps, plus barriers, for the chords kernel's geodesic
  EMA gate (counted with nvdisasm, not timed). Compiled with FMA contraction (the chords kernel
  without: its values follow torch's separate roundings).
  ``"auto"`` (the default, :data:`DEFAULT_KERNEL`) picks dots for the EMA, chords for slerp: on an
  H100 dots was 4-7 times faster on the EMA gate (``benchmarks/RESULTS.md``).

Chords kernel formulas: those of ``poolsim.core`` step by step (``normalize``, ``safe_norm``,
``distance``, ``ema_update``, ``slerp_update``, the gate of ``matching._decide``), with IEEE-rounded
division and square root (``div_rn``/``sqrt_rn``, as torch and JAX compute them) so that values agree
with the JAX scan and the literal loop to rounding (the sums are reduced in another order). Two places
differ from the literal formulas, both order-preserving:

* **Geodesic gate.** The core's angle is ``2 atan2(y, x)`` with chords ``y = ||u - v||``,
  ``x = ||u + v||`` of the normalised vectors (``chord_angle``; ``y = x = 0`` read as ``(1, 1)``). For
  ``(y_i, x_i) = rho_i (sin h_i, cos h_i)`` with ``rho_i > 0`` and half-angles ``h_i`` in ``[0, pi/2]``,
  ``y_1 x_2 - y_2 x_1 = rho_1 rho_2 sin(h_1 - h_2)`` has the sign of ``h_1 - h_2`` (``|h_1 - h_2| <=
  pi/2``), so ``angle_1 < angle_2`` iff ``y_1 x_2 < y_2 x_1``; a fixed radius ``tau`` is compared the
  same way, ``angle < tau`` iff ``y cos(tau/2) < x sin(tau/2)`` for ``0 < tau/2 <= pi/2`` (``tau/2 >
  pi/2``: always, since the angle is at most ``pi``; ``tau <= 0``: never). The decisions therefore
  equal the literal loop's except where the two sides agree to float32 rounding (ties).
* **Slerp's angle** needs ``atan`` itself, which Triton's interpreter (the CPU test path) lacks, so it
  is a polynomial here (below, error <= 2e-8 on its reduced range, i.e. float32 rounding); slerp also
  reuses the gate's chords of the once-normalised vectors where the core normalises them a second time
  (a change of at most a few units in the last place). Both only move the in-kernel centroid that the
  next decisions see, at rounding level; the returned centroids of ``match_sequential`` are replayed
  in torch (``slerp_trajectory``).

Dots kernel formulas, from ``ff = f.f``, ``cc = c.c``, ``fc = f.c`` of the raw vectors (``c = 0``:
uninitialised). The gate compares a key that is strictly increasing in the core's distance
(:func:`_closeness_key`), against the other centroid's key or the radius on the same scale
(:func:`_tau_key`), with ``cos = clip(fc / sqrt(ff' cc'), -1, 1)``, a zero squared norm read as 1 (so
``cos = 0`` when either vector is zero, ``core.cosine_similarity``'s convention):

* l2: ``sqrt(max(ff + cc - 2 fc, 0))``; cosine: ``1 - cos``, as the core.
* Geodesic: ``-cos``. For unit ``u, v`` the core's ``2 atan2(||u - v||, ||u + v||)`` is ``arccos(u.v)``
  (``||u -+ v||^2 = 2 -+ 2 cos``, ``tan(t/2) = sqrt((1 - cos) / (1 + cos))``); a zero vector gives
  chords ``(1, 1)`` (both zero: read as ``(1, 1)``, ``chord_angle``), i.e. ``pi/2 = arccos(0)``. arccos
  is strictly decreasing on ``[-1, 1]``, so ``angle_own < angle_other`` iff ``cos_own > cos_other``; the
  clip is non-decreasing, so it can only turn a strict inequality into a tie where both cosines round
  beyond +-1 (both angles within rounding of 0, or of pi). Fixed ``tau``: ``angle < tau`` iff ``cos >
  cos(tau)`` for ``0 < tau <= pi`` (arccos maps ``[-1, 1]`` onto ``[0, pi]``); ``tau > pi``: always
  (key 2 > ``-cos``), ``tau <= 0``: never (key -2).
* EMA: with ``c* = g c`` the core's centroid (``g = 1`` for the start centroid), ``r^2 = alpha^2 c*.c*
  + beta^2 ff + 2 alpha beta f.c*`` (clamped at 0; ``r = 0``: the centroid stays, as
  ``core.ema_update``'s 0/0) and ``c' = (alpha c* + beta f) / r``.

Rounding. A sum of products is one thread's ``k = BLOCK_D / (32 warps)`` terms and then a tree, so
``|error| <= gamma sum |x_i y_i|`` with ``gamma ~ (k + log2(32 warps)) u`` (``u = 2^-24``; ``d = 768`` at
1 warp: ``gamma ~ 37 u ~ 2.2e-6``, typical errors far smaller). Cosines are thus off by ``~gamma``: the
decisions equal the literal loop's except where the two cosines (or ``cos`` and ``cos(tau)``) agree to
``~2 gamma``, i.e. angles within ``~2 gamma / sin(angle)`` (within ``~sqrt(4 gamma) ~ 3e-3`` rad of 0 or
pi, where the chords kernel resolves ``~gamma``). l2: ``|error of ff + cc - 2 fc| <= gamma (||f|| +
||c||)^2 ~ 4 gamma``: squared distances that agree to ``~1e-5`` are ties, and a fixed l2 radius below
``~3e-3`` is decided at rounding level (use the chords kernel there). ``r`` is NOT taken from the dot
products, whose error ``gamma (alpha ||c|| + beta ||f||)^2`` is unbounded relative to ``r^2`` where
``alpha c + beta f`` nearly cancels (near-antipodal at ``alpha = 1/2``): the moved centroid ``c'`` has the
core's direction (to rounding) and norm ``||alpha c* + beta f|| / r``, and its ``c'.c'`` is in the next
step's reduction anyway, so the kernel writes ``r ||c'||`` one step later (the last step: one extra
reduction) -- the core's normaliser to the accuracy of a sum of squares -- and reads the moved
centroid as ``c* = c' / ||c'||`` (``g = 1 / ||c'||``, :func:`_centroid_scale`). On the tests' data ``r``
agrees with the JAX scan to < 4e-7 relative; a feature 0.01 rad from antipodal is 4.8e-4 off without
the correction. What remains: where ``||alpha c* + beta f||^2`` is within ``~gamma`` of 0, ``r^2`` from
the dots may round to ``<= 0`` (the kernel keeps the centroid where the core moves it along the tiny
sum) or, for bitwise antipodal inputs whose dot products do not cancel exactly, to ``> 0`` (the kernel
moves the centroid along rounding noise where the core keeps it).

Interpreted vs compiled: the kernels are ordinary ``@triton.jit`` functions, compiled for CUDA
tensors. With ``TRITON_INTERPRET=1`` set before ``triton`` is first imported, Triton builds every
``@triton.jit`` function (its own ``tl.sum`` too) as an interpreted function that runs on CPU tensors
with NumPy: that is how the CPU tests run it, in a child process so that no other code in the test
session is interpreted (``tests/adsim/test_adsim_gate_triton.py``).
"""
from __future__ import annotations

import math
import os
from contextlib import nullcontext as _nullcontext
from typing import NamedTuple

import torch
import triton
import triton.language as tl

METRIC_IDS = {"l2": 0, "cosine": 1, "geodesic": 2}
MAX_D = 1024  # one (2, BLOCK_D) register tile per program; ViT-L's width is 768
KERNELS = ("auto", "chords", "dots")
DOTS_STAGES = 3  # the dots kernel's loads run 2 steps ahead (cp.async pipelining on sm_80+)
# "auto": dots for the EMA, chords for slerp (the only kernel with it). On one H100 the 8 gates of a
# ViT-L step (4,624 patch features per layer) took 4.5-4.9 ms with dots and 21-34 ms with chords
# (by warp count; benchmarks/RESULTS.md), so dots wherever it applies.
DEFAULT_KERNEL = "auto"


class Decisions(NamedTuple):
    acc_pos: torch.Tensor  # (S, n) 0/1: feature matched to the normal centroid
    acc_neg: torch.Tensor  # (S, n) 0/1: feature matched to the anomaly centroid
    r_pos: torch.Tensor    # (S, n) EMA normaliser ||alpha c + (1 - alpha) f|| where matched (0: 0/0), or acc (slerp)
    r_neg: torch.Tensor
    c_pos: torch.Tensor    # (S, d) the kernel's own centroids after the n steps (checks; no gradient)
    c_neg: torch.Tensor


def interpreted() -> bool:
    """Whether Triton was imported in interpreter mode (``TRITON_INTERPRET=1``): then the kernel runs
    on CPU tensors (slowly) and not on CUDA ones."""
    knobs = getattr(triton, "knobs", None)  # triton >= 3.4; older releases read the variable directly
    if knobs is not None:
        return bool(knobs.runtime.interpret)

    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on")


@triton.jit
def _gate_kernel(f_ptr, lab_ptr, c_ptr, init_ptr, acc_ptr, r_ptr, c_out_ptr, n, d, alpha, beta, tau, tau_sin,
                 tau_cos, METRIC: tl.constexpr, FIXED_TAU: tl.constexpr, SLERP: tl.constexpr,
                 BLOCK_D: tl.constexpr):
    """Program ``s`` = slot ``s``. ``f: (S, n, d)`` unit features, ``lab: (n, 2)`` 0/1 label weights
    (normal, anomaly), ``c: (S, 2, d)`` and ``init: (S, 2)`` start state; writes ``acc, r: (S, 2, n)``
    and ``c_out: (S, 2, d)``. Row 0 of every (2, .) tile is the normal centroid, row 1 the anomaly one."""
    s = tl.program_id(0).to(tl.int64)
    rows = tl.arange(0, 2)
    cols = tl.arange(0, BLOCK_D)
    cmask = cols < d
    tile = rows[:, None] * d + cols[None, :]
    tmask = (rows[:, None] < 2) & cmask[None, :]
    # masked lanes hold 0 in c and f and stay 0 through every update (0 / norm, 0 * weight)
    c = tl.load(c_ptr + s * 2 * d + tile, mask=tmask, other=0.0)
    init = tl.load(init_ptr + s * 2 + rows)
    f_row = f_ptr + s * n * d
    out_row = s * 2 * n + rows * n
    f_next = tl.load(f_row + cols, mask=cmask & (n > 0), other=0.0)
    for j in range(n):
        f = f_next
        # prefetch the next feature: its load does not depend on this step's decisions
        f_next = tl.load(f_row + (j + 1) * d + cols, mask=cmask & (j + 1 < n), other=0.0)
        lab = tl.load(lab_ptr + j * 2 + rows)
        fb = tl.broadcast_to(f[None, :], (2, BLOCK_D))
        # The sums a step needs before its decision, as ONE reduction of a (2, BLOCK_D, 2, 2) tile (one
        # block-wide synchronisation instead of four): ||c||^2, ||f||^2, ||f - c||^2 (l2) and the norm
        # of the EMA candidate alpha c + (1 - alpha) f (it does not depend on the decision).
        e = alpha * c + beta * fb
        sums = tl.sum(tl.join(tl.join(c * c, fb * fb), tl.join(e * e, (fb - c) * (fb - c))), axis=1)
        sums_cf, sums_e = tl.split(sums)
        ss_c, ss_f = tl.split(sums_cf)
        ss_e, e2 = tl.split(sums_e)
        norm_e = tl.where(ss_e > 0, tl.sqrt_rn(tl.where(ss_e > 0, ss_e, 1.0)), 0.0)
        if METRIC != 0 or SLERP:  # the unit vectors (core.normalize; l2 with the EMA needs none)
            c_unit = tl.div_rn(c, tl.sqrt_rn(tl.where(ss_c > 0, ss_c, 1.0))[:, None])
            f_unit = tl.div_rn(fb, tl.sqrt_rn(tl.where(ss_f > 0, ss_f, 1.0))[:, None])
        # chords of the unit vectors (core.geodesic), one reduction; slerp needs them for any metric
        if METRIC == 2 or SLERP:
            dm = f_unit - c_unit
            dp = f_unit + c_unit
            ym, xp = tl.split(tl.sum(tl.join(dm * dm, dp * dp), axis=1))
            y = tl.where(ym > 0, tl.sqrt_rn(tl.where(ym > 0, ym, 1.0)), 0.0)
            x = tl.where(xp > 0, tl.sqrt_rn(tl.where(xp > 0, xp, 1.0)), 0.0)
            both_zero = (y == 0) & (x == 0)  # core.chord_angle: read as (1, 1), the angle pi/2
            y = tl.where(both_zero, 1.0, y)
            x = tl.where(both_zero, 1.0, x)
        # matching._decide: own distance below tau, or (adaptive) below the other centroid's, which is
        # infinitely far while uninitialised; an uninitialised own centroid accepts. The other
        # centroid's value of a 2-vector v = (v0, v1) is join(v1, v0) (split/join, not a reduction).
        if METRIC == 2:
            if FIXED_TAU:
                ok = y * tau_cos < x * tau_sin                                  # angle < tau
            else:
                y0, y1 = tl.split(y)
                x0, x1 = tl.split(x)
                ok = y * tl.join(x1, x0) < tl.join(y1, y0) * x                  # angle < other angle
        else:
            if METRIC == 0:
                dist = tl.where(e2 > 0, tl.sqrt_rn(tl.where(e2 > 0, e2, 1.0)), 0.0)  # ||f - c||
            else:
                cos = tl.sum(f_unit * c_unit, axis=1)
                dist = 1.0 - tl.minimum(tl.maximum(cos, -1.0), 1.0)                  # 1 - cos(f, c)
            if FIXED_TAU:
                ok = dist < tau
            else:
                d0, d1 = tl.split(dist)
                ok = dist < tl.join(d1, d0)
        if not FIXED_TAU:
            i0, i1 = tl.split(init)
            ok = ok | (tl.join(i1, i0) <= 0)
        ok = ok | (init <= 0)
        a = tl.where(ok, 1.0, 0.0) * lab
        # the EMA (core.ema_update); its normaliser is also the scan's r
        ema = tl.where((norm_e > 0)[:, None], tl.div_rn(e, tl.where(norm_e > 0, norm_e, 1.0)[:, None]), c)
        if SLERP:  # core.slerp_update; its angle t = 2 atan2(y, x) from a polynomial atan (module docstring)
            lo = tl.minimum(y, x)
            hi = tl.maximum(y, x)
            z = tl.div_rn(lo, hi)                       # in [0, 1]
            big = z > 0.41421356237309503               # tan(pi/8): atan(z) = pi/4 + atan((z-1)/(z+1))
            w = tl.where(big, tl.div_rn(z - 1.0, z + 1.0), z)
            w2 = w * w
            q = (((-0.06459379941225052 * w2 + 0.10746300220489502) * w2 - 0.1426423341035843) * w2
                 + 0.1999955028295517) * w2 - 0.3333333134651184
            at = w + w * w2 * q
            at = tl.where(big, at + 0.7853981633974483, at)
            t = 2.0 * tl.where(y > x, 1.5707963267948966 - at, at)
            sin_t = tl.sin(t)
            small = sin_t < 1e-6
            s_safe = tl.where(small, 1.0, sin_t)
            wa = tl.where(small, alpha, tl.div_rn(tl.sin(alpha * t), s_safe))
            wb = tl.where(small, beta, tl.div_rn(tl.sin(beta * t), s_safe))
            mix = wa[:, None] * c_unit + wb[:, None] * f_unit
            ss_m = tl.sum(mix * mix, axis=1)
            moved = tl.div_rn(mix, tl.sqrt_rn(tl.where(ss_m > 0, ss_m, 1.0))[:, None])
            moved = tl.where((small & (t > 1.0))[:, None], ema, moved)   # antipodal: no unique arc
            moved = tl.where((ss_c == 0)[:, None], f_unit, moved)        # zero centroid: f / ||f||
            r = a
        else:
            moved = ema
            r = a * norm_e
        c = tl.where((a > 0)[:, None], moved, c)
        init = tl.maximum(init, a)
        tl.store(acc_ptr + out_row + j, a)
        tl.store(r_ptr + out_row + j, r)
    tl.store(c_out_ptr + s * 2 * d + tile, c, mask=tmask)


@triton.jit
def _closeness_key(ff, cc, fc, METRIC: tl.constexpr):
    """A scalar that orders like the core's distance of ``f`` to ``c`` (strictly increasing in it), from
    ``ff = f.f, cc = c.c, fc = f.c``: l2 ``sqrt(max(ff + cc - 2 fc, 0))``, cosine ``1 - cos``, geodesic
    ``-cos`` (module docstring), with ``cos = clip(fc / sqrt(ff cc), -1, 1)`` and a zero norm read as 1."""
    if METRIC == 0:
        key = tl.sqrt_rn(tl.maximum(ff + cc - 2.0 * fc, 0.0))
    else:
        cos = tl.div_rn(fc, tl.sqrt_rn(tl.where(ff > 0, ff, 1.0) * tl.where(cc > 0, cc, 1.0)))
        cos = tl.minimum(tl.maximum(cos, -1.0), 1.0)
        key = 1.0 - cos if METRIC == 1 else -cos
    return key


@triton.jit
def _centroid_scale(cc, unit):
    """``g`` with ``g c`` the core's centroid: 1 for the start centroid, ``1 / ||c||`` once the kernel
    has moved it (its stored norm is off by the rounding of ``r``; module docstring)."""
    return tl.where((unit > 0) & (cc > 0), tl.div_rn(1.0, tl.sqrt_rn(tl.where(cc > 0, cc, 1.0))), 1.0)


@triton.jit
def _ema_move(c, f, g, cc, fc, ff, a, alpha, beta):
    """``core.ema_update`` of ``g c`` (``cc, fc``: its dot products) where ``a > 0``: returns the new
    ``c = (alpha g c + beta f) / r`` and ``r = sqrt(max(||alpha g c + beta f||^2, 0))`` from the dot
    products; ``r = 0``: the EMA's 0/0, ``c`` stays."""
    r2 = alpha * alpha * cc + beta * beta * ff + 2.0 * alpha * beta * fc
    r = tl.where(r2 > 0, tl.sqrt_rn(tl.where(r2 > 0, r2, 1.0)), 0.0)
    if (a > 0) & (r > 0):  # a branch: at most one of the two centroids moves per labelled feature
        c = tl.div_rn(alpha * g, r) * c + tl.div_rn(beta, r) * f
    return c, r


@triton.jit
def _dots_kernel(f_ptr, lab_ptr, c_ptr, init_ptr, acc_ptr, r_ptr, c_out_ptr, n, d, alpha, beta, tau_key,
                 METRIC: tl.constexpr, FIXED_TAU: tl.constexpr, BLOCK_D: tl.constexpr, STAGES: tl.constexpr):
    """The EMA gate from dot products (module docstring). Program ``s`` = slot ``s``; arguments as
    :func:`_gate_kernel` (``r`` must be zero on entry: only moves write it). The two centroids are
    two ``(BLOCK_D,)`` vectors ``c0`` (normal) and ``c1`` (anomaly); everything else is scalar."""
    s = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    cmask = cols < d
    c0 = tl.load(c_ptr + s * 2 * d + cols, mask=cmask, other=0.0)   # masked lanes stay 0
    c1 = tl.load(c_ptr + s * 2 * d + d + cols, mask=cmask, other=0.0)
    init0 = tl.load(init_ptr + s * 2)
    init1 = tl.load(init_ptr + s * 2 + 1)
    unit0 = init0 * 0.0  # 1 once the kernel moved the centroid
    unit1 = unit0
    pend0 = unit0 > 0    # the previous step moved the centroid: its r is written at this step
    pend1 = pend0
    rp0 = unit0          # that move's r from the dot products
    rp1 = unit0
    f_row = f_ptr + s * n * d
    acc_row = acc_ptr + s * 2 * n
    r_row = r_ptr + s * 2 * n
    # the loads do not depend on the decisions: Triton's pipeliner issues them STAGES - 1 steps ahead
    for j in tl.range(0, n, num_stages=STAGES):
        f = tl.load(f_row + j * d + cols, mask=cmask, other=0.0)
        lab0 = tl.load(lab_ptr + 2 * j)
        lab1 = tl.load(lab_ptr + 2 * j + 1)
        # the step's one reduction of c0.c0, f.c0, c1.c1, f.c1, and f.f beside it (module docstring)
        sums = tl.sum(tl.join(tl.join(c0 * c0, f * c0), tl.join(c1 * c1, f * c1)), axis=0)
        ff = tl.sum(f * f, axis=0)
        row0, row1 = tl.split(sums)   # join(x, y)[..., 0] = x: row0 = (c0.c0, f.c0), row1 = (c1.c1, f.c1)
        cc0, fc0 = tl.split(row0)
        cc1, fc1 = tl.split(row1)
        # the previous step's move, if any: its exact normaliser is r ||c_new|| (module docstring)
        tl.store(r_row + j - 1, rp0 * tl.sqrt_rn(cc0), mask=pend0)
        tl.store(r_row + n + j - 1, rp1 * tl.sqrt_rn(cc1), mask=pend1)
        g0 = _centroid_scale(cc0, unit0)
        g1 = _centroid_scale(cc1, unit1)
        cc0, fc0, cc1, fc1 = cc0 * g0 * g0, fc0 * g0, cc1 * g1 * g1, fc1 * g1
        # matching._decide on the ordering keys
        k0 = _closeness_key(ff, cc0, fc0, METRIC)
        k1 = _closeness_key(ff, cc1, fc1, METRIC)
        if FIXED_TAU:
            ok0 = k0 < tau_key
            ok1 = k1 < tau_key
        else:
            ok0 = (k0 < k1) | (init1 <= 0)   # an uninitialised other centroid is infinitely far
            ok1 = (k1 < k0) | (init0 <= 0)
        a0 = tl.where(ok0 | (init0 <= 0), lab0, 0.0)  # an uninitialised own centroid accepts
        a1 = tl.where(ok1 | (init1 <= 0), lab1, 0.0)
        c0, rp0 = _ema_move(c0, f, g0, cc0, fc0, ff, a0, alpha, beta)
        c1, rp1 = _ema_move(c1, f, g1, cc1, fc1, ff, a1, alpha, beta)
        pend0 = (a0 > 0) & (rp0 > 0)
        pend1 = (a1 > 0) & (rp1 > 0)
        unit0 = tl.where(pend0, 1.0, unit0)
        unit1 = tl.where(pend1, 1.0, unit1)
        init0 = tl.maximum(init0, a0)
        init1 = tl.maximum(init1, a1)
        tl.store(acc_row + j, a0)
        tl.store(acc_row + n + j, a1)
    cc0, cc1 = tl.split(tl.sum(tl.join(c0 * c0, c1 * c1), axis=0))  # the last move's r, the final centroids
    tl.store(r_row + n - 1, rp0 * tl.sqrt_rn(cc0), mask=pend0)
    tl.store(r_row + 2 * n - 1, rp1 * tl.sqrt_rn(cc1), mask=pend1)
    tl.store(c_out_ptr + s * 2 * d + cols, c0 * _centroid_scale(cc0, unit0), mask=cmask)
    tl.store(c_out_ptr + s * 2 * d + d + cols, c1 * _centroid_scale(cc1, unit1), mask=cmask)


def _tau_half_angle(tau: float) -> tuple[float, float]:
    """``(sin, cos)`` of ``tau / 2`` for the geodesic radius test ``y cos < x sin`` (module docstring);
    ``tau/2 > pi/2`` -> ``(1, -1)`` (always inside), ``tau <= 0`` -> ``(0, 1)`` (never)."""
    half = tau / 2.0
    if half <= 0.0:
        return 0.0, 1.0
    if half > math.pi / 2:
        return 1.0, -1.0
    return math.sin(half), math.cos(half)


def _tau_key(metric: str, tau: float) -> float:
    """The fixed radius on :func:`_closeness_key`'s scale: ``tau`` (l2, cosine) or ``-cos(tau)``
    (geodesic; ``tau > pi``: 2, always inside, since ``-cos <= 1``; ``tau <= 0``: -2, never)."""
    if metric != "geodesic":
        return tau
    return -2.0 if tau <= 0.0 else 2.0 if tau > math.pi else -math.cos(tau)


def default_num_warps(kernel: str, d: int) -> int:
    """Warps per program unless ``num_warps`` is given: dots 1; chords 1 per 256 lanes of its tile
    (``next_power_of_2(d)``), at least 1, at most 8 (4 at ViT-L's ``d = 768``)."""
    return 1 if kernel == "dots" else min(8, max(1, triton.next_power_of_2(d) // 256))


def resolve_kernel(kernel: str, update: str) -> str:
    """The kernel that runs: ``"auto"`` -> ``"dots"`` for the EMA, ``"chords"`` for slerp; checks that
    ``kernel`` is one of :data:`KERNELS` and implements ``update``."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if kernel == "auto":
        return "dots" if update == "ema" else "chords"
    if kernel == "dots" and update != "ema":
        raise ValueError("kernel='dots' implements the EMA update only; use 'chords' or 'auto' for slerp")
    return kernel


def gate_decisions(f, is_pos, is_neg, c_pos, c_neg, init_pos, init_neg, *, metric: str, alpha: float,
                   update: str = "ema", tau: float | None = None, num_warps: int | None = None,
                   kernel: str = DEFAULT_KERNEL) -> Decisions:
    """Algorithm 1's decisions for ``S`` slots in one kernel launch (no gradient).

    Shapes and meaning as ``matching._scan_decisions``: ``f: (S, n, d)`` unit features (float32),
    ``is_pos, is_neg: (n,)`` 0/1, ``c_*: (S, d)``, ``init_*: (S,)``; ``d <= MAX_D``. The tensors must be
    on a CUDA device, or on the CPU with Triton in interpreter mode (:func:`interpreted`).
    ``kernel``: one of :data:`KERNELS` (module docstring): ``"auto"`` (default: dots for the EMA,
    chords for slerp), ``"chords"``, ``"dots"`` (EMA only). ``num_warps``: warps per program (default:
    :func:`default_num_warps`).
    """
    if metric not in METRIC_IDS:
        raise ValueError(f"metric must be one of {tuple(METRIC_IDS)}, got {metric!r}")
    if update not in ("ema", "slerp"):
        raise ValueError(f"centroid update must be one of ('ema', 'slerp'), got {update!r}")
    kernel = resolve_kernel(kernel, update)
    S, n, d = f.shape
    if not 1 <= d <= MAX_D:
        raise ValueError(f"the Triton gate takes feature width d in [1, {MAX_D}], got {d}")
    on_cuda = f.device.type == "cuda"
    if interpreted() == on_cuda:
        raise ValueError("the Triton gate runs compiled on CUDA tensors, or on CPU tensors with Triton's "
                         f"interpreter (TRITON_INTERPRET=1 before triton is imported); got {f.device} tensors "
                         f"with the interpreter {'on' if interpreted() else 'off'}")
    with torch.no_grad():
        f = f.detach().float().contiguous()
        lab = torch.stack([is_pos, is_neg], dim=-1).to(f).contiguous()
        cents = torch.stack([c_pos, c_neg], dim=1).to(f).contiguous()
        inits = torch.stack([init_pos, init_neg], dim=1).to(f).contiguous()
        acc = torch.zeros(S, 2, n, device=f.device)
        r = torch.zeros(S, 2, n, device=f.device)
        c_out = cents.clone()
        block, fixed, warps = triton.next_power_of_2(d), tau is not None, num_warps or default_num_warps(kernel, d)
        radius = 0.0 if tau is None else float(tau)  # the kernels' tau argument (unused without FIXED_TAU)
        if S > 0:
            with torch.cuda.device(f.device) if on_cuda else _nullcontext():  # launch on the tensors' GPU
                if kernel == "dots":  # compiled with FMA contraction (module docstring)
                    _dots_kernel[(S,)](f, lab, cents, inits, acc, r, c_out, n, d, float(alpha), 1.0 - float(alpha),
                                       _tau_key(metric, radius) if fixed else 0.0, METRIC=METRIC_IDS[metric],
                                       FIXED_TAU=fixed, BLOCK_D=block, STAGES=DOTS_STAGES, num_warps=warps)
                else:
                    tau_sin, tau_cos = _tau_half_angle(radius) if fixed else (0.0, 1.0)
                    _gate_kernel[(S,)](f, lab, cents, inits, acc, r, c_out, n, d, float(alpha), 1.0 - float(alpha),
                                       radius, tau_sin, tau_cos, METRIC=METRIC_IDS[metric],
                                       FIXED_TAU=fixed, SLERP=update == "slerp", BLOCK_D=block, num_warps=warps,
                                       enable_fp_fusion=False)  # separate roundings of a*c + b*f, like torch, JAX
    return Decisions(acc[:, 0], acc[:, 1], r[:, 0], r[:, 1], c_out[:, 0], c_out[:, 1])
