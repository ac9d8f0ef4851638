"""What ``predict`` accepts, as a list of ``(name, source)`` items: folders, files, PIL images, tensors."""
from __future__ import annotations

from pathlib import Path

import torch
from PIL import Image


def _files(folder: Path) -> list:
    """Every regular, non-hidden file of ``folder`` (not recursive), sorted: non-images are warned about
    when read, not filtered by their suffix."""
    return sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))


def _tensor_images(x: torch.Tensor) -> list:
    """``(B, 3, H, W)`` or ``(3, H, W)`` in ``[0, 1]`` -> 8-bit PIL images (quantised as an image file
    is, so a tensor and the file it was read from give identical scores)."""
    if x.ndim == 3:
        x = x[None]
    if x.ndim != 4 or x.shape[1] != 3 or not x.is_floating_point():
        raise ValueError(f"images: a tensor must be float (B, 3, H, W) or (3, H, W), got {x.dtype} "
                         f"{tuple(x.shape)}")
    x = x.detach().cpu().float()
    if not bool(torch.isfinite(x).all()) or float(x.min()) < 0.0 or float(x.max()) > 1.0:
        raise ValueError("images: a tensor must hold finite values in [0, 1]")
    u8 = (x * 255.0).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    return [Image.fromarray(a) for a in u8]


def image_items(images) -> list:
    """What :meth:`Detector.predict` accepts -> ``[(name, path or PIL image)]``: a folder (its files,
    sorted), a file, a PIL image, a tensor, or a list/tuple of paths, folders and PIL images.
    A path that does not exist -> ``ValueError``."""
    if isinstance(images, torch.Tensor):
        return [(f"<tensor image {i}>", im) for i, im in enumerate(_tensor_images(images))]
    if isinstance(images, (str, Path, Image.Image)):
        images = [images]
    if not isinstance(images, (list, tuple)):
        raise TypeError(f"images must be a folder, a path, a PIL image, a tensor or a list of paths/PIL "
                        f"images, got {type(images).__name__}")
    items = []
    for i, im in enumerate(images):
        if isinstance(im, Image.Image):
            items.append((f"<PIL image {i}>", im))
            continue
        if not isinstance(im, (str, Path)):
            raise TypeError(f"images[{i}] must be a path or a PIL image, got {type(im).__name__}")
        p = Path(im)
        if p.is_dir():
            items += [(str(f), f) for f in _files(p)]
        elif p.is_file():
            items.append((str(p), p))
        else:
            raise ValueError(f"images: no such file or folder {str(p)!r}")
    return items
