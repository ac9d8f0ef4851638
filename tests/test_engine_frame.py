"""``experiments.frame`` / ``run``'s per-seed frame: its documented column dtypes, its values equal
to the engine's per-seed arrays bit for bit (no precision lost in building it), the columns that
are views of those arrays, and the library's reductions over it giving the same numbers as over
the same frame in 64-bit columns."""
import numpy as np
import pandas as pd
import pytest

from poolsim import _engine, decide_claim, experiments

SMALL = dict(Ks=(5, 9, 12), n=40, every=3, radius=2.5, gamma=0.5, jitter=0.2)
# The largest seed the API accepts (seeds lie in [0, 2**32)) is in the run: an int32 seed column
# would wrap it to -1. 41 seeds: enough for decide_claim to give an interval (MIN_SEEDS).
SEEDS = list(range(40)) + [2**32 - 1]
# 64-bit versions of the frame's integer and estimate columns: the frame's values in the dtypes a
# lossless build could have used; reductions over them are the reference for the 32-bit columns.
WIDE = {"seed": np.int64, "K": np.int64, "n_domains": np.int64, "n_iter": np.int64,
        "est_0": np.float64, "est_1": np.float64}


def _documented_dtypes() -> dict:
    """The column dtypes stated in ``experiments.frame``'s docstring and docs/engine.md (the same
    for a float32 and a float64 engine)."""
    return {"seed": np.dtype(np.uint32), "K": np.dtype(np.int32), "eps": np.dtype(np.float64),
            "n_domains": np.dtype(np.int32), "converged": np.dtype(bool),
            "n_iter": np.dtype(np.int32), "est_0": np.dtype(np.float64), "est_1": np.dtype(np.float64)}


# slow: each engine dtype compiles the engine for SMALL (~7 s of CPU)
@pytest.fixture(scope="module", params=[pytest.param(t, marks=pytest.mark.slow) for t in ("float32", "float64")])
def built(request):
    """(engine dtype, per-seed arrays, parameters, frame) for the sufficient-statistics path."""
    res, P = experiments.simulate("domain_addition", seeds=SEEDS, materialize=False,
                                  dtype=request.param, fields=experiments.FRAME_FIELDS, **SMALL)
    return request.param, res, P, experiments.frame("domain_addition", res, P)


def test_frame_column_dtypes_are_the_documented_ones(built):
    _, _, _, df = built
    assert list(df.columns) == ["experiment", "strategy", "seed", "K", "eps", "n_domains",
                                "converged", "n_iter", "est_0", "est_1"]
    assert {c: df[c].dtype for c in df.columns if c not in ("experiment", "strategy")} == \
        _documented_dtypes()
    assert df.strategy.dtype == pd.CategoricalDtype(list(_engine.STRATEGIES))
    assert df.experiment.dtype == pd.CategoricalDtype(["domain_addition"])
    assert df.strategy.cat.codes.dtype == np.int8


@pytest.mark.slow
def test_run_returns_the_frame_with_its_dtypes():
    kw = dict(seeds=SEEDS, materialize=False, **SMALL)
    res, P = experiments.simulate("domain_addition", fields=experiments.FRAME_FIELDS, **kw)
    pd.testing.assert_frame_equal(experiments.run("domain_addition", **kw),
                                  experiments.frame("domain_addition", res, P), check_exact=True)


def test_frame_values_equal_the_engine_arrays_exactly(built):
    # Every column against the engine array it comes from, with ==: the estimate columns are the
    # engine's numbers (float32 widened exactly to float64), eps is NumPy's float64 norm bit for
    # bit, and the integer columns hold every value (the largest seed included).
    _, res, P, df = built
    S, nK, n_strat, d = res.estimates.shape
    for j in range(d):
        np.testing.assert_array_equal(df[f"est_{j}"].to_numpy(), res.estimates[..., j].ravel())
    want_eps = np.linalg.norm(res.estimates.astype(np.float64) - np.asarray(P["mu_star"]), axis=-1)
    np.testing.assert_array_equal(df.eps.to_numpy(), want_eps.ravel())
    np.testing.assert_array_equal(df.n_domains.to_numpy(), res.n_domains.ravel())
    np.testing.assert_array_equal(df.seed.to_numpy(), np.repeat(SEEDS, nK * n_strat))
    np.testing.assert_array_equal(df.K.to_numpy(), np.tile(np.repeat(SMALL["Ks"], n_strat), S))
    st = np.asarray(df.strategy.astype(str)).reshape(S, nK, n_strat)
    assert (st == np.array(_engine.STRATEGIES)).all()
    n_iter = df.n_iter.to_numpy().reshape(S, nK, n_strat)
    conv = df.converged.to_numpy().reshape(S, nK, n_strat)
    np.testing.assert_array_equal(n_iter[..., 2], res.n_iter)
    np.testing.assert_array_equal(conv[..., 2], res.converged)
    assert (n_iter[..., :2] == 0).all() and conv[..., :2].all()


