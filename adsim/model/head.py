"""Trainable head: seg/det adapters interleaved with the frozen blocks, VACA, text scoring, centroids.

Shapes: ``B`` images, ``N = grid**2`` patch tokens, ``W`` transformer width, ``E`` joint embedding
dimension (adapter bottleneck = text embedding size), ``L = 4`` adapter layers.

* Adapters (after blocks ``spec.adapter_layers``): ``W -> E -> W`` with LeakyReLU; the residual stream
  continues as ``0.8 x + 0.1 seg_out + 0.1 det_out``; the ``E``-d bottleneck output is the token
  feature scored against the text embeddings.
* Text: ``T = (t_normal, t_anomaly)``, each the renormalised mean over a prompt ensemble written for
  this project (state phrases x templates). One prompt set for training, selection and test.
* VACA (Algorithm 1, step 2) on both tasks: ``Delta = |mean_{b,n} P_norm (t_normal - t_anomaly)|``,
  ``a = Softplus(MLP(Delta))``, ``w = 1 + gamma a``, ``P~ = normalize(P_norm w)`` and
  ``Var = Var(Delta w)``. ``Delta`` is a batch statistic used as a constant (detached), so
  ``L_var`` only reaches the MLP, as the paper states; a running mean of ``Delta`` (like batch-norm
  statistics) is used at evaluation so a test image's score never depends on the other test images.
  ``P~`` is renormalised because step (3) takes ``arccos(<f, c>)``, which needs unit features.
* Patch logit ``z = 100 (<f, t_anomaly> - <f, t_normal>)``: the two-way softmax of ``100 <f, T>``
  gives ``P(anomaly) = sigmoid(z)``. Image logit per layer: ``max_n z_det`` (Algorithm 1).
* Evaluation scores (``score=``, :data:`SCORES`), chosen so that they *rank*: with ``|z|`` in the tens
  (logit scale 100), ``sigmoid(z)`` is exactly 1.0 in float32 for every ``z >= 17``, so any average of
  probabilities ties. ``"logit_max"`` (default): image score = layer mean of ``max_n z_det``, pixel map =
  layer mean of ``z_seg``; ``"logit_mean"``: image score = layer mean of ``mean_n z_det`` (same map).
  ``"authors_prob_mean"``: the released code's scoring, kept so their numbers stay comparable
  (``AyushRoy2001/Beyond-Pooling``, ``test_zero.py``, ``test()``: image score = sum over layers of
  the patch mean of ``softmax(100 <f, T>)[anomaly]``; pixel map = sum over layers of the softmax of the
  bilinearly upsampled logits, ``align_corners=True``); we take the layer *mean* (same ranking).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import NamedTuple

import torch
from torch import nn

from adsim.config.choices import DEFAULT_SCORE, SCORES
from adsim.config.run import TrainConfig
from adsim.model.backbone import Backbone, encode_prompts, run_blocks, upsample_patches
from adsim.model.matching import CentroidBank
from poolsim import core

LOGIT_SCALE = 100.0


def text_embeddings(backbone: Backbone, prompts: dict) -> torch.Tensor:
    """``T: (2, E)`` unit rows (normal, anomaly): renormalised mean of each ensemble's embeddings."""
    rows = [core.normalize(encode_prompts(backbone, list(prompts[k])).mean(0)) for k in ("normal", "anomaly")]
    return torch.stack(rows)


class Adapter(nn.Module):
    """Residual bottleneck adapter ``W -> E -> W``; returns ``(bottleneck (.., E), output (.., W))``."""

    def __init__(self, width: int, bottleneck: int):
        super().__init__()
        self.down = nn.Linear(width, bottleneck)
        self.up = nn.Linear(bottleneck, width)
        self.act = nn.LeakyReLU()

    def forward(self, x):
        mid = self.act(self.down(x))
        return mid, self.act(self.up(mid))


