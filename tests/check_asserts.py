"""Flag tests whose assertions cannot fail: ``python tests/check_asserts.py [files or folders]``.

A static check (Python's ``ast``, nothing is imported or run) of every ``test_*`` function in
``tests/**/test_*.py``. Two findings:

* ``no-assert``: the test contains no assertion at all -- no ``assert`` statement, no
  ``pytest.raises``/``pytest.warns``/``pytest.fail``, no ``*.assert_*``/``assert_*`` call (NumPy's and
  torch's testing helpers), and calls no function of its own module that does (followed through
  the module's helpers, transitively). Such a test passes whatever the code does, unless it only
  checks that nothing raises: say so with a ``# no-assert: <reason>`` comment in its body.
* ``always-true``: an ``assert`` whose condition is a truthy constant or a non-empty tuple
  (``assert (x == y, "message")`` is always true: the message belongs after a comma outside the
  parentheses). Such an assert does not count as an assertion for ``no-assert`` either.
* ``unused-read``: a name bound to what a reading call returned (``read_csv``, ``read_json``,
  ``read_text``, ``json.load(s)``, ``np.load``, ``torch.load``, ``pd.read_*``, ``open``) and never
  used afterwards: the test reads a file and says nothing about it.

Run by ``tests/test_check_asserts.py`` over the whole suite (it must report nothing), and usable by
hand. Exit status 1 when something is flagged.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

READERS = {"read_csv", "read_json", "read_text", "read_bytes", "load", "loads", "read_parquet",
           "read_table", "open", "read_pickle", "read_excel"}
ASSERTING = {"raises", "warns", "fail", "deprecated_call", "approx"}


def _call_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        f = node.func
        if isinstance(f, ast.Attribute):
            return f.attr
        if isinstance(f, ast.Name):
            return f.id
    return None


def _always_true(node: ast.Assert) -> bool:
    t = node.test
    return (isinstance(t, ast.Constant) and bool(t.value)) or (isinstance(t, ast.Tuple) and len(t.elts) > 0)


def _asserts_directly(fn: ast.AST) -> bool:
    for node in ast.walk(fn):
        if isinstance(node, ast.Assert) and not _always_true(node):
            return True
        name = _call_name(node)
        if name and (name.startswith("assert") or name in ASSERTING):
            return True
    return False


def _called_names(fn: ast.AST) -> set[str]:
    out = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Name):  # a helper called, or passed on (map, partial, a fixture param)
            out.add(node.id)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
    return out


def _asserting_helpers(tree: ast.Module) -> set[str]:
    """Names of the module's functions (any nesting) that assert, directly or through each other."""
    funcs = {n.name: n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    asserting = {name for name, fn in funcs.items() if _asserts_directly(fn)}
    changed = True
    while changed:
        changed = False
        for name, fn in funcs.items():
            if name not in asserting and _called_names(fn) & asserting:
                asserting.add(name)
                changed = True
    return asserting


def _unused_reads(fn: ast.AST) -> list[tuple[int, str]]:
    """``(line, name)`` of names bound from a reading call and never loaded in the function."""
    bound = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and _reads(node.value):
            for tgt in node.targets:
                bound += [(n.lineno, n.id) for n in ast.walk(tgt) if isinstance(n, ast.Name)]
        elif isinstance(node, ast.With):
            for item in node.items:
                if _reads(item.context_expr) and isinstance(item.optional_vars, ast.Name):
                    bound.append((item.optional_vars.lineno, item.optional_vars.id))
    loaded = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return [(line, name) for line, name in bound if name not in loaded and not name.startswith("_")]


def _reads(value: ast.AST) -> bool:
    """A reading call, or a tuple of them (``a, b = read(x), read(y)``)."""
    if isinstance(value, ast.Tuple):
        return any(_reads(v) for v in value.elts)
    return _call_name(value) in READERS


def check_file(path: Path) -> list[str]:
    src = path.read_text()
    tree = ast.parse(src, filename=str(path))
    lines = src.splitlines()
    helpers = _asserting_helpers(tree)
    found = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or not fn.name.startswith("test"):
            continue
        if any("fixture" in ast.unparse(dec) for dec in fn.decorator_list):
            continue  # a fixture named test_*, not a test
        for node in ast.walk(fn):
            if isinstance(node, ast.Assert) and _always_true(node):
                found.append(f"{path}:{node.lineno}: {fn.name}: always-true ({ast.unparse(node.test)[:60]})")
        body = "\n".join(lines[fn.lineno - 1:fn.end_lineno])
        if not (_asserts_directly(fn) or _called_names(fn) & helpers) and "# no-assert:" not in body:
            found.append(f"{path}:{fn.lineno}: {fn.name}: no-assert (nothing in it can fail)")
        for line, name in _unused_reads(fn):
            found.append(f"{path}:{line}: {fn.name}: unused-read ({name!r} is read and never used)")
    return found


def check(paths) -> list[str]:
    files = []
    for p in map(Path, paths):
        files += sorted(p.rglob("test_*.py")) if p.is_dir() else [p]
    return [msg for f in files for msg in check_file(f)]


def main(argv: list[str]) -> int:
    found = check(argv or [Path(__file__).parent])
    print("\n".join(found) if found else "no test without a failing assertion found")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
