"""Figure ``synthetic_intro``: the asymmetric set-up -- domain means scattered around a biased
direction, target mu* = 0 marked (paper, Appendix figure "synthetic_intro").

Uses the asymptotic experiment's draws at K = 50 (shared with ``asymptotic`` and ``baselines``).
"""
from __future__ import annotations

import pandas as pd

from .. import _verdict
from . import _data

NAME = "synthetic_intro"
TITLE = "Asymmetric setting: domain means around a biased direction"
EXPERIMENT = "asymptotic"
SIMULATIONS: list[tuple[str, dict]] = [(EXPERIMENT, {})]


def compute(*, seeds: int, quick: bool, progress=None) -> pd.DataFrame:
    S = _data.n_seeds(seeds, quick)
    res, P = _data.simulation(EXPERIMENT, seeds=S, progress=progress)
    outlier = _data.labels(EXPERIMENT, seeds=S)
    K = P["Ks"][-1]
    means = res.means[:, :K].astype(float)
    rows = [dict(panel="domain_means", seed=int(P["seeds"][0]), domain=k + 1, x=means[0, k, 0],
                 y=means[0, k, 1], shifted=bool(outlier[0, k]), K=K, n_seeds=1)
            for k in range(K)]
    centre = means.mean(axis=1)  # (S, d): average of the K means, per seed
    rows += [dict(panel="seed_average", seed=int(s), x=c[0], y=c[1], K=K, n_seeds=1)
             for s, c in zip(P["seeds"], centre)]
    rows += [_data.interval_rows(centre[:, j], panel="average_of_means", coord=j, K=K)
             for j in range(P["d"])]
    rows.append(dict(panel="expected_mean", x=P["p"] * P["alpha"], y=0.0, K=K, n_seeds=S))
    v = _verdict.decide(centre[:, 0], threshold=0.0)
    return _data.set_verdicts(_data.tidy(pd.DataFrame(rows), P), [_data.claim(
        NAME, "domain means concentrate along a biased direction, away from mu* = 0", v,
        f"coordinate 1 of the average of the K={K} domain means",
        note="True by construction (the simulated D_mu shifts a share p of the means by alpha "
             "along e1): an illustration of the set-up, not evidence for the paper.")])


def plot(df: pd.DataFrame):
    import matplotlib.pyplot as plt

    P = df.attrs["params"]
    pts = df[df.panel == "domain_means"]
    avg = df[df.panel == "seed_average"]
    exp = df[df.panel == "expected_mean"].iloc[0]
    S = int(df[df.panel == "average_of_means"]["n_seeds"].iloc[0])
    fig, ax = plt.subplots(figsize=(10, 6))
    sh = pts["shifted"].astype(bool)
    ax.scatter(pts.x[~sh], pts.y[~sh], s=28, c="tab:blue", alpha=0.8,
               label=f"domain mean, unshifted (seed {int(pts.seed.iloc[0])})")
    ax.scatter(pts.x[sh], pts.y[sh], s=28, c="tab:orange", alpha=0.9,
               label=f"domain mean, shifted by alpha e1 (seed {int(pts.seed.iloc[0])})")
    ax.scatter(avg.x, avg.y, marker="x", s=30, c="0.3", label=f"average of the {int(pts.K.iloc[0])} "
               f"means, each of {S} seeds")
    ax.scatter([exp.x], [exp.y], marker="P", s=120, c="black", label="E[mu_k] = p alpha e1")
    _data.mark_target(ax)
    ax.annotate("", xy=(P["alpha"], 0), xytext=(0, 0),
                arrowprops=dict(arrowstyle="->", color="tab:orange", lw=1.5))
    ax.set_aspect("equal")
    ax.set_xlabel("coordinate 1 (biased direction e1)")
    ax.set_ylabel("coordinate 2")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7.5, loc="upper left", bbox_to_anchor=(1.02, 1))
    return _data.finish(
        fig, f"{TITLE}\nK={P['Ks'][-1]}, alpha={P['alpha']}, p={P['p']} (ours), "
             f"gamma={P['gamma']} (ours), {S} seeds",
        _data.caption(P, S, ["alpha", "p", "gamma"], "Asymmetric D_mu: mu_k = gamma z_k + B_k alpha "
                      "e1, B_k ~ Bernoulli(p)."), bottom=0.07)


def summarize(df: pd.DataFrame) -> str:
    P = df.attrs["params"]
    avg = df[df.panel == "average_of_means"].set_index("coord")
    e1, e2 = avg.loc[0], avg.loc[1]
    return "\n".join([
        f"## synthetic_intro -- {TITLE}",
        "",
        "| quantity | mean [95% CI] over seeds | expected |",
        "|---|---|---|",
        f"| average of the K={P['Ks'][-1]} domain means, coordinate 1 | {_data.fmt(e1)} | "
        f"p alpha = {P['p'] * P['alpha']:.3f} |",
        f"| average of the K={P['Ks'][-1]} domain means, coordinate 2 | {_data.fmt(e2)} | 0 |",
        "",
        *_data.claim_lines(_data.verdicts_of(df)),
        "",
    ])
