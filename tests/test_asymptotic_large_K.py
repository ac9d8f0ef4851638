"""The ``asymptotic`` figure beyond the paper's K: ``--max-K`` plumbing (CLI -> figure module),
the K values it adds, and the Thm 1 limits it overlays (equal to poolsim.theory's)."""
import math
import types

import numpy as np
import pandas as pd
import pytest

from poolsim import decide_claim, metadist, theory
from poolsim.figures import __main__ as cli
from poolsim.figures import _data, asymptotic


def test_gap_slope_recovers_a_power_law():
    # eps_K - eps_inf = 0.3 K^-0.5 exactly: the fitted slope over K >= 100 is -0.5 (K < 100 ignored)
    K = np.array([10, 50, 100, 1000, 10_000])
    cur = pd.DataFrame({"K": K, "mean": 0.2 + 0.3 * K ** -0.5 + np.where(K < 100, 1.0, 0.0)})
    assert asymptotic.gap_slope(cur, 0.2) == pytest.approx(-0.5, abs=1e-12)
    assert math.isnan(asymptotic.gap_slope(cur, 0.25))  # a non-positive gap: no log fit


def test_ks_for_adds_the_large_K_values_up_to_max_K():
    default = (5, 10, 20, 30, 40, 50)  # experiments.EXPERIMENTS["asymptotic"] (the paper's)
    assert asymptotic.ks_for(None) == default
    assert asymptotic.ks_for(50) == default
    assert asymptotic.ks_for(100) == default + (100,)
    assert asymptotic.ks_for(1234) == default + (100, 200, 500, 1000, 1234)
    assert asymptotic.ks_for(10_000)[-4:] == (1000, 2000, 5000, 10_000)


@pytest.mark.parametrize("bad", [49, 0, -5, 100.0, "100", True])
def test_ks_for_rejects_bad_max_K(bad):
    with pytest.raises(ValueError, match="max_K must be an integer >= 50"):
        asymptotic.ks_for(bad)


def _fake(name, takes_max_K, seen):
    def summarize(df):
        return f"## {name} -- fake\n\nok\n"

    def plot(df):
        import matplotlib.pyplot as plt
        return plt.figure()

    def make(seeds, **kw):
        seen[name] = kw
        df = pd.DataFrame({"panel": ["p"], "mean": [1.0], "n_seeds": [seeds]})
        return _data.set_verdicts(df, [_data.claim(name, "c", decide_claim(np.ones(seeds)), "x")])

    if takes_max_K:
        def compute(*, seeds, quick, progress=None, max_K=None):
            return make(seeds, max_K=max_K)
    else:
        def compute(*, seeds, quick, progress=None):
            return make(seeds)
    return types.SimpleNamespace(NAME=name, compute=compute, plot=plot, summarize=summarize)


@pytest.fixture
def fakes(monkeypatch):
    import poolsim.figures as figs

    seen: dict = {}
    mods = {"big": _fake("big", True, seen), "plain": _fake("plain", False, seen)}
    monkeypatch.setattr(figs, "available", lambda: tuple(mods))
    monkeypatch.setattr(figs, "load", mods.__getitem__)
    monkeypatch.setenv("XLA_FLAGS", "")  # main() may set the compile flag; keep it to this test
    return seen


def test_cli_passes_max_K_only_to_modules_that_take_it(tmp_path, fakes):
    assert cli.main(["--out", str(tmp_path), "--only", "big", "plain", "--max-K", "100",
                     "--seeds", "2", "--format", "png"]) == 0
    assert fakes == {"big": {"max_K": 100}, "plain": {}}
    assert "--max-K 100" in (tmp_path / "summary.md").read_text()  # the run settings name it
    fakes.clear()
    args = ["--out", str(tmp_path), "--only", "big", "--seeds", "2", "--format", "png"]
    assert cli.main(args) == 1 and fakes == {}  # it would replace the --max-K results: stops before any work
    assert cli.main([*args, "--overwrite"]) == 0
    assert fakes == {"big": {"max_K": None}}
    assert "--max-K" not in (tmp_path / "summary.md").read_text()


@pytest.mark.parametrize("args, msg", [
    (["--only", "plain", "--max-K", "100"], "--max-K: none of the figures made (plain) takes it; those that do: big"),
    (["--only", "big", "--max-K", "20"], "--max-K: max_K must be an integer >= 50"),
])
def test_cli_max_K_errors_before_any_work(tmp_path, fakes, capsys, args, msg):
    out = tmp_path / "out"
    assert cli.main(["--out", str(out), *args]) == 1
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and msg in err[0]
    assert fakes == {} and not out.exists()


@pytest.mark.slow
def test_asymptotic_at_max_K_100_runs_and_overlays_theory_limits():
    # A real (small) run: 3 seeds, K up to 100. The overlaid limits are theory's, recomputed here:
    # matching's fixed point at fixed tau (match_limit, gate on means of n = 150 samples) and
    # pooling's ||E[mu] - mu*|| = p alpha = 0.45 (metadist.contaminated's mean).
    df = asymptotic.compute(seeds=3, quick=True, max_K=100)
    assert df.attrs["params"]["Ks"] == (5, 10, 20, 30, 40, 50, 100)
    assert df.attrs["params"]["materialize"] is False  # large K: exact sufficient statistics
    assert set(df[df.panel == "final"].K) == {100}
    lim = df[df.panel == "limit"].set_index("strategy")["mean"]
    md = metadist.contaminated(0.3, 1.5, d=2, gamma=0.5)
    want = np.linalg.norm(theory.match_limit(md, sigma=0.8, tau=1.2, N=150).centroid)
    assert lim["match"] == pytest.approx(want, rel=1e-12)
    assert lim["pool"] == lim["subsample"] == pytest.approx(0.45, rel=1e-12)
    v = _data.verdicts_of(df)
    assert v.claim.str.contains("fixed-tau").sum() == 2 and (v.verdict == "inconclusive").all()  # 3 seeds
    assert "limit lies" in asymptotic.summarize(df)
    import matplotlib.pyplot as plt

    fig = asymptotic.plot(df)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any("K->inf at fixed tau (theory)" in t for t in labels)
    assert fig.axes[0].get_xscale() == "log" and not math.isnan(lim["match"])
    assert len(fig.axes) == 3 and "approach to the fixed-tau limit" in fig.axes[1].get_title()
    plt.close(fig)
