"""The claims module (poolsim/figures/_claims.py): the declared ranges and readings are pinned to a
literal table (they were fixed before the sweep's results were read), the robustness rule is
checked on constructed inputs whose answer is known, and the readings that existing verdict rows
use reproduce those rows exactly."""
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from poolsim import _verdict, experiments
from poolsim.figures import _claims, _data, asymptotic, domain_addition, symmetric

ROOT = Path(__file__).resolve().parents[1]

# (experiment, parameter, values, default): the declaration committed before the sweep ran
RANGES = [
    ("asymptotic", "gamma", (0.25, 0.5, 0.75, 1.0, 1.25, 1.5), 0.5),
    ("asymptotic", "p", (0.1, 0.2, 0.3, 0.4), 0.3),
    ("asymptotic", "tau", (1.0, 1.1, 1.2), 1.2),
    ("asymptotic", "m_frac", (0.25, 0.5, 0.75), 0.5),
    ("asymptotic", "n_sub", (5, 10, 20), 10),
    ("domain_addition", "gamma", (0.25, 0.5, 0.75, 1.0), 0.5),
    ("domain_addition", "jitter", (0.0, 0.2, 0.5), 0.2),
    ("domain_addition", "tau", (1.0, 1.1, 1.2), 1.1),
    ("domain_addition", "m_frac", (0.25, 0.5, 0.75), 0.5),
    ("domain_addition", "n_sub", (5, 10, 20), 10),
    ("symmetric", "m_frac", (0.25, 0.5, 0.75), 0.5),
    ("symmetric", "n_sub", (5, 10, 20), 10),
]
# (claim id, existing row's reading, [(reading, headline)])
READINGS = [
    ("asymptotic.lowest", "eps at K=50", [("eps at K=50", True), ("squared error at K=50", False)]),
    ("asymptotic.fastest", "eps_5 - eps_50", [("eps_5 - eps_50", True), ("relative decrease", False)]),
    ("asymptotic.largest", "eps at K=50", [("mean eps over the K grid", True), ("eps at K=50", False),
                                           ("squared error at K=50", False)]),
    ("domain_addition.theta1", "last vs first arrival step", [("last vs first arrival step", True)]),
    ("domain_addition.blunts", "largest step over all K", [("mean step at outlier arrivals", True),
                                                           ("largest step over all K", False)]),
    ("domain_addition.final", "eps at K=30", [("eps at K=30", True), ("squared error at K=30", False)]),
    ("domain_addition.stable", "largest step", [("largest step", True), ("mean absolute step", False)]),
    ("domain_addition.often", "fraction of steps <= 0", [("fraction of steps <= 0", True)]),
    ("symmetric.unbiased.balanced", "every coordinate within 0.1 gamma",
     [("every coordinate within 0.1 gamma", True)]),
    ("symmetric.unbiased.gaussian", "every coordinate within 0.1 gamma",
     [("every coordinate within 0.1 gamma", True)]),
    ("symmetric.negligible.balanced", "eps below 0.1 gamma", [("eps below 0.1 gamma", True)]),
    ("symmetric.negligible.gaussian", "eps below 0.1 gamma", [("eps below 0.1 gamma", True)]),
]
PAPER_WORDS = ("paper", "Def.", "Sec.", "Fig.", "Example", "Thm", "Omega", "sentence")


def test_declared_ranges_are_the_pinned_table_with_paper_based_reasons():
    got = [(r.experiment, r.parameter, r.values, r.default) for r in _claims.RANGES]
    assert got == RANGES
    for r in _claims.RANGES:
        assert r.default in r.values and list(r.values) == sorted(r.values)
        assert len(r.why) > 40 and any(w in r.why for w in PAPER_WORDS), r
        # the default is the experiment's own default (poolsim.experiments), not a new set-up
        P, _ = experiments.resolve(r.experiment, {})
        assert P[r.parameter] == r.default
    assert _claims.MAPS == (("asymptotic", "gamma", "p"), ("domain_addition", "gamma", "jitter"))


