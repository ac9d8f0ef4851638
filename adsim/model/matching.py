"""The detector's normal/anomaly centroids: state plus calls into ``poolsim.core`` on torch tensors.

Algorithm 1, step (3), per layer and task. For a unit feature ``f`` with label ``y`` and centroids
``c+`` (normal), ``c-`` (anomaly), ``d+- = M(f, c+-)`` and the adaptive radius is
``tau(f) = min(d+, d-)``. The feature is *matched* to its label's centroid only when that centroid
is strictly the closer one (``d_y = tau < d_other``, i.e. ``gate(d_y, d_other)`` of the core);
otherwise it is skipped. A matched feature moves its centroid by the EMA of the paper
(``alpha = 0.5`` then renormalisation, ``core.ema_update``) or, as an option, along the great
circle (``core.slerp_update``). Centroids start at zero ("no warm start"); a zero centroid is
*uninitialised* and never blocks: the first label-consistent feature initialises it (the EMA of a zero
centroid is ``f / ||f||``) and an uninitialised *other* centroid counts as infinitely far away.
(Taken literally, ``arccos(<f, 0>) = pi/2`` for both zero centroids would reject every feature forever.)

Two gate modes:

* ``sequential`` -- Algorithm 1 literally: features are visited one by one and each is gated against
  the centroids as already moved by the features before it (order-dependent; ``n`` small steps).
* ``batched`` -- every feature of the batch is gated against the *batch-start* centroids, and each
  centroid takes one EMA step towards the normalised mean of its matched features. One vectorised
  step per batch; with one feature per batch both modes are identical (tested).

All decisions are 0/1 float weights (no boolean indexing, no host syncs); the returned centroids carry
gradients through the matched features so that ``L_intra``/``L_inter`` train the adapters, while the
stored state is detached.

Exact and fast: :func:`match_sequential` takes Algorithm 1's decisions without a Python loop -- one
compiled, no-grad ``jax.lax.scan`` over the features on CPU, one fused Triton kernel per slot on CUDA
(:mod:`adsim.model.gate_triton`) -- and then rebuilds each centroid's EMA trajectory in torch as one
weighted sum of the matched features, ``c_n = W_0 c_0 + sum_j W_j f_j``, with the per-step normalisers
``r_j = ||alpha c_{j-1} + (1 - alpha) f_j||`` taken from the scan. Its decisions are the literal loop's
(same formulas in float32; only an exact floating-point tie could differ). **Gradient:** the normalisers
are held constant, so ``dc/df_j = W_j`` (followed by one final renormalisation): exactly the gradient of
the literal loop with every ``r_j`` detached (tested); with one EMA step per centroid the two coincide.
Slerp has no weighted-sum form: the same scan takes its decisions and :func:`slerp_trajectory` replays
the literal chain in torch over the accepted features only. ``match(..., mode="sequential")`` stays the
literal loop, the oracle of the tests.

The batched gate is an *approximation* of Algorithm 1 (decisions against the batch-start centroids);
how far its decisions and centroids are from the exact gate's, and what each costs on CPU and GPU, is
measured by ``benchmarks/adsim_gate.py`` and ``benchmarks/gpu_adsim.py`` (``benchmarks/RESULTS.md``).
"""
from __future__ import annotations

import math
import os
from functools import partial
from typing import NamedTuple, Optional

import numpy as np
import torch

from adsim.model.sphere import chords
from adsim.runtime.eager import outside_graphs
from poolsim import core

GATE_MODES = ("sequential", "batched")
UPDATES = ("ema", "slerp")


class Matched(NamedTuple):
    """One matching step: the normal and anomaly centroids ``(d,)`` after the update, which of the ``n``
    features each gate accepted (0/1, ``(n,)``), and whether each centroid is initialised."""
    c_pos: torch.Tensor    # (d,) normal centroid after the update (carries grad)
    c_neg: torch.Tensor    # (d,) anomaly centroid after the update
    acc_pos: torch.Tensor  # (n,) 0/1: feature matched to the normal centroid (S+)
    acc_neg: torch.Tensor  # (n,) 0/1: feature matched to the anomaly centroid (S-)
    init_pos: torch.Tensor  # () 0/1: normal centroid initialised
    init_neg: torch.Tensor


def _validate(metric: str, mode: str, update: str) -> None:
    if metric not in core.METRICS:
        raise ValueError(f"metric must be one of {core.METRICS}, got {metric!r}")
    if mode not in GATE_MODES:
        raise ValueError(f"gate mode must be one of {GATE_MODES}, got {mode!r}")
    if update not in UPDATES:
        raise ValueError(f"centroid update must be one of {UPDATES}, got {update!r}")


def _move(c, f, alpha, update):
    return core.ema_update(c, f, alpha) if update == "ema" else core.slerp_update(c, f, alpha)


