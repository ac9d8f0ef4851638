"""The public method registry, used from outside the package as a third-party method would use it, and
the one validation of run configuration values (the same answer through a recipe, ``--set`` and flags)."""
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import adsim.methods as methods
from adsim.cli.main import _parser, _train_config
from adsim.config import recipes
from adsim.config.choices import METRICS, SCORES, ZERO_SHOT_METHODS
from adsim.config.run import config_from_recipe, validate
from adsim.inference.detector import Detector
from adsim.methods import catalog, registry

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.filterwarnings("ignore::adsim.model.backbone.RandomWeightsWarning")


class _Contrast(methods.Method):
    """A method defined outside adsim: the image's standard deviation over channels as its map."""
    name = "contrast"
    clip_norm = False

    def __init__(self, backbone):
        super().__init__()
        self.image_size, self.grid = backbone.spec.image_size, backbone.spec.grid

    def forward(self, x):
        m = x.std(1)
        return methods.Output(m.flatten(1).amax(1), m)


def test_a_method_registered_from_outside_runs_through_the_detector(monkeypatch, toy_root):
    monkeypatch.setattr(registry, "ZERO_SHOT", dict(registry.ZERO_SHOT))  # the test leaves no trace
    monkeypatch.setattr(catalog, "ZERO_SHOT", registry.ZERO_SHOT)
    assert methods.register_zero_shot("contrast", _Contrast) is _Contrast
    assert "contrast" in catalog.zero_shot_names()
    det = Detector.zero_shot("contrast", backbone="tiny", device="cpu")
    paths = sorted((toy_root / "Brain_AD" / "valid" / "good" / "img").iterdir())
    pred = det.predict(paths)
    assert pred.scores.shape == (len(paths),) and np.isfinite(pred.scores).all()
    # the map is the method's own: channel std of the preprocessed images (no CLIP normalisation)
    from adsim.data.bmad import read_image
    x = torch.stack([read_image(p, det.method.image_size, clip_norm=False) for p in paths])
    np.testing.assert_allclose(pred.maps, x.std(1).numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="method name must be"):
        methods.register_zero_shot("no spaces", _Contrast)


@pytest.mark.slow
def test_a_plugin_package_registers_through_its_entry_point(tmp_path):
    """An installed distribution with an ``adsim.methods`` entry point is imported by the catalog, and
    its method is usable by name in a fresh process (as ``predict --zero-shot NAME`` would be)."""
    (tmp_path / "adsim_plugin_demo.py").write_text(textwrap.dedent('''
        import adsim.methods as methods

        class Flat(methods.Method):
            name = "flat"
            def __init__(self, backbone):
                super().__init__()
                self.image_size, self.grid = backbone.spec.image_size, backbone.spec.grid
            def forward(self, x):
                return methods.Output(x.new_zeros(x.shape[0]), x.new_zeros(x.shape[0], *x.shape[2:]))

        methods.register_zero_shot("flat", Flat)
    '''))
    dist = tmp_path / "adsim_plugin_demo-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: adsim-plugin-demo\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[adsim.methods]\nflat = adsim_plugin_demo\n")
    code = ("import warnings; warnings.simplefilter('error')\n"
            "from adsim.methods import catalog\nprint(catalog.zero_shot_names())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert "'flat'" in out.stdout and "'winclip'" in out.stdout
    # without the distribution: only the built-ins
    (dist / "entry_points.txt").unlink()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"})
    assert "'flat'" not in out.stdout and "'winclip'" in out.stdout, out.stdout + out.stderr


def test_the_cli_constants_name_what_is_registered():
    """``--help`` lists choices from ``adsim.config.choices`` (plain Python, no torch); they are the
    registries' and the core's own."""
    import poolsim
    from adsim.model import head
    assert METRICS == poolsim.core.METRICS
    assert SCORES == head.SCORES
    assert set(ZERO_SHOT_METHODS) == {n for n in catalog.zero_shot_names() if n in ZERO_SHOT_METHODS}
    assert set(ZERO_SHOT_METHODS) == set(catalog.zero_shot_names())  # no built-in missing from --help


_TRAIN = ["train", "--data", "D", "--target", "Brain", "--out", "O"]


def _via_cli(*extra):
    return _train_config(_parser().parse_args([*_TRAIN, *extra]))


def _via_recipe(**field):
    return validate(config_from_recipe(recipes.override(recipes.get("clean"), **field), data="D", target="Brain",
                                       out="O"))


def _via_record(**field):
    """A config.json record as written by a run, with one field changed, read back as inference does."""
    cfg = config_from_recipe(recipes.get("clean"), data="D", target="Brain", out="O")
    record = json.loads(json.dumps(cfg._asdict()))
    record.update({k: list(v) if isinstance(v, tuple) else v for k, v in field.items()})
    return validate(type(cfg)(**{k: tuple(v) if isinstance(v, list) else v for k, v in record.items()}))


@pytest.mark.parametrize("field,value,flag,ok", [
    ("train_splits", ("train",), ["--train-splits", "train"], False),   # no 'train' split in the MVFA layout
    ("train_splits", ("valid",), ["--train-splits", "valid"], True),
    ("lr", -1.0, ["--lr", "-1"], False),
    ("lr", 0.01, ["--lr", "0.01"], True),
    ("epochs", 0, ["--epochs", "0"], False),
    ("metric", "manhattan", ["--metric", "manhattan"], False),
    ("metric", "cosine", ["--metric", "cosine"], True),
    ("gamma", 0.5, ["--gamma", "0.5"], True),
])
def test_a_value_is_accepted_or_refused_the_same_way_everywhere(field, value, flag, ok):
    routes = {"recipe": lambda: _via_recipe(**{field: value}),
              "--set": lambda: _via_cli("--set", f"{field}={value!r}"),
              "flag": lambda: _via_cli(*flag),
              "config.json": lambda: _via_record(**{field: value})}
    for route, build in routes.items():
        if ok:
            assert getattr(build(), field) == value, route
        else:
            with pytest.raises(ValueError, match=field):
                build()