def test_declared_readings_are_the_pinned_table_one_headline_each():
    got = [(c.id, c.existing, [(r.label, r.headline) for r in c.readings]) for c in _claims.CLAIMS]
    assert got == READINGS
    for c in _claims.CLAIMS:
        assert sum(r.headline for r in c.readings) == 1
        assert all(len(r.why) > 20 and r.compared for r in c.readings)
        assert all((c.id, r.label) in _claims.MEASURES for r in c.readings)
    assert "agrees with the paper plays no part" in _claims.HEADLINE_RULE


def test_every_figure_is_swept_or_says_why_not():
    from poolsim.figures import available

    swept = {c.figure for c in _claims.CLAIMS}
    assert swept == {"asymptotic", "domain_addition", "symmetric"} == {r.experiment for r in _claims.RANGES}
    assert set(available()) - {"sensitivity"} == swept | set(_claims.NOT_SWEPT_WHY)
    assert not swept & set(_claims.NOT_SWEPT_WHY)


def test_declared_claims_and_illustrations_match_the_committed_rows():
    table = pd.read_csv(ROOT / "figures" / "verdicts.csv")
    for c in _claims.CLAIMS:  # each existing row is found by its exact text
        assert ((table.figure == c.figure) & (table.claim == c.text)).sum() == 1, c.text
    kinds = [_claims.kind(f, t) for f, t in zip(table.figure, table.claim)]
    # the rows that cannot fail: synthetic_intro's set-up and flow_bridge's certified bound (3 set-ups)
    assert kinds.count(_claims.KIND_ILLUSTRATION) == 4
    for i in _claims.ILLUSTRATIONS:
        assert any(f == i.figure and t.startswith(i.prefix) for f, t in zip(table.figure, table.claim))


def _sweep(verdicts, design="one at a time", parameter="gamma", values=None):
    values = values if values is not None else [0.25, 0.5, 0.75, 1.0][:len(verdicts)]
    return pd.DataFrame(dict(design=design, parameter=parameter, value=values, verdict=verdicts))


def test_classify_on_constructed_sweeps():
    H, N, I = _verdict.HOLDS, _verdict.DOES_NOT_HOLD, _verdict.INCONCLUSIVE
    assert _claims.classify(_sweep([H, H, H])) == "robust"
    assert _claims.classify(_sweep([N, N])) == "fails throughout"
    assert _claims.classify(_sweep([I, I])) == "inconclusive throughout"
    assert _claims.classify(_sweep([H, H, I, N])) == (
        "holds only for gamma in {0.25, 0.5} (does not hold at gamma in {1}; "
        "inconclusive at gamma in {0.75})")
    assert _claims.classify(_sweep([N, I])) == (
        "never holds: at no value of gamma (does not hold at gamma in {0.25}; inconclusive at "
        "gamma in {0.5})")
    # a parameter where it holds throughout is not listed; a map reports its count of cells
    rows = pd.concat([_sweep([H, H], parameter="p", values=[0.1, 0.2]), _sweep([H, N]),
                      _sweep([H, N, H], design="map gamma x p", parameter="gamma x p",
                             values=["0.25, 0.1", "1, 0.1", "0.5, 0.2"])])
    assert _claims.classify(rows) == ("holds only for gamma in {0.25} (does not hold at gamma in "
                                      "{0.5}); gamma x p: holds in 2 of 3 cells")
    rows = pd.concat([_sweep([H, I], parameter="p", values=[0.1, 0.2]),
                      _sweep([I, N], parameter="tau", values=[1.0, 1.1])])
    assert _claims.classify(rows) == ("holds only for p in {0.1} (inconclusive at p in {0.2}); at no "
                                      "value of tau (does not hold at tau in {1.1}; inconclusive at "
                                      "tau in {1})")
    with pytest.raises(ValueError, match="at least one"):
        _claims.classify(_sweep([]))
    with pytest.raises(ValueError, match="unknown verdicts"):
        _claims.classify(_sweep(["maybe"]))


