"""Data Addition score, paper Eq. 15:
DA(y) = sum_{i=1}^{L-1} 1{y_{i+1} >= y_i} (1 + (y_{i+1} - y_i) / 10 * s_i), s = (0.1, 0.2, 0.3, 0.4).
Expected values are worked out by hand in the comments."""
import numpy as np
import pytest

import poolsim

PAPER_S = (0.1, 0.2, 0.3, 0.4)


@pytest.mark.parametrize("y,expected", [
    # diffs (2, -1, 4, 5): (1 + 0.2*0.1) + 0 + (1 + 0.4*0.3) + (1 + 0.5*0.4) = 1.02 + 1.12 + 1.20 = 3.34
    ([70, 72, 71, 75, 80], 3.34),
    # flat: four steps of exactly 1 each = 4 (the paper's "DA >= 4: never deteriorates" threshold)
    ([80, 80, 80, 80, 80], 4.0),
    # diffs all 10: each step 1 + 1.0 * s_i, sum = 4 + (0.1 + 0.2 + 0.3 + 0.4) = 5.0
    ([50, 60, 70, 80, 90], 5.0),
    # strictly decreasing: every indicator is 0
    ([90, 85, 80, 75, 70], 0.0),
    # diffs (-5, 1, 0.5, -0.5): 0 + (1 + 0.1*0.2) + (1 + 0.05*0.3) + 0 = 1.02 + 1.015 = 2.035
    ([85.0, 80.0, 81.0, 81.5, 81.0], 2.035),
])
def test_eq15_by_hand(y, expected):
    got = poolsim.da_score(y)
    assert isinstance(got, float)
    assert got == pytest.approx(expected, rel=1e-12)
    # The paper's weights passed explicitly give the same number.
    assert poolsim.da_score(y, weights=PAPER_S) == pytest.approx(expected, rel=1e-12)


def test_default_weights_other_lengths_are_i_over_sum():
    # L = 3: s = (1, 2) / 3. diffs (3, 6): (1 + 0.3 * 1/3) + (1 + 0.6 * 2/3) = 1.1 + 1.4 = 2.5
    assert poolsim.da_score([10, 13, 19]) == pytest.approx(2.5, rel=1e-12)
    # L = 2: s = (1,). diff 5: 1 + 0.5 * 1 = 1.5
    assert poolsim.da_score([70, 75]) == pytest.approx(1.5, rel=1e-12)
    # L = 6: s = (1..5) / 15. diffs all 3: 5 + 0.3 * (15 / 15) = 5.3
    assert poolsim.da_score([60, 63, 66, 69, 72, 75]) == pytest.approx(5.3, rel=1e-12)
    # Explicit weights override: L = 3, s = (0.5, 0.5): (1 + 0.3*0.5) + (1 + 0.6*0.5) = 2.45
    assert poolsim.da_score([10, 13, 19], weights=[0.5, 0.5]) == pytest.approx(2.45, rel=1e-12)


@pytest.mark.parametrize("L", [2, 3, 5, 8])
def test_monotone_runs_score_at_least_L_minus_1(rng, L):
    # Each non-decreasing step contributes 1 + (nonnegative), so DA >= L - 1, with equality iff
    # every step is flat; a single drop removes that step's >= 1.
    y = np.cumsum(rng.uniform(0, 3, size=(200, L)), axis=1) + 50
    y[:10] = 70.0  # flat runs
    da = poolsim.da_score(y)
    assert da.shape == (200,)
    assert np.all(da >= L - 1)
    np.testing.assert_allclose(da[:10], L - 1)
    assert np.all(da[10:] > L - 1)
    dropped = y.copy()
    dropped[:, -1] = dropped[:, -2] - 1.0  # last step now a drop
    assert np.all(poolsim.da_score(dropped) < L - 1)


def test_batched_shapes_match_loop(rng):
    y = rng.uniform(60, 90, size=(3, 4, 5))
    da = poolsim.da_score(y)
    assert isinstance(da, np.ndarray) and da.shape == (3, 4)
    loop = np.array([[poolsim.da_score(y[i, j]) for j in range(4)] for i in range(3)])
    np.testing.assert_allclose(da, loop, rtol=0, atol=0)


@pytest.mark.parametrize("kwargs,name", [
    (dict(y=[70.0]), "y"),
    (dict(y=75.0), "y"),
    (dict(y=[70.0, np.nan, 72.0]), "y"),
    (dict(y=[70.0, 71.0, 72.0, 73.0, 74.0], weights=[0.1, 0.2, 0.7]), "weights"),
    (dict(y=[70.0, 71.0, 72.0], weights=[0.1, np.inf]), "weights"),
])
def test_bad_input(kwargs, name):
    with pytest.raises(ValueError, match=rf"\b{name}\b"):
        poolsim.da_score(**kwargs)


def test_unsigned_and_integer_inputs_are_differenced_as_real_numbers():
    # Performance stored as uint8 percent: a drop 80 -> 70 must be a drop (-10), not the unsigned
    # wrap-around 246. Eq. 15 on (70, 80, 70, 75): diffs (10, -10, 5), s = (1, 2, 3) / 6:
    # (1 + 1.0 * 1/6) + 0 + (1 + 0.5 * 3/6) = 2 + 1/6 + 1/4 = 2.41666...
    expected = 2 + 1 / 6 + 1 / 4
    for dtype in (np.uint8, np.int64, np.float32):
        assert poolsim.da_score(np.array([70, 80, 70, 75], dtype=dtype)) == pytest.approx(expected, rel=1e-7)


def test_non_finite_message_says_what_is_wrong():
    with pytest.raises(ValueError, match="y contains NaN or inf"):
        poolsim.da_score([70.0, np.inf])


def test_one_run_gives_a_python_float_and_messages_name_the_lengths():
    # documented return type: a Python float for 1-D y (not a NumPy scalar or a 0-d array)
    assert type(poolsim.da_score([70, 72, 71, 75, 80])) is float
    with pytest.raises(ValueError, match=r"weights must have length L-1 = 4 for y of length 5, "
                                         r"got shape \(3,\)"):
        poolsim.da_score([70, 72, 71, 75, 80], weights=[0.2, 0.3, 0.5])
    with pytest.raises(ValueError, match="weights contains NaN or inf"):
        poolsim.da_score([70, 72, 71], weights=[0.5, np.nan])
