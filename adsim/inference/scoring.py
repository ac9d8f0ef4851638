"""Scoring batches: a detector (or a head with a forward function) over a list of labelled samples.

:func:`score` streams ``adsim.data.Sample`` s through a :class:`~adsim.inference.detector.Detector`
(sharded over torchrun ranks, gathered on every rank); :func:`score_batches` runs the adapter head on
ready batches (images or precomputed tokens) -- the path of the domain-addition protocol.
"""
from __future__ import annotations

import numpy as np
import torch
from tqdm.auto import tqdm

from adsim.config.choices import DEFAULT_SCORE
from adsim.metrics.functional import smooth
from adsim.model.head import anomaly_maps, check_score, image_scores
from adsim.runtime import distributed


def score(detector, samples, *, batch_size: int = 16, maps: bool = False, progress: bool = False,
          desc: str = "scoring", smooth_sigma: float = 0.0) -> dict:
    """``{"scores": (n,), "labels": (n,), "maps": (n, S, S) or None, "masks": ...}`` as NumPy, scored by
    ``detector`` (``adsim.inference.detector.Detector.score_samples``, batch by batch); maps are smoothed per image
    with ``smooth_sigma`` as they stream. Under torchrun each rank scores ``samples[rank::size]`` and
    every rank gets all ``n`` results."""
    part = distributed.shard(samples)  # [distributed] all samples with one process
    out = None
    if part:
        # the per-batch metric inputs; a streaming metric (adsim.metrics) can consume them here instead
        scores, labels, all_maps, masks = [], [], [], []
        for o, batch in detector.score_samples(part, batch_size=batch_size, maps=maps,
                                               progress=progress and distributed.is_main(), desc=desc):
            scores.append(o.scores)
            labels.append(batch["label"].numpy())
            if maps:
                all_maps.append(smooth(o.maps, smooth_sigma))
                masks.append(batch["mask"].numpy().astype(bool))
        out = {"scores": np.concatenate(scores), "labels": np.concatenate(labels),
               "maps": np.concatenate(all_maps) if maps else None, "masks": np.concatenate(masks) if maps else None}
    return distributed.gather_arrays(out, len(samples))


@torch.no_grad()
def score_batches(head, batches, forward, *, grid: int, size: int, device, amp=None, maps: bool = False,
                  progress: bool = False, desc: str = "scoring", scoring: str = DEFAULT_SCORE) -> dict:
    """Score an iterable of batch dicts (``image``, ``label``, ``mask``) with ``forward(x) -> Features``
    (image path or token path); the head is put in evaluation mode. ``scoring``: one of
    ``adsim.model.head.SCORES``. Output as :func:`score`."""
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


def run_score(cfg, override: str | None = None) -> str:
    """The scoring of a run: ``override``, else the config's ``scoring`` field (its recipe), else the default."""
    return check_score(override or getattr(cfg, "scoring", None) or DEFAULT_SCORE)
