"""The README stays true: its quick start is exactly the two documented commands (the second is what
.ci/run runs), its Python examples run as written, it fits on a screen and its links resolve. The longer
examples (advise, own scans) are tutorials of the documentation site, executed by its build
(tests/test_docs.py)."""
import re
from pathlib import Path

import pytest

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


@pytest.mark.slow
def test_python_example_runs():
    (code,) = [b for b in _blocks("python") if "import poolsim" in b]
    namespace = {}
    exec(compile(code, "README.md", "exec"), namespace)
    # The DA line's documented value: Eq. 15 for (70, 72, 71, 75, 80) is 3.34 (see test_da.py).
    assert "-> 3.34" in code
    assert abs(namespace["poolsim"].da_score([70, 72, 71, 75, 80]) - 3.34) < 1e-12
    assert bool(namespace["res"].converged)


@pytest.mark.filterwarnings("ignore:backbone tiny has RANDOM weights")
def test_adsim_python_example_runs(tmp_path):
    """The adsim block as written, its two folders replaced by temporary ones: 4 anomalous toy Brain test
    images (``n_per_class=4``) scored by winclip on the tiny backbone."""
    pytest.importorskip("torch")
    (code,) = [b for b in _blocks("python") if "from adsim import Detector" in b]
    for old, new in (("/tmp/toy", str(tmp_path / "toy")), ("/tmp/pred_png", str(tmp_path / "png"))):
        assert old in code
        code = code.replace(old, new)
    namespace = {}
    exec(compile(code, "README.md", "exec"), namespace)
    pred = namespace["pred"]
    assert pred.scores.shape == (4,) and pred.maps.shape == (4, 64, 64)  # make_toy_bmad's default size: 64
    assert len(list((tmp_path / "png").glob("*.png"))) == 4


def test_readme_fits_on_a_screen_and_links_only_to_files_that_exist():
    """At most 150 lines; every relative link points at a file or folder of the repository."""
    assert len(README.splitlines()) <= 150
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README)
    local = [link for link in links if "://" not in link]
    assert local, "the README links into the docs"
    assert [link for link in local if not (ROOT / link).exists()] == []
