"""AnomalyCLIP: Zhou et al., "AnomalyCLIP: Object-agnostic Prompt Learning for Zero-shot Anomaly
Detection", ICLR 2024 (arXiv:2310.18961). Trained on the auxiliary domains by ``python -m adsim train
--recipe anomalyclip`` (or ``--method anomalyclip``), rebuilt from the run folder by the ``TRAINED``
registry.

What this file computes (``B`` images, ``N = grid**2`` patches, ``L`` = 4 feature layers, the blocks
``spec.adapter_layers`` -- ViT-L: 6, 12, 18, 24 as in AnomalyCLIP):

* **Object-agnostic prompts** (Sec. 3, object-agnostic text prompt design: the templates
  ``g_n = [V_1]...[V_E][object]``, ``g_a = [W_1]...[W_E][damaged][object]``): the prompts
  ``"X ... X object."`` and ``"X ... X damaged object."`` are tokenised once; the token embeddings at
  the ``E = 12`` ``X`` positions are replaced by learned vectors (init N(0, 0.02^2)) and the sequence
  runs through the FROZEN open_clip text transformer exactly as ``CLIP.encode_text`` does (positional
  embedding, transformer, ``ln_final``, end-of-text pooling, text projection). The learned vectors are
  the only trainable parameters; the text and visual encoders are frozen (no gradient reaches them).
* **Deep text prompts** (their ``design_details``: ``--depth 9 --t_n_ctx 4``, ``train.py:124-126``;
  ``prompt_ensemble.py:159-163``; ``AnomalyCLIP.py`` ``ResidualAttentionBlock_learnable_token``): before
  each text block ``1 .. depth - 1`` the hidden states at positions ``1 .. t`` are replaced by that
  layer's learned vectors ``(t, D)``, shared by the two prompts (``depth = 9``, ``t = 4``, capped at the
  text tower's depth; init N(0, 0.02^2)).
* **Global score** (Sec. 3, glocal context optimization): ``z_img = (<f_cls, t_a> - <f_cls, t_n>) / 0.07``
  for the class token of the last block times the visual projection, WITHOUT ``ln_post`` (their
  ``AnomalyCLIP_lib/AnomalyCLIP.py:387``, ``x_ori[0, :, :] @ self.proj``; CLIP's own image embedding applies
  ``ln_post`` first -- ``PromptLearner(image_ln_post=True)`` gives that); ``P(anomalous) =
  softmax(<f, t> / 0.07)[1] = sigmoid(z_img)``.
* **Local maps** (Sec. 3, local context): the patch tokens after each feature layer, through ``ln_post``
  and the visual projection (the joint space; their ``AnomalyCLIP.py:383``), unit-normalised;
  ``z_l = (<p, t_a> - <p, t_n>) / 0.07`` per patch.
* **DPAM** (Sec. 3, refinement of the local visual space; their ``AnomalyCLIP_lib/AnomalyCLIP.py``
  ``Attention``, ``ResidualAttentionBlock.forward``, ``DAPM_replace``): from the first feature layer on
  (ViT-L: blocks 6-24, their ``DPAM_layer = 20``, ``train.py:42, :73``) the visual tower runs two paths.
  The original path is the unmodified block; the DPAM path adds, block by block, the *V-V* self-attention
  ``softmax(v v^T / sqrt(d)) v`` (queries and keys replaced by the values; same projections) of the
  original path's ``ln_1`` tokens, without the MLP. Patch features come from the DPAM path, the image
  embedding from the original path (:func:`visual_features`).
* **Glocal loss** (Sec. 3, glocal context optimization; their ``train.py:82-104``): ``L_global`` =
  cross-entropy of the two-way softmax of the image embedding against the image label (= BCE on
  ``z_img``); ``L_local`` = sum over the layers of Focal(softmax map, mask) + Dice(anomalous map, mask)
  + Dice(normal map, 1 - mask), on the patch *probabilities* ``sigmoid(z)`` (= the two-way softmax)
  bilinearly upsampled to the mask size (their ``compute_similarity`` softmax, then ``get_similarity_map``'s
  ``interpolate``, ``model_load.py:222-235``); the focal loss of ``adsim.model.losses`` takes the logit of the
  upsampled probability (clamped to [1e-6, 1 - 1e-6]). ``PromptLearner(upsample="logit")`` upsamples the
  log-odds instead. Weights ``beta_bce``, ``beta_focal``,
  ``beta_dice`` of the recipe (``anomalyclip``: 1, 4, 4 -- AnomalyCLIP multiplies the local loss by
  ``lam = 4``, ``train.py:50, :102``). Classification-only domains: no pixel loss
  (``cls_only_pixel_loss="none"``, as the head).
* **Inference**: image score ``z_img`` (log-odds of AnomalyCLIP's image probability, so it ranks); pixel
  map: the layer *mean* of the patch log-odds, bilinearly upsampled. AnomalyCLIP's code
  (``zqhang/AnomalyCLIP`` ``test.py:93-111``) scores the image with the probability ``sigmoid(z_img)``
  (same ranking), sums the per-layer anomalous *probabilities* of the maps (saturating; a different but
  similar ranking) and smooths with a Gaussian of sigma 4 (``evaluate``'s ``smooth_sigma``, recipe value 4).

Where this differs from AnomalyCLIP's code (also in ``docs/recipes.md``):

* Inference scores are log-odds and the map a layer mean (above); no label smoothing in the focal loss.
* Map smoothing: their sigma 4 was chosen at 518 px; the recipe applies sigma 4 at the backbone's size (238 px
  on ViT-L-14-336), i.e. about 2.2 times wider relative to the image (``--set smooth_sigma=1.84`` matches
  their relative width at 238 px).
* Image size: the backbone's (AnomalyCLIP trains at 518 px with Resize + CenterCrop); the training data
  are the other BMAD domains (AnomalyCLIP trains on one auxiliary data set); training settings from the
  recipe (AnomalyCLIP: 15 epochs, lr 1e-3, batch 8, Adam betas (0.5, 0.999)); gradient clipping 1.0
  (the run's ``grad_clip``; theirs none).
* The ``ffn`` variant of their dual path (an MLP on the DPAM path, off by default) is not offered.
"""
from __future__ import annotations

