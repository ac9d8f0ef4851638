"""Figure ``sensitivity`` (ours): every swept claim's verdict across the set-up parameters the paper
leaves open, under every fair reading of its sentence.

The parameters, their ranges (with the paper-based reasons), the readings and the headline rule
are declared in :mod:`poolsim.figures._claims` (fixed before this sweep first ran; pinned by
``tests/test_claims.py``). Each parameter moves one at a time with the others at the
experiment's defaults, and the pairs of :data:`poolsim.figures._claims.MAPS` move over their full
grid (the verdict maps); a claim's fixed set-up choice (``Claim.setup``: the symmetric layout)
is kept. Every setting is one engine simulation (``poolsim.experiments.simulate``,
the figures' seeds 0..S-1, the experiment's defaults otherwise), decided per reading on paired
per-seed differences (:func:`poolsim.figures._claims.measure`).

Multiplicity: the sweep is one family. ``verdict_holm`` is each test's verdict after Holm's
step-down adjustment over every distinct (claim, reading, setting) of the sweep (family-wise error
5%; p-values from each paired interval, :func:`poolsim._verdict.p_value`); the robustness of a
reading (:func:`poolsim.figures._claims.classify`) and the maps use the Holm-adjusted verdicts.

``sensitivity.csv``: one row per claim x reading x setting -- ``claim_id, claim, reading,
headline, experiment, design`` ("one at a time" / "map X x Y"), ``parameter, value`` (the moved
parameter(s) and value(s)), the full setting (one column per open parameter), ``verdict,
estimate, ci_low, ci_high, n_seeds, threshold, side, compared, p_value, verdict_holm``.
Made only with ``--only sensitivity`` or ``--all`` (about 60 simulations of S seeds).
"""
from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pandas as pd

from .. import _verdict, experiments
from . import _claims, _data

NAME = "sensitivity"
TITLE = "Sensitivity of the verdicts to what the paper leaves open (Holm-adjusted over the sweep)"
EXPERIMENTS = ("asymptotic", "domain_addition", "symmetric")


def settings(experiment: str) -> list[tuple[str, str, str, dict]]:
    """``(design, parameter, value, overrides)`` of every setting swept for ``experiment``:
    one parameter at a time over its declared range, then each map's full grid. ``overrides``
    leave out parameters at their default (so the default setting is the figures' own draw)."""
    rs = {r.parameter: r for r in _claims.ranges(experiment)}
    out = []
    for r in rs.values():
        for v in r.values:
            out.append(("one at a time", r.parameter, f"{v:g}",
                        {} if v == r.default else {r.parameter: v}))
    for exp, x, y in _claims.MAPS:
        if exp != experiment:
            continue
        for vy in rs[y].values:
            for vx in rs[x].values:
                over = {k: v for k, v in ((x, vx), (y, vy)) if v != rs[k].default}
                out.append((f"map {x} x {y}", f"{x} x {y}", f"{vx:g}, {vy:g}", over))
    return out


def _distinct(experiment: str) -> list[dict]:
    seen: dict[tuple, dict] = {}
    for *_, over in settings(experiment):
        seen.setdefault(tuple(sorted(over.items())), over)
    return list(seen.values())


def _setups(experiment: str) -> list[tuple]:
    """The fixed choices (``Claim.setup``, e.g. the symmetric layout) of ``experiment``'s claims."""
    return sorted({c.setup for c in _claims.CLAIMS if c.figure == experiment})


def _jobs() -> list[tuple[str, tuple, dict]]:
    """``(experiment, setup, overrides)`` of every distinct simulation of the sweep."""
    return [(e, st, over) for e in EXPERIMENTS if _claims.ranges(e) for st in _setups(e)
            for over in _distinct(e)]


def _key(experiment: str, setup: tuple, over: dict) -> tuple:
    return experiment, tuple(sorted({**dict(setup), **over}.items()))


def progress_total(seeds: int, quick: bool) -> int:
    """Progress units: seeds x distinct simulations."""
    return _data.n_seeds(seeds, quick) * len(_jobs())


def _eps(experiment: str, S: int, setup: tuple, over: dict, progress):
    """eps ``(S, nK, 3)``, estimate - mu* at the last K ``(S, 3, d)`` and the parameters of one
    setting. The default setting is the figures' memoised draw
    (:func:`poolsim.figures._data.simulation`); the others are simulated directly and only these
    kept, so the sweep's memory does not grow with its settings."""
    if not over:
        res, P = _data.simulation(experiment, seeds=S, progress=progress, **dict(setup))
    else:
        res, P = experiments.simulate(experiment, seeds=S, progress=progress, **dict(setup), **over)
    est = res.estimates[:, -1].astype(float) - np.asarray(P["mu_star"], float)
    return _data.eps(res, P), est, P


