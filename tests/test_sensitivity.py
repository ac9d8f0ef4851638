"""The sensitivity sweep figure (poolsim/figures/sensitivity.py): its settings follow the declared
ranges, Holm runs over the distinct tests (a setting shared by several designs is one test), and a
tiny sweep's rows equal the claims module's measure() on a direct engine simulation."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from poolsim import _verdict, experiments  # noqa: E402
from poolsim.figures import _claims, _data, sensitivity  # noqa: E402


def test_settings_follow_the_declared_ranges_and_maps():
    for exp in sensitivity.EXPERIMENTS:
        rs = _claims.ranges(exp)
        got = sensitivity.settings(exp)
        one = [s for s in got if s[0] == "one at a time"]
        assert [(p, v) for _, p, v, _ in one] == [(r.parameter, f"{v:g}") for r in rs for v in r.values]
        # the default value is passed as no override: the figures' own draw
        assert all((over == {}) == (v == f"{next(r for r in rs if r.parameter == p).default:g}")
                   for _, p, v, over in one)
        maps = [m for m in _claims.MAPS if m[0] == exp]
        assert len(got) == len(one) + sum(
            len(next(r for r in rs if r.parameter == x).values)
            * len(next(r for r in rs if r.parameter == y).values) for _, x, y in maps)


def test_holm_counts_a_shared_setting_once():
    # three rows, two of them the same test (the default setting under two designs)
    base = dict(claim_id="c", reading="r", experiment="asymptotic", threshold=0.0, side="greater",
                n_seeds=1000)
    params = {r.parameter: 1.0 for r in _claims.RANGES}
    rows = [dict(base, **params, estimate=0.1, ci_low=0.01, ci_high=0.19, design="one at a time"),
            dict(base, **params, estimate=0.1, ci_low=0.01, ci_high=0.19, design="map"),
            dict(base, **{**params, "gamma": 2.0}, estimate=0.1, ci_low=0.05, ci_high=0.15,
                 design="one at a time")]
    out = sensitivity.with_holm(pd.DataFrame(rows))
    p = _verdict.p_value([0.1, 0.1], [0.01, 0.05], [0.19, 0.15], [1000, 1000])
    adj = _verdict.holm(p)  # a family of two, not three
    expected = _verdict.adjusted_verdicts([0.1, 0.1], [0.0, 0.0], ["greater"] * 2, adj)
    assert out.verdict_holm.tolist() == [expected[0], expected[0], expected[1]]
    assert out.p_value.tolist() == pytest.approx([p[0], p[0], p[1]])


@pytest.mark.slow
def test_tiny_sweep_equals_measure_on_a_direct_simulation(monkeypatch):
    small = tuple(r._replace(values=(r.default, r.values[0])) for r in _claims.RANGES
                  if r.parameter == "gamma")
    monkeypatch.setattr(_claims, "RANGES", small)
    monkeypatch.setattr(_claims, "MAPS", ())
    _data.clear_memo()
    ticks = []
    df = sensitivity.compute(seeds=40, quick=False, progress=ticks.append)
    assert sum(ticks) == sensitivity.progress_total(40, False) == 40 * 4
    assert set(df.n_seeds) == {40}
    res, P = experiments.simulate("asymptotic", seeds=40, gamma=0.25)
    e = experiments.eps(res.estimates, P["mu_star"])
    row = df[(df.claim_id == "asymptotic.lowest") & (df.reading == "eps at K=50") & (df.value == "0.25")]
    v = _claims.measure("asymptotic.lowest", "eps at K=50", e, P)
    assert row.estimate.item() == pytest.approx(v.estimate, abs=1e-12)
    assert row.ci_low.item() == pytest.approx(v.ci_low, abs=1e-12)
    assert row.verdict.item() == v.verdict
    fig = sensitivity.plot(df)
    assert "40 seeds" in fig._suptitle.get_text()
    plt.close(fig)
    md = sensitivity.summarize(df)
    assert md.startswith("## sensitivity -- ") and md.count("| asymptotic:") == 7
    _data.clear_memo()
