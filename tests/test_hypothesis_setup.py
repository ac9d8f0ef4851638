"""The hypothesis set-up of the suite (issue 15): the default profile is deterministic, the deep
profile multiplies every example budget by 50, and the float strategies' domains are what their
docstrings say (checked by searching for a counterexample, not by reading the code)."""
import os
import sys

import pytest
from hypothesis import find, settings
from hypothesis.errors import NoSuchExample

from poolsim.testing import examples, finite_floats

TINY = sys.float_info.min  # 2.2250738585072014e-308, the smallest normal float64
SEARCH = settings(database=None, derandomize=True, max_examples=2000)


@pytest.mark.skipif(os.environ.get("HYPOTHESIS_PROFILE", "default") != "default",
                    reason="checks the default profile; another one was chosen on purpose")
def test_default_profile_is_deterministic():
    active = settings()
    assert settings.get_current_profile_name() == "default"
    assert active.derandomize and active.database is None
    assert examples(60) == 60 and examples(15) == 15


def test_deep_profile_runs_fifty_times_the_examples():
    deep = settings.get_profile("deep")
    assert deep.max_examples == 50 * settings.get_profile("default").max_examples == 5000
    assert not deep.derandomize  # fresh examples on every deep run
    before = settings.get_current_profile_name()
    settings.load_profile("deep")  # examples() reads the active profile
    try:
        assert examples(60) == 3000 and examples(15) == 750
    finally:
        settings.load_profile(before)


@pytest.mark.slow
@pytest.mark.parametrize("lo,hi", [(0.0, 2.0), (-5.0, 5.0)])
def test_finite_floats_domain(lo, hi):
    # default: zero is drawn, subnormals never
    assert find(finite_floats(lo, hi), lambda x: x == 0.0, settings=SEARCH) == 0.0
    with pytest.raises(NoSuchExample):
        find(finite_floats(lo, hi), lambda x: 0 < abs(x) < TINY, settings=SEARCH)
    # subnormal=True lets them in
    sub = find(finite_floats(lo, hi, subnormal=True), lambda x: 0 < abs(x) < TINY, settings=SEARCH)
    assert 0 < abs(sub) < TINY
    # never outside the bounds, never NaN or inf
    with pytest.raises(NoSuchExample):
        find(finite_floats(lo, hi, subnormal=True), lambda x: not lo <= x <= hi, settings=SEARCH)


def test_docs_say_how_to_run_the_deep_profile():
    from pathlib import Path

    docs = Path(__file__).resolve().parents[1] / "docs"
    testing = (docs / "getting-started.md").read_text().split("## Tests", 1)[1].split("\n## ", 1)[0]
    assert ("HYPOTHESIS_PROFILE=deep python -m pytest -q tests/test_theory_properties.py "
            "tests/test_multimodal.py") in testing
    assert "(mutation.md)" in testing
    assert "mutmut run --max-children 1" in (docs / "mutation.md").read_text()


def test_users_get_the_deep_profile_from_poolsim_testing(monkeypatch):
    """The profile poolsim.testing.examples' docstring recommends exists for users, not only in this suite's
    conftest: registered by ``import poolsim.testing``, chosen with HYPOTHESIS_PROFILE through load_profile."""
    from poolsim import testing

    assert "tests/conftest.py" not in testing.examples.__doc__
    before = settings.get_current_profile_name()
    monkeypatch.setenv("HYPOTHESIS_PROFILE", testing.DEEP)
    try:
        assert testing.load_profile() == "deep"
        assert settings().max_examples == 5000 and not settings().derandomize
    finally:
        settings.load_profile(before)
    with pytest.raises(ValueError, match="hypothesis profile 'nope' is not registered"):
        testing.load_profile("nope")
    assert settings.get_current_profile_name() == before
