"""Losses of Algorithm 1, step (4). Every loss takes *logits* (never probabilities) where it can.

* ``dice_loss``: ``1 - (2 sum p y + s) / (sum p + sum y + s)`` per image (``s = 1`` smoothing),
  averaged over the images that have a pixel mask; ``unit="row"``: the same per image row (sums over the
  row's pixels), averaged over the rows of each image -- what AdaCLIP's ``loss.py`` computes at batch 1.
* ``focal_loss``: ``-(1 - p_t)^gamma log p_t`` (``gamma = 2``) with ``log p_t`` from ``logsigmoid``.
* ``bce_loss``: ``binary_cross_entropy_with_logits`` on image logits.
* ``intra``: mean over the matched set of ``M(f, c)^p`` (0 when the set is empty); ``geodesic_intra``
  is the paper's ``M = d_G, p = 2``.
* ``inter``: ``-M(c+, c-)`` (paper) or the authors' ``1 / (M + 1e-6)`` (0 until both centroids exist);
  ``cross``: the authors' feature-to-other-centroid reciprocal term.

``valid`` arguments are 0/1 weights; an all-zero ``valid`` gives 0 (never 0/0).
"""
from __future__ import annotations

import torch
from torch.nn import functional

from adsim.model.sphere import unit_geodesic
from poolsim import core


def _masked_mean(values, weights):
    total = weights.sum()
    return (values * weights).sum() / torch.clamp(total, min=1.0)


DICE_UNITS = ("image", "row")


def dice_loss(prob, target, valid, smooth: float = 1.0, *, unit: str = "image"):
    """``prob, target: (B, H, W)``, ``valid: (B,)``. ``unit="image"``: one Dice per image; ``"row"``: one
    Dice per image row ``(B, H)``, averaged over the ``H`` rows of each image (AdaCLIP's ``BinaryDiceLoss``
    with ``N = targets.size()[0]`` on the ``(H, W)`` mask its batch-1 trainer passes)."""
    if unit == "image":
        p, t = prob.flatten(1), target.flatten(1)
    elif unit == "row":
        p, t = prob, target
    else:
        raise ValueError(f"unit must be one of {DICE_UNITS}, got {unit!r}")
    dice = (2.0 * (p * t).sum(-1) + smooth) / (p.sum(-1) + t.sum(-1) + smooth)
    return _masked_mean(1.0 - (dice if unit == "image" else dice.mean(-1)), valid)


def two_way_dice_loss(prob, target, valid, smooth: float = 1.0, *, unit: str = "image"):
    """Dice of both channels of a two-way softmax: ``dice(prob, target) + dice(1 - prob, 1 - target)``."""
    return (dice_loss(prob, target, valid, smooth, unit=unit)
            + dice_loss(1.0 - prob, 1.0 - target, valid, smooth, unit=unit))


def focal_loss(logits, target, valid, gamma: float = 2.0):
    """``logits, target: (B, H, W)`` (anomaly logit, target in [0, 1]), ``valid: (B,)``.

    A pixel is anomalous iff ``target >= 0.5`` (at least half lesion: the rule ``adsim.training.train``
    uses for patch labels, so a resized mask's half-covered pixel is anomalous in both places).
    """
    log_pt = torch.where(target >= 0.5, functional.logsigmoid(logits), functional.logsigmoid(-logits))
    per_pixel = -((1.0 - torch.exp(log_pt)) ** gamma) * log_pt
    return _masked_mean(per_pixel.flatten(1).mean(1), valid)


def bce_loss(logits, labels, weights=None):
    """``logits, labels: (B,)``; mean binary cross-entropy on logits (``weights (B,)`` 0/1: mean over
    the weighted samples, 0 when none)."""
    per = functional.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype), reduction="none")
    return per.mean() if weights is None else _masked_mean(per, weights)


INTER_FORMS = ("neg_distance", "reciprocal")
EPS_RECIPROCAL = 1e-6  # the authors' 1 / (d + 1e-6) (train_zero.py:186-187)


