"""The suite has no test that cannot fail (``tests/check_asserts.py``), and the checker flags what it
claims to flag (a synthetic test module with one example of each finding)."""
import importlib.util
from pathlib import Path

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("check_asserts", HERE / "check_asserts.py")
check_asserts = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_asserts)

BAD = '''
import json
import pandas as pd
import pytest

def _helper(v):
    assert v > 0

def _indirect(v):
    _helper(v)

@pytest.fixture
def test_data():
    return 1

def test_tuple_assert():
    x = 1
    assert (x == 2, "message")

def test_reads_and_says_nothing(tmp_path):
    proto, da = pd.read_csv(tmp_path / "a.csv"), pd.read_csv(tmp_path / "b.csv")
    assert len(proto) == 3

def test_runs_only():
    json.dumps({})

def test_documented_smoke():
    json.dumps({})  # no-assert: only checks that it does not raise

def test_through_helpers():
    _indirect(3)

def test_raises():
    with pytest.raises(ValueError):
        int("x")

def test_numpy_helper():
    import numpy as np
    np.testing.assert_allclose(1.0, 1.0)
'''


def test_checker_flags_each_kind_and_nothing_else(tmp_path):
    f = tmp_path / "test_bad.py"
    f.write_text(BAD)
    found = sorted(m.split(": ", 1)[1] for m in check_asserts.check([f]))
    assert found == sorted([
        "test_tuple_assert: always-true ((x == 2, 'message'))",
        "test_tuple_assert: no-assert (nothing in it can fail)",
        "test_reads_and_says_nothing: unused-read ('da' is read and never used)",
        "test_runs_only: no-assert (nothing in it can fail)",
    ])
    assert check_asserts.main([str(f)]) == 1


def test_no_test_in_the_suite_cannot_fail():
    found = check_asserts.check([HERE])
    assert found == [], "\n".join(found)
