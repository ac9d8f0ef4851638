"""The verdict rule (poolsim._verdict.decide) on constructed inputs whose answer is known."""
import math

import numpy as np
import pytest
from scipy import stats

from poolsim import _verdict as verdict
from poolsim import decide_claim


def _shifted_noise(n, mean, sd=1.0, seed=0):
    """``n`` values with EXACTLY the given sample mean and sample sd (ddof=1), so the t interval
    is known in closed form: mean +- t_{0.975, n-1} sd / sqrt(n)."""
    z = np.random.default_rng(seed).normal(size=n)
    z = (z - z.mean()) / z.std(ddof=1)
    return mean + sd * z


def test_interval_is_the_student_t_interval_of_the_paired_differences():
    n = 100
    a = _shifted_noise(n, 0.5, sd=2.0, seed=1)
    b = np.random.default_rng(2).normal(size=n) * 10  # large common part: cancels in a - b
    v = decide_claim(a + b, b, threshold=0.0)
    half = stats.t.ppf(0.975, n - 1) * 2.0 / math.sqrt(n)  # closed form, = 0.3968...
    assert v.n_seeds == n and v.threshold == 0.0 and v.side == "greater"
    assert v.estimate == pytest.approx(0.5, abs=1e-12)
    assert (v.ci_low, v.ci_high) == pytest.approx((0.5 - half, 0.5 + half), abs=1e-12)
    assert v.verdict == verdict.HOLDS  # interval [0.10, 0.90] lies above 0


def test_pairing_matters_unpaired_intervals_would_overlap():
    # a and b share a per-seed term with sd 10; a exceeds b by 0.5 +- 0.1 on every seed. Separate
    # intervals of a and b (half-width ~2 each) overlap; the paired difference decides.
    n = 200
    common = np.random.default_rng(3).normal(size=n) * 10
    a = common + _shifted_noise(n, 0.5, sd=0.1, seed=4)
    v = decide_claim(a, common, threshold=0.0)
    assert v.verdict == verdict.HOLDS and v.ci_low > 0.45


@pytest.mark.parametrize("mean, side, want", [
    (0.5, "greater", verdict.HOLDS), (-0.5, "greater", verdict.DOES_NOT_HOLD),
    (-0.5, "less", verdict.HOLDS), (0.5, "less", verdict.DOES_NOT_HOLD),
    (0.05, "greater", verdict.INCONCLUSIVE), (0.05, "less", verdict.INCONCLUSIVE)])
def test_three_outcomes(mean, side, want):
    # n = 100, sd 1: half-width t_{.975,99}/10 = 0.198, so |mean| = 0.5 is decided, 0.05 is not
    v = decide_claim(_shifted_noise(100, mean), threshold=0.0, side=side)
    assert v.verdict == want


def test_threshold_shifts_the_decision():
    d = _shifted_noise(100, 0.5)  # interval [0.30, 0.70]
    assert decide_claim(d, threshold=0.2).verdict == verdict.HOLDS
    assert decide_claim(d, threshold=0.5).verdict == verdict.INCONCLUSIVE
    assert decide_claim(d, threshold=0.8).verdict == verdict.DOES_NOT_HOLD


@pytest.mark.parametrize("n", [1, 2, 10, 29])
def test_few_seeds_are_inconclusive_without_an_interval(n):
    # a huge, noiseless effect: still no verdict below MIN_SEEDS = 30 seeds
    v = decide_claim(np.full(n, 5.0), threshold=0.0)
    assert v.verdict == verdict.INCONCLUSIVE
    assert math.isnan(v.ci_low) and math.isnan(v.ci_high) and v.n_seeds == n
    assert "no interval" in verdict.fmt(v)


def test_exactly_min_seeds_is_decided():
    v = decide_claim(_shifted_noise(verdict.MIN_SEEDS, 3.0), threshold=0.0)
    assert v.verdict == verdict.HOLDS and v.n_seeds == 30


def test_non_finite_pairs_are_dropped_pairwise():
    a = _shifted_noise(40, 1.0)
    b = np.zeros(40)
    a[:5] = np.nan
    b[5:8] = np.inf
    v = decide_claim(a, b)
    assert v.n_seeds == 32 and v.verdict == verdict.HOLDS
    assert decide_claim([np.nan] * 40).verdict == verdict.INCONCLUSIVE


def test_bad_arguments_raise_naming_them():
    with pytest.raises(ValueError, match="side"):
        decide_claim(np.ones(40), side="bigger")
    with pytest.raises(ValueError, match="paired"):
        decide_claim(np.ones(40), np.ones(39))
    with pytest.raises(ValueError, match="threshold"):
        decide_claim(np.ones(40), threshold=float("nan"))
    with pytest.raises(ValueError, match="min_seeds"):
        decide_claim(np.ones(40), min_seeds=1)


def test_fmt_shows_interval_and_seeds():
    v = decide_claim(_shifted_noise(100, 0.5))
    assert verdict.fmt(v).startswith("holds: +0.5 [+0.302, +0.698], 100 seeds")


def test_no_counterexample_uses_clopper_pearson_and_any_violation_decides():
    v = verdict.no_counterexample(np.zeros(100))
    # Clopper-Pearson upper bound for 0 of 100: 1 - 0.025^(1/100) = 0.0362 (closed form)
    assert v.verdict == verdict.HOLDS and v.ci_low == 0.0
    assert v.ci_high == pytest.approx(1 - 0.025 ** (1 / 100), rel=1e-9)
    w = np.zeros(100)
    w[7] = 2
    assert verdict.no_counterexample(w).verdict == verdict.DOES_NOT_HOLD
    assert verdict.no_counterexample(np.zeros(29)).verdict == verdict.INCONCLUSIVE


def test_all_of_reports_the_deciding_part():
    good = decide_claim(_shifted_noise(100, 0.5))
    weak = decide_claim(_shifted_noise(100, 0.3))
    bad = decide_claim(_shifted_noise(100, -0.5))
    undecided = decide_claim(_shifted_noise(100, 0.05))
    assert verdict.all_of([good, weak]) == (weak, 1)  # both hold: the weaker one is reported
    assert verdict.all_of([good, undecided, weak])[0].verdict == verdict.INCONCLUSIVE
    assert verdict.all_of([good, undecided, bad]) == (bad, 2)


def test_within_is_two_one_sided_decisions():
    assert verdict.within(_shifted_noise(100, 0.0, sd=0.1), margin=0.1).verdict == verdict.HOLDS
    assert verdict.within(_shifted_noise(100, 0.5, sd=0.1), margin=0.1).verdict == verdict.DOES_NOT_HOLD
    assert verdict.within(_shifted_noise(100, 0.1, sd=1.0), margin=0.1).verdict == verdict.INCONCLUSIVE
    with pytest.raises(ValueError, match="margin"):
        verdict.within(np.zeros(40), margin=0)
