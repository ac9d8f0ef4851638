"""Mao et al.: Mao, Wei, Lian, Wang, Zheng, "Beyond Single-Modal Boundary: Cross-Modal Anomaly Detection through
Visual Prototype and Harmonization", CVPR 2025, pp. 9964-9973. Trained on the auxiliary domains by
``python -m adsim train --recipe mao``, rebuilt from the run folder by the ``TRAINED`` registry.

What is public (``docs/recipes.md``, section ``mao``, lists each source): the abstract, and the authors' repository
github.com/Kerio99/CMAD (commit ``a939ac7``: a README, no code) whose ``assets/framework.png`` draws the model.
From them: per auxiliary (source) modality one set of learnable *normal / abnormal prototypes* in the visual
space, a *global* pair compared with the image's global token and a *local* pair compared with the patch tokens
of a multi-scale image encoder ("Transferable Visual Prototypes"); for an image of an unseen modality, *adaptive
prototype weights* computed from the global token and the global prototypes, and the per-modality similarity
scores summed with these weights -- the local ones after a top-K over the patches ("Prototype Harmonization");
no text encoder in the model; in the few-shot setting a "Visual Discrepancy Inference" of the query's patch
tokens against the support images' patch tokens, added to the zero-shot score.

Everything below that the figure does not fix is ``adsim's choice`` (``B`` images, ``N = grid**2`` patches,
``L`` stages = the blocks ``spec.adapter_layers``, ``M = len(cfg.train_domains)`` source domains, ``E`` the
joint embedding dimension):

* **Features** (frozen CLIP, no gradient): global token ``g (B, E)`` = CLIP's image embedding (pooled class token,
  ``ln_post``, projection), unit; patch tokens of stage ``l`` = the residual stream after block
  ``spec.adapter_layers[l]`` (class token dropped) through ``ln_post`` and the projection, unit -- the same
  space as ``g`` ("multi-scale" read as the L stages).
* **Prototypes** (the only trainable parameters): ``glob (M, 2, E)`` and ``local (M, L, 2, E)``, index 0 normal,
  1 abnormal, seeded Gaussian initialisation of norm about 1, unit-normalised where used.
* **Attribute similarity**: the two-way log-odds of the cosine similarities,
  ``z = (<x, q_a> - <x, q_n>) / TEMPERATURE`` (CLIP's 0.07): ``zg[b, m]`` for the global token against domain
  ``m``'s global pair, ``zl[l, b, m, n]`` for patch ``n`` against domain ``m``'s stage-``l`` local pair.
* **Harmonization weights**: ``w[b, m] = softmax_m(max_c <g_b, glob_mc> / HARMONY_TEMPERATURE)`` (sum to 1;
  largest for the source domain whose prototypes the image's global token is closest to); no parameters of
  their own.
* **Scores**: image ``s_b = sum_m w_bm (zg[b, m] + mean_l topK_n zl[l, b, m, n])`` (topK = mean of the
  ``K = max(1, ceil(TOPK_FRACTION * N))`` largest patch log-odds); pixel map = the bilinear upsampling
  (``align_corners=False``) of ``sum_m w_bm mean_l zl[l, b, m, :]``. Both log-odds (rank, do not saturate).
* **Loss** (each sample trains only its own domain's prototypes, ``batch["domain"]``): BCE of the global
  log-odds and of the top-K local log-odds against the image label (weight ``beta_bce``), Focal and Dice of the
  upsampled stage log-odds against the mask where the domain has masks (``beta_focal``, ``beta_dice``; layer
  mean), and an attraction ``1 - <g, glob[d, y]>`` of the image's global token to its domain's prototype of
  its class (weight ``lambda_intra``) so that the global prototypes lie near their domain's images and the
  harmonization weights measure resemblance.
* **Visual Discrepancy Inference**: not a part of this file; ``Output.patches`` are the L stages' unit patch
  tokens, so ``adsim.methods.fewshot`` (a memory bank of k normal target images, nearest-neighbour cosine
  distance added to the zero-shot map in normal-standardised units) gives the few-shot mode.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from adsim.config.run import train_domains_of
from adsim.config.run import validate as validate_config
from adsim.methods.baselines.aprilgan import visual_tokens
from adsim.methods.baselines.common import TEMPERATURE, load_checked, positive_int, project
from adsim.methods.registry import Method, Output, Trainer, register_trained, register_trainer
from adsim.model import losses
from adsim.model.backbone import upsample_patches
from poolsim import core

HARMONY_TEMPERATURE = 0.07  # adsim's choice (CLIP's temperature): softmax over the source domains
TOPK_FRACTION = 0.01        # adsim's choice: K = max(1, ceil(0.01 N)) patches in the local image score
LABEL = ("Mao et al. (adsim's reading of the abstract and the authors' framework figure: per-domain global/local "
         "normal-abnormal prototypes and their harmonization are theirs; the similarity, the harmonization "
         "weights, top-K, the losses and the few-shot fusion are adsim's choices, docs/recipes.md)")


class Prototypes(nn.Module):
    """The trainable state: ``glob (M, 2, E)`` global and ``local (M, L, 2, E)`` local prototypes per source
    domain (index 0 normal, 1 abnormal), drawn from a Gaussian of standard deviation ``embed_dim ** -0.5`` (norm
    about 1) seeded by ``seed``."""

    def __init__(self, domains: int, stages: int, embed_dim: int, *, seed: int = 0):
        super().__init__()
        for name, v in (("domains", domains), ("stages", stages), ("embed_dim", embed_dim)):
            positive_int(name, v)
        gen, scale = torch.Generator().manual_seed(seed), embed_dim ** -0.5  # expected norm 1
        self.glob = nn.Parameter(scale * torch.randn(domains, 2, embed_dim, generator=gen))
        self.local = nn.Parameter(scale * torch.randn(domains, stages, 2, embed_dim, generator=gen))


def visual_features(backbone, images: torch.Tensor) -> tuple:
    """``images (B, 3, S, S)`` -> ``(g (B, E), [L x (B, N, E)])``: the unit global token and the L stages' unit
    patch tokens in the joint space (``ln_post`` and the projection), frozen."""
    img, tokens = visual_tokens(backbone, images)
    with torch.no_grad():
        return img, [project(backbone.model.visual, t) for t in tokens]


def domain_log_odds(x: torch.Tensor, protos: torch.Tensor) -> torch.Tensor:
    """``x (B, ..., E)`` unit, ``protos (M, 2, E)`` -> ``(B, M, ...)``: ``(<x, q_a> - <x, q_n>) / TEMPERATURE``
    with the unit prototypes ``q`` of each domain."""
    q = core.normalize(protos.float())
    return torch.movedim((x.float() @ (q[:, 1] - q[:, 0]).t()) / TEMPERATURE, -1, 1)


def harmonization_weights(g: torch.Tensor, glob: torch.Tensor,
                          temperature: float = HARMONY_TEMPERATURE) -> torch.Tensor:
    """``g (B, E)`` unit, ``glob (M, 2, E)`` -> ``w (B, M)``: softmax over the domains of the global token's
    cosine similarity to the nearer of each domain's two global prototypes, divided by ``temperature``."""
    if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or not temperature > 0:
        raise ValueError(f"temperature must be a number > 0, got {temperature!r}")
    sims = torch.einsum("be,mce->bmc", g.float(), core.normalize(glob.float()))
    return torch.softmax(sims.amax(-1) / temperature, dim=1)


