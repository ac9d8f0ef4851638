"""WinCLIP, zero-shot (training-free): Jeong et al., "WinCLIP: Zero-/Few-Shot Anomaly Classification and
Segmentation", CVPR 2023 (arXiv:2303.14814), Sec. 4.1-4.2.

What this file computes for ``B`` images on a ``g x g`` patch grid (``N = g**2``):

* **Compositional prompt ensemble** (Sec. 4.1): every state word (7 normal, 4 anomalous; the paper's
  appendix lists, also in anomalib's ``prompting.py``) filled with the object word, times every template
  (the paper's 21 templates); each class's text embedding is the renormalised mean of its unit prompt
  embeddings, ``t_n``, ``t_a`` (rows of ``text``). The object word is ``"object"`` by default, so the
  target's name is never needed (WinCLIP itself uses the class name, e.g. "bottle").
* **Two-class score** (Eq. 1): ``ascore_0(f) = softmax(<f, t> / tau)[anomalous] = sigmoid(z)`` with the
  log-odds ``z = (<f, t_a> - <f, t_n>) / tau``, ``tau = 0.07``.
* **Window embeddings** (Sec. 4.2, Fig. 3): for each window scale ``k`` (default 2 and 3 patches, stride 1)
  and each ``k x k`` window, the class token and the window's patch tokens (after the patch and position
  embedding, i.e. the masked token subset) run through the *whole* visual transformer; the window's
  embedding is the resulting class token after ``ln_post`` and the visual projection. This is the exact
  masked-token computation of the paper (no patch-averaging approximation); the full image gives the
  image embedding and the patch features.
* **Harmonic aggregation** (Sec. 4.2, the equation defining ``M^W``): the score of patch ``ij`` at one
  scale is the harmonic mean of ``ascore_0`` over the windows that cover it,
  ``M_ij = |W_ij| / sum_{w in W_ij} 1 / ascore_0(F_w)``. We return its *log-odds*, computed exactly and
  stably: with ``1 / sigmoid(z) = 1 + exp(-z)``, ``logit(M_ij) = -log( mean_{w in W_ij} exp(-z_w) )``
  (a soft minimum of the window logits; :func:`harmonic_log_odds`), which ranks like ``M_ij`` but never
  saturates (``M`` itself is 1.0 in float32 once every ``z`` exceeds ~17).
* **Multi-scale map**: the image-level score (broadcast to every patch) and the per-scale maps are
  fused by one more harmonic mean (as anomalib's WinCLIP, ``torch_model.py`` ``_compute_zero_shot_scores``,
  does); in log-odds form the same soft minimum. The map is bilinearly upsampled to the image size.
* **Image score**: ``image_score="cls"``: ``z`` of the full-image class token (``ascore_0``, anomalib's
  zero-shot image score); ``"cls+max"`` (default): ``log((ascore_0 + max_ij M_ij) / 2)``, the class-token
  score plus the map's maximum -- the form WinCLIP+ (Sec. 4.3) uses to fuse its scores; whether the
  paper's *zero-shot* classification numbers include the map's maximum could not be checked here (no
  code from the authors), so both are offered. A log-probability, so it ranks.

Scores and maps are log-odds / log-probabilities (they rank; probabilities saturate and tie).

Map smoothing: none of the references smooth WinCLIP's maps (the paper does not mention it; anomalib's
WinCLIP model returns the fused map as it is), so the method declares ``smooth_sigma = 0`` and the table
runner uses it for WinCLIP's cells (``build(..., smooth_sigma=4.0)`` gives a smoothed cell).

Differences from the published code: WinCLIP's authors released no code; anomalib's reimplementation
(``openvinotoolkit/anomalib``, ``models/image/winclip``) averages the *unnormalised* prompt embeddings,
returns probabilities, upsamples with ``align_corners`` default and scores the image with the class
token only. Backbone: the paper uses ViT-B/16+ at 240 px (15 x 15 grid); here any ``adsim`` backbone.
"""
from __future__ import annotations

import math

import torch

