"""The engine's accelerator path (``POOLSIM_ENGINE_PATH=accelerator``: XLA medians inside the estimates
program, no compaction stages, chunks kept on the device and gathered once) run on the CPU, so CI covers
the code a GPU runs: same numbers as the CPU path, and the number of programs it compiles pinned."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from poolsim import _engine
from poolsim import experiments as ex

SMALL = dict(Ks=(5, 9, 12), n=40)


@pytest.mark.parametrize("materialize", [False, True])
def test_accelerator_path_gives_the_cpu_paths_numbers(monkeypatch, materialize):
    # 70 seeds: a full chunk of 64 and a padded one of the same shape, so the device-side gather cuts padding
    spec, _ = ex.spec("domain_addition", materialize=materialize, **SMALL)
    spec = spec._replace(tol=1.25e-4)  # a spec no other test compiles
    monkeypatch.setenv(_engine.PATH_ENV, "cpu")
    cpu = _engine.simulate(spec, np.arange(70), chunk=64)
    monkeypatch.setenv(_engine.PATH_ENV, "accelerator")
    assert _engine.accelerator_path() and not _engine.host_medians_outside(spec)
    acc = _engine.simulate(spec, np.arange(70), chunk=64)
    for name, a, b in zip(cpu._fields, cpu, acc):  # one run, one machine: bit for bit
        np.testing.assert_array_equal(a, b, err_msg=name)
    # the accelerator path's programs are their own (their own key), one shape each
    assert [f._cache_size() for f in _engine.compiled(spec, "float32")] == [1, 1]
    monkeypatch.setenv(_engine.PATH_ENV, "cpu")
    assert [f._cache_size() for f in _engine.compiled(spec, "float32")] == [1, 1]


def test_unknown_path_is_one_clear_error(monkeypatch):
    monkeypatch.setenv(_engine.PATH_ENV, "gpu")
    with pytest.raises(ValueError, match="POOLSIM_ENGINE_PATH must be one of"):
        _engine.accelerator_path()


# A fresh process (nothing compiled, no program store) runs the same small experiment on each path and
# counts XLA's backend compilations (jax.monitoring) and the engine's traces.
_CHILD = textwrap.dedent("""
    import json, os, sys
    import jax, numpy as np
    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda ev, dur, **kw: compiles.append(dur) if ev == "/jax/core/compile/backend_compile_duration" else None)
    from poolsim import _engine, experiments as ex
    out = {}
    for path in ("cpu", "accelerator"):
        os.environ[_engine.PATH_ENV] = path
        for mat in (False, True):
            spec, _ = ex.spec("domain_addition", materialize=mat, Ks=(5, 9, 12), n=40)
            n0 = len(compiles)
            _engine.simulate(spec, np.arange(70), chunk=64)
            out[f"{path} materialize={mat}"] = {
                "compiles": len(compiles) - n0, "compile_s": sum(compiles[n0:]),
                "programs": [f._cache_size() for f in _engine.compiled(spec, "float32")]}
    print(json.dumps(out))
""")


@pytest.mark.slow
def test_programs_compiled_per_path_are_pinned():
    env = {**os.environ, "POOLSIM_CACHE_DIR": "off", "JAX_PLATFORMS": "cpu"}
    env.pop(_engine.PATH_ENV, None)
    p = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    print(got)  # compile seconds per path, for the record (-s)
    # each path: the draws and the estimates program, one chunk shape (64; the padded chunk has the same)
    assert {k: v["programs"] for k, v in got.items()} == {k: [1, 1] for k in got}
    # XLA compilations: the CPU path compiles exactly the engine's two programs; the accelerator path also
    # compiles its device-side gather (slices of the padded chunk and concatenations of the result fields:
    # 12 small programs), once per process -- the materialised run after it reuses them (same field shapes)
    assert {k: v["compiles"] for k, v in got.items()} == {
        "cpu materialize=False": 2, "cpu materialize=True": 2,
        "accelerator materialize=False": 2 + 12, "accelerator materialize=True": 2}
    assert all(v["compile_s"] > 0 for v in got.values())
