"""End to end on the tiny open_clip backbone and the toy BMAD data: train -> eval -> metrics.json,
resume, model selection, bad input through the CLI."""
import json
import shutil

import pytest
import torch

from adsim.cli.main import main
from adsim.config.run import TrainConfig, validate

pytestmark = pytest.mark.filterwarnings("ignore::adsim.model.backbone.RandomWeightsWarning")
TINY = ["--backbone", "tiny", "--batch-size", "8", "--no-progress"]


@pytest.fixture(scope="module")
def no_brain(toy_root, tmp_path_factory):
    """The toy data WITHOUT the target's folder: training must succeed without ever reading it."""
    dst = tmp_path_factory.mktemp("no_brain") / "bmad"
    shutil.copytree(toy_root, dst, ignore=lambda d, names: [n for n in names if n == "Brain_AD"])
    return dst


@pytest.mark.slow
def test_train_eval_metrics_json(toy_root, no_brain, tmp_path):
    run = tmp_path / "run"
    assert main(["train", "--data", str(no_brain), "--target", "Brain", "--out", str(run), "--epochs", "1", *TINY]) == 0
    assert main(["eval", "--run", str(run), "--data", str(toy_root), "--no-progress"]) == 0
    m = json.loads((run / "metrics.json").read_text())
    assert m["target"] == "Brain" and m["zero_shot"] and m["select"] == "last"
    assert 0.0 <= m["image_auc"] <= 100.0 and 0.0 <= m["pixel_auc"] <= 100.0
    assert all(0.0 <= m[k] <= 100.0 for k in ("image_ap", "image_f1max", "pixel_ap", "pixel_f1max", "aupro"))
    assert m["n_images"] == 4 and m["n_anomalous"] == 2 and "warning_weights" in m
    assert m["simulated_data"] is True  # make-toy-bmad's marker file (adsim.data.simulated)
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["config"]["train_domains"] == ["Liver", "Retina_RESC", "Retina_OCT2017", "Chest", "Histopathology"]
    assert cfg["config"]["seed"] == 0 and cfg["n_train_images"] == 40
    hist = json.loads((run / "history.json").read_text())["history"]
    assert len(hist) == 1 and hist[0]["steps"] == 5 and all(
        v == v for v in hist[0].values())  # no NaN in the logged losses
    assert hist[0]["inter"] < 0  # both centroids were initialised and pushed apart
    # an AC-only target has image AUC only
    run2 = tmp_path / "run_chest"
    assert main(["train", "--data", str(toy_root), "--target", "Chest", "--out", str(run2), "--epochs", "1",
                 "--train-domains", "Liver", "--method", "naive", "--no-vaca", *TINY]) == 0
    assert main(["eval", "--run", str(run2), "--data", str(toy_root), "--no-progress"]) == 0
    m2 = json.loads((run2 / "metrics.json").read_text())
    assert "pixel_auc" not in m2 and m2["method"] == "naive" and m2["vaca"] is False


def _heads_equal(a, b):
    sa = torch.load(a / "checkpoint_last.pt", weights_only=False)
    sb = torch.load(b / "checkpoint_last.pt", weights_only=False)
    assert sa["epoch"] == sb["epoch"] == 1
    for k in sa["head"]:
        torch.testing.assert_close(sa["head"][k], sb["head"][k], rtol=0, atol=0, msg=k)
    return sa, sb


@pytest.mark.slow
def test_resume_loses_no_epoch_and_matches_uninterrupted(toy_root, tmp_path):
    common = ["--data", str(toy_root), "--target", "Liver", "--train-domains", "Chest", "Histopathology", *TINY]
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["train", *common, "--out", str(a), "--epochs", "2"]) == 0
    # "killed" after its first epoch: run b has only epoch 0 on disk, then resumes
    assert main(["train", *common, "--out", str(b), "--epochs", "1"]) == 0
    assert main(["train", *common, "--out", str(b), "--epochs", "2"]) == 2  # exists, no --resume
    assert main(["train", *common, "--out", str(b), "--epochs", "2", "--resume"]) == 0
    sa, sb = _heads_equal(a, b)
    assert [h["epoch"] for h in sb["history"]] == [0, 1]
    assert sa["history"] == sb["history"]
    # resuming with another configuration is refused
    assert main(["train", *common, "--out", str(b), "--epochs", "3", "--resume", "--metric", "l2"]) == 2


