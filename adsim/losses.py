"""Losses of Algorithm 1, step (4). Every loss takes *logits* (never probabilities) where it can.

* ``dice_loss``: ``1 - (2 sum p y + s) / (sum p + sum y + s)`` per image (``s = 1`` smoothing),
  averaged over the images that have a pixel mask.
* ``focal_loss``: ``-(1 - p_t)^gamma log p_t`` (``gamma = 2``) with ``log p_t`` from ``logsigmoid``.
* ``bce_loss``: ``binary_cross_entropy_with_logits`` on image logits.
* ``geodesic_intra``: mean over the matched set of ``d_G(f, c)^2`` (0 when the set is empty).
* ``geodesic_inter``: ``-d_G(c+, c-)`` (0 until both centroids exist).

``valid`` arguments are 0/1 weights; an all-zero ``valid`` gives 0 (never 0/0).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from poolsim import _core


def _masked_mean(values, weights):
    total = weights.sum()
    return (values * weights).sum() / torch.clamp(total, min=1.0)


def dice_loss(prob, target, valid, smooth: float = 1.0):
    """``prob, target: (B, H, W)``, ``valid: (B,)``."""
    inter = (prob * target).flatten(1).sum(1)
    dice = (2.0 * inter + smooth) / (prob.flatten(1).sum(1) + target.flatten(1).sum(1) + smooth)
    return _masked_mean(1.0 - dice, valid)


def focal_loss(logits, target, valid, gamma: float = 2.0):
    """``logits, target: (B, H, W)`` (anomaly logit, target in [0, 1]), ``valid: (B,)``.

    A pixel is anomalous iff ``target >= 0.5`` (at least half lesion: the rule ``adsim.train``
    uses for patch labels, so a resized mask's half-covered pixel is anomalous in both places).
    """
    log_pt = torch.where(target >= 0.5, F.logsigmoid(logits), F.logsigmoid(-logits))
    per_pixel = -((1.0 - torch.exp(log_pt)) ** gamma) * log_pt
    return _masked_mean(per_pixel.flatten(1).mean(1), valid)


def bce_loss(logits, labels):
    """``logits, labels: (B,)``; mean binary cross-entropy on logits."""
    return F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype))


def geodesic_intra(f, accepted, c):
    """``f: (..., n, d)``, ``accepted: (..., n)`` 0/1, ``c: (..., d)`` -> ``(...)``: mean of
    ``d_G(f_j, c)^2`` over the accepted ``j`` (0 for an empty set)."""
    d2 = _core.geodesic(f, c[..., None, :]) ** 2
    return (accepted * d2).sum(-1) / torch.clamp(accepted.sum(-1), min=1.0)


def geodesic_inter(c_pos, c_neg, both_initialised):
    """``-d_G(c+, c-)`` over the last axis, times the 0/1 ``both_initialised``."""
    return -_core.geodesic(c_pos, c_neg) * both_initialised
