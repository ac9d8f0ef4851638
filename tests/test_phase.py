"""The decision map (``poolsim._phase``, figure ``phase``): the map's engine
against the experiments API, its verdicts against the committed figures, the monotone structure
theory implies, the multiplicity adjustments."""
import math
import pathlib

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st
from scipy import stats

from poolsim import _phase, _verdict, experiments
from poolsim._reference import ref_match
from poolsim.figures import _data
from poolsim.testing import examples

ROOT = pathlib.Path(__file__).resolve().parents[1]
S = 300  # seeds per check below: enough to decide the paper points (effects ~0.2, sd ~0.15)


def _eps_frame(name, **kw):
    # chunk S // 2: two full chunks (the default, one chunk of 1,024, would run 724 padding seeds)
    df = experiments.run(name, seeds=S, chunk=S // 2, materialize=False, dtype="float32", **kw)
    return {s: g["eps"].to_numpy() for s, g in df.groupby("strategy")}


@pytest.fixture(scope="module")
def paper_cells():
    """The map's engine at the two paper points (one K, one n, one tau each)."""
    out = {}
    for law, share, shift, K, n, tau in (("contaminated", 0.3, 1.5, 50, 150, 1.2),
                                         ("outlier_schedule", 12 / 36, 2.5, 30, 100, 1.1)):
        spec = _phase.GridSpec(law, (K,), (n,), (tau,))
        m = _phase.run_grid(spec, [share], [shift], seeds=S)
        out[law] = _phase.Moments(m.sums[0, 0, 0, 0], m.gram[0, 0, 0, 0], m.n, m.aux[0, 0, 0, 0])
    return out


@pytest.mark.slow
@pytest.mark.parametrize("law, name, K", [("contaminated", "asymptotic", 50),
                                          ("outlier_schedule", "domain_addition", 30)])
def test_map_engine_simulates_the_experiments_model(paper_cells, law, name, K):
    # Same model, independent random streams: the map's mean eps of each strategy must match the
    # experiments API (materialize=False: the same median-of-domain-means start) within 4
    # standard errors of the difference of two independent means (S seeds each).
    ref = _eps_frame(name, Ks=(K,))
    m = paper_cells[law]
    for i, s in enumerate(("pool", "subsample", "match")):
        mine, se_mine = m.mean(i), math.sqrt(m.var(i) / m.n)
        theirs, se_theirs = ref[s].mean(), ref[s].std(ddof=1) / math.sqrt(S)
        assert abs(mine - theirs) < 4 * math.hypot(se_mine, se_theirs), (s, mine, theirs)


@pytest.mark.slow
def test_paper_points_agree_with_the_committed_verdicts(paper_cells):
    # The committed figures decide "matching has the lowest eps" at these points (verdicts.csv:
    # asymptotic, K=50, and domain_addition, K=30); the map's engine must decide the pooling
    # comparison the same way on its own seeds, and so must the committed phase.csv's cells.
    v = pd.read_csv(ROOT / "figures" / "verdicts.csv")
    committed = {
        "contaminated": v[(v.figure == "asymptotic")
                          & (v.claim == "matching's eps_K is the lowest at K=50")].verdict.item(),
        "outlier_schedule": v[(v.figure == "domain_addition")
                              & (v.claim == "matching has the smallest final error (K=30)")].verdict.item()}
    phase = pd.read_csv(ROOT / "figures" / "phase.csv")
    for law, m in paper_cells.items():
        e, var = m.paired(0, 2)
        assert _verdict.from_moments(e, math.sqrt(var), m.n).verdict == committed[law] == "holds"
        from poolsim.figures import phase as fig

        p, a, K, n = fig.LAWS[law]["paper"]
        cell = phase[(phase.law == law) & (phase.K == K) & (phase.n == n)
                     & np.isclose(phase.share, p) & np.isclose(phase["shift"], a)]
        assert cell.pool_minus_match_verdict.item() == committed[law]
        assert cell.pool_minus_match_verdict_bh.item() == committed[law]


def test_outlier_share_reproduces_every_third_domain():
    # j / 36 = 1 / every marks exactly the domains k % every == 0 (outlier_schedule's rule).
    k = np.arange(1, 61)
    for every in (2, 3, 4, 6, 9, 12, 18, 36):
        j = 36 // every
        beatty = (k * j) // 36 > ((k - 1) * j) // 36
        np.testing.assert_array_equal(beatty, k % every == 0)


# Where theory implies monotonicity (ours, from the Corollary and Thm 1's pooled bias): with
# alpha >= tau + 4 gamma (= 3.2 here) every outlier lies beyond the Corollary's safe-exclusion
# radius eps_K + tau of a centroid started among the inliers (p <= 0.4: the median is an inlier),
# so matching's error is that of the inliers' mean and grows with p only through the shrinking
# inlier count (~ gamma / sqrt(K (1 - p))), while pooling's bias p alpha grows at rate alpha. So
# E[eps(pool) - eps(match)] is non-decreasing in p there. At small alpha nothing is implied (the
# outliers are partly matched) and nothing is tested.
SPEC_MONO = _phase.GridSpec("contaminated", (30,), (100,), (1.2,))


@pytest.mark.slow
@settings(max_examples=examples(6), deadline=None)
@given(p1=st.floats(0.0, 0.35), dp=st.floats(0.03, 0.1), alpha=st.floats(3.2, 5.0))
def test_more_contamination_never_helps_pooling_when_outliers_are_far(p1, dp, alpha):
    m = _phase.run_grid(SPEC_MONO, [p1, min(p1 + dp, 0.4)], [alpha], seeds=200)
    mom = _phase.Moments(m.sums[0, 0, :, 0], m.gram[0, 0, :, 0], m.n, m.aux[0, 0, :, 0])
    d, var = mom.paired(0, 2)
    se = np.sqrt(var / m.n)
    # 4 standard errors of the two cells' means (their covariance ignored: se1 + se2 bounds it)
    assert d[1] - d[0] >= -4 * (se[0] + se[1]), (d, se)


def test_grid_rejects_bad_input():
    spec = _phase.GridSpec("contaminated", (10,), (50,), (1.0,))
    with pytest.raises(ValueError, match="shares"):
        _phase.run_grid(spec, [1.5], [1.0], seeds=2)
    with pytest.raises(ValueError, match="shifts"):
        _phase.run_grid(spec, [0.1], [-1.0], seeds=2)
    with pytest.raises(ValueError, match="law"):
        _phase.run_grid(spec._replace(law="x"), [0.1], [1.0], seeds=2)
    with pytest.raises(ValueError, match="multiples of 1/36"):
        _phase.run_grid(spec._replace(law="outlier_schedule"), [0.3], [1.0], seeds=2)
    with pytest.raises(ValueError, match="seeds"):
        _phase.run_grid(spec, [0.1], [1.0], seeds=0)


# --- multiplicity ------------------------------------------------------------------------------

def test_p_value_agrees_with_the_interval_rule(rng):
    # p < 0.05 exactly when decide_claim's 95% interval excludes the threshold (same t law).
    for shift in np.linspace(-0.3, 0.3, 25):
        x = rng.normal(shift, 1.0, 60)
        v = _verdict.decide(x, threshold=0.05)
        p = _verdict.p_value(v.estimate, v.ci_low, v.ci_high, v.n_seeds, v.threshold)
        ref = stats.ttest_1samp(x, 0.05).pvalue  # scipy's one-sample t-test
        np.testing.assert_allclose(p, ref, rtol=1e-8)
        assert (p < 0.05) == (v.verdict != _verdict.INCONCLUSIVE)


def test_holm_and_bh_against_hand_computed_values():
    p = np.array([0.01, 0.04, 0.03, 0.005])
    # Holm: sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 -> 0.02, 0.03, 0.06, 0.04 -> running
    # max 0.02, 0.03, 0.06, 0.06; back in input order:
    np.testing.assert_allclose(_verdict.holm(p), [0.03, 0.06, 0.06, 0.02])
    # BH: p_(i) m / i = 0.02, 0.02, 0.04, 0.04 (min from the top) -> input order:
    np.testing.assert_allclose(_verdict.benjamini_hochberg(p), [0.02, 0.04, 0.04, 0.02])
    v = _verdict.adjusted_verdicts([1.0, -1.0, 1.0, 1.0], 0.0, ["greater", "greater", "less",
                                                                "greater"], [0.01, 0.01, 0.01, 0.2])
    assert v.tolist() == ["holds", "does not hold", "does not hold", "inconclusive"]


def test_from_moments_is_decide(rng):
    x = rng.normal(0.1, 1.0, 80)
    assert _verdict.from_moments(x.mean(), x.std(ddof=1), x.size) == _verdict.decide(x)
    assert _verdict.from_moments(0.3, 1.0, 10).verdict == "inconclusive"


def test_holm_column_keeps_deterministic_claims_and_only_weakens_verdicts():
    rows = [dict(figure="f", claim=f"c{i}", verdict=v, estimate=e, ci_low=lo, ci_high=hi,
                 n_seeds=100, threshold=0.0, side=side, compared="x", source="ours", note="")
            for i, (v, e, lo, hi, side) in enumerate([
                ("holds", 0.5, 0.4, 0.6, "greater"),
                ("holds", 0.05, 0.001, 0.099, "greater"),  # p just below 0.05: Holm undoes it
                ("does not hold", 0.02, 0.0, 0.05, "zero"),
                ("inconclusive", 0.0, -0.1, 0.1, "less")])]
    t = _data.with_holm(pd.DataFrame(rows))
    assert t[_data.HOLM_COLUMN].tolist() == ["holds", "inconclusive", "does not hold",
                                             "inconclusive"]


def test_committed_verdicts_have_the_holm_column_and_summary_table():
    v = pd.read_csv(ROOT / "figures" / "verdicts.csv")
    assert _data.HOLM_COLUMN in v.columns
    assert set(v[_data.HOLM_COLUMN]) <= set(_verdict.OUTCOMES)
    # Holm never decides what the per-claim rule left open
    assert not ((v.verdict == "inconclusive") & (v[_data.HOLM_COLUMN] != "inconclusive")).any()
    summary = (ROOT / "figures" / "summary.md").read_text()
    assert "| figure | claim | per-claim verdict | Holm-adjusted |" in summary


def test_committed_map_is_complete_and_nearly_decided():
    phase = pd.read_csv(ROOT / "figures" / "phase.csv")
    assert len(phase) >= 400 and (phase.n_seeds >= 1000).all()
    for col in ("share", "shift", "K", "n", "pool_minus_match", "pool_minus_match_ci_low",
                "pool_minus_match_ci_high", "pool_minus_match_verdict",
                "pool_minus_match_verdict_bh", "tau_best", "rule_plugin_regret"):
        assert phase[col].notna().all(), col
    assert (phase.pool_minus_match_verdict_bh != "inconclusive").mean() > 0.8


# --- the CLI: optional figures ------------------------------------------------------------------

def _fake(name, value=1.0):
    import types

    from poolsim import decide_claim

    def compute(*, seeds, quick, progress=None):
        df = pd.DataFrame({"panel": ["p"], "mean": [value], "n_seeds": [seeds]})
        return _data.set_verdicts(df, [_data.claim(name, f"{name} is positive",
                                                   decide_claim(np.full(seeds, value)), "x")])

    def plot(df):
        import matplotlib.pyplot as plt
        return plt.figure()

    return types.SimpleNamespace(NAME=name, compute=compute, plot=plot,
                                 summarize=lambda df: f"## {name} -- fake\n\nvalue {value}\n")


def test_default_run_skips_optional_figures_and_keeps_their_results(tmp_path, monkeypatch):
    import poolsim.figures as figs
    from poolsim.figures import __main__ as cli

    mods = {"first": _fake("first"), "phase": _fake("phase", -1.0)}
    monkeypatch.setattr(figs, "available", lambda: tuple(mods))
    monkeypatch.setattr(figs, "load", mods.__getitem__)
    monkeypatch.setenv("XLA_FLAGS", "")
    out = tmp_path / "out"
    assert cli.main(["--out", str(out), "--format", "png", "--seeds", "40", "--all"]) == 0
    assert (out / "phase.png").is_file()
    (out / "phase.png").unlink()
    assert cli.main(["--out", str(out), "--format", "png", "--seeds", "40"]) == 0
    assert not (out / "phase.png").exists()  # the default run does not make it ...
    v = pd.read_csv(out / "verdicts.csv")  # ... but keeps its verdict row and section
    assert v.figure.tolist() == ["first", "phase"]
    assert v[_data.HOLM_COLUMN].tolist() == ["holds", "does not hold"]
    assert "## phase -- fake" in (out / "summary.md").read_text()
    with pytest.raises(SystemExit):
        cli.main(["--all", "--only", "first"])


def test_grid_rejects_bad_spec():
    spec = _phase.GridSpec("contaminated", (10,), (50,), (1.0,))
    for bad, msg in ((dict(taus=(0.0,)), "taus"), (dict(sigma=-1.0), "sigma"),
                     (dict(gamma=math.nan), "gamma"), (dict(Ks=(10, 5)), "Ks"), (dict(ns=(0,)), "ns")):
        with pytest.raises(ValueError, match=msg):
            _phase.run_grid(spec._replace(**bad), [0.1], [1.0], seeds=2)


@pytest.mark.slow
def test_on_the_fly_reduction_equals_per_seed_values_and_decide():
    # One seed at a time, the sums ARE that seed's values; their sums, cross-products and the
    # verdict decide_claim draws from them must equal the chunked, padded (40 = 16 + 16 + 8 seeds)
    # run's reduced statistics and from_moments' verdict (float64 arithmetic: tight tolerance).
    spec = _phase.GridSpec("contaminated", (10,), (20,), (0.8, 1.6))
    shares, shifts = [0.1, 0.3], [1.0, 2.5]
    per_seed = np.stack([_phase.run_grid(spec, shares, shifts, seeds=[s]).sums
                         for s in range(40)])  # (40, 1, 1, P, A, V)
    m = _phase.run_grid(spec, shares, shifts, seeds=40)
    np.testing.assert_allclose(m.sums, per_seed.sum(0), rtol=1e-6)
    np.testing.assert_allclose(m.gram, np.einsum("s...v,s...w->...vw", per_seed, per_seed),
                               rtol=1e-6)
    v = per_seed[:, 0, 0, 1, 1]  # cell p = 0.3, alpha = 2.5: (40, V)
    ref = _verdict.decide(v[:, 0], v[:, 2])  # pooling vs matching at tau = 0.8
    e, var = _phase.Moments(m.sums[0, 0, 1, 1], m.gram[0, 0, 1, 1], m.n, m.aux).paired(0, 2)
    got = _verdict.from_moments(e, math.sqrt(var), m.n)
    assert got.verdict == ref.verdict
    np.testing.assert_allclose([got.estimate, got.ci_low, got.ci_high],
                               [ref.estimate, ref.ci_low, ref.ci_high], rtol=1e-6)


@pytest.mark.slow
def test_plot_and_summary_render_from_the_committed_csv():
    from poolsim.figures import phase as fig

    df = pd.read_csv(ROOT / "figures" / "phase.csv")
    text = fig.summarize(_data.set_verdicts(df, fig.claims(df)))
    assert "## phase -- " in text and "Benjamini-Hochberg" in text
    figure = fig.plot(df)
    assert len(figure.axes) >= 12
    import matplotlib.pyplot as plt
    plt.close(figure)


def test_thm1_limit_iterates_only_moving_cells_with_the_same_numbers(monkeypatch):
    # limit_eps skips cells whose last step was exactly zero; the reference below iterates every
    # cell until the largest step is below 1e-10 (the fixed-point iteration of
    # theory.match_limit on the same quadrature draws): the results must be identical, bit for bit.
    from poolsim.figures import phase as fig

    monkeypatch.setattr(fig, "QUAD", 3000)
    cfg = dict(shares=np.array([0.0, 0.1, 0.3]), shifts=np.array([0.0, 1.0, 2.5, 4.0]), tau=1.2)
    n, sigma, gamma = 50, 0.8, 0.5
    rng = np.random.default_rng(0)
    z, u, e, es = (rng.standard_normal((3000, 2)), rng.random(3000), rng.standard_normal((3000, 2)),
                   rng.standard_normal((3000, 2)))
    p, a = cfg["shares"][:, None, None], cfg["shifts"][None, :, None]
    shift = (u < p) * a
    x0 = gamma * z[:, 0] + shift + sigma / math.sqrt(n) * e[:, 0]
    x1 = np.broadcast_to(gamma * z[:, 1] + sigma / math.sqrt(n) * e[:, 1], x0.shape)
    c0 = np.median(gamma * z[:, 0] + shift + sigma * es[:, 0], axis=-1)
    c1 = np.broadcast_to(np.median(gamma * z[:, 1] + sigma * es[:, 1]), c0.shape)
    for _ in range(200):
        w = ((x0 - c0[..., None]) ** 2 + (x1 - c1[..., None]) ** 2) < 1.2 ** 2
        tot = w.sum(-1)
        n0 = np.where(tot > 0, (w * x0).sum(-1) / np.maximum(tot, 1), c0)
        n1 = np.where(tot > 0, (w * x1).sum(-1) / np.maximum(tot, 1), c1)
        moved = np.hypot(n0 - c0, n1 - c1).max()
        c0, c1 = n0, n1
        if moved < 1e-10:
            break
    got = fig.limit_eps(cfg, n)
    np.testing.assert_array_equal(got[..., 0], np.hypot(c0, c1))
    np.testing.assert_array_equal(got[..., 1], (p * a)[..., 0] * np.ones_like(c0))


@pytest.mark.parametrize("stages", [0, pytest.param(_phase.STAGES, marks=pytest.mark.slow)])
def test_compacted_matching_equals_the_loop_reference(rng, stages):
    # The map's batched matching (rows still moving gathered into smaller batches, `stages` times)
    # against poolsim._reference.ref_match (Def. 3 with Python loops, float64), row by row: the
    # same matched-domain count and the centroid within float32 rounding of the domain means.
    import jax

    K, R0, T = 12, 150, 3
    means = rng.normal(0.0, 1.0, (R0, K, 2)) + (rng.random((R0, K, 1)) < 0.3) * np.array([2.5, 0.0])
    start = np.median(means, axis=1)
    taus = rng.uniform(0.4, 2.0, (T, R0))
    spec = _phase.GridSpec("contaminated", (K,), (50,), (1.0,))
    xs = tuple(np.float32(means[..., i]) for i in range(2))
    c, cnt = jax.jit(lambda xs, c0, tau: _phase._match(xs, c0, tau, spec, stages))(
        xs, np.float32(start), np.float32(taus))
    for t in range(T):
        for r in range(R0):
            x32 = np.float64(np.float32(means[r]))[:, None, :]  # (K, 1 sample, d)
            ref_c, inc, _, _ = ref_match(x32, float(np.float32(taus[t, r])), init=start[r].astype(np.float32))
            assert int(cnt[t, r]) == sum(inc), (t, r)
            np.testing.assert_allclose(np.asarray(c[t, r]), ref_c, atol=2e-6)
