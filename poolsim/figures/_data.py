"""What the figure modules share: one memoised ``experiments.simulate`` per set-up, interval
tables, ground-truth outlier labels, captions and colours.

The memo (:func:`simulation`) is keyed by every input of ``simulate`` and ``simulate`` is a pure
function of them, so sharing one draw between figures (``synthetic_intro``, ``asymptotic`` and
``baselines`` all use the asymptotic draws) changes no number -- it only saves JIT compiles.
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable

import numpy as np
import pandas as pd

from .. import _engine, _verdict, experiments

QUICK_SEEDS = 3  # --quick: at most this many seeds

LABELS = {"pool": "naive pooling", "subsample": "uniform subsampling", "match": "matching"}
COLORS = {"pool": "tab:blue", "subsample": "tab:orange", "match": "tab:green"}
STRATEGIES = _engine.STRATEGIES
VERDICT_COLOURS = {_verdict.HOLDS: "#5aae61", _verdict.DOES_NOT_HOLD: "#d6604d",
                   _verdict.INCONCLUSIVE: "#d9d9d9"}  # verdict maps (phase, sensitivity)
LABELLED = ("asymptotic", "domain_addition")  # experiments with known outlier labels

_MEMO: dict = {}
_LOCK = threading.Lock()


def n_seeds(seeds: int, quick: bool) -> int:
    """Seeds a figure uses: ``seeds``, or at most :data:`QUICK_SEEDS` with ``quick``."""
    return min(int(seeds), QUICK_SEEDS) if quick else int(seeds)


def _key(name: str, seeds: int, params: dict) -> tuple:
    return name, int(seeds), tuple(sorted(params.items()))


def _memo(key: tuple, make: Callable[[], Any]) -> tuple[Any, bool]:
    """``(value, was_cached)``; ``make()`` runs outside the lock (it may take seconds)."""
    with _LOCK:
        if key in _MEMO:
            return _MEMO[key], True
    value = make()
    with _LOCK:
        return _MEMO.setdefault(key, value), False


def simulation(name: str, *, seeds: int, progress: Callable[[int], None] | None = None,
               **params) -> tuple[_engine.SeedResult, dict]:
    """``experiments.simulate(name, seeds=seeds, **params)``, computed once per distinct input."""
    value, cached = _memo(_key(name, seeds, params), lambda: experiments.simulate(
        name, seeds=seeds, progress=progress, **params))
    if cached and progress is not None:
        progress(int(seeds))
    return value


def labels(name: str, *, seeds: int, **params) -> np.ndarray:
    """:func:`outlier_labels` of :func:`simulation`'s draws, computed once per distinct input."""
    return _memo(("labels",) + _key(name, seeds, params),
                 lambda: outlier_labels(name, *simulation(name, seeds=seeds, **params)))[0]


def _fetch(name: str, seeds: int, progress, params: dict) -> None:
    simulation(name, seeds=seeds, progress=progress, **params)
    if name in LABELLED and params.get("metadist") is None:
        labels(name, seeds=seeds, **params)


def prefetch(jobs: Iterable[tuple[str, dict]], *, seeds: int,
             progress: Callable[[int], None] | None = None, workers: int = 2) -> None:
    """Run several :func:`simulation` calls (and their :func:`labels`) in threads, so XLA can
    compile one while Python traces another (compiling is most of a figure run's time; the
    simulations themselves take well under a second)."""
    jobs = list({_key(n, seeds, p): (n, p) for n, p in jobs}.values())
    if not jobs:
        return
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(jobs)))) as pool:
        futures = [pool.submit(_fetch, n, seeds, progress, p) for n, p in jobs]
        for f in futures:
            f.result()


def clear_memo() -> None:
    with _LOCK:
        _MEMO.clear()


def eps(res: _engine.SeedResult, P: dict) -> np.ndarray:
    """``||estimate - mu_*||_2`` per seed, K and strategy: ``(S, nK, 3)`` (float64,
    :func:`poolsim.experiments.eps`)."""
    return experiments.eps(res.estimates, P["mu_star"])


