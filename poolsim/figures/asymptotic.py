"""Figure ``asymptotic`` (Thm 1, paper figure synthetic_exp_1): eps_K vs K under an asymmetric
D_mu; left the curves with 95% bands and the K -> infinity limits of Thm 1 at fixed tau
(:func:`limits`), right the final eps at the largest K.

The paper's K = 5 ... 50 by default; ``compute(..., max_K=N)`` (the CLI's ``--max-K N``) adds
K = 100, 200, 500, 1000, 2000, 5000, 10000, ... up to N (and N itself), so the approach to the
limit is visible. That run uses the engine's exact sufficient statistics (``materialize=False``:
the same gate on the domain sample means, matching started at the median of the domain means
instead of the sample median) -- drawing 1.5 million samples per seed at K = 10^4 would cost
minutes per hundred seeds -- and the theory limit does not depend on the start (at the default
parameters the iteration reaches the same fixed point from every start on the contamination axis
between -1 and 2).

The limits are theory, not simulation: matching's is the fixed point c* = E[xbar | ||xbar - c*||
< tau] of :func:`poolsim.theory.match_limit` (eps_inf = ||c* - mu*||), pooling's and subsampling's
the mean of :func:`poolsim.theory.pool_limit` (eps_inf = ||E[mu] - mu*|| = p alpha).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .. import _verdict, experiments, theory
from . import _claims, _data

NAME = "asymptotic"
TITLE = "Asymptotic behaviour (Thm 1): eps_K = ||estimate - mu*|| vs K"
SIMULATIONS: list[tuple[str, dict]] = [("asymptotic", {})]
LARGE_KS = (100, 200, 500, 1000, 2000, 5000, 10_000, 20_000, 50_000, 100_000, 200_000, 500_000,
            1_000_000)
"""K values ``max_K`` adds beyond the paper's (those <= max_K, then max_K itself)."""
LIMIT_MARGIN = 0.01
"""Ours: "eps_K is at its limit" means the mean per-seed eps_K - eps_inf lies within +-0.01
(7.5% of matching's eps_inf = 0.133 at the default parameters)."""


def ks_for(max_K: int | None) -> tuple[int, ...]:
    """The K values of a run: the experiment's defaults, plus :data:`LARGE_KS` up to ``max_K`` and
    ``max_K`` itself. ``max_K`` must be an integer >= the largest default K (50)."""
    Ks = tuple(experiments.EXPERIMENTS[NAME].defaults["Ks"])
    if max_K is None:
        return Ks
    if isinstance(max_K, bool) or not isinstance(max_K, (int, np.integer)) or max_K < Ks[-1]:
        raise ValueError(f"max_K must be an integer >= {Ks[-1]} (the paper's largest K), got {max_K!r}")
    return tuple(sorted({*Ks, *(k for k in LARGE_KS if k <= max_K), int(max_K)}))


def limits(P: dict) -> dict:
    """``{strategy: eps_inf}``: Thm 1's K -> infinity limits at the run's parameters (``P``, the
    resolved experiment parameters) -- matching at fixed tau from
    :func:`poolsim.theory.match_limit` (gate on the domain sample means of ``n`` points; 1-D
    numerical integration), pooling and subsampling ``||E[mu] - mu*||`` from
    :func:`poolsim.theory.pool_limit` (subsampling: ``m = ceil(m_frac K) -> infinity``). Empty
    for a user-supplied meta-distribution or a metric other than l2."""
    if P.get("metadist") is not None or P["metric"] != "l2":
        return {}
    _, dist = experiments.resolve(NAME, {k: v for k, v in P.items() if k != "seeds"})
    mu = np.asarray(dist.mu_star, float)
    lim = theory.match_limit(dist, sigma=P["sigma"], tau=P["tau"], N=int(P["n"]),
                             init="mean" if P["init"] == "mean" else "median")
    pool = float(np.linalg.norm(theory.pool_limit(dist, sigma=P["sigma"]).mean - mu))
    return {"pool": pool, "subsample": pool, "match": float(np.linalg.norm(lim.centroid - mu))}


def compute(*, seeds: int, quick: bool, progress=None, max_K: int | None = None) -> pd.DataFrame:
    S = _data.n_seeds(seeds, quick)
    extra = {} if max_K is None else {"Ks": ks_for(max_K), "materialize": False}
    res, P = _data.simulation("asymptotic", seeds=S, progress=progress, **extra)
    e = _data.eps(res, P)
    df = _data.curve_frame(e, P["Ks"], _data.STRATEGIES, panel="eps_vs_K")
    final = df[df.K == P["Ks"][-1]].assign(panel="final")
    lim = limits(P)
    rows = pd.DataFrame([{"panel": "limit", "strategy": s, "mean": v} for s, v in lim.items()])
    out = _data.tidy(pd.concat([df, final, rows], ignore_index=True), P)
    return _data.set_verdicts(out, claims(e, P, lim) + _claims.reading_rows(NAME, e, P))