@pytest.mark.slow
def test_selection_modes(toy_root, tmp_path):
    common = ["--data", str(toy_root), "--target", "Brain", "--train-domains", "Liver", "Chest", *TINY]
    held = tmp_path / "held"
    assert main(["train", *common, "--out", str(held), "--epochs", "2", "--select-heldout", "0.5"]) == 0
    assert (held / "checkpoint_best.pt").exists()
    assert main(["eval", "--run", str(held), "--data", str(toy_root), "--no-progress"]) == 0
    m = json.loads((held / "metrics.json").read_text())
    assert m["select"] == "heldout" and m["zero_shot"] and m["checkpoint"]["file"] == "checkpoint_best.pt"
    test = tmp_path / "test"
    assert main(["train", *common, "--out", str(test), "--epochs", "1", "--select-on-test"]) == 0
    assert main(["eval", "--run", str(test), "--data", str(toy_root), "--no-progress"]) == 0
    m = json.loads((test / "metrics.json").read_text())
    assert m["zero_shot"] is False and "NOT a zero-shot" in m["warning"]
    assert "AUTHORS' PROTOCOL" in json.loads((test / "config.json").read_text())["protocol"]


@pytest.mark.slow
def test_sequential_gate_trains(toy_root, tmp_path):
    run = tmp_path / "seq"
    assert main(["train", "--data", str(toy_root), "--target", "Brain", "--train-domains", "Liver",
                 "--train-splits", "valid", "--gate-mode", "sequential", "--update", "slerp", "--out", str(run),
                 "--epochs", "1", *TINY]) == 0
    hist = json.loads((run / "history.json").read_text())["history"]
    assert hist[0]["steps"] == 1 and hist[0]["intra"] >= 0


@pytest.mark.parametrize("args", [["--target", "Knee"], ["--target", "Brain", "--train-domains", "Brain"],
                                  ["--target", "Brain", "--backbone", "ViT-Z-1"],
                                  ["--target", "Brain", "--image-size", "60"],
                                  ["--target", "Brain", "--checkpoint", "/no/such/file.pt"]])
def test_cli_bad_input(toy_root, tmp_path, args, capsys):
    argv = ["train", "--data", str(toy_root), "--out", str(tmp_path / "r"), "--epochs", "1",
            "--batch-size", "8", "--no-progress", *args]
    if "--backbone" not in args:
        argv += ["--backbone", "tiny"]
    assert main(argv) == 2
    assert "error:" in capsys.readouterr().err


@pytest.mark.slow
def test_eval_refuses_training_domain_and_bad_run(toy_root, tmp_path, capsys):
    assert main(["eval", "--run", str(tmp_path), "--data", str(toy_root)]) == 2
    assert "not a run folder" in capsys.readouterr().err
    run = tmp_path / "r"
    assert main(["train", "--data", str(toy_root), "--target", "Brain", "--train-domains", "Liver",
                 "--train-splits", "valid", "--out", str(run), "--epochs", "1", *TINY]) == 0
    assert main(["eval", "--run", str(run), "--data", str(toy_root), "--target", "Liver"]) == 2
    assert "training domain" in capsys.readouterr().err


def test_validate_choices():
    base = TrainConfig(data="d", target="Brain", out="o")
    with pytest.raises(ValueError, match="metric must be one of"):
        validate(base._replace(metric="manhattan"))
    with pytest.raises(ValueError, match="select must be one of"):
        validate(base._replace(select="best-of-test"))
    assert validate(base).train_domains == ("Liver", "Retina_RESC", "Retina_OCT2017", "Chest", "Histopathology")


@pytest.mark.slow
def test_authors_recipe_end_to_end_records_the_recipe(toy_root, tmp_path, capsys):
    run = tmp_path / "authors"
    argv = ["train", "--data", str(toy_root), "--target", "Brain", "--out", str(run), "--recipe", "authors",
            "--epochs", "1", "--backbone", "tiny", "--no-progress", "--train-domains", "Liver", "Chest"]
    assert main(argv) == 0
    assert "not zero-shot" in capsys.readouterr().err  # the authors select on the target's test set
    rec = json.loads((run / "config.json").read_text())
    assert rec["recipe"]["name"] == "authors" and rec["recipe"]["gate_filter"] == "skip_step"
    assert rec["config"]["batch_size"] == 1 and rec["config"]["adapter_bias"] is False
    assert "a bad photo of a flawless object." in rec["prompts"]["normal"]  # MVFA "object" ensemble
    hist = json.loads((run / "history.json").read_text())["history"][0]
    assert hist["steps"] == rec["n_train_images"] and 0.0 <= hist["skipped"] <= 1.0
    assert main(["eval", "--run", str(run), "--data", str(toy_root)]) == 0
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["smooth_sigma"] == 0.0  # the recipe's smoothing (authors: none), not the old default 4
    # a flag overrides one field of the recipe; the rest stays the recipe's
    run2 = tmp_path / "authors_bs2"
    assert main([*argv[:6], str(run2), *argv[7:], "--batch-size", "2", "--set", "gate_unit=patch"]) == 0
    cfg2 = json.loads((run2 / "config.json").read_text())["config"]
    assert (cfg2["batch_size"], cfg2["gate_unit"], cfg2["gate_filter"], cfg2["recipe"]) == (2, "patch", "skip_step",
                                                                                          "authors")
