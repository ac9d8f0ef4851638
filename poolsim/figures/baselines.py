"""Figure ``baselines`` (ours; the paper compares against none of these): the asymptotic and
domain-addition experiments again, with the robust location estimators a statistician would use
instead of matching, computed on the SAME draws (the engine's domain sample means ``xbar``).

Estimators: see :mod:`poolsim.figures._baselines`. Naive pooling and matching are the engine's own
numbers for those draws; the oracle averages the domains the meta-distribution did not make
outliers (ground truth, unavailable in practice).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .. import _verdict
from . import _baselines, _data

NAME = "baselines"
TITLE = "Matching vs robust location estimators on the same draws (ours, not in the paper)"
EXPERIMENTS = ("asymptotic", "domain_addition")
SIMULATIONS: list[tuple[str, dict]] = [(name, {}) for name in EXPERIMENTS]
MAX_SEEDS = 200  # robust estimators on the first 200 seeds (batched over seeds) ...
MCD_SEEDS = 200  # ... sklearn MinCovDet (fitted batched, _mcd.py) on the first 200 of those
# (60 left the domain_addition comparison with MCD undecided)
ENGINE = ("pool", "match")  # engine strategies shown next to the baselines
LABELS = {**{s: _data.LABELS[s] for s in ENGINE}, **_baselines.LABELS}
COLORS = {**{s: _data.COLORS[s] for s in ENGINE}, **_baselines.COLORS}
# Bands only for pooling, matching and the oracle: nine overlapping bands are unreadable; every
# estimator's interval at the final K is in the bar panels and all intervals are in the CSV.
STYLES = {s: dict(label=LABELS[s], color=COLORS[s], ls="-" if s in ENGINE else "--",
                  marker="o" if s in ENGINE else ".", band=s in ENGINE + ("oracle",))
          for s in LABELS}


def compute(*, seeds: int, quick: bool, progress=None) -> pd.DataFrame:
    S = _data.n_seeds(seeds, quick)  # the engine figures' draws (shared simulation) ...
    Sb = min(S, MAX_SEEDS)  # ... of which the first Sb seeds get the robust estimators
    parts, verdicts = [], []
    for name in EXPERIMENTS:
        res, P = _data.simulation(name, seeds=S, progress=progress)
        outlier = _data.labels(name, seeds=S)[:Sb]
        est = _baselines.estimate_all(res.xbar[:Sb], P["Ks"], P["seeds"][:Sb], outlier,
                                      mcd_seeds=MCD_SEEDS)
        idx = [_data.STRATEGIES.index(s) for s in ENGINE]
        eng = np.linalg.norm(res.estimates[:Sb, :, idx].astype(float) - P["mu_star"], axis=-1)
        base = np.stack([np.linalg.norm(est[b] - P["mu_star"], axis=-1) for b in _baselines.LABELS],
                        axis=-1)  # (Sb, nK, n_baselines), NaN where not used
        e = np.concatenate([eng, base], axis=-1)
        df = _data.curve_frame(e, P["Ks"], LABELS, panel="eps_vs_K", experiment=name)
        parts += [df.dropna(subset=["mean"]),
                  df[df.K == P["Ks"][-1]].assign(panel="final").dropna(subset=["mean"])]
        fin = dict(zip(LABELS, np.moveaxis(e[:, -1], -1, 0)))  # name -> (Sb,) eps at the final K
        verdicts.append(_data.all_claim(
            NAME, f"matching's final error is below every robust baseline's (`{name}`, "
                  f"K={P['Ks'][-1]})", {
                f"eps({LABELS[b]}) - eps(matching)": _verdict.decide(fin[b], fin["match"])
                for b in _baselines.LABELS if b != "oracle"},
            source="ours", note="The paper compares against no robust estimator."
            + (f" MCD on the first {MCD_SEEDS} seeds only (cost)." if MCD_SEEDS < Sb else "")))
    out = _data.tidy(pd.concat(parts, ignore_index=True),
                     {name: _data.simulation(name, seeds=S)[1] for name in EXPERIMENTS})
    return _data.set_verdicts(out, verdicts)


def plot(df: pd.DataFrame):
    import matplotlib.pyplot as plt

    Ps = df.attrs["params"]
    S = int(df["n_seeds"].iloc[0])
    fig, axes = plt.subplots(2, 2, figsize=(13, 9.5))
    desc = {"asymptotic": "asymptotic (Thm 1): contaminated D_mu, alpha={alpha}, p={p}, n={n}, "
                          "tau={tau}",
            "domain_addition": "domain addition (Thm 3): every {every}rd domain at radius "
                               "{radius}, n={n}, tau={tau}"}
    for col, name in enumerate(EXPERIMENTS):
        P = Ps[name]
        d = df[df.experiment == name]
        a, b = axes[0, col], axes[1, col]
        _data.plot_curves(a, d[d.panel == "eps_vs_K"], STYLES)
        a.set_xlabel("number of domains K")
        a.set_ylabel("eps_K (mean, 95% band)")
        a.grid(alpha=0.3)
        a.set_title(desc[name].format(**P), fontsize=9)
        if col == 0:
            a.legend(fontsize=7, ncol=2)
        _data.plot_bars(b, d[d.panel == "final"].reset_index(drop=True), LABELS, COLORS)
        b.set_ylabel(f"eps at K={P['Ks'][-1]}")
        b.grid(alpha=0.3, axis="y")
    note = ("Robust baselines: coordinate-wise median; scipy.stats.trim_mean (20% per side); "
            "geometric median (Weiszfeld); multivariate Huber M-estimator (threshold chi_d 90% "
            "quantile x MAD-type scale); sklearn MinCovDet location at the final K only (needs "
            "K >= 10d); median of ceil(sqrt K) block means (geometric median). Oracle uses the true "
            "outlier labels.")
    title = (f"{TITLE}\nestimators applied to the domain sample means of the same simulated "
             f"draws, {S} seeds")
    return _data.finish(fig, title, _data.caption(Ps["asymptotic"], S, [], note))


def summarize(df: pd.DataFrame) -> str:
    S = int(df[df.strategy == "match"]["n_seeds"].iloc[0])
    lines = [f"## baselines -- {TITLE}", "",
             "| estimator | "
             + " | ".join(f"{n}: eps at final K [95% CI]" for n in EXPERIMENTS) + " |",
             "|---|" + "---|" * len(EXPERIMENTS)]
    fin = {n: df[(df.panel == "final") & (df.experiment == n)].set_index("strategy")
           for n in EXPERIMENTS}
    for s in LABELS:
        lines.append(f"| {LABELS[s]} | " + " | ".join(
            _data.fmt(fin[n].loc[s]) if s in fin[n].index else "n/a" for n in EXPERIMENTS) + " |")
    lines += ["", f"Final K: asymptotic K={int(fin['asymptotic'].K.iloc[0])}, domain_addition "
                  f"K={int(fin['domain_addition'].K.iloc[0])}; the first {S} seeds of the engine "
                  f"figures' draws (MCD: {int(fin['asymptotic']['n_seeds'].get('mcd', 0))}).", "",
              *_data.claim_lines(_data.verdicts_of(df)), ""]
    return "\n".join(lines)
