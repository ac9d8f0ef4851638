"""Quiet by default: an adsim command with the tiny backbone prints the random-weights notice once, as one
``warning:`` line of adsim's own, and no third-party log line (open_clip's root-logger "No pretrained
weights loaded ..."); building a backbone leaves the caller's logging set-up as it was."""
import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from adsim.model.backbone import RandomWeightsWarning, build_backbone

ROOT = Path(__file__).resolve().parents[2]
NOTICE = ("warning: backbone tiny has RANDOM weights (no --checkpoint): results are meaningless for "
          "anomaly-detection AUC; use them only for tests and timing")


@pytest.mark.slow
def test_predict_with_the_tiny_backbone_prints_one_line_of_its_own(tmp_path):
    image = tmp_path / "scan.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64), dtype=np.uint8)).save(image)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    env.pop("PYTHONWARNINGS", None)  # Python's default warning display, as a user's terminal has it
    out = subprocess.run([sys.executable, "-m", "adsim", "predict", "--zero-shot", "winclip", "--backbone", "tiny",
                          "--out", str(tmp_path / "pred"), "--no-overlays", "--no-progress", str(image)],
                         capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    assert "scored 1 images" in out.stdout
    # the whole of stderr: no source line under the notice, no "WARNING:root:No pretrained weights loaded"
    assert out.stderr.splitlines() == [NOTICE], out.stderr


def test_building_a_backbone_drops_only_open_clips_notice_and_restores_logging(caplog):
    root = logging.getLogger()
    filters = list(root.filters)
    with caplog.at_level(logging.WARNING), warnings.catch_warnings():
        warnings.simplefilter("ignore", RandomWeightsWarning)
        build_backbone("tiny", seed=0)
        logging.warning("a record of the caller's own")  # the root logger still passes everything else
    assert [r.getMessage() for r in caplog.records] == ["a record of the caller's own"]
    assert root.filters == filters


@pytest.mark.slow
def test_building_a_backbone_adds_no_handler_to_an_unconfigured_root_logger():
    """``logging.warning`` installs a stderr handler on a root logger without one (``basicConfig``): open_clip's
    call inside ``build_backbone`` must not leave one behind."""
    code = ("import logging, warnings\nwarnings.simplefilter('ignore')\n"
            "from adsim.model.backbone import build_backbone\nbuild_backbone('tiny')\n"
            "print(len(logging.getLogger().handlers))\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0"] and out.stderr == "", out.stdout + out.stderr