def top_k(n: int) -> int:
    """``K`` of the local image score for ``n`` patches: ``max(1, ceil(TOPK_FRACTION * n))``."""
    return max(1, math.ceil(TOPK_FRACTION * positive_int("n", n)))


def topk_mean(z: torch.Tensor) -> torch.Tensor:
    """``z (..., N)`` -> ``(...)``: mean of the ``top_k(N)`` largest values."""
    return z.topk(top_k(z.shape[-1]), dim=-1).values.mean(-1)


def domain_scores(protos: Prototypes, g: torch.Tensor, feats) -> dict:
    """``{"zg": (B, M), "zl": (L, B, M, N)}``: the global token's and every stage's patch log-odds against every
    source domain's prototypes."""
    if len(feats) != protos.local.shape[1]:
        raise ValueError(f"feats must hold one tensor per stage ({protos.local.shape[1]}), got {len(feats)}")
    return {"zg": domain_log_odds(g, protos.glob),
            "zl": torch.stack([domain_log_odds(p, protos.local[:, l]) for l, p in enumerate(feats)])}


def _forward(protos: Prototypes, backbone, images: torch.Tensor) -> dict:
    """Training forward: ``{"g": (B, E), "zg": (B, M), "zl": (L, B, M, N)}`` for every source domain (the loss
    keeps each sample's own)."""
    g, feats = visual_features(backbone, images)
    return {"g": g, **domain_scores(protos, g, feats)}


