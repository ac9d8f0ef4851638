"""Output folders under stress, through the CLI: one writer per folder (``poolsim.io.folder_lock``: a second
``train`` or ``predict --out`` is refused with one line naming the holder's PID and host, ``--wait`` waits,
a dead holder's lock does not block), and a full disk or a read-only folder (a tiny tmpfs, mounted where
the tests run as root and may mount; skipped with the reason elsewhere): one line naming the file and
why, exit 2, the previous checkpoint intact, no temporary file left."""
import contextlib
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from adsim.cli.main import main
from adsim.runtime.io import load_torch

pytestmark = pytest.mark.filterwarnings("ignore::adsim.model.backbone.RandomWeightsWarning")

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--backbone", "tiny", "--device", "cpu", "--no-progress"]
TRAIN = ["--target", "Brain", "--train-domains", "Liver", "Chest", "--batch-size", "4", "--compile", "off", *TINY]
HOLD = "import sys, time; from poolsim.io import folder_lock; l = folder_lock(sys.argv[1]).__enter__(); " \
       "print('held', flush=True); time.sleep(float(sys.argv[2]))"


@contextlib.contextmanager
def _holder(folder: Path, seconds: float):
    """A process holding ``folder``'s lock for ``seconds`` (yielded once it holds it; killed on the way out,
    so 600 means: until the test is done, however long a busy machine takes)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder), str(seconds)], stdout=subprocess.PIPE,
                            text=True, env=env, cwd=ROOT)
    try:
        assert proc.stdout.readline().strip() == "held"
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()


def _predict(toy_root, out, *extra):
    image = sorted((toy_root / "Brain_AD" / "test" / "good" / "img").iterdir())[0]
    return main(["predict", "--zero-shot", "winclip", *TINY, str(image), "--out", str(out), *extra])


def test_a_second_writer_is_refused_naming_the_holder(toy_root, tmp_path, capsys):
    out = tmp_path / "out"
    with _holder(out, 600) as holder:
        for argv in (["train", "--data", str(toy_root), *TRAIN, "--epochs", "1", "--out", str(out)], None):
            capsys.readouterr()
            assert (main(argv) if argv else _predict(toy_root, out)) == 2
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and "Traceback" not in err[0]
            assert f"in use by pid {holder.pid} on {socket.gethostname()}" in err[0] and "--wait" in err[0]
    assert not (out / "checkpoint_last.pt").exists() and not (out / "scores.csv").exists()


@pytest.mark.slow
def test_wait_waits_for_the_holder_and_a_dead_holder_does_not_block(toy_root, tmp_path):
    out = tmp_path / "out"
    with _holder(out, 3) as holder:
        assert _predict(toy_root, out, "--wait") == 0
        assert holder.poll() is not None  # the lock is released when the holder exits: it had to end first
    with _holder(out, 600) as holder:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        assert f"pid {holder.pid}" in (out / ".lock").read_text()  # the stale lock file still names it
        assert _predict(toy_root, out) == 0


# -- a full disk, a read-only folder ------------------------------------------------------------------------

@contextlib.contextmanager
def _tmpfs(where: Path, size_kib: int):
    """A tmpfs of ``size_kib`` KiB mounted on ``where`` (skip with the reason where that is impossible)."""
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("a full disk is simulated with a tiny tmpfs, which needs root to mount")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(where)],
                       capture_output=True, text=True, check=False)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here (container without CAP_SYS_ADMIN?): {r.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _sizes_kib(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file()) // 1024


@pytest.fixture(scope="module")
def one_epoch(toy_root, tmp_path_factory):
    """A finished 1-epoch run (its files' sizes tell how small a disk to give the next one)."""
    out = tmp_path_factory.mktemp("sizes") / "run"
    assert main(["train", "--data", str(toy_root), *TRAIN, "--epochs", "1", "--out", str(out)]) == 0
    return out


def test_a_disk_that_fills_during_training_keeps_the_previous_checkpoint(one_epoch, toy_root, tmp_path, capsys):
    """Room for epoch 0's files and a little more: epoch 1's checkpoint write fails with ENOSPC."""
    with _tmpfs(tmp_path / "disk", _sizes_kib(one_epoch) + 64) as disk:
        out = disk / "run"
        capsys.readouterr()
        assert main(["train", "--data", str(toy_root), *TRAIN, "--epochs", "3", "--out", str(out)]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()[-1:]
        assert line.startswith("error: No space left on device: ") and line.split(": ")[-1] in {
            str(out / n) for n in ("checkpoint_last.pt", "checkpoint_best.pt", "history.json")}
        assert load_torch(out / "checkpoint_last.pt")["epoch"] == 0  # the previous checkpoint, whole
        assert list(out.glob(".*.tmp")) == []


def test_predict_onto_a_full_disk_names_the_file(toy_root, tmp_path, capsys):
    with _tmpfs(tmp_path / "disk", 16) as disk:
        (disk / "filler").write_bytes(b"\0" * (8 * 1024))  # 2 of its 4 pages: room for the lock file and little else
        capsys.readouterr()
        assert _predict(toy_root, disk / "out") == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith(f"error: No space left on device: {disk / 'out'}/") and "Traceback" not in err


def test_a_read_only_folder_is_refused_before_any_work(one_epoch, toy_root, tmp_path, capsys):
    import shutil

    with _tmpfs(tmp_path / "disk", _sizes_kib(one_epoch) + 256) as disk:
        run = disk / "run"
        shutil.copytree(one_epoch, run)
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        before = (run / "checkpoint_last.pt").read_bytes()
        for argv in (["train", "--data", str(toy_root), *TRAIN, "--epochs", "2", "--out", str(run), "--resume"],
                     ["predict", "--run", str(run), "--out", str(run / "pred"), "--no-progress",
                      str(next((toy_root / "Brain_AD" / "test" / "good" / "img").iterdir()))]):
            capsys.readouterr()
            assert main(argv) == 2
            (line,) = capsys.readouterr().err.strip().splitlines()[-1:]
            assert "not writable" in line and "Read-only file system" in line
        assert (run / "checkpoint_last.pt").read_bytes() == before