def _gate(f, c_pos, c_neg, init_pos, init_neg, metric, tau=None):
    """0/1 ``(accept_as_normal_if_normal, accept_as_anomaly_if_anomaly)`` for ``f: (..., d)``.
    ``tau=None``: adaptive (own centroid strictly closer); a number: fixed radius ``d_own < tau``.

    Array-API code: the same function runs on torch (literal loop) and inside the compiled
    ``jax.lax.scan`` of :func:`match_sequential`.
    """
    xp = core.namespace(f)
    dist = xp.stack([core.distance(f, c_pos, metric), core.distance(f, c_neg, metric)], axis=-1)
    ok = _decide(dist, xp.stack([init_pos, init_neg], axis=-1), tau)
    return ok[..., 0], ok[..., 1]


def _decide(dist, inits, tau=None):
    """The gate on the distances to both centroids (array API; the one rule of the literal loop, the JAX
    scan and the batched gate): ``dist: (..., 2)`` to ``(c+, c-)``, ``inits`` 0/1 broadcast against it ->
    0/1 ``(..., 2)`` of ``dist``'s dtype."""
    xp = core.namespace(dist)
    known = inits > 0
    # own centroid strictly closer (d_own = tau = min(d+, d-) < d_other; an uninitialised other is
    # infinitely far) or, with a fixed tau, closer than tau; own uninitialised: accept
    other = xp.flip(xp.where(known, dist, float("inf")), axis=-1) if tau is None else tau
    return xp.where(known, core.gate(dist, other), 1.0)


def _batched_sums(f, labels, cents, inits, *, metric, tau=None) -> tuple:
    """The batched gate's decisions and matched sums for ``S`` slots: ``f: (S, n, d)`` *unit* features,
    ``labels: (n, 2)`` 0/1 weights (is normal, is anomalous), ``cents: (S, 2, d)`` batch-start centroids
    ``(c+, c-)``, ``inits: (S, 2)`` -> ``(acc (S, 2, n) 0/1, num (S, 2, d) sums of the matched
    features)``. Distances carry no gradient (the gate is 0/1); one fused pass over ``f`` for the
    geodesic gate (``_sphere.chords``) and one matmul for both matched sums."""
    with torch.no_grad():
        if metric == "geodesic" and tau is None:
            # the angle 2 asin(y / 2) increases with the chord y = ||f - c^||, so comparing chords is
            # comparing angles: one fused cdist pass (against c^ only) instead of angles from 2 chords
            (dist,) = chords(f, core.normalize(cents), both=False)  # (S, n, 2)
        else:  # ablation metrics and a fixed radius: the generic definitions (forward only)
            dist = core.distance(f[:, :, None, :], cents[:, None, :, :], metric)
        ok = _decide(dist, inits[:, None, :], tau)
    acc = (ok * labels).to(f.dtype).transpose(1, 2)  # (S, 2, n)
    # the matched sums as one batched matmul for both centroids, in float32 like the rest of matching
    # even when called inside an autocast region
    with torch.autocast(f.device.type, enabled=False):
        return acc, acc @ f


def _batched_update(num, total, cents, inits, *, alpha, update) -> tuple:
    """Each centroid one step towards the normalised mean of its matched features: ``num: (S, 2, d)``
    matched sums, ``total: (S, 2)`` their counts, ``cents: (S, 2, d)``, ``inits: (S, 2)`` -> ``(new
    centroids (S, 2, d), new inits (S, 2))``; a centroid without matched features stays as it was. The
    normalised mean is ``normalize(num)`` (the count only scales it)."""
    has = total > 0
    moved = _move(cents, core.normalize(torch.where(has[..., None], num, cents)), alpha, update)
    return torch.where(has[..., None], moved, cents), torch.maximum(inits, has.to(inits.dtype))


def _batched(f, is_pos, is_neg, c_pos, c_neg, init_pos, init_neg, *, metric, alpha, update, tau=None) -> Matched:
    """The batched gate for ``S`` slots at once with plain batched ops (no vmap).

    ``f: (S, n, d)`` *unit* features, ``is_pos, is_neg: (n,)`` 0/1 label weights, ``c_*: (S, d)``,
    ``init_*: (S,)``, ``tau`` as :func:`_gate`. Per slot the same as the per-feature rule of
    :func:`match`: distances to the batch-start centroids, then each centroid moves one step towards
    the normalised mean of its matched features (:func:`_batched_sums`, :func:`_batched_update`).
    """
    cents = torch.stack([c_pos, c_neg], dim=1)  # (S, 2, d)
    inits = torch.stack([init_pos, init_neg], dim=1).to(f.dtype)  # (S, 2)
    acc, num = _batched_sums(f, torch.stack([is_pos, is_neg], -1), cents, inits, metric=metric, tau=tau)
    new, inits = _batched_update(num, acc.sum(-1), cents, inits, alpha=alpha, update=update)
    return Matched(new[:, 0], new[:, 1], acc[:, 0], acc[:, 1], inits[:, 0], inits[:, 1])


