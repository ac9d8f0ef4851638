"""Committed results are compared, not overwritten: the tolerance rule (poolsim.figures._compare),
the CLI keeping files whose numbers only carry float noise while a real change rewrites them, and
``--check`` failing on an altered verdict. The fast tests use fake figures (no JAX); the slow one
runs a real figure natively and under XLA limited to SSE4.2 (float32 sums in another order)."""
import json
import os
import re
import shutil
import subprocess
import sys
import time
import types

import numpy as np
import pandas as pd
import pytest

from poolsim.figures import _compare
from poolsim.figures import __main__ as cli

HEAD = "panel,mean,ci_low,ci_high,n_seeds\n"


def test_numbers_within_tolerance_of_their_column_are_the_same():
    old = HEAD + "a,0.5,0.4,0.6,100\nb,-0.001,-0.2,0.2,100\n"
    # 1e-6 of the column's largest magnitude (0.6 for ci_high, 0.5 for mean): float noise
    noisy = HEAD + "a,0.5000005,0.4,0.6,100\nb,-0.0010004,-0.2,0.2,100\n"
    d = _compare.compare(noisy, old)
    assert d.same and not d.bitwise and d.problems == []
    # worst in half-widths: row a: 5e-7 / 0.1; row b: 4e-7 / 0.2
    assert d.worst_hw == pytest.approx(5e-7 / 0.1)
    assert _compare.compare(old, old).bitwise
    real = HEAD + "a,0.5001,0.4,0.6,100\nb,-0.001,-0.2,0.2,100\n"  # 2e-4 of the scale: a real change
    d = _compare.compare(real, old)
    assert not d.same and len(d.problems) == 1 and "row 1: mean = 0.5001" in d.problems[0]
    assert d.worst_hw == pytest.approx(1e-4 / 0.1)
    assert not _compare.compare(HEAD + "a,0.5,0.4,0.6,101\nb,-0.001,-0.2,0.2,100\n", old).same
    assert not _compare.compare(HEAD + "x,0.5,0.4,0.6,100\nb,-0.001,-0.2,0.2,100\n", old).same


def test_nan_inf_and_rounded_columns():
    old = "a,b\nnan,0.19585\ninf,0.51234\n"
    assert _compare.compare("a,b\nnan,0.19586\ninf,0.51234\n", old).same  # b rounded to 5 decimals
    assert not _compare.compare("a,b\nnan,0.19587\ninf,0.51234\n", old).same
    assert not _compare.compare("a,b\n1.0,0.19585\ninf,0.51234\n", old).same
    assert not _compare.compare("a,b\nnan,0.19585\n-inf,0.51234\n", old).same
    # a column of full-precision floats with one short value gets no rounding allowance
    assert not _compare.compare("m\n0.5001\n0.1234567890123\n", "m\n0.5\n0.1234567890123\n").same
    # an integer column gets no rounding allowance: 5 vs 6 differs
    assert not _compare.compare("K\n6\n", "K\n5\n").same


def test_new_columns_and_rows_are_reported_not_errors():
    old = "figure,claim,verdict,estimate\nf,c1,holds,0.5\nf,c2,holds,0.7\n"
    new = "figure,claim,verdict,estimate,robust\nf,c2,holds,0.7,yes\nf,c1,holds,0.5,yes\nf,c3,holds,1,no\n"
    d = _compare.compare(new, old, _compare.VERDICT_KEY)  # rows by key: their order does not matter
    assert not d.same
    assert d.problems == ["column 'robust' is new (not in the committed file)", "row 'f / c3' is new"]
    assert sorted(d.verdicts) == [("f / c1", "verdict", "holds", "holds"),
                                  ("f / c2", "verdict", "holds", "holds")]
    d = _compare.compare(new.replace("f,c2,holds", "f,c2,inconclusive"), old, _compare.VERDICT_KEY)
    assert "f / c2: verdict is 'inconclusive', committed 'holds'" in d.problems


def _fake(name, value, seeds_values=None):
    from poolsim import decide_claim
    from poolsim.figures import _data

    def compute(*, seeds, quick, progress=None):
        x = np.full(seeds, value) + np.linspace(-1, 1, seeds) * 0.1
        df = pd.DataFrame({"panel": ["p"], "mean": [float(x.mean())], "ci_low": [x.mean() - 0.05],
                           "ci_high": [x.mean() + 0.05], "n_seeds": [seeds]})
        return _data.set_verdicts(df, [_data.claim(name, f"{name} is positive", decide_claim(x), "x")])

    def plot(df):
        import matplotlib.pyplot as plt

        fig = plt.figure()
        fig.text(0.5, 0.5, repr(float(df["mean"].iloc[0])))  # the image shows the exact number
        return fig

    return types.SimpleNamespace(NAME=name, compute=compute, plot=plot,
                                 summarize=lambda df: f"## {name} -- fake\n\nmean {df['mean'].iloc[0]!r}\n")


