"""Frozen CLIP backbone through open_clip's own API, plus the tiny test configuration.

``build_backbone(name, ...)`` returns a :class:`Backbone` (the open_clip model, its tokenizer and a
:class:`BackboneSpec` describing the patch grid and the adapter positions). Weights come from a
*local* file only (``checkpoint=PATH``, open_clip resizes the position embeddings when the image size
differs from the checkpoint's); with ``checkpoint=None`` the weights are random and a loud
:class:`RandomWeightsWarning` says that any AUC computed with them is meaningless. Nothing here
downloads anything.

``adsim-tiny`` (4 blocks, width 64, 8 px patches, 64 px images; ``model_configs/adsim-tiny.json``) is
registered with ``open_clip.add_model_config`` so that the tests run the real open_clip code on CPU.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import NamedTuple

import open_clip
import torch

_CONFIG_DIR = Path(__file__).with_name("model_configs")
TINY = "adsim-tiny"

# name -> (open_clip config name, default image size). ViT-L-14-336 runs at 238 px: the 17 x 17 patch
# grid of the authors' "240 px" set-up (their conv silently drops the last 2 pixel rows/columns; we
# refuse image sizes that are not a multiple of the patch size instead).
BACKBONES = {
    "tiny": (TINY, 64),
    "ViT-B-16": ("ViT-B-16", 224),
    "ViT-L-14": ("ViT-L-14", 224),
    "ViT-L-14-336": ("ViT-L-14-336", 238),
}


class RandomWeightsWarning(UserWarning):
    """The backbone has random weights: detection AUCs computed with it are meaningless."""


class BackboneSpec(NamedTuple):
    name: str
    image_size: int
    patch_size: int
    grid: int              # patches per side; N = grid ** 2 tokens per image
    width: int             # transformer width (adapter input)
    embed_dim: int         # joint image-text space (adapter bottleneck, text embeddings)
    layers: int
    adapter_layers: tuple  # 0-based block indices after which adapters sit
    pretrained: bool


class Backbone(NamedTuple):
    model: torch.nn.Module  # open_clip CLIP, frozen, eval mode
    tokenizer: object
    spec: BackboneSpec


def _register_tiny() -> None:
    if TINY not in open_clip.list_models():
        open_clip.add_model_config(_CONFIG_DIR / f"{TINY}.json")


def adapter_layers(depth: int) -> tuple:
    """Blocks after which adapters sit: the ends of the four quarters of the stack.

    ViT-L (24 blocks) -> (5, 11, 17, 23), i.e. blocks 6, 12, 18, 24 as in the reference set-up;
    12 blocks -> (2, 5, 8, 11); the 4-block tiny model -> (0, 1, 2, 3).
    """
    if depth < 4:
        raise ValueError(f"backbone depth must be >= 4 blocks for four adapter layers, got {depth}")
    return tuple(round(depth * k / 4) - 1 for k in range(1, 5))


def build_backbone(name: str = "ViT-L-14-336", *, image_size: int | None = None,
                   checkpoint: str | None = None, quick_gelu: bool = True, seed: int = 0,
                   device: str | torch.device = "cpu") -> Backbone:
    """Create the frozen open_clip model.

    ``quick_gelu`` is on by default because the OpenAI weights were trained with QuickGELU.
    ``seed`` fixes the random initialisation (so a run with random weights is rebuilt identically at
    evaluation time). Raises ``ValueError`` for an unknown name, an image size that is not a positive
    multiple of the patch size, a missing checkpoint file or a checkpoint of another architecture.
    """
    if name not in BACKBONES:
        raise ValueError(f"backbone must be one of {tuple(BACKBONES)}, got {name!r}")
    _register_tiny()
    cfg_name, default_size = BACKBONES[name]
    size = default_size if image_size is None else image_size
    patch = open_clip.get_model_config(cfg_name)["vision_cfg"]["patch_size"]
    if not isinstance(size, int) or size <= 0 or size % patch:
        raise ValueError(f"image_size must be a positive multiple of the patch size {patch} of {name}, "
                         f"got {size!r}")
    if checkpoint is not None and not os.path.isfile(checkpoint):
        # checked here so that open_clip never treats the string as a tag to download
        raise ValueError(f"checkpoint file not found: {checkpoint!r}")
    if checkpoint is None:
        warnings.warn(f"backbone {name} has RANDOM weights (no --checkpoint): results are meaningless "
                      "for anomaly-detection AUC; use them only for tests and timing",
                      RandomWeightsWarning, stacklevel=2)
    torch.manual_seed(seed)
    try:
        model = open_clip.create_model(cfg_name, pretrained=checkpoint, force_quick_gelu=quick_gelu,
                                       force_image_size=size, device=device)
    except RuntimeError as err:  # strict state-dict load: missing/unexpected keys, shape mismatch
        raise ValueError(f"checkpoint {checkpoint!r} does not fit backbone {name}: {err}") from err
    model.eval().requires_grad_(False)
    visual = model.visual
    if not all(hasattr(visual, a) for a in ("transformer", "conv1", "_embeds")):
        raise ValueError(f"backbone {name} is not a plain open_clip VisionTransformer")
    depth = len(visual.transformer.resblocks)
    spec = BackboneSpec(name=name, image_size=size, patch_size=patch, grid=size // patch,
                        width=visual.conv1.out_channels, embed_dim=visual.output_dim, layers=depth,
                        adapter_layers=adapter_layers(depth), pretrained=checkpoint is not None)
    return Backbone(model, open_clip.get_tokenizer(cfg_name), spec)


def fingerprint(model: torch.nn.Module) -> float:
    """A weight checksum (sum of all parameters in float64) to verify that evaluation rebuilds the
    very backbone the run was trained with."""
    with torch.no_grad():
        return float(sum(p.detach().double().sum() for p in model.parameters()))


def frozen_tokens(backbone: Backbone, images: torch.Tensor) -> list:
    """Patch tokens ``(B, N, width)`` after each adapter block of the *unadapted* backbone (no grad).

    Used for the frozen-forward benchmark; training runs the interleaved forward in ``head.py``.
    """
    with torch.no_grad():
        out = backbone.model.visual.forward_intermediates(
            images, indices=list(backbone.spec.adapter_layers), stop_early=True,
            intermediates_only=True, output_fmt="NLC")
    return out["image_intermediates"]


@torch.no_grad()
def encode_prompts(backbone: Backbone, prompts: list, device=None) -> torch.Tensor:
    """Unit-norm text embeddings ``(len(prompts), embed_dim)`` from the CLIP text tower."""
    device = device or next(backbone.model.parameters()).device
    tokens = backbone.tokenizer(prompts).to(device)
    return torch.nn.functional.normalize(backbone.model.encode_text(tokens).float(), dim=-1)
