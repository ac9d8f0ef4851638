"""``python -m adsim figures --from RUN --out DIR``: the anomaly-detection figures and table of a protocol run.

* ``ad_final.png`` -- AUC after each added domain (hardest order) per target/task, naive, BiLoRA (the
  continual-learning baseline) and the paper's method, mean over seeds with the min-max band; DA of this
  run and the paper's DA in the legend.
* ``ad_ablation.png`` -- the same for the matching metrics (l2, cosine, geodesic, geodesic + VACA).
* ``ad_modality_gap.png`` -- Table-4-style similarities: paper (real BMAD) beside this run (measured).
* ``ad_variance.png`` -- per-channel class vs modality variance of the final VACA head, before/after VACA.
* ``ad_sensitivity.png``, ``sensitivity.md`` -- with ``--sweep``: mean DA per method and the paired DA
  difference (matching + VACA minus naive) against each swept simulator parameter, 95% t-intervals.
* ``ad_table.md`` -- final AUC and DA per target x task x method (mean +- sd over seeds), the paper's
  numbers in separate columns, and the paper's claims next to what this run shows.

Paper numbers (``adsim.data.reference``) are always labelled "paper, real BMAD" and never mixed into a column
of this run's numbers, which are labelled "this run, simulated" or "this run, real".
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from scipy import stats

from adsim.data import (
    reference,  # noqa: E402
    sim,
)
from adsim.data.domains import DOMAINS  # noqa: E402
from adsim.experiments.protocol import METHODS  # noqa: E402
from adsim.runtime.io import read_json
from poolsim import verdict  # noqa: E402  (the one verdict rule for every claim line)
from poolsim.io import atomic_write  # noqa: E402

FINAL = ("naive", "match-geodesic-vaca")
FIGURE_FINAL = ("naive", "bilora", "match-geodesic-vaca")  # the paper's Fig. "final" (MVFA, BiLoRA, ours)
ABLATION = ("match-l2", "match-cosine", "match-geodesic", "match-geodesic-vaca")
COLORS = dict(zip(METHODS, ("tab:gray", "tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")))
STYLES = dict(zip(METHODS, ("-", "--", ":", "-.", "-", "--")))


def _label(df) -> str:
    return f"this run, {df['data'].iloc[0]}"


def _curves(proto, da, methods, title, order="hardest"):
    sel = proto[(proto["order"] == order) & proto["method"].isin(methods)]
    metr = [m for m in ("match-l2", "match-cosine", "match-geodesic") if m in methods]
    if len(metr) > 1:
        w = sel[sel["method"].isin(metr)].pivot_table(index=["target", "task", "seed", "step"], columns="method",
                                                      values="auc")
        if float((w.max(axis=1) - w.min(axis=1)).max()) == 0.0:
            title += f" ({', '.join(metr)}: identical AUCs, so their curves coincide)"
    panels = sorted({(t, k) for t, k in zip(sel["target"], sel["task"])},
                    key=lambda p: (DOMAINS.index(p[0]), p[1]))
    if not panels:
        raise ValueError(f"the run has no cells with order {order!r} for methods {list(methods)}")
    ncol = min(3, len(panels))
    nrow = -(-len(panels) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(5.2 * ncol, 3.6 * nrow), squeeze=False)
    n_seeds = sel["seed"].nunique()
    for ax, (t, k) in zip(axes.flat, panels):
        for m in methods:
            g = sel[(sel["target"] == t) & (sel["task"] == k) & (sel["method"] == m)]
            if g.empty:
                continue
            s = g.groupby("step")["auc"].agg(["mean", "min", "max"])
            d = da[(da["target"] == t) & (da["task"] == k) & (da["method"] == m) & (da["order"] == order)]["da"]
            paper = reference.paper_da(m, t, k)
            lab = f"{m}: DA {_pm(d)}"
            lab += f" | paper DA {paper:.4g}" if paper is not None else " | paper DA n/a"
            ax.plot(s.index, s["mean"], STYLES[m], color=COLORS[m], marker="o", ms=3, label=lab)
            ax.fill_between(s.index, s["min"], s["max"], color=COLORS[m], alpha=0.12)
        ax.set_title(f"{t} {k}", fontsize=10)
        ax.set_xlabel("number of training domains added")
        ax.set_ylabel(f"{'image' if k == 'AC' else 'pixel'} AUC (%)")
        ax.set_xticks(sorted(sel["step"].unique()))
        ax.legend(fontsize=6.5, loc="lower right")
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(f"{title} -- {_label(sel)} ({order} order, {sel['mode'].iloc[0]}, {n_seeds} seed(s); "
                 "band = min-max over seeds).\nLegend: DA this run (mean±sd) | paper DA (real BMAD, "
                 "figure captions; n/a = not stated)", fontsize=9)
    fig.tight_layout()
    return fig


def fig_modality_gap(sim_df, kind: str):
    names = list(reference.TABLE4_ORDER)
    measured = sim_df.groupby(["domain_a", "domain_b"])["cosine"].mean().unstack()
    avail = [d for d in names if d in measured.index]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.8))
    short = {"Retina_OCT2017": "OCT17", "Retina_RESC": "RESC", "Histopathology": "HIS"}
    for ax, (mat, lab, order) in zip(axes, (
            (reference.TABLE4, "paper, real BMAD (Table 4)", names),
            (measured.loc[avail, avail].to_numpy(), f"this run, {kind} (measured, mean over "
                                                    f"{sim_df['seed'].nunique()} seed(s))", avail))):
        im = ax.imshow(mat, vmin=0, vmax=1, cmap="viridis")
        ticks = [short.get(d, d) for d in order]
        ax.set_xticks(range(len(order)), ticks, rotation=45, ha="right")
        ax.set_yticks(range(len(order)), ticks)
        for i in range(len(order)):
            for j in range(len(order)):
                ax.text(j, i, f"{mat[i, j]:.2f}", ha="center", va="center", fontsize=7,
                        color="white" if mat[i, j] < 0.5 else "black")
        ax.set_title(lab, fontsize=9)
    fig.colorbar(im, ax=axes, shrink=0.8, label="mean pairwise cosine of image features")
    fig.suptitle("Modality gap: Table-4-style similarities (diagonal = intra-modality spread)", fontsize=10)
    return fig


def fig_variance(var, target: str = "Retina_OCT2017"):
    if target not in set(var["target"]):
        target = var["target"].iloc[0]
    v = var[(var["target"] == target) & (var["order"] == var["order"].iloc[0])]
    m = v.groupby("channel")[["class_before", "modality_before", "class_after", "modality_after"]].mean()
    order = m["class_before"].sort_values(ascending=False).index
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
    x = np.arange(len(order))
    for ax, which in zip(axes, ("before", "after")):
        c, mo = m.loc[order, f"class_{which}"], m.loc[order, f"modality_{which}"]
        ax.bar(x - 0.2, c, 0.4, label="class-discriminative variance", color="tab:red")
        ax.bar(x + 0.2, mo, 0.4, label="modality variance", color="tab:blue")
        ax.set_title(f"{which} VACA: sum class {c.sum():.3g}, sum modality {mo.sum():.3g} "
                     f"(ratio {c.sum() / mo.sum():.2f})", fontsize=9)
        ax.set_xlabel("channel rank (by class variance before VACA)")
        ax.set_yscale("log")
    axes[0].set_ylabel("variance")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Per-channel variance, final match-geodesic-vaca head, target {target} -- {_label(v)} "
                 f"({v['seed'].nunique()} seed(s), every modality's test split)", fontsize=9)
    fig.tight_layout()
    return fig


def _sweep_values(sw, p) -> list:
    return sorted(dict.fromkeys(sw.loc[sw["param"] == p, "value"].astype(float)))


def sensitivity_rows(sw) -> list:
    """Per swept (param, value): mean DA of each method and the paired difference matching + VACA minus
    naive pooling over (target, task, seed), each with its 95% t-interval (``poolsim.verdict``)."""
    rows = []
    for p in dict.fromkeys(sw["param"]):
        for v in _sweep_values(sw, p):
            g = sw[(sw["param"] == p) & (sw["value"].astype(float) == v)]
            row = {"param": p, "value": v, "default": g["default"].iloc[0]}
            for m in (m for m in FINAL if m in set(g["method"])):
                row[m] = verdict.decide(g[g["method"] == m]["da"], threshold=4.0)
            if set(FINAL) <= set(g["method"]):
                row["diff"] = verdict.decide(*_paired(g, *FINAL[::-1]))
            rows.append(row)
    return rows


def _ci(v) -> tuple:
    """``(estimate, lower error, upper error)`` for an errorbar (zero bars without an interval)."""
    if np.isnan(v.ci_low):
        return v.estimate, 0.0, 0.0
    return v.estimate, v.estimate - v.ci_low, v.ci_high - v.estimate


def fig_sensitivity(sw):
    """Top: mean DA per method; bottom: paired DA difference matching + VACA minus naive; 95% t-intervals.
    Values are categorical on the x axis (``inf`` is a value of ``align_concentration``)."""
    rows = sensitivity_rows(sw)
    params = list(dict.fromkeys(r["param"] for r in rows))
    fig, axes = plt.subplots(2, len(params), figsize=(4.0 * len(params), 6.4), squeeze=False)
    for j, p in enumerate(params):
        rs = [r for r in rows if r["param"] == p]
        x = np.arange(len(rs))
        for k, m in enumerate(m for m in FINAL if m in rs[0]):
            e = np.array([_ci(r[m]) for r in rs])
            axes[0, j].errorbar(x + (k - 0.5) * 0.12, e[:, 0], yerr=e[:, 1:].T, fmt="o" + STYLES[m],
                                color=COLORS[m], capsize=3, label=m)
        if "diff" in rs[0]:
            e = np.array([_ci(r["diff"]) for r in rs])
            axes[1, j].errorbar(x, e[:, 0], yerr=e[:, 1:].T, fmt="o", color="k", capsize=3)
            axes[1, j].axhline(0, color="0.6", lw=0.8)
        for i, lab in enumerate(("mean DA (Eq. 15)", "DA: matching + VACA - naive")):
            axes[i, j].set_ylabel(lab)
            axes[i, j].set_xticks(x, [f"{r['value']:g}" for r in rs])
            axes[i, j].set_xlabel(f"{p} (default {rs[0]['default']})")
        axes[0, j].axhline(4, color="0.6", lw=0.8, ls=":")
        axes[0, j].legend(fontsize=7)
    fig.suptitle(f"Sensitivity of the SIMULATED protocol (this run, simulated; hardest order; 6 targets, all "
                 f"tasks, {sw['seed'].nunique()} seed(s); bars: 95% t-intervals over (target, task, seed), "
                 f"none below {verdict.MIN_SEEDS} pairs)", fontsize=8)
    fig.tight_layout()
    return fig


def sensitivity_md(sw) -> str:
    """``sensitivity.md``: the rows of :func:`sensitivity_rows` as a table (this run, simulated)."""
    lines = ["# Sensitivity of the simulated protocol (this run, SIMULATED)", "",
             f"`python -m adsim sweep`: one simulator parameter changed at a time (adsim.data.sim.SWEEP), hardest "
             f"order, {sw['seed'].nunique()} seed(s), every target and task; the other parameters at their "
             "defaults. Each cell: mean, 95% Student-t interval over (target, task, seed), pairs, verdict "
             "(poolsim.verdict). DA columns test DA >= 4; the last column tests matching + VACA > naive.", "",
             "| parameter | value | naive DA | matching + VACA DA | matching + VACA - naive |", "|---|---|---|---|---|"]
    for r in sensitivity_rows(sw):
        cells = [verdict.describe(r[k]) if k in r else "-" for k in (*FINAL, "diff")]
        mark = " (default)" if float(r["default"]) == r["value"] else ""
        lines.append(f"| {r['param']} | {r['value']:g}{mark} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _pm(s) -> str:
    return f"{s.mean():.2f} ± {s.std(ddof=1):.2f}" if len(s) > 1 else f"{s.mean():.2f}"


def _paired(da, a: str, b: str, value: str = "da"):
    keys = ["target", "task", "order", "mode", "seed"]
    pair = da[da["method"] == a].merge(da[da["method"] == b], on=keys, suffixes=("_a", "_b"))
    return pair[f"{value}_a"].to_numpy(), pair[f"{value}_b"].to_numpy()


def claims(proto, da, shared=None) -> list:
    """The paper's comparative claims decided on this run: ``[{"claim", "verdict", "text"}]``.
    ``shared``: ``{method: method it copies}`` from ``protocol.json`` (metrics proven identical)."""
    shared = shared or {}
    methods = set(da["method"])
    out = []

    def add(claim, v, extra=""):
        out.append({"claim": claim, "verdict": v.verdict, "estimate": v.estimate, "ci_low": v.ci_low,
                    "ci_high": v.ci_high, "n": v.n_seeds, "text": verdict.describe(v) + extra})

    if "match-geodesic-vaca" in methods:
        d = da[da["method"] == "match-geodesic-vaca"]["da"]
        base = ""
        if "naive" in methods:
            nv = verdict.decide(da[da["method"] == "naive"]["da"], threshold=4.0)
            base = f"; naive pooling against the same threshold: {verdict.describe(nv)}"
        add("Paper: geodesic matching + VACA has DA ≥ 4 (mean DA over cells, threshold 4).",
            verdict.decide(d, threshold=4.0),
            base)
    for a, b, what in (("match-geodesic-vaca", "naive", "matching + VACA has higher DA than naive pooling"),
                       ("match-geodesic", "naive", "geodesic matching (no VACA) has higher DA than naive pooling"),
                       ("match-geodesic-vaca", "match-geodesic", "VACA raises the DA of geodesic matching"),
                       ("match-geodesic", "match-l2", "geodesic matching has higher DA than l2 matching"),
                       ("match-geodesic", "match-cosine", "geodesic matching has higher DA than cosine matching"),
                       ("match-geodesic-vaca", "bilora",
                        "matching + VACA has higher DA than BiLoRA (continual learning, one domain per step)"),
                       ("bilora", "naive", "BiLoRA has higher DA than naive pooling (MVFA)")):
        if not {a, b} <= methods:
            continue
        if shared.get(b) == a or shared.get(a) == b or (shared.get(a) and shared.get(a) == shared.get(b)):
            out.append({"claim": f"Paper: {what}.", "verdict": "identical by construction", "estimate": 0.0,
                        "ci_low": float("nan"), "ci_high": float("nan"), "n": 0,
                        "text": "identical by construction under this recipe (adaptive gate on unit features "
                                "and geodesic losses: one result computed once, see protocol.json "
                                "metric_equivalence) -> **not testable**"})
            continue
        add(f"Paper: {what}.", verdict.decide(*_paired(da, a, b)))
    return out


def vaca_report(gains, var=None) -> list:
    """Markdown lines: channel-gain spread and its correlation with Delta per task, and the class /
    modality variance ratio before and after VACA (``variance.csv``). A gain spread near 1 = inert."""
    lines = ["| task | heads | gain max/min (median, range) | gain sd (median) | corr(gain, Delta) (mean ± sd) |",
             "|---|---|---|---|---|"]
    for task, g in gains.groupby("task"):
        c = g["corr_w_delta"].dropna()
        lines.append(f"| {task} | {len(g)} | {g['w_ratio'].median():.3f} ({g['w_ratio'].min():.3f}-"
                     f"{g['w_ratio'].max():.3f}) | {g['w_sd'].median():.3g} | "
                     f"{c.mean():+.2f} ± {c.std(ddof=1) if len(c) > 1 else float('nan'):.2f} |")
    if var is not None and len(var):
        keys = ["target", "method", "order", "mode", "seed"]
        s = var.groupby(keys)[["class_before", "modality_before", "class_after", "modality_after"]].sum()
        before, after = s["class_before"] / s["modality_before"], s["class_after"] / s["modality_after"]
        v = verdict.decide(after.to_numpy(), before.to_numpy(), threshold=0.0)
        lines += ["", f"Class / modality variance ratio of the last layer's det features over every modality's "
                      f"test split: before VACA {before.mean():.3g}, after {after.mean():.3g} (mean over "
                      f"{len(s)} heads); paired change after - before {verdict.describe(v)}."]
    return lines


def table_md(proto, da, shared=None, gains=None, var=None, recipe: dict | None = None) -> str:
    kind = _label(proto)
    order = "hardest" if (da["order"] == "hardest").any() else da["order"].iloc[0]
    hard = da[da["order"] == order]
    last_all = proto[proto["step"] == proto["step"].max()]
    last = last_all[last_all["order"] == order]
    lines = [f"# Anomaly detection: domain-addition protocol ({kind})", "",
             f"Final AUC = AUC after the last added domain, DA = Eq. 15 on the AUC after each step; both for "
             f"the {order} order, {proto['mode'].iloc[0]} mode; mean ± sd over "
             f"{proto['seed'].nunique()} seed(s). Columns \"paper, real BMAD\": Table 1 "
             "(row MVFA-AD* for naive, BiLORA* for bilora, Ours for match-geodesic-vaca) and the DA values stated in the captions "
             "of Fig. final / Fig. ablation; '-' = not reported. They are NOT comparable numbers: the paper "
             "ran real BMAD images through ViT-L-14-336; this run's data are described by its label.", "",
             *([f"Recipe: `{recipe.get('name')}` (docs/recipes.md) with gate_mode `{recipe.get('gate_mode')}`, "
                f"gate_unit `{recipe.get('gate_unit')}`, gate_filter `{recipe.get('gate_filter')}`, loss_metric "
                f"`{recipe.get('loss_metric')}`; full record in protocol.json.", ""] if recipe else []),
             f"| target | task | method | final AUC ({kind}) | DA ({kind}) | DA ≥ 4 ({kind}) "
             "| AUC (paper, real BMAD) | DA (paper, real BMAD) |", "|---|---|---|---|---|---|---|---|"]
    for (t, k), _ in sorted(last.groupby(["target", "task"]), key=lambda x: (DOMAINS.index(x[0][0]), x[0][1])):
        for m in [m for m in METHODS if m in set(last["method"])]:
            a = last[(last["target"] == t) & (last["task"] == k) & (last["method"] == m)]["auc"]
            d = hard[(hard["target"] == t) & (hard["task"] == k) & (hard["method"] == m)]["da"]
            pa, pd_ = reference.paper_auc(m, t, k), reference.paper_da(m, t, k)
            lines.append(f"| {t} | {k} | {m} | {_pm(a)} | {_pm(d)} | {(d >= 4).sum()}/{len(d)} | "
                         f"{'-' if pa is None else f'{pa:.2f}'} | {'-' if pd_ is None else f'{pd_:.4g}'} |")
    lines += ["", "## Paper claims next to this run", "",
              "Decided on paired differences (same target, task, order, mode, seed) with a 95% Student-t "
              f"interval (poolsim.verdict; fewer than {verdict.MIN_SEEDS} pairs or an interval containing the "
              "threshold -> inconclusive).", ""]
    lines += [f"- {c['claim']} This run: {c['text']}" for c in claims(proto, hard, shared)]
    if "bilora" in set(proto["method"]):
        lines.append("- bilora trains one domain per step on the previous step's head (BiLoRA updates, earlier "
                     "domains' frozen) in either mode; its cells carry the run's mode only to pair with the others.")
    if da["order"].nunique() > 1:
        by = da.groupby(["method", "order"])["da"].mean().unstack()
        lines.append("- Paper: the reverse order (farthest domain first) is the easiest, the hardest order the most "
                     "likely to deteriorate. This run, mean DA by order: "
                     + "; ".join(f"{m}: " + ", ".join(f"{o} {v:.2f}" for o, v in by.loc[m].items())
                                 for m in by.index) + ".")
    if proto["order"].nunique() > 1:
        fa = last_all.groupby(["target", "task", "method", "seed"])["auc"].agg(lambda s: s.max() - s.min())
        seq = fa[fa.index.get_level_values("method") == "bilora"]  # one domain per step in either mode
        fa = fa[fa.index.get_level_values("method") != "bilora"]
        if len(fa):
            lines.append(f"- Paper: final performance differs by at most ±1.06 AUC across orders (exchangeability). "
                         f"This run: largest final-AUC range across orders {fa.max():.3g} "
                         f"({proto['mode'].iloc[0]} mode"
                         + ("; cumulative training pools the same set in a canonical order, so equality is exact "
                            "by construction)" if proto["mode"].iloc[0] == "cumulative" else ")") + ".")
        if len(seq):
            lines.append(f"- bilora (sequential by definition): largest final-AUC range across orders {seq.max():.3g}.")
    if gains is not None and len(gains):
        lines += ["", "## VACA's measured effect (final match-geodesic-vaca heads)", "", *vaca_report(gains, var)]
    return "\n".join(lines) + "\n"


def _extras(src: Path) -> tuple:
    """``(shared methods, vaca_gains table or None, variance table or None)`` of a protocol folder."""
    shared: dict = {}  # as protocol.json records it
    if (src / "protocol.json").is_file():
        eq = read_json(src / "protocol.json").get("metric_equivalence") or {}
        shared = eq.get("copies") or eq.get("shared_with") or {}
    gains = pd.read_csv(src / "vaca_gains.csv") if (src / "vaca_gains.csv").is_file() else None
    var = pd.read_csv(src / "variance.csv") if (src / "variance.csv").is_file() else None
    return shared, gains, var


def recipes_summary(runs: dict) -> str:
    """One markdown table of every claim under every recipe: ``runs = {recipe name: protocol folder}``."""
    lines = ["# The paper's claims under each recipe (this run, simulated)", "",
             "Each row: mean paired difference, 95% Student-t interval, pairs, verdict (poolsim.verdict). "
             "Recipes: docs/recipes.md.", "", "| claim | " + " | ".join(runs) + " |",
             "|---|" + "---|" * len(runs)]
    table: dict[str, dict[str, str]] = {}  # claim -> {recipe name: cell}
    for name, folder in runs.items():
        folder = Path(folder)
        shared, _, _ = _extras(folder)
        for c in claims(pd.read_csv(folder / "protocol.csv"), pd.read_csv(folder / "da.csv"), shared):
            table.setdefault(c["claim"], {})[name] = c["text"].replace("|", "/")
    for claim, cols in table.items():
        lines.append(f"| {claim} | " + " | ".join(cols.get(n, "-") for n in runs) + " |")
    for name, folder in runs.items():
        _, gains, var = _extras(Path(folder))
        if gains is not None and len(gains):
            lines += ["", f"## VACA under the {name} recipe", "", *vaca_report(gains, var)]
    return "\n".join(lines) + "\n"


def zero_shot_table(src) -> pd.DataFrame | None:
    """For a SIMULATED protocol folder: the text prior's draws per (seed, target) -- alignment ``a_k``,
    ``cos(v_k, u)`` and the zero-shot image AUC of the frozen text direction before any training
    (``adsim.data.sim``, ``info["zero_shot"]``), regenerated from ``protocol.json``'s simulator parameters
    and the run's seeds. ``None`` for real-data runs or runs without a record."""
    src = Path(src)
    if not (src / "protocol.json").is_file():
        return None
    recorded = read_json(src / "protocol.json").get("settings", {}).get("sim")
    if not recorded:
        return None
    # the simulator parameters protocol.json recorded (JSON values: lists become tuples)
    fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in recorded.items()}
    params = sim.SimParams(**fields)
    seeds = sorted(pd.read_csv(src / "protocol.csv")["seed"].unique())
    return pd.DataFrame([{"seed": int(s), "target": d, **z}
                         for s in seeds for d, z in sim.simulate(params, int(s)).info["zero_shot"].items()])


