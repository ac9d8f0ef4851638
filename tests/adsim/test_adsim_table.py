"""``python -m adsim table`` on the toy data and the tiny backbone: the table's shape, paper columns,
no retraining and no re-evaluation of finished cells, resumption after an interruption."""
import json

import pandas as pd
import pytest

from adsim.cli.main import main
from adsim.config import recipes
from adsim.config.run import config_from_recipe
from adsim.data import reference
from adsim.experiments import table

pytestmark = pytest.mark.filterwarnings("ignore::adsim.model.backbone.RandomWeightsWarning")
GRID = dict(methods=["naive", "match"], targets=["Brain", "Chest"], shots=[0, 2], backbone="tiny", epochs=1,
            batch_size=8, progress=False)


@pytest.fixture
def counted(monkeypatch):
    """Count the training runs and the cell evaluations the runner performs."""
    calls = {"train": [], "cells": [], "sigma": []}
    train, cell = table.train, table.evaluate_cell

    def counting_train(cfg, **kw):
        calls["train"].append((cfg.target, cfg.method))
        return train(cfg, **kw)

    def counting_cell(det, data, target, shots, **kw):
        calls["cells"].append((target, det.method.name, shots))
        calls["sigma"].append(kw.get("smooth_sigma"))
        return cell(det, data, target, shots, **kw)

    monkeypatch.setattr(table, "train", counting_train)
    monkeypatch.setattr(table, "evaluate_cell", counting_cell)
    return calls


@pytest.mark.slow
def test_table_grid_files_and_rerun_skips(toy_root, tmp_path, counted, capsys):
    out = tmp_path / "table"
    done = table.run(out, toy_root, **GRID)
    assert len(done["computed"]) == 2 * 2 * 2 and not done["skipped"]
    assert sorted(counted["train"]) == [(t, m) for t in ("Brain", "Chest") for m in ("match", "naive")]  # once each
    df = pd.read_csv(out / "table.csv")
    assert list(df["target"]) == ["Brain", "Chest"]
    ours = [f"{m} k={k} {task}" for m in ("naive", "match") for k in (0, 2) for task in ("AC", "AS")]
    assert set(ours) <= set(df.columns)
    brain, chest = df.iloc[0], df.iloc[1]
    assert all(0 <= brain[c] <= 100 for c in ours) and all(0 <= chest[c] <= 100 for c in ours if c.endswith("AC"))
    assert chest[[c for c in ours if c.endswith("AS")]].isna().all()  # Chest has no masks: no AS
    # paper-reported columns, separate and labelled, equal to reference.TABLE1 (naive -> MVFA-AD*, match -> Ours)
    assert brain["paper-reported MVFA-AD* AC"] == reference.TABLE1["MVFA-AD*"][("Brain", "AC")]
    assert chest["paper-reported Ours AC"] == reference.TABLE1["Ours"][("Chest", "AC")]
    assert brain["paper-reported Ours AS"] == reference.TABLE1["Ours"][("Brain", "AS")]
    md = (out / "table.md").read_text()
    assert "MEANINGLESS" in md and "paper-reported" in md and "| Brain |" in md
    assert "(SIMULATED toy data, make-toy-bmad)" in md  # the toy root carries make-toy-bmad's marker
    assert "naive `clean`, match `clean`" in md  # the recipe each trained method ran with
    cell = json.loads((out / "cells" / "Brain__naive__k2.json").read_text())
    assert len(cell["metrics"]["shot_files"]) == 2 and cell["metrics"]["n_images"] == 4  # valid shots, 4 test
    mtimes = {p.name: p.stat().st_mtime_ns for p in (out / "cells").iterdir()}
    # second run, through the CLI: nothing retrained, nothing re-evaluated, no cell rewritten
    n_train, n_cells = len(counted["train"]), len(counted["cells"])
    assert main(["table", "--data", str(toy_root), "--methods", "naive", "match", "--targets", "Brain", "Chest",
                 "--shots", "0", "2", "--out", str(out), "--backbone", "tiny", "--epochs", "1", "--batch-size", "8",
                 "--no-progress"]) == 0
    assert "0 cells computed, 8 already done" in capsys.readouterr().out
    assert (len(counted["train"]), len(counted["cells"])) == (n_train, n_cells)
    assert {p.name: p.stat().st_mtime_ns for p in (out / "cells").iterdir()} == mtimes
    with pytest.raises(ValueError, match="other settings"):
        table.run(out, toy_root, **{**GRID, "epochs": 2})


