"""What the CLIP baselines share: input check, the visual tower run block by block, the joint-space
projection of tokens, and the two-way (normal, anomalous) log-odds. Shapes: ``B`` images, ``N = grid**2``
patch tokens, ``W`` visual width, ``E`` joint embedding dimension."""
from __future__ import annotations

import torch
from torch import nn

from adsim.model.backbone import run_blocks as _blocks
from poolsim import _core

TEMPERATURE = 0.07  # CLIP's initial temperature; WinCLIP (Eq. 1) and AnomalyCLIP divide by it


def check_images(images: torch.Tensor, spec) -> None:
    """``ValueError`` unless ``images`` is ``(B, 3, S, S)`` with ``S = spec.image_size``."""
    if not torch.is_tensor(images) or images.ndim != 4 or images.shape[1] != 3 \
            or tuple(images.shape[2:]) != (spec.image_size,) * 2:
        shape = tuple(images.shape) if torch.is_tensor(images) else type(images).__name__
        raise ValueError(f"images must be a tensor of shape (B, 3, {spec.image_size}, {spec.image_size}), "
                         f"got {shape}")


def run_blocks(backbone, x: torch.Tensor, blocks) -> torch.Tensor:
    """Tokens ``(B, T, W)`` through ``blocks`` of the visual transformer (batch-first in and out)."""
    return _blocks(backbone, x, blocks)


def project(visual, tokens: torch.Tensor) -> torch.Tensor:
    """Residual-stream tokens ``(..., W)`` -> unit joint-space features ``(..., E)``: ``ln_post``, then the
    visual projection, as CLIP does for its class token."""
    x = visual.ln_post(tokens)
    if visual.proj is not None:
        x = x @ visual.proj
    return _core.normalize(x.float())


def pooled(visual, x: torch.Tensor) -> tuple:
    """Last-block tokens ``(B, 1 + N, W)`` -> ``(image embedding (B, E) unit, patch features (B, N, E) unit)``:
    open_clip's own pooling (``VisionTransformer._pool``) and projection for the image embedding."""
    img, _ = visual._pool(x)
    if visual.proj is not None:
        img = img @ visual.proj
    return _core.normalize(img.float()), project(visual, x[:, 1:])


def log_odds(features: torch.Tensor, text: torch.Tensor, temperature: float = TEMPERATURE) -> torch.Tensor:
    """``features (..., E)`` unit, ``text (2, E)`` unit rows (normal, anomalous) -> ``(...)`` log-odds
    ``z = (<f, t_a> - <f, t_n>) / temperature`` of the two-way softmax: ``P(anomalous) = sigmoid(z)``."""
    return (features.float() @ (text[1] - text[0]).float()) / temperature


def upsample(patch_map: torch.Tensor, grid: int, size: int) -> torch.Tensor:
    """``(B, N)`` values on the patch grid -> ``(B, size, size)``, bilinear."""
    m = patch_map.reshape(-1, 1, grid, grid)
    return nn.functional.interpolate(m, size=(size, size), mode="bilinear", align_corners=False)[:, 0]
