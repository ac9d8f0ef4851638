"""Small metric helpers shared by evaluation, the protocol, the simulator and model selection."""
from __future__ import annotations

import math

import numpy as np
from scipy.ndimage import gaussian_filter


def auc_percent(labels, scores) -> float:
    """ROC AUC in percent of ``scores`` (any shape) against 0/1 ``labels`` (same size); one class only ->
    ``ValueError``."""
    # imported here: sklearn.metrics costs ~2 s of CPU to import, which a training run without model
    # selection (and every job process that never scores) would otherwise pay at start-up
    from sklearn.metrics import roc_auc_score

    labels = np.asarray(labels).ravel()
    if len(np.unique(labels)) < 2:
        raise ValueError("AUC undefined: the labels contain one class only")
    return 100.0 * float(roc_auc_score(labels, np.asarray(scores).ravel()))


def check_sigma(sigma: float) -> float:
    """``sigma`` if it is a finite number >= 0 (a map-smoothing width in pixels), else ``ValueError``."""
    if sigma < 0 or not math.isfinite(sigma):
        raise ValueError(f"smoothing sigma must be a finite number >= 0, got {sigma!r}")
    return sigma


def smooth(maps: np.ndarray, sigma: float) -> np.ndarray:
    """Each map of ``maps: (B, H, W)`` blurred by a Gaussian of width ``sigma`` pixels (0: unchanged)."""
    if check_sigma(sigma) == 0:
        return maps
    return np.stack([gaussian_filter(m, sigma=sigma) for m in maps])
