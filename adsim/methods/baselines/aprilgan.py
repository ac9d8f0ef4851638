"""APRIL-GAN: Chen, Han, Zhang, "APRIL-GAN: A Zero-/Few-Shot Anomaly Classification and Segmentation Method
for CVPR 2023 VAND Workshop Challenge Tracks 1&2" (arXiv:2305.17382). Trained on the auxiliary domains by
``python -m adsim train --recipe aprilgan`` (or ``--method aprilgan``), rebuilt from the run folder by the
``TRAINED`` registry. Reference code: github.com/ByChelsea/VAND-APRIL-GAN (commit ``f13b8a6``).

What this file computes (``B`` images, ``N = grid**2`` patches, ``L`` = 4 feature stages after the blocks
``spec.adapter_layers`` -- ViT-L: 6, 12, 18, 24, their ``--features_list 6 12 18 24``):

* **Text** (fixed, never trained): the prompt ensemble of their ``prompt_ensemble.py``
  (``encode_text_with_prompt_ensemble``: 7 normal and 5 abnormal state phrases x 35 templates, unit
  embeddings averaged and renormalised per state) -- the recipe's ``prompts`` (``aprilgan``:
  ``mvfa_object``, the same phrases and templates; MVFA-AD took them from APRIL-GAN) with the object
  word of that prompt set instead of the class name.
* **Per-stage linear maps into the text space** (their ``model.py`` ``LinearLayer``; paper Sec. 2.2):
  for each stage ``l`` one ``nn.Linear(W, E)`` (with bias, torch's default initialisation) applied to the
  RAW residual-stream patch tokens after block ``l`` -- class token dropped, no ``ln_post``, no visual
  projection (their ``open_clip/transformer.py`` returns the block outputs as they are) -- then
  unit-normalised. These ``L`` maps are the only trainable parameters; CLIP stays frozen.
* **Patch log-odds**: ``z_l = (<p, t_a> - <p, t_n>) / 0.01`` (their ``100.0 * patch_tokens @ text``; the
  two-way softmax's anomalous probability is ``sigmoid(z_l)``).
* **Loss** (their ``train.py``): ``sum_l Focal(softmax(up(logits_l)), mask) + Dice(softmax(up(logits_l))[anomalous], mask)``,
  the two-channel logits bilinearly upsampled to the mask size with ``align_corners=True`` before the
  softmax (bilinear interpolation is linear, so the upsampled two-way softmax is ``sigmoid`` of the
  upsampled ``z_l``, which is what is computed here), masks binarised at 0.5. Dice on the anomalous
  channel only; no image-level loss (their training has none). Weights ``beta_focal``, ``beta_dice``
  (recipe 1, 1); ``beta_bce`` has no effect (the image score has no trainable part).
* **Image score** (their ``test.py``, zero-shot mode): the FROZEN CLIP image embedding (open_clip's pooled
  class token, ``ln_post``, projection), unit, against the same text: ``z_img = (<f, t_a> - <f, t_n>) / 0.01``
  (log-odds of their ``softmax(100 f @ t)[1]``, same ranking). The trained maps do not enter it.
* **Pixel map**: ``map_score="logit_mean"`` (default; the run's method): the layer mean of the upsampled
  ``z_l`` (log-odds; ranks without saturating); ``"prob_sum"``: their literal map, the layer sum of the
  anomalous probabilities ``sum_l sigmoid(up(z_l))``. Both upsample with ``align_corners=True`` as they do.

Where this differs from their code (also in ``docs/recipes.md``): class name -> the prompt set's object word;
Focal without their label smoothing (1e-5); the backbone's image size (they use 518 px); the other BMAD
domains as training data (they train on MVTec AD or VisA); gradient clipping 1.0 (the run's ``grad_clip``);
classification-only domains contribute no loss (they have no such images).
"""
from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from adsim.config.prompts import prompt_texts
from adsim.methods.baselines.common import check_images, layer_targets, load_checked, log_odds, pooled, positive_int
from adsim.methods.registry import Method, Output, Trainer, register_trained, register_trainer
from adsim.model import losses
from adsim.model.backbone import run_blocks, upsample_patches
from adsim.model.head import text_embeddings
from poolsim import core

