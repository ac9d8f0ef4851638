"""Evaluation: image-level AUC (AC) and, for Brain/Liver/Retina_RESC, pixel-level AUC (AS), in percent.

``evaluate(run, data)`` rebuilds the run's backbone (and checks its weight fingerprint), loads the
head from the run's checkpoint, scores the target's ``test`` split and writes ``RUN/metrics.json``
atomically. Scores and pixel maps are logits by default (``score="logit_max"``; probabilities
saturate and tie, see ``adsim.model.head``); ``score="authors_prob_mean"`` reproduces the released code's
scoring. A run config's ``scoring`` field (its recipe) sets it; an explicit ``scoring=`` overrides.
Image metrics (AUC, AP, F1-max) come from sklearn on all scores; pixel metrics (AUC, AP, F1-max,
AUPRO to FPR 0.3) from ``adsim.metrics.Accumulator``'s histograms, within the ``pixel_error_bounds``
it writes of the exact values; pixel maps
may be Gaussian-smoothed (``scipy.ndimage.gaussian_filter``, sigma in pixels; 0 = off).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from adsim.data import bmad
from adsim.data.domains import MASKED, canonical_domain
from adsim.inference.detector import Detector
from adsim.inference.overlays import write_overlay
from adsim.methods.fewshot import for_target
from adsim.metrics.accumulator import accumulate, entries
from adsim.metrics.functional import check_sigma
from adsim.runtime import distributed
from adsim.runtime.io import write_json


def split_metrics(detector, samples, *, batch_size: int, pixel: bool, progress: bool, desc: str,
                  smooth_sigma: float) -> tuple:
    """``(metrics.json entries, image scores (n,))`` of ``samples`` (``adsim.metrics``). Each batch goes
    into an ``Accumulator`` as it is scored, so no map of the whole split is held; under torchrun each
    rank streams its shard and the ranks' accumulators are merged (histograms of a fixed size)."""
    part = distributed.shard(samples)  # [distributed] all samples with one process
    batches = ({"scores": o.scores, "labels": batch["label"].numpy(), "maps": o.maps,
                "masks": batch["mask"].numpy().astype(bool) if pixel else None}
               for o, batch in detector.score_samples(part, batch_size=batch_size, maps=pixel,
                                                      progress=progress and distributed.is_main(), desc=desc))
    acc = accumulate(batches if part else (), smooth_sigma, pixel=pixel)
    scores = distributed.gather_arrays({"scores": acc.scores} if part else None, len(samples))["scores"]
    if distributed.world().size > 1:
        shards = distributed.gather_objects(acc)
        acc = shards[0]
        for other in shards[1:]:
            acc.merge(other)
    return entries(acc.compute(), smooth_sigma), scores


def evaluate(run, data, target: str | None = None, *, checkpoint: str = "auto", smooth_sigma: float = 4.0,
             batch_size: int = 16, device: str = "auto", progress: bool = True, scoring: str | None = None,
             overlays: int = 0, shots: int = 0, shot_seed: int = 0) -> dict:
    """Score the target's test split and write ``RUN/metrics.json``; returns the metrics dict.
    ``scoring``: one of ``adsim.model.head.SCORES`` (default: the run's, else ``"logit_max"``).
    ``overlays=N``: also write the ``N`` most and the ``N`` least anomalous test images' heatmaps
    (ground-truth contour where a mask exists) to ``RUN/overlays/`` (``adsim.inference.overlays``).
    ``shots=k``: few-shot mode (``adsim.methods.fewshot.for_target``: k normal images of the target's valid split,
    drawn with ``shot_seed``, in a memory bank; never scored; recorded in metrics.json)."""
    _check_options(smooth_sigma, overlays)
    detector = Detector.from_run(run, checkpoint=checkpoint, device=device, scoring=scoring)
    cfg, spec = detector.info["config"], detector.info["backbone"]
    target = canonical_domain(target or cfg.target)
    if target in cfg.train_domains:
        raise ValueError(f"{target} was a training domain of this run: not a zero-shot evaluation")
    record = {"checkpoint": detector.info["checkpoint"], "select": cfg.select, "method": cfg.method,
              "metric": cfg.metric, "vaca": cfg.vaca, "gate_mode": cfg.gate_mode, "backbone": cfg.backbone,
              "seed": cfg.seed, "train_domains": list(cfg.train_domains), "pretrained": spec.pretrained,
              "zero_shot": cfg.select != "test", "scoring": cfg.scoring}
    if cfg.select == "test":
        record["warning"] = ("checkpoint selected on the target's test set (authors' protocol): "
                             "optimistic, NOT a zero-shot result")
    return _evaluate_target(detector, data, target, Path(run), record, smooth_sigma=smooth_sigma,
                            batch_size=batch_size, progress=progress, overlays=overlays, shots=shots,
                            shot_seed=shot_seed)


