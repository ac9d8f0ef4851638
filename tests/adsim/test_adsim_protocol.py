"""Domain-addition protocol: CSVs, DA = Eq. 15, resume, orders, bad input, real-data path, figures, sweep."""
import json
import os
import re
import shutil

import numpy as np
import pandas as pd
import pytest

from adsim.cli.main import main
from adsim.data import sim
from adsim.data.domains import DOMAINS
from adsim.experiments import protocol, sources
from adsim.experiments.sweep import sweep
from poolsim import da_score

pytestmark = pytest.mark.filterwarnings("ignore::adsim.model.backbone.RandomWeightsWarning")
# a small simulated world and one pass per step: the tests check plumbing, not detection quality
SMALL = ["--sim", "n_train=6", "n_test=8", "n_layers=2", "--epochs", "1", "--batch-size", "16"]
KEYS = ["target", "task", "method", "order", "mode", "seed"]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("proto") / "run"
    argv = ["protocol", "--simulate", "--quick", "--targets", "Brain", "Chest", "--methods", "naive",
            "match-geodesic-vaca", "--out", str(out), "--no-progress", *SMALL]
    assert main(argv) == 0
    return out, argv


@pytest.mark.slow
def test_quick_protocol_csvs_are_well_formed(quick_run):
    out, _ = quick_run
    proto, da = pd.read_csv(out / "protocol.csv"), pd.read_csv(out / "da.csv")
    assert list(proto.columns) == [*KEYS, "step", "added", "auc", "data"]
    # Brain: AC + AS, Chest: AC only; 2 methods x 3 orders x 5 steps, 1 seed (--quick)
    assert len(proto) == (2 + 1) * 2 * 3 * 5 and set(proto["seed"]) == {0}
    assert set(proto[proto["target"] == "Chest"]["task"]) == {"AC"}
    assert proto["auc"].between(0, 100).all() and set(proto["data"]) == {"simulated"}
    similarity = pd.read_csv(out / "similarity.csv")
    s = similarity.set_index(["domain_a", "domain_b"])["cosine"]
    for (t, m, o), g in proto[proto["task"] == "AC"].groupby(["target", "method", "order"]):
        added = list(g.sort_values("step")["added"])
        assert sorted(added) == sorted(d for d in DOMAINS if d != t)  # leave-one-out, each once
        sims = [s[(t, d)] for d in added]
        if o == "hardest":  # closest (highest measured similarity) first
            assert sims == sorted(sims, reverse=True)
        if o == "reverse":
            assert sims == sorted(sims)
    # cumulative: the last step trains on the same pooled set for every order -> the same model
    last = proto[proto["step"] == 5].groupby(["target", "task", "method"])["auc"].nunique()
    assert (last == 1).all()
    # da.csv: one row per protocol curve (target, task, method, order), each over its 5 steps, DA
    # within Eq. 15's range: 4 terms, each 0 or 1 + (AUC gain <= 100) / 10 * s_i with sum s_i = 1
    assert list(da.columns) == [*KEYS, "data", "steps", "da"] and set(da["data"]) == {"simulated"}
    curves = {tuple(k) for k in proto[KEYS].drop_duplicates().itertuples(index=False)}
    assert {tuple(k) for k in da[KEYS].itertuples(index=False)} == curves and len(da) == len(curves) == 18
    assert (da["steps"] == 5).all() and da["da"].between(0.0, 4.0 + 10.0).all()
    var = pd.read_csv(out / "variance.csv")
    assert list(var.columns) == ["target", "method", "order", "mode", "seed", "channel", "class_before",
                                 "modality_before", "class_after", "modality_after", "data"]
    # per-channel variances (means of squares, population variances): finite and >= 0
    vals = var[["class_before", "modality_before", "class_after", "modality_after"]].to_numpy()
    assert len(var) > 0 and np.isfinite(vals).all() and (vals >= 0).all()


