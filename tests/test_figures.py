"""``python -m poolsim.figures``: files, CSV numbers vs a direct experiments-API call, bad arguments,
atomic output, and the hand-written robust estimators against independent references.

The CLI run and the direct API run are two subprocesses with the same XLA flags, so the same
seeds give the same float32 numbers. They share a JAX persistent compilation cache in a temp
folder: the second process loads the executables the first compiled instead of compiling again
(the cache is keyed by the lowered program, so it changes no number).
"""
import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap
import time
import types

import numpy as np
import pandas as pd
import pytest
from scipy import optimize

from poolsim.figures import FIGURES, _baselines
from poolsim.figures import __main__ as cli

SEEDS = 2  # the CLI run below: --quick --seeds 2, i.e. seeds 0, 1 (too few for any verdict)
ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_backend_optimization_level=0"}
ENV.pop("JAX_COMPILATION_CACHE_DIR", None)
_UMASK = os.umask(0o022)  # read the process umask (the CLI subprocesses inherit it) ...
os.umask(_UMASK)  # ... and put it back

# The direct API call: plain experiments.run / simulate, then the reductions the figures plot,
# computed here independently of poolsim.figures (np.median on the raw xbar, per-seed diffs, ...).
REFERENCE = textwrap.dedent("""
    import json, sys
    import numpy as np
    from poolsim import experiments
    S = int(sys.argv[2]); out = {}
    def means(df, by):
        return {"|".join(map(str, k)): (v.mean(), *experiments.ci95(v)[1:]) for k, v in df.groupby(by)["eps"]}
    for key, name, kw in [("asymptotic", "asymptotic", {}), ("domain_addition", "domain_addition", {}),
                          ("symmetric_balanced", "symmetric", {"layout": "balanced"}),
                          ("symmetric_gaussian", "symmetric", {"layout": "gaussian"})]:
        res, P = experiments.simulate(name, seeds=S, **kw)
        df = experiments.frame(name, res, P)
        out[key] = means(df, ["strategy", "K"])
        if name == "domain_addition":
            piv = df.pivot_table(index=["strategy", "seed"], columns="K", values="eps")
            out["delta"] = {f"{s}|{k}": float(np.diff(piv.loc[s].to_numpy(), axis=1)[:, i].mean())
                            for s in ("pool", "subsample", "match")
                            for i, k in enumerate(piv.columns[1:])}
        if name in ("asymptotic", "domain_addition"):
            xbar = res.xbar.astype(float)
            out[key + "_median"] = {str(K): float(np.mean(np.linalg.norm(
                np.median(xbar[:, :K], axis=1), axis=-1))) for K in P["Ks"]}
            if name == "domain_addition":
                keep = np.arange(1, xbar.shape[1] + 1) % 3 != 0
                out["oracle"] = {str(K): float(np.mean(np.linalg.norm(
                    xbar[:, :K][:, keep[:K]].mean(axis=1), axis=-1))) for K in P["Ks"]}
            else:
                out["means_seed0"] = res.means[0].astype(float).tolist()
    json.dump(out, open(sys.argv[1], "w"))
""")


def _run(args, **kw):
    return subprocess.run([sys.executable, "-m", "poolsim.figures", *args], capture_output=True,
                          text=True, env=ENV, **kw)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(output folder, reference dict): the CLI on every figure, then the direct API."""
    base = tmp_path_factory.mktemp("figs")
    out, ref = base / "out", base / "ref.json"
    env = {**ENV, "JAX_COMPILATION_CACHE_DIR": str(base / "jax-cache"),
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
           "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
    for cmd in ([sys.executable, "-m", "poolsim.figures", "--quick", "--seeds", str(SEEDS),
                 "--out", str(out), "--only", *FIGURES],
                [sys.executable, "-c", REFERENCE, str(ref), str(SEEDS)]):
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
    return out, json.loads(ref.read_text())


def _csv(out, name):
    return pd.read_csv(out / f"{name}.csv")


def _check_curve(df, ref, panel, extra=None):
    """Every (strategy, K) row of ``panel`` equals the direct API's mean and 95% interval."""
    rows = df[(df.panel == panel) & (df.eval(extra) if extra else True)]
    assert len(rows) > 0
    for _, r in rows.iterrows():
        m, lo, hi = ref[f"{r.strategy}|{int(r.K)}"]
        np.testing.assert_allclose([r["mean"], r.ci_low, r.ci_high], [m, lo, hi], rtol=1e-6, atol=1e-9)
        assert r.n_seeds == SEEDS


