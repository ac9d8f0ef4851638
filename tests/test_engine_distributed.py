"""The Monte-Carlo engine under ``jax.distributed``: 2 local CPU processes vs one process, and
misconfiguration errors."""
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest

from poolsim import experiments

pytestmark = pytest.mark.slow  # two JAX processes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Small domain-addition set-up (few K values keep the compiles short); 7 seeds do not divide
# evenly over 2 processes, so the padding of the last block is exercised.
SMALL = dict(Ks=(5, 9, 12), n=40, every=3, radius=2.5, gamma=0.5, jitter=0.2)
SEEDS = 7

WORKER = textwrap.dedent("""
    import sys
    from poolsim import experiments
    port, pid, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    experiments.init_distributed(f"localhost:{port}", num_processes=2, process_id=pid,
                                 initialization_timeout=120)
    import jax
    assert jax.process_count() == 2 and jax.process_index() == pid
    df = experiments.run("domain_addition", seeds=%d, distributed=True, **%r)
    summ = experiments.summarize("domain_addition", seeds=%d, distributed=True, **%r)
    if jax.process_index() == 0:
        df.to_pickle(out)
        summ.to_pickle(out + ".summary")
    jax.distributed.shutdown()
""" % (SEEDS, SMALL, SEEDS, SMALL))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def test_two_processes_equal_one_process(tmp_path):
    import jax

    # The workers get this process's JAX set-up (conftest enables x64, which changes the draws).
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT,
               JAX_ENABLE_X64=str(int(jax.config.jax_enable_x64)))
    env.pop("XLA_FLAGS", None)
    out = str(tmp_path / "frame.pkl")
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(port), str(i), out], cwd=ROOT,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    try:
        logs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (_, err) in zip(procs, logs):
        assert p.returncode == 0, err[-3000:]
    got = pd.read_pickle(out)
    want = experiments.run("domain_addition", seeds=SEEDS, **SMALL)
    # Discrete outputs identical; estimates equal up to float32 rounding (each process runs a
    # batch of another shape, and XLA fuses reductions per shape: 1 ulp ~ 1.2e-7 seen).
    discrete = ["experiment", "strategy", "seed", "K", "n_domains", "converged", "n_iter"]
    pd.testing.assert_frame_equal(got[discrete], want[discrete])
    for col in ("eps", "est_0", "est_1"):
        np.testing.assert_allclose(got[col], want[col], rtol=1e-6, atol=1e-6)
    # The summary's moments, gathered from both processes (process 1's block has one padding
    # seed, which must not count), against the one-process summary: same seeds, same numbers up
    # to the estimates' float32 rounding above.
    summ = pd.read_pickle(out + ".summary")
    one = experiments.summarize("domain_addition", seeds=SEEDS, **SMALL)
    assert (summ.n_seeds == SEEDS).all()
    pd.testing.assert_frame_equal(summ, one, check_exact=False, rtol=1e-5, atol=1e-6)


def test_distributed_without_initialize_names_what_to_call():
    with pytest.raises(RuntimeError, match="jax.distributed.initialize.*JAX_COORDINATOR_ADDRESS"):
        experiments.run("domain_addition", seeds=2, distributed=True, **SMALL)
    with pytest.raises(ValueError, match="distributed must be True or False"):
        experiments.run("domain_addition", seeds=2, distributed="yes", **SMALL)


@pytest.mark.parametrize("env, kwargs, match", [
    ({"JAX_COORDINATOR_ADDRESS": "localhost"}, dict(num_processes=2, process_id=0),
     "JAX_COORDINATOR_ADDRESS must be 'HOST:PORT'"),
    ({"JAX_COORDINATOR_ADDRESS": "localhost:99999"}, dict(num_processes=2, process_id=0),
     "JAX_COORDINATOR_ADDRESS must be 'HOST:PORT'"),
    ({}, dict(coordinator_address=":1234", num_processes=2, process_id=0),
     "coordinator_address must be 'HOST:PORT'"),
    ({"JAX_LOCAL_DEVICE_IDS": "0,gpu1"}, dict(coordinator_address="h:1", num_processes=2,
                                             process_id=0), "JAX_LOCAL_DEVICE_IDS"),
    ({}, dict(coordinator_address="h:1", num_processes=0, process_id=0), "num_processes"),
    ({}, dict(coordinator_address="h:1", num_processes=2, process_id=2), "process_id"),
    ({}, dict(num_processes=2, process_id=1), "JAX_COORDINATOR_ADDRESS"),
])
def test_init_distributed_misconfiguration(monkeypatch, env, kwargs, match):
    # Every case fails in the checks, before jax.distributed.initialize is reached.
    import jax

    monkeypatch.delenv("JAX_COORDINATOR_ADDRESS", raising=False)
    monkeypatch.delenv("JAX_LOCAL_DEVICE_IDS", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(jax.distributed, "initialize",
                        lambda *a, **k: pytest.fail("initialize reached with a bad setting"))
    with pytest.raises(ValueError, match=match):
        experiments.init_distributed(**kwargs)
