"""A new user's first hour, from the shell, as a test: each step is what the README and the docs tell a user to
type, run in a fresh interpreter (``python -m ...`` / ``python -c``) against a copy of the committed results,
so that the next trap of this kind is found by the suite and not by a user.

* a ``--quick`` smoke run does not replace the committed 1000-seed figures: it stops in one line saying where
  to write instead (``figures/settings.json``; docs/getting-started.md, "Committed results are kept");
* ``adsim predict --zero-shot`` without weights stops in one line naming ``--checkpoint`` (no ViT-L with
  random weights for minutes);
* ``python -m adsim --help`` reads as plain text;
* the module paths the concepts page names import as written (``import poolsim.verdict``);
* an experiment's parameters, defaults and ranges are in ``help(poolsim.experiments.run)``, and a value out
  of range gets the one wording of range errors whichever side it is on;
* the ``deep`` hypothesis profile ``poolsim.testing.examples`` recommends is there for the user's own tests.

The steps that start JAX are slow-tier (each ~2 s of interpreter start-up); the adsim ones answer before
torch loads.
"""
import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}


def _run(*args, env=None, cwd=ROOT):
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env or ENV, capture_output=True, text=True,
                          timeout=300)


def _digest(folder: Path) -> dict:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_a_quick_run_leaves_the_committed_figures_alone(tmp_path):
    clone = tmp_path / "clone"
    shutil.copytree(ROOT / "figures", clone / "figures")
    before = _digest(clone / "figures")
    r = _run("-m", "poolsim.figures", "--only", "asymptotic", "--quick", cwd=clone)  # --out: figures/ there
    assert r.returncode == 1
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("poolsim.figures: error: figures/settings.json records asymptotic made with 1000 "
                           "seeds; this run would replace it with --quick (3 seeds): write elsewhere with --out DIR")
    assert "--overwrite" in line and "--check" in line
    assert _digest(clone / "figures") == before


def test_predict_without_weights_stops_in_one_line_naming_checkpoint(tmp_path):
    pytest.importorskip("lazy_loader", reason='adsim\'s CLI needs the adsim extra (pip install -e ".[adsim]")')
    scans = tmp_path / "scans"
    scans.mkdir()
    (scans / "a.png").write_bytes(b"not read: the command stops first")
    out = tmp_path / "out"
    r = _run("-m", "adsim", "predict", "--zero-shot", "winclip", str(scans), "--out", str(out))
    assert r.returncode == 2
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("error: backbone ViT-L-14-336 without --checkpoint would have RANDOM weights")
    assert "--checkpoint PATH" in line and "--random-weights" in line and "--backbone tiny" in line
    assert not out.exists()


def test_adsim_help_is_plain_text():
    pytest.importorskip("lazy_loader", reason='adsim\'s CLI needs the adsim extra (pip install -e ".[adsim]")')
    r = _run("-m", "adsim", "--help")
    assert r.returncode == 0 and r.stdout.startswith("usage: python -m adsim")
    assert not re.search(r"``|:func:|:class:|:mod:|`\w", r.stdout), r.stdout


@pytest.mark.slow
def test_the_modules_the_concepts_page_names_import_as_written():
    names = set(re.findall(r"(?<![\w./-])(poolsim(?:\.[a-z]\w*)+)", (ROOT / "docs" / "concepts.md").read_text()))
    assert {"poolsim.core", "poolsim.verdict"} <= names
    # `import` every dotted prefix that names a module; the first one that does not import must be a function,
    # class or constant of the module before it (a module that exists only as an attribute fails)
    code = ("import importlib, types\n"
            f"for name in {sorted(names)!r}:\n"
            "    parts = name.split('.')\n"
            "    for i in range(2, len(parts) + 1):\n"
            "        head = '.'.join(parts[:i])\n"
            "        try:\n"
            "            exec(f'import {head}')\n"
            "            print('imported', head)\n"
            "            continue\n"
            "        except ModuleNotFoundError:\n"
            "            pass\n"
            "        obj = getattr(importlib.import_module('.'.join(parts[:i - 1])), parts[i - 1])\n"
            "        assert not isinstance(obj, types.ModuleType), f'{head} is a module that does not import'\n"
            "        break\n")
    r = _run("-c", code)
    assert r.returncode == 0, r.stderr[-2000:]
    assert {"imported poolsim.core", "imported poolsim.verdict"} <= set(r.stdout.splitlines())


@pytest.mark.slow
def test_experiment_parameters_are_in_help_and_range_errors_read_alike():
    r = _run("-m", "pydoc", "poolsim.experiments.run")
    assert r.returncode == 0, r.stderr[-2000:]
    text = r.stdout
    for name in ("asymptotic", "symmetric", "domain_addition"):
        assert f"**Experiment `{name}`**" in text
    for row in ("| `p` | `0.3` | [0, 1] |", "| `alpha` | `1.5` | [0, inf) |", "| `gamma` | `0.5` | [0, inf) |",
                "| `layout` | `'gaussian'` | 'gaussian', 'balanced' |", "| `every` | `3` | integer in [1, inf) |",
                "| `tau` | `1.2` | (0, inf) |", "| `m_frac` | `0.5` | (0, 1] |"):
        assert row in text, row
    code = ("from poolsim import experiments\n"
            "for p in (1.5, -0.1):\n"
            "    try:\n"
            "        experiments.run('asymptotic', seeds=2, p=p)\n"
            "    except ValueError as err:\n"
            "        print(err)\n")
    r = _run("-c", code)
    assert r.stdout.splitlines() == ["p must be a finite number in [0, 1], got 1.5",
                                     "p must be a finite number in [0, 1], got -0.1"], r.stderr[-2000:]


@pytest.mark.slow
def test_the_deep_hypothesis_profile_is_there_for_users():
    code = ("import poolsim.testing\n"
            "from hypothesis import settings\n"
            "print(poolsim.testing.load_profile(), settings().max_examples, poolsim.testing.examples(60))\n")
    r = _run("-c", code, env={**ENV, "HYPOTHESIS_PROFILE": "deep"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["deep", "5000", "3000"]
