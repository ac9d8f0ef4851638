"""Where the protocol's features come from: the feature-level simulator or real BMAD-layout images.

A :class:`Source` hides the difference: ``forward(head, x)`` is ``features_from_tokens`` (simulated
tokens) or ``features`` (images through the frozen open_clip backbone); ``train_batches`` and
``test_batches`` yield the batch dicts that ``adsim.training.train.train_epoch`` and
``adsim.evaluation.evaluate.score_batches`` consume. ``similarity`` is the Table-4-style matrix (mean pairwise
cosine of unit image features, ``adsim.data.sim.similarity``) *measured on this source's features*: last
simulated layer for the simulator, last adapter block of the frozen backbone for real images (the paper
used the 4th adapter layer of its trained model, which does not exist before training).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np
import torch

from adsim.config.prompts import prompt_texts
from adsim.data import bmad, sim
from adsim.data.domains import DOMAINS, MASKED, SPLITS
from adsim.model.backbone import build_backbone, frozen_tokens
from adsim.model.head import features, features_from_tokens, text_embeddings


class Source(NamedTuple):
    kind: str                # "simulated" | "real"
    domains: tuple           # available domains, DOMAINS order
    masked: tuple            # domains with pixel masks
    similarity: np.ndarray   # (len(domains), len(domains)) measured mean pairwise cosines
    grid: int
    size: int                # mask / map side (pixels; = grid for the simulator)
    width: int
    embed_dim: int
    n_layers: int
    text: torch.Tensor       # (2, embed_dim)
    forward: Callable        # (head, x) -> Features
    train_batches: Callable  # (domains, batch_size, seed) -> iterable of batch dicts
    test_batches: Callable   # (domain, batch_size) -> iterable of batch dicts
    smooth_sigma: float      # Gaussian smoothing of pixel maps before the pixel AUC


def _split_batches(split: sim.Split, batch_size: int, order=None):
    n = len(split.labels)
    idx = torch.arange(n) if order is None else order
    for i in range(0, n, batch_size):
        j = idx[i:i + batch_size]
        yield {"image": split.tokens[j], "label": split.labels[j], "mask": split.masks[j],
               "has_mask": split.has_mask[j], "pixel_domain": split.pixel_domain[j]}


def _concat(splits: list) -> sim.Split:
    return sim.Split(*(torch.cat(parts) for parts in zip(*splits)))


def simulated(params: sim.SimParams, seed: int) -> Source:
    """The simulator's six modalities for ``seed`` (SIMULATED data)."""
    data = sim.simulate(params, seed)
    p = sim.validate(params)
    domains = DOMAINS
    feats = {d: sim.image_features(torch.cat([data.train[d].tokens, data.test[d].tokens])) for d in domains}
    _, similarity = sim.similarity(feats)

    def train_batches(doms, batch_size, shuffle_seed):
        pooled = _concat([data.train[d] for d in sorted(doms, key=domains.index)])  # canonical, order-free
        gen = torch.Generator().manual_seed(shuffle_seed)
        return _split_batches(pooled, batch_size, torch.randperm(len(pooled.labels), generator=gen))

    return Source("simulated", domains, MASKED, similarity, p.grid, p.grid, p.width, p.embed_dim, p.n_layers,
                  data.text, features_from_tokens, train_batches,
                  lambda d, bs: _split_batches(data.test[d], bs), 0.0)


def real(root, *, backbone: str = "ViT-L-14-336", checkpoint=None, image_size=None, seed: int = 0,
         device="cpu", clip_norm: bool = True, smooth_sigma: float = 4.0, n_similarity: int = 64,
         prompts: str = "medical", quick_gelu: bool = True) -> Source:
    """Real images in the MVFA layout under ``root``; the domains are those whose folder exists.
    ``prompts``: the recipe's prompt set (``adsim.config.prompts.prompt_texts``); ``quick_gelu``: the recipe's
    activation of the CLIP towers (``adsim.model.backbone.build_backbone``)."""
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"--data {root} is not a folder")
    domains = tuple(d for d in DOMAINS if (root / f"{d}_AD").is_dir())
    if len(domains) < 2:
        raise ValueError(f"need at least two modalities under {root} for leave-one-out, found {list(domains)} "
                         f"(expected folders {[d + '_AD' for d in DOMAINS]})")
    train = {d: [s for sp in SPLITS for s in bmad.list_split(root, d, sp)] for d in domains}
    test = {d: bmad.list_split(root, d, "test") for d in domains}
    bb = build_backbone(backbone, image_size=image_size, checkpoint=checkpoint, quick_gelu=quick_gelu, seed=seed,
                        device=device)
    spec = bb.spec

    def loader(samples, batch_size, gen=None):
        return torch.utils.data.DataLoader(bmad.ImageDataset(samples, spec.image_size, clip_norm=clip_norm),
                                           batch_size=batch_size, shuffle=gen is not None, generator=gen)

    feats = {}
    for d in domains:
        rows = []
        for batch in loader(train[d][:n_similarity], 16):
            tok = frozen_tokens(bb, batch["image"].to(device))[-1].float()  # (B, N, W) patch tokens, last block
            rows.append(torch.nn.functional.normalize(tok.mean(1), dim=-1).cpu().numpy())
        feats[d] = np.concatenate(rows)
    _, similarity = sim.similarity(feats)

    def train_batches(doms, batch_size, shuffle_seed):
        samples = [s for d in sorted(doms, key=domains.index) for s in train[d]]
        return loader(samples, batch_size, torch.Generator().manual_seed(shuffle_seed))

    return Source("real", domains, tuple(d for d in domains if d in MASKED), similarity, spec.grid, spec.image_size,
                  spec.width, spec.embed_dim, len(spec.adapter_layers), text_embeddings(bb, prompt_texts(prompts)),
                  lambda head, x: features(bb, head, x), train_batches,
                  lambda d, bs: loader(test[d], bs), smooth_sigma)


class Lazy:
    """``source_for_seed`` of a source that is the same for every seed: ``factory(*args, **kwargs)`` is
    built on the first call in each process and kept. Pickling keeps the arguments and drops the built
    source, so a scheduler job (:func:`poolsim.cluster.run_jobs`) builds its own instead of receiving a
    backbone in its pickle."""

    def __init__(self, factory: Callable, *args, **kwargs):
        self.factory, self.args, self.kwargs = factory, args, kwargs
        self._built: Source | None = None

    def __call__(self, seed: int) -> Source:
        if self._built is None:
            self._built = self.factory(*self.args, **self.kwargs)
        return self._built

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_built": None}
