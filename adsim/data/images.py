"""What ``predict`` accepts, as a list of ``(name, source)`` items: folders, files, PIL images, tensors.

A source is a path (a plain image file), a PIL image, or an ``adsim.data.medical.Source``: one frame of
a DICOM file or one slice of a NIfTI volume (``adsim.data.medical``: a multi-frame DICOM is one item per
frame, a 3-D NIfTI one item per slice along ``axis``, a folder's DICOM series in instance order).
"""
from __future__ import annotations

from pathlib import Path

import torch
from PIL import Image

from adsim.data.medical import Source, expand, expand_folder, resolve_axis


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


def _named(items: list) -> list:
    return [(it.name, it) if isinstance(it, Source) else (str(it), it) for it in items]


def image_items(images, *, axis="axial") -> list:
    """What :meth:`Detector.predict` accepts -> ``[(name, source)]``: a folder (its regular, non-hidden
    files, sorted; non-images are warned about when read, not filtered by their suffix), a file, a PIL
    image, a tensor, an ``adsim.data.medical.Source``, or a list/tuple of these (not tensors). DICOM and
    NIfTI files expand to one item per frame or slice (``axis``: the NIfTI slice axis, see
    ``adsim.data.medical.resolve_axis``). A path that does not exist -> ``ValueError``."""
    resolve_axis(axis)
    if isinstance(images, torch.Tensor):
        return [(f"<tensor image {i}>", im) for i, im in enumerate(_tensor_images(images))]
    if isinstance(images, (str, Path, Image.Image, Source)):
        images = [images]
    if not isinstance(images, (list, tuple)):
        raise TypeError(f"images must be a folder, a path, a PIL image, a tensor or a list of paths/PIL "
                        f"images, got {type(images).__name__}")
    items: list[tuple[str, Image.Image | Source | Path]] = []
    for i, im in enumerate(images):
        if isinstance(im, Image.Image):
            items.append((f"<PIL image {i}>", im))
            continue
        if isinstance(im, Source):
            items.append((im.name, im))
            continue
        if not isinstance(im, (str, Path)):
            raise TypeError(f"images[{i}] must be a path or a PIL image, got {type(im).__name__}")
        p = Path(im)
        if p.is_dir():
            items += _named(expand_folder(p, axis=axis))
        elif p.is_file():
            items += _named(expand(p, axis=axis))
        else:
            raise ValueError(f"images: no such file or folder {str(p)!r}")
    return items
