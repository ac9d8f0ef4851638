"""adsim test set-up: one torch thread (the CI machine is small and shared), a session toy data set
and a session tiny backbone (random weights -- its RandomWeightsWarning is expected here)."""
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
torch.set_num_threads(1)

from adsim.data.toy import make_toy_bmad  # noqa: E402
from adsim.model.backbone import RandomWeightsWarning, build_backbone  # noqa: E402


@pytest.fixture(scope="session")
def toy_root(tmp_path_factory):
    # 2 normal + 2 anomalous images per domain and split: 40 training images for one target
    return make_toy_bmad(tmp_path_factory.mktemp("toy_bmad"), n_per_class=2, size=64, seed=1)


@pytest.fixture(scope="session")
def tiny():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RandomWeightsWarning)
        return build_backbone("tiny", seed=0)


@pytest.fixture(scope="session")
def triton_interpreter():
    """``run(cases, folder) -> outputs``: the Triton gate kernel on ``cases`` under Triton's interpreter,
    in one child process (``_triton_interpret.py``; the interpreter must be chosen before triton is
    imported, which this process already did). A failing child -> ``AssertionError`` with its stderr."""
    root = Path(__file__).resolve().parents[2]

    def run(cases: list, folder: Path) -> list:
        torch.save(cases, folder / "cases.pt")
        env = {**os.environ, "TRITON_INTERPRET": "1", "JAX_PLATFORMS": "cpu",
               "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
        proc = subprocess.run([sys.executable, str(Path(__file__).with_name("_triton_interpret.py")),
                               str(folder / "cases.pt"), str(folder / "out.pt")], env=env, cwd=root,
                              capture_output=True, text=True, timeout=600, check=False)
        if proc.returncode:
            raise AssertionError(f"interpreter child failed:\n{proc.stderr[-3000:]}")
        return torch.load(folder / "out.pt")

    return run


@pytest.fixture(scope="session")
def cli_run(toy_root):
    """``run(recipe, folder) -> (run folder, checkpoint state, history, metrics.json)``: ``python -m adsim train
    --recipe RECIPE`` (1 epoch, tiny backbone, target Brain, training domains Liver and Chest), ``eval`` and
    ``predict --run`` on one Brain test image, each asserted to exit 0."""
    from adsim.cli.main import main
    from adsim.runtime.io import load_torch, read_json

    def run(recipe: str, folder: Path) -> tuple:
        out = folder / "run"
        assert main(["train", "--recipe", recipe, "--data", str(toy_root), "--target", "Brain", "--train-domains",
                     "Liver", "Chest", "--out", str(out), "--epochs", "1", "--backbone", "tiny", "--no-progress",
                     "--device", "cpu"]) == 0
        assert main(["eval", "--run", str(out), "--data", str(toy_root), "--no-progress", "--device", "cpu"]) == 0
        image = next((toy_root / "Brain_AD" / "test" / "Ungood" / "img").glob("*.png"))
        assert main(["predict", "--run", str(out), "--out", str(folder / "pred"), str(image), "--device", "cpu"]) == 0
        assert (folder / "pred" / "scores.csv").is_file()
        return (out, load_torch(out / "checkpoint_last.pt")["head"], read_json(out / "history.json")["history"],
                read_json(out / "metrics.json"))

    return run
