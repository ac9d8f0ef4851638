"""The package as a user installs it: the sdist and the wheel build, the wheel (built from the sdist, so the
sdist is complete) installs into a fresh virtual environment outside the repository and runs the two entry
points from there; both packages ship ``py.typed``; mypy runs clean on the public modules ([tool.mypy])."""
import os
import shutil
import site
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DATA = ("poolsim/py.typed", "adsim/py.typed", "adsim/model/model_configs/adsim-tiny.json")


def _tracked_tree(dest: Path) -> Path:
    """A copy of the files git tracks (the whole tree outside git): the build writes its egg-info and build/
    folders there, not into the checkout other tests read."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True)
    if listed.returncode == 0:
        for rel in filter(None, listed.stdout.decode().split("\0")):
            if (ROOT / rel).is_file():
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / rel, dest / rel)
    else:
        shutil.copytree(ROOT, dest, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.egg-info", "build", "mutants"))
    return dest


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """``(sdist, wheel)`` built by ``python -m build`` (sdist first, the wheel from the sdist), without build
    isolation: the build backend (setuptools) comes from the test environment, so no network is needed."""
    pytest.importorskip("build")
    src = _tracked_tree(tmp_path_factory.mktemp("src"))
    dist = tmp_path_factory.mktemp("dist")
    out = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(src)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (sdist,), (wheel,) = dist.glob("*.tar.gz"), dist.glob("*.whl")
    return sdist, wheel


@pytest.mark.slow
def test_wheel_and_sdist_hold_the_package_data(built):
    sdist, wheel = built
    names = set(zipfile.ZipFile(wheel).namelist())
    assert set(PACKAGE_DATA) <= names, set(PACKAGE_DATA) - names
    assert not [n for n in names if n.startswith(("tests/", "figures/", "benchmarks/"))]
    with tarfile.open(sdist) as tar:
        members = {m.name.split("/", 1)[1] for m in tar.getmembers() if "/" in m.name}
    assert set(PACKAGE_DATA) <= members and "pyproject.toml" in members


@pytest.mark.slow
def test_the_wheel_installed_outside_the_repository_runs_both_entry_points(built, tmp_path):
    """A fresh venv in tmp, the wheel installed into it with pip (``--no-deps``: the dependencies are this
    environment's, made visible by a ``.pth`` file listing its site-packages, as ``--system-site-packages``
    would for a system Python; no download), run with cwd outside the repository and no PYTHONPATH.

    The venv is created without a pip of its own (``--without-pip``: ensurepip would install one, ~6 s of
    CPU) and this environment's pip installs the wheel into it (``pip --python VENV_PYTHON``: pip runs under
    the venv's interpreter and installs into its site-packages, as the venv's own pip would)."""
    _, wheel = built
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    purelib = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(JAX_PLATFORMS="cpu", PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}")
    work = tmp_path / "work"
    work.mkdir()

    def run(*args, timeout=600):
        out = subprocess.run([str(py), *args], cwd=work, env=env, capture_output=True, text=True, timeout=timeout)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        return out

    pip = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index",
                          "-q", str(wheel)], cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stdout[-3000:] + pip.stderr[-3000:]
    # then this environment's packages after the venv's own, as plain path entries: their .pth files (an editable
    # install of this checkout among them) are not processed, so poolsim and adsim come from the wheel only
    (purelib / "zz_test_environment.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    # one interpreter: where the packages come from, then package data in use (the tiny backbone's open_clip
    # config comes from the installed adsim)
    where = run("-W", "ignore", "-c", "import poolsim, adsim; print(poolsim.__file__); print(adsim.__file__)\n"
                "from adsim.model.backbone import build_backbone; build_backbone('tiny')").stdout.split()
    assert len(where) == 2, where
    assert all(Path(p).is_relative_to(purelib) for p in where), where
    assert not any(Path(p).is_relative_to(ROOT) for p in where), where
    assert "usage: python -m adsim" in run("-m", "adsim", "--help").stdout
    run("-m", "poolsim.figures", "--quick", "--out", str(work / "figs"))
    assert (work / "figs" / "summary.md").is_file() and (work / "figs" / "verdicts.csv").is_file()


@pytest.mark.slow
def test_mypy_is_clean_on_the_public_modules():
    """``mypy`` with pyproject's [tool.mypy] (the public modules of both packages): no error.

    It runs as a developer runs it, from the repository root with mypy's own incremental cache there
    (``.mypy_cache/``, git-ignored): mypy re-checks what changed since the cache was written (source files,
    installed libraries) and what depends on it, with the results of a cold run. A cold run type-checks the
    libraries the packages import (torch, JAX, NumPy, pandas) too: ~50 s of CPU on the 2-core machine, ~1 s
    warm. Only this test runs mypy, so one pytest-xdist worker writes the cache."""
    mypy = shutil.which("mypy") or str(Path(sys.executable).with_name("mypy"))
    if not Path(mypy).exists():
        pytest.skip("mypy is not installed (the test extra installs it)")
    out = subprocess.run([mypy], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-2000:]
    assert "Success: no issues found" in out.stdout
