"""The code's shape, checked: one-way imports (import-linter), pyflakes-clean (ruff), ``__all__`` in
every package, no private name imported across modules, and a CLI that answers ``--help`` without
loading torch. Each check runs the real tool on the source tree; each has a case showing it can fail."""
import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("poolsim", "adsim")


def _run(*args, cwd=ROOT):
    return subprocess.run([*args], capture_output=True, text=True, cwd=cwd)


def _tool(name):
    path = shutil.which(name) or str(Path(sys.executable).with_name(name))
    if not Path(path).exists():
        pytest.skip(f"{name} is not installed (the test extra installs it)")
    return path


def test_import_contracts_are_kept():
    """The layers contracts of ``pyproject.toml`` ([tool.importlinter]) hold for both packages."""
    out = _run(_tool("lint-imports"), "--no-cache")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "broken" in out.stdout and " 0 broken" in out.stdout


def test_import_contract_catches_a_back_import(tmp_path):
    """A copy of the tree with one upward import (model -> training) breaks the adsim contract."""
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    losses = tmp_path / "adsim" / "model" / "losses.py"
    losses.write_text(losses.read_text() + "\nfrom adsim.training import train as _back_edge  # noqa: E402,F401\n")
    out = subprocess.run([_tool("lint-imports"), "--no-cache"], capture_output=True, text=True, cwd=tmp_path,
                         env={"PYTHONPATH": str(tmp_path), "PATH": ""})
    assert out.returncode != 0 and "adsim.model.losses -> adsim.training" in out.stdout, out.stdout


def test_ruff_pyflakes_clean():
    out = _run(_tool("ruff"), "check", "--no-cache", *PACKAGES, "tests", "benchmarks")
    assert out.returncode == 0, out.stdout + out.stderr


def _modules(pkg):
    return sorted((ROOT / pkg).rglob("*.py"))


def test_every_package_declares_all():
    inits = [p for pkg in PACKAGES for p in _modules(pkg) if p.name == "__init__.py"]
    assert len(inits) >= 12
    for init in inits:
        text = init.read_text()
        assert "__all__" in text, f"{init.relative_to(ROOT)} has no __all__"


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _module_path(path: Path, level: int, module: str | None, root: Path) -> Path:
    """The folder an ``ImportFrom`` in ``path`` names: ``level`` dots up from ``path``'s folder (0: from
    ``root``), then ``module``'s parts."""
    base = path.parents[level - 1] if level else root
    return base.joinpath(*(module.split(".") if module else []))


def _is_module(folder: Path, name: str) -> bool:
    return (folder / f"{name}.py").is_file() or (folder / name / "__init__.py").is_file()


def _private_imports(path: Path, root: Path = ROOT) -> list:
    """Private names or modules used outside the module that owns them:

    * ``from adsim.X import _name`` / ``from poolsim import _core`` / ``from adsim._x import ...``: an
      absolute import of a private name or through a private module (one package reaching into the
      other's, or its own, internals by full path);
    * ``from ._strategies import _domains`` (any relative level): a private name that is not a module;
      a package's own private modules (``from . import _core``) are its internal layout and allowed;
    * ``fb._simulated`` where ``fb`` was bound by an import of a package module: a private function
      reached through the module (NamedTuple API such as ``Config._fields`` is on a class, not a module).
    """
    bad, name, modules = [], path.name, set()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.split(".")[0] in PACKAGES:
            bad += [f"{name}: from {node.module} import {a.name}" for a in node.names if _is_private(a.name)]
            if any(_is_private(part) and part != "__main__" for part in node.module.split(".")[1:]):
                bad.append(f"{name}: from {node.module} import ...")
        if isinstance(node, ast.ImportFrom) and node.level > 0:
            folder = _module_path(path, node.level, node.module, root)
            for a in node.names:
                if _is_module(folder, a.name):
                    modules.add(a.asname or a.name)
                elif _is_private(a.name):
                    bad.append(f"{name}: from {'.' * node.level}{node.module or ''} import {a.name}")
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] in PACKAGES:
            folder = _module_path(path, 0, node.module, root)
            modules |= {a.asname or a.name for a in node.names if _is_module(folder, a.name)}
        if isinstance(node, ast.Import):
            modules |= {a.asname or a.name.split(".")[0] for a in node.names if a.name.split(".")[0] in PACKAGES}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules \
                and _is_private(node.attr):
            bad.append(f"{name}: {node.value.id}.{node.attr}")
    return bad


