"""The README stays true: its quick start is exactly the two documented commands (the second is what
.ci/run runs) and its Python example runs as written."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()

INSTALL_RUN = "pip install -e . && python -m poolsim.figures"
INSTALL_TEST = 'pip install -e ".[test,adsim]" && python -m pytest -q'


def _blocks(lang):
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def test_quick_start_is_the_two_commands_and_ci_runs_the_second():
    quick = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    bash = re.findall(r"```bash\n(.*?)```", quick, flags=re.S)
    assert len(bash) == 1
    assert bash[0].strip().splitlines() == [INSTALL_RUN, INSTALL_TEST]
    assert INSTALL_TEST in (ROOT / ".ci" / "run").read_text()


def test_python_example_runs():
    (code,) = [b for b in _blocks("python") if "import poolsim" in b]
    namespace = {}
    exec(compile(code, "README.md", "exec"), namespace)
    # The DA line's documented value: Eq. 15 for (70, 72, 71, 75, 80) is 3.34 (see test_da.py).
    assert "-> 3.34" in code
    assert abs(namespace["poolsim"].da_score([70, 72, 71, 75, 80]) - 3.34) < 1e-12
    assert bool(namespace["res"].converged)


@pytest.mark.filterwarnings("ignore:backbone tiny has RANDOM weights")
def test_adsim_python_example_runs(tmp_path):
    """The adsim block of "Use it on your own images", on a 1-epoch tiny run and 4 toy images (its paths
    replaced by temporary ones)."""
    pytest.importorskip("torch")
    from adsim.cli.main import main
    from adsim.data.toy import make_toy_bmad
    (code,) = [b for b in _blocks("python") if "from adsim import Detector" in b]
    toy = make_toy_bmad(tmp_path / "toy", n_per_class=2, size=64, seed=0)
    run = tmp_path / "run"
    assert main(["train", "--data", str(toy), "--target", "Brain", "--train-domains", "Liver", "--epochs", "1",
                 "--backbone", "tiny", "--batch-size", "8", "--no-progress", "--out", str(run)]) == 0
    scans = toy / "Brain_AD" / "test" / "Ungood" / "img"
    for old, new in (("/tmp/run", str(run)), ("my_scans/", f"{scans}/"), ("/tmp/pred_png", str(tmp_path / "png"))):
        assert old in code
        code = code.replace(old, new)
    namespace = {}
    exec(compile(code, "README.md", "exec"), namespace)
    assert namespace["pred"].scores.shape == (2,) and namespace["pred"].maps.shape == (2, 64, 64)
    assert len(list((tmp_path / "png").glob("*.png"))) == 2


@pytest.mark.filterwarnings("ignore:backbone tiny has RANDOM weights")
def test_own_scans_example_runs_on_the_bundled_files(tmp_path):
    """The two commands of "Use it on your own scans", run as written on a DICOM series (pydicom's MR_small,
    three instances) and a NIfTI volume (nibabel's anatomical.nii), with the tiny backbone's random weights
    in place of the ViT-L-14-336 file."""
    pydicom = pytest.importorskip("pydicom")
    nibabel = pytest.importorskip("nibabel")
    import csv
    import shlex
    import shutil

    from adsim.cli.main import main
    section = README.split("### Use it on your own scans", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    series = tmp_path / "ct_series"
    series.mkdir()
    ds = pydicom.dcmread(Path(pydicom.__file__).parent / "data" / "test_files" / "MR_small.dcm")
    for number in (1, 2, 3):
        ds.InstanceNumber = number
        ds.save_as(series / f"IM{number:04d}.dcm")
    shutil.copy(Path(nibabel.__file__).parent / "tests" / "data" / "anatomical.nii", tmp_path / "brain.nii")
    lines = block.strip().splitlines()
    assert len(lines) == 2
    weights = "--backbone ViT-L-14-336 --checkpoint ViT-L-14-336px.pt"
    for line in lines:
        assert line.startswith("python -m adsim predict") and weights in line
        line = line.replace(weights, "--backbone tiny --device cpu --no-progress")
        for old, new in (("ct_series/", f"{series}/"), ("brain.nii", str(tmp_path / "brain.nii")),
                         ("/tmp/pred_", f"{tmp_path}/pred_")):
            line = line.replace(old, new)
        assert main(shlex.split(line)[3:]) == 0
    ct = list(csv.DictReader((tmp_path / "pred_ct" / "scores.csv").read_text().splitlines()))
    assert [r["kind"] for r in ct] == ["image"] * 3 + ["volume"]
    brain = list(csv.DictReader((tmp_path / "pred_brain" / "scores.csv").read_text().splitlines()))
    assert [r["kind"] for r in brain] == ["slice"] * 25 + ["volume"]  # anatomical.nii: 25 axial slices
    for out in ("pred_ct", "pred_brain"):
        assert (tmp_path / out / "report.html").is_file()


def test_advise_example_runs():
    """The "Should I match?" block: poolsim.advise on a small data set (its seed count as written)."""
    (code,) = [b for b in _blocks("python") if "advise(" in b]
    namespace = {}
    exec(compile(code, "README.md", "exec"), namespace)
    advice = namespace["advice"]
    assert advice.strategy in ("match", "pool") and advice.tau > 0
    assert advice.vs_pool.n_seeds == namespace["SEEDS"]