from adsim.methods.baselines.common import TEMPERATURE, check_images, log_odds, pooled
from adsim.methods.registry import Method, Output, register_zero_shot
from adsim.model.backbone import run_blocks, upsample_patches
from adsim.model.head import text_embeddings

NORMAL_STATES = ("{}", "flawless {}", "perfect {}", "unblemished {}", "{} without flaw", "{} without defect",
                 "{} without damage")
ANOMALOUS_STATES = ("damaged {}", "{} with flaw", "{} with defect", "{} with damage")
TEMPLATES = (
    "a cropped photo of the {}.", "a close-up photo of a {}.", "a close-up photo of the {}.",
    "a bright photo of a {}.", "a bright photo of the {}.", "a dark photo of the {}.", "a dark photo of a {}.",
    "a jpeg corrupted photo of a {}.", "a jpeg corrupted photo of the {}.", "a blurry photo of the {}.",
    "a blurry photo of a {}.", "a photo of a {}.", "a photo of the {}.", "a photo of a small {}.",
    "a photo of the small {}.", "a photo of a large {}.", "a photo of the large {}.",
    "a photo of the {} for visual inspection.", "a photo of a {} for visual inspection.",
    "a photo of the {} for anomaly detection.", "a photo of a {} for anomaly detection.")
IMAGE_SCORES = ("cls", "cls+max")
CHUNK = 4096  # window sequences per transformer call (bounds memory; results do not depend on it)


def prompt_ensemble(obj: str = "object") -> dict:
    """``{"normal": [...], "anomaly": [...]}``: every state word x every template (Sec. 4.1)."""
    if not isinstance(obj, str) or not obj.strip():
        raise ValueError(f"object must be a non-empty string, got {obj!r}")

    def expand(states):
        return [t.format(s.format(obj)) for s in states for t in TEMPLATES]
    return {"normal": expand(NORMAL_STATES), "anomaly": expand(ANOMALOUS_STATES)}


def windows(grid: int, k: int) -> torch.Tensor:
    """``(n_windows, k*k)`` row-major patch indices of every ``k x k`` window at stride 1 on a
    ``grid x grid`` patch grid (``n_windows = (grid - k + 1)**2``)."""
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= grid:
        raise ValueError(f"window scale must be an integer in [1, {grid}] (the patch grid), got {k!r}")
    idx = torch.arange(grid * grid).reshape(grid, grid)
    return idx.unfold(0, k, 1).unfold(1, k, 1).reshape(-1, k * k)


def harmonic_log_odds(z: torch.Tensor, win: torch.Tensor, n_patches: int) -> torch.Tensor:
    """``z (B, n_windows)`` window log-odds, ``win (n_windows, k)`` patch indices -> ``(B, n_patches)``:
    ``logit`` of the harmonic mean of ``sigmoid(z_w)`` over the windows covering each patch,
    ``-log(mean_{w covers p} exp(-z_w))`` (exact; ``logsumexp`` keeps it stable). A patch covered by no
    window gets ``-inf`` (never happens at stride 1)."""
    cover = torch.zeros(win.shape[0], n_patches, dtype=torch.bool, device=z.device)
    cover[torch.arange(win.shape[0], device=z.device)[:, None], win.to(z.device)] = True
    log_cover = torch.where(cover, 0.0, -math.inf)  # (n_windows, N)
    lse = torch.logsumexp(-z.float()[:, :, None] + log_cover[None], dim=1)  # (B, N)
    return torch.log(cover.sum(0).float()) - lse