@pytest.mark.slow
def test_interrupted_table_resumes(toy_root, tmp_path, counted, monkeypatch):
    out = tmp_path / "table"
    grid = {**GRID, "targets": ["Chest"]}
    cell = table.evaluate_cell  # the counting one

    def dies_on_third(det, data, target, shots, **kw):
        if len(counted["cells"]) == 2:
            raise KeyboardInterrupt  # e.g. Ctrl-C during the third cell
        return cell(det, data, target, shots, **kw)

    monkeypatch.setattr(table, "evaluate_cell", dies_on_third)
    with pytest.raises(KeyboardInterrupt):
        table.run(out, toy_root, **grid)
    assert len(list((out / "cells").iterdir())) == 2 and not (out / "table.csv").exists()
    monkeypatch.setattr(table, "evaluate_cell", cell)
    done = table.run(out, toy_root, **grid)
    assert len(counted["cells"]) == 4  # the 2 finished cells were not evaluated again
    assert len(done["skipped"]) == 2 and len(done["computed"]) == 2
    assert sorted(counted["train"]) == [("Chest", "match"), ("Chest", "naive")]  # the finished run is reused
    assert len(pd.read_csv(out / "table.csv")) == 1


def test_bad_requests(toy_root, tmp_path):
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        table.run(tmp_path / "t", toy_root, methods=["nope"], backbone="tiny")
    with pytest.raises(ValueError, match="--shots must be integers >= 0"):
        table.run(tmp_path / "t", toy_root, methods=["naive"], shots=[-2], backbone="tiny")
    with pytest.raises(ValueError, match="unknown domain"):
        table.run(tmp_path / "t", toy_root, methods=["naive"], targets=["Kidney"], backbone="tiny")
    with pytest.raises(ValueError, match=r"--shots must be an integer in \[1, 2\]"):  # before any training
        table.run(tmp_path / "t", toy_root, methods=["naive"], shots=[0, 4], targets=["Liver"], backbone="tiny")
    assert not (tmp_path / "t" / "runs").exists()


@pytest.mark.slow
def test_a_recipe_selected_on_the_target_test_set_is_flagged(toy_root, tmp_path):
    out = tmp_path / "table"
    table.run(out, toy_root, methods=["authors"], targets=["Chest"], shots=[0], backbone="tiny", epochs=1,
          progress=False)
    md = (out / "table.md").read_text()
    assert "authors: checkpoint selected on the TARGET's test set" in md and "NOT zero-shot" in md
    assert "authors `authors`" in md
    assert json.loads((out / "cells" / "Chest__authors__k0.json").read_text())["select"] == "test"
    assert "paper-reported Ours AC" in pd.read_csv(out / "table.csv").columns


@pytest.mark.slow
def test_an_interrupted_training_resumes_from_its_checkpoint(toy_root, tmp_path, counted):
    """A run folder with a checkpoint but no trained.json (killed during training) continues at the first
    unfinished epoch instead of starting again."""
    out = tmp_path / "table"
    run = out / "runs" / "Chest" / "naive"
    cfg = config_from_recipe(recipes.override(recipes.get("clean"), method="naive", epochs=1), data=str(toy_root),
                                   target="Chest", out=str(run), backbone="tiny", seed=0)
    table.train(cfg, progress=False)  # epoch 1 of 2 done, then "killed": no trained.json (counted)
    assert not (run / "trained.json").exists()
    table.run(out, toy_root, methods=["naive"], targets=["Chest"], shots=[0], backbone="tiny", epochs=2, progress=False)
    history = json.loads((run / "history.json").read_text())["history"]
    assert [h["epoch"] for h in history] == [0, 1]  # epoch 0 kept, epoch 1 added
    assert len(counted["train"]) == 2 and (run / "trained.json").exists()  # the kill + one resumed call


def test_training_free_methods_are_not_trained(toy_root, tmp_path, counted):
    out = tmp_path / "table"
    table.run(out, toy_root, methods=["winclip"], targets=["Liver"], shots=[0, 2], backbone="tiny", progress=False)
    assert counted["train"] == [] and not (out / "runs").exists()
    assert len(counted["cells"]) == 2
    # WinCLIP's maps are not smoothed (no reference smooths them), whatever the --recipe's smooth_sigma (clean: 4)
    assert counted["sigma"] == [0.0, 0.0]
    df = pd.read_csv(out / "table.csv")
    assert {"winclip k=0 AC", "winclip k=2 AS", "paper-reported WinCLIP AS"} <= set(df.columns)
    assert df["paper-reported WinCLIP AS"][0] == reference.TABLE1["WinCLIP"][("Liver", "AS")]
    cell = json.loads((out / "cells" / "Liver__winclip__k2.json").read_text())
    assert cell["metrics"]["shots"] == 2 and cell["select"] is None