def compute(*, seeds: int, quick: bool, progress=None) -> pd.DataFrame:
    S = _data.n_seeds(seeds, quick)
    # two threads: XLA compiles one setting while Python traces the next (results do not depend
    # on the thread: each setting is a pure function of its parameters and seeds)
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {_key(e, st, o): pool.submit(_eps, e, S, st, o, progress) for e, st, o in _jobs()}
        sims = {k: f.result() for k, f in futures.items()}
    open_params = list(dict.fromkeys(r.parameter for r in _claims.RANGES))
    rows = []
    for exp in EXPERIMENTS:
        for design, param, value, over in settings(exp):
            for c in _claims.CLAIMS:
                if c.figure != exp or not _claims.ranges(exp):
                    continue
                e, est, P = sims[_key(exp, c.setup, over)]
                full = {k: (P[k] if k in P else math.nan) for k in open_params}
                for r in c.readings:
                    v = _claims.measure(c.id, r.label, e, P, est)
                    rows.append(dict(claim_id=c.id, claim=c.text, reading=r.label,
                                     headline=r.headline, experiment=exp, design=design,
                                     parameter=param, value=value, **full, verdict=v.verdict,
                                     estimate=v.estimate, ci_low=v.ci_low, ci_high=v.ci_high,
                                     n_seeds=v.n_seeds, threshold=v.threshold, side=v.side,
                                     compared=r.compared))
    df = with_holm(pd.DataFrame(rows))
    df.attrs["params"] = {"seeds": S}
    return _data.set_verdicts(df, [])


def with_holm(df: pd.DataFrame) -> pd.DataFrame:
    """``p_value`` and ``verdict_holm`` (Holm over the distinct tests of the sweep: a setting that
    appears under several designs, e.g. the default, is one test)."""
    df = df.copy()
    df["p_value"] = _verdict.p_value(df["estimate"], df["ci_low"], df["ci_high"], df["n_seeds"],
                                     df["threshold"])
    params = [r.parameter for r in _claims.RANGES]
    key = ["claim_id", "reading", "experiment"] + list(dict.fromkeys(params))
    uniq = df.drop_duplicates(key).reset_index(drop=True)
    uniq["verdict_holm"] = _verdict.adjusted_verdicts(uniq["estimate"], uniq["threshold"],
                                                      uniq["side"], _verdict.holm(uniq["p_value"]))
    merged = df.drop(columns=["verdict_holm"], errors="ignore").merge(
        uniq[key + ["verdict_holm"]], on=key, how="left", validate="many_to_one")
    return merged


def _short(cid: str, reading: str, headline: bool) -> str:
    return f"{cid.split('.', 1)[1]}: {reading}" + (" *" if headline else "")


