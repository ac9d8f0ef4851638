"""Grid cells as scheduler jobs (``--executor processes|slurm``, :mod:`poolsim.cluster`) and the output
folder's lock: same CSV bytes as the sequential runner with 2 workers, a worker killed mid-cell retried
with the result unchanged, a driver killed by SIGKILL resumed, the Slurm job script, one driver per folder.

The expected CSVs are the sequential runner's own (``--executor local``, today's code path), computed in
this module; the job runs must reproduce them byte for byte."""
import functools
import json
import math
import os
import signal
import socket
import threading
import time
from pathlib import Path

import _crash
import pytest

from adsim.cli.main import main
from adsim.data import sim
from adsim.experiments import protocol, sources, table
from poolsim import cluster
from poolsim.io import folder_lock

pytest.importorskip("submitit", reason='the scheduler extra: pip install -e ".[cluster]"')
pytestmark = pytest.mark.filterwarnings("ignore::adsim.model.backbone.RandomWeightsWarning")
ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--sim", "n_train=6", "n_test=8", "n_layers=2", "--epochs", "1", "--batch-size", "16"]
# 2 seeds x 2 methods, one target and order: 4 cells (similarity.csv gets two seeds, variance.csv VACA's);
# every job pays a fresh interpreter's torch import (~8 s CPU), so the grids here are small
PROTO = ["protocol", "--simulate", "--quick", "--seeds", "2", "--targets", "Brain", "--methods", "naive",
         "match-geodesic-vaca", "--orders", "hardest", "--no-progress", *SMALL]
ONE = ["protocol", "--simulate", "--quick", "--targets", "Chest", "--methods", "naive", "--orders", "hardest",
       "--no-progress", *SMALL]
PROTO_CSVS = ("protocol.csv", "da.csv", "similarity.csv", "variance.csv", "vaca_gains.csv")
TABLE = dict(methods=["naive", "winclip"], targets=["Chest"], shots=[0, 2], backbone="tiny", epochs=4,
             batch_size=8, progress=False)


@pytest.fixture(autouse=True)
def _children_import_this_checkout(monkeypatch):
    """Job processes import adsim / poolsim from this checkout, as the test process does."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")


@pytest.fixture(scope="module")
def sequential_protocol(tmp_path_factory):
    out = tmp_path_factory.mktemp("seq") / "proto"
    assert main([*PROTO, "--out", str(out)]) == 0
    return out


def _same_bytes(a: Path, b: Path, names) -> None:
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


@pytest.mark.slow
def test_protocol_as_jobs_on_two_workers_writes_the_sequential_csvs(sequential_protocol, tmp_path, capsys):
    out = tmp_path / "jobs"
    assert main([*PROTO, "--out", str(out), "--executor", "processes", "--max-concurrent", "2"]) == 0
    assert "computed 4 cells" in capsys.readouterr().out
    _same_bytes(sequential_protocol, out, PROTO_CSVS)
    assert len(list((out / "jobs" / "logs").glob("*_log.out"))) == 4  # one job per cell
    # a re-run finds every cell by its file: nothing submitted, nothing rewritten
    mtimes = {p: p.stat().st_mtime_ns for p in (out / "cells").iterdir()}
    assert main([*PROTO, "--out", str(out), "--executor", "processes", "--max-concurrent", "2"]) == 0
    assert "computed 0 cells, kept 4" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in (out / "cells").iterdir()} == mtimes
    assert len(list((out / "jobs" / "logs").glob("*_log.out"))) == 4


def _kill_when(path: Path, lock: Path, forbidden: Path, killed: list, timeout: float = 120.0) -> None:
    """SIGKILL the process holding ``lock`` (its job) once ``path`` exists and ``forbidden`` does not."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists() and lock.exists():
            holder = lock.read_text().split()
            if holder and not forbidden.exists():
                pid = int(holder[1])
                os.kill(pid, signal.SIGKILL)
                killed.append((pid, sorted(p.name for p in path.parent.iterdir())))
                return
        time.sleep(0.02)