@pytest.mark.parametrize("pkg", PACKAGES)
def test_no_private_name_crosses_a_module(pkg):
    """No module of poolsim or adsim uses another module's private name, and adsim uses poolsim's
    public names only (adsim's package ``__init__`` importing its own ``_legacy`` helper is the one
    exception)."""
    bad = [b for p in _modules(pkg) for b in _private_imports(p) if b != "__init__.py: from adsim import _legacy"]
    assert bad == []


def test_private_import_check_can_fail(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from adsim.model.head import _secret, features\nfrom adsim._legacy import MOVED\n"
                     "from adsim.model import head\n")
    assert _private_imports(probe) == ["probe.py: from adsim.model.head import _secret",
                                       "probe.py: from adsim._legacy import ..."]


def test_private_import_check_sees_relative_imports_and_attributes(tmp_path):
    """Inside a package: a relative import of a private function and a private function reached through
    a module alias are caught; the package's own private modules and a class's ``_fields`` are not."""
    pkg = tmp_path / "poolsim"
    (pkg / "figures").mkdir(parents=True)
    for module in ("__init__", "_core", "_strategies", "theory", "experiments", "figures/__init__",
                   "figures/flow_bridge"):
        (pkg / f"{module}.py").write_text("")
    probe = pkg / "figures" / "probe.py"
    probe.write_text("from .. import _core, theory\nfrom .._strategies import _domains, LEVELS\n"
                     "from . import flow_bridge as fb\nfrom ..experiments import Experiment\n"
                     "fb._simulated\n_core.namespace\ntheory.ok\nExperiment._fields\n")
    assert _private_imports(probe, tmp_path) == ["probe.py: from .._strategies import _domains",
                                                 "probe.py: fb._simulated"]


HEAVY = ("torch", "jax", "open_clip", "sklearn", "pandas", "matplotlib", "submitit")
HELP_COMMANDS = ("make-toy-bmad", "train", "eval", "predict", "table", "protocol", "sweep", "figures")


@pytest.fixture(scope="module")
def help_loaded():
    """``{command: heavy libraries loaded}`` after ``python -m adsim COMMAND --help`` for every command of
    :data:`HELP_COMMANDS`, run one after the other in ONE fresh interpreter: what is loaded after each
    command is what that command and the ones before it loaded (a module, once imported, stays in
    ``sys.modules``), so every entry is empty exactly when no command loads a heavy library."""
    pytest.importorskip("lazy_loader", reason='adsim\'s CLI needs the adsim extra (pip install -e ".[adsim]")')
    code = ("import sys, runpy\n"
            "for command in " + repr(list(HELP_COMMANDS)) + ":\n"
            "    sys.argv = ['adsim', command, '--help']\n"
            "    try:\n        runpy.run_module('adsim', run_name='__main__')\n    except SystemExit:\n        pass\n"
            "    print('LOADED', command, *[m for m in " + repr(HEAVY) + " if m in sys.modules], file=sys.stderr)\n")
    out = _run(sys.executable, "-c", code)
    assert out.stdout.count("usage:") == len(HELP_COMMANDS), out.stdout + out.stderr
    lines = [line.split()[1:] for line in out.stderr.splitlines() if line.startswith("LOADED")]
    assert [line[0] for line in lines] == list(HELP_COMMANDS), out.stderr
    return {line[0]: line[1:] for line in lines}


@pytest.mark.parametrize("command", HELP_COMMANDS)
def test_cli_help_answers_without_loading_torch(command, help_loaded):
    """``python -m adsim COMMAND --help`` loads none of the heavy libraries (torch, JAX, open_clip,
    scikit-learn, pandas, matplotlib, submitit): its cost is the parsers' (start-up time is a benchmark
    matter, not a timed test)."""
    assert help_loaded[command] == []


_MARKUP = re.compile(r"``|`[^`\s]+`|:(?:func|class|mod|meth|attr|data|obj|exc|ref):")


def _help_texts() -> dict:
    """``{command line: its --help text}`` of every CLI: ``python -m adsim`` and each of its commands,
    ``python -m poolsim.figures`` and ``python -m poolsim.audit`` (argparse's own text, in this process)."""
    import contextlib
    import io

    from adsim.cli.main import main as adsim_main
    from poolsim.audit import main as audit_main
    from poolsim.figures.__main__ import main as figures_main

    def text(main, argv):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            main([*argv, "--help"])
        return out.getvalue()

    texts = {"python -m adsim": text(adsim_main, [])}
    commands = re.search(r"\{([\w,-]+)\}", texts["python -m adsim"]).group(1).split(",")
    texts.update({f"python -m adsim {c}": text(adsim_main, [c]) for c in commands})
    texts["python -m poolsim.figures"] = text(figures_main, [])
    texts["python -m poolsim.audit"] = text(audit_main, [])
    return texts