@pytest.mark.slow
def test_da_equals_eq15_on_the_auc_rows(quick_run):
    out, _ = quick_run
    proto, da = pd.read_csv(out / "protocol.csv"), pd.read_csv(out / "da.csv")
    assert len(da) == 3 * 2 * 3 and list(da.columns) == [*KEYS, "data", "steps", "da"]
    s = np.array([0.1, 0.2, 0.3, 0.4])  # the paper's weights (Eq. 15)
    for _, row in da.iterrows():
        g = proto[(proto[KEYS] == row[KEYS]).all(axis=1)].sort_values("step")
        y = g["auc"].to_numpy()
        assert row["da"] == pytest.approx(da_score(y), abs=1e-12)
        # Eq. 15 written out by hand, independently of poolsim.da_score
        hand = sum((1 + (y[i + 1] - y[i]) / 10 * s[i]) if y[i + 1] >= y[i] else 0.0 for i in range(4))
        assert row["da"] == pytest.approx(hand, abs=1e-9)


@pytest.mark.slow
def test_resume_recomputes_only_deleted_cells(quick_run, tmp_path):
    out0, argv = quick_run
    out = tmp_path / "copy"
    shutil.copytree(out0, out)
    before = pd.read_csv(out / "protocol.csv")
    cells = sorted((out / "cells").glob("*.json"))
    deleted = {c.name for c in cells[::2]}
    for c in cells[::2]:
        c.unlink()
    params = sim.validate(sim.SimParams(n_train=6, n_test=8, n_layers=2))
    settings = protocol.Settings(data="simulated", sim=params._asdict(), epochs=1, batch_size=16, lr=3e-3)
    res = protocol.run(out, lambda s: sources.simulated(params, s), settings, targets=["Brain", "Chest"],
                methods=["naive", "match-geodesic-vaca"], seeds=1, progress=False)
    assert set(res["computed"]) == deleted and len(res["skipped"]) == len(cells) - len(deleted)
    after = pd.read_csv(out / "protocol.csv")
    pd.testing.assert_frame_equal(before.sort_values([*KEYS, "step"]).reset_index(drop=True),
                                  after.sort_values([*KEYS, "step"]).reset_index(drop=True))
    # a rerun computes nothing; other settings are refused
    assert protocol.run(out, lambda s: sources.simulated(params, s), settings, targets=["Brain", "Chest"],
                 methods=["naive", "match-geodesic-vaca"], seeds=1, progress=False)["computed"] == []
    with pytest.raises(ValueError, match="other settings"):
        protocol.run(out, lambda s: None, settings._replace(lr=0.5), targets=["Brain"], methods=["naive"], seeds=1)


@pytest.mark.slow
def test_sequential_mode_runs(tmp_path):
    out = tmp_path / "seq"
    assert main(["protocol", "--simulate", "--quick", "--targets", "Liver", "--methods", "match-geodesic",
                 "--orders", "random", "--mode", "sequential", "--out", str(out), "--no-progress", *SMALL]) == 0
    proto = pd.read_csv(out / "protocol.csv")
    assert set(proto["mode"]) == {"sequential"} and len(proto) == 2 * 5


@pytest.mark.parametrize("extra, msg", [(["--targets", "Knee"], "unknown domain"),
                                        (["--methods", "magic"], "unknown method"),
                                        (["--orders", "easiest"], "unknown order"),
                                        (["--mode", "parallel"], "unknown mode"),
                                        (["--targets", "Chest", "--tasks", "AS"], "no pixel masks"),
                                        (["--sim", "shared=2"], "shared"),
                                        (["--seeds", "0"], "seeds")])