def _t_interval(x) -> str:
    """``mean (95% t-interval [lo, hi], n draws)``: descriptive (no claim decided on it)."""
    x = np.asarray(x, dtype=float)
    if len(x) < 2:
        return f"{x.mean():.3g} (1 draw, no interval)"
    lo, hi = stats.t.interval(0.95, len(x) - 1, loc=x.mean(), scale=stats.sem(x))
    return f"{x.mean():.3g} (95% t-interval [{lo:.3g}, {hi:.3g}], {len(x)} draws)"


def zero_shot_md(zs: pd.DataFrame, proto: pd.DataFrame) -> list:
    """Lines of ``ad_table.md`` on the text prior: zero-shot AUC and drawn alignments, and how far the
    trained methods' final image AUC is from the zero-shot AUC (paired over (target, seed))."""
    lines = ["", "## Zero-shot transfer drawn from the text prior (this run, SIMULATED)", "",
             "Per (seed, target) the simulator draws the text alignment a_k ~ Beta (adsim.data.sim, step 4); the "
             "zero-shot image AUC scores each test image by the frozen text direction before any training "
             "(layer mean of the max patch score). Intervals are descriptive (Student t over the draws).", "",
             f"- alignment a_k: {_t_interval(zs['alignment'])}; cos(v_k, text direction): "
             f"{_t_interval(zs['text_cos'])}; zero-shot image AUC: {_t_interval(zs['image_auc'])}, "
             f"range {zs['image_auc'].min():.1f}-{zs['image_auc'].max():.1f}."]
    last = proto[(proto["step"] == proto["step"].max()) & (proto["task"] == "AC") & (proto["order"] == "hardest")]
    for m in [m for m in FINAL if m in set(last["method"])]:
        pair = last[last["method"] == m].merge(zs, on=["seed", "target"])
        if len(pair):
            lines.append(f"- {m}: final image AUC minus zero-shot AUC, paired over (target, seed): "
                         f"{_t_interval(pair['auc'] - pair['image_auc'])}.")
    return lines


