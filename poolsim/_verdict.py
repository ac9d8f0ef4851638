"""The one verdict rule: the implementation of :mod:`poolsim.verdict`, whose docstring states the rule."""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

HOLDS = "holds"
"""The whole interval lies on the claimed side of the threshold."""
DOES_NOT_HOLD = "does not hold"
"""The whole interval lies on the other side of the threshold."""
INCONCLUSIVE = "inconclusive"
"""The interval contains the threshold, or there are fewer than :data:`MIN_SEEDS` seeds."""
OUTCOMES = (HOLDS, DOES_NOT_HOLD, INCONCLUSIVE)
"""The three verdicts."""
MIN_SEEDS = 30
"""Fewest paired seeds for an interval; with fewer a claim is ``inconclusive`` and no interval is given."""
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
    return from_moments(est, float(d.std(ddof=1)), n, threshold=threshold, side=side,
                        min_seeds=min_seeds)


def from_moments(mean: float, sd: float, n: int, *, threshold: float = 0.0,
                 side: str = "greater", min_seeds: int = MIN_SEEDS) -> Verdict:
    """:func:`decide` from the paired differences' mean, standard deviation (ddof 1) and count
    instead of the values themselves (the rule is the same; used where the per-seed values are
    reduced on the fly, e.g. the decision map)."""
    if side not in SIDES:
        raise ValueError(f"side must be one of {SIDES}, got {side!r}")
    n = int(n)
    if n < min_seeds:
        return Verdict(INCONCLUSIVE, float(mean), math.nan, math.nan, n, float(threshold), side)
    lo, hi, verdict = decide_arrays(np.asarray(mean, float), np.asarray(sd, float), n,
                                    threshold=threshold, side=side)
    return Verdict(str(verdict), float(mean), float(lo), float(hi), n, float(threshold), side)


def decide_arrays(mean, sd, n: int, *, threshold=0.0, side: str = "greater"):
    """Vectorised :func:`from_moments` (``n >= MIN_SEEDS`` seeds for every entry):
    ``(ci_low, ci_high, verdict)`` arrays of ``mean``'s shape."""
    from scipy import stats

    mean, sd = np.asarray(mean, float), np.asarray(sd, float)
    half = stats.t.ppf(0.5 + LEVEL / 2, n - 1) * sd / math.sqrt(n)
    lo, hi = mean - half, mean + half
    above, below = lo > threshold, hi < threshold
    claimed = above if side == "greater" else below
    other = below if side == "greater" else above
    verdict = np.where(claimed, HOLDS, np.where(other, DOES_NOT_HOLD, INCONCLUSIVE))
    return lo, hi, verdict


def p_value(estimate, ci_low, ci_high, n_seeds, threshold=0.0):
    """Two-sided Student-t p-value of "mean difference = threshold", recovered from a verdict's
    95% interval (``half = t_{0.975, n-1} sd / sqrt(n)``): below 0.05 exactly when the interval
    excludes the threshold. NaN interval (fewer than MIN_SEEDS seeds): 1. A zero-width interval:
    0 when the estimate differs from the threshold, else 1. Vectorised."""
    from scipy import stats

    est, lo, hi = (np.asarray(v, float) for v in (estimate, ci_low, ci_high))
    n = np.asarray(n_seeds, float)
    thr = np.asarray(threshold, float)
    se = (hi - lo) / 2 / stats.t.ppf(0.5 + LEVEL / 2, np.maximum(n - 1, 1))
    gap = np.abs(est - thr)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(se > 0, gap / np.where(se > 0, se, 1.0), np.where(gap > 0, np.inf, 0.0))
    p = 2 * stats.t.sf(t, np.maximum(n - 1, 1))
    return np.where(np.isfinite(lo) & np.isfinite(hi), p, 1.0)


def holm(p) -> np.ndarray:
    """Holm's step-down adjusted p-values (family-wise error control; any dependence)."""
    p = np.asarray(p, float).ravel()
    m = p.size
    order = np.argsort(p, kind="stable")
    adj = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    out = np.empty(m)
    out[order] = adj
    return out


def benjamini_hochberg(p) -> np.ndarray:
    """Benjamini-Hochberg adjusted p-values (false discovery rate; ``scipy.stats.false_discovery_control``)."""
    from scipy import stats

    p = np.asarray(p, float).ravel()
    return stats.false_discovery_control(p, method="bh") if p.size else p


def adjusted_verdicts(estimate, threshold, side, p_adjusted, level: float = LEVEL):
    """Verdicts after a multiplicity adjustment: the claimed side (``holds``) or the other side
    (``does not hold``) where the adjusted p-value is below ``1 - level``, else ``inconclusive``.
    ``side`` "greater"/"less" per entry. Vectorised."""
    est, thr = np.asarray(estimate, float), np.asarray(threshold, float)
    greater = np.asarray(side) == "greater"
    sig = np.asarray(p_adjusted, float) < 1 - level
    claimed = np.where(greater, est > thr, est < thr)
    return np.where(sig & claimed, HOLDS, np.where(sig, DOES_NOT_HOLD, INCONCLUSIVE))


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
           "from_moments", "decide_arrays", "p_value", "holm", "benjamini_hochberg",
           "adjusted_verdicts", "all_of", "within", "no_counterexample", "fmt", "describe"]
