"""Evaluation: image-level AUC (AC) and, for Brain/Liver/Retina_RESC, pixel-level AUC (AS), in percent.

``evaluate(run, data)`` rebuilds the run's backbone (and checks its weight fingerprint), loads the
head from the run's checkpoint, scores the target's ``test`` split and writes ``RUN/metrics.json``
atomically. Scores and pixel maps are logits by default (``score="logit_max"``; probabilities
saturate and tie, see ``adsim.head``); ``score="authors_prob_mean"`` reproduces the released code's
scoring. A run config's ``scoring`` field (its recipe) sets it; an explicit ``scoring=`` overrides.
Image metrics (AUC, AP, F1-max) come from sklearn on all scores; pixel metrics (AUC, AP, F1-max,
AUPRO to FPR 0.3) from ``adsim.metrics.Accumulator``'s histograms, within the ``pixel_error_bounds``
it writes of the exact values (``pixel_auc`` was sklearn on all pixels before issue 13); pixel maps
may be Gaussian-smoothed (``scipy.ndimage.gaussian_filter``, sigma in pixels; 0 = off).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from scipy.ndimage import gaussian_filter
from sklearn.metrics import roc_auc_score
from tqdm.auto import tqdm

from . import data as D
from . import distributed as DD
from ._io import autocast_dtype, load_torch, read_json, resolve_device, write_json
from .backbone import build_backbone, fingerprint
from .head import DEFAULT_SCORE, anomaly_maps, check_score, features, image_scores, text_embeddings
from .metrics import summarize

CHECKPOINTS = ("auto", "last", "best")


@torch.no_grad()
def score(backbone, head, samples, *, clip_norm: bool, device, precision: str = "auto", batch_size: int = 16,
          maps: bool = False, progress: bool = False, desc: str = "scoring", scoring: str = DEFAULT_SCORE) -> dict:
    """``{"scores": (n,), "labels": (n,), "maps": (n, S, S) or None, "masks": ...}`` as NumPy.
    Under torchrun each rank scores ``samples[rank::size]`` and every rank gets all ``n`` results."""
    spec = backbone.spec
    part = DD.shard(samples)  # [distributed] all samples with one process
    loader = torch.utils.data.DataLoader(D.ImageDataset(part, spec.image_size, clip_norm=clip_norm),
                                         batch_size=batch_size, shuffle=False)
    out = score_batches(head, loader, lambda x: features(backbone, head, x), grid=spec.grid,
                        size=spec.image_size, device=device, amp=autocast_dtype(precision, device),
                        maps=maps, progress=progress and DD.is_main(), desc=desc, scoring=scoring) if part else None
    return DD.gather_arrays(out, len(samples))


@torch.no_grad()
def score_batches(head, batches, forward, *, grid: int, size: int, device, amp=None, maps: bool = False,
                  progress: bool = False, desc: str = "scoring", scoring: str = DEFAULT_SCORE) -> dict:
    """Score an iterable of batch dicts (``image``, ``label``, ``mask``) with ``forward(x) -> Features``
    (image path or token path); the head is put in evaluation mode. ``scoring``: one of
    ``adsim.head.SCORES``. Output as :func:`score`."""
    check_score(scoring)
    head.eval()
    scores, labels, all_maps, masks = [], [], [], []
    for batch in tqdm(batches, desc=desc, disable=not progress, leave=False):
        x = batch["image"].to(device)
        with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
            feats = forward(x)
        scores.append(image_scores(feats, scoring).cpu().numpy())
        labels.append(batch["label"].numpy())
        if maps:
            all_maps.append(anomaly_maps(feats, grid, size, scoring).cpu().numpy())
            masks.append(batch["mask"].numpy().astype(bool))
    return {"scores": np.concatenate(scores), "labels": np.concatenate(labels),
            "maps": np.concatenate(all_maps) if maps else None, "masks": np.concatenate(masks) if maps else None}


def auc_percent(labels, scores) -> float:
    labels = np.asarray(labels).ravel()
    if len(np.unique(labels)) < 2:
        raise ValueError("AUC undefined: the labels contain one class only")
    return 100.0 * float(roc_auc_score(labels, np.asarray(scores).ravel()))


def smooth(maps: np.ndarray, sigma: float) -> np.ndarray:
    if sigma < 0 or not math.isfinite(sigma):
        raise ValueError(f"smoothing sigma must be a finite number >= 0, got {sigma!r}")
    if sigma == 0:
        return maps
    return np.stack([gaussian_filter(m, sigma=sigma) for m in maps])


def selection_score(backbone, head, samples, cfg, device) -> float:
    """Model-selection criterion: mean over domains of the image AUC (plus pixel AUC where masks
    exist, averaged). With ``select="heldout"`` the samples are held-out *training-domain* data."""
    was_training = head.training
    values = []
    for domain in sorted({s.domain for s in samples}):
        sub = [s for s in samples if s.domain == domain]
        if len({s.label for s in sub}) < 2:
            continue
        has_masks = domain in D.MASKED
        out = score(backbone, head, sub, clip_norm=cfg.clip_norm, device=device, precision=cfg.precision,
                    batch_size=cfg.batch_size, maps=has_masks, scoring=run_score(cfg))
        values.append(auc_percent(out["labels"], out["scores"]))
        if has_masks and out["masks"].any():
            values.append(auc_percent(out["masks"], out["maps"]))
    head.train(was_training)
    if not values:
        raise ValueError("selection set has no domain with both normal and anomalous images")
    return float(np.mean(values))


def run_score(cfg, override: str | None = None) -> str:
    """The scoring of a run: ``override``, else the config's ``scoring`` field (its recipe), else the default."""
    return check_score(override or getattr(cfg, "scoring", None) or DEFAULT_SCORE)


