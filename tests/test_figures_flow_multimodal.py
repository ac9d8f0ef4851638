"""The flow_bridge and multimodal figure modules honour the figure-module contract (quick runs)."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from poolsim.figures import flow_bridge, multimodal  # noqa: E402


@pytest.fixture(scope="module", params=[flow_bridge, multimodal], ids=lambda m: m.NAME)
def run(request):
    mod = request.param
    ticks = []
    df = mod.compute(seeds=2, quick=True, progress=ticks.append)
    return mod, df, ticks


@pytest.mark.slow
def test_compute_is_tidy_with_intervals(run):
    mod, df, ticks = run
    assert isinstance(mod.NAME, str) and isinstance(mod.TITLE, str)
    for col in ("n_seeds", "value", "ci_low", "ci_high", "panel", "name"):
        assert col in df.columns
    assert (df.n_seeds == 2).all()
    assert np.isfinite(df.value).all()
    assert (df.ci_low <= df.value + 1e-12).all() and (df.value <= df.ci_high + 1e-12).all()
    assert sum(ticks) == (2 * df.dataset.nunique() if mod is flow_bridge else 4)  # 2 set-ups
    if mod is flow_bridge:  # the certified Thm 4 bound must hold for every seed and data set
        holds = df[(df.panel == "thm4") & (df.name == "holds")]
        assert len(holds) == df.dataset.nunique() and (holds.value == 1.0).all()
        assert set(df.data) == {"simulated", "real"}


@pytest.mark.slow
def test_plot_and_summarize(run):
    mod, df, _ = run
    fig = mod.plot(df)
    assert isinstance(fig, matplotlib.figure.Figure)
    text = " ".join(t.get_text() for t in fig.texts) + fig._suptitle.get_text()
    assert "2 seeds" in text
    assert ("REAL DATA" in " ".join(t.get_text() for ax in fig.axes for t in ax.get_xticklabels())
            if mod is flow_bridge else "SIMULATED" in text)
    plt.close(fig)
    md = mod.summarize(df)
    assert md.startswith("## ") and "|---" in md
    verdicts = df.attrs["verdicts"]
    assert verdicts and all(v["verdict"] == "inconclusive" for v in verdicts)  # 2 seeds < 30
    assert md.count("**inconclusive**") == len(verdicts)


@pytest.mark.parametrize("mod", [flow_bridge, multimodal], ids=lambda m: m.NAME)
def test_bad_seed_count(mod):
    with pytest.raises(ValueError, match="seeds"):
        mod.compute(seeds=0, quick=True)
