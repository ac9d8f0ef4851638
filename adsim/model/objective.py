"""The training objective of the adapter head: segmentation and detection losses plus the matching terms.

``L_total = b1 Dice + b2 Focal + b3 BCE + l1 L_intra + l2 L_inter + l_var Var`` (Algorithm 1 with the
recipe's weights). The matching terms run the centroid gate (:class:`adsim.model.matching.CentroidBank`)
on the features the recipe's ``gate_unit`` selects; :func:`objective` is what the eager training step
calls, and the compiled step (``adsim.training.compiled_step``) runs its two halves, :func:`head_terms`
and :func:`total_loss`, as two compiled regions.
"""
from __future__ import annotations

import torch
from torch.nn import functional

from adsim.config.run import TrainConfig
from adsim.model import losses
from adsim.model.backbone import upsample_patches
from adsim.model.head import Head
from poolsim import core


def match_sets(cfg: TrainConfig, feats, labels, masks, has_mask, grid: int) -> list:
    """The features the gate sees: ``[(first slot, f (L, n, E) unit, y (n,), valid (n,), owner (n,))]``.

    Patch labels come from the mask pooled to the patch grid: normal if no lesion pixel, anomalous if at
    least half lesion, unknown (not matched) in between or without a known mask. ``gate_unit="patch"``:
    every patch token (Algorithm 1); ``"image_mean"``: per image the mean of its normal and the mean of
    its anomalous patch tokens (the authors' code, train_zero_da.py:323,354). ``match_branches="seg+det"``
    adds the detection branch's per-image mean token (slots L..2L-1; train_zero_da.py:192)."""
    b, n_layers = labels.shape[0], len(feats.seg)
    frac = functional.adaptive_avg_pool2d(masks[:, None], grid).flatten(1)  # (B, N)
    lesion = (frac >= 0.5).to(frac.dtype)  # (B, N) 0/1 patch label
    normal = has_mask[:, None] * (frac == 0).to(frac.dtype)
    anomalous = has_mask[:, None] * lesion
    seg = torch.stack(feats.seg)  # (L, B, N, E)
    img = torch.arange(b, device=labels.device)
    if cfg.gate_unit == "patch":
        sets = [(0, seg.flatten(1, 2), lesion.flatten(), (normal + anomalous).flatten(),
                 img.repeat_interleave(frac.shape[1]))]
    else:
        def mean(w):  # (B, N) weights -> (L, B, E) unit mean token
            return core.normalize((seg * w[None, :, :, None]).sum(2))
        sets = [(0, torch.cat([mean(normal), mean(anomalous)], 1),
                 torch.cat([torch.zeros_like(labels), torch.ones_like(labels)]),
                 torch.cat([(normal.sum(1) > 0), (anomalous.sum(1) > 0)]).to(labels.dtype), img.repeat(2))]
    if cfg.match_branches == "seg+det":
        f_img = core.normalize(torch.stack([d.mean(dim=1) for d in feats.det]))  # (L, B, E)
        sets.append((n_layers, f_img, labels, torch.ones_like(labels), img))
    return sets


def matching_losses(cfg: TrainConfig, head: Head, feats, labels, masks, has_mask, grid: int) -> tuple:
    """``(L_intra, L_inter, keep (B,))`` of the centroid matching (means over the matched sets and
    layers); updates the centroids (training mode). ``keep`` is the per-sample loss weight: 0 for a
    sample that failed the gate under ``gate_filter="skip_step"``, else 1. Every matched feature is a
    unit vector (``match_sets``), so the gate and ``L_intra`` skip re-normalising, and ``L_intra``
    takes both centroids of a slot in one pass."""
    if head.centroids is None:
        raise ValueError("matching_losses needs a head with centroids (method 'match'), got one without")
    lm = cfg.metric if cfg.loss_metric == "gate" else "geodesic"
    sets = match_sets(cfg, feats, labels, masks, has_mask, grid)
    outs = head.centroids.steps([(start, f, y, v) for start, f, y, v, _ in sets], unit=True)
    matched = [(f, owner, v, m) for (_, f, _, v, owner), m in zip(sets, outs)]
    keep = torch.ones_like(labels)
    if cfg.gate_filter == "skip_step":
        failed = torch.zeros_like(labels)
        for _, owner, v, m in matched:  # a valid unit that neither centroid accepted failed the gate
            failed = failed.index_add(0, owner, (v * (1.0 - m.acc_pos - m.acc_neg)).amax(0))
        keep = (failed == 0).to(labels.dtype)
    norm = len(matched) * head.n_layers
    # the centroids of Matched are unit vectors (or zero, uninitialised): no normalisation in the losses
    intra = inter = 0.0
    for f, owner, _, m in matched:
        acc_pos, acc_neg = m.acc_pos, m.acc_neg
        if cfg.gate_filter == "skip_step":
            k = keep[owner]
            acc_pos, acc_neg = acc_pos * k, acc_neg * k
        both = losses.intra(f, torch.stack([acc_pos, acc_neg], -2), torch.stack([m.c_pos, m.c_neg], -2), metric=lm,
                            power=cfg.intra_power, unit=True, unit_c=True)  # (L, 2)
        intra = intra + both.sum()
        if cfg.inter_form == "reciprocal":
            inter = inter + (losses.cross(f, acc_pos, m.c_neg, m.init_neg, metric=lm)
                             + losses.cross(f, acc_neg, m.c_pos, m.init_pos, metric=lm)).sum()
    # L_inter of every slot at once
    c_pos, c_neg, init_pos, init_neg = (torch.cat([getattr(m, k) for *_, m in matched])
                                        for k in ("c_pos", "c_neg", "init_pos", "init_neg"))
    inter = inter + losses.inter(c_pos, c_neg, init_pos * init_neg, metric=lm, form=cfg.inter_form, unit=True).sum()
    return intra / norm, inter / norm, keep