def _runs(slices: list) -> list[list[int]]:
    """The indices of ``slices`` (disjoint slot ranges) grouped into runs of adjacent ranges, in slot order."""
    runs: list[list[int]] = []
    for i in sorted(range(len(slices)), key=lambda i: slices[i].start):
        if runs and slices[runs[-1][-1]].stop == slices[i].start:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def match(f, y, valid, c_pos, c_neg, init_pos, init_neg, *, metric: str = "geodesic",
          mode: str = "batched", alpha: float = 0.5, update: str = "ema", tau: float | None = None) -> Matched:
    """Gate features and update the two centroids.

    ``f: (n, d)`` features (normalised here), ``y: (n,)`` 1 = anomaly / 0 = normal, ``valid: (n,)``
    0/1 (0 = label unknown, e.g. a patch half inside a lesion or an image without a mask);
    ``c_pos, c_neg: (d,)``; ``init_pos, init_neg: ()`` 0/1 floats.
    """
    _validate(metric, mode, update)
    f = core.normalize(f.float())
    y, valid = y.to(f.dtype), valid.to(f.dtype)
    is_pos, is_neg = (1.0 - y) * valid, y * valid
    if mode == "batched":
        state = (t[None] for t in (c_pos, c_neg, init_pos, init_neg))
        out = _batched(f[None], is_pos, is_neg, *state, metric=metric, alpha=alpha, update=update, tau=tau)
        return Matched(*(t[0] for t in out))
    acc_pos, acc_neg = [], []
    for j in range(f.shape[0]):  # Algorithm 1 literally; no host sync inside the loop
        ok_pos, ok_neg = _gate(f[j], c_pos, c_neg, init_pos, init_neg, metric, tau)
        a_pos, a_neg = ok_pos * is_pos[j], ok_neg * is_neg[j]
        c_pos = a_pos * _move(c_pos, f[j], alpha, update) + (1.0 - a_pos) * c_pos
        c_neg = a_neg * _move(c_neg, f[j], alpha, update) + (1.0 - a_neg) * c_neg
        init_pos, init_neg = torch.maximum(init_pos, a_pos), torch.maximum(init_neg, a_neg)
        acc_pos.append(a_pos)
        acc_neg.append(a_neg)
    return Matched(c_pos, c_neg, torch.stack(acc_pos), torch.stack(acc_neg), init_pos, init_neg)


def _scan_decisions(f, is_pos, is_neg, c_pos, c_neg, init_pos, init_neg, *, metric: str, alpha: float,
                    unroll: int = 1, tau: float | None = None, update: str = "ema"):
    """Algorithm 1's decisions for ``S`` slots at once (jax.numpy; compiled by :func:`_compiled_scan`).

    ``f: (S, n, d)`` unit features, ``is_pos, is_neg: (n,)`` 0/1, ``c_*: (S, d)``, ``init_*: (S,)``.
    Returns ``(acc_pos, acc_neg, r_pos, r_neg)``, each ``(S, n)``: the 0/1 decisions and, per step, the
    norm ``r = ||alpha c + (1 - alpha) f||`` that the EMA divides by (0 where the EMA would be 0/0 and
    leaves ``c`` unchanged, the antipodal case of ``core.ema_update``). ``update="slerp"``: the
    centroids move by ``core.slerp_update`` and ``r`` is the decisions again (unused).
    """
    import jax.numpy as jnp
    from jax import lax

    def body(carry, x):
        cp, cn, ip, in_ = carry
        fj, pj, nj = x
        ok_pos, ok_neg = _gate(fj, cp, cn, ip, in_, metric, tau)
        out = [ok_pos * pj, ok_neg * nj]
        moved = []
        for c, a in ((cp, out[0]), (cn, out[1])):
            moved.append(jnp.where(a[:, None] > 0, _move(c, fj, alpha, update), c))
            # the EMA's normaliser (slerp needs none: its chain is replayed literally, slerp_trajectory)
            out.append(a * core.safe_norm(core.ema_update(c, fj, alpha, renormalize=False)) if update == "ema"
                       else a)
        carry = (moved[0], moved[1], jnp.maximum(ip, out[0]), jnp.maximum(in_, out[1]))
        return carry, tuple(out)

    _, (acc_pos, acc_neg, r_pos, r_neg) = lax.scan(body, (c_pos, c_neg, init_pos, init_neg),
                                                   (jnp.swapaxes(f, 0, 1), is_pos, is_neg), unroll=unroll)
    return tuple(jnp.swapaxes(t, 0, 1) for t in (acc_pos, acc_neg, r_pos, r_neg))