def interval_rows(values: np.ndarray, **cols: Any) -> dict:
    """One tidy row: ``mean``, ``ci_low``, ``ci_high`` (95% t over seeds) and ``n_seeds`` of
    ``values`` (one number per seed), plus ``cols``."""
    m, lo, hi = experiments.ci95(values)
    n = int(np.sum(np.isfinite(np.asarray(values, dtype=float))))  # ci95 drops non-finite seeds
    return {**cols, "mean": m, "ci_low": lo, "ci_high": hi, "n_seeds": n}


def curve_frame(values: np.ndarray, Ks: Iterable[int], names: Iterable[str], **cols) -> pd.DataFrame:
    """Rows for ``values: (S, nK, n_names)`` -> one row per (name, K) with the seed interval."""
    names = list(names)
    return pd.DataFrame([interval_rows(values[:, i, j], strategy=s, K=int(k), **cols)
                         for j, s in enumerate(names) for i, k in enumerate(Ks)])


def outlier_labels(name: str, res: _engine.SeedResult, P: dict) -> np.ndarray:
    """Ground truth ``(S, K_max)`` bool: which domains the meta-distribution made outliers.

    * ``domain_addition``: position ``k % every == 0`` (k = 1, 2, ...), by construction;
    * ``asymptotic``: the contaminated law's Bernoulli shift B_k. It is recovered by drawing the
      same seeds again with ``alpha = 0`` (same keys, so the same Gaussian part): the difference
      of the two draws is ``B_k alpha e_1``. Both are checked against the means actually drawn.
    """
    if P.get("metadist") is not None:
        raise ValueError("outlier labels are only known for the built-in meta-distributions")
    means = res.means.astype(float)
    mu = np.asarray(P["mu_star"], float)
    if name == "domain_addition":
        k = np.arange(1, means.shape[1] + 1)
        lab = np.broadcast_to(k % P["every"] == 0, means.shape[:2])
        radius_ok = np.allclose(np.linalg.norm(means - mu, axis=-1)[lab], P["radius"], atol=1e-4)
        if not radius_ok:
            raise RuntimeError("domain_addition outliers are not at the expected radius")
        return lab.copy()
    if name == "asymptotic":
        import jax
        import jax.numpy as jnp

        params = {k: v for k, v in P.items() if k != "seeds"}
        spec0, _ = experiments.spec(name, **{**params, "alpha": 0.0, "materialize": False})
        keys = jax.vmap(jax.random.key)(jnp.asarray(P["seeds"], dtype=jnp.uint32))
        dtype = jnp.dtype(P["dtype"])
        base = jax.jit(jax.vmap(lambda k: _engine.draw(spec0, dtype, k)[0]))(keys)
        shift = np.linalg.norm(means - np.asarray(base, float), axis=-1)
        lab = shift > P["alpha"] / 2
        if not (np.allclose(shift[lab], P["alpha"], atol=1e-4) and np.all(shift[~lab] < 1e-4)):
            raise RuntimeError("could not recover the contamination labels of the asymptotic draws")
        return lab
    raise ValueError(f"outlier labels are defined for 'asymptotic' and 'domain_addition', not {name!r}")


def caption(P: dict, seeds: int, keys: Iterable[str], extra: str = "") -> str:
    """The caption every figure carries: simulated data, seed count and the parameters used."""
    shown = "".join(f", {k}={P[k]}" for k in keys)
    sub = f"subsampling m=ceil({P['m_frac']}K) domains x {P['n_sub']} pts"
    return (f"SIMULATED data (poolsim JAX Monte Carlo), {seeds} seed(s). d={P['d']}, "
            f"sigma={P['sigma']}, mu*=0{shown}; matching: {P['metric']} metric, "
            f"{'sample' if P['materialize'] else 'domain'}-median init, tol={P['tol']}; {sub}. "
            f"Intervals: 95% Student-t over seeds. {extra}").strip()


