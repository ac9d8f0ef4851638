"""One rule for every verdict the project prints: ``holds`` / ``does not hold`` / ``inconclusive``.

A comparative claim ("matching is lowest", "subsampling blunts the spikes", "A beats B") is decided
on the PAIRED per-seed difference of the two quantities compared (same seed, same draws), never on
two separate intervals or on point estimates:

* ``estimate`` = mean of the differences, ``[ci_low, ci_high]`` = 95% Student-t interval
  (``scipy.stats.t``, n - 1 degrees of freedom);
* the claim is ``mean difference > threshold`` (``side="greater"``) or ``< threshold``
  (``side="less"``); it **holds** when the whole interval lies on the claimed side, **does not
  hold** when the whole interval lies on the other side, and is **inconclusive** when the
  interval contains the threshold or when there are fewer than :data:`MIN_SEEDS` seeds (then no
  interval is reported at all -- never a zero-width one).

A claim that a quantity clears a fixed threshold is only evidence when the baseline it is meant
to beat does not clear it too; callers then compare against the baseline (pass it as ``b``).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

HOLDS, DOES_NOT_HOLD, INCONCLUSIVE = "holds", "does not hold", "inconclusive"
OUTCOMES = (HOLDS, DOES_NOT_HOLD, INCONCLUSIVE)
MIN_SEEDS = 30  # fewer paired seeds than this: "inconclusive", no interval
LEVEL = 0.95
SIDES = ("greater", "less")


class Verdict(NamedTuple):
    """A decided claim. ``ci_low``/``ci_high`` are NaN when ``n_seeds < MIN_SEEDS``."""

    verdict: str
    estimate: float
    ci_low: float
    ci_high: float
    n_seeds: int
    threshold: float
    side: str  # "greater" / "less" than threshold; "zero": no counterexample (no_counterexample)


def decide(a, b=None, *, threshold: float = 0.0, side: str = "greater",
           min_seeds: int = MIN_SEEDS) -> Verdict:
    """Decide "mean of ``a - b`` is ``side`` than ``threshold``" on paired per-seed values.

    ``a``, ``b``: ``(S,)`` per-seed values of the compared quantities (``b=None``: ``a`` already
    holds the per-seed differences, or a single quantity compared with ``threshold``). Seeds where
    either value is not finite are dropped (pairwise). ``side``: "greater" or "less".
    """
    if side not in SIDES:
        raise ValueError(f"side must be one of {SIDES}, got {side!r}")
    if not isinstance(min_seeds, (int, np.integer)) or min_seeds < 2:
        raise ValueError(f"min_seeds must be an integer >= 2, got {min_seeds!r}")
    threshold = float(threshold)
    if not math.isfinite(threshold):
        raise ValueError(f"threshold must be finite, got {threshold!r}")
    a = np.asarray(a, dtype=float).ravel()
    if b is not None:
        b = np.asarray(b, dtype=float).ravel()
        if b.shape != a.shape:
            raise ValueError(f"a and b must be paired (same length), got {a.size} and {b.size}")
        a = a - b
    d = a[np.isfinite(a)]
    n = int(d.size)
    est = float(d.mean()) if n else math.nan
    if n < min_seeds:
        return Verdict(INCONCLUSIVE, est, math.nan, math.nan, n, threshold, side)
    from scipy import stats

    half = float(stats.t.ppf(0.5 + LEVEL / 2, n - 1) * d.std(ddof=1) / math.sqrt(n))
    lo, hi = est - half, est + half
    above, below = lo > threshold, hi < threshold
    if not (above or below):
        verdict = INCONCLUSIVE
    elif above == (side == "greater"):
        verdict = HOLDS
    else:
        verdict = DOES_NOT_HOLD
    return Verdict(verdict, est, lo, hi, n, threshold, side)


def all_of(parts) -> tuple[Verdict, int]:
    """Combine verdicts of a claim that needs every part: ``does not hold`` if any part does not
    hold, else ``inconclusive`` if any part is, else ``holds``. Returns ``(verdict, index)`` of
    the part that decides (the failing part; else the least decided one: the interval closest to
    its threshold on the wrong side)."""
    parts = list(parts)
    if not parts:
        raise ValueError("parts must hold at least one Verdict")

    def margin(v: Verdict) -> float:  # distance of the interval's near end past the threshold
        if math.isnan(v.ci_low):
            return -math.inf
        if v.side == "zero":  # no_counterexample: how far the share's interval stays from 0
            return -v.ci_high
        return v.ci_low - v.threshold if v.side == "greater" else v.threshold - v.ci_high

    for outcome in (DOES_NOT_HOLD, INCONCLUSIVE, HOLDS):
        idx = [i for i, v in enumerate(parts) if v.verdict == outcome]
        if idx:
            i = min(idx, key=lambda j: margin(parts[j]))
            return parts[i], i
    raise ValueError(f"unknown verdicts {[v.verdict for v in parts]}")  # pragma: no cover


def within(a, b=None, *, margin: float, min_seeds: int = MIN_SEEDS) -> Verdict:
    """Equivalence: "mean of ``a - b`` lies in ``(-margin, margin)``" (two one-sided decisions,
    combined with :func:`all_of`). Reported as the binding side."""
    if not margin > 0:
        raise ValueError(f"margin must be positive, got {margin!r}")
    v, _ = all_of([decide(a, b, threshold=margin, side="less", min_seeds=min_seeds),
                   decide(a, b, threshold=-margin, side="greater", min_seeds=min_seeds)])
    return v


def no_counterexample(violations, *, min_seeds: int = MIN_SEEDS) -> Verdict:
    """A deterministic "for every case" claim checked on each seed: ``violations (S,)`` counts the
    cases that break it per seed. Any violation: ``does not hold``; none in at least ``min_seeds``
    seeds: ``holds`` (no counterexample found). The estimate is the share of seeds with a
    violation and the interval its 95% Clopper-Pearson interval (``scipy.stats.binomtest``), so an
    all-clear run still reports how rare a failure could be (about 3/S), not a zero width.
    ``side`` is "zero" (the claim: no seed violates it)."""
    from scipy import stats

    v = np.asarray(violations, dtype=float).ravel()
    v = v[np.isfinite(v)]
    n = int(v.size)
    if n < min_seeds:
        k = int(np.sum(v > 0))
        return Verdict(INCONCLUSIVE, k / n if n else math.nan, math.nan, math.nan, n, 0.0, "zero")
    k = int(np.sum(v > 0))
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=LEVEL, method="exact")
    return Verdict(DOES_NOT_HOLD if k else HOLDS, k / n, float(ci.low), float(ci.high), n, 0.0,
                   "zero")


def fmt(v: Verdict, digits: int = 3) -> str:
    """``"holds: +0.12 [0.10, 0.14], 1000 seeds"`` (interval omitted when there is none)."""
    if math.isnan(v.ci_low):
        num = "n/a" if math.isnan(v.estimate) else f"{v.estimate:+.{digits}g}"
        return (f"{v.verdict}: {num}, {v.n_seeds} seed(s) (< {MIN_SEEDS}: no interval, "
                "no verdict)")
    return (f"{v.verdict}: {v.estimate:+.{digits}g} [{v.ci_low:+.{digits}g}, "
            f"{v.ci_high:+.{digits}g}], {v.n_seeds} seeds")


def describe(v: Verdict, unit: str = "") -> str:
    """``+0.12 (95% t-interval [-0.05, +0.29], 36 pairs) -> **inconclusive**`` (claim lines of adsim)."""
    ci = "no interval" if math.isnan(v.ci_low) else f"95% t-interval [{v.ci_low:+.3g}, {v.ci_high:+.3g}]"
    return f"{v.estimate:+.3g}{unit} ({ci}, {v.n_seeds} pairs) -> **{v.verdict}**"


__all__ = ["HOLDS", "DOES_NOT_HOLD", "INCONCLUSIVE", "OUTCOMES", "MIN_SEEDS", "Verdict", "decide",
           "all_of", "within", "no_counterexample", "fmt", "describe"]