def test_robustness_uses_the_holm_column_and_annotate_fills_every_row():
    H, I = _verdict.HOLDS, _verdict.INCONCLUSIVE
    sweep = _sweep([H, H]).assign(claim_id="asymptotic.lowest", reading="eps at K=50",
                                  headline=True, verdict_holm=[H, I])
    rob = _claims.robustness(sweep)
    assert rob.robustness.tolist() == ["holds only for gamma in {0.25} (inconclusive at gamma in {0.5})"]
    table = pd.DataFrame(dict(figure=["asymptotic", "synthetic_intro", "asymptotic"],
                              claim=["matching's eps_K is the lowest at K=50",
                                     "domain means concentrate along a biased direction, x",
                                     "matching's eps_K is the lowest at K=50 -- reading: "
                                     "squared error at K=50"]))
    out = _claims.annotate(table, sweep)
    assert out.kind.tolist() == ["test", "illustration", "test"]
    assert out.reading.tolist() == ["eps at K=50", "", "squared error at K=50"]
    assert out.headline.tolist() == ["yes", "", "no"]
    assert out.robustness.tolist() == [rob.robustness[0], "illustration", "not swept"]
    assert _claims.kind("multimodal", "eps_(K+1,m) <= eps_(K,m) for all m with high probability") == "outside premise"


def _fake_eps(P, S=50, seed=0):
    """Per-seed eps curves (S, nK, 3) with the three strategies close, so every verdict kind occurs."""
    rng = np.random.default_rng(seed)
    nK = len(P["Ks"])
    return np.abs(1.0 + 0.3 * rng.normal(size=(S, nK, 3)) + np.array([0.0, 0.02, -0.05]))


@pytest.mark.parametrize("figure, mod", [("asymptotic", asymptotic),
                                         ("domain_addition", domain_addition),
                                         ("symmetric", symmetric)])
def test_existing_readings_reproduce_the_existing_rows(figure, mod):
    P, _ = experiments.resolve(figure, {})
    e = _fake_eps(P)
    est = 0.05 * np.random.default_rng(3).normal(size=(e.shape[0], 3, P["d"])) + 0.1
    if figure == "asymptotic":
        rows = mod.claims(e, P)
    elif figure == "symmetric":
        rows = mod.claims("balanced", e[:, -1], est, P) + mod.claims("gaussian", e[:, -1], est, P)
    else:
        step, arrival = np.diff(e, axis=1), np.asarray(P["Ks"])[1:] % P["every"] == 0
        rows = mod.claims(e, step, arrival, P)
    by_text = {r["claim"]: r for r in rows}
    for c in _claims.CLAIMS:
        if c.figure != figure:
            continue
        v = _claims.measure(c.id, c.existing, e, P, est)
        r = by_text[c.text]
        assert (v.verdict, v.estimate, v.ci_low, v.ci_high) == (
            r["verdict"], r["estimate"], r["ci_low"], r["ci_high"])


def test_reading_rows_are_labelled_and_decided_on_the_same_draws():
    P, _ = experiments.resolve("domain_addition", {})
    e = _fake_eps(P, seed=1)
    rows = _claims.reading_rows("domain_addition", e, P)
    texts = [r["claim"] for r in rows]
    assert texts == ["subsampling blunts the spikes (relative to naive pooling) -- reading: mean step "
                     "at outlier arrivals",
                     "matching has the smallest final error (K=30) -- reading: squared error at K=30",
                     "matching gives the most stable curve (smallest largest step) -- reading: mean "
                     "absolute step"]
    # the mean step at outlier arrivals, computed independently: Ks 6, 9, ..., 30 are arrivals
    j = {s: i for i, s in enumerate(_data.STRATEGIES)}
    Ks = np.asarray(P["Ks"])
    idx = [i for i in range(1, len(Ks)) if Ks[i] % 3 == 0]
    d = np.mean([(e[:, i, j["subsample"]] - e[:, i - 1, j["subsample"]])
                 - (e[:, i, j["pool"]] - e[:, i - 1, j["pool"]]) for i in idx], axis=0)
    assert rows[0]["estimate"] == pytest.approx(d.mean(), abs=1e-12)
    assert rows[0]["note"].endswith("The headline reading (docs/claims.md).")
    assert not rows[1]["note"].endswith("(docs/claims.md).")