def finish(fig, title: str, caption_text: str, bottom: float = 0.06):
    """Title on top, the caption (:func:`caption`) wrapped at the bottom, tight layout between."""
    import textwrap

    fig.suptitle(title, fontsize=10)
    width = int(fig.get_figwidth() * 14)  # characters per line at 7.5 pt
    fig.text(0.5, 0.005, textwrap.fill(caption_text, width), ha="center", va="bottom",
             fontsize=7.5, color="0.25")
    fig.tight_layout(rect=(0, bottom, 1, 1))
    return fig


def mark_target(ax) -> None:
    """The target mu* = 0 as a hollow star (points under it stay visible)."""
    ax.scatter([0], [0], marker="*", s=320, facecolors="none", edgecolors="red", linewidths=1.8,
               zorder=6, label="target mu* = 0")


def tidy(df: pd.DataFrame, params: dict) -> pd.DataFrame:
    """``panel`` first, integer columns as nullable integers (not floats with NaN), and the
    resolved parameters in ``df.attrs["params"]`` for ``plot``/``summarize``."""
    df = df[["panel"] + [c for c in df.columns if c != "panel"]].copy()
    for c in ("K", "seed", "domain", "coord", "n_seeds"):
        if c in df:
            df[c] = df[c].astype("Int64")
    df.attrs["params"] = params
    return df


def plot_curves(ax, df: pd.DataFrame, styles: dict | None = None) -> None:
    """Mean curve with a shaded 95% band per strategy (``df``: strategy, K, mean, ci_low, ci_high);
    ``styles[strategy]`` may set label, color, ls, marker and ``band=False``."""
    for s, g in df.groupby("strategy", sort=False):
        st = (styles or {}).get(s, {})
        label = st.get("label", LABELS.get(s, s))
        line, = ax.plot(g["K"], g["mean"], marker=st.get("marker", "o"), ms=3.5, label=label,
                        color=st.get("color", COLORS.get(s)), ls=st.get("ls", "-"), lw=1.5)
        if st.get("band", True):
            ax.fill_between(g["K"].astype(float), g["ci_low"], g["ci_high"],
                            color=line.get_color(), alpha=0.18)


def plot_bars(ax, df: pd.DataFrame, labels: dict | None = None, colors: dict | None = None) -> None:
    """One bar per strategy with its 95% interval as an error bar (``df``: strategy, mean, ci_*)."""
    x = np.arange(len(df))
    err = np.vstack([df["mean"] - df["ci_low"], df["ci_high"] - df["mean"]])
    cols = [(colors or COLORS).get(s, "0.5") for s in df["strategy"]]
    ax.bar(x, df["mean"], yerr=err, color=cols, capsize=4, alpha=0.85)
    ax.set_xticks(x, [(labels or LABELS).get(s, s) for s in df["strategy"]], rotation=20,
                  ha="right", fontsize=8)
    for xi, m, hi in zip(x, df["mean"], df["ci_high"]):
        ax.text(xi + 0.06, max(m, hi), f"{m:.3f}", ha="left", va="bottom", fontsize=7)


def fmt_ci(m: float, lo: float, hi: float, digits: int = 3) -> str:
    """``"m [lo, hi]"`` for markdown tables."""
    return f"{m:.{digits}g} [{lo:.{digits}g}, {hi:.{digits}g}]"


def fmt(row: Any) -> str:
    """``mean [lo, hi]`` for summary tables."""
    return f"{row['mean']:.3f} [{row['ci_low']:.3f}, {row['ci_high']:.3f}]"


def seeds_capped(seeds: int, quick: bool, cap: int) -> int:
    """Seeds a costly figure uses: :func:`n_seeds`, at most ``cap`` (the figure's ``MAX_SEEDS``)."""
    return min(n_seeds(seeds, quick), int(cap))


# --- verdicts: every claim decided by poolsim._verdict on paired per-seed values -------------------

VERDICT_COLUMNS = ("figure", "claim", "verdict", "estimate", "ci_low", "ci_high", "n_seeds",
                   "threshold", "side", "compared", "source", "note")