@pytest.mark.slow
def test_table_as_jobs_a_killed_worker_is_retried_and_resumes(toy_root, tmp_path):
    ref = tmp_path / "seq"
    table.run(ref, toy_root, **TABLE)
    out = tmp_path / "jobs"
    run = out / "runs" / "Chest" / "naive"
    killed = []
    killer = threading.Thread(target=_kill_when, args=(run / "checkpoint_last.pt", out / "jobs" / "Chest__naive" /
                                                       ".lock", run / "trained.json", killed))
    killer.start()
    done = table.run(out, toy_root, **TABLE, resources=cluster.Resources(executor="processes", max_concurrent=2,
                                                                          retries=1, poll_s=0.2))
    killer.join()
    assert killed, "the worker was not killed during its training run"
    assert "trained.json" not in killed[0][1]  # killed mid-training, after a checkpoint
    with pytest.raises(ProcessLookupError):
        os.kill(killed[0][0], 0)
    assert sorted(done["computed"]) == sorted(table.cell_name("Chest", m, k) for m in ("naive", "winclip")
                                               for k in (0, 2))
    # 3 jobs: (Chest, naive) twice (killed, then resubmitted), (Chest, winclip) once
    assert len(list((out / "jobs" / "logs").glob("*_log.out"))) == 3
    history = json.loads((run / "history.json").read_text())["history"]
    assert [h["epoch"] for h in history] == [0, 1, 2, 3]
    _same_bytes(ref, out, ["table.csv"])


@pytest.mark.slow
def test_sweep_as_jobs_on_two_workers_writes_the_sequential_csvs(tmp_path):
    """Two configurations (the default ``shared`` and one other), one method, two targets: 4 cells as jobs on 2
    workers; ``sweep.csv`` and every configuration's CSVs are the sequential sweep's bytes."""
    from adsim.experiments.sweep import sweep

    base = sim.validate(sim.SimParams(n_train=4, n_test=6, n_layers=1))
    st = protocol.Settings(data="simulated", sim=base._asdict(), epochs=1, batch_size=16, lr=3e-3)
    grid = {"shared": (0.0, base.shared)}
    targets = ("Brain", "Chest")
    seq = sweep(tmp_path / "seq", base, st, methods=("naive",), grid=grid, progress=False, targets=targets)
    jobs = sweep(tmp_path / "jobs", base, st, methods=("naive",), grid=grid, progress=False, targets=targets,
                 resources=cluster.Resources(executor="processes", max_concurrent=2, poll_s=0.2))
    assert len(seq) == len(jobs) == 2 * 3  # per configuration: Brain (tasks AC and AS), Chest (AC)
    _same_bytes(tmp_path / "seq", tmp_path / "jobs", ["sweep.csv"])
    for config in ("default", "shared=0.0"):
        csvs = sorted(p.name for p in (tmp_path / "seq" / config).glob("*.csv"))
        assert "protocol.csv" in csvs and csvs == sorted(p.name for p in (tmp_path / "jobs" / config).glob("*.csv"))
        _same_bytes(tmp_path / "seq" / config, tmp_path / "jobs" / config, csvs)
        assert len(list((tmp_path / "jobs" / config / "jobs" / "logs").glob("*_log.out"))) == 2  # one per cell


@pytest.mark.slow
def test_a_failing_cell_is_reported_with_its_log(tmp_path):
    # every job of the grid raises (its source cannot be built): each is submitted 1 + retries times,
    # then reported with the last line of its error and its log file, and no CSV row is invented
    params = sim.validate(sim.SimParams(n_train=4, n_test=4, n_layers=1))
    settings = protocol.Settings(data="simulated", sim=params._asdict(), epochs=1, batch_size=16, lr=3e-3)
    out = tmp_path / "failing"
    with pytest.raises(cluster.GridFailed) as err:
        protocol.run(out, functools.partial(math.sqrt, -1.0), settings, targets=["Chest"], methods=["naive"],
                     orders=["hardest"], seeds=1, progress=False,
                     resources=cluster.Resources(executor="processes", retries=1, poll_s=0.2))
    (name, log, why), = err.value.failed
    assert name == "Chest__naive__hardest__cumulative__s0" and "TypeError" in why
    assert Path(log).is_file() and "TypeError" in Path(log).read_text()
    assert f"{name}: {why} (log: {log})" in str(err.value)
    assert len(list((out / "jobs" / "logs").glob("*_log.out"))) == 2  # first try + one retry
    assert not list((out / "cells").glob("*.json")) and len(protocol.pd.read_csv(out / "protocol.csv")) == 0