def test_frame_columns_are_views_of_the_engine_arrays(built):
    # n_domains always; the estimates where the engine's dtype is already float64
    dtype, res, _, df = built
    assert np.shares_memory(df.n_domains.to_numpy(), res.n_domains)
    for col in ("est_0", "est_1"):
        assert np.shares_memory(df[col].to_numpy(), res.estimates) == (dtype == "float64"), col


@pytest.mark.slow
def test_frame_of_read_only_arrays_is_a_writable_copy():
    # Arrays gathered straight from an accelerator are read-only: the frame copies them so that
    # pandas can assign into it, and the caller's arrays stay as they were.
    res, P = experiments.simulate("domain_addition", seeds=2, materialize=False,
                                  fields=experiments.FRAME_FIELDS, **SMALL)
    ro = res._replace(estimates=res.estimates.copy(), n_domains=res.n_domains.copy())
    for a in (ro.estimates, ro.n_domains):
        a.flags.writeable = False
    df = experiments.frame("domain_addition", ro, P)
    df.loc[0, "n_domains"] = -1
    df.loc[0, "est_0"] = 99.0
    assert df.n_domains.iloc[0] == -1 and df.est_0.iloc[0] == 99.0
    np.testing.assert_array_equal(ro.n_domains, res.n_domains)
    np.testing.assert_array_equal(ro.estimates, res.estimates)


def test_reductions_over_the_frame_equal_those_over_64_bit_columns(built):
    # The library's reductions (ci95, decide_claim) and pandas' (the estimates are float64, pandas
    # reduces integer columns in 64 bits): the same numbers, exactly, as over the frame in 64-bit
    # columns (what run() returned when every integer column was int64).
    _, _, _, df = built
    wide = df.astype(WIDE)
    for col in ("eps", "est_0", "est_1"):
        assert experiments.ci95(df[col]) == experiments.ci95(wide[col])
    for by in (["strategy", "K"], ["seed"]):
        for col in ("K", "n_domains", "n_iter", "seed", "est_0", "est_1"):
            for how in ("mean", "sum", "var", "max"):
                pd.testing.assert_series_equal(
                    df.groupby(by, observed=True)[col].agg(how),
                    wide.groupby(by, observed=True)[col].agg(how), check_dtype=False,
                    check_exact=True, check_index_type=False)
    match = df[df.strategy == "match"]
    pool = df[df.strategy == "pool"]
    wm, wp = wide[wide.strategy == "match"], wide[wide.strategy == "pool"]
    got = decide_claim(pool.est_0.to_numpy(), match.est_0.to_numpy())
    assert np.isfinite(got.ci_low)  # enough seeds for an interval: the comparison is not vacuous
    assert got == decide_claim(wp.est_0.to_numpy(), wm.est_0.to_numpy())
    piv = df.pivot_table(index=["strategy", "seed"], columns="K", values="eps", observed=True)
    piv_wide = wide.pivot_table(index=["strategy", "seed"], columns="K", values="eps",
                                observed=True)
    np.testing.assert_array_equal(piv.to_numpy(), piv_wide.to_numpy())


@pytest.mark.parametrize("d", [1, 2, 3, 9])
def test_eps_in_row_blocks_equals_numpy_norm(monkeypatch, d):
    # Blocks of 7 rows over 600 rows (a ragged last block): the blockwise float64 norm equals
    # NumPy's norm of the whole float64 array bit for bit, for the left-to-right sum (d < 8) and
    # NumPy's own (d >= 8).
    monkeypatch.setattr(experiments, "_EPS_BLOCK", 7)
    rng = np.random.default_rng(d)
    est = rng.normal(size=(50, 4, 3, d)).astype(np.float32)
    mu = rng.normal(size=d)
    got = experiments.eps(est, mu)
    assert got.shape == (50, 4, 3) and got.dtype == np.float64
    np.testing.assert_array_equal(got, np.linalg.norm(est.astype(float) - mu, axis=-1))
