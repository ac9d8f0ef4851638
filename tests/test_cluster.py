"""poolsim's decision map on scheduler jobs (:mod:`poolsim.cluster`, submitit's local executor, 2 workers):
the same ``Moments``, bit for bit, as the one-process run (the reference is ``run_grid`` itself without a
scheduler); failing jobs are reported with their logs."""
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from poolsim import _cluster, _phase, cluster

pytest.importorskip("submitit", reason='the scheduler extra: pip install -e ".[cluster]"')
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _children_import_this_checkout(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")


@pytest.mark.slow
def test_decision_map_seed_blocks_as_jobs_are_bit_identical(tmp_path):
    spec = _phase.GridSpec("contaminated", (5, 10), (50,), (0.5, 1.0))
    args = ([0.1, 0.3], [1.0, 4.0])
    here = _phase.run_grid(spec, *args, seeds=40, chunk=8)
    res = cluster.Resources(executor="processes", max_concurrent=2, poll_s=0.2)
    jobs = _phase.run_grid(spec, *args, seeds=40, chunk=8, resources=res, jobs_dir=tmp_path / "jobs")
    assert len(list((tmp_path / "jobs" / "logs").glob("*_log.out"))) == 2  # 5 chunks -> blocks of 3 and 2
    for a, b in zip(here, jobs):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(ValueError, match="jobs_dir"):
        _phase.run_grid(spec, *args, seeds=4, resources=res)
    with pytest.raises(ValueError, match="submit_only"):
        _phase.run_grid(spec, *args, seeds=4, resources=res._replace(executor="slurm", submit_only=True),
                        jobs_dir=tmp_path / "jobs")


def test_decision_map_job_names_are_stable_and_differ_between_grids(tmp_path, monkeypatch):
    """A re-run finds its own Slurm jobs by name (same grid, same names); another grid in the same folder
    (other taus, other seeds) never takes them for its own (different names). A block with the very same
    arguments would get the same name: its result is the same."""
    seen = []

    def capture(folder, jobs, res, **kw):
        seen.append([j.name for j in jobs])
        raise RuntimeError("captured")

    monkeypatch.setattr(_cluster, "run_jobs", capture)  # what _phase calls (poolsim.cluster re-exports it)
    spec = _phase.GridSpec("contaminated", (5, 10), (50,), (0.5, 1.0))
    res = cluster.Resources(executor="slurm", max_concurrent=2)
    for s, taus, seeds in ((spec, None, 40), (spec, None, 40), (spec, (0.5, 2.0), 40), (spec, None, np.arange(40, 80))):
        with pytest.raises(RuntimeError, match="captured"):
            _phase.run_grid(s._replace(taus=taus or s.taus), [0.1, 0.3], [1.0, 4.0], seeds=seeds, chunk=8,
                            resources=res, jobs_dir=tmp_path)
    assert seen[0] == seen[1] and len(seen[0]) == 2
    assert not set(seen[0]) & set(seen[2]) and not set(seen[0]) & set(seen[3])


def test_failed_jobs_are_reported_with_their_logs(tmp_path):
    res = cluster.Resources(executor="processes", max_concurrent=2, retries=1, poll_s=0.2)
    out = cluster.run_jobs(tmp_path, [cluster.Job("ok", math.sqrt, (4.0,)), cluster.Job("bad", math.sqrt, (-1.0,))],
                           res, progress=False)
    assert out.results == {"ok": 2.0} and out.pending == []
    (name, log, why), = out.failed
    assert name == "bad" and why == "ValueError: math domain error"
    assert "math domain error" in Path(log).read_text()
    assert len(list((tmp_path / "logs").glob("*_log.out"))) == 1 + 2  # ok once, bad twice (one retry)


@pytest.mark.slow
def test_phase_figure_with_executor_processes_writes_the_local_files(tmp_path):
    """``python -m poolsim.figures --only phase --quick`` with seed blocks as jobs (2 workers): every file byte
    for byte the local run's. ``--quick`` (3 seeds, one chunk) makes one job per law, so the figure's path is
    what is tested here; several blocks per grid are summed in the tests above and below.

    Both runs are the command itself in a fresh interpreter, as a user starts it, with a compile cache of this
    test's own: the jobs then find the programs the local run compiled (~20 s of XLA work per law). A job's
    cache key holds the XLA flags its JAX started with, which an in-process run could not match here (this
    process's JAX started before the figure command sets its compile flag)."""
    env = {**os.environ, "POOLSIM_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("XLA_FLAGS", None)  # the figure command chooses its compile flag, as for a user
    base = [sys.executable, "-m", "poolsim.figures", "--only", "phase", "--quick", "--format", "png"]
    jobs = tmp_path / "jobs"
    for extra in (["--out", str(tmp_path / "local")],
                  ["--out", str(tmp_path / "proc"), "--executor", "processes", "--max-concurrent", "2",
                   "--jobs-dir", str(jobs)]):
        r = subprocess.run([*base, *extra], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(p.relative_to(jobs).parts[0] for p in jobs.glob("*/logs/*_log.out")) == [
        "contaminated", "outlier_schedule"]
    names = sorted(p.name for p in (tmp_path / "local").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "proc").iterdir())
    assert {"phase.csv", "phase.png", "summary.md", "verdicts.csv"} <= set(names)
    for name in names:
        assert (tmp_path / "local" / name).read_bytes() == (tmp_path / "proc" / name).read_bytes(), name


def test_figures_executor_needs_a_figure_that_takes_jobs(tmp_path, capsys):
    from poolsim.figures import __main__ as cli

    assert cli.main(["--only", "asymptotic", "--out", str(tmp_path), "--executor", "processes"]) == 1
    assert "none of the figures made (asymptotic) runs seed blocks as jobs; those that do: phase" in \
        capsys.readouterr().err
    assert cli.main(["--only", "phase", "--out", str(tmp_path), "--executor", "sge"]) == 1
    assert "--executor must be one of" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_cluster_flags_parse_into_checked_resources():
    import argparse

    p = argparse.ArgumentParser()
    cluster.add_arguments(p, unit="seed block")
    res = cluster.resources_from_args(p.parse_args([
        "--executor", "slurm", "--max-concurrent", "4", "--gpus-per-cell", "1", "--partition", "gpu",
        "--slurm-set", "account=lab", "mail-type=END", "--setup", "module load cuda"]))
    assert res == cluster.Resources(executor="slurm", max_concurrent=4, gpus_per_cell=1, partition="gpu",
                                    slurm={"account": "lab", "mail_type": "END"}, setup=("module load cuda",),
                                    poll_s=30.0)
    assert cluster.resources_from_args(p.parse_args([])) == cluster.Resources()
    with pytest.raises(ValueError, match="--slurm-set expects KEY=VALUE"):
        cluster.resources_from_args(p.parse_args(["--slurm-set", "account"]))
    with pytest.raises(ValueError, match="--max-concurrent must be an integer >= 1"):
        cluster.resources_from_args(p.parse_args(["--max-concurrent", "0"]))


def test_figures_default_jobs_folder_is_git_ignored():
    """A failed figure run keeps ``OUT/.figures-jobs`` (its logs): nothing there is offered for a commit."""
    from poolsim.figures import __main__ as cli

    r = subprocess.run(["git", "check-ignore", "-q", f"figures/{cli.JOBS_DIR}/contaminated/logs/1_0_log.out"],
                       cwd=ROOT, capture_output=True)
    if r.returncode == 128:
        pytest.skip("not a git checkout")
    assert r.returncode == 0
