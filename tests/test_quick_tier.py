"""The quick tier (``python -m pytest -m "not slow"``) still reaches every module of poolsim and adsim.

A module is reached when a test file with at least one test outside ``slow`` imports it (``import``,
``from ... import``, or names it as a string such as ``"-m", "adsim"``, which runs ``adsim.__main__``), or
when a reached module imports it (at module level or inside a function: the static import graph of the
source; a package's string naming one of its submodules, as poolsim.figures' registry loaded with
importlib, counts as an import). A whole file marked ``slow``
(``pytestmark``) reaches nothing here.

A parametrised test runs in the quick tier at every value of each parameter, not at every combination
(``tests/quick_tier.py``)."""
import ast
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from quick_tier import quick_tier_cases

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("poolsim", "adsim")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _resolve(name: str) -> list[str]:
    """``name`` and its parent packages, as far as they are modules of the packages."""
    parts = name.split(".")
    return [m for m in (".".join(parts[:i]) for i in range(1, len(parts) + 1)) if m in MODULES]


def _imports(tree: ast.AST, current: str, is_package: bool) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                out.update(_resolve(a.name))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = current.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            out.update(_resolve(module))
            out.update(f"{module}.{a.name}" for a in node.names if f"{module}.{a.name}" in MODULES)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            # "-m", "adsim" runs adsim.__main__; a package's registry of submodule names, loaded with
            # importlib (poolsim.figures' FIGURES), names its submodules
            named = [node.value, f"{current}.{node.value}" if is_package else ""]
            out.update(m for n in named if n in MODULES for m in (n, f"{n}.__main__") if m in MODULES)
    return out


def _file_is_slow(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            return "slow" in ast.unparse(node.value)
    return False


def _has_quick_test(tree: ast.Module) -> bool:
    def slow(fn):
        return any("slow" in ast.unparse(d) for d in fn.decorator_list)
    return any(isinstance(n, ast.FunctionDef) and n.name.startswith("test") and not slow(n) for n in ast.walk(tree))


def _reached(test_files) -> set[str]:
    todo = set()
    for f in test_files:
        tree = ast.parse(f.read_text())
        if not _file_is_slow(tree) and _has_quick_test(tree):
            todo |= _imports(tree, "tests", False)
    seen: set[str] = set()
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        path = MODULES[m]
        todo |= _imports(ast.parse(path.read_text()), m, path.name == "__init__.py") - seen
    return seen


def test_every_module_is_reached_by_a_quick_test():
    missing = sorted(set(MODULES) - _reached(sorted((ROOT / "tests").rglob("*.py"))))
    assert missing == [], f"modules no quick (non-slow) test file reaches: {missing}"


def test_the_reach_check_can_fail(tmp_path):
    """A lone test file that imports poolsim.theory reaches theory and what it imports, not adsim."""
    probe = tmp_path / "test_probe.py"
    probe.write_text("from poolsim import theory\n\ndef test_x():\n    assert theory\n")
    reached = _reached([probe])
    assert "poolsim.theory" in reached and "poolsim._core" in reached
    assert not any(m.startswith("adsim") for m in reached)
    probe.write_text("import pytest\nfrom poolsim import theory\npytestmark = pytest.mark.slow\n\n"
                     "def test_x():\n    assert theory\n")
    assert _reached([probe]) == set()


def _case(function, slow=False, **params):
    return SimpleNamespace(path=Path("test_f.py"), cls=None, originalname=function, name=function,
                           callspec=SimpleNamespace(params=params),
                           get_closest_marker=lambda name: object() if slow and name == "slow" else None)


def test_the_quick_tier_runs_each_parameter_value_once_not_each_combination():
    """Worked by hand: cases (a, x), (a, y), (b, x), (b, y) of f: the first three each bring a new value
    (x; y; b), (b, y) brings none and is skipped. An array value is told apart by identity. A case that
    is already slow covers nothing, so (c, x) after a slow (c, y) still runs; another function (g) and a
    test without parameters are never skipped."""
    a, b, c = np.zeros(2), np.ones(2), np.full(2, 2.0)
    x, y = "x", "y"
    cases = [_case("f", m=a, v=x), _case("f", m=a, v=y), _case("f", m=b, v=x), _case("f", m=b, v=y),
             _case("f", slow=True, m=c, v=y), _case("f", m=c, v=x), _case("g", m=b, v=y)]
    plain = SimpleNamespace(path=Path("test_f.py"), cls=None, originalname="h", name="h",
                            get_closest_marker=lambda name: None)
    assert quick_tier_cases(cases + [plain]) == [cases[3]]


@pytest.mark.slow
def test_quick_collection_keeps_every_value_of_every_parameter(tmp_path):
    """The hook in tests/conftest.py, through pytest itself: ``-m "not slow"`` collects fewer cases of
    test_strategies.py's reference test, and at each position of the case id the same values as the full
    collection. One collection serves both: the full collection is what ``-m`` kept plus what it deselected
    (a probe plugin prints the ids pytest hands to ``pytest_deselected``)."""
    (tmp_path / "deselected_probe.py").write_text(
        "def pytest_deselected(items):\n    for item in items:\n        print('DESELECTED', item.nodeid)\n")
    path = [str(tmp_path), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider",
                          "-p", "deselected_probe", "-m", "not slow", "tests/test_strategies.py"], cwd=ROOT,
                         check=True, capture_output=True, text=True, env=env).stdout

    def ids(lines):
        cases = [line.split("[", 1)[1].rstrip("]").split("-") for line in lines
                 if "::test_strategy_matches_reference[" in line]
        return len(cases), [set(column) for column in zip(*cases)]

    quick = [line for line in out.splitlines() if not line.startswith("DESELECTED ")]
    n_quick, values_quick = ids(quick)
    n_all, values_all = ids(quick + [line.split(" ", 1)[1] for line in out.splitlines()
                                     if line.startswith("DESELECTED ")])
    assert 0 < n_quick < n_all
    assert values_quick == values_all