def plot(df: pd.DataFrame):
    import textwrap

    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    S = int(df["n_seeds"].max())
    code = {o: i for i, o in enumerate(_verdict.OUTCOMES)}
    cmap = ListedColormap([_data.VERDICT_COLOURS[o] for o in _verdict.OUTCOMES])
    rob = _claims.robustness(df)
    changes = df.groupby(["claim_id", "reading"], sort=False)["verdict_holm"].nunique() > 1
    changing = rob[rob.headline.to_numpy() & np.array([bool(changes[(c, r)]) for c, r in zip(rob.claim_id, rob.reading)])]
    maps = [(m, r) for m in _claims.MAPS for r in changing.itertuples()
            if _claims.claim(r.claim_id).figure == m[0]]
    ncol = 4
    nmap_rows = -(-len(maps) // ncol)
    swept = [e for e in EXPERIMENTS if (df.experiment == e).any()]
    nsw = len(swept)
    fig = plt.figure(figsize=(15, 4.5 * nsw + 3.2 * nmap_rows))
    gs = fig.add_gridspec(nsw + nmap_rows, ncol, height_ratios=[3] * nsw + [2.2] * nmap_rows)
    for i, exp in enumerate(swept):
        ax = fig.add_subplot(gs[i, :])
        one = df[(df.experiment == exp) & (df.design == "one at a time")]
        cols = list(dict.fromkeys(zip(one.parameter, one.value)))
        lines = list(dict.fromkeys(zip(one.claim_id, one.reading, one.headline)))
        z = np.full((len(lines), len(cols)), np.nan)
        look = {(r.claim_id, r.reading, r.parameter, r.value): code[r.verdict_holm]
                for r in one.itertuples()}
        for a, (cid, lab, _) in enumerate(lines):
            for b, (p, v) in enumerate(cols):
                z[a, b] = look[(cid, lab, p, v)]
        ax.imshow(z, cmap=cmap, vmin=-0.5, vmax=2.5, aspect="auto", interpolation="nearest")
        ax.set_xticks(range(len(cols)), [f"{p}={v}" for p, v in cols], rotation=60, ha="right",
                      fontsize=7)
        ax.set_yticks(range(len(lines)), [_short(*ln) for ln in lines], fontsize=7.5)
        defaults = {r.parameter: f"{r.default:g}" for r in _claims.ranges(exp)}
        for b, (p, v) in enumerate(cols):
            if defaults[p] == v:
                ax.axvline(b, color="k", lw=0.6, ls=":")
            if b and cols[b - 1][0] != p:
                ax.axvline(b - 0.5, color="white", lw=2)
        ax.set_title(f"{exp}: one open parameter at a time (dotted: the figure's default); "
                     f"* = headline reading", fontsize=9)
    for k, ((exp, x, y), r) in enumerate(maps):
        ax = fig.add_subplot(gs[nsw + k // ncol, k % ncol])
        sub = df[(df.design == f"map {x} x {y}") & (df.claim_id == r.claim_id)
                 & (df.reading == r.reading)]
        xs = list(_claims_range(exp, x).values)
        ys = list(_claims_range(exp, y).values)
        z = np.full((len(ys), len(xs)), np.nan)
        for row in sub.itertuples():
            z[ys.index(getattr(row, y)), xs.index(getattr(row, x))] = code[row.verdict_holm]
        ax.imshow(z, cmap=cmap, vmin=-0.5, vmax=2.5, origin="lower", aspect="auto")
        ax.set_xticks(range(len(xs)), [f"{v:g}" for v in xs], fontsize=7)
        ax.set_yticks(range(len(ys)), [f"{v:g}" for v in ys], fontsize=7)
        ax.scatter([xs.index(_claims_range(exp, x).default)],
                   [ys.index(_claims_range(exp, y).default)], marker="*", s=90,
                   facecolors="none", edgecolors="k")
        ax.set_xlabel(x, fontsize=8)
        ax.set_ylabel(y, fontsize=8)
        ax.set_title(textwrap.fill(_claims.claim(r.claim_id).text, 44) + f"\n({r.reading})",
                     fontsize=7.5)
    handles = [Patch(color=_data.VERDICT_COLOURS[o], label=o) for o in _verdict.OUTCOMES]
    fig.legend(handles=handles, loc="upper right", fontsize=8, ncol=3)
    return _data.finish(
        fig, f"{TITLE}\n{S} seeds per setting; star in a map: the figure's default",
        f"SIMULATED data (poolsim JAX Monte Carlo), {S} seeds per setting, the experiments' "
        f"defaults except the parameter(s) moved. Colour: the verdict after Holm's adjustment over "
        f"all {len(df.drop_duplicates(['claim_id', 'reading', 'experiment'] + [r.parameter for r in _claims.RANGES]))} "
        f"tests of the sweep. Maps: the headline readings whose verdict changes over the sweep. Ranges and "
        f"readings: poolsim/figures/_claims.py.", bottom=0.05)


def _claims_range(exp: str, param: str) -> _claims.Range:
    return next(r for r in _claims.ranges(exp) if r.parameter == param)


def summarize(df: pd.DataFrame) -> str:
    S = int(df["n_seeds"].max())
    rob = _claims.robustness(df)
    default = df[(df.design == "one at a time")]
    lines = [f"## sensitivity -- {TITLE}", "",
             f"{S} seeds per setting (SIMULATED). Each open parameter moves over its declared range "
             f"(poolsim/figures/_claims.py, reasons below) with the others at the experiment's "
             f"defaults, plus the maps {', '.join(f'{x} x {y} ({e})' for e, x, y in _claims.MAPS)}. "
             f"Verdicts after Holm's adjustment over the sweep's "
             f"{len(df.drop_duplicates(['claim_id', 'reading', 'experiment'] + [r.parameter for r in _claims.RANGES]))} "
             f"distinct tests. Headline reading: {_claims.HEADLINE_RULE}", "",
             "| claim | reading | headline | at the default (Holm) | robustness over the declared ranges |",
             "|---|---|---|---|---|"]
    for r in rob.itertuples():
        c = _claims.claim(r.claim_id)
        at = default[(default.claim_id == r.claim_id) & (default.reading == r.reading)]
        d0 = at[at.apply(lambda x: f"{_claims_range(x.experiment, x.parameter).default:g}" == x.value,
                         axis=1)]["verdict_holm"].iloc[0]
        lines.append(f"| {c.figure}: {c.text} | {r.reading} | {'yes' if r.headline else 'no'} | "
                     f"{d0} | {r.robustness} |")
    lines += ["", "Declared ranges (fixed before the sweep ran):", ""]
    lines += [f"- {r.experiment} `{r.parameter}` in {{{', '.join(f'{v:g}' for v in r.values)}}} "
              f"(default {r.default:g}): {r.why}." for r in _claims.RANGES]
    return "\n".join(lines) + "\n"
