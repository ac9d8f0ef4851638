"""Opening a shared run folder never runs code: a checkpoint whose unpickling would create a marker file
is refused by every command that reads checkpoints, and the marker never appears. Plus the bounds on
the other inputs a run or a command line brings (``--set`` values, image sizes)."""
import builtins
import importlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from adsim.cli.main import main
from adsim.config import recipes
from adsim.config.run import config_from_recipe
from adsim.experiments import table
from adsim.inference.detector import Detector
from adsim.model.backbone import build_backbone
from adsim.runtime.io import UnsafeCheckpointError, convert_checkpoint, load_torch, save_torch
from adsim.training.train import train

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.filterwarnings("ignore::adsim.model.backbone.RandomWeightsWarning")


class _Payload:
    """Unpickling this calls ``open(marker, "w")``: it creates the marker file (a stand-in for any code)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (builtins.open, (self.marker, "w"))


@pytest.fixture(scope="module")
def clean_run(toy_root, tmp_path_factory):
    """A real one-epoch run (tiny backbone) whose checkpoints were written by this version."""
    out = tmp_path_factory.mktemp("runs") / "Chest" / "naive"
    cfg = config_from_recipe(recipes.override(recipes.get("clean"), method="naive", epochs=1, batch_size=8),
                             data=str(toy_root), target="Chest", train_domains=("Brain", "Liver"), out=str(out),
                             backbone="tiny", seed=0, device="cpu")
    train(cfg, progress=False)
    return out, cfg


def _poisoned(clean_run, tmp_path):
    """A copy of the run whose checkpoint also holds the payload (the edit a malicious sharer would make)."""
    src, _ = clean_run
    run = tmp_path / "runs" / "Chest" / "naive"
    shutil.copytree(src, run)
    record = json.loads((run / "config.json").read_text())
    record["config"]["out"] = str(run)  # as if the run had been made here (train --resume compares it)
    (run / "config.json").write_text(json.dumps(record))
    marker = tmp_path / "MARKER"
    ckpt = load_torch(run / "checkpoint_last.pt")
    ckpt["note"] = _Payload(marker)
    torch.save(ckpt, run / "checkpoint_last.pt")  # plain torch.save: save_torch would refuse the object
    return run, marker


def test_checkpoints_written_by_training_are_plain(clean_run):
    run, _ = clean_run
    ckpt = load_torch(run / "checkpoint_last.pt")  # the weights-only unpickler reads it
    assert set(ckpt) >= {"epoch", "head", "optimizer", "history"}
    assert all(isinstance(v, float) for e in ckpt["history"] for k, v in e.items() if k not in ("epoch", "steps"))


def test_a_poisoned_checkpoint_is_refused_everywhere_and_runs_nothing(clean_run, toy_root, tmp_path, capsys):
    run, marker = _poisoned(clean_run, tmp_path)
    with pytest.raises(UnsafeCheckpointError, match=r"holds .*open.* refused, nothing in it was run"):
        Detector.from_run(run, checkpoint="last", device="cpu")
    images = sorted((toy_root / "Chest_AD" / "test" / "good" / "img").iterdir())[:2]
    for argv in (["predict", "--run", str(run), "--checkpoint", "last", "--out", str(tmp_path / "pred"),
                  "--no-progress", *map(str, images)],
                 ["eval", "--run", str(run), "--data", str(toy_root), "--checkpoint", "last", "--no-progress"]):
        capsys.readouterr()
        assert main(argv) == 2
        # one line, naming the file and what it holds (besides the CLI's once-per-process random-weights notice)
        (line,) = [ln for ln in capsys.readouterr().err.strip().splitlines() if "has RANDOM weights" not in ln]
        assert line.startswith("error: checkpoint ") and "checkpoint_last.pt holds" in line and "open" in line
    # train --resume reads the same checkpoint
    _, cfg = clean_run
    with pytest.raises(UnsafeCheckpointError):
        train(cfg._replace(out=str(run), epochs=2), resume=True, progress=False)
    # the table runner, finding a finished run of its grid, loads it through Detector.from_run
    (run / "trained.json").write_text('{"target": "Chest", "method": "naive"}')
    with pytest.raises(UnsafeCheckpointError):
        table.run(tmp_path, toy_root, methods=["naive"], targets=["Chest"], shots=[0], backbone="tiny",
                  epochs=1, progress=False, device="cpu")
    assert not marker.exists()
    # the probe can fail: loading the same file with the full unpickler does create the marker
    full = torch.load(run / "checkpoint_last.pt", weights_only=False)  # the test's oracle, never the package's
    full["note"].close()  # the payload returned the file it opened
    assert marker.exists()


def test_convert_run_makes_numpy_values_plain_and_refuses_anything_else(clean_run, tmp_path, capsys):
    src, _ = clean_run
    run = tmp_path / "old"
    shutil.copytree(src, run)
    ckpt = load_torch(run / "checkpoint_last.pt")
    ckpt["history"][0]["loss"] = np.float64(0.25)  # what an earlier version could write
    ckpt["extra"] = np.arange(3)
    torch.save(ckpt, run / "checkpoint_last.pt")
    with pytest.raises(UnsafeCheckpointError, match="numpy"):
        load_torch(run / "checkpoint_last.pt")
    assert main(["convert-run", str(run)]) == 0
    assert "converted" in capsys.readouterr().out
    got = load_torch(run / "checkpoint_last.pt")
    assert type(got["history"][0]["loss"]) is float and got["history"][0]["loss"] == 0.25
    assert torch.equal(got["extra"], torch.arange(3))
    # a file holding anything else is left alone and refused
    marker = tmp_path / "MARKER2"
    ckpt["extra"] = _Payload(marker)
    torch.save(ckpt, run / "checkpoint_last.pt")
    with pytest.raises(UnsafeCheckpointError, match="not converted"):
        convert_checkpoint(run / "checkpoint_last.pt")
    assert not marker.exists()


def test_save_torch_refuses_objects_it_could_not_read_back(tmp_path):
    with pytest.raises(TypeError, match=r"c.pt\['x'\] is a .*_Payload"):
        save_torch(tmp_path / "c.pt", {"x": _Payload(tmp_path / "m")})
    assert not (tmp_path / "c.pt").exists()


def test_no_full_pickle_load_in_the_packages():
    """``torch.load(..., weights_only=False)`` appears nowhere in the shipped code."""
    hits = [f"{p.relative_to(ROOT)}" for pkg in ("adsim", "poolsim") for p in (ROOT / pkg).rglob("*.py")
            if "weights_only=False" in p.read_text()]
    assert hits == []


@pytest.mark.parametrize("value", ["(" + "1, " * 70 + ")", "[" * 90 + "]" * 90, "{'a': 1}", "(1, (2, 3))", "x" * 300])
def test_set_values_are_bounded(value):
    with pytest.raises(ValueError, match="--set gamma"):
        recipes.parse_sets([f"gamma={value}"])


def test_image_sizes_the_backbone_cannot_use_are_refused_before_any_allocation(capsys, toy_root, tmp_path):
    with pytest.raises(ValueError, match=r"at most 512 \(64 patches per side\), got 100000"):
        build_backbone("tiny", image_size=100000)
    argv = ["train", "--data", str(toy_root), "--target", "Chest", "--out", str(tmp_path / "r"), "--backbone", "tiny",
            "--image-size", "100000", "--no-progress"]
    assert main(argv) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "image_size must be" in line and "100000" in line


def test_out_of_memory_is_one_line(monkeypatch, capsys, toy_root, tmp_path):
    training = importlib.import_module("adsim.training.train")  # the module (its train is a function too)

    def oom(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 40.00 GiB")

    monkeypatch.setattr(training, "build_backbone", oom)
    argv = ["train", "--data", str(toy_root), "--target", "Chest", "--out", str(tmp_path / "r"), "--backbone", "tiny",
            "--no-progress"]
    assert main(argv) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: out of memory") and "lower --batch-size or --image-size" in line