def claims(e: np.ndarray, P: dict, lim: dict | None = None) -> list[dict]:
    """The paper's claims on ``e: (S, nK, 3)`` (eps per seed, K, strategy), each decided on
    paired per-seed differences; with ``lim`` (:func:`limits`), ours on matching's approach to
    its K -> infinity limit."""
    Ks, j = P["Ks"], {s: i for i, s in enumerate(_data.STRATEGIES)}
    L, K0, K1 = _data.LABELS, Ks[0], Ks[-1]
    fin, drop = e[:, -1], e[:, 0] - e[:, -1]
    others = [s for s in _data.STRATEGIES if s != "match"]
    rows = [
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
    if lim and "match" in lim:
        inf, m = lim["match"], e[:, :, j["match"]]
        note = (f"eps_inf = {inf:.4f}: theory.match_limit (the fixed point c* = E[xbar | ||xbar - c*|| "
                f"< tau] of the K -> inf iteration), not the paper's tau -> 0 limit eps = 0.")
        rows += [
            _data.claim(NAME, f"matching's eps_K approaches its fixed-tau K->inf limit (K={K0} -> {K1})",
                        _verdict.decide(np.abs(m[:, -1] - inf), np.abs(m[:, 0] - inf), side="less"),
                        f"|eps_{K1} - eps_inf| - |eps_{K0} - eps_inf| (matching)", source="ours",
                        note=note),
            _data.claim(NAME, f"matching's eps_K is at its fixed-tau limit at K={K1} "
                              f"(within +-{LIMIT_MARGIN:g}, ours)",
                        _verdict.within(m[:, -1] - inf, margin=LIMIT_MARGIN),
                        f"eps_{K1}(matching) - eps_inf", source="ours", note=note),
        ]
    return rows


def plot(df: pd.DataFrame):
    import matplotlib.pyplot as plt

    P = df.attrs["params"]
    S = int(df["n_seeds"].iloc[0])
    lim = df[df.panel == "limit"].set_index("strategy")["mean"]
    wide = P["Ks"][-1] > 10 * P["Ks"][0]  # a --max-K run: log K axis and the approach panel
    if wide and "match" in lim:
        fig, (a, g, b) = plt.subplots(1, 3, figsize=(15, 4.8), gridspec_kw=dict(width_ratios=(1.6, 1.1, 1)))
        _plot_gap(g, df[(df.panel == "eps_vs_K") & (df.strategy == "match")], lim["match"])
    else:
        fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.6), gridspec_kw=dict(width_ratios=(1.6, 1)))
    _data.plot_curves(a, df[df.panel == "eps_vs_K"])
    if "match" in lim:
        a.axhline(lim["match"], color=_data.COLORS["match"], ls="--", lw=1.1,
                  label=f"matching, K->inf at fixed tau (theory): {lim['match']:.3f}")
    if "pool" in lim:
        a.axhline(lim["pool"], color="0.35", ls=":", lw=1.1,
                  label=f"pooling & subsampling, K->inf (theory): {lim['pool']:.3f}")
    a.set_xlabel("number of domains K")
    a.set_ylabel("eps_K = ||estimate - mu*||_2  (mean, 95% band)")
    if wide:
        a.set_xscale("log")
    else:
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
                      "p and gamma are our choices (the paper gives alpha only). Dashed/dotted lines: "
                      "Thm 1's K -> infinity limits computed by poolsim.theory (not simulated); matching's "
                      "at fixed tau is the fixed point of the gated mean, not mu*."), bottom=0.08)


def gap_slope(cur: pd.DataFrame, inf: float, K_from: int = 100) -> float:
    """Fitted log-log slope of matching's mean ``eps_K - eps_inf`` over ``K >= K_from`` (``cur``:
    the matching rows of panel ``eps_vs_K``; ``np.polyfit`` on the logs); NaN when fewer than two
    such K or a mean gap is not positive."""
    c = cur[cur.K >= K_from]
    gap = c["mean"].to_numpy(float) - inf
    if len(c) < 2 or np.any(gap <= 0):
        return float("nan")
    return float(np.polyfit(np.log10(c.K.to_numpy(float)), np.log10(gap), 1)[0])


def _plot_gap(ax, cur: pd.DataFrame, inf: float) -> None:
    """Matching's approach to its limit: mean ``eps_K - eps_inf`` with its 95% interval, log-log
    where positive."""
    K = cur.K.to_numpy(float)
    m, lo, hi = (cur[c].to_numpy(float) - inf for c in ("mean", "ci_low", "ci_high"))
    pos = m > 0
    ax.errorbar(K[pos], m[pos], yerr=np.vstack([m[pos] - np.maximum(lo[pos], m[pos] * 1e-2),
                                                hi[pos] - m[pos]]),
                fmt="o-", ms=3.5, color=_data.COLORS["match"], capsize=2,
                label="matching: mean eps_K - eps_inf, 95% interval")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("number of domains K")
    ax.set_ylabel("eps_K - eps_inf (matching)")
    ax.set_title(f"approach to the fixed-tau limit: slope {gap_slope(cur, inf):.2f} over K >= 100",
                 fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)


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
    lim = df[df.panel == "limit"].set_index("strategy")["mean"]
    if "match" in lim:
        m = fin.loc["match"]
        inside = m["ci_low"] <= lim["match"] <= m["ci_high"]
        lines += ["", f"Theory (Thm 1, K -> infinity; poolsim.theory, not simulated): matching at fixed "
                      f"tau eps_inf = {lim['match']:.4f} (theory.match_limit), pooling and subsampling "
                      f"||E[mu] - mu*|| = {lim['pool']:.4f} (theory.pool_limit). At K={Ks[-1]} matching's "
                      f"eps is {_data.fmt(m)}: the limit lies {'inside' if inside else 'outside'} its 95% "
                      f"interval."]
        slope = gap_slope(cur.loc["match"].reset_index(), lim["match"])
        if not np.isnan(slope):
            lines[-1] += (f" The mean gap eps_K - eps_inf falls like K^{slope:.2f} over K >= 100 "
                          f"(np.polyfit on the logs of the per-K means).")
    lines += ["", *_data.claim_lines(_data.verdicts_of(df)), ""]
    return "\n".join(lines)
