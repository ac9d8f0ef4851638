"""Anomaly-map overlays: a heatmap over the input image, the ground-truth contour where a mask exists.

:func:`overlay` blends a matplotlib colormap of the map -- min-max normalised *per image*, so colours
show where the model looks within an image, not how anomalous the image is (the score is printed in
the title strip) -- over the RGB input at the map's resolution. The mask contour is the mask minus its
binary erosion (``scipy.ndimage``), drawn one pixel wide. :func:`write_overlay` writes the PNG
atomically (``adsim.runtime.io``; mode 0666 & ~umask, i.e. 0644 under the usual umask).
"""
from __future__ import annotations

import functools
import io
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from PIL import Image, ImageDraw, ImageFont
from scipy.ndimage import binary_erosion

from poolsim.io import atomic_write

CONTOUR_RGB = (0, 255, 0)  # ground-truth contour colour (green: apart from the jet colormap's red/blue ends)


def overlay(image: np.ndarray, amap: np.ndarray, mask: np.ndarray | None = None, *, cmap: str = "jet",
            alpha: float = 0.45) -> np.ndarray:
    """``image (S, S, 3)`` RGB in ``[0, 1]`` (float) or uint8, ``amap (S, S)`` anomaly map (higher = more
    anomalous), ``mask (S, S)`` bool ground truth or ``None`` -> ``(S, S, 3)`` uint8 blend
    ``(1 - alpha) image + alpha cmap(normalised map)`` with the mask contour on top."""
    img = np.asarray(image)
    img = img.astype(np.float32) / 255.0 if img.dtype == np.uint8 else img.astype(np.float32)
    amap = np.asarray(amap, dtype=np.float32)
    if img.ndim != 3 or img.shape[2] != 3 or amap.shape != img.shape[:2]:
        raise ValueError(f"image must be (H, W, 3) and amap (H, W) of the same H, W; got {img.shape}, {amap.shape}")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")
    if not np.isfinite(amap).all():
        raise ValueError("amap holds NaN or inf")
    lo, hi = float(amap.min()), float(amap.max())
    norm = (amap - lo) / (hi - lo) if hi > lo else np.zeros_like(amap)  # a constant map: lowest colour
    heat = colormaps[cmap](norm)[..., :3]
    out = np.clip((1.0 - alpha) * img + alpha * heat, 0.0, 1.0)
    out = (out * 255.0).round().astype(np.uint8)
    if mask is not None:
        mask = np.asarray(mask, dtype=bool)
        if mask.shape != amap.shape:
            raise ValueError(f"mask must have the map's shape {amap.shape}, got {mask.shape}")
        out[mask & ~binary_erosion(mask)] = CONTOUR_RGB
    return out


def overlay_names(names: list) -> list:
    """One PNG file name per input name: ``<stem>.png``; inputs without a file stem, or stems that occur
    twice, get their position as a prefix (``00003_<stem>.png``), so no two inputs share a file."""
    stems = [Path(n).stem if not n.startswith("<") else "" for n in names]
    counts: dict[str, int] = {}
    for s in stems:
        counts[s] = counts.get(s, 0) + 1
    return [f"{s}.png" if s and counts[s] == 1 else f"{i:05d}_{s or 'image'}.png" for i, s in enumerate(stems)]


@functools.cache
def _font():
    return ImageFont.load_default()


def write_overlay(path, image: np.ndarray, amap: np.ndarray, mask: np.ndarray | None = None, *,
                  score: float | None = None, title: str | None = None, min_size: int = 192, **options) -> Path:
    """:func:`overlay` (``options``: ``cmap``, ``alpha``) written as a PNG to ``path`` atomically, with a
    text strip above it holding ``title`` and the image ``score`` when given. An overlay smaller than
    ``min_size`` pixels is enlarged by an integer factor (nearest neighbour: every pixel stays visible)."""
    rgb = overlay(image, amap, mask, **options)
    factor = -(-int(min_size) // min(rgb.shape[:2])) if min(rgb.shape[:2]) < min_size else 1
    if factor > 1:
        rgb = np.repeat(np.repeat(rgb, factor, axis=0), factor, axis=1)
    text = " ".join(t for t in (title, None if score is None else f"score {score:.3g}") if t)
    if text:
        font = _font()
        # the box of a text drawn at (0, 0) is whole pixels (Pillow's stubs declare floats for scaled fonts)
        draw = ImageDraw.Draw(Image.new("RGB", (1, 1)))
        left, top, right, bottom = map(int, draw.textbbox((0, 0), text, font=font))
        strip = Image.new("RGB", (max(rgb.shape[1], right + 4), bottom + 4), (255, 255, 255))
        ImageDraw.Draw(strip).text((2, 2), text, fill=(0, 0, 0), font=font)
        canvas = Image.new("RGB", (strip.width, rgb.shape[0] + strip.height), (255, 255, 255))
        canvas.paste(strip, (0, 0))
        canvas.paste(Image.fromarray(rgb), (0, strip.height))
    else:
        canvas = Image.fromarray(rgb)
    buf = io.BytesIO()
    canvas.save(buf, format="PNG")
    return atomic_write(path, lambda fh: fh.write(buf.getvalue()))


def montage(pngs, out, *, title: str, ncols: int = 4, dpi: int = 100) -> Path:
    """Overlay PNGs (a list, or a folder: its ``most_*`` files, then the rest, by name) side by side in one
    matplotlib figure titled ``title`` (say there what the data and the weights are), written to ``out``
    atomically. Returns ``out``."""
    from matplotlib.figure import Figure

    if isinstance(pngs, (str, Path)) and Path(pngs).is_dir():
        pngs = sorted(Path(pngs).glob("*.png"), key=lambda p: (not p.name.startswith("most"), p.name))
    pngs = [Path(p) for p in pngs]
    if not pngs:
        raise ValueError("montage: no PNG to show")
    if not isinstance(ncols, int) or ncols < 1:
        raise ValueError(f"ncols must be an integer >= 1, got {ncols!r}")
    ncols = min(ncols, len(pngs))
    nrows = -(-len(pngs) // ncols)
    fig = Figure(figsize=(2.4 * ncols, 2.6 * nrows + 0.6), dpi=dpi)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for ax in axes.ravel():
        ax.axis("off")
    for ax, p in zip(axes.ravel(), pngs):
        with Image.open(p) as im:
            ax.imshow(np.asarray(im.convert("RGB")), interpolation="nearest")
        ax.set_title(p.stem, fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return atomic_write(out, lambda fh: fh.write(buf.getvalue()))