@pytest.fixture
def fakes(monkeypatch):
    import poolsim.figures as figs

    mods = {"first": _fake("first", 1.0), "second": _fake("second", 2.0)}
    monkeypatch.setattr(figs, "available", lambda: tuple(mods))
    monkeypatch.setattr(figs, "load", mods.__getitem__)
    monkeypatch.setenv("XLA_FLAGS", "")
    return mods


def _state(out):
    return {p.name: (p.read_bytes(), p.stat().st_ino, p.stat().st_mtime_ns) for p in out.iterdir()}


def test_float_noise_rewrites_nothing_a_real_change_rewrites_its_files(tmp_path, fakes, capsys):
    out = tmp_path / "out"
    args = ["--out", str(out), "--format", "png", "--seeds", "40"]
    assert cli.main(args) == 0
    first = _state(out)
    time.sleep(0.01)
    fakes["second"] = _fake("second", 2.0 * (1 + 3e-8))  # another CPU: a few float32 ulps
    capsys.readouterr()
    assert cli.main(args) == 0
    assert _state(out) == first  # not even replaced; the image and summary show the kept numbers
    assert "no file changed; kept second.csv, second claims: reproduced within tolerance" in capsys.readouterr().err
    fakes["second"] = _fake("second", 2.001)  # a real change
    assert cli.main(args) == 0
    changed = {n for n, s in _state(out).items() if s != first[n]}
    assert changed == {"second.csv", "second.png", "summary.md", "verdicts.csv"}


def test_check_passes_on_noise_and_fails_naming_figure_and_claim_on_an_altered_verdict(
        tmp_path, fakes, capsys):
    out = tmp_path / "out"
    assert cli.main(["--out", str(out), "--format", "png", "--seeds", "40"]) == 0
    before = _state(out)
    fakes["first"] = _fake("first", 1.0 * (1 + 3e-8))
    capsys.readouterr()
    assert cli.main(["--check", "--out", str(out), "--seeds", "40"]) == 0
    report = capsys.readouterr().out
    assert "## first" in report and "## second" in report
    assert "| claim: first is positive |" in report and "holds = holds; verdict_holm: holds = holds" in report
    v = pd.read_csv(out / "verdicts.csv")
    v.loc[v["figure"] == "second", "verdict"] = "does not hold"  # a committed verdict the code no longer gives
    v.to_csv(out / "verdicts.csv", index=False)
    altered = _state(out)
    assert cli.main(["--check", "--out", str(out), "--seeds", "40"]) == 1
    cap = capsys.readouterr()
    assert "**does not hold -> holds**" in cap.out
    assert ("poolsim.figures --check: second: verdicts.csv: second / second is positive: verdict is "
            "'holds', committed 'does not hold'") in cap.err
    assert _state(out) == altered  # --check writes nothing into --out
    v.loc[v["figure"] == "second", "verdict"] = "holds"
    v.to_csv(out / "verdicts.csv", index=False)
    t = pd.read_csv(out / "first.csv")
    t["mean"] *= 1.001  # a committed number the rerun does not reproduce (1e-3 relative, tolerance 1e-5)
    t.to_csv(out / "first.csv", index=False)
    assert cli.main(["--check", "--out", str(out), "--seeds", "40"]) == 1
    err = capsys.readouterr().err
    assert re.search(r"poolsim.figures --check: first: first.csv: row 1: mean = 1.0000000\d*, committed 1.001 ", err)
    assert "--check: second:" not in err  # the other figure reproduces
    assert {k: v for k, v in before.items() if k != "verdicts.csv"} == \
        {k: v for k, v in altered.items() if k != "verdicts.csv"}