_SCANS: dict = {}


def _jax():
    """``jax``, imported lazily. JAX would otherwise reserve most of a GPU's memory, which torch shares;
    the flag is read when JAX first starts its GPU backend, so every JAX use here goes through this."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax

    return jax


# Scan steps per loop iteration on a GPU: each ``while`` iteration there costs kernel launches and a
# predicate read-back, so several steps per iteration are cheaper; on the CPU unrolling only lengthens
# compilation. (Measured: benchmarks/RESULTS.md, adsim exact gate.)
GPU_UNROLL = 8


def _compiled_scan(metric: str, alpha: float, unroll: int = 1, tau: float | None = None, update: str = "ema"):
    """``jax.jit`` of :func:`_scan_decisions` for one (metric, alpha, unroll, tau, update); recompiles per
    shape."""
    key = (metric, float(alpha), int(unroll), tau, update)
    if key not in _SCANS:
        _SCANS[key] = _jax().jit(partial(_scan_decisions, metric=metric, alpha=float(alpha), unroll=int(unroll),
                                         tau=tau, update=update))
    return _SCANS[key]


SCAN_DEVICES = ("auto", "cpu")
SCAN_BACKENDS = ("auto", "jax", "triton")


def _triton_gate():
    """``adsim.model.gate_triton`` if Triton is importable, else ``None`` (Triton ships with torch's CUDA
    wheels on Linux; it is absent from CPU-only installs)."""
    try:
        from adsim.model import gate_triton as _gate_triton
    except ImportError:
        return None
    return _gate_triton


def _use_triton(f, scan_backend: str, scan_device: str) -> bool:
    """Whether :func:`match_sequential` takes its decisions with the Triton kernel: ``"triton"``
    always (a clear error if it cannot run), ``"auto"`` for CUDA tensors of width <= ``MAX_D`` when
    Triton is importable and compiling (not the interpreter) and ``scan_device`` is ``"auto"``."""
    if scan_backend == "jax":
        return False
    gate = _triton_gate()
    if scan_backend == "triton":
        if gate is None:
            raise ValueError("scan_backend='triton' needs the triton package (pip install triton)")
        return True
    return (gate is not None and scan_device == "auto" and f.device.type == "cuda"
            and f.shape[-1] <= gate.MAX_D and not gate.interpreted())


def _to_jax(t: torch.Tensor, scan_device: str):
    """A float32 torch tensor as a JAX array: on the tensor's GPU (zero-copy through DLPack) when
    ``scan_device="auto"`` and JAX has a GPU, else in host memory (the scan then runs on the CPU)."""
    jax = _jax()
    t = t.detach().contiguous()
    if scan_device == "auto" and t.device.type != "cpu" and any(d.platform == "gpu" for d in jax.devices()):
        return jax.dlpack.from_dlpack(t)
    if jax.default_backend() == "cpu":  # a NumPy copy: the jitted call moves it (cheaper than device_put)
        return t.cpu().numpy().copy()
    return jax.device_put(t.cpu().numpy(), jax.devices("cpu")[0])


def _to_torch(a, device) -> torch.Tensor:
    if device.type != "cpu" and getattr(a, "devices", None) and next(iter(a.devices())).platform == "gpu":
        return torch.from_dlpack(a)
    return torch.from_numpy(np.asarray(a).copy()).to(device)


def ema_trajectory(f, c0, moved, r, alpha: float):
    """Centroids after the EMA steps of Algorithm 1 as one weighted sum, ``(S, d)`` (or ``(S, k, d)``).

    ``f: (S, n, d)`` unit features, ``c0: (S, d)`` start centroids, ``moved: (S, n)`` 0/1 (feature
    ``j`` moved the centroid), ``r: (S, n)`` the normaliser of each step (ignored where not moved);
    or ``k`` centroids per slot on the same features at once (``c0: (S, k, d)``, ``moved, r: (S, k, n)``).
    Unrolling ``c_j = (alpha c_{j-1} + (1 - alpha) f_j) / r_j``:
    ``c_n = prod_k (alpha / r_k) c_0 + sum_j (1 - alpha) / r_j prod_{k > j} (alpha / r_k) f_j``
    (products over moved steps). The products are sums of logs taken from the end (so the recent
    steps, which carry the weight, are summed without cancellation) and the result is renormalised
    once, which changes the value only by rounding. Gradients reach ``f`` and ``c0`` with ``r`` held
    constant (see the module docstring).
    """
    moved = moved.to(f.dtype)
    r = torch.where(moved > 0, r.to(f.dtype), torch.ones_like(r, dtype=f.dtype))
    log_step = moved * (math.log(alpha) - torch.log(r))          # log(alpha / r_k) on moved steps
    after = torch.flip(torch.cumsum(torch.flip(log_step, (-1,)), -1), (-1,)) - log_step  # sum_{k > j}
    w = moved * (1.0 - alpha) / r * torch.exp(after)
    w0 = torch.exp(log_step.sum(-1))
    c = w0[..., None] * c0 + torch.einsum("s...n,snd->s...d", w, f)
    any_moved = moved.amax(-1, keepdim=True) > 0
    return torch.where(any_moved, core.normalize(c), c0)


def slerp_trajectory(f, c0, moved, alpha: float, steps=None):
    """Centroids after the slerp steps of Algorithm 1, ``(S, d)``: the literal chain replayed over the
    features that moved some slot's centroid.

    ``f: (S, n, d)`` unit features, ``c0: (S, d)`` start centroids, ``moved: (S, n)`` 0/1 decisions
    (no gradient). Slerp has no weighted-sum form, so each replayed step is one ``core.slerp_update``
    of all ``S`` slots, blended with the decision as the literal loop of :func:`match` does
    (``a * slerp(c, f_j) + (1 - a) * c``); steps where no slot moved are skipped (they change nothing
    and, as in the loop, pass no gradient). Values and gradients are therefore the literal loop's,
    with at most ``n`` vectorised steps instead of ``S * n`` gate-and-move steps. ``steps``: the
    indices ``j`` to replay (a host list, e.g. :func:`moved_steps` of several centroids at once; any
    superset of the moving steps gives the same result, since a step with ``a = 0`` keeps ``c``);
    ``None`` reads them from ``moved`` (one host sync).
    """
    moved = moved.to(f.dtype)
    if steps is None:
        steps = moved_steps([moved])[0]
    c = c0.clone()  # a new tensor even when nothing moves (c0 may be a view of a bank buffer)
    for j in steps:
        a = moved[:, j, None]
        c = a * _move(c, f[:, j], alpha, "slerp") + (1.0 - a) * c
    return c


def moved_steps(moved: list) -> list:
    """``[[j, ...], ...]``: per ``moved_k: (S_k, n_k)`` 0/1 decisions, the steps ``j`` where some slot moved,
    read to the host in ONE synchronisation for all of them (slerp's replay, :func:`slerp_trajectory`,
    needs them as host indices: the one host decision of the exact slerp gate)."""
    if not moved:
        return []
    flags = torch.cat([m.amax(0) > 0 for m in moved])
    hits = torch.nonzero(flags).flatten().tolist()  # the host read
    out, start = [], 0
    for m in moved:
        n = m.shape[1]
        out.append([j - start for j in hits if start <= j < start + n])
        start += n
    return out


class Decided(NamedTuple):
    """The exact gate's decisions for one set of slots (:func:`sequential_decisions`), before the centroids
    are rebuilt (:func:`sequential_centroids`); index 0 of the centroid axis is normal, 1 anomalous."""
    f: torch.Tensor      # (S, n, d) unit features (carry grad)
    state: list          # [c_pos (S, d), c_neg (S, d), init_pos (S,), init_neg (S,)] start state
    acc: torch.Tensor    # (S, 2, n) 0/1 decisions
    r: torch.Tensor      # (S, 2, n) EMA normalisers (slerp: the decisions again)


def match_sequential(f, y, valid, c_pos, c_neg, init_pos, init_neg, *, metric: str = "geodesic",
                     alpha: float = 0.5, update: str = "ema", scan_device: str = "auto",
                     tau: float | None = None, scan_backend: str = "auto") -> Matched:
    """Algorithm 1's sequential gate, exact and fast, for ``S`` slots at once.

    ``f: (S, n, d)`` features (normalised here), ``y, valid: (n,)`` shared by the slots,
    ``c_pos, c_neg: (S, d)``, ``init_pos, init_neg: (S,)``. Returns :class:`Matched` with a leading
    slot axis; same decisions as ``match(..., mode="sequential")`` slot by slot, centroids equal up
    to rounding, gradients with the EMA normalisers held constant (``update="ema"``) or the literal
    loop's gradients (``update="slerp"``: :func:`slerp_trajectory` replays the chain over the accepted
    features).
    ``scan_backend``: what takes the decisions. ``"triton"``: one fused Triton kernel
    (``adsim.model.gate_triton``; CUDA tensors, or CPU tensors under Triton's interpreter, for tests);
    ``"jax"``: the compiled ``jax.lax.scan``; ``"auto"`` (default): the kernel for CUDA tensors when
    Triton is installed (width <= 1024), else the JAX scan. ``scan_device`` (JAX scan only):
    ``"auto"`` runs the scan on the tensors' GPU when JAX has one (else on the CPU); ``"cpu"`` always
    copies the features to the host and scans there (and makes ``"auto"`` pick the JAX scan).
    """
    _validate(metric, "sequential", update)
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"EMA factor alpha must be in (0, 1), got {alpha!r}")
    if scan_device not in SCAN_DEVICES:
        raise ValueError(f"scan_device must be one of {SCAN_DEVICES}, got {scan_device!r}")
    if scan_backend not in SCAN_BACKENDS:
        raise ValueError(f"scan_backend must be one of {SCAN_BACKENDS}, got {scan_backend!r}")
    if f.ndim != 3 or c_pos.shape != (f.shape[0], f.shape[2]) or y.shape != (f.shape[1],):
        raise ValueError(f"match_sequential wants f (S, n, d), c (S, d), y (n,); got f {tuple(f.shape)}, "
                         f"c {tuple(c_pos.shape)}, y {tuple(y.shape)}")
    dec = sequential_decisions(f, y, valid, c_pos, c_neg, init_pos, init_neg, metric=metric, alpha=alpha,
                               update=update, scan_device=scan_device, tau=tau, scan_backend=scan_backend)
    return sequential_centroids(dec, alpha=alpha, update=update)


def sequential_decisions(f, y, valid, c_pos, c_neg, init_pos, init_neg, *, metric: str, alpha: float,
                         update: str, scan_device: str = "auto", tau: float | None = None,
                         scan_backend: str = "auto", unit: bool = False) -> Decided:
    """The first half of :func:`match_sequential` (arguments as there, checked there): normalise ``f``
    (``unit=True``: its rows are unit vectors already) and take Algorithm 1's decisions (Triton kernel
    or JAX scan, through the opaque operator :func:`gate_decisions_op`; no gradient, no host
    synchronisation on CUDA)."""
    f = f.float() if unit else core.normalize(f.float())
    y, valid = y.to(f.dtype), valid.to(f.dtype)
    is_pos, is_neg = (1.0 - y) * valid, y * valid
    state = [t.to(f.dtype) for t in (c_pos, c_neg, init_pos, init_neg)]
    backend = "triton" if _use_triton(f, scan_backend, scan_device) else "jax"
    # the decisions carry no gradient
    f_, pos, neg, c_pos, c_neg, init_pos, init_neg = (t.detach() for t in (f, is_pos, is_neg, *state))
    args = (f_, pos, neg, c_pos, c_neg, init_pos, init_neg, metric, float(alpha), update, tau, backend, scan_device)
    if torch.compiler.is_compiling():  # one node of the graph
        return Decided(f, state, *gate_decisions_op(*args))
    return Decided(f, state, *_decisions(*args))


def _decisions(f, is_pos, is_neg, c_pos, c_neg, init_pos, init_neg, metric, alpha, update, tau, backend,
               scan_device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(acc, r)``, each ``(S, 2, n)``, by ``backend`` (:func:`gate_decisions_op`)."""
    if backend == "triton":
        dec = _triton_gate().gate_decisions(f, is_pos, is_neg, c_pos, c_neg, init_pos, init_neg, metric=metric,
                                            alpha=alpha, update=update, tau=tau)
        return torch.stack([dec.acc_pos, dec.acc_neg], 1), torch.stack([dec.r_pos, dec.r_neg], 1)
    with torch.no_grad():
        args = [_to_jax(t, scan_device) for t in (f, is_pos, is_neg, c_pos, c_neg, init_pos, init_neg)]
        on_gpu = hasattr(args[0], "devices") and next(iter(args[0].devices())).platform == "gpu"
        scan = _compiled_scan(metric, alpha, GPU_UNROLL if on_gpu else 1, tau, update)
        acc_pos, acc_neg, r_pos, r_neg = (_to_torch(a, f.device) for a in scan(*args))
    return torch.stack([acc_pos, acc_neg], 1), torch.stack([r_pos, r_neg], 1)