TEMPERATURE = 0.01   # their ``100.0 * features @ text`` (train.py, test.py)
MAP_SCORES = ("logit_mean", "prob_sum")


class LinearMaps(nn.Module):
    """The trainable state: ``fc[l]: nn.Linear(W, E)`` for each of the ``L`` stages, and ``text (2, E)`` the
    fixed unit text embeddings (normal, anomalous) as a buffer that is not saved (rebuilt from the run's
    prompts)."""

    text: torch.Tensor
    """``(2, E)`` unit text embeddings (normal, anomalous): a buffer that is not saved."""

    def __init__(self, width: int, embed_dim: int, text: torch.Tensor, *, stages: int = 4, seed: int = 0):
        super().__init__()
        for name, v in (("width", width), ("embed_dim", embed_dim), ("stages", stages)):
            positive_int(name, v)
        if not torch.is_tensor(text) or tuple(text.shape) != (2, embed_dim):
            shape = tuple(text.shape) if torch.is_tensor(text) else type(text).__name__
            raise ValueError(f"text must be a (2, {embed_dim}) tensor (normal, anomalous), got {shape}")
        with torch.random.fork_rng(devices=[]):  # the initialisation depends on ``seed`` only
            torch.manual_seed(seed)
            self.fc = nn.ModuleList([nn.Linear(width, embed_dim) for _ in range(stages)])
        self.register_buffer("text", core.normalize(text.float()), persistent=False)


def visual_tokens(backbone, images: torch.Tensor) -> tuple:
    """``images (B, 3, S, S)`` -> ``(image embedding (B, E) unit, [L x (B, N, W)] raw patch tokens after the
    blocks spec.adapter_layers)``: one pass of the frozen visual tower, without gradient."""
    check_images(images, backbone.spec)
    visual = backbone.model.visual
    layers = set(backbone.spec.adapter_layers)
    tokens = []
    with torch.no_grad():
        x = visual._embeds(images)
        for i, block in enumerate(visual.transformer.resblocks):
            x = run_blocks(backbone, x, (block,))
            if i in layers:
                tokens.append(x[:, 1:])  # class token dropped (their LinearLayer: tokens[i][:, 1:, :])
        img, _ = pooled(visual, x)
    return img, tokens


class _StageMaps(Protocol):
    """What :func:`stage_features` reads: ``fc[l]: nn.Linear(W, E)`` per stage (:class:`LinearMaps`, and
    AdaCLIP's prompts, which project their patch tokens the same way)."""

    fc: nn.ModuleList


def stage_features(maps: _StageMaps, tokens) -> list:
    """Raw patch tokens ``[L x (B, N, W)]`` -> ``[L x (B, N, E)]`` unit features, stage ``l`` through ``fc[l]``."""
    if len(tokens) != len(maps.fc):
        raise ValueError(f"tokens must hold one tensor per stage ({len(maps.fc)}), got {len(tokens)}")
    return [core.normalize(fc(t.to(fc.weight.dtype)).float()) for fc, t in zip(maps.fc, tokens)]


def _forward(maps: LinearMaps, backbone, images: torch.Tensor) -> dict:
    """Training forward: ``{"z_img": (B,), "z_maps": (L, B, N)}`` (``z_img`` without gradient)."""
    img, tokens = visual_tokens(backbone, images)
    feats = stage_features(maps, tokens)
    return {"z_img": log_odds(img, maps.text, TEMPERATURE),
            "z_maps": torch.stack([log_odds(p, maps.text, TEMPERATURE) for p in feats])}