def soft_min(z: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """``-log(mean exp(-z))`` along ``dim``: the log-odds of the harmonic mean of ``sigmoid(z)``."""
    return math.log(z.shape[dim]) - torch.logsumexp(-z, dim=dim)


class WinCLIP(Method):
    """Zero-shot WinCLIP on a frozen open_clip backbone (see the module docstring)."""

    text: torch.Tensor
    """``(2, E)`` unit text embeddings (normal, anomalous) of the prompt ensemble: a buffer."""

    def __init__(self, backbone, *, scales=(2, 3), temperature: float = TEMPERATURE, image_score: str = "cls+max",
                 object: str = "object", clip_norm: bool = True,  # noqa: A002 -- the paper's word
                 smooth_sigma: float = 0.0):
        super().__init__()
        if not isinstance(smooth_sigma, (int, float)) or isinstance(smooth_sigma, bool) or not smooth_sigma >= 0 \
                or not math.isfinite(smooth_sigma):
            raise ValueError(f"smooth_sigma must be a finite number >= 0, got {smooth_sigma!r}")
        self.smooth_sigma = float(smooth_sigma)  # Gaussian sigma (pixels) evaluation applies to the maps
        spec = backbone.spec
        scales = tuple(scales)
        if not scales or len(set(scales)) != len(scales):
            raise ValueError(f"scales must be distinct window sizes, got {scales!r}")
        self.windows = [windows(spec.grid, k) for k in scales]  # validates every scale
        if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or not temperature > 0 \
                or not math.isfinite(temperature):
            raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
        if image_score not in IMAGE_SCORES:
            raise ValueError(f"image_score must be one of {IMAGE_SCORES}, got {image_score!r}")
        if not isinstance(clip_norm, bool):
            raise ValueError(f"clip_norm must be True or False, got {clip_norm!r}")
        self.backbone, self.scales, self.image_score = backbone, scales, image_score
        self.temperature = float(temperature)
        self.name, self.clip_norm, self.image_size, self.grid = "winclip", clip_norm, spec.image_size, spec.grid
        self.register_buffer("text", text_embeddings(backbone, prompt_ensemble(object)))

    def _window_log_odds(self, x: torch.Tensor, win: torch.Tensor) -> torch.Tensor:
        """``x (B, 1 + N, W)`` embedded tokens -> ``(B, n_windows)`` log-odds of every window's embedding."""
        b, nw = x.shape[0], win.shape[0]
        cls = x[:, None, :1].expand(b, nw, 1, x.shape[-1])
        seqs = torch.cat([cls, x[:, 1 + win.to(x.device)]], dim=2).flatten(0, 1)  # (B * n_windows, 1 + k*k, W)
        visual = self.backbone.model.visual
        out = []
        for part in seqs.split(CHUNK):
            emb, _ = pooled(visual, run_blocks(self.backbone, part, visual.transformer.resblocks))
            out.append(log_odds(emb, self.text, self.temperature))
        return torch.cat(out).reshape(b, nw)

    def forward(self, images: torch.Tensor) -> Output:
        """``images (B, 3, S, S)`` -> :class:`Output` (``scores (B,)``, ``maps (B, S, S)`` log-odds /
        log-probabilities, ``patches``: the last block's unit patch features ``(B, N, E)``)."""
        check_images(images, self.backbone.spec)
        visual = self.backbone.model.visual
        x = visual._embeds(images)  # (B, 1 + N, W): patch + position embedding, ln_pre (per token)
        img, patches = pooled(visual, run_blocks(self.backbone, x, visual.transformer.resblocks))
        z_img = log_odds(img, self.text, self.temperature)  # (B,)
        n = self.grid * self.grid
        per_scale = [z_img[:, None].expand(-1, n)]
        per_scale += [harmonic_log_odds(self._window_log_odds(x, w), w, n) for w in self.windows]
        fused = soft_min(torch.stack(per_scale), dim=0)  # (B, N)
        if self.image_score == "cls":
            scores = z_img
        else:
            f = torch.nn.functional.logsigmoid
            scores = torch.logaddexp(f(z_img), f(fused.amax(dim=1))) - math.log(2.0)
        return Output(scores.float(), upsample_patches(fused, self.grid, self.image_size).float(), (patches,))


def build(backbone, **options) -> WinCLIP:
    """``build(backbone, scales=(2, 3), temperature=0.07, image_score="cls+max", object="object",
    clip_norm=True, smooth_sigma=0.0)``."""
    return WinCLIP(backbone, **options).to(next(backbone.model.parameters()).device).eval()


register_zero_shot("winclip", build)
