"""Verdicts for the adsim claim lines: ``holds`` / ``does not hold`` / ``inconclusive``.

PRIVATE stand-in for the project-wide verdict rule that poolsim is getting (same rule, same names:
``decide(a, b, threshold=, side=)``); the lead unifies the two when merging. A claim "mean of
``a - b`` is ``side`` of ``threshold``" is decided on the paired differences (same seed, same cell):
95% Student-t interval (``scipy.stats.t``, n - 1 degrees of freedom); **holds** when the whole
interval is on the claimed side, **does not hold** when it is wholly on the other side,
**inconclusive** when it contains the threshold or when there are fewer than ``MIN_PAIRS`` pairs.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from scipy import stats

HOLDS, DOES_NOT_HOLD, INCONCLUSIVE = "holds", "does not hold", "inconclusive"
MIN_PAIRS = 30
SIDES = ("greater", "less")


class Verdict(NamedTuple):
    verdict: str
    estimate: float   # mean paired difference (or mean of ``a``)
    ci_low: float     # 95% Student-t interval; NaN with fewer than ``min_pairs`` pairs
    ci_high: float
    n: int
    threshold: float
    side: str


def decide(a, b=None, *, threshold: float = 0.0, side: str = "greater", min_pairs: int = MIN_PAIRS) -> Verdict:
    """``a``, ``b``: paired ``(n,)`` values (``b=None``: ``a`` alone against ``threshold``)."""
    if side not in SIDES:
        raise ValueError(f"side must be one of {SIDES}, got {side!r}")
    a = np.asarray(a, dtype=float).ravel()
    if b is not None:
        b = np.asarray(b, dtype=float).ravel()
        if b.shape != a.shape:
            raise ValueError(f"a and b must be paired (same length), got {a.size} and {b.size}")
        a = a - b
    d = a[np.isfinite(a)]
    n = int(d.size)
    est = float(d.mean()) if n else math.nan
    if n < max(min_pairs, 2):
        return Verdict(INCONCLUSIVE, est, math.nan, math.nan, n, float(threshold), side)
    sd = float(d.std(ddof=1))
    half = float(stats.t.ppf(0.975, n - 1)) * sd / math.sqrt(n)
    lo, hi = est - half, est + half
    if lo > threshold:
        v = HOLDS if side == "greater" else DOES_NOT_HOLD
    elif hi < threshold:
        v = HOLDS if side == "less" else DOES_NOT_HOLD
    else:
        v = INCONCLUSIVE
    return Verdict(v, est, lo, hi, n, float(threshold), side)


def describe(v: Verdict, unit: str = "") -> str:
    """``+0.12 [−0.05, +0.29] (36 pairs) -> **inconclusive**``."""
    ci = "no interval" if math.isnan(v.ci_low) else f"95% t-interval [{v.ci_low:+.3g}, {v.ci_high:+.3g}]"
    return f"{v.estimate:+.3g}{unit} ({ci}, {v.n} pairs) -> **{v.verdict}**"
