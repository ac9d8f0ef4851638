"""Figure ``asymptotic`` (Thm 1, paper figure synthetic_exp_1): eps_K vs K under an asymmetric
D_mu; left the curves with 95% bands, right the final eps at K = 50."""
from __future__ import annotations

import numpy as np
import pandas as pd

from .. import _verdict
from . import _claims, _data

NAME = "asymptotic"
TITLE = "Asymptotic behaviour (Thm 1): eps_K = ||estimate - mu*|| vs K"
SIMULATIONS: list[tuple[str, dict]] = [("asymptotic", {})]


def compute(*, seeds: int, quick: bool, progress=None) -> pd.DataFrame:
    S = _data.n_seeds(seeds, quick)
    res, P = _data.simulation("asymptotic", seeds=S, progress=progress)
    e = _data.eps(res, P)
    df = _data.curve_frame(e, P["Ks"], _data.STRATEGIES, panel="eps_vs_K")
    final = df[df.K == P["Ks"][-1]].assign(panel="final")
    out = _data.tidy(pd.concat([df, final], ignore_index=True), P)
    return _data.set_verdicts(out, claims(e, P) + _claims.reading_rows(NAME, e, P))


def claims(e: np.ndarray, P: dict) -> list[dict]:
    """The paper's claims on ``e: (S, nK, 3)`` (eps per seed, K, strategy), each decided on
    paired per-seed differences."""
    Ks, j = P["Ks"], {s: i for i, s in enumerate(_data.STRATEGIES)}
    L, K0, K1 = _data.LABELS, Ks[0], Ks[-1]
    fin, drop = e[:, -1], e[:, 0] - e[:, -1]
    others = [s for s in _data.STRATEGIES if s != "match"]
    return [
        _data.all_claim(NAME, f"matching's eps_K is the lowest at K={K1}", {
            f"eps({L[s]}) - eps(matching) at K={K1}": _verdict.decide(fin[:, j[s]], fin[:, j["match"]])
            for s in others}),
        _data.all_claim(NAME, f"matching's eps_K decreases fastest (K={K0} -> {K1})", {
            f"decrease(matching) - decrease({L[s]}), decrease = eps_{K0} - eps_{K1}":
                _verdict.decide(drop[:, j["match"]], drop[:, j[s]]) for s in others}),
        _data.all_claim(NAME, f"subsampling suffers the largest errors (Sec. 5; at K={K1})", {
            f"eps(uniform subsampling) - eps({L[s]}) at K={K1}":
                _verdict.decide(fin[:, j["subsample"]], fin[:, j[s]])
            for s in _data.STRATEGIES if s != "subsample"}),
    ]


def plot(df: pd.DataFrame):
    import matplotlib.pyplot as plt

    P = df.attrs["params"]
    S = int(df["n_seeds"].iloc[0])
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.6), gridspec_kw=dict(width_ratios=(1.6, 1)))
    _data.plot_curves(a, df[df.panel == "eps_vs_K"])
    a.set_xlabel("number of domains K")
    a.set_ylabel("eps_K = ||estimate - mu*||_2  (mean, 95% band)")
    a.set_xticks(P["Ks"])
    a.grid(alpha=0.3)
    a.legend(fontsize=8)
    _data.plot_bars(b, df[df.panel == "final"])
    b.set_ylabel(f"eps at K={P['Ks'][-1]}")
    b.set_title(f"final error, K={P['Ks'][-1]}", fontsize=9)
    b.grid(alpha=0.3, axis="y")
    return _data.finish(
        fig, f"{TITLE}\nasymmetric D_mu, n={P['n']}, tau={P['tau']}, alpha={P['alpha']}, {S} seeds",
        _data.caption(P, S, ["n", "tau", "alpha", "p", "gamma"],
                      "p and gamma are our choices (the paper gives alpha only)."), bottom=0.07)


def summarize(df: pd.DataFrame) -> str:
    P = df.attrs["params"]
    Ks = P["Ks"]
    cur = df[df.panel == "eps_vs_K"].set_index(["strategy", "K"])
    fin = df[df.panel == "final"].set_index("strategy")
    lines = [f"## asymptotic -- {TITLE}", "",
             f"| strategy | eps at K={Ks[0]} [95% CI] | eps at K={Ks[-1]} [95% CI] |",
             "|---|---|---|"]
    for s in _data.STRATEGIES:
        lines.append(f"| {_data.LABELS[s]} | {_data.fmt(cur.loc[(s, Ks[0])])} | "
                     f"{_data.fmt(fin.loc[s])} |")
    lines += ["", *_data.claim_lines(_data.verdicts_of(df)), ""]
    return "\n".join(lines)