def pixel_mask_weights(cfg: TrainConfig, batch) -> torch.Tensor:
    """``(B,)`` 0/1: the images whose pixel losses count -- those with a mask, and with
    ``cls_only_pixel_loss="none"`` only from a domain that has pixel masks."""
    has_mask = batch["has_mask"]
    if cfg.cls_only_pixel_loss == "none" and "pixel_domain" in batch:
        has_mask = has_mask * batch["pixel_domain"]  # no pixel loss on either class without masks
    return has_mask


def head_terms(cfg: TrainConfig, head: Head, feats, batch,
               grid: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The part of the objective that needs the head's state: ``(seg_logits (L, B, N), image_logits
    (L, B), var, intra, inter, keep (B,))``, updating the centroids (training mode); the matching
    terms are 0 and ``keep`` all ones without centroids."""
    labels = batch["label"]
    intra = inter = labels.new_zeros(())
    keep = torch.ones_like(labels)  # (B,) per-sample loss weight
    if head.centroids is not None:
        intra, inter, keep = matching_losses(cfg, head, feats, labels, batch["mask"], pixel_mask_weights(cfg, batch),
                                             grid)
    return torch.stack(feats.seg_logits), feats.image_logits, feats.var, intra, inter, keep


def total_loss(cfg: TrainConfig, seg_logits, image_logits, var, intra, inter, keep, batch, grid: int) -> tuple:
    """``(loss, {name: detached value})`` from :func:`head_terms`' outputs: Dice and Focal on the patch
    logits upsampled to the mask size, BCE on the image logits, and the weighted sum."""
    labels, masks = batch["label"], batch["mask"]
    has_mask = pixel_mask_weights(cfg, batch)
    n_layers, size = seg_logits.shape[0], masks.shape[-1]
    # all layers at once: (L*B, S, S) logits against the masks repeated per layer (= mean over layers);
    # the upsampling as two matrix products (adsim.model.backbone.upsample_patches)
    z = upsample_patches(seg_logits, grid, size, matmul=True).flatten(0, 1)
    masks_l, valid_l = masks.repeat(n_layers, 1, 1), (has_mask * keep).repeat(n_layers)
    parts = {"intra": intra, "inter": inter}
    parts["dice"] = losses.dice_loss(torch.sigmoid(z), masks_l, valid_l)
    parts["focal"] = losses.focal_loss(z, masks_l, valid_l)
    parts["bce"] = losses.bce_loss(image_logits.flatten(), labels.repeat(n_layers), keep.repeat(n_layers))
    parts["var"] = var
    parts["n_pass"] = keep.sum()
    loss = (cfg.beta_dice * parts["dice"] + cfg.beta_focal * parts["focal"] + cfg.beta_bce * parts["bce"]
            + cfg.lambda_intra * parts["intra"] + cfg.lambda_inter * parts["inter"]
            + cfg.lambda_var * parts["var"])
    # every part a tensor on the loss's device (a CPU constant would keep CUDA graphs off)
    return loss, {k: torch.as_tensor(v, device=loss.device).detach().float() for k, v in parts.items()}


def objective(cfg: TrainConfig, head: Head, feats, batch, grid: int) -> tuple:
    """``L_total = b1 Dice + b2 Focal + b3 BCE + l1 L_intra + l2 L_inter + l_var Var`` (means over
    layers): :func:`head_terms` then :func:`total_loss`. Updates the centroids (training mode). With
    ``gate_filter="skip_step"`` a sample with a gate failure (any matched unit, any layer) gets weight 0
    in every loss term (the authors skip its optimiser step; ``n_pass`` = samples left). Returns
    ``(loss, {name: detached value})``."""
    return total_loss(cfg, *head_terms(cfg, head, feats, batch, grid), batch, grid)
