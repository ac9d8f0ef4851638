"""``python -m adsim make-toy-bmad DIR``: a small procedural stand-in for BMAD in the MVFA layout.

SIMULATED data, for tests and the demo only. Each modality has its own texture (brain: an ellipse
with folds; liver: a blob with vessels; RESC/OCT: layered retina bands of different frequency; chest:
rib stripes; histopathology: nuclei dots). An anomalous image carries a lesion -- a smooth bright or
dark disc that replaces the texture -- and, for Brain/Liver/Retina_RESC, its mask.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from PIL import Image

from adsim.data.bmad import SIMULATED_MARKER
from adsim.data.domains import DOMAINS, MASKED, SPLITS


def _grid(size):
    y, x = np.mgrid[0:size, 0:size] / size
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
        img = 0.25 + (r < 1) * (0.35 + 0.1 * np.sin(12 * x + 9 * y + ph) ** 8)
    elif domain in ("Retina_RESC", "Retina_OCT2017"):
        freq = 18 if domain == "Retina_RESC" else 30
        band = np.exp(-((y - 0.5 - 0.08 * np.sin(4 * x + ph)) / 0.18) ** 2)
        img = band * (0.5 + 0.3 * np.sin(freq * y + ph))
    elif domain == "Chest":
        img = 0.3 + 0.25 * (np.sin(25 * y + 3 * np.abs(x - 0.5) + ph) > 0.6) * (np.abs(x - 0.5) > 0.06)
    elif domain == "Histopathology":
        img = np.full((size, size), 0.75)
        for cx, cy in rng.uniform(0, 1, (40, 2)):
            img -= 0.4 * np.exp(-(((x - cx) ** 2 + (y - cy) ** 2) / 0.0015))
    else:  # pragma: no cover - DOMAINS is closed
        raise ValueError(domain)
    return np.clip(img + noise, 0.0, 1.0)


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
    tmp = path.with_name(path.stem + ".tmp" + path.suffix)
    Image.fromarray(array).save(tmp)  # uint8 (H, W) -> 8-bit grey
    os.replace(tmp, path)


def make_toy_bmad(root, *, n_per_class: int = 8, size: int = 64, seed: int = 0) -> Path:
    """Write ``n_per_class`` normal and anomalous images per domain and split under ``root``."""
    if not isinstance(n_per_class, int) or n_per_class < 1:
        raise ValueError(f"n_per_class must be an integer >= 1, got {n_per_class!r}")
    if not isinstance(size, int) or size < 16:
        raise ValueError(f"size must be an integer >= 16, got {size!r}")
    root = Path(root)
    rng = np.random.default_rng(seed)
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
                _save((normal * 255).astype(np.uint8), base / "good" / "img" / name)
                anomalous, mask = _lesion(_texture(domain, size, rng), rng)
                _save((anomalous * 255).astype(np.uint8), base / "Ungood" / "img" / name)
                if domain in MASKED:
                    _save((mask * 255).astype(np.uint8), base / "Ungood" / "anomaly_mask" / name)
    (root / SIMULATED_MARKER).write_text(  # read by eval and the table runner, which label their outputs
        f"SIMULATED toy data written by `python -m adsim make-toy-bmad` (n_per_class={n_per_class}, "
        f"size={size}, seed={seed}); not medical images.\n")
    return root