def test_cli_help_is_plain_text():
    """No reST or Markdown markup in any --help (argparse prints descriptions as they are): no ````code````,
    no ```name```, no ``:func:`` roles."""
    pytest.importorskip("lazy_loader", reason='adsim\'s CLI needs the adsim extra (pip install -e ".[adsim]")')
    texts = _help_texts()
    assert len(texts) >= 12 and all("usage: python -m" in t for t in texts.values())
    marked = {cmd: _MARKUP.findall(t) for cmd, t in texts.items() if _MARKUP.search(t)}
    assert marked == {}
    assert not _MARKUP.search("plain --out DIR, it's (a) 'quoted' [x]")  # the pattern spares plain text ...
    assert all(_MARKUP.search(t) for t in ("``x``", "`x`", ":func:`x`"))  # ... and catches markup


# One fresh interpreter for three probes, in this order (each one's starting state is checked on the way):
# ``import adsim`` loads neither torch nor JAX; ``adsim.Detector`` then loads torch (the probe can see a
# heavy import); then the first import of the moved ``adsim.train`` warns and forwards.
_IMPORTS = """
import sys, warnings
import adsim
print("LAZY", 'torch' in sys.modules, 'jax' in sys.modules)
adsim.Detector
import adsim.training.train
print("DETECTOR", 'torch' in sys.modules, 'torch._dynamo' in sys.modules, 'sklearn' in sys.modules)
print("TRAIN_UNLOADED", 'adsim.train' not in sys.modules)
warnings.simplefilter('error', DeprecationWarning)
try:
    import adsim.train
except DeprecationWarning as w:
    print('WARNED', w)
warnings.simplefilter('ignore', DeprecationWarning)
import importlib
sys.modules.pop('adsim.train', None)
m = importlib.import_module('adsim.train')
from adsim.config.run import TrainConfig
from adsim.model.head import make_head
print(m.TrainConfig is TrainConfig, m.make_head is make_head)
"""


@pytest.fixture(scope="module")
def imports():
    """stdout of :data:`_IMPORTS` in a fresh interpreter; stdout and stderr if it failed."""
    out = _run(sys.executable, "-c", _IMPORTS)
    return out.stdout + ("" if out.returncode == 0 else out.stderr)


@pytest.mark.slow
def test_import_adsim_is_lazy(imports):
    assert "LAZY False False" in imports, imports
    # the detector and the trainer load torch (the probe can see it being loaded), but neither dynamo
    # (adsim.runtime.outside_graphs asks for it only while compiling; building a CLIP backbone loads it
    # anyway, through torchvision) nor scikit-learn (imported where an AUC is computed)
    assert "DETECTOR True False False" in imports, imports


@pytest.mark.slow
def test_legacy_paths_forward_with_a_deprecation_warning(imports):
    assert "TRAIN_UNLOADED True" in imports, imports  # the first import of adsim.train is the one below
    assert "WARNED adsim.train moved to adsim.training.train" in imports, imports
    assert imports.strip().endswith("True True"), imports


def test_public_modules_reexport_all_of_their_implementation():
    """``poolsim.core``, ``poolsim.verdict`` and ``poolsim.cluster`` (importable by those paths, as the docs
    name them) are the public faces of ``_core``, ``_verdict`` and ``_cluster``: the same ``__all__``, the very
    same objects, and every public function or class the implementation defines is in it."""
    import inspect

    from poolsim import _cluster, _core, _verdict, cluster, core, verdict

    for public, private in ((core, _core), (verdict, _verdict), (cluster, _cluster)):
        assert public.__all__ == private.__all__, public.__name__
        assert all(getattr(public, n) is getattr(private, n) for n in public.__all__), public.__name__
        defined = {n for n, v in vars(private).items() if not n.startswith("_") and
                   (inspect.isfunction(v) or inspect.isclass(v)) and v.__module__ == private.__name__}
        assert defined <= set(private.__all__), (private.__name__, sorted(defined - set(private.__all__)))
