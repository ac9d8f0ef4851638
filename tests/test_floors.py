"""The floors job of CI (``.ci/poolsim-matrix``) installs exactly the floors ``pyproject.toml`` declares:
``.ci/floors.py`` turns each core dependency into a ``name==floor`` pin, and refuses a dependency it
cannot pin. The Python classifiers start at ``requires-python``'s floor and list the Pythons CI runs."""
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FLOORS = ROOT / ".ci" / "floors.py"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _floors(pyproject: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(FLOORS), str(pyproject)], capture_output=True, text=True)


def test_every_core_dependency_is_pinned_at_its_declared_floor():
    # the reference: each dependency string read by hand, "name>=floor" with an optional ",<cap" after it
    want = []
    for dep in PROJECT["dependencies"]:
        m = re.fullmatch(r"([A-Za-z0-9._-]+)>=([0-9][0-9.]*)(,<=?[0-9.]+)?", dep)
        assert m, f"{dep!r}: the floors job pins '>=' floors"
        want.append(f"{m[1]}=={m[2]}")
    run = _floors(ROOT / "pyproject.toml")
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == want


@pytest.mark.parametrize("dep", ["scipy", "scipy<2", "scipy>=1.13,>=1.14", "scipy>=1.13; python_version < '3.12'"])
def test_a_dependency_without_one_floor_is_an_error_naming_it(tmp_path, dep):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(f'[project]\nname = "x"\ndependencies = ["numpy>=2.0", "{dep}"]\n')
    run = _floors(pyproject)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.startswith(f"floors.py: error: dependency {dep!r} of {pyproject}:"), run.stderr


def test_a_cap_and_extras_leave_the_floor_to_pin(tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "x"\ndependencies = ["jax>=0.8.0,<0.12.1", "mkdocstrings[python] >= 0.27"]\n')
    run = _floors(pyproject)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["jax==0.8.0", "mkdocstrings==0.27"]


def test_python_classifiers_are_the_pythons_ci_runs():
    """3.11 (requires-python's floor: the main run and the floors job) and every Python the matrix script
    loops over, one classifier each, nothing else."""
    floor = re.fullmatch(r">=(3\.\d+)", PROJECT["requires-python"])[1]
    (loop,) = re.findall(r"^for v in ([0-9. ]+); do$", (ROOT / ".ci" / "poolsim-matrix").read_text(), flags=re.M)
    versions = [c.rsplit(" :: ", 1)[1] for c in PROJECT["classifiers"]
                if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)]
    assert versions == [floor, *loop.split()]