def test_bad_input_one_line_error_no_csv(tmp_path, capsys, extra, msg):
    out = tmp_path / "bad"
    assert main(["protocol", "--simulate", "--quick", "--out", str(out), "--no-progress", *SMALL, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and msg in err and "\n" not in err
    assert not out.exists()


@pytest.mark.slow
def test_real_path_on_toy_bmad(toy_root, tmp_path, capsys):
    data = tmp_path / "bmad"
    for d in ("Brain", "Liver", "Chest"):
        shutil.copytree(toy_root / f"{d}_AD", data / f"{d}_AD")
    out = tmp_path / "real"
    assert main(["protocol", "--data", str(data), "--backbone", "tiny", "--targets", "Brain", "--methods",
                 "naive", "match-geodesic-vaca", "--orders", "hardest", "--seeds", "1", "--epochs", "1",
                 "--out", str(out), "--no-progress"]) == 0
    proto = pd.read_csv(out / "protocol.csv")
    assert set(proto["data"]) == {"real"} and set(proto["task"]) == {"AC", "AS"}
    assert len(proto) == 2 * 2 * 2  # tasks x methods x steps (two training domains)
    assert set(pd.read_csv(out / "similarity.csv")["domain_a"]) == {"Brain", "Liver", "Chest"}
    # DA with two steps: da_score's generalised weights (s = (1,)), recomputed here
    da = pd.read_csv(out / "da.csv")
    assert len(da) == len(proto) // 2  # one DA row per two-step curve
    for _, row in da.iterrows():
        y = proto[(proto[KEYS] == row[KEYS]).all(axis=1)].sort_values("step")["auc"].to_numpy()
        assert row["da"] == pytest.approx((1 + (y[1] - y[0]) / 10) if y[1] >= y[0] else 0.0)
    # fewer than two modalities, and a masked target whose masks are missing
    one = tmp_path / "one"
    shutil.copytree(toy_root / "Brain_AD", one / "Brain_AD")
    assert main(["protocol", "--data", str(one), "--backbone", "tiny", "--out", str(tmp_path / "o1")]) == 2
    assert "at least two modalities" in capsys.readouterr().err
    shutil.rmtree(data / "Brain_AD" / "test" / "Ungood" / "anomaly_mask")
    assert main(["protocol", "--data", str(data), "--backbone", "tiny", "--out", str(tmp_path / "o2")]) == 2
    assert "missing folder" in capsys.readouterr().err and not (tmp_path / "o2").exists()


def _params_of(out):
    recorded = json.loads((out / "protocol.json").read_text())["settings"]["sim"]
    return sim.SimParams(**{k: tuple(v) if isinstance(v, list) else v for k, v in recorded.items()})


@pytest.mark.slow
def test_figures_and_table(quick_run, tmp_path):
    out, _ = quick_run
    figs = tmp_path / "figs"
    assert main(["figures", "--from", str(out), "--out", str(figs)]) == 0
    names = {p.name for p in figs.iterdir()}
    assert {"ad_final.png", "ad_ablation.png", "ad_modality_gap.png", "ad_variance.png", "ad_table.md"} <= names
    md = (figs / "ad_table.md").read_text()
    mask = os.umask(0o022)
    os.umask(mask)
    assert (figs / "ad_table.md").stat().st_mode & 0o777 == 0o666 & ~mask  # not mkstemp's 0600
    assert "this run, simulated" in md and "paper, real BMAD" in md
    assert "| Brain | AS | match-geodesic-vaca |" in md and "| 90.29 | 4.048 |" in md  # Table 1 / caption
    # the text prior's draws are regenerated from protocol.json: the same as simulate() for each seed
    zs = pd.read_csv(figs / "zero_shot.csv")
    for seed, g in zs.groupby("seed"):
        info = sim.simulate(_params_of(out), int(seed)).info["zero_shot"]
        np.testing.assert_allclose(g.set_index("target").loc[list(info), "image_auc"],
                                   [info[d]["image_auc"] for d in info])
    assert "Zero-shot transfer drawn from the text prior" in md and "final image AUC minus zero-shot AUC" in md
    # every claim line's verdict comes from poolsim's one rule (three outcomes, n and interval shown)
    claims = [ln for ln in md.splitlines() if ln.startswith("- Paper") and "**" in ln]
    assert len(claims) >= 2
    for ln in claims:
        assert re.search(r"\*\*(holds|does not hold|inconclusive)\*\*", ln), ln
        assert re.search(r"\d+ (seeds|pairs)|seed\(s\)", ln), ln  # the count behind the verdict
    assert main(["figures", "--from", str(tmp_path), "--out", str(figs)]) == 2


@pytest.mark.slow
def test_sweep_one_parameter(tmp_path):
    base = sim.validate(sim.SimParams(n_train=4, n_test=6, n_layers=1))
    st = protocol.Settings(data="simulated", sim=base._asdict(), epochs=1, batch_size=16, lr=3e-3)
    table = sweep(tmp_path / "sw", base, st, methods=("naive",), grid={"shared": (0.0, 0.5)}, progress=False)
    assert set(table["value"]) == {0.0, 0.5} and len(table) == 2 * 9  # 6 targets, 3 with AS
    assert (tmp_path / "sw" / "default" / "protocol.csv").exists()  # shared=0.5 is the default
    assert (tmp_path / "sw" / "shared=0.0" / "protocol.csv").exists()


def test_sweep_command_passes_its_targets(tmp_path, monkeypatch):
    # the CLI's --targets reaches sweep(targets=) (the default: None, every modality); sweep itself is stubbed
    import adsim.experiments.sweep as sweep_module
    calls = []
    monkeypatch.setattr(sweep_module, "sweep", lambda *a, **kw: calls.append(kw) or pd.DataFrame())
    base = ["sweep", "--out", str(tmp_path / "sw"), "--quick", "--methods", "naive", "--no-progress"]
    assert main([*base, "--targets", "Chest", "Brain"]) == 0
    assert main(base) == 0
    assert [c["targets"] for c in calls] == [["Chest", "Brain"], None]


def test_sim_params_from_the_command_line():
    # "inf" selects the point-mass text prior (every modality at the mean alignment)
    from adsim.cli.protocol import sim_params
    p = sim_params(["align_concentration=inf", "shared=0.25"], False)
    assert p.align_concentration == float("inf") and p.shared == 0.25 and sim.alignment_prior(p) is None
    with pytest.raises(ValueError, match="align_concentration"):
        sim_params(["align_concentration=0"], False)


def test_sensitivity_table_and_figure_with_intervals(tmp_path):
    # A synthetic sweep table (36 (target, task, seed) pairs per value, inf among the values): the paired
    # difference and its interval must equal the mean and scipy's Student-t interval of the differences
    # computed here independently; a value with 9 pairs gets no interval (< 30 pairs).
    from scipy import stats

    from adsim.experiments.figures import sensitivity_rows, sweep_figures
    rng = np.random.default_rng(0)
    rows = []
    for param, values, n_seeds in (("align_concentration", (2.0, float("inf")), 4), ("shared", (0.0,), 1)):
        for value in values:
            for seed in range(n_seeds):
                for cell in range(9):
                    da = rng.normal(4.0, 1.0)
                    for m, shift in (("naive", 0.0), ("match-geodesic-vaca", rng.normal(0.3, 0.5))):
                        rows.append({"param": param, "value": value, "default": 2.0 if param != "shared" else 0.5,
                                     "method": m, "target": DOMAINS[cell % 6], "task": "AC" if cell < 6 else "AS",
                                     "order": "hardest", "mode": "cumulative", "seed": seed, "da": da + shift})
    sw = pd.DataFrame(rows)
    got = {(r["param"], r["value"]): r for r in sensitivity_rows(sw)}
    assert set(got) == {("align_concentration", 2.0), ("align_concentration", float("inf")), ("shared", 0.0)}
    for key in (("align_concentration", 2.0), ("align_concentration", float("inf"))):
        g = sw[(sw["param"] == key[0]) & (sw["value"] == key[1])]
        d = (g[g["method"] == "match-geodesic-vaca"]["da"].to_numpy() - g[g["method"] == "naive"]["da"].to_numpy())
        lo, hi = stats.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=stats.sem(d))
        v = got[key]["diff"]
        assert v.n_seeds == 36 and v.estimate == pytest.approx(d.mean())
        assert (v.ci_low, v.ci_high) == pytest.approx((lo, hi))
    assert got[("shared", 0.0)]["diff"].n_seeds == 9 and np.isnan(got[("shared", 0.0)]["diff"].ci_low)
    png, md = sweep_figures(sw, tmp_path)
    assert png.name == "ad_sensitivity.png" and png.stat().st_size > 0
    text = md.read_text()
    assert "| align_concentration | inf |" in text and "| align_concentration | 2 (default) |" in text
    assert "SIMULATED" in text and text.count("95% t-interval") == 2 * 3  # 2 values x 3 columns with 36 pairs
