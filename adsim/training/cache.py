"""Frozen-trunk cache: the tokens entering the first adapter, computed once per image.

The backbone is frozen and no adapter acts before block ``spec.adapter_layers[0]``, so the output of
blocks ``0 .. adapter_layers[0]`` (:func:`adsim.model.head.trunk_tokens`, ``(1 + N, W)`` per image) depends on
the image alone and is the same in every epoch. ``train(..., trunk_cache=True)`` (CLI
``--trunk-cache``) computes it once, keeps it in RAM with the masks and labels, and trains from it:
image decoding, resizing and the trunk blocks leave the epoch loop. The training result is the same as
without the cache (same ops on the same values, same autocast; tested).

Valid only because the image pipeline is deterministic (``adsim.data.ImageDataset`` has no data
augmentation): with a random augmentation the cached tokens would be those of one fixed draw, so
such a dataset must not be cached.

Cost: ``n_images x (1 + N) x W x 4`` bytes (float32, the dtype the trunk produces), plus the masks
(``S x S`` bytes each). Under torchrun every rank builds and holds the whole cache (each rank's share of
an epoch changes with the permutation).
"""
from __future__ import annotations

import torch
from tqdm.auto import tqdm

from adsim.model.head import trunk_tokens


class TrunkCache(torch.utils.data.Dataset):
    """Items like :class:`adsim.data.ImageDataset`'s, with the trunk tokens ``(1 + N, W)`` as ``image``
    (the model input, as in ``adsim.experiments.sources``)."""

    def __init__(self, tokens: torch.Tensor, masks: torch.Tensor, has_mask: torch.Tensor, labels: torch.Tensor):
        n = tokens.shape[0]
        if not masks.shape[0] == has_mask.shape[0] == labels.shape[0] == n:
            raise ValueError(f"cache arrays disagree on the number of images: {tokens.shape[0]}, "
                             f"{masks.shape[0]}, {has_mask.shape[0]}, {labels.shape[0]}")
        self.tokens, self.masks, self.has_mask, self.labels = tokens, masks, has_mask, labels

    def __len__(self):
        return self.tokens.shape[0]

    def nbytes(self) -> int:
        return sum(t.element_size() * t.numel() for t in (self.tokens, self.masks, self.has_mask, self.labels))

    def __getitem__(self, i):
        return {"image": self.tokens[i], "mask": self.masks[i].float(), "has_mask": self.has_mask[i],
                "label": self.labels[i], "index": torch.tensor(i)}


@torch.no_grad()
def build_trunk_cache(backbone, dataset, *, device, amp=None, batch_size: int = 16, num_workers: int = 0,
                      progress: bool = False) -> TrunkCache:
    """One pass over ``dataset`` (an ``ImageDataset``) through the frozen trunk, under the same autocast
    as training; the tokens are stored on the CPU in the dtype the trunk returns."""
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=num_workers)
    tokens, masks, has_mask, labels = [], [], [], []
    for batch in tqdm(loader, desc="trunk cache", disable=not progress, leave=False):
        with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
            tokens.append(trunk_tokens(backbone, batch["image"].to(device)).cpu())
        masks.append(batch["mask"] > 0.5)
        has_mask.append(batch["has_mask"])
        labels.append(batch["label"])
    return TrunkCache(torch.cat(tokens), torch.cat(masks), torch.cat(has_mask), torch.cat(labels))