@pytest.mark.slow
def test_every_file_written(runs):
    out, _ = runs
    for name in FIGURES:
        for ext in ("png", "pdf", "csv"):
            assert (out / f"{name}.{ext}").stat().st_size > 0, (name, ext)
    summary = (out / "summary.md").read_text()
    for name in FIGURES:
        assert f"## {name} -- " in summary
    assert "SIMULATED" in summary and f"{SEEDS} seeds" in summary
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temp folder left
    assert all(p.stat().st_mode & 0o777 == 0o666 & ~_UMASK for p in out.iterdir())


@pytest.mark.slow
def test_verdicts_csv_has_the_columns_and_two_seeds_never_decide(runs):
    out, _ = runs
    v = pd.read_csv(out / "verdicts.csv")
    assert {"figure", "claim", "verdict", "estimate", "ci_low", "ci_high", "n_seeds",
            "threshold"} <= set(v.columns)
    assert set(v.figure) == set(FIGURES)  # every figure states at least one claim
    assert (v.verdict == "inconclusive").all() and (v.n_seeds <= SEEDS).all()
    assert v.ci_low.isna().all()  # no zero-width interval from two seeds
    summary = (out / "summary.md").read_text()
    claims = [ln for ln in summary.splitlines() if ln.startswith("- ") and "**" in ln]
    assert len(claims) == len(v)  # the claim lines are rendered from the rows
    assert all("**inconclusive**" in ln for ln in claims)
    assert not re.search(r"\b(holds|does not hold)\b", "\n".join(claims))
    assert "0 holds, 0 does not hold" in summary


@pytest.mark.slow
def test_csv_numbers_equal_direct_api_call(runs):
    out, ref = runs
    _check_curve(_csv(out, "asymptotic"), ref["asymptotic"], "eps_vs_K")
    _check_curve(_csv(out, "asymptotic"), ref["asymptotic"], "final")
    da = _csv(out, "domain_addition")
    _check_curve(da, ref["domain_addition"], "trajectory")
    _check_curve(da, ref["domain_addition"], "final")
    for _, r in da[da.panel == "delta"].iterrows():
        assert r["mean"] == pytest.approx(ref["delta"][f"{r.strategy}|{int(r.K)}"], rel=1e-6, abs=1e-9)
    sym = _csv(out, "symmetric")
    for lay in ("balanced", "gaussian"):
        _check_curve(sym, ref[f"symmetric_{lay}"], "eps", f"layout == '{lay}'")


@pytest.mark.slow
def test_baselines_csv_matches_engine_and_independent_estimators(runs):
    out, ref = runs
    b = _csv(out, "baselines")
    for name in ("asymptotic", "domain_addition"):
        d = b[(b.experiment == name) & b.strategy.isin(["pool", "match"])]
        _check_curve(d, ref[name], "eps_vs_K")
        med = b[(b.experiment == name) & (b.strategy == "median") & (b.panel == "eps_vs_K")]
        got = dict(zip(med.K.astype(str), med["mean"]))
        assert got == pytest.approx(ref[f"{name}_median"], rel=1e-9)
        mcd = b[(b.experiment == name) & (b.strategy == "mcd")]
        assert mcd.K.min() >= _baselines.MCD_MIN_RATIO * 2  # only where K >> d (d = 2)
    orc = b[(b.experiment == "domain_addition") & (b.strategy == "oracle") & (b.panel == "eps_vs_K")]
    assert dict(zip(orc.K.astype(str), orc["mean"])) == pytest.approx(ref["oracle"], rel=1e-9)


@pytest.mark.slow
def test_intro_points_are_the_drawn_means(runs):
    out, ref = runs
    pts = _csv(out, "synthetic_intro").query("panel == 'domain_means'")
    np.testing.assert_allclose(pts[["x", "y"]].to_numpy(), np.array(ref["means_seed0"]), rtol=1e-6)
    # Ground-truth contamination labels: B_k ~ Bernoulli(0.3) over 50 domains -> 15 +- 3.2 shifted;
    # shifted means sit alpha = 1.5 further along e1 (difference of two group means, sd <= 0.2).
    sh = pts.shifted.astype(bool)
    assert 5 <= sh.sum() <= 25
    assert pts.x[sh].mean() - pts.x[~sh].mean() == pytest.approx(1.5, abs=0.6)


