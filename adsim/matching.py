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


def _gate(f, c_pos, c_neg, init_pos, init_neg, metric, tau=None):
    """0/1 ``(accept_as_normal_if_normal, accept_as_anomaly_if_anomaly)`` for ``f: (..., d)``.
    ``tau=None``: adaptive (own centroid strictly closer); a number: fixed radius ``d_own < tau``."""
    d_pos = _core.distance(f, c_pos, metric)
    d_neg = _core.distance(f, c_neg, metric)
    inf = torch.full_like(d_pos, float("inf"))
    d_pos_eff = torch.where(init_pos > 0, d_pos, inf)   # uninitialised centroid: infinitely far
    d_neg_eff = torch.where(init_neg > 0, d_neg, inf)
    # own centroid strictly closer (d_own = tau = min(d+, d-) < d_other); own uninitialised: accept
    ok_pos = torch.where(init_pos > 0, _core.gate(d_pos, d_neg_eff if tau is None else tau), torch.ones_like(d_pos))
    ok_neg = torch.where(init_neg > 0, _core.gate(d_neg, d_pos_eff if tau is None else tau), torch.ones_like(d_neg))
    return ok_pos, ok_neg


def match(f, y, valid, c_pos, c_neg, init_pos, init_neg, *, metric: str = "geodesic",
          mode: str = "batched", alpha: float = 0.5, update: str = "ema", tau: float | None = None) -> Matched:
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
        ok_pos, ok_neg = _gate(f, c_pos, c_neg, init_pos, init_neg, metric, tau)
        acc_pos, acc_neg = ok_pos * is_pos, ok_neg * is_neg
        new = []
        for c, acc, init in ((c_pos, acc_pos, init_pos), (c_neg, acc_neg, init_neg)):
            mean, total = _core.weighted_mean(f, acc, c)
            moved = _move(c, _core.normalize(mean), alpha, update)
            has = (total > 0).to(f.dtype)
            new.append((has * moved + (1.0 - has) * c, torch.maximum(init, has)))
        (c_pos, init_pos), (c_neg, init_neg) = new
        return Matched(c_pos, c_neg, acc_pos, acc_neg, init_pos, init_neg)
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


class CentroidBank(torch.nn.Module):
    """Centroid state for ``n_slots`` (layer, task) pairs, stored as buffers so it is checkpointed.

    ``step(start, f, y, valid)`` matches ``f: (S, n, d)`` against slots ``start .. start+S-1``
    (``y, valid: (n,)`` shared by the slots) and, in training mode, stores the detached result. The
    batched gate is ``torch.func.vmap``-ed over the slots (one set of kernels for all layers).
    """

    def __init__(self, n_slots: int, dim: int, *, metric: str = "geodesic", mode: str = "batched",
                 alpha: float = 0.5, update: str = "ema", tau: float | None = None):
        super().__init__()
        _validate(metric, mode, update)
        if not 0.0 < alpha < 1.0:
            raise ValueError(f"EMA factor alpha must be in (0, 1), got {alpha!r}")
        self.metric, self.mode, self.alpha, self.update, self.tau = metric, mode, alpha, update, tau
        self.register_buffer("c_pos", torch.zeros(n_slots, dim))
        self.register_buffer("c_neg", torch.zeros(n_slots, dim))
        self.register_buffer("init_pos", torch.zeros(n_slots))
        self.register_buffer("init_neg", torch.zeros(n_slots))

    def step(self, start: int, f, y, valid) -> Matched:
        """``Matched`` with a leading slot axis ``S`` on every field."""
        sl = slice(start, start + f.shape[0])
        state = (self.c_pos[sl], self.c_neg[sl], self.init_pos[sl], self.init_neg[sl])
        run = partial(match, metric=self.metric, mode=self.mode, alpha=self.alpha, update=self.update, tau=self.tau)
        if self.mode == "batched":
            out = torch.func.vmap(run, in_dims=(0, None, None, 0, 0, 0, 0))(f, y, valid, *state)
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
