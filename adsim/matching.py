"""The detector's normal/anomaly centroids: state plus calls into ``poolsim._core`` on torch tensors.

Algorithm 1, step (3), per layer and task. For a unit feature ``f`` with label ``y`` and centroids
``c+`` (normal), ``c-`` (anomaly), ``d+- = M(f, c+-)`` and the adaptive radius is
``tau(f) = min(d+, d-)``. The feature is *matched* to its label's centroid only when that centroid
is strictly the closer one (``d_y = tau < d_other``, i.e. ``gate(d_y, d_other)`` of the core);
otherwise it is skipped. A matched feature moves its centroid by the EMA of the paper
(``alpha = 0.5`` then renormalisation, ``_core.ema_update``) or, as an option, along the great
circle (``_core.slerp_update``). Centroids start at zero ("no warm start"); a zero centroid is
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
"""
from __future__ import annotations

from functools import partial
from typing import NamedTuple

import torch

from poolsim import _core

from ._sphere import chords

GATE_MODES = ("sequential", "batched")
UPDATES = ("ema", "slerp")


class Matched(NamedTuple):
    c_pos: torch.Tensor    # (d,) normal centroid after the update (carries grad)
    c_neg: torch.Tensor    # (d,) anomaly centroid after the update
    acc_pos: torch.Tensor  # (n,) 0/1: feature matched to the normal centroid (S+)
    acc_neg: torch.Tensor  # (n,) 0/1: feature matched to the anomaly centroid (S-)
    init_pos: torch.Tensor  # () 0/1: normal centroid initialised
    init_neg: torch.Tensor


def _validate(metric: str, mode: str, update: str) -> None:
    if metric not in _core.METRICS:
        raise ValueError(f"metric must be one of {_core.METRICS}, got {metric!r}")
    if mode not in GATE_MODES:
        raise ValueError(f"gate mode must be one of {GATE_MODES}, got {mode!r}")
    if update not in UPDATES:
        raise ValueError(f"centroid update must be one of {UPDATES}, got {update!r}")


def _move(c, f, alpha, update):
    return _core.ema_update(c, f, alpha) if update == "ema" else _core.slerp_update(c, f, alpha)


def _gate(f, c_pos, c_neg, init_pos, init_neg, metric):
    """0/1 ``(accept_as_normal_if_normal, accept_as_anomaly_if_anomaly)`` for ``f: (..., d)``."""
    return _decide(_core.distance(f, c_pos, metric), _core.distance(f, c_neg, metric), init_pos, init_neg)


def _decide(d_pos, d_neg, init_pos, init_neg):
    """The gate on distances to the two centroids (``init_*`` broadcast against ``d_*``)."""
    inf = torch.full_like(d_pos, float("inf"))
    d_pos_eff = torch.where(init_pos > 0, d_pos, inf)   # uninitialised centroid: infinitely far
    d_neg_eff = torch.where(init_neg > 0, d_neg, inf)
    # own centroid strictly closer (d_own = tau = min(d+, d-) < d_other); own uninitialised: accept
    ok_pos = torch.where(init_pos > 0, _core.gate(d_pos, d_neg_eff), torch.ones_like(d_pos))
    ok_neg = torch.where(init_neg > 0, _core.gate(d_neg, d_pos_eff), torch.ones_like(d_neg))
    return ok_pos, ok_neg


def _batched(f, is_pos, is_neg, c_pos, c_neg, init_pos, init_neg, *, metric, alpha, update) -> Matched:
    """The batched gate for ``S`` slots at once with plain batched ops (no vmap).

    ``f: (S, n, d)`` *unit* features, ``is_pos, is_neg: (n,)`` 0/1 label weights, ``c_*: (S, d)``,
    ``init_*: (S,)``. Per slot the same as the per-feature rule of :func:`match`: distances to the
    batch-start centroids (no gradient: the gate is 0/1), then each centroid moves one step towards
    the normalised mean of its matched features. Costs per slot: one fused pass over ``f`` for the
    geodesic gate (``_sphere.chords``, no gradient) and one matmul for both matched sums.
    """
    cents = torch.stack([c_pos, c_neg], dim=1)  # (S, 2, d)
    inits = torch.stack([init_pos, init_neg], dim=1)  # (S, 2)
    with torch.no_grad():
        if metric == "geodesic":
            # the angle 2 asin(y / 2) increases with the chord y = ||f - c^||, so comparing chords is
            # comparing angles: one fused cdist pass (against c^ only) instead of angles from 2 chords
            (dist,) = chords(f, _core.normalize(cents), both=False)  # (S, n, 2)
        else:  # ablation metrics: the generic definitions (forward only)
            dist = _core.distance(f[:, :, None, :], cents[:, None, :, :], metric)
        ok_pos, ok_neg = _decide(dist[..., 0], dist[..., 1], init_pos[:, None], init_neg[:, None])
    acc = torch.stack([ok_pos * is_pos, ok_neg * is_neg], dim=1).to(f.dtype)  # (S, 2, n)
    total = acc.sum(-1)  # (S, 2)
    has = total > 0
    # matched means (the _core.weighted_mean rule, as one batched matmul for both centroids), in
    # float32 like the rest of matching even when called inside an autocast region
    with torch.autocast(f.device.type, enabled=False):
        num = acc @ f  # (S, 2, d)
    mean = torch.where(has[..., None], num / torch.where(has, total, 1.0)[..., None], cents)
    moved = _move(cents, _core.normalize(mean), alpha, update)
    h = has.to(f.dtype)
    new = h[..., None] * moved + (1.0 - h[..., None]) * cents
    inits = torch.maximum(inits, h)
    return Matched(new[:, 0], new[:, 1], acc[:, 0], acc[:, 1], inits[:, 0], inits[:, 1])


