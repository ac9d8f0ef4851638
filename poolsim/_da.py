"""Data Addition score (paper Eq. 15)."""
from __future__ import annotations

from typing import Any

import numpy as np

PAPER_WEIGHTS = (0.1, 0.2, 0.3, 0.4)


def da_score(y: Any, weights: Any = None) -> Any:
    """Data Addition score, Eq. 15 of the paper, vectorised over leading axes.

    ``DA(y) = sum_{i=1}^{L-1} 1[y_{i+1} >= y_i] * (1 + (y_{i+1} - y_i) / 10 * s_i)``

    ``y: (..., L)`` performance after adding 1..L domains, **in percent** (AUC x 100), L >= 2.
    ``weights: (L-1,)`` the importance weights ``s``; default: the paper's ``(0.1, 0.2, 0.3, 0.4)``
    for L = 5 and, for other L, our generalisation ``s_i = i / sum_{j<L} j`` (which reproduces the
    paper's weights at L = 5). A run that never gets worse scores at least L - 1 (4 for L = 5).

    Returns a float for 1-D ``y``, else an array of shape ``y.shape[:-1]``. NumPy on the host: not traced by
    JAX (``jit``, ``vmap``, ``grad``), not differentiated by torch autograd.
    """
    arr = np.asarray(y, dtype=float)
    if arr.ndim == 0 or arr.shape[-1] < 2:
        raise ValueError(f"y must have at least 2 values along its last axis, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError("y contains NaN or inf; DA needs finite performance values")
    L = arr.shape[-1]
    if weights is None:
        s = np.arange(1, L, dtype=float)
        s = s / s.sum()
    else:
        s = np.asarray(weights, dtype=float)
        if s.shape != (L - 1,):
            raise ValueError(f"weights must have length L-1 = {L - 1} for y of length {L}, "
                             f"got shape {s.shape}")
        if not np.all(np.isfinite(s)):
            raise ValueError("weights contains NaN or inf")
    step = np.diff(arr, axis=-1)
    score = np.sum(np.where(step >= 0, 1.0 + step / 10.0 * s, 0.0), axis=-1)
    return float(score) if score.ndim == 0 else score
