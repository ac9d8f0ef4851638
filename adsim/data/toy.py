"""``python -m adsim make-toy-bmad DIR``: a small procedural stand-in for BMAD in the MVFA layout.

SIMULATED data, for tests and the demo only. Each modality has its own texture (brain: an ellipse
with folds; liver: a blob with vessels; RESC/OCT: layered retina bands of different frequency; chest:
rib stripes; histopathology: nuclei dots). An anomalous image carries a lesion -- a smooth bright or
dark disc that replaces the texture -- and, for Brain/Liver/Retina_RESC, its mask.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path

import numpy as np
from PIL import Image

from adsim.data.domains import DOMAINS, MASKED, SIMULATED_MARKER, SPLITS


@lru_cache(maxsize=8)
def _grid(size):
    """``x (1, size)``, ``y (size, 1)`` pixel coordinates in [0, 1): broadcast, they give the same values
    as full ``(size, size)`` grids at a fraction of the work (read-only: cached)."""
    x = (np.arange(size, dtype=np.float64) / size)[None, :]
    y = x.T.copy()
    x.flags.writeable = y.flags.writeable = False
    return x, y


def _texture(domain: str, size: int, rng) -> np.ndarray:
    x, y = _grid(size)
    noise = rng.normal(0.0, 0.05, (size, size))
    ph = rng.uniform(0, 2 * np.pi)
    if domain == "Brain":
        r = ((x - 0.5) / 0.38) ** 2 + ((y - 0.5) / 0.45) ** 2
        img = (r < 1) * (0.45 + 0.15 * np.sin(30 * np.sqrt(r) + ph))
    elif domain == "Liver":
        r = ((x - 0.45) / 0.4) ** 2 + ((y - 0.55) / 0.3) ** 2
        s2 = np.sin(12 * x + 9 * y + ph) ** 2
        s4 = s2 * s2
        img = 0.25 + (r < 1) * (0.35 + 0.1 * (s4 * s4))  # sin^8 by squaring
    elif domain in ("Retina_RESC", "Retina_OCT2017"):
        freq = 18 if domain == "Retina_RESC" else 30
        band = np.exp(-((y - 0.5 - 0.08 * np.sin(4 * x + ph)) / 0.18) ** 2)
        img = band * (0.5 + 0.3 * np.sin(freq * y + ph))
    elif domain == "Chest":
        img = 0.3 + 0.25 * (np.sin(25 * y + 3 * np.abs(x - 0.5) + ph) > 0.6) * (np.abs(x - 0.5) > 0.06)
    elif domain == "Histopathology":  # 40 Gaussian nuclei, each separable: one (size, 40) x (40, size) product
        centres = rng.uniform(0, 1, (40, 2))
        gx = np.exp(-((x.T - centres[:, 0]) ** 2) / 0.0015)  # (size, 40)
        gy = np.exp(-((y - centres[:, 1]) ** 2) / 0.0015)    # (size, 40)
        img = 0.75 - 0.4 * (gy @ gx.T)
    else:  # pragma: no cover - DOMAINS is closed
        raise ValueError(domain)
    return np.clip(np.broadcast_to(img, (size, size)) + noise, 0.0, 1.0)


def _lesion(img: np.ndarray, rng) -> tuple:
    size = img.shape[0]
    x, y = _grid(size)
    cx, cy = rng.uniform(0.3, 0.7, 2)
    radius = rng.uniform(0.12, 0.2)
    d = np.sqrt((x - cx) ** 2 + (y - cy) ** 2) / radius
    mask = d < 1.0
    level = 0.95 if rng.uniform() < 0.5 else 0.05
    weight = np.clip(1.5 * (1.0 - d), 0.0, 1.0)
    return img * (1 - weight) + level * weight, mask


def _save(array: np.ndarray, path: Path) -> None:
    # tmp + os.replace rather than poolsim.io.atomic_write: the same no-partial-file guarantee without its fsync,
    # which for hundreds of small PNGs of a regenerable toy set would take most of the command's time
    tmp = path.with_name(path.stem + ".tmp" + path.suffix)
    # uint8 (H, W) -> 8-bit grey; zlib level 1: the same pixels, written ~4x faster than level 6
    Image.fromarray(array).save(tmp, format="PNG", compress_level=1)
    os.replace(tmp, path)


def _draw(root: Path, n_per_class: int, size: int, rng, pool) -> list:
    """Draw every image in a fixed order from ``rng`` and submit its PNG to ``pool``; the futures."""
    writes = []
    for domain in DOMAINS:
        for split in SPLITS:
            base = root / f"{domain}_AD" / split
            folders = [base / "good" / "img", base / "Ungood" / "img"]
            if domain in MASKED:
                folders.append(base / "Ungood" / "anomaly_mask")
            for f in folders:
                f.mkdir(parents=True, exist_ok=True)
            for i in range(n_per_class):
                name = f"{domain.lower()}_{split}_{i:04d}.png"
                normal = _texture(domain, size, rng)
                writes.append(pool.submit(_save, (normal * 255).astype(np.uint8), base / "good" / "img" / name))
                anomalous, mask = _lesion(_texture(domain, size, rng), rng)
                writes.append(pool.submit(_save, (anomalous * 255).astype(np.uint8), base / "Ungood" / "img" / name))
                if domain in MASKED:
                    writes.append(pool.submit(_save, (mask * 255).astype(np.uint8),
                                              base / "Ungood" / "anomaly_mask" / name))
    return writes


def make_toy_bmad(root, *, n_per_class: int = 8, size: int = 64, seed: int = 0) -> Path:
    """Write ``n_per_class`` normal and anomalous images per domain and split under ``root``.

    The images depend only on the arguments: they are drawn one after the other from one generator;
    a thread pool encodes and writes the PNG files (zlib releases the GIL), in any order."""
    if not isinstance(n_per_class, int) or n_per_class < 1:
        raise ValueError(f"n_per_class must be an integer >= 1, got {n_per_class!r}")
    if not isinstance(size, int) or size < 16:
        raise ValueError(f"size must be an integer >= 16, got {size!r}")
    root = Path(root)
    rng = np.random.default_rng(seed)
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        for w in _draw(root, n_per_class, size, rng, pool):
            w.result()  # an error of any write is raised here
    (root / SIMULATED_MARKER).write_text(  # read by eval and the table runner, which label their outputs
        f"SIMULATED toy data written by `python -m adsim make-toy-bmad` (n_per_class={n_per_class}, "
        f"size={size}, seed={seed}); not medical images.\n")
    return root
