"""The 2 x 2 mosaic augmentation of APRIL-GAN's and AdaCLIP's training data (recipe field ``aug_rate``).

With probability ``rate`` a training item is replaced by a mosaic of four images of its own group (the BMAD
domain: their "class"), drawn without replacement, each resized to one quadrant (row-major: top left, top
right, bottom left, bottom right); the masks are mosaicked the same way. This is what their data sets do
(ByChelsea/VAND-APRIL-GAN ``dataset.py`` and caoyunkang/AdaCLIP ``dataset/base_dataset.py`` ``combine_img``:
four images of the item's class pasted into a 2W x 2H canvas, then resized with the rest of the pipeline).

What the mosaic item keeps of the item it replaces, as theirs does: its ``label`` (their ``anomaly`` field is
not updated) and its ``index``; ``has_mask`` is 1 only if all four sources have a known mask. adsim resizes
each source (already at the training size ``S``) to its quadrant with antialiased bilinear interpolation, the
mask with the same interpolation then binarised at 0.5; theirs pastes the originals and resizes the whole
canvas once (their resize filters differ from adsim's anyway).

Draws are reproducible and independent of the data loader: item ``i`` in epoch ``e`` of phase ``p`` uses
``numpy.random.default_rng([seed, p, e, i])`` -- one uniform number against ``rate``, then the four sources
-- so a resumed run and any number of loader workers see the same mosaics (their draws use Python's global
``random`` module).
"""
from __future__ import annotations

import numpy as np
import torch
from torch.nn import functional

SOURCES = 4  # images per mosaic: 2 x 2


def quadrants(size: int) -> list:
    """``[(top, left, height, width)]`` of the four quadrants of a ``size x size`` image, row-major (the first
    row and column take ``size // 2`` pixels, the others the rest)."""
    h0 = size // 2
    spans = ((0, h0), (h0, size - h0))
    return [(top, left, h, w) for top, h in spans for left, w in spans]


def resize(x: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """``x (C, H, W)`` float -> ``(C, height, width)``: bilinear, antialiased (``align_corners=False``)."""
    return functional.interpolate(x[None].float(), size=(height, width), mode="bilinear", antialias=True,
                                  align_corners=False)[0]


def compose(images: list, masks: list) -> tuple:
    """Four ``images [(3, S, S)]`` and ``masks [(S, S)]`` -> ``(image (3, S, S), mask (S, S) 0/1)``: each source
    resized (:func:`resize`) into its quadrant (:func:`quadrants`), the masks likewise and binarised at 0.5."""
    if len(images) != SOURCES or len(masks) != SOURCES:
        raise ValueError(f"a mosaic takes {SOURCES} images and {SOURCES} masks, got {len(images)} and {len(masks)}")
    size = images[0].shape[-1]
    image = torch.empty_like(images[0])
    mask = torch.empty(size, size, dtype=masks[0].dtype)
    for (top, left, h, w), x, m in zip(quadrants(size), images, masks):
        image[:, top:top + h, left:left + w] = resize(x, h, w)
        mask[top:top + h, left:left + w] = (resize(m[None], h, w)[0] > 0.5).to(mask.dtype)
    return image, mask


class Mosaic(torch.utils.data.Dataset):
    """``dataset`` (items ``{"image" (3, S, S), "mask" (S, S), "has_mask", "label", "index"}``, e.g.
    ``adsim.data.bmad.ImageDataset``) with each item replaced, with probability ``rate``, by a 2 x 2 mosaic of
    four items of its group (``groups[i]``: item ``i``'s group, e.g. its domain; a group of fewer than four
    items is never mosaicked). :meth:`set_epoch` selects the draws (module docstring)."""

    def __init__(self, dataset, groups, rate: float, *, seed: int = 0):
        groups = list(groups)
        if len(groups) != len(dataset):
            raise ValueError(f"groups must name one group per item ({len(dataset)}), got {len(groups)}")
        if not isinstance(rate, (int, float)) or isinstance(rate, bool) or not 0.0 <= rate <= 1.0:
            raise ValueError(f"rate must be a number in [0, 1], got {rate!r}")
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
        self.dataset, self.rate, self.seed = dataset, float(rate), seed
        members: dict = {}
        for i, g in enumerate(groups):
            members.setdefault(g, []).append(i)
        self.pool = [members[g] for g in groups]  # item i -> the items of its group (shared lists)
        self.phase, self.epoch = 0, 0

    def set_epoch(self, epoch: int, phase: int = 0) -> None:
        """Draw the mosaics of ``epoch`` (and ``phase``, e.g. 1 + the domain index of a sequential schedule)."""
        for name, v in (("epoch", epoch), ("phase", phase)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {v!r}")
        self.epoch, self.phase = epoch, phase

    def __len__(self):
        return len(self.dataset)

    def sources(self, i: int) -> list | None:
        """The four items item ``i`` is replaced by in the current epoch, or ``None`` (kept as it is)."""
        rng = np.random.default_rng([self.seed, self.phase, self.epoch, i])
        pool = self.pool[i]
        if rng.random() >= self.rate or len(pool) < SOURCES:
            return None
        return [pool[j] for j in rng.choice(len(pool), size=SOURCES, replace=False)]

    def __getitem__(self, i):
        picks = self.sources(i)
        item = self.dataset[i]
        if picks is None:
            return item
        parts = [self.dataset[j] for j in picks]
        image, mask = compose([p["image"] for p in parts], [p["mask"] for p in parts])
        has_mask = torch.stack([torch.as_tensor(p["has_mask"], dtype=torch.float32) for p in parts]).min()
        return {**item, "image": image, "mask": mask, "has_mask": has_mask.to(torch.as_tensor(item["has_mask"]).dtype)}
