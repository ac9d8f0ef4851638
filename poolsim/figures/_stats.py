"""Small helpers shared by figure modules: seed-level summaries."""
from __future__ import annotations

import math
from typing import Any

import numpy as np


def ci95(values: Any) -> tuple[float, float, float]:
    """Mean and a 95% Student-t interval over seeds (``scipy.stats.t``); width 0 for one seed.
    NaN entries are ignored."""
    from scipy import stats

    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return math.nan, math.nan, math.nan
    m = float(v.mean())
    if v.size < 2:
        return m, m, m
    h = float(stats.t.ppf(0.975, v.size - 1) * v.std(ddof=1) / math.sqrt(v.size))
    return m, m - h, m + h


def fmt(m: float, lo: float, hi: float, digits: int = 3) -> str:
    """``"m [lo, hi]"`` for markdown tables."""
    return f"{m:.{digits}g} [{lo:.{digits}g}, {hi:.{digits}g}]"
