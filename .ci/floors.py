"""Print a constraints file that pins each core dependency of pyproject.toml at its declared floor.

    python .ci/floors.py [PYPROJECT] > floors.txt

One line ``name==floor`` for every entry of ``[project] dependencies``, in their order. ``.ci/poolsim-matrix``
installs poolsim with it (``uv pip install -c floors.txt -e .``): an install that cannot have every floor
fails, and so does CI, as it does when poolsim's tests fail at the floors. Each dependency must declare its
floor as one ``>=`` specifier (a cap may follow) and no environment marker; one that does not is an error
naming it (exit status 2), as there would be nothing, or more than one thing, to pin. Needs ``packaging``.
"""
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement


def floors(pyproject: Path) -> list[str]:
    """``["name==floor", ...]`` for ``pyproject``'s ``[project] dependencies``; ValueError naming a
    dependency without exactly one ``>=`` floor, or with an environment marker."""
    pins = []
    for dep in tomllib.loads(pyproject.read_text())["project"]["dependencies"]:
        req = Requirement(dep)
        lower = [s.version for s in req.specifier if s.operator == ">="]
        if req.marker is not None or len(lower) != 1:
            raise ValueError(f"dependency {dep!r} of {pyproject}: the floors job needs exactly one '>=' floor "
                             "and no environment marker")
        pins.append(f"{req.name}=={lower[0]}")
    return pins


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else Path(__file__).resolve().parents[1] / "pyproject.toml"
    try:
        print("\n".join(floors(path)))
    except ValueError as exc:
        print(f"floors.py: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