def intra(f, accepted, c, *, metric: str = "geodesic", power: int = 2, unit: bool = False, unit_c: bool = False):
    """``f: (..., n, d)``, ``accepted: (..., n)`` 0/1, ``c: (..., d)`` -> ``(...)``: mean of
    ``M(f_j, c)^power`` over the accepted ``j`` (0 for an empty set). ``M`` is ``core.distance``
    with ``metric`` (the paper: ``d_G``, ``power = 2``; the authors' code: ``d_G``, ``power = 1``).

    Several centroids at once (one pass over ``f``): ``accepted: (..., k, n)``, ``c: (..., k, d)`` ->
    ``(..., k)``. For ``d_G`` the distances come from ``adsim.model.sphere.unit_geodesic`` (the chord formula
    of ``core.geodesic`` in one fused kernel); ``unit=True``: the rows of ``f`` are already unit
    vectors (skips normalising them); ``unit_c=True``: so are the centroids (or zero: uninitialised)."""
    multi = accepted.ndim == f.ndim
    acc = accepted if multi else accepted[..., None, :]
    cc = c if multi else c[..., None, :]
    if metric == "geodesic":
        d = unit_geodesic(f if unit else core.normalize(f), cc if unit_c else core.normalize(cc)).transpose(-1, -2)
    else:
        d = core.distance(f[..., None, :, :], cc[..., :, None, :], metric)
    out = (acc * d ** power).sum(-1) / torch.clamp(acc.sum(-1), min=1.0)
    return out if multi else out[..., 0]


def inter(c_pos, c_neg, both_initialised, *, metric: str = "geodesic", form: str = "neg_distance",
          unit: bool = False):
    """Centroid separation over the last axis, times the 0/1 ``both_initialised``. ``unit=True``: the
    centroids are unit (or zero) vectors; the geodesic then comes from ``adsim.model.sphere.unit_geodesic``
    without normalising them.

    * ``neg_distance`` (paper): ``-M(c+, c-)``.
    * ``reciprocal`` (authors' code, train_zero.py:180-187): ``1 / (M(c+, c-) + 1e-6)`` on *detached*
      centroids (the authors read ``centroid.data``), so it adds a value but no gradient."""
    def dist(a, b):
        if unit and metric == "geodesic":
            return unit_geodesic(a[..., None, :], b[..., None, :]).squeeze((-2, -1))
        return core.distance(a, b, metric)
    if form == "neg_distance":
        return -dist(c_pos, c_neg) * both_initialised
    if form == "reciprocal":
        return both_initialised / (dist(c_pos.detach(), c_neg.detach()) + EPS_RECIPROCAL)
    raise ValueError(f"inter_form must be one of {INTER_FORMS}, got {form!r}")


def cross(f, accepted, c_other, other_initialised, *, metric: str = "geodesic"):
    """The authors' feature-to-other-centroid term (train_zero.py:166,173,186): ``1 / (mean_j
    M(f_j, c_other) + 1e-6)`` over the accepted ``j`` with the other centroid detached; 0 for an empty
    set or an uninitialised other centroid. Shapes as :func:`intra`."""
    d = core.distance(f, c_other.detach()[..., None, :], metric)
    n = accepted.sum(-1)
    mean = (accepted * d).sum(-1) / torch.clamp(n, min=1.0)
    return (n > 0).to(f.dtype) * other_initialised / (mean + EPS_RECIPROCAL)


def geodesic_intra(f, accepted, c, *, unit: bool = False):
    """:func:`intra` with the paper's ``d_G^2``."""
    return intra(f, accepted, c, metric="geodesic", power=2, unit=unit)


def geodesic_inter(c_pos, c_neg, both_initialised):
    """:func:`inter` with the paper's ``-d_G(c+, c-)``."""
    return inter(c_pos, c_neg, both_initialised, metric="geodesic", form="neg_distance")