HOLM_COLUMN = "verdict_holm"  # added to verdicts.csv over the whole file (:func:`with_holm`)


def with_holm(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` (rows of verdicts.csv) with :data:`HOLM_COLUMN`: each claim's verdict after Holm's
    step-down adjustment over every claim of the table (family-wise error 5% for the whole file).

    A row's p-value is the two-sided Student-t p-value of its decided comparison, recovered from
    its 95% interval (:func:`poolsim._verdict.p_value`; below 0.05 exactly when the per-claim
    interval excludes the threshold); rows without an interval count as p = 1. Rows of "no
    counterexample" claims (side "zero": a deterministic check on every seed, not a test) keep
    their verdict and are not in the family."""
    table = table.drop(columns=[HOLM_COLUMN], errors="ignore").copy()
    test = (table["side"] != "zero").to_numpy()
    out = table["verdict"].astype(object).to_numpy().copy()
    if test.any():
        t = table[test]
        p = _verdict.p_value(t["estimate"], t["ci_low"], t["ci_high"], t["n_seeds"], t["threshold"])
        out[test] = _verdict.adjusted_verdicts(t["estimate"], t["threshold"], t["side"],
                                               _verdict.holm(p))
    table[HOLM_COLUMN] = out
    return table


def claim(figure: str, text: str, v: _verdict.Verdict, compared: str, *, source: str = "paper",
          note: str = "") -> dict:
    """One row of ``verdicts.csv``: the claim ``text``, decided as ``v`` on the per-seed values
    ``compared`` (e.g. "eps(pooling) - eps(matching) at K=50"); ``source`` "paper" (a claim of the
    paper) or "ours" (a question we add); ``note`` a caveat (our thresholds, by-construction...)."""
    return dict(figure=figure, claim=text, verdict=v.verdict, estimate=v.estimate, ci_low=v.ci_low,
                ci_high=v.ci_high, n_seeds=v.n_seeds, threshold=v.threshold, side=v.side,
                compared=compared, source=source, note=note)


def all_claim(figure: str, text: str, parts: dict, *, source: str = "paper", note: str = "") -> dict:
    """A claim that needs every part (``{compared: Verdict}``) to hold; the row reports the part
    that decides it (see :func:`poolsim._verdict.all_of`)."""
    names = list(parts)
    v, i = _verdict.all_of([parts[k] for k in names])
    return claim(figure, text, v, names[i], source=source, note=note)


def set_verdicts(df: pd.DataFrame, rows: list) -> pd.DataFrame:
    """Attach the verdict rows to a figure's frame (``df.attrs["verdicts"]``), for ``summarize``
    and the CLI's ``verdicts.csv``."""
    df.attrs["verdicts"] = [dict(r) for r in rows]
    return df


def verdicts_of(df: pd.DataFrame) -> pd.DataFrame:
    """The verdict rows attached by :func:`set_verdicts`, columns :data:`VERDICT_COLUMNS`."""
    return pd.DataFrame(df.attrs.get("verdicts", []), columns=list(VERDICT_COLUMNS))


def claim_lines(verdicts: pd.DataFrame) -> list[str]:
    """Markdown bullets rendered from verdict rows (``verdicts.csv``'s columns)."""
    lines = []
    for r in verdicts.itertuples():
        src = "Paper" if r.source == "paper" else "Ours (not a claim of the paper)"
        v = _verdict.Verdict(r.verdict, float(r.estimate), float(r.ci_low), float(r.ci_high),
                             int(r.n_seeds), float(r.threshold), r.side)
        rel = {"greater": ">", "less": "<", "zero": "="}[r.side]
        lines.append(f"- {src}: {r.claim} -- **{r.verdict}**. Decided on {r.compared} "
                     f"{rel} {r.threshold:g}, per seed: {_verdict.fmt(v)[len(r.verdict) + 2:]}."
                     + (f" {r.note}" if isinstance(r.note, str) and r.note else ""))
    return lines