class VACA(nn.Module):
    """Variance-aware channel attention for one (layer, task)."""

    delta_running: torch.Tensor
    """``(dim,)`` running mean of the per-channel text contrast ``Delta`` (what eval mode uses): a buffer."""
    n_tracked: torch.Tensor
    """``()`` int64, training batches seen so far: a buffer."""

    def __init__(self, dim: int, *, gamma: float = 1.0, hidden: int | None = None, momentum: float = 0.1):
        super().__init__()
        hidden = hidden or max(dim // 4, 8)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, dim))
        self.gamma, self.momentum = gamma, momentum
        self.register_buffer("delta_running", torch.zeros(dim))
        self.register_buffer("n_tracked", torch.zeros((), dtype=torch.long))

    def forward(self, p_norm, text, raw=None):
        """``p_norm: (B, N, E)`` unit tokens, ``text: (2, E)`` -> ``(P~ (B, N, E) unit, Var (), w (E,))``.

        ``raw``: optionally the tokens ``p_norm`` was normalised from. Each row of ``p_norm`` is ``raw``'s
        row times a positive factor, so ``normalize(raw * w)`` is the same ``P~``; computed that way the
        backward pass skips ``p_norm``'s normalisation (one fewer forward + backward over the tokens
        that the loss reaches)."""
        if self.training:
            with torch.no_grad():
                delta = (p_norm.float().mean(dim=(0, 1)) * (text[0] - text[1])).abs()
                # first batch: take Delta as is; then exponential running mean (no host sync)
                m = torch.where(self.n_tracked == 0, 1.0, self.momentum)
                self.delta_running.mul_(1.0 - m).add_(m * delta)
                self.n_tracked += 1
        else:
            delta = self.delta_running
        w = 1.0 + self.gamma * nn.functional.softplus(self.mlp(delta))
        var = torch.var(delta * w, correction=0)
        return core.normalize((p_norm if raw is None else raw) * w), var, w


def _stackable(modules) -> bool:
    """Whether :func:`vaca_stacked` can run ``modules`` as one batched computation: the same ``gamma``,
    ``momentum``, training mode, parameter shapes and buffer dtypes."""
    first = modules[0]

    def layout(m):
        return ([p.shape for p in m.parameters()], m.delta_running.dtype, m.gamma, m.momentum, m.training)
    return all(layout(m) == layout(first) for m in modules[1:])


def vaca_stacked(modules, p_norm, text, raw=None) -> tuple:
    """:class:`VACA` of ``S`` modules as ONE batched computation: ``p_norm: (S, B, N, E)`` unit tokens
    (slot ``s`` for ``modules[s]``), ``text: (2, E)`` -> ``(P~ (S, B, N, E), Var (S,), w (S, E))``.

    The values of ``modules[s](p_norm[s], text, raw[s])`` (to float32 rounding) with the same running
    updates of every module's ``delta_running`` and ``n_tracked``, in a fixed number of operations
    instead of one set per module (each a kernel launch on a GPU): the MLP weights are stacked at call
    time (their gradients flow back to each module's parameters), the MLP is two batched matmuls, and
    the buffers are read as one stack and written back by two ``torch._foreach_*`` calls (one fused
    kernel each on CUDA). Modules that differ in configuration (:func:`_stackable`) run one by one."""
    if not _stackable(modules):
        outs = [m(p_norm[s], text, None if raw is None else raw[s]) for s, m in enumerate(modules)]
        return tuple(torch.stack(t) for t in zip(*outs))
    first = modules[0]
    running = torch.stack([m.delta_running for m in modules])  # (S, E)
    if first.training:
        with torch.no_grad():
            delta = (p_norm.float().mean(dim=(1, 2)) * (text[0] - text[1])).abs()  # (S, E)
            # VACA.forward's update per slot: Delta as is on a module's first batch, then the running mean
            rate = torch.where(torch.stack([m.n_tracked for m in modules]) == 0, 1.0, first.momentum)[:, None]
            running = running * (1.0 - rate) + rate * delta
            torch._foreach_copy_([m.delta_running for m in modules], list(running.unbind(0)))
            torch._foreach_add_([m.n_tracked for m in modules], 1)
    else:
        delta = running
    lin1, lin2 = zip(*((m.mlp[0], m.mlp[2]) for m in modules))

    def linear(layer, x):  # (S, in, 1) -> (S, out, 1): weight @ x, so each weight's gradient has its layout
        bias, weight = (torch.stack([getattr(lin, k) for lin in layer]) for k in ("bias", "weight"))
        return torch.baddbmm(bias[..., None], weight, x)
    a = linear(lin2, torch.relu(linear(lin1, delta[..., None]))).squeeze(-1)  # (S, E)
    w = 1.0 + first.gamma * nn.functional.softplus(a)
    var = torch.var(delta * w, dim=-1, correction=0)
    return core.normalize((p_norm if raw is None else raw) * w[:, None, None, :]), var, w


class Features(NamedTuple):
    """What the adapter head computes for ``B`` images, per adapter layer ``L``: unit features ``(B, N, E)``
    of the segmentation and detection branches, their patch logits ``(B, N)``, the image logits ``(L, B)``,
    VACA's summed variance and the detection features before VACA."""
    seg: list         # L x (B, N, E) unit seg features (after VACA when on)
    det: list         # L x (B, N, E) unit det features
    seg_logits: list  # L x (B, N) patch anomaly logits
    det_logits: list  # L x (B, N)
    image_logits: torch.Tensor  # (L, B) max over patches of det logits
    var: torch.Tensor           # () sum of VACA variances (0 without VACA)
    det_raw: list     # L x (B, N, E) unit det features *before* VACA (the variance analysis)


class Head(nn.Module):
    """Every trainable parameter and every piece of state that a run checkpoints."""

    text: torch.Tensor
    """``(2, E)`` text embeddings (normal, anomalous): a buffer."""

    def __init__(self, width: int, embed_dim: int, text: torch.Tensor, *, n_layers: int = 4,
                 vaca: bool = True, gamma: float = 1.0, matching: bool = True, metric: str = "geodesic",
                 gate_mode: str = "batched", alpha: float = 0.5, update: str = "ema"):
        super().__init__()
        if text.shape != (2, embed_dim):
            raise ValueError(f"text embeddings must have shape (2, {embed_dim}), got {tuple(text.shape)}")
        self.seg_adapters = nn.ModuleList(Adapter(width, embed_dim) for _ in range(n_layers))
        self.det_adapters = nn.ModuleList(Adapter(width, embed_dim) for _ in range(n_layers))
        self.vaca = nn.ModuleList(VACA(embed_dim, gamma=gamma) for _ in range(2 * n_layers)) if vaca else None
        # slots 0..L-1: segmentation (patch features), L..2L-1: detection (image features)
        self.centroids = CentroidBank(2 * n_layers, embed_dim, metric=metric, mode=gate_mode,
                                      alpha=alpha, update=update) if matching else None
        self.register_buffer("text", text.float().clone())
        self.n_layers = n_layers


def features(backbone: Backbone, head: Head, images: torch.Tensor) -> Features:
    """Interleaved forward: frozen blocks, adapters after the adapter blocks, then VACA and scoring.

    ``images: (B, 3, S, S)`` normalised. Raises ``ValueError`` on a wrong image size or on NaN/inf
    features (one host sync per call). Equal to
    ``features_from_bottlenecks(head, *adapter_bottlenecks(backbone, head, trunk_tokens(backbone, images)))``.
    """
    return features_from_bottlenecks(head, *adapter_bottlenecks(backbone, head, trunk_tokens(backbone, images)))


def trunk_tokens(backbone: Backbone, images: torch.Tensor) -> torch.Tensor:
    """``(B, 1 + N, W)``: the tokens entering the first adapter, i.e. the output of the frozen blocks
    ``0 .. spec.adapter_layers[0]``. No adapter acts before them, so they depend on the image only (the
    frozen-trunk cache of ``adsim.training.cache`` stores them)."""
    spec = backbone.spec
    if images.ndim != 4 or images.shape[1] != 3 or tuple(images.shape[2:]) != (spec.image_size,) * 2:
        raise ValueError(f"images must have shape (B, 3, {spec.image_size}, {spec.image_size}), "
                         f"got {tuple(images.shape)}")
    visual = backbone.model.visual
    x = visual._embeds(images)  # (B, 1 + N, W): patch embedding, class token, position, ln_pre
    return run_blocks(backbone, x, visual.transformer.resblocks[: spec.adapter_layers[0] + 1])


def adapter_bottlenecks(backbone: Backbone, head: Head, x: torch.Tensor) -> tuple:
    """From :func:`trunk_tokens` ``x: (B, 1 + N, W)`` on: adapters after each adapter block (the
    residual stream continues as ``0.8 x + 0.1 seg + 0.1 det``) and the later frozen blocks. Returns
    ``(seg_mid, det_mid)``, each ``L x (B, N, E)`` patch-token bottlenecks (input of :func:`features_from_bottlenecks`)."""
    layers = backbone.spec.adapter_layers
    blocks = backbone.model.visual.transformer.resblocks
    seg_mid, det_mid = [], []
    for k, i in enumerate(layers):
        if k:
            x = run_blocks(backbone, x, blocks[layers[k - 1] + 1: i + 1])
        s_mid, s_out = head.seg_adapters[k](x)
        d_mid, d_out = head.det_adapters[k](x)
        x = 0.8 * x + 0.1 * s_out + 0.1 * d_out
        seg_mid.append(s_mid[:, 1:])
        det_mid.append(d_mid[:, 1:])
    return seg_mid, det_mid


def features_from_tokens(head: Head, tokens: torch.Tensor) -> Features:
    """The same head on *precomputed* frozen tokens ``tokens: (B, L, N, W)`` (e.g. the feature-level
    simulator of ``adsim.data.sim``): each layer's adapters act on that layer's tokens. Without a backbone
    there are no later blocks for the residual mix ``0.8 x + 0.1 seg + 0.1 det`` to feed, so that mix
    is dropped; everything after the adapter bottleneck (VACA, scoring, matching, losses) is shared
    with :func:`features`. Raises ``ValueError`` on a wrong shape or NaN/inf features."""
    if tokens.ndim != 4 or tokens.shape[1] != head.n_layers:
        raise ValueError(f"tokens must have shape (B, {head.n_layers}, N, W), got {tuple(tokens.shape)}")
    seg_mid = [head.seg_adapters[k](tokens[:, k])[0] for k in range(head.n_layers)]
    det_mid = [head.det_adapters[k](tokens[:, k])[0] for k in range(head.n_layers)]
    return features_from_bottlenecks(head, seg_mid, det_mid)


def features_from_bottlenecks(head: Head, seg_mid: list, det_mid: list, *, check: bool = True) -> Features:
    """Adapter bottlenecks ``L x (B, N, E)`` -> normalisation, VACA, text scoring (float32).
    All ``2L`` (layer, task) slots run as one stacked ``(2L, B, N, E)`` computation (slots ``0..L-1``
    segmentation, ``L..2L-1`` detection, the order of ``head.vaca``; :func:`vaca_stacked`); the
    returned lists hold views of the stacked results.
    ``check=False`` skips the NaN/inf check (a host sync and, under ``torch.compile``, a graph break):
    the caller then checks :func:`finite` itself (``adsim.training.compiled_step`` does, after the compiled step)."""
    n = head.n_layers
    text = head.text
    direction = text[1] - text[0]
    with torch.autocast(seg_mid[0].device.type, enabled=False):  # scoring and VACA in float32
        x = torch.stack([*seg_mid, *det_mid]).float()  # (2L, B, N, E)
        p = core.normalize(x)
        det_raw = list(p.unbind(0)[n:])
        var = x.new_zeros(())
        if head.vaca is not None:  # P~ from the raw tokens: no gradient through p's normalisation
            p, v, _ = vaca_stacked(list(head.vaca), p, text, raw=x)
            var = v.sum()
        logits = LOGIT_SCALE * p @ direction  # (2L, B, N)
        image_logits = logits[n:].amax(dim=2)
    p, logits = p.unbind(0), logits.unbind(0)
    feats = Features(list(p[:n]), list(p[n:]), list(logits[:n]), list(logits[n:]), image_logits, var, det_raw)
    if check:
        check_finite(finite(feats))
    return feats


def finite(feats: Features) -> torch.Tensor:
    """``()`` bool tensor: every patch and image logit is finite (no host sync)."""
    return torch.isfinite(feats.image_logits).all() & torch.isfinite(torch.stack(feats.seg_logits)).all()


_NOT_FINITE = "NaN or inf in the token features (check the input images and the checkpoint)"


class DeferredFiniteChecks:
    """The flags :func:`check_finite` received inside :func:`deferred_finite_checks`, combined on the
    device (no host sync) until :meth:`check` reads them."""

    def __init__(self):
        self.flag = None

    def add(self, flag: torch.Tensor) -> None:
        self.flag = flag if self.flag is None else self.flag & flag

    def check(self) -> None:
        """Raise ``ValueError`` unless every flag so far was true (one host sync; none when no flag)."""
        flag, self.flag = self.flag, None
        if flag is not None and not bool(flag):
            raise ValueError("NaN or inf in a training step's token features or loss (check the input images "
                             "and the checkpoint)")


_DEFERRED: list = []  # the open deferred_finite_checks() scopes, innermost last


@contextmanager
def deferred_finite_checks():
    """Context manager: inside it :func:`check_finite` only records its flag (on the device) in the
    :class:`DeferredFiniteChecks` it yields; the flags are read on ``pending.check()`` and when the
    scope ends without an exception. The training loop checks once per epoch (and at each
    progress-bar update) instead of once per step: a host read per step would stall a GPU's queue."""
    pending = DeferredFiniteChecks()
    _DEFERRED.append(pending)
    try:
        yield pending
    finally:
        _DEFERRED.remove(pending)
    pending.check()


def check_finite(flag: torch.Tensor) -> None:
    """Raise ``ValueError`` unless :func:`finite`'s ``flag`` is true (one host sync); inside
    :func:`deferred_finite_checks`, record ``flag`` there instead (no sync)."""
    if _DEFERRED:
        _DEFERRED[-1].add(flag)
        return
    if not bool(flag):
        raise ValueError(_NOT_FINITE)


def check_score(score: str) -> str:
    if score not in SCORES:
        raise ValueError(f"score must be one of {SCORES}, got {score!r}")
    return score


def anomaly_maps(feats: Features, grid: int, size: int, score: str = DEFAULT_SCORE) -> torch.Tensor:
    """``(B, size, size)`` pixel anomaly map on the patch grid, bilinearly upsampled: the layer mean of
    the patch logits ``z_seg`` (``score="logit_*"``; unbounded, never saturates) or, for
    ``"authors_prob_mean"``, the layer mean of ``sigmoid`` of the upsampled logits (in [0, 1])."""
    z = torch.stack(feats.seg_logits).float()  # (L, B, N)
    if check_score(score) == "authors_prob_mean":
        return torch.sigmoid(upsample_patches(z, grid, size, align_corners=True)).mean(0)
    return upsample_patches(z.mean(0), grid, size)


def image_scores(feats: Features, score: str = DEFAULT_SCORE) -> torch.Tensor:
    """``(B,)`` image anomaly score (see :data:`SCORES` and the module docstring): layer mean of the max
    (``"logit_max"``) or mean (``"logit_mean"``) patch logit, or the authors' layer mean of the patch
    mean of probabilities (``"authors_prob_mean"``, saturates: ties once logits exceed ~17)."""
    z = torch.stack(feats.det_logits).float()  # (L, B, N)
    check_score(score)
    if score == "logit_max":
        return z.amax(dim=2).mean(0)
    if score == "logit_mean":
        return z.mean(dim=2).mean(0)
    return torch.sigmoid(z).mean(dim=2).mean(0)


def make_head(cfg: TrainConfig, width: int, embed_dim: int, text, n_layers: int = 4) -> Head:
    """The head a config asks for: ``width`` = token dimension, ``embed_dim`` = text dimension.
    ``adapter_bias=False`` removes the adapters' biases (the authors' ``bias=False``, CLIP/adapter.py:22,26);
    ``gate_tau="fixed"`` gives the centroid gate the fixed radius ``tau``."""
    head = Head(width, embed_dim, text, n_layers=n_layers, vaca=cfg.vaca, gamma=cfg.gamma,
                matching=cfg.method == "match", metric=cfg.metric, gate_mode=cfg.gate_mode,
                alpha=cfg.alpha, update=cfg.update)
    if not cfg.adapter_bias:
        for ad in (*head.seg_adapters, *head.det_adapters):
            for lin in (ad.down, ad.up):
                lin.register_parameter("bias", None)
    if head.centroids is not None:
        head.centroids.tau = float(cfg.tau) if cfg.gate_tau == "fixed" else None
    return head