def aprilgan_loss(cfg, maps, out: dict, batch: dict) -> tuple:
    """``sum_l (beta_focal Focal_l + beta_dice Dice_l(anomalous))`` on the upsampled (``align_corners=True``)
    patch log-odds against the binarised masks (module docstring); returns ``(loss, {name: detached value})``."""
    z, masks_l, valid_l = layer_targets(cfg, out["z_maps"], batch)  # (L * B, S, S), (L * B, S, S), (L * B,)
    n_layers = out["z_maps"].shape[0]
    parts = {"focal": n_layers * losses.focal_loss(z, masks_l, valid_l),
             "dice": n_layers * losses.dice_loss(torch.sigmoid(z), masks_l, valid_l)}
    loss = cfg.beta_focal * parts["focal"] + cfg.beta_dice * parts["dice"]
    return loss, {k: v.detach().float() for k, v in parts.items()}


def build_maps(cfg, backbone) -> LinearMaps:
    """The trainable module of a run: one linear map per stage, the text of ``cfg.prompts``, seeded by ``cfg.seed``."""
    spec = backbone.spec
    text = text_embeddings(backbone, prompt_texts(cfg.prompts))
    return LinearMaps(spec.width, spec.embed_dim, text, stages=len(spec.adapter_layers), seed=cfg.seed)


class APRILGAN(Method):
    """Inference with the trained per-stage maps (module docstring); ``map_score`` one of :data:`MAP_SCORES`."""

    def __init__(self, backbone, maps: LinearMaps, *, clip_norm: bool = True, map_score: str = "logit_mean"):
        super().__init__()
        if map_score not in MAP_SCORES:
            raise ValueError(f"map_score must be one of {MAP_SCORES}, got {map_score!r}")
        self.backbone, self.maps, self.map_score = backbone, maps, map_score
        self.name, self.clip_norm = "aprilgan", clip_norm
        self.image_size, self.grid = backbone.spec.image_size, backbone.spec.grid

    def forward(self, images: torch.Tensor) -> Output:
        """``images (B, 3, S, S)`` -> :class:`Output`: ``scores`` = ``z_img`` of the frozen image embedding,
        ``maps`` per ``map_score``, ``patches`` = the L stages' unit features."""
        img, tokens = visual_tokens(self.backbone, images)
        feats = stage_features(self.maps, tokens)
        z = upsample_patches(torch.stack([log_odds(p, self.maps.text, TEMPERATURE) for p in feats]),
                             self.grid, self.image_size, align_corners=True)  # (L, B, S, S)
        maps = z.mean(0) if self.map_score == "logit_mean" else torch.sigmoid(z).sum(0)
        return Output(log_odds(img, self.maps.text, TEMPERATURE).float(), maps.float(), tuple(feats))


def load(cfg, backbone, record, state: dict) -> APRILGAN:
    """Rebuild the method of an ``aprilgan`` run: the run's prompts' text embeddings and the checkpoint's
    linear maps (``{"fc.<l>.weight", "fc.<l>.bias"}``); a state of another method or shape -> ``ValueError``."""
    spec = backbone.spec
    keys = sorted(state) if isinstance(state, dict) else type(state).__name__
    if not isinstance(state, dict) or not state or not all(k.startswith("fc.") for k in state):
        raise ValueError(f"checkpoint state is not an aprilgan state (need 'fc.<stage>.weight' / '.bias'); keys: {keys}")
    device = next(backbone.model.parameters()).device
    maps = LinearMaps(spec.width, spec.embed_dim, text_embeddings(backbone, record["prompts"]),
                      stages=len(spec.adapter_layers), seed=cfg.seed)
    load_checked(maps, state, "aprilgan maps of this backbone")
    return APRILGAN(backbone, maps.to(device), clip_norm=cfg.clip_norm).eval()


def _method(cfg, backbone, maps: LinearMaps) -> APRILGAN:
    return APRILGAN(backbone, maps, clip_norm=cfg.clip_norm)


register_trainer("aprilgan", Trainer(build=build_maps, forward=_forward, loss=aprilgan_loss, method=_method))
register_trained("aprilgan", load)