@torch.library.custom_op("adsim::gate_decisions", mutates_args=())
def gate_decisions_op(f: torch.Tensor, is_pos: torch.Tensor, is_neg: torch.Tensor, c_pos: torch.Tensor,
                      c_neg: torch.Tensor, init_pos: torch.Tensor, init_neg: torch.Tensor, metric: str,
                      alpha: float, update: str, tau: Optional[float], backend: str,
                      scan_device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Algorithm 1's decisions as one PyTorch operator (``torch.ops.adsim.gate_decisions``), arguments
    as :func:`_scan_decisions` (``f`` detached unit float32 features) plus ``backend``: ``"triton"``
    (:func:`adsim.model.gate_triton.gate_decisions`) or ``"jax"`` (the compiled scan, on ``scan_device``).
    Returns ``(acc, r)``, each ``(S, 2, n)``: the normal / anomaly decisions and EMA normalisers.

    An operator because ``torch.compile`` does not trace into a hand-launched Triton kernel or a JAX
    call: dynamo records the call as one node (shapes from the fake implementation below), so the exact
    gate's step stays one graph -- inductor calls it as an external kernel, and under CUDA graphs the
    Triton launch is captured with the rest of the step (it allocates on the stream and never
    synchronises). The JAX scan on a GPU is not capturable (its own streams): :class:`CentroidBank` keeps
    it, and slerp's host read of the steps to replay, between graphs. Eager code calls the same
    implementation without the operator's dispatch."""
    return _decisions(f, is_pos, is_neg, c_pos, c_neg, init_pos, init_neg, metric, alpha, update, tau, backend,
                      scan_device)


@gate_decisions_op.register_fake
def _gate_decisions_shapes(f, is_pos, is_neg, c_pos, c_neg, init_pos, init_neg, metric, alpha, update, tau,
                           backend, scan_device):
    S, n, _ = f.shape
    return f.new_empty((S, 2, n)), f.new_empty((S, 2, n))


def traced_gate(f: torch.Tensor, update: str, scan_backend: str = "auto") -> bool:
    """Whether the exact gate of a step on features like ``f`` can run inside a compiled graph (the
    EMA through :func:`gate_decisions_op`, with the Triton kernel or on CPU tensors); else
    :class:`CentroidBank` runs it between graphs (slerp reads the steps to replay on the host; the JAX
    scan on a GPU runs on its own streams, which CUDA graphs cannot capture)."""
    return update == "ema" and (f.device.type == "cpu" or _use_triton(f, scan_backend, "auto"))


def sequential_centroids(dec: Decided, *, alpha: float, update: str, steps=None) -> Matched:
    """The second half of :func:`match_sequential`: the centroids from the decisions ``dec`` -- the EMA
    as one weighted sum (:func:`ema_trajectory`), slerp replayed (:func:`slerp_trajectory`, over
    ``steps``: the host indices of the steps where either centroid of any slot moved; ``None``: read
    here, one host sync for both centroids)."""
    f, state, acc = dec.f, dec.state, dec.acc
    if update == "ema":  # both centroids in one weighted sum
        c_pos, c_neg = ema_trajectory(f, torch.stack(state[:2], 1), acc * (dec.r > 0), dec.r, alpha).unbind(1)
    else:
        if steps is None:
            steps = moved_steps([acc.amax(1)])[0]
        c_pos = slerp_trajectory(f, state[0], acc[:, 0], alpha, steps)
        c_neg = slerp_trajectory(f, state[1], acc[:, 1], alpha, steps)
    init_pos, init_neg = torch.maximum(torch.stack(state[2:], 1), acc.amax(-1)).unbind(1)
    return Matched(c_pos, c_neg, acc[:, 0], acc[:, 1], init_pos, init_neg)


def sequential_sets(sets: list, *, metric: str, alpha: float, update: str, tau: float | None = None,
                    scan_backend: str = "auto", unit: bool = False) -> list:
    """:func:`match_sequential` for several sets of slots at once, ``sets = [(f (S, n, d), y (n,),
    valid (n,), c_pos, c_neg, init_pos, init_neg)]`` -> ``[Matched]``: every set's decisions first, then
    (slerp) ONE host read of the steps to replay for all sets (:func:`moved_steps`), then the centroids.
    The EMA needs no host read at all. ``unit=True``: the rows of every ``f`` are unit vectors already."""
    decs = [sequential_decisions(*s, metric=metric, alpha=alpha, update=update, tau=tau, scan_backend=scan_backend,
                                 unit=unit) for s in sets]
    steps = [None] * len(decs)
    if update != "ema":
        steps = moved_steps([d.acc.amax(1) for d in decs])
    return [sequential_centroids(d, alpha=alpha, update=update, steps=st) for d, st in zip(decs, steps)]


def _cat(tensors: list) -> torch.Tensor:
    """``torch.cat`` along axis 0 that returns a single tensor as is (no copy)."""
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors)