import torch
from torch import nn

from adsim.methods.baselines.common import check_images, load_checked, log_odds, pooled, project
from adsim.methods.registry import Method, Output, Trainer, register_trained, register_trainer
from adsim.model import losses
from adsim.model.backbone import run_blocks, upsample_patches
from adsim.model.prompting import encode_text_deep, pooled_length
from poolsim import core

N_CTX = 12           # learnable tokens per prompt (AnomalyCLIP's prompt length)
DEPTH, T_CTX = 9, 4  # deep text prompts: layers 1 .. DEPTH - 1, T_CTX positions each
PROB_EPS = 1e-6     # clamp of the upsampled probabilities before their logit (focal loss)
PLACEHOLDER = "X"    # tokenised once; its embedding positions are replaced by the learned vectors
TEMPLATES = ("{} object.", "{} damaged object.")  # normal, anomalous (object-agnostic)


UPSAMPLES = ("prob", "logit")  # what the pixel loss upsamples: AnomalyCLIP's probabilities, or the log-odds


class PromptLearner(nn.Module):
    """The trainable state: ``ctx (2, n_ctx, D_text)`` learned token embeddings (normal, anomalous) and
    ``deep (depth - 1, t, D_text)`` the deep text prompts. ``tokens (2, context_length)`` is derived from
    ``n_ctx`` (not saved). ``image_ln_post`` (image embedding with CLIP's ``ln_post``; AnomalyCLIP: without)
    and ``upsample`` (one of :data:`UPSAMPLES`) are settings, not state."""

    tokens: torch.Tensor
    """``(2, context_length)`` token ids of the two prompt templates: a buffer that is not saved."""

    def __init__(self, backbone, *, n_ctx: int = N_CTX, depth: int = DEPTH, t: int = T_CTX, seed: int = 0,
                 image_ln_post: bool = False, upsample: str = "prob"):
        super().__init__()
        if not isinstance(image_ln_post, bool):
            raise ValueError(f"image_ln_post must be True or False, got {image_ln_post!r}")
        if upsample not in UPSAMPLES:
            raise ValueError(f"upsample must be one of {UPSAMPLES}, got {upsample!r}")
        self.image_ln_post, self.upsample = image_ln_post, upsample
        if not isinstance(n_ctx, int) or isinstance(n_ctx, bool) or not 1 <= n_ctx <= 60:
            raise ValueError(f"n_ctx must be an integer in [1, 60], got {n_ctx!r}")
        model = backbone.model
        depth = min(depth, len(model.transformer.resblocks))  # capped at the text tower's depth
        if not isinstance(t, int) or isinstance(t, bool) or not 1 <= t <= n_ctx or depth < 1:
            raise ValueError(f"deep prompts need 1 <= t <= n_ctx ({n_ctx}) and depth >= 1, got t={t!r}, "
                             f"depth={depth!r}")
        words = " ".join([PLACEHOLDER] * n_ctx)
        tokens = backbone.tokenizer([tpl.format(words) for tpl in TEMPLATES])
        if not bool((tokens[:, 1:1 + n_ctx] == tokens[0, 1]).all()):  # one BPE token per placeholder
            raise ValueError(f"the placeholder {PLACEHOLDER!r} does not tokenise to one token per position")
        gen = torch.Generator().manual_seed(seed)
        width = model.token_embedding.weight.shape[1]
        self.ctx = nn.Parameter(0.02 * torch.randn(2, n_ctx, width, generator=gen))
        self.deep = nn.Parameter(0.02 * torch.randn(depth - 1, t, width, generator=gen))
        self.register_buffer("tokens", tokens.to(model.token_embedding.weight.device), persistent=False)
        self.n_ctx, self.pooled = n_ctx, pooled_length(tokens)  # read once, on the host


