"""`import poolsim` must not import torch (the theory side runs without the adsim extra)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]  # run where `poolsim` is importable from source


def _modules_after(code: str) -> list:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys, json\n"
                          "print(json.dumps(sorted(sys.modules)))"],
                         capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_import_poolsim_does_not_import_torch():
    mods = _modules_after("import poolsim, poolsim.metadist")
    assert "poolsim" in mods and "poolsim._core" in mods  # the probe sees what was imported
    assert not any(m == "torch" or m.startswith("torch.") for m in mods)
    # And the probe can fail: importing torch shows up.
    assert "torch" in _modules_after("import poolsim, torch")