class CentroidBank(torch.nn.Module):
    """Centroid state for ``n_slots`` (layer, task) pairs, stored as buffers so it is checkpointed.

    ``step(start, f, y, valid)`` matches ``f: (S, n, d)`` against slots ``start .. start+S-1``
    (``y, valid: (n,)`` shared by the slots) and, in training mode, stores the detached result. The
    batched gate runs all slots with the same batched kernels (``_batched``); the sequential gate is
    :func:`match_sequential` (all slots in one compiled scan, or one Triton kernel on CUDA: ``scan_backend``)
    for both the EMA and the slerp update.
    """

    c_pos: torch.Tensor
    """``(n_slots, dim)`` normal centroids: a buffer."""
    c_neg: torch.Tensor
    """``(n_slots, dim)`` anomalous centroids: a buffer."""
    init_pos: torch.Tensor
    """``(n_slots,)`` 0/1: normal centroid initialised: a buffer."""
    init_neg: torch.Tensor
    """``(n_slots,)`` 0/1: anomalous centroid initialised: a buffer."""

    def __init__(self, n_slots: int, dim: int, *, metric: str = "geodesic", mode: str = "batched",
                 alpha: float = 0.5, update: str = "ema", tau: float | None = None, scan_backend: str = "auto"):
        super().__init__()
        _validate(metric, mode, update)
        if not 0.0 < alpha < 1.0:
            raise ValueError(f"EMA factor alpha must be in (0, 1), got {alpha!r}")
        if scan_backend not in SCAN_BACKENDS:
            raise ValueError(f"scan_backend must be one of {SCAN_BACKENDS}, got {scan_backend!r}")
        self.metric, self.mode, self.alpha, self.update, self.tau = metric, mode, alpha, update, tau
        self.scan_backend = scan_backend  # sequential mode: what takes the decisions (match_sequential)
        self.register_buffer("c_pos", torch.zeros(n_slots, dim))
        self.register_buffer("c_neg", torch.zeros(n_slots, dim))
        self.register_buffer("init_pos", torch.zeros(n_slots))
        self.register_buffer("init_neg", torch.zeros(n_slots))

    def step(self, start: int, f, y, valid, *, unit: bool = False) -> Matched:
        """``Matched`` with a leading slot axis ``S`` on every field. ``unit=True``: the rows of ``f``
        are already unit vectors (skips the normalisation)."""
        return self.steps([(start, f, y, valid)], unit=unit)[0]

    def steps(self, items: list, *, unit: bool = False) -> list:
        """:meth:`step` for several sets ``items = [(start, f (S, n, d), y (n,), valid (n,))]`` (disjoint slot
        ranges) -> ``[Matched]``. The exact gate takes every set's decisions before any centroid is rebuilt,
        so that slerp reads the steps it replays for all sets in one host synchronisation
        (:func:`sequential_sets`); the EMA and the batched gate need none."""
        slices = [slice(start, start + f.shape[0]) for start, f, _, _ in items]
        states = [(self.c_pos[sl], self.c_neg[sl], self.init_pos[sl], self.init_neg[sl]) for sl in slices]
        if self.mode == "batched":
            outs: list = [None] * len(items)
            for run in _runs(slices):  # adjacent slot ranges: one centroid update for all their slots
                lo, hi = slices[run[0]].start, slices[run[-1]].stop
                cents = torch.stack([self.c_pos[lo:hi], self.c_neg[lo:hi]], dim=1)  # (S, 2, d)
                inits = torch.stack([self.init_pos[lo:hi], self.init_neg[lo:hi]], dim=1)  # (S, 2)
                accs, nums = [], []
                for i in run:
                    _, f, y, valid = items[i]
                    f = f.float() if unit else core.normalize(f.float())
                    y, valid = y.to(f.dtype), valid.to(f.dtype)
                    rows = slice(slices[i].start - lo, slices[i].stop - lo)
                    acc, num = _batched_sums(f, torch.stack([(1.0 - y) * valid, y * valid], -1), cents[rows],
                                             inits[rows], metric=self.metric, tau=self.tau)
                    accs.append(acc)
                    nums.append(num)
                new, new_inits = _batched_update(_cat(nums), _cat([a.sum(-1) for a in accs]), cents, inits,
                                                 alpha=self.alpha, update=self.update)
                # each set's rows by one unbind and one split (each a single op in the backward pass)
                sizes = [slices[i].stop - slices[i].start for i in run]
                c_pos, c_neg, i_pos, i_neg = (t.split(sizes) for t in (*new.unbind(1), *new_inits.unbind(1)))
                for j, (i, acc) in enumerate(zip(run, accs)):
                    outs[i] = Matched(c_pos[j], c_neg[j], acc[:, 0], acc[:, 1], i_pos[j], i_neg[j])
        else:  # exact sequential gate, all slots of a set in one kernel / compiled scan (EMA and slerp)
            sets = [(f, y, valid, *state) for (_, f, y, valid), state in zip(items, states)]
            # under torch.compile: in the graph (gate_decisions_op), or eagerly between compiled graphs
            # where traced_gate says it cannot be in one
            traced = all(traced_gate(f, self.update, self.scan_backend) for _, f, _, _ in items)
            outs = (sequential_sets if traced else partial(outside_graphs, sequential_sets))(
                sets, metric=self.metric, alpha=self.alpha, update=self.update, tau=self.tau,
                scan_backend=self.scan_backend, unit=unit)
        if self.training:
            with torch.no_grad():
                for sl, out in zip(slices, outs):
                    self.c_pos[sl] = out.c_pos.detach()
                    self.c_neg[sl] = out.c_neg.detach()
                    self.init_pos[sl] = out.init_pos.detach()
                    self.init_neg[sl] = out.init_neg.detach()
        return outs