@pytest.mark.slow
def test_a_rerun_under_another_instruction_set_leaves_the_folder_clean(tmp_path):
    """synthetic_intro with 200 seeds: XLA limited to SSE4.2 sums the float32 draws in another order
    than the native (AVX) code, so the raw CSV differs in the last bits (asserted: otherwise this test
    could not fail); the rerun must keep every file, and ``--check`` must pass."""
    env = {**os.environ, "POOLSIM_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("XLA_FLAGS", None)
    sse = {**env, "XLA_FLAGS": "--xla_cpu_max_isa=SSE4_2"}
    args = ["--only", "synthetic_intro", "--seeds", "200", "--format", "png"]

    def run(out, environ, *extra):
        return subprocess.run([sys.executable, "-m", "poolsim.figures", *args, "--out", str(out), *extra],
                              env=environ, capture_output=True, text=True, timeout=600)

    native = tmp_path / "native"
    assert run(native, env).returncode == 0
    clone = tmp_path / "clone"
    shutil.copytree(native, clone)
    before = _state(clone)
    r = run(clone, sse)
    assert r.returncode == 0, r.stderr
    assert "kept synthetic_intro.csv" in r.stderr and "not bit for bit" in r.stderr  # the bits did differ
    assert _state(clone) == before
    r = run(clone, sse, "--check")
    assert r.returncode == 0, r.stderr
    assert "## synthetic_intro" in r.stdout and "reproduced |" in r.stdout


def test_render_store_keys_on_the_inputs_and_only_keeps_poolsim_figures(tmp_path, monkeypatch):
    from poolsim.figures import _renders, asymptotic

    monkeypatch.setenv("POOLSIM_CACHE_DIR", str(tmp_path / "cache"))
    df = pd.DataFrame({"mean": [0.5, 0.25]})
    df.attrs["params"] = {"K": 5}
    other = df.copy()
    other.attrs = {"params": {"K": 6}}  # the same numbers, other parameters: another picture
    keys = {_renders.key("asymptotic", "png", d) for d in (df, other)} | {_renders.key("asymptotic", "pdf", df)}
    assert len(keys) == 3
    assert _renders.covered(asymptotic) and not _renders.covered(_fake("asymptotic", 1.0))
    (tmp_path / "asymptotic.png").write_bytes(b"png bytes")
    dest = tmp_path / "dest"
    dest.mkdir()
    assert not _renders.load(asymptotic, "asymptotic", ["png"], df, dest)
    _renders.store(asymptotic, "asymptotic", ["png"], df, tmp_path)
    assert _renders.load(asymptotic, "asymptotic", ["png"], df, dest)
    assert (dest / "asymptotic.png").read_bytes() == b"png bytes"
    assert not _renders.load(asymptotic, "asymptotic", ["png"], other, dest)
    assert not _renders.load(asymptotic, "asymptotic", ["png", "pdf"], df, dest)  # every format or none


def test_check_reads_the_committed_sweep_for_the_robustness_column(tmp_path, fakes, monkeypatch):
    # --check makes the figures in a scratch folder; the verdicts' robustness column must still come from
    # the committed sensitivity.csv (the sweep is an optional figure the check does not rerun), else every
    # swept claim reads "not swept" and differs from its committed row.
    from poolsim.figures import _claims

    out = tmp_path / "out"
    assert cli.main(["--out", str(out), "--format", "png", "--seeds", "40"]) == 0
    seen = []
    real = _claims.read_sweep
    monkeypatch.setattr(_claims, "read_sweep", lambda *folders: seen.append(folders) or real(*folders))
    assert cli.main(["--check", "--out", str(out), "--seeds", "40"]) == 0
    assert len(seen) == 1 and seen[0][-1] == out.resolve(), seen


def _counting(fakes):
    """Wrap every fake figure's ``compute`` to count its calls: a refused run computes nothing."""
    calls = []
    for name, mod in fakes.items():
        def compute(*, _inner=mod.compute, _name=name, **kw):
            calls.append(_name)
            return _inner(**kw)
        fakes[name] = types.SimpleNamespace(**{**vars(mod), "compute": compute})
    return calls


def _errors(capsys):
    return [ln for ln in capsys.readouterr().err.splitlines() if "error" in ln]


def test_a_smaller_or_other_run_stops_before_any_work_and_says_where_to_write(tmp_path, fakes, capsys):
    """Results made with 40 seeds are not replaced by a --quick, a smaller or a larger run: one line naming the
    figures, their settings, this run's and the way out (--out, --check, --overwrite); nothing computed,
    nothing written. The same settings rerun as before (nothing changes)."""
    out = tmp_path / "out"
    base = ["--out", str(out), "--format", "png"]
    assert cli.main([*base, "--seeds", "40"]) == 0
    assert json.loads((out / "settings.json").read_text()) == {
        name: {"seeds": 40, "quick": False, "max_K": None} for name in ("first", "second")}
    before = _state(out)
    calls = _counting(fakes)
    tail = ("write elsewhere with --out DIR, compare without writing with --check, or replace {} on purpose with "
            "--overwrite")
    for extra, names, how in ((["--seeds", "40", "--quick"], "first, second", "--quick (3 seeds)"),
                              (["--quick"], "first, second", "--quick (3 seeds)"),
                              (["--seeds", "20"], "first, second", "20 seeds"),
                              (["--seeds", "80"], "first, second", "80 seeds"),
                              (["--only", "second", "--paper-seeds"], "second", "10 seeds")):
        capsys.readouterr()
        assert cli.main([*base, *extra]) == 1
        it = "them" if "," in names else "it"
        assert _errors(capsys) == [f"poolsim.figures: error: {out / 'settings.json'} records {names} made with "
                                   f"40 seeds; this run would replace {it} with {how}: " + tail.format(it)]
        assert _state(out) == before
    assert calls == []
    assert cli.main([*base, "--seeds", "40"]) == 0  # the recorded settings: a rerun, nothing rewritten
    assert _state(out) == before and sorted(calls) == ["first", "second"]
    # nor by one figure of it (summary.md's "Run settings" line would name an --only run: it is kept)
    assert cli.main([*base, "--seeds", "40", "--only", "second"]) == 0
    assert _state(out) == before


def test_overwrite_replaces_on_purpose_and_says_so_quick_results_are_not_protected(tmp_path, fakes, capsys):
    out = tmp_path / "out"
    base = ["--out", str(out), "--format", "png"]
    assert cli.main([*base, "--seeds", "40"]) == 0
    capsys.readouterr()
    assert cli.main([*base, "--seeds", "20", "--only", "second", "--overwrite"]) == 0
    assert "; --overwrite replaced the results of second made with 40 seeds" in capsys.readouterr().err
    assert json.loads((out / "settings.json").read_text()) == {  # the other figure's entry is kept
        "first": {"seeds": 40, "quick": False, "max_K": None}, "second": {"seeds": 20, "quick": False, "max_K": None}}
    assert pd.read_csv(out / "second.csv")["n_seeds"].tolist() == [20]
    # a --quick run's results are a smoke test: a real run replaces them without --overwrite
    smoke = tmp_path / "smoke"
    assert cli.main(["--out", str(smoke), "--format", "png", "--quick"]) == 0
    assert json.loads((smoke / "settings.json").read_text())["first"] == {"seeds": 3, "quick": True, "max_K": None}
    assert cli.main(["--out", str(smoke), "--format", "png", "--seeds", "40"]) == 0
    assert json.loads((smoke / "settings.json").read_text())["first"]["seeds"] == 40


def test_check_notes_that_a_smaller_run_differs_by_design(tmp_path, fakes, capsys):
    out = tmp_path / "out"
    assert cli.main(["--out", str(out), "--format", "png", "--seeds", "40"]) == 0
    before = _state(out)
    capsys.readouterr()
    assert cli.main(["--check", "--out", str(out), "--seeds", "30"]) == 1
    err = capsys.readouterr().err
    assert (f"poolsim.figures --check: note: {out.resolve() / 'settings.json'} records first, second made with "
            f"40 seeds; this run uses 30 seeds, so its numbers differ by design") in err
    assert _state(out) == before


def test_committed_settings_match_the_committed_numbers():
    """figures/settings.json (read, never written here) has an entry for every committed figure, each the
    default run's settings; each CSV's seed count is those seeds, capped by the figure's MAX_SEEDS."""
    from pathlib import Path

    from poolsim.figures import FIGURES, _settings, available, load

    figures = Path(__file__).resolve().parents[1] / "figures"
    recorded = _settings.read(figures)
    made = [n for n in available() if (figures / f"{n}.csv").is_file()]
    assert sorted(recorded) == sorted(made) and set(FIGURES) <= set(made)
    for name in made:
        mod = load(name)
        assert recorded[name] == _settings.of(mod, cli.DEFAULT_SEEDS, False, None), name
        n = pd.read_csv(figures / f"{name}.csv", usecols=["n_seeds"])["n_seeds"].max()
        assert n == min(recorded[name]["seeds"], getattr(mod, "MAX_SEEDS", recorded[name]["seeds"])), name
    assert (figures / "settings.json").read_text() == _settings.render(recorded, available())  # as a run writes it
