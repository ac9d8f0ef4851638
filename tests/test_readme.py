"""The README stays true: its quick start is exactly the two documented commands (the second is what
.ci/run runs) and its Python example runs as written."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()

INSTALL_RUN = "pip install -e . && python -m poolsim.figures"
INSTALL_TEST = 'pip install -e ".[test,adsim]" && python -m pytest -q'


def _blocks(lang):
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def test_quick_start_is_the_two_commands_and_ci_runs_the_second():
    quick = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    bash = re.findall(r"```bash\n(.*?)```", quick, flags=re.S)
    assert len(bash) == 1
    assert bash[0].strip().splitlines() == [INSTALL_RUN, INSTALL_TEST]
    assert INSTALL_TEST in (ROOT / ".ci" / "run").read_text()


def test_python_example_runs():
    (code,) = _blocks("python")
    namespace = {}
    exec(compile(code, "README.md", "exec"), namespace)
    # The DA line's documented value: Eq. 15 for (70, 72, 71, 75, 80) is 3.34 (see test_da.py).
    assert "-> 3.34" in code
    assert abs(namespace["poolsim"].da_score([70, 72, 71, 75, 80]) - 3.34) < 1e-12
    assert bool(namespace["res"].converged)
