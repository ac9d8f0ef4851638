"""What the CLIP baselines share: argument and input checks, loading a checkpoint state into a method's
trainable module, the joint-space projection of tokens, and the two-way
(normal, anomalous) log-odds (the frozen blocks and the patch-to-pixel upsampling are
``adsim.model.backbone.run_blocks`` / ``upsample_patches``, as for the adapter head). Shapes: ``B`` images, ``N = grid**2``
patch tokens, ``W`` visual width, ``E`` joint embedding dimension."""
from __future__ import annotations

import torch

from adsim.model.backbone import upsample_patches
from poolsim import core

TEMPERATURE = 0.07  # CLIP's initial temperature; WinCLIP (Eq. 1) and AnomalyCLIP divide by it



def positive_int(name: str, v) -> int:
    """``v`` if it is an ``int`` (not a bool) ``>= 1``, else ``ValueError`` naming ``name``."""
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    return v


def load_checked(module: torch.nn.Module, state: dict, what: str) -> torch.nn.Module:
    """``module.load_state_dict(state)``; returns ``module``. A state that does not fit -> ``ValueError``
    "checkpoint does not fit the <what>: " followed by torch's message on one line (its first 400
    characters)."""
    try:
        module.load_state_dict(state)
    except RuntimeError as err:
        raise ValueError(f"checkpoint does not fit the {what}: {' '.join(str(err).split())[:400]}") from err
    return module


def check_images(images: torch.Tensor, spec) -> None:
    """``ValueError`` unless ``images`` is ``(B, 3, S, S)`` with ``S = spec.image_size``."""
    if not torch.is_tensor(images) or images.ndim != 4 or images.shape[1] != 3 \
            or tuple(images.shape[2:]) != (spec.image_size,) * 2:
        shape = tuple(images.shape) if torch.is_tensor(images) else type(images).__name__
        raise ValueError(f"images must be a tensor of shape (B, 3, {spec.image_size}, {spec.image_size}), "
                         f"got {shape}")


def project(visual, tokens: torch.Tensor) -> torch.Tensor:
    """Residual-stream tokens ``(..., W)`` -> unit joint-space features ``(..., E)``: ``ln_post``, then the
    visual projection, as CLIP does for its class token."""
    x = visual.ln_post(tokens)
    if visual.proj is not None:
        x = x @ visual.proj
    return core.normalize(x.float())


def image_embedding(visual, x: torch.Tensor) -> torch.Tensor:
    """Last-block tokens ``(B, 1 + N, W)`` -> the image embedding ``(B, E)`` as open_clip computes it
    (``VisionTransformer._pool``, then the projection), not normalised."""
    img, _ = visual._pool(x)
    return img @ visual.proj if visual.proj is not None else img


def pooled(visual, x: torch.Tensor) -> tuple:
    """Last-block tokens ``(B, 1 + N, W)`` -> ``(image embedding (B, E) unit, patch features (B, N, E) unit)``:
    :func:`image_embedding`, unit-normalised, and :func:`project` of the patch tokens."""
    return core.normalize(image_embedding(visual, x).float()), project(visual, x[:, 1:])


def log_odds(features: torch.Tensor, text: torch.Tensor, temperature: float = TEMPERATURE) -> torch.Tensor:
    """``features (..., E)`` unit, ``text (2, E)`` unit rows (normal, anomalous) -> ``(...)`` log-odds
    ``z = (<f, t_a> - <f, t_n>) / temperature`` of the two-way softmax: ``P(anomalous) = sigmoid(z)``."""
    return (features.float() @ (text[1] - text[0]).float()) / temperature


def layer_targets(cfg, z_maps: torch.Tensor, batch: dict) -> tuple:
    """The per-layer pixel-loss inputs of patch log-odds ``z_maps (L, B, N)`` trained against binarised
    masks: ``(z (L * B, S, S)`` bilinearly upsampled with ``align_corners=True``, ``masks (L * B, S, S)``
    binarised at 0.5, ``valid (L * B,)`` = ``has_mask``, times ``pixel_domain`` when
    ``cfg.cls_only_pixel_loss == "none"``), the batch repeated once per layer."""
    masks, valid = (batch["mask"] > 0.5).float(), batch["has_mask"]
    if cfg.cls_only_pixel_loss == "none" and "pixel_domain" in batch:
        valid = valid * batch["pixel_domain"]
    n_layers, _, n = z_maps.shape
    z = upsample_patches(z_maps, int(round(n ** 0.5)), masks.shape[-1], align_corners=True).flatten(0, 1)
    return z, masks.repeat(n_layers, 1, 1), valid.repeat(n_layers)
