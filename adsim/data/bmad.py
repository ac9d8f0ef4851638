"""BMAD in the MVFA-AD folder layout.

``ROOT/{Brain,Liver,Retina_RESC,Retina_OCT2017,Chest,Histopathology}_AD/{valid,test}/{good,Ungood}/img/*``
with pixel masks ``Ungood/anomaly_mask/<same file name>`` for Brain, Liver and Retina_RESC.
Bad layouts raise ``ValueError`` naming the path: a missing folder, an empty split, a missing mask.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from PIL import Image

from adsim.data import medical
from adsim.data.domains import MASKED, SIMULATED_MARKER, SPLITS, canonical_domain


def simulated(root) -> bool:
    """Whether ``root`` is SIMULATED toy data (``adsim.data.toy.make_toy_bmad`` left its marker file there)."""
    return (Path(root) / SIMULATED_MARKER).is_file()


# what a split folder may hold: PIL's formats (8- and 16-bit) and single-frame DICOM files
IMAGE_EXT = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", *medical.DICOM_SUFFIXES)
"""File suffixes a split folder is read for (lower case)."""


class Sample(NamedTuple):
    """One image of a BMAD split: its file, ``label`` (0 normal, 1 anomalous), its pixel mask file (``None``
    for normal images and domains without masks) and its domain."""
    image: Path
    label: int          # 0 normal (good), 1 anomalous (Ungood)
    mask: Path | None   # pixel mask (Ungood of a masked domain only)
    domain: str


def _images(folder: Path) -> list:
    if not folder.is_dir():
        raise ValueError(f"missing folder {folder} (expected the MVFA-AD layout of BMAD)")
    return sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_EXT)


def list_split(root, domain: str, split: str) -> list:
    """All samples of one split of one domain, normal first."""
    domain = canonical_domain(domain)
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    base = Path(root) / f"{domain}_AD" / split
    if not base.is_dir():
        raise ValueError(f"missing folder {base} (expected the MVFA-AD layout of BMAD)")
    samples = [Sample(p, 0, None, domain) for p in _images(base / "good" / "img")]
    masks = {}
    if domain in MASKED:
        masks = {p.stem: p for p in _images(base / "Ungood" / "anomaly_mask")}
    for p in _images(base / "Ungood" / "img"):
        mask = None
        if domain in MASKED:
            mask = masks.get(p.stem)
            if mask is None:
                raise ValueError(f"anomalous image {p} has no mask {base / 'Ungood' / 'anomaly_mask' / p.name}")
        samples.append(Sample(p, 1, mask, domain))
    if not samples:
        raise ValueError(f"empty split {base}: no images in good/img or Ungood/img")
    return samples


def require_both_classes(samples: list, what: str) -> None:
    """AUC is undefined on one class: raise ``ValueError``."""
    labels = {s.label for s in samples}
    if labels != {0, 1}:
        raise ValueError(f"{what} has only {'normal' if labels == {0} else 'anomalous'} images; "
                         "AUC needs both normal and anomalous images")


@functools.cache
def _clip_mean_std() -> tuple:
    """CLIP's image normalisation ``(mean (3, 1, 1), std (3, 1, 1))`` from open_clip, loaded on first use
    (importing open_clip loads torchvision and timm: seconds that code without images need not pay)."""
    from open_clip.constants import OPENAI_DATASET_MEAN, OPENAI_DATASET_STD

    return torch.tensor(OPENAI_DATASET_MEAN).view(3, 1, 1), torch.tensor(OPENAI_DATASET_STD).view(3, 1, 1)


def _normalise(x: torch.Tensor) -> torch.Tensor:
    mean, std = _clip_mean_std()
    return (x - mean) / std


def preprocess(image: Image.Image, size: int, *, clip_norm: bool = True) -> torch.Tensor:
    """The training preprocessing of one image: RGB, bicubic resize to ``size x size``, ``[0, 1]``, CLIP
    mean/std normalisation when ``clip_norm``. Returns ``(3, size, size)`` float32. Any image size is
    accepted (mismatched sizes are resized, as in training)."""
    img = image.convert("RGB").resize((size, size), Image.BICUBIC)
    x = torch.from_numpy(np.asarray(img, dtype=np.float32) / 255.0).permute(2, 0, 1)
    return _normalise(x) if clip_norm else x


def preprocess_array(pixels: np.ndarray, size: int, *, clip_norm: bool = True) -> torch.Tensor:
    """:func:`preprocess` of float ``pixels`` in ``[0, 1]``, ``(H, W)`` grey or ``(H, W, 3)`` RGB, without
    going through 8 bits: bicubic resize of each channel in float (PIL mode ``F``), clipped to ``[0, 1]``
    as the 8-bit path clips to ``[0, 255]``; grey is repeated to 3 channels."""
    a = np.asarray(pixels, dtype=np.float32)
    channels = [a] if a.ndim == 2 else [a[..., c] for c in range(a.shape[-1])]
    resized = [np.asarray(Image.fromarray(np.ascontiguousarray(c)).resize((size, size), Image.BICUBIC),
                          dtype=np.float32) for c in channels]
    x = torch.from_numpy(np.clip(np.stack(resized * 3 if len(resized) == 1 else resized), 0.0, 1.0))
    return _normalise(x) if clip_norm else x


# what reading a file that is not a readable image raises (adsim.data.medical.UnreadableInput is a
# ValueError; PIL raises OSError, SyntaxError, EOFError or its DecompressionBombError)
UNREADABLE = (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError)
"""The exceptions that mean "not a readable image" (caught per file by ``predict``)."""


def load_image(src, size: int, *, clip_norm: bool = True) -> tuple:
    """``(image (3, size, size) float32, window)`` of ``src``: a path, an ``adsim.data.medical.Source``
    (a DICOM frame or NIfTI slice) or an open PIL image, read by ``adsim.data.medical.decode`` (DICOM,
    NIfTI, 16-bit PNG/TIFF, PIL's formats) and preprocessed as in training. ``window``: how stored values
    became pixels. A file that is not a readable image raises one of :data:`UNREADABLE`."""
    decoded = medical.decode(src)
    if isinstance(decoded.pixels, Image.Image):
        return preprocess(decoded.pixels, size, clip_norm=clip_norm), decoded.window
    return preprocess_array(decoded.pixels, size, clip_norm=clip_norm), decoded.window


def read_image(src, size: int, *, clip_norm: bool = True) -> torch.Tensor:
    """:func:`load_image` without the window: ``(3, size, size)`` float32."""
    return load_image(src, size, clip_norm=clip_norm)[0]


def unnormalise(x: torch.Tensor, *, clip_norm: bool = True) -> torch.Tensor:
    """Inverse of :func:`preprocess`'s normalisation: ``(..., 3, S, S)`` -> RGB in ``[0, 1]``."""
    if not clip_norm:
        return x.cpu().clamp(0, 1)
    mean, std = _clip_mean_std()
    return (x.cpu() * std + mean).clamp(0, 1)


class ImageDataset(torch.utils.data.Dataset):
    """Items: ``image (3, S, S)`` float, ``mask (S, S)`` 0/1, ``has_mask`` (a normal image's mask is
    all zero and known; an anomalous image without a mask has ``has_mask = 0``), ``label``, ``index``."""

    def __init__(self, samples: list, size: int, *, clip_norm: bool = True):
        self.samples, self.size, self.clip_norm = list(samples), size, clip_norm

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        s = self.samples[i]
        x = read_image(s.image, self.size, clip_norm=self.clip_norm)
        if s.mask is not None:
            with Image.open(s.mask) as im:
                m = np.asarray(im.convert("L").resize((self.size, self.size), Image.NEAREST)) > 127
            mask = torch.from_numpy(m.astype(np.float32))
        else:
            mask = torch.zeros(self.size, self.size)
        has_mask = float(s.label == 0 or s.mask is not None)
        return {"image": x, "mask": mask, "has_mask": torch.tensor(has_mask),
                "label": torch.tensor(float(s.label)), "index": torch.tensor(i)}


def holdout(samples: list, fraction: float, seed: int) -> tuple:
    """Split ``samples`` into (train, held-out) with ``fraction`` of every (domain, class) held out."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"holdout fraction must be in (0, 1), got {fraction!r}")
    rng = np.random.default_rng(seed)
    train, held = [], []
    groups = {}
    for s in samples:
        groups.setdefault((s.domain, s.label), []).append(s)
    for key in sorted(groups):
        g = groups[key]
        order = rng.permutation(len(g))
        k = int(round(fraction * len(g)))
        held += [g[j] for j in order[:k]]
        train += [g[j] for j in order[k:]]
    return train, held