@pytest.mark.parametrize("over", [{}, {"R": 8.0, "tau": 2.0, "p": 0.1}], ids=["figure", "partial"])
def test_multimodal_premise_shares_match_an_independent_computation(over):
    """Separation and coverage shares of one_seed, recomputed here from the raw draws and the
    returned per-mode errors with the Lemma's two inequalities written out."""
    from poolsim.figures import multimodal as mm

    P = {**mm.PARAMS, "K_max": 18, **over}
    shares = []
    for seed in range(3):
        out = mm.one_seed(seed, P)
        X, mode, modes = mm._draw(seed, P)
        xbar = X.mean(axis=1)
        gap = min(np.hypot(*(modes[i] - modes[j])) for i in range(P["M"]) for j in range(P["M"]) if i != j)
        sep, cov = [], []
        for i, K in enumerate(out["Ks"]):
            eps = out["eps"]["multimodal matching"][i]  # (M,)
            r_max = max(np.hypot(*(xbar[k] - modes[mode[k]])) for k in range(K))
            sep.append(gap > 2 * (P["tau"] + r_max + max(eps)))
            cov.append(all(P["tau"] >= r_max + e for e in eps))
        both = [a and b for a, b in zip(sep, cov)]
        assert out["lemma"] == pytest.approx(np.mean(sep), abs=1e-12)
        assert out["coverage"] == pytest.approx(np.mean(cov), abs=1e-12)
        assert out["premise"] == pytest.approx(np.mean(both), abs=1e-12)
        shares.append((np.mean(sep), np.mean(cov)))
    if over:  # the partial set-up exercises both outcomes of coverage (seeds 1, 2: 0.3, 0.9)
        assert any(0 < c < 1 for _, c in shares)
    else:  # the figure's set-up: contaminated domains lie outside tau, so coverage never holds
        assert all(c == 0 for _, c in shares) and {s for s, _ in shares} == {0.0, 1.0}


def test_counts_on_a_constructed_table():
    H, N, I = _verdict.HOLDS, _verdict.DOES_NOT_HOLD, _verdict.INCONCLUSIVE
    rows = [  # (source, kind, headline, verdict, robustness) -> expected class / where counted
        ("paper", "test", "yes", H, "robust"),
        ("paper", "test", "yes", H, "holds only for gamma in {0.25} (does not hold at gamma in {1})"),
        ("paper", "test", "no", N, "fails throughout"),  # another reading: counted apart
        ("paper", "test", "yes", N, "fails throughout"),
        ("paper", "test", "yes", I, "never holds: at no value of p (inconclusive at p in {0.1})"),
        ("paper", "test", "", H, "not swept"),
        ("paper", "test", "", N, "not swept"),
        ("paper", "illustration", "", H, "illustration"),
        ("paper", "outside premise", "", N, "outside premise"),
        ("ours", "test", "", H, "not swept"),
        ("ours", "test", "", N, "not swept"),
    ]
    t = pd.DataFrame(rows, columns=["source", "kind", "headline", "verdict", "robustness"])
    t["figure"], t["claim"] = "f", [f"c{i}" for i in range(len(t))]
    got = _claims.counts(t)
    assert got["n"] == 6
    assert got["paper"] == {"holds across the whole declared range": 1, "holds only in part": 1,
                            "holds at its one set-up (not swept)": 1, "fails": 2,
                            "inconclusive": 1}
    assert got["part"] == [("f", "c1", rows[1][4])]
    assert (got["illustrations"], got["outside_premise"], got["other_readings"]) == (1, 1, 1)
    assert (got["ours"], got["ours_holds"]) == (2, 1)
    with pytest.raises(ValueError, match="unknown robustness"):
        _claims.outcome_class(H, "sometimes")