def test_help():
    r = _run(["--help"])
    assert r.returncode == 0
    assert "--quick" in r.stdout and "synthetic_intro" in r.stdout


@pytest.mark.parametrize("args, msg", [
    (["--only", "nosuch"], "unknown figure"),
    (["--only", "asymptotic", "flow_bridge_typo"], "unknown figure"),
    (["--seeds", "0"], "--seeds must be a positive integer"),
    (["--seeds", "-3"], "--seeds must be a positive integer"),
    (["--seeds", "two"], "invalid int value"),
    (["--format", "png,gif"], "--format"),
    (["--bogus"], "unrecognized arguments"),
])
def test_bad_arguments_one_line_error_nothing_written(tmp_path, args, msg):
    out = tmp_path / "out"
    r = _run(["--out", str(out), *args])
    assert r.returncode != 0
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("poolsim.figures: error:") and msg in lines[0]
    assert not out.exists()


@pytest.mark.parametrize("where", ["is_a_file", "under_a_file"])
def test_unwritable_out(tmp_path, where):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    out = blocker if where == "is_a_file" else blocker / "sub"
    r = _run(["--out", str(out), "--only", "asymptotic"])
    assert r.returncode != 0
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "--out" in lines[0]
    assert blocker.read_text() == "x"


def _fake(name, fail, value=1.0):
    from poolsim import decide_claim
    from poolsim.figures import _data

    def compute(*, seeds, quick, progress=None):
        df = pd.DataFrame({"panel": ["p"], "mean": [value], "n_seeds": [seeds]})
        v = decide_claim(np.full(seeds, value))
        return _data.set_verdicts(df, [_data.claim(name, f"{name} is positive", v, "x")])

    def plot(df):
        if fail:
            raise ValueError(f"{name} failed while plotting")
        import matplotlib.pyplot as plt
        return plt.figure()

    return types.SimpleNamespace(NAME=name, compute=compute, plot=plot,
                                 summarize=lambda df: f"## {name} -- fake\n\nvalue {value}\n")


def test_failure_midway_leaves_out_untouched(tmp_path, monkeypatch, capsys):
    # Two fake figures, the second fails: nothing of the first may reach --out.
    import poolsim.figures as figs

    mods = {"first": _fake("first", False), "second": _fake("second", True)}
    monkeypatch.setattr(figs, "available", lambda: tuple(mods))
    monkeypatch.setattr(figs, "load", mods.__getitem__)
    monkeypatch.setenv("XLA_FLAGS", "")  # main() may set the compile flag; keep it to this test
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("old")
    assert cli.main(["--out", str(out), "--format", "png"]) == 1
    err = [ln for ln in capsys.readouterr().err.splitlines() if "error" in ln]
    assert err == ["poolsim.figures: error: second failed while plotting"]
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]
    # and the same fakes without the failure write everything
    mods["second"] = _fake("second", False)
    assert cli.main(["--out", str(out), "--format", "png"]) == 0
    assert {p.name for p in out.iterdir()} == {"keep.txt", "summary.md", "first.csv", "first.png",
                                               "second.csv", "second.png", "verdicts.csv", "settings.json"}


