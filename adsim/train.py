"""Zero-shot training: adapters (+ VACA, + geodesic matching) on every BMAD domain except the target.

The target's data is never read unless ``select="test"`` (the authors' protocol, clearly labelled as
optimistic in every output). Default: fixed number of epochs, last checkpoint. One backward pass per
step; autocast (bf16 on GPU, none on CPU; fp16 only with a GradScaler); gradient clipping; a checkpoint
after every epoch, written atomically, so a killed run resumes at the first unfinished epoch.
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import NamedTuple

import numpy as np
import open_clip
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from poolsim import _core

from . import data as D
from . import losses as L
from ._io import autocast_dtype, read_json, resolve_device, save_torch, write_json
from .backbone import build_backbone, fingerprint
from .head import Head, features, prompt_ensemble, text_embeddings

METHODS = ("naive", "match")
SELECTIONS = ("last", "heldout", "test")


class TrainConfig(NamedTuple):
    data: str
    target: str
    out: str
    train_domains: tuple | None = None  # None: every domain except the target
    train_splits: tuple = ("valid", "test")  # of the *training* domains
    backbone: str = "ViT-L-14-336"
    checkpoint: str | None = None
    image_size: int | None = None
    quick_gelu: bool = True
    clip_norm: bool = True
    epochs: int = 10
    batch_size: int = 16
    lr: float = 1e-4
    betas: tuple = (0.5, 0.999)
    grad_clip: float = 1.0
    method: str = "match"      # naive = MVFA-like pooling baseline (no centroids, no L_geo)
    metric: str = "geodesic"   # matching metric M of the gate
    gate_mode: str = "batched"
    update: str = "ema"
    alpha: float = 0.5
    vaca: bool = True
    gamma: float = 1.0
    beta_dice: float = 1.0
    beta_focal: float = 1.0
    beta_bce: float = 1.0
    lambda_intra: float = 1.0
    lambda_inter: float = 0.1
    lambda_var: float = 0.1
    select: str = "last"
    holdout_frac: float = 0.2
    seed: int = 0
    device: str = "auto"
    precision: str = "auto"
    num_workers: int = 0


def validate(cfg: TrainConfig) -> TrainConfig:
    """Canonical domain names and every choice checked; returns the normalised config."""
    target = D.canonical_domain(cfg.target)
    domains = tuple(D.canonical_domain(d) for d in (cfg.train_domains or [d for d in D.DOMAINS if d != target]))
    if target in domains:
        raise ValueError(f"zero-shot: the target {target} must not be a training domain ({domains})")
    if not domains or len(set(domains)) != len(domains):
        raise ValueError(f"train_domains must be distinct and non-empty, got {domains}")
    for name, value, allowed in (("method", cfg.method, METHODS), ("metric", cfg.metric, _core.METRICS),
                                 ("select", cfg.select, SELECTIONS)):
        if value not in allowed:
            raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
    for s in cfg.train_splits:
        if s not in D.SPLITS:
            raise ValueError(f"train_splits must be drawn from {D.SPLITS}, got {s!r}")
    for name in ("epochs", "batch_size"):
        if not isinstance(getattr(cfg, name), int) or getattr(cfg, name) < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {getattr(cfg, name)!r}")
    if not cfg.lr > 0 or not cfg.grad_clip > 0:
        raise ValueError(f"lr and grad_clip must be > 0, got {cfg.lr!r}, {cfg.grad_clip!r}")
    return cfg._replace(target=target, train_domains=domains, train_splits=tuple(cfg.train_splits),
                        betas=tuple(cfg.betas))


def make_head(cfg: TrainConfig, width: int, embed_dim: int, text, n_layers: int = 4) -> Head:
    """The head a config asks for: ``width`` = token dimension, ``embed_dim`` = text dimension."""
    return Head(width, embed_dim, text, n_layers=n_layers, vaca=cfg.vaca, gamma=cfg.gamma,
                matching=cfg.method == "match", metric=cfg.metric, gate_mode=cfg.gate_mode,
                alpha=cfg.alpha, update=cfg.update)


def make_optimizer(cfg: TrainConfig, head: Head) -> torch.optim.Optimizer:
    """Adam with the reference betas ``(0.5, 0.999)`` on every trainable head parameter."""
    return torch.optim.Adam(head.parameters(), lr=cfg.lr, betas=cfg.betas)


def objective(cfg: TrainConfig, head: Head, feats, batch, grid: int) -> tuple:
    """``L_total = b1 Dice + b2 Focal + b3 BCE + l1 L_intra + l2 L_inter + l_var Var`` (means over
    layers). Updates the centroids (training mode). Returns ``(loss, {name: detached value})``."""
    labels, masks, has_mask = batch["label"], batch["mask"], batch["has_mask"]
    size = masks.shape[-1]
    n_layers = head.n_layers
    parts = dict.fromkeys(("intra", "inter"), 0.0)
    # all layers at once: (L*B, S, S) logits against the masks repeated per layer (= mean over layers)
    z = F.interpolate(torch.stack(feats.seg_logits).reshape(-1, 1, grid, grid), size=(size, size),
                      mode="bilinear", align_corners=False)[:, 0]
    masks_l, valid_l = masks.repeat(n_layers, 1, 1), has_mask.repeat(n_layers)
    parts["dice"] = L.dice_loss(torch.sigmoid(z), masks_l, valid_l)
    parts["focal"] = L.focal_loss(z, masks_l, valid_l)
    parts["bce"] = L.bce_loss(feats.image_logits.flatten(), labels.repeat(n_layers))
    if head.centroids is not None:
        parts["intra"], parts["inter"] = matching_losses(head, feats, batch, grid)
    parts["var"] = feats.var
    loss = (cfg.beta_dice * parts["dice"] + cfg.beta_focal * parts["focal"] + cfg.beta_bce * parts["bce"]
            + cfg.lambda_intra * parts["intra"] + cfg.lambda_inter * parts["inter"]
            + cfg.lambda_var * parts["var"])
    return loss, {k: torch.as_tensor(v).detach().float() for k, v in parts.items()}


def matching_losses(head: Head, feats, batch, grid: int) -> tuple:
    """``(L_intra, L_inter)`` of the centroid matching (means over layers and the two tasks); updates
    the centroids (training mode). Patch labels come from the mask pooled to the patch grid: normal if
    no lesion pixel, anomalous if at least half lesion, unknown (not matched) in between or without a
    mask."""
    labels, masks, has_mask = batch["label"], batch["mask"], batch["has_mask"]
    n_layers = head.n_layers
    intra, ms = 0.0, []
    frac = F.adaptive_avg_pool2d(masks[:, None], grid).flatten(1)
    y_patch = (frac >= 0.5).float().flatten()
    v_patch = (has_mask[:, None] * ((frac == 0) | (frac >= 0.5)).float()).flatten()
    f_seg = torch.stack([s.flatten(0, 1) for s in feats.seg])  # (L, B*N, E) patch features
    f_img = _core.normalize(torch.stack([d.mean(dim=1) for d in feats.det]))  # (L, B, E) image features
    for start, f, y, v in ((0, f_seg, y_patch, v_patch), (n_layers, f_img, labels, torch.ones_like(labels))):
        m = head.centroids.step(start, f, y, v, unit=True)  # seg: unit from _score; img: normalised above
        acc, cents = torch.stack([m.acc_pos, m.acc_neg], dim=-2), torch.stack([m.c_pos, m.c_neg], dim=-2)
        intra += L.geodesic_intra(f, acc, cents, unit=True).sum() / (2 * n_layers)  # both centroids, one pass
        ms.append(m)
    c_pos, c_neg, both = (torch.cat(t) for t in zip(*((m.c_pos, m.c_neg, m.init_pos * m.init_neg) for m in ms)))
    inter = L.geodesic_inter(c_pos, c_neg, both).sum() / (2 * n_layers)  # all 2L slots at once
    return intra, inter


def train_epoch(cfg: TrainConfig, head: Head, opt, scaler, batches, forward, grid: int, device, amp, *,
                desc: str = "epoch", progress: bool = False) -> dict:
    """One pass over ``batches`` (dicts with ``image``, ``mask``, ``has_mask``, ``label``): forward,
    :func:`objective`, one backward pass, gradient clipping, optimizer step. ``forward(x) -> Features``
    is the image path (:func:`adsim.head.features`) or the token path (``features_from_tokens``).
    Returns ``{"steps": n, loss name: mean over steps}``."""
    head.train()
    sums, steps = {}, 0
    bar = tqdm(batches, desc=desc, disable=not progress, leave=False)
    for batch in bar:
        batch = _batch_to(batch, device)
        with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
            feats = forward(batch["image"])
        loss, parts = objective(cfg, head, feats, batch, grid)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()  # the single backward pass of the step
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(head.parameters(), cfg.grad_clip)
        scaler.step(opt)
        scaler.update()
        parts["loss"] = loss.detach()
        for k, v in parts.items():
            sums[k] = sums.get(k, 0.0) + v
        steps += 1
        if progress and steps % 10 == 1:  # a host sync, so not every step
            bar.set_postfix(loss=f"{float(loss.detach()):.4f}")
    return {"steps": steps, **{k: float(v) / max(steps, 1) for k, v in sums.items()}}


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _config_record(cfg: TrainConfig, backbone, prompts) -> dict:
    return {"config": cfg._asdict(), "backbone_spec": backbone.spec._asdict(),
            "backbone_fingerprint": fingerprint(backbone.model), "prompts": prompts,
            "versions": {"torch": torch.__version__, "open_clip": open_clip.__version__},
            "protocol": ("AUTHORS' PROTOCOL: checkpoint selected on the TARGET's test set -- optimistic, "
                         "not zero-shot") if cfg.select == "test" else "zero-shot: target never used"}


def _batch_to(batch, device):
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def train(cfg: TrainConfig, *, resume: bool = False, progress: bool = True) -> Path:
    """Train and checkpoint under ``cfg.out``; returns the run folder."""
    from .evaluate import selection_score  # evaluate imports train's helpers

    cfg = validate(cfg)
    out = Path(cfg.out)
    last = out / "checkpoint_last.pt"
    if last.exists() and not resume:
        raise ValueError(f"{out} already holds a run; pass --resume to continue it or choose another --out")
    if resume:
        if not last.exists():
            raise ValueError(f"--resume: no checkpoint {last}")
        saved = read_json(out / "config.json")["config"]
        now = _jsonable(cfg._asdict())
        diff = sorted(k for k in now if k != "epochs" and now[k] != saved.get(k))
        if diff:
            raise ValueError(f"--resume with a different configuration ({diff}); only --epochs may change")
    _seed_everything(cfg.seed)
    device = resolve_device(cfg.device)
    amp = autocast_dtype(cfg.precision, device)
    backbone = build_backbone(cfg.backbone, image_size=cfg.image_size, checkpoint=cfg.checkpoint,
                              quick_gelu=cfg.quick_gelu, seed=cfg.seed, device=device)
    spec = backbone.spec
    prompts = prompt_ensemble()
    head = make_head(cfg, spec.width, spec.embed_dim, text_embeddings(backbone, prompts)).to(device)
    opt = make_optimizer(cfg, head)
    scaler = torch.amp.GradScaler(device.type, enabled=amp is torch.float16)

    samples = [s for d in cfg.train_domains for sp in cfg.train_splits for s in D.list_split(cfg.data, d, sp)]
    selection = []
    if cfg.select == "heldout":
        samples, selection = D.holdout(samples, cfg.holdout_frac, cfg.seed)
    elif cfg.select == "test":
        selection = D.list_split(cfg.data, cfg.target, "test")
    if selection:
        D.require_both_classes(selection, f"selection set ({cfg.select})")
    record = _jsonable(_config_record(cfg, backbone, prompts))
    record["n_train_images"] = len(samples)
    write_json(out / "config.json", record)

    start, history, best = 0, [], None
    if resume:
        ckpt = torch.load(last, map_location=device, weights_only=False)
        head.load_state_dict(ckpt["head"])
        opt.load_state_dict(ckpt["optimizer"])
        scaler.load_state_dict(ckpt["scaler"])
        start, history, best = ckpt["epoch"] + 1, ckpt["history"], ckpt["best"]
    dataset = D.ImageDataset(samples, spec.image_size, clip_norm=cfg.clip_norm)
    for epoch in range(start, cfg.epochs):
        # shuffling depends only on (seed, epoch): a resumed run sees the same order
        gen = torch.Generator().manual_seed(cfg.seed * 100_003 + epoch)
        loader = torch.utils.data.DataLoader(dataset, batch_size=cfg.batch_size, shuffle=True, generator=gen,
                                             num_workers=cfg.num_workers, pin_memory=device.type == "cuda")
        entry = {"epoch": epoch, **train_epoch(cfg, head, opt, scaler, loader,
                                                lambda x: features(backbone, head, x), spec.grid, device, amp,
                                                desc=f"epoch {epoch + 1}/{cfg.epochs}", progress=progress)}
        if selection:
            entry["selection_score"] = selection_score(backbone, head, selection, cfg, device)
            if best is None or entry["selection_score"] > best["score"]:
                best = {"epoch": epoch, "score": entry["selection_score"]}
                save_torch(out / "checkpoint_best.pt", {"epoch": epoch, "head": head.state_dict()})
        history.append(entry)
        save_torch(last, {"epoch": epoch, "head": head.state_dict(), "optimizer": opt.state_dict(),
                          "scaler": scaler.state_dict(), "history": history, "best": best})
        write_json(out / "history.json", {"history": history, "best": best, "select": cfg.select})
    return out


def _jsonable(obj):
    """Tuples -> lists recursively, so a config compares equal to its JSON round trip."""
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return obj
