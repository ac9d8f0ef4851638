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

from ._verdict import (
    HOLDS as HOLDS,
    DOES_NOT_HOLD as DOES_NOT_HOLD,
    INCONCLUSIVE as INCONCLUSIVE,
    OUTCOMES as OUTCOMES,
    MIN_SEEDS as MIN_SEEDS,
    Verdict as Verdict,
    decide as decide,
    from_moments as from_moments,
    decide_arrays as decide_arrays,
    p_value as p_value,
    holm as holm,
    benjamini_hochberg as benjamini_hochberg,
    adjusted_verdicts as adjusted_verdicts,
    all_of as all_of,
    within as within,
    no_counterexample as no_counterexample,
    fmt as fmt,
    describe as describe,
)

__all__ = ["HOLDS", "DOES_NOT_HOLD", "INCONCLUSIVE", "OUTCOMES", "MIN_SEEDS", "Verdict", "decide", "from_moments",
           "decide_arrays", "p_value", "holm", "benjamini_hochberg", "adjusted_verdicts", "all_of",
           "within", "no_counterexample", "fmt", "describe"]