def text_features(backbone, learner: PromptLearner) -> torch.Tensor:
    """``(2, E)`` unit text embeddings (normal, anomalous) of the learned prompts through the frozen text
    tower; differentiable in the learned vectors only. Mirrors ``open_clip.CLIP.encode_text`` (block by
    block, as ``open_clip.transformer.Transformer.forward``) with the token embeddings at positions
    ``1 .. n_ctx`` replaced, and the deep prompts inserted before blocks ``1 .. depth - 1``."""
    model, tokens, n = backbone.model, learner.tokens, learner.n_ctx
    emb = model.token_embedding(tokens).to(model.transformer.get_cast_dtype())
    x = torch.cat([emb[:, :1], learner.ctx.to(emb.dtype), emb[:, 1 + n:]], dim=1)
    return encode_text_deep(backbone, tokens, embeds=x, deep=tuple(learner.deep), length=learner.pooled)


def vv_attention(block, h: torch.Tensor) -> torch.Tensor:
    """DPAM's V-V self-attention of one open_clip block on ``h (B, T, W)`` (= ``ln_1`` of the block's
    input): the block's own ``in_proj`` value projection used as queries, keys and values, its heads,
    scale ``1 / sqrt(head_dim)`` and ``out_proj`` (and its layer scale ``ls_1``)."""
    attn = block.attn
    if not isinstance(attn, nn.MultiheadAttention):
        raise ValueError(f"DPAM needs nn.MultiheadAttention blocks, got {type(attn).__name__}")
    b, t, c = h.shape
    heads = attn.num_heads
    w_v = attn.in_proj_weight[2 * c:]
    b_v = None if attn.in_proj_bias is None else attn.in_proj_bias[2 * c:]
    v = nn.functional.linear(h, w_v, b_v).reshape(b, t, heads, c // heads).transpose(1, 2)  # (B, H, T, d)
    out = nn.functional.scaled_dot_product_attention(v, v, v)  # softmax(v v^T / sqrt(d)) v
    out = nn.functional.linear(out.transpose(1, 2).reshape(b, t, c), attn.out_proj.weight, attn.out_proj.bias)
    return block.ls_1(out)


def visual_features(backbone, images: torch.Tensor, *, dpam: bool = True, image_ln_post: bool = False) -> tuple:
    """``images (B, 3, S, S)`` -> ``(image embedding (B, E) unit, [L x (B, N, E)] unit patch features after
    the blocks ``spec.adapter_layers``)``, through the frozen visual tower. ``dpam``: from the first
    feature layer on, patch features from the DPAM path (module docstring); the image embedding is
    always the unmodified tower's: its class token times the projection, through ``ln_post`` first only
    when ``image_ln_post`` (CLIP's embedding; AnomalyCLIP's code omits it)."""
    check_images(images, backbone.spec)
    visual = backbone.model.visual
    blocks = visual.transformer.resblocks
    first, layers = backbone.spec.adapter_layers[0], set(backbone.spec.adapter_layers)
    x = run_blocks(backbone, visual._embeds(images), blocks[:first])
    path = x  # the DPAM path starts from the first DPAM block's input
    patches = []
    for i in range(first, len(blocks)):
        if dpam:
            path = path + vv_attention(blocks[i], blocks[i].ln_1(x))
        x = run_blocks(backbone, x, blocks[i:i + 1])
        if i in layers:
            patches.append(project(visual, (path if dpam else x)[:, 1:]))
    if image_ln_post:
        img, _ = pooled(visual, x)
    else:  # AnomalyCLIP.py:387: x_ori[0, :, :] @ self.proj
        img = x[:, 0] @ visual.proj if visual.proj is not None else x[:, 0]
        img = core.normalize(img.float())
    return img, patches


def _forward(learner: PromptLearner, backbone, images: torch.Tensor) -> dict:
    """Training forward: ``{"z_img": (B,), "z_maps": (L, B, N)}``; the visual tower
    runs without gradient (frozen, and the prompts do not enter it)."""
    with torch.no_grad():
        img, patches = visual_features(backbone, images, image_ln_post=learner.image_ln_post)
    text = text_features(backbone, learner)
    return {"z_img": log_odds(img, text), "z_maps": torch.stack([log_odds(p, text) for p in patches])}


def glocal_loss(cfg, learner, out: dict, batch: dict) -> tuple:
    """``beta_bce L_global + sum_l (beta_focal Focal_l + beta_dice (Dice_l(anomalous) + Dice_l(normal)))``
    (module docstring); returns ``(loss, {name: detached value})``."""
    labels, masks, has_mask = batch["label"], batch["mask"], batch["has_mask"]
    if cfg.cls_only_pixel_loss == "none" and "pixel_domain" in batch:
        has_mask = has_mask * batch["pixel_domain"]
    z_maps = out["z_maps"]
    n_layers, b, n = z_maps.shape
    grid, size = int(round(n ** 0.5)), masks.shape[-1]
    if getattr(learner, "upsample", "prob") == "prob":  # their softmax at the patches, then interpolate
        prob = upsample_patches(torch.sigmoid(z_maps), grid, size).flatten(0, 1)  # (L * B, S, S)
        z = torch.logit(prob, eps=PROB_EPS)
    else:
        z = upsample_patches(z_maps, grid, size).flatten(0, 1)
        prob = torch.sigmoid(z)
    masks_l, valid_l = masks.repeat(n_layers, 1, 1), has_mask.repeat(n_layers)
    parts = {"bce": losses.bce_loss(out["z_img"], labels),
             "focal": n_layers * losses.focal_loss(z, masks_l, valid_l),
             "dice": n_layers * losses.two_way_dice_loss(prob, masks_l, valid_l)}
    loss = cfg.beta_bce * parts["bce"] + cfg.beta_focal * parts["focal"] + cfg.beta_dice * parts["dice"]
    return loss, {k: v.detach().float() for k, v in parts.items()}


def _build(cfg, backbone) -> PromptLearner:
    return PromptLearner(backbone, seed=cfg.seed)


class AnomalyCLIP(Method):
    """Inference with learned prompts (text embeddings computed once, at construction)."""

    text: torch.Tensor
    """``(2, E)`` unit text embeddings (normal, anomalous) of the learned prompts: a buffer."""

    def __init__(self, backbone, learner: PromptLearner, *, clip_norm: bool = True, dpam: bool = True):
        super().__init__()
        self.backbone, self.learner, self.dpam = backbone, learner, dpam
        self.name, self.clip_norm = "anomalyclip", clip_norm
        self.image_size, self.grid = backbone.spec.image_size, backbone.spec.grid
        with torch.no_grad():
            self.register_buffer("text", text_features(backbone, learner))

    def forward(self, images: torch.Tensor) -> Output:
        """``images (B, 3, S, S)`` -> :class:`Output`: ``scores`` = ``z_img`` (B,), ``maps`` = layer mean of
        the patch log-odds, upsampled (B, S, S); ``patches`` = the L layers' unit patch features."""
        img, patches = visual_features(self.backbone, images, dpam=self.dpam,
                                       image_ln_post=self.learner.image_ln_post)
        z_maps = torch.stack([log_odds(p, self.text) for p in patches]).mean(0)
        return Output(log_odds(img, self.text).float(), upsample_patches(z_maps, self.grid, self.image_size).float(),
                      tuple(patches))


def load(cfg, backbone, record, state: dict) -> AnomalyCLIP:
    """Rebuild the method of an ``anomalyclip`` run from its checkpoint state (``{"ctx", "deep"}``); a state
    of another method or shape -> ``ValueError``."""
    ctx, deep = (state.get("ctx"), state.get("deep")) if isinstance(state, dict) else (None, None)
    if ctx is None or deep is None or ctx.ndim != 3 or ctx.shape[0] != 2 or deep.ndim != 3:
        raise ValueError(f"checkpoint state is not an anomalyclip prompt state (need 'ctx' (2, n_ctx, D) and "
                         f"'deep' (depth - 1, t, D)); keys: {sorted(state) if isinstance(state, dict) else type(state)}")
    learner = PromptLearner(backbone, n_ctx=int(ctx.shape[1]), depth=int(deep.shape[0]) + 1, t=int(deep.shape[1]),
                            seed=cfg.seed)
    load_checked(learner, state, "anomalyclip prompts of this backbone")
    device = next(backbone.model.parameters()).device
    return AnomalyCLIP(backbone, learner.to(device), clip_norm=cfg.clip_norm).eval()


def _method(cfg, backbone, learner: PromptLearner) -> AnomalyCLIP:
    return AnomalyCLIP(backbone, learner, clip_norm=cfg.clip_norm)


register_trainer("anomalyclip", Trainer(build=_build, forward=_forward, loss=glocal_loss, method=_method))
register_trained("anomalyclip", load)
