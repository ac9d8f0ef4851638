"""What the CLIP baselines share: input check, the joint-space projection of tokens, and the two-way
(normal, anomalous) log-odds (the frozen blocks and the patch-to-pixel upsampling are
``adsim.model.backbone.run_blocks`` / ``upsample_patches``, as for the adapter head). Shapes: ``B`` images, ``N = grid**2``
patch tokens, ``W`` visual width, ``E`` joint embedding dimension."""
from __future__ import annotations

import torch

from poolsim import core

TEMPERATURE = 0.07  # CLIP's initial temperature; WinCLIP (Eq. 1) and AnomalyCLIP divide by it


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


def pooled(visual, x: torch.Tensor) -> tuple:
    """Last-block tokens ``(B, 1 + N, W)`` -> ``(image embedding (B, E) unit, patch features (B, N, E) unit)``:
    open_clip's own pooling (``VisionTransformer._pool``) and projection for the image embedding."""
    img, _ = visual._pool(x)
    if visual.proj is not None:
        img = img @ visual.proj
    return core.normalize(img.float()), project(visual, x[:, 1:])


def log_odds(features: torch.Tensor, text: torch.Tensor, temperature: float = TEMPERATURE) -> torch.Tensor:
    """``features (..., E)`` unit, ``text (2, E)`` unit rows (normal, anomalous) -> ``(...)`` log-odds
    ``z = (<f, t_a> - <f, t_n>) / temperature`` of the two-way softmax: ``P(anomalous) = sigmoid(z)``."""
    return (features.float() @ (text[1] - text[0]).float()) / temperature