def load_run(run, *, checkpoint: str = "auto", device: str = "auto"):
    """Rebuild ``(cfg, backbone, head, checkpoint_info, device)`` of a run folder."""
    from .train import TrainConfig, make_head

    run = Path(run)
    if not (run / "config.json").is_file():
        raise ValueError(f"{run} is not a run folder (no config.json)")
    record = read_json(run / "config.json")
    cfg = TrainConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in record["config"].items()})
    if checkpoint not in CHECKPOINTS:
        raise ValueError(f"checkpoint must be one of {CHECKPOINTS}, got {checkpoint!r}")
    if checkpoint == "auto":
        checkpoint = "best" if cfg.select != "last" else "last"
    path = run / f"checkpoint_{checkpoint}.pt"
    if not path.is_file():
        raise ValueError(f"missing checkpoint {path}")
    dev = resolve_device(device)
    backbone = build_backbone(cfg.backbone, image_size=cfg.image_size, checkpoint=cfg.checkpoint,
                              quick_gelu=cfg.quick_gelu, seed=cfg.seed, device=dev)
    fp = fingerprint(backbone.model)
    if not math.isclose(fp, record["backbone_fingerprint"], rel_tol=1e-9, abs_tol=1e-6):
        raise ValueError(f"backbone weights differ from the run's (fingerprint {fp} vs "
                         f"{record['backbone_fingerprint']}): wrong --checkpoint or a changed file")
    head = make_head(cfg, backbone.spec.width, backbone.spec.embed_dim,
                     text_embeddings(backbone, record["prompts"])).to(dev)
    ckpt = load_torch(path, map_location=dev)
    try:
        head.load_state_dict(ckpt["head"])
    except (RuntimeError, KeyError) as err:
        raise ValueError(f"checkpoint {path} does not fit this run's head: {err}") from err
    return cfg, backbone, head, {"file": path.name, "epoch": int(ckpt["epoch"])}, dev


def evaluate(run, data, target: str | None = None, *, checkpoint: str = "auto", smooth_sigma: float = 4.0,
             batch_size: int = 16, device: str = "auto", progress: bool = True, scoring: str | None = None) -> dict:
    """Score the target's test split and write ``RUN/metrics.json``; returns the metrics dict.
    ``scoring``: one of ``adsim.head.SCORES`` (default: the run's, else ``"logit_max"``)."""
    cfg, backbone, head, info, dev = load_run(run, checkpoint=checkpoint, device=device)
    scoring = run_score(cfg, scoring)
    target = D.canonical_domain(target or cfg.target)
    if target in cfg.train_domains:
        raise ValueError(f"{target} was a training domain of this run: not a zero-shot evaluation")
    samples = D.list_split(data, target, "test")
    D.require_both_classes(samples, f"{target} test split")
    has_masks = target in D.MASKED
    out = score(backbone, head, samples, clip_norm=cfg.clip_norm, device=dev, precision=cfg.precision,
                batch_size=batch_size, maps=has_masks, progress=progress, desc=f"eval {target}", scoring=scoring)
    metrics = {"target": target, "n_images": int(len(samples)), "n_anomalous": int(out["labels"].sum()),
               "checkpoint": info, "select": cfg.select, "method": cfg.method, "metric": cfg.metric,
               "vaca": cfg.vaca, "gate_mode": cfg.gate_mode, "backbone": cfg.backbone, "seed": cfg.seed,
               "train_domains": list(cfg.train_domains), "pretrained": backbone.spec.pretrained,
               "auc_unit": "percent", "zero_shot": cfg.select != "test", "scoring": scoring}
    if has_masks and not out["masks"].any():
        raise ValueError(f"{target} test masks contain no anomalous pixel: pixel AUC undefined")
    metrics.update(summarize(out, smooth_sigma))  # image_auc/ap/f1max (+ pixel_auc/ap/f1max, aupro)
    if cfg.select == "test":
        metrics["warning"] = ("checkpoint selected on the target's test set (authors' protocol): "
                              "optimistic, NOT a zero-shot result")
    if not backbone.spec.pretrained:
        metrics["warning_weights"] = "random backbone weights: AUCs are meaningless (test/timing run)"
    if DD.is_main():
        write_json(Path(run) / "metrics.json", metrics)
    DD.barrier()
    return metrics