def mao_loss(cfg, protos: Prototypes, out: dict, batch: dict) -> tuple:
    """Each sample's own domain (``batch["domain"]``) only: ``beta_bce (BCE_global + BCE_topK) + beta_focal Focal
    + beta_dice Dice + lambda_intra attraction`` (module docstring); ``(loss, {name: detached value})``."""
    idx, labels = batch["domain"].long(), batch["label"].float()
    rows = torch.arange(idx.shape[0], device=idx.device)
    zg, zl = out["zg"][rows, idx], out["zl"][:, rows, idx]  # (B,), (L, B, N)
    masks, has_mask = (batch["mask"] > 0.5).float(), batch["has_mask"].float()
    if cfg.cls_only_pixel_loss == "none" and "pixel_domain" in batch:
        has_mask = has_mask * batch["pixel_domain"]
    n_stages, _, n = zl.shape
    z = upsample_patches(zl, int(round(n ** 0.5)), masks.shape[-1], matmul=True).flatten(0, 1)  # (L * B, S, S)
    masks_l, valid_l = masks.repeat(n_stages, 1, 1), has_mask.repeat(n_stages)
    target = core.normalize(protos.glob.float())[idx, labels.long()]  # (B, E): own domain, own class
    parts = {"bce_global": losses.bce_loss(zg, labels),
             "bce_local": losses.bce_loss(topk_mean(zl).mean(0), labels),
             "focal": losses.focal_loss(z, masks_l, valid_l),
             "dice": losses.dice_loss(torch.sigmoid(z), masks_l, valid_l),
             "attract": (1.0 - (out["g"].float() * target).sum(-1)).mean()}
    loss = (cfg.beta_bce * (parts["bce_global"] + parts["bce_local"]) + cfg.beta_focal * parts["focal"]
            + cfg.beta_dice * parts["dice"] + cfg.lambda_intra * parts["attract"])
    return loss, {k: v.detach().float() for k, v in parts.items()}


def build_prototypes(cfg, backbone) -> Prototypes:
    """The trainable module of a run: one global and one local prototype pair per training domain and stage."""
    spec = backbone.spec
    return Prototypes(len(train_domains_of(validate_config(cfg))), len(spec.adapter_layers), spec.embed_dim,
                      seed=cfg.seed)


class Mao(Method):
    """Inference with the trained prototypes of the source ``domains`` (names, in ``protos`` order)."""

    def __init__(self, backbone, protos: Prototypes, domains=(), *, clip_norm: bool = True):
        super().__init__()
        domains = tuple(domains)
        if domains and len(domains) != protos.glob.shape[0]:
            raise ValueError(f"domains must name the {protos.glob.shape[0]} source domains of the prototypes, "
                             f"got {domains}")
        self.backbone, self.protos, self.domains = backbone, protos, domains
        self.name, self.clip_norm = "mao", clip_norm
        self.image_size, self.grid = backbone.spec.image_size, backbone.spec.grid

    def weights(self, images: torch.Tensor) -> torch.Tensor:
        """``(B, M)`` harmonization weights of ``images`` over the source domains."""
        g, _ = visual_features(self.backbone, images)
        return harmonization_weights(g, self.protos.glob)

    def forward(self, images: torch.Tensor) -> Output:
        """``images (B, 3, S, S)`` -> :class:`Output`: harmonized image log-odds, harmonized pixel log-odds,
        ``patches`` = the L stages' unit patch tokens."""
        g, feats = visual_features(self.backbone, images)
        out = domain_scores(self.protos, g, feats)
        w = harmonization_weights(g, self.protos.glob)  # (B, M)
        scores = (w * (out["zg"] + topk_mean(out["zl"]).mean(0))).sum(1)
        patch = (w[None, :, :, None] * out["zl"]).sum(2).mean(0)  # (B, N)
        return Output(scores.float(), upsample_patches(patch, self.grid, self.image_size).float(), tuple(feats))


def load(cfg, backbone, record, state: dict) -> Mao:
    """Rebuild the method of a ``mao`` run: prototypes for the run's training domains and the backbone's stages
    from the checkpoint (``{"glob", "local"}``); a state of another method or shape -> ``ValueError``."""
    keys = sorted(state) if isinstance(state, dict) else type(state).__name__
    if not isinstance(state, dict) or set(state) != {"glob", "local"}:
        raise ValueError(f"checkpoint state is not a mao state (need 'glob' and 'local'); keys: {keys}")
    device = next(backbone.model.parameters()).device
    protos = build_prototypes(cfg, backbone)
    load_checked(protos, state, "mao prototypes of this run's domains and backbone")
    return Mao(backbone, protos.to(device), validate_config(cfg).train_domains, clip_norm=cfg.clip_norm).eval()


def _method(cfg, backbone, protos: Prototypes) -> Mao:
    return Mao(backbone, protos, validate_config(cfg).train_domains, clip_norm=cfg.clip_norm)


register_trainer("mao", Trainer(build=build_prototypes, forward=_forward, loss=mao_loss, method=_method))
register_trained("mao", load)