def match(f, y, valid, c_pos, c_neg, init_pos, init_neg, *, metric: str = "geodesic",
          mode: str = "batched", alpha: float = 0.5, update: str = "ema") -> Matched:
    """Gate features and update the two centroids.

    ``f: (n, d)`` features (normalised here), ``y: (n,)`` 1 = anomaly / 0 = normal, ``valid: (n,)``
    0/1 (0 = label unknown, e.g. a patch half inside a lesion or an image without a mask);
    ``c_pos, c_neg: (d,)``; ``init_pos, init_neg: ()`` 0/1 floats.
    """
    _validate(metric, mode, update)
    f = _core.normalize(f.float())
    y, valid = y.to(f.dtype), valid.to(f.dtype)
    is_pos, is_neg = (1.0 - y) * valid, y * valid
    if mode == "batched":
        state = (t[None] for t in (c_pos, c_neg, init_pos, init_neg))
        out = _batched(f[None], is_pos, is_neg, *state, metric=metric, alpha=alpha, update=update)
        return Matched(*(t[0] for t in out))
    acc_pos, acc_neg = [], []
    for j in range(f.shape[0]):  # Algorithm 1 literally; no host sync inside the loop
        ok_pos, ok_neg = _gate(f[j], c_pos, c_neg, init_pos, init_neg, metric)
        a_pos, a_neg = ok_pos * is_pos[j], ok_neg * is_neg[j]
        c_pos = a_pos * _move(c_pos, f[j], alpha, update) + (1.0 - a_pos) * c_pos
        c_neg = a_neg * _move(c_neg, f[j], alpha, update) + (1.0 - a_neg) * c_neg
        init_pos, init_neg = torch.maximum(init_pos, a_pos), torch.maximum(init_neg, a_neg)
        acc_pos.append(a_pos)
        acc_neg.append(a_neg)
    return Matched(c_pos, c_neg, torch.stack(acc_pos), torch.stack(acc_neg), init_pos, init_neg)


class CentroidBank(torch.nn.Module):
    """Centroid state for ``n_slots`` (layer, task) pairs, stored as buffers so it is checkpointed.

    ``step(start, f, y, valid)`` matches ``f: (S, n, d)`` against slots ``start .. start+S-1``
    (``y, valid: (n,)`` shared by the slots) and, in training mode, stores the detached result. The
    batched gate runs all slots with the same batched kernels (``_batched``).
    """

    def __init__(self, n_slots: int, dim: int, *, metric: str = "geodesic", mode: str = "batched",
                 alpha: float = 0.5, update: str = "ema"):
        super().__init__()
        _validate(metric, mode, update)
        if not 0.0 < alpha < 1.0:
            raise ValueError(f"EMA factor alpha must be in (0, 1), got {alpha!r}")
        self.metric, self.mode, self.alpha, self.update = metric, mode, alpha, update
        self.register_buffer("c_pos", torch.zeros(n_slots, dim))
        self.register_buffer("c_neg", torch.zeros(n_slots, dim))
        self.register_buffer("init_pos", torch.zeros(n_slots))
        self.register_buffer("init_neg", torch.zeros(n_slots))

    def step(self, start: int, f, y, valid, *, unit: bool = False) -> Matched:
        """``Matched`` with a leading slot axis ``S`` on every field. ``unit=True``: the rows of ``f``
        are already unit vectors (skips the normalisation; batched mode only, else ignored)."""
        sl = slice(start, start + f.shape[0])
        state = (self.c_pos[sl], self.c_neg[sl], self.init_pos[sl], self.init_neg[sl])
        run = partial(match, metric=self.metric, mode=self.mode, alpha=self.alpha, update=self.update)
        if self.mode == "batched":
            f = f.float() if unit else _core.normalize(f.float())
            y, valid = y.to(f.dtype), valid.to(f.dtype)
            out = _batched(f, (1.0 - y) * valid, y * valid, *state, metric=self.metric, alpha=self.alpha,
                           update=self.update)
        else:  # Algorithm 1's feature loop cannot be vectorised; slots one after the other
            per_slot = [run(f[s], y, valid, *(t[s] for t in state)) for s in range(f.shape[0])]
            out = Matched(*(torch.stack(field) for field in zip(*per_slot)))
        if self.training:
            with torch.no_grad():
                self.c_pos[sl] = out.c_pos.detach()
                self.c_neg[sl] = out.c_neg.detach()
                self.init_pos[sl] = out.init_pos.detach()
                self.init_neg[sl] = out.init_neg.detach()
        return out