def _save(fig, path: Path) -> Path:
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
    return path


def _read_sweep(sweep_dir) -> pd.DataFrame:
    if not (Path(sweep_dir) / "sweep.csv").is_file():
        raise ValueError(f"{sweep_dir} has no sweep.csv (run `python -m adsim sweep` first)")
    return pd.read_csv(Path(sweep_dir) / "sweep.csv")


def sweep_figures(sw, out) -> list:
    """``ad_sensitivity.png`` and ``sensitivity.md`` in ``out`` from a sweep table (or its folder)."""
    sw = sw if isinstance(sw, pd.DataFrame) else _read_sweep(sw)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return [_save(fig_sensitivity(sw), out / "ad_sensitivity.png"),
            atomic_write(out / "sensitivity.md", lambda fh: fh.write(sensitivity_md(sw).encode()))]


def make_figures(src, out, *, sweep_dir=None) -> list:
    src, out = Path(src), Path(out)
    if not (src / "protocol.csv").is_file():
        raise ValueError(f"{src} has no protocol.csv (run `python -m adsim protocol --out {src}` first)")
    out.mkdir(parents=True, exist_ok=True)
    proto, da = pd.read_csv(src / "protocol.csv"), pd.read_csv(src / "da.csv")
    if proto.empty:
        raise ValueError(f"{src}/protocol.csv has no rows")
    kind = proto["data"].iloc[0]
    figs = {}
    if set(FIGURE_FINAL) & set(proto["method"]):
        figs["ad_final"] = lambda: _curves(proto, da, [m for m in FIGURE_FINAL if m in set(proto["method"])],
                                           "Domain addition: naive pooling, BiLoRA and geodesic matching + VACA")
    if set(ABLATION) & set(proto["method"]):
        figs["ad_ablation"] = lambda: _curves(proto, da, [m for m in ABLATION if m in set(proto["method"])],
                                              "Ablation of the matching metric")
    if (src / "similarity.csv").is_file():
        figs["ad_modality_gap"] = lambda: fig_modality_gap(pd.read_csv(src / "similarity.csv"), kind)
    if (src / "variance.csv").is_file():
        figs["ad_variance"] = lambda: fig_variance(pd.read_csv(src / "variance.csv"))
    sw = _read_sweep(sweep_dir) if sweep_dir is not None else None
    written = [_save(make(), out / f"{name}.png") for name, make in figs.items()]
    if sw is not None:
        written += sweep_figures(sw, out)
    shared, gains, var = _extras(src)
    recipe = read_json(src / "protocol.json").get("recipe") if (src / "protocol.json").is_file() else None
    text = table_md(proto, da, shared, gains, var, recipe)
    zs = zero_shot_table(src) if kind == "simulated" else None
    if zs is not None:
        written.append(atomic_write(out / "zero_shot.csv", lambda fh: fh.write(zs.to_csv(index=False).encode())))
        text += "\n".join(zero_shot_md(zs, proto)) + "\n"
    md = atomic_write(out / "ad_table.md", lambda fh: fh.write(text.encode()))
    return written + [md]
