"""Compile once per machine (``adsim.runtime.compile_cache``): a second process that compiles the same step
loads inductor's generated code and the AOT-autograd graphs from ``poolsim.io.cache_dir("torch-inductor")``
instead of generating them, as torch's own counters show (``fxgraph_cache_hit``, ``autograd_cache_hit``;
not timing). The step is a small function with a backward through adsim's compile path
(``adsim.training.compiled_step``'s regions, inductor backend): the cache does not depend on the step's
size, and inductor's C++ code generation of the tiny backbone's whole step takes minutes on the CI machine.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from adsim.runtime import compile_cache

ROOT = Path(__file__).resolve().parents[2]
CHILD = """
import json, torch
from torch._dynamo.utils import counters
from adsim.training import compiled_step
regions = compiled_step._Regions("default", "inductor", False)
w = torch.linspace(-1, 1, 64).reshape(8, 8).requires_grad_(True)
step = regions.compile(lambda x: (x @ w).tanh().square().sum())
step(torch.ones(4, 8)).backward()
assert not regions.fell_back
print("RESULT " + json.dumps({"fx_hit": counters["inductor"]["fxgraph_cache_hit"],
                              "fx_miss": counters["inductor"]["fxgraph_cache_miss"],
                              "aot_hit": counters["aot_autograd"]["autograd_cache_hit"],
                              "grad": w.grad.sum().item()}))
"""


def _child(env_over: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHINDUCTOR_", "TRITON_CACHE"))}
    env.update({"PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu", **env_over})
    proc = subprocess.run([sys.executable, "-c", CHILD], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))[len("RESULT "):])


@pytest.mark.slow
def test_second_process_loads_the_compiled_step_from_the_cache(tmp_path):
    first = _child({"POOLSIM_CACHE_DIR": str(tmp_path)})
    assert first["fx_hit"] == 0 and first["fx_miss"] > 0 and first["aot_hit"] == 0  # an empty cache
    assert any((tmp_path / compile_cache.KIND).iterdir())  # written where poolsim.io.cache_dir says
    second = _child({"POOLSIM_CACHE_DIR": str(tmp_path)})
    assert second["aot_hit"] > 0 or second["fx_hit"] > 0, second  # the joint graph (and its code) loaded
    assert second["fx_miss"] == 0, second
    assert second["grad"] == first["grad"]


def test_configure_respects_the_user_and_off(monkeypatch, tmp_path):
    import torch._functorch.config as aot
    import torch._inductor.config as ind

    for var in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", *compile_cache._SWITCHES):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(ind, "fx_graph_cache", ind.fx_graph_cache)  # restored after the test
    monkeypatch.setattr(ind, "fx_graph_remote_cache", ind.fx_graph_remote_cache)
    monkeypatch.setattr(aot, "enable_autograd_cache", aot.enable_autograd_cache)
    monkeypatch.setenv("POOLSIM_CACHE_DIR", str(tmp_path))
    assert compile_cache.configure() == tmp_path / "torch-inductor"
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "torch-inductor" / "triton")
    assert ind.fx_graph_cache is True and ind.fx_graph_remote_cache is False and aot.enable_autograd_cache is True
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))  # the user's folder wins
    monkeypatch.setenv("TORCHINDUCTOR_AUTOGRAD_CACHE", "0")
    aot.enable_autograd_cache = False
    assert compile_cache.configure() == tmp_path / "mine"
    assert aot.enable_autograd_cache is False
    monkeypatch.delenv("TORCHINDUCTOR_AUTOGRAD_CACHE")
    monkeypatch.setenv("POOLSIM_CACHE_DIR", "off")  # disabled: both caches off for the process
    assert compile_cache.configure() is None
    assert ind.fx_graph_cache is False and aot.enable_autograd_cache is False
