"""poolsim's decision map on scheduler jobs (:mod:`poolsim.cluster`, submitit's local executor, 2 workers):
the same ``Moments``, bit for bit, as the one-process run (the reference is ``run_grid`` itself without a
scheduler); failing jobs are reported with their logs."""
import math
import os
from pathlib import Path

import numpy as np
import pytest

from poolsim import _phase, cluster

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


def test_failed_jobs_are_reported_with_their_logs(tmp_path):
    res = cluster.Resources(executor="processes", max_concurrent=2, retries=1, poll_s=0.2)
    out = cluster.run_jobs(tmp_path, [cluster.Job("ok", math.sqrt, (4.0,)), cluster.Job("bad", math.sqrt, (-1.0,))],
                           res, progress=False)
    assert out.results == {"ok": 2.0} and out.pending == []
    (name, log, why), = out.failed
    assert name == "bad" and why == "ValueError: math domain error"
    assert "math domain error" in Path(log).read_text()
    assert len(list((tmp_path / "logs").glob("*_log.out"))) == 1 + 2  # ok once, bad twice (one retry)