def test_background_figure_errors_surface_and_a_failure_stops_it(tmp_path, monkeypatch, capsys):
    # Figures without SIMULATIONS are computed in a background thread: (1) its error is the run's
    # one-line error; (2) when a main-thread figure fails first, its next progress call raises.
    # The error line is the last thing written to stderr and starts a line of its own: every progress bar
    # was closed before it (a bar closed after it writes after it; the cursor-up escape a bar below the
    # first writes when it closes would precede it on its line), whichever thread makes its bar first.
    import threading

    import poolsim.figures as figs

    stopped = threading.Event()

    def slow_compute(*, seeds, quick, progress=None):
        deadline = time.monotonic() + 600  # a guard against a hang only: the loop ends when it is stopped
        while time.monotonic() < deadline:
            try:
                progress(0)
            except RuntimeError:
                stopped.set()
                raise
            time.sleep(0.01)
        raise AssertionError("the background figure was not stopped")

    def broken_compute(*, seeds, quick, progress=None):
        raise ValueError("background compute failed")

    main_fails = types.SimpleNamespace(**{**vars(_fake("first", True)), "SIMULATIONS": []})
    slow = types.SimpleNamespace(**{**vars(_fake("slow", False)), "compute": slow_compute})
    broken = types.SimpleNamespace(**{**vars(_fake("broken", False)), "compute": broken_compute})
    monkeypatch.setenv("XLA_FLAGS", "")
    out = tmp_path / "out"
    out.mkdir()
    for mods, message in (({"broken": broken}, "background compute failed"),
                          ({"first": main_fails, "slow": slow}, "first failed while plotting")):
        monkeypatch.setattr(figs, "available", lambda mods=mods: tuple(mods))
        monkeypatch.setattr(figs, "load", mods.__getitem__)
        assert cli.main(["--out", str(out), "--format", "png"]) == 1
        err = capsys.readouterr().err
        assert ("\n" + err).endswith(f"\npoolsim.figures: error: {message}\n"), repr(err[-200:])
        assert [ln for ln in err.splitlines() if "error" in ln] == [f"poolsim.figures: error: {message}"]
        assert list(out.iterdir()) == []
    assert stopped.is_set()


def test_only_keeps_the_other_figures_sections_and_verdicts(tmp_path, monkeypatch):
    import poolsim.figures as figs

    mods = {"first": _fake("first", False), "second": _fake("second", False)}
    monkeypatch.setattr(figs, "available", lambda: tuple(mods))
    monkeypatch.setattr(figs, "load", mods.__getitem__)
    monkeypatch.setenv("XLA_FLAGS", "")
    out = tmp_path / "out"
    assert cli.main(["--out", str(out), "--format", "png", "--seeds", "40"]) == 0
    mods["second"] = _fake("second", False, value=-1.0)
    assert cli.main(["--out", str(out), "--format", "png", "--seeds", "40", "--only", "second"]) == 0
    summary = (out / "summary.md").read_text()
    assert "## first -- fake" in summary and "value 1.0" in summary  # kept from the first run
    assert "## second -- fake" in summary and "value -1.0" in summary  # replaced by the second
    v = pd.read_csv(out / "verdicts.csv").set_index("figure")
    assert list(v.index) == ["first", "second"]
    # 40 constant seeds: +1 holds, -1 does not hold (constant data: the interval is the point)
    assert v.loc["first", "verdict"] == "holds" and v.loc["second", "verdict"] == "does not hold"


def test_a_rerun_that_changes_nothing_rewrites_nothing(tmp_path, monkeypatch):
    """The same settings twice: every file (CSV, PNG, PDF, SVG, verdicts.csv, summary.md) keeps its bytes and
    is not even replaced (same inode and modification time); no date or command line in any file; a changed
    figure rewrites only the files whose bytes changed."""
    import poolsim.figures as figs

    mods = {"first": _fake("first", False), "second": _fake("second", False)}
    monkeypatch.setattr(figs, "available", lambda: tuple(mods))
    monkeypatch.setattr(figs, "load", mods.__getitem__)
    monkeypatch.setenv("XLA_FLAGS", "")
    out = tmp_path / "out"

    def state():
        return {p.name: (p.read_bytes(), p.stat().st_ino, p.stat().st_mtime_ns) for p in out.iterdir()}

    args = ["--out", str(out), "--format", "png,pdf,svg", "--seeds", "40"]
    assert cli.main(args) == 0
    first = state()
    assert len(first) == 11  # two figures x (csv, png, pdf, svg), verdicts.csv, summary.md, settings.json
    time.sleep(0.01)  # a rewrite would show in the modification time
    assert cli.main([*args[:-1], "40"]) == 0
    assert state() == first
    summary = (out / "summary.md").read_text()
    assert "Run settings: `python -m poolsim.figures --seeds 40`" in summary
    assert not re.search(r"\b20\d\d-\d\d-\d\d|--out|--format", summary)
    for name, (data, _, _) in first.items():
        assert b"Matplotlib v" not in data and b"matplotlib.org" not in data, name  # no version stamp
    mods["second"] = _fake("second", False, value=2.0)
    assert cli.main(args) == 0
    changed = {n for n, s in state().items() if s != first[n]}
    assert {"second.csv", "summary.md"} <= changed and not changed & {"first.csv", "first.png", "first.pdf"}