def evaluate_zero_shot(method: str, data, target: str, out, *, backbone: str = "ViT-L-14-336",
                       checkpoint: str | None = None, image_size: int | None = None, smooth_sigma: float = 4.0,
                       batch_size: int = 16, device: str = "auto", progress: bool = True, overlays: int = 0,
                       shots: int = 0, shot_seed: int = 0, seed: int = 0, random_weights: bool = False) -> dict:
    """:func:`evaluate` for a training-free method of ``adsim.methods.catalog`` (``Detector.zero_shot``
    on ``backbone`` with local ``checkpoint`` weights, or random ones with ``random_weights=True`` as
    there): the same metrics, shots and overlays, written to ``OUT/metrics.json`` (and ``OUT/overlays/``)."""
    _check_options(smooth_sigma, overlays)
    detector = Detector.zero_shot(method, backbone=backbone, checkpoint=checkpoint, image_size=image_size,
                                  device=device, seed=seed, random_weights=random_weights)
    spec = detector.info["backbone"]
    record = {"method": method, "zero_shot_method": method, "backbone": backbone, "checkpoint": checkpoint,
              "image_size": spec.image_size, "seed": seed, "pretrained": spec.pretrained, "zero_shot": True}
    return _evaluate_target(detector, data, canonical_domain(target), Path(out), record, smooth_sigma=smooth_sigma,
                            batch_size=batch_size, progress=progress, overlays=overlays, shots=shots,
                            shot_seed=shot_seed)


def _check_options(smooth_sigma, overlays) -> None:
    check_sigma(smooth_sigma)
    if not isinstance(overlays, int) or isinstance(overlays, bool) or overlays < 0:
        raise ValueError(f"overlays must be an integer >= 0, got {overlays!r}")


def _evaluate_target(detector, data, target: str, out: Path, record: dict, *, smooth_sigma: float,
                     batch_size: int, progress: bool, overlays: int, shots: int, shot_seed: int) -> dict:
    """Score ``target``'s test split with ``detector``; ``OUT/metrics.json`` = ``record`` + the metrics."""
    samples, shot_record = bmad.list_split(data, target, "test"), {"shots": 0}
    if shots:
        detector, samples, shot_record = for_target(detector, data, target, shots, seed=shot_seed,
                                                    batch_size=batch_size)
    bmad.require_both_classes(samples, f"{target} test split")
    has_masks = target in MASKED
    scored, image_scores_ = split_metrics(detector, samples, batch_size=batch_size, pixel=has_masks,
                                          progress=progress, desc=f"eval {target}", smooth_sigma=smooth_sigma)
    metrics = {"target": target, "n_images": len(samples), "n_anomalous": int(sum(s.label for s in samples)),
               **record, "auc_unit": "percent", "simulated_data": bmad.simulated(data), **scored, **shot_record}
    if not record["pretrained"]:
        metrics["warning_weights"] = "random backbone weights: AUCs are meaningless (test/timing run)"
    if distributed.is_main():
        write_json(out / "metrics.json", metrics)
        if overlays:
            write_extremes(detector, samples, image_scores_, overlays, out / "overlays", batch_size=batch_size)
    distributed.barrier()
    return metrics


def write_extremes(detector, samples: list, scores: np.ndarray, n: int, folder, *, batch_size: int = 16) -> list:
    """Overlays of the ``n`` most and the ``n`` least anomalous ``samples`` by ``scores`` (``(len(samples),)``,
    e.g. from :func:`score`), re-scored by ``detector`` (only these ``<= 2 n`` images, so no map of the
    whole split is kept): ``most_01_<stem>.png`` ... and ``least_01_<stem>.png`` ... in ``folder``.
    Returns the paths written."""
    order = np.argsort(np.asarray(scores), kind="stable")
    picks = [(f"most_{r + 1:02d}", int(i)) for r, i in enumerate(order[::-1][:n])]
    picks += [(f"least_{r + 1:02d}", int(i)) for r, i in enumerate(order[:n])]
    chosen = [samples[i] for _, i in picks]
    written, k = [], 0
    for o, batch in detector.score_samples(chosen, batch_size=batch_size, desc="overlays"):
        rgb = bmad.unnormalise(batch["image"], clip_norm=detector.method.clip_norm).permute(0, 2, 3, 1).numpy()
        for j in range(len(o.scores)):
            tag, s = picks[k][0], chosen[k]
            mask = batch["mask"][j].numpy() > 0.5 if s.mask is not None else None
            label = "anomalous" if s.label else "normal"
            written.append(write_overlay(Path(folder) / f"{tag}_{s.image.stem}.png", rgb[j], o.maps[j], mask,
                                         score=float(o.scores[j]), title=f"{tag.replace('_', ' ')}: {label}"))
            k += 1
    return written