def test_slurm_job_array_script_and_resubmission(tmp_path, monkeypatch, capsys):
    """Fake ``sbatch`` / ``sacct`` on PATH record what submitit hands to Slurm: one job array of the
    missing cells with the requested resources; a re-run attaches to the queued jobs instead of
    submitting them again."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "sbatch_calls"
    (bin_dir / "sbatch").write_text(f"#!/bin/sh\ncat \"$1\" > {calls}.$$\necho 'Submitted batch job 4242'\n")
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 1\n")  # submitit looks for it; never run here
    (bin_dir / "sacct").write_text("#!/bin/sh\necho 'JobID|State|NodeList'\n"
                                   "for i in 0 1 2 3; do echo \"4242_$i|PENDING|None\"; done\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "proto"
    argv = [*PROTO, "--out", str(out), "--executor", "slurm", "--partition", "gpu",
            "--gpus-per-cell", "1", "--cpus-per-cell", "4", "--time-limit", "90", "--max-concurrent", "3",
            "--slurm-set", "account=lab", "--setup", "source .venv/bin/activate", "--submit-only"]
    assert main(argv) == 0
    assert "submitted 4 cells" in capsys.readouterr().out
    scripts = sorted(tmp_path.glob("sbatch_calls.*"))
    assert len(scripts) == 1  # one array for the 4 cells
    script = scripts[0].read_text()
    for line in ("#SBATCH --array=0-3%3", "#SBATCH --partition=gpu", "#SBATCH --gpus-per-node=1",
                 "#SBATCH --cpus-per-task=4", "#SBATCH --time=90", "#SBATCH --account=lab",
                 "#SBATCH --ntasks-per-node=1", "#SBATCH --nodes=1", "#SBATCH --signal=USR2@",
                 "source .venv/bin/activate", "-m submitit.core._submit"):
        assert line in script, line
    records = sorted((out / "jobs").glob("*.job"))
    assert sorted(json.loads(r.read_text())["job_id"] for r in records) == [f"4242_{i}" for i in range(4)]
    assert not (out / "protocol.csv").exists()  # nothing to merge yet
    # the re-run sees the 4 jobs still queued (sacct): nothing submitted again
    assert main(argv) == 0
    assert "submitted 4 cells" in capsys.readouterr().out and len(list(tmp_path.glob("sbatch_calls.*"))) == 1


def test_a_second_driver_is_refused_or_waits(tmp_path, capsys):
    out = tmp_path / "busy"
    argv = [*ONE, "--out", str(out)]
    with folder_lock(out):
        assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err
    assert f"pid {os.getpid()} on {socket.gethostname()}" in err and "--wait" in err
    assert not (out / "protocol.json").exists()
    lock = folder_lock(out).__enter__()
    threading.Timer(1.0, lock.release).start()
    assert main([*argv, "--wait"]) == 0  # waits for the holder, then runs
    assert (out / "protocol.csv").exists()


@pytest.mark.slow
def test_a_driver_killed_by_sigkill_resumes_and_a_partial_cell_is_not_merged(sequential_protocol, tmp_path):
    # killed inside its third cell's write (the temporary file written, not moved in place), wherever that
    # falls in time: two of the four cells are done
    out = tmp_path / "killed"
    rc, _ = _crash.run_child([*PROTO, "--out", str(out)], ("write", "cells/*.json", 3), timeout=600)
    assert rc == -signal.SIGKILL
    cells = sorted((out / "cells").glob("*.json"))
    assert len(cells) == 2 and len(list((out / "cells").glob(".*.tmp"))) == 1
    # a partially written cell (as a copy cut short would leave it) is never taken as finished
    truncated = cells[0].read_bytes()[:40]
    cells[0].write_bytes(truncated)
    assert main([*PROTO, "--out", str(out)]) == 0  # the kernel dropped the dead driver's lock
    assert cells[0].read_bytes() != truncated
    _same_bytes(sequential_protocol, out, PROTO_CSVS)


def test_resources_are_checked():
    for field, value, msg in (("executor", "sge", "--executor must be one of"),
                              ("max_concurrent", 0, "--max-concurrent must be an integer >= 1"),
                              ("retries", -1, "--retries must be an integer >= 0"),
                              ("submit_only", True, "--submit-only needs --executor slurm")):
        with pytest.raises(ValueError, match=msg):
            cluster.check_resources(cluster.Resources(executor="processes")._replace(**{field: value}))


def test_source_factories_pickle_without_their_data():
    import pickle

    params = sim.validate(sim.SimParams(n_train=4, n_test=4, n_layers=1))
    lazy = sources.Lazy(sources.simulated, params, 0)
    first = lazy(0)
    assert lazy(1) is first  # built once per process, whatever the seed
    assert pickle.loads(pickle.dumps(lazy))._built is None
    assert protocol.compute_cell.__module__ == "adsim.experiments.protocol"  # importable by the job