def test_paper_seeds_flag_runs_ten_seeds_labelled(tmp_path, monkeypatch):
    import poolsim.figures as figs

    mods = {"first": _fake("first", False)}
    monkeypatch.setattr(figs, "available", lambda: tuple(mods))
    monkeypatch.setattr(figs, "load", mods.__getitem__)
    monkeypatch.setenv("XLA_FLAGS", "")
    out = tmp_path / "out"
    assert cli.main(["--out", str(out), "--format", "png", "--paper-seeds"]) == 0
    assert "the paper's 10-seed picture" in (out / "summary.md").read_text()
    v = pd.read_csv(out / "verdicts.csv")
    assert v.n_seeds.tolist() == [10] and v.verdict.tolist() == ["inconclusive"]
    assert cli.main(["--out", str(out), "--format", "png", "--seeds", "10"]) == 0  # the same run
    assert "the paper's 10-seed picture" in (out / "summary.md").read_text()


def test_temp_folder_of_a_killed_run_is_git_ignored():
    root = pathlib.Path(__file__).resolve().parents[1]
    r = subprocess.run(["git", "check-ignore", "-q", f"figures/{cli.TMP_PREFIX}abc123/x.png"],
                       cwd=root, capture_output=True)
    if r.returncode == 128:
        pytest.skip("not a git checkout")
    assert r.returncode == 0


# --- the hand-written estimators against independent references ---------------------------------

def test_geometric_median_minimises_sum_of_distances(rng):
    x = rng.normal(size=(25, 2)) + np.array([[3.0, 0.0]]) * (rng.random((25, 1)) < 0.3)
    # reference: direct numerical minimisation of sum_i ||x_i - y|| (scipy, from the mean)
    ref = optimize.minimize(lambda y: np.linalg.norm(x - y, axis=1).sum(), x.mean(0),
                            method="Nelder-Mead", options=dict(xatol=1e-10, fatol=1e-12)).x
    np.testing.assert_allclose(_baselines.geometric_median(x), ref, atol=1e-6)


def test_huber_is_equivariant_and_symmetric(rng):
    # Mirror-symmetric data about c: by symmetry of the estimating equation the solution is c.
    z = rng.normal(size=(10, 2))
    c = np.array([0.7, -1.2])
    np.testing.assert_allclose(_baselines.huber(np.vstack([c + z, c - z])), c, atol=1e-8)
    # translation equivariance, and one far outlier moves it by a bounded amount (less than the mean)
    x = rng.normal(size=(30, 2))
    np.testing.assert_allclose(_baselines.huber(x + 5.0), _baselines.huber(x) + 5.0, atol=1e-7)
    xo = np.vstack([x, [[100.0, 0.0]]])
    assert np.linalg.norm(_baselines.huber(xo) - _baselines.huber(x)) < 0.2 * np.linalg.norm(
        xo.mean(0) - x.mean(0))


def test_median_of_means_and_mcd_edges(rng):
    x = rng.normal(size=(9, 2))
    # K = 1: a single block holding the one domain, so the estimate is that domain
    np.testing.assert_allclose(_baselines.median_of_means(x[:1], seed=0), x[0])
    assert np.isnan(_baselines.mcd(x, seed=0)).all()  # K = 9 < 10 d = 20: not used
    y = rng.normal(size=(40, 2))
    assert np.all(np.isfinite(_baselines.mcd(y, seed=0)))


def test_results_page_numbers_come_from_the_committed_run():
    # Every "m [lo, hi]" the results page's figures and audit sections quote appears verbatim in the
    # committed figures/summary.md or docs/claims.md (numbers come from the committed run).
    root = pathlib.Path(__file__).resolve().parents[1]
    results = (root / "docs" / "results.md").read_text()
    part = results.split("## Reproduced figures", 1)[1].split("\n## adsim", 1)[0]
    committed = (root / "figures" / "summary.md").read_text() + (root / "docs" / "claims.md").read_text()
    quoted = re.findall(r"[-+]?\d+\.\d+ \[[-+]?\d+\.\d+, [-+]?\d+\.\d+\]", part)
    assert len(quoted) >= 5
    missing = [q for q in quoted if q not in committed]
    assert not missing, missing
