"""Hard stops: ``python -m adsim train`` killed by SIGKILL (real processes, ``_crash.py``) inside checkpoint
writes, at seeded random moments and inside a sequential (BiLoRA) domain, then ``--resume``d, ends
bitwise where the uninterrupted run ends (head, optimiser, history, best checkpoint, history.json); no
file under its final name is ever a part; a damaged checkpoint is a one-line error, not a crash inside
torch. More moments: ``benchmarks/crash_soak.py``."""
import numpy as np
import pytest

import _crash
from adsim.cli.main import main

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::adsim.model.backbone.RandomWeightsWarning")]

# toy data (conftest: 2 normal + 2 anomalous images per domain and split); valid+test of two domains,
# a quarter held out for checkpoint selection: 12 training images, batch 4 -> 3 steps per epoch
POOLED = ["--target", "Brain", "--train-domains", "Liver", "Chest", "--backbone", "tiny", "--epochs", "3",
          "--batch-size", "4", "--device", "cpu", "--no-progress", "--select-heldout", "0.25", "--compile", "off"]
SEQUENTIAL = ["--recipe", "bilora", "--target", "Brain", "--train-domains", "Liver", "Chest", "--backbone", "tiny",
              "--epochs", "2", "--batch-size", "4", "--device", "cpu", "--no-progress", "--compile", "off"]


@pytest.fixture(scope="module")
def pooled_reference(toy_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("crash") / "reference"
    rc, seconds = _crash.run_child(["train", "--data", str(toy_root), *POOLED, "--out", str(out)])
    assert rc == 0
    return out, seconds


def test_killed_inside_writes_and_at_random_moments_resumes_to_the_same_run(pooled_reference, toy_root, tmp_path):
    """Four kills in one run: inside the 1st write of checkpoint_best.pt (epoch 0 always selects; best is
    written before last, so no checkpoint_last.pt exists yet and the resume starts over), inside the 2nd
    write of checkpoint_last.pt of the next start (the temporary file complete, not moved in), inside the
    last epoch's history.json write of the start after (its 3rd: the resume's own rewrite, epochs 1 and 2;
    the checkpoint is complete, history.json an epoch behind: the next resume has no epoch left to train
    and must still bring it up to date), and at a seeded random
    moment (``_crash.random_moments``); each start after a kill passes ``--resume``."""
    ref, seconds = pooled_reference
    rng = np.random.default_rng(33)
    timed = [m for m in _crash.random_moments(rng, 2, seconds, 3) if m[0] == "timer"]
    moments = [("write", "checkpoint_best.pt", 1), ("write", "checkpoint_last.pt", 2), ("write", "history.json", 3),
               *timed]
    out = tmp_path / "run"
    log = _crash.kill_and_resume(["--data", str(toy_root), *POOLED], out, moments)
    # the write kills happened inside the write: the temporary file was left behind, the final name kept
    # the previous checkpoint; the resumed start removed the leftovers
    assert [rc for m, rc, _ in log if m[0] == "write"] == [-9, -9, -9]
    assert all(any(s.startswith(f".{m[1]}.") for s in stale) for m, _, stale in log if m[0] == "write")
    assert list(out.glob(".*.tmp")) == []
    assert _crash.differences(ref, out) == []


def test_killed_inside_a_sequential_domain_resumes_to_the_same_run(toy_root, tmp_path):
    """BiLoRA trains Liver, then Chest: killed inside the write of Chest's first checkpoint (the 3rd write
    of checkpoint_last.pt: domain 1, epoch 0) and again at a seeded random moment of the resumed run."""
    ref = tmp_path / "reference"
    rc, seconds = _crash.run_child(["train", "--data", str(toy_root), *SEQUENTIAL, "--out", str(ref)])
    assert rc == 0
    rng = np.random.default_rng(3300)
    moments = [("write", "checkpoint_last.pt", 3), ("timer", round(float(rng.uniform(0.5, 1.0) * seconds), 2))]
    out = tmp_path / "run"
    log = _crash.kill_and_resume(["--data", str(toy_root), *SEQUENTIAL], out, moments)
    assert log[0][1] == -9
    assert _crash.differences(ref, out) == []


def test_a_truncated_checkpoint_is_refused_in_one_line(pooled_reference, toy_root, tmp_path, capsys):
    """A checkpoint cut short (copied by a tool that died, a disk that filled under a non-atomic writer):
    ``--resume`` and ``predict --run`` refuse it naming the file, exit 2, no traceback."""
    import shutil

    ref, _ = pooled_reference
    run = tmp_path / "run"
    shutil.copytree(ref, run)
    data = (run / "checkpoint_last.pt").read_bytes()
    (run / "checkpoint_last.pt").write_bytes(data[: len(data) // 2])
    # config.json records the run's --out: resume it where it was made
    import json

    record = json.loads((run / "config.json").read_text())
    record["config"]["out"] = str(run)
    (run / "config.json").write_text(json.dumps(record))
    capsys.readouterr()
    assert main(["train", "--data", str(toy_root), *POOLED, "--out", str(run), "--resume"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()[-1:]
    assert line.startswith(f"error: checkpoint {run / 'checkpoint_last.pt'} is corrupt")
    image = next((toy_root / "Brain_AD" / "test" / "good" / "img").iterdir())
    assert main(["predict", "--run", str(run), "--checkpoint", "last", "--out", str(tmp_path / "p"), "--no-progress",
                 str(image)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"checkpoint {run / 'checkpoint_last.pt'} is corrupt" in err.splitlines()[-1]
