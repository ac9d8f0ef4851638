"""The claims module: what each verdict row tests, under which readings, over which open parameters.

Declarations (fixed before any sweep result was read; ``tests/test_claims.py`` pins them):

* :data:`RANGES` -- for each engine experiment, the set-up parameters the paper does not give, a
  plausible range for each and why (from the paper's own figures and text); the sensitivity sweep
  (``python -m poolsim.figures --only sensitivity``) moves them one at a time, the others at their
  defaults, and over the two-parameter :data:`MAPS`.
* :data:`CLAIMS` -- each swept claim (its exact text in ``verdicts.csv``), every fair reading of
  its sentence as a labelled :class:`Reading`, and which one is the headline: the most literal
  reading of the paper's words, chosen by the rule in :data:`HEADLINE_RULE`, never by which one
  agrees with the paper.
* :data:`ILLUSTRATIONS` -- verdict rows that cannot fail (true by construction); they are counted
  apart from the tests.

Rules: :func:`measure` decides one reading on one simulation (paired per-seed differences,
:func:`poolsim._verdict.decide`); :func:`classify` turns a reading's Holm-adjusted verdicts over
the sweep into ``robust`` / ``holds only for ...`` / ``fails throughout`` / ...;
:func:`annotate` adds the ``kind``, ``reading``, ``headline`` and ``robustness`` columns to
``verdicts.csv``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np
import pandas as pd

from .. import _verdict
from . import _data


class Range(NamedTuple):
    """An open parameter of ``experiment``: the values swept (the default among them) and why."""

    experiment: str
    parameter: str
    values: tuple
    default: float
    why: str


TAU_WHY = ("the paper's implementation details list fixed radii tau in {1.0, 1.1, 1.2} for the "
           "synthetic runs; each experiment names one of them")
M_FRAC_WHY = ("Def. 2 draws m of the K domains uniformly and the paper never gives m; a quarter to "
              "three quarters of the domains")
RANGES: tuple[Range, ...] = (
    Range("asymptotic", "gamma", (0.25, 0.5, 0.75, 1.0, 1.25, 1.5), 0.5,
          "inlier spread of D_mu: not given. Up to 1.5, the spread the paper gives its symmetric "
          "D_mu (Sec. 'Finite-K with symmetric meta-distribution'); down to 0.25, means that "
          "'concentrate along a biased direction' (Fig. synthetic_intro), well inside the shift "
          "alpha = 1.5"),
    Range("asymptotic", "p", (0.1, 0.2, 0.3, 0.4), 0.3,
          "share of shifted domains: not given. From 0.1 (Example 1's p) to 0.4: a directional "
          "mass that leaves the inliers a majority (p < 1/2), as 'outliers' requires"),
    Range("asymptotic", "tau", (1.0, 1.1, 1.2), 1.2, TAU_WHY),
    Range("asymptotic", "m_frac", (0.25, 0.5, 0.75), 0.5, M_FRAC_WHY),
    Range("asymptotic", "n_sub", (5, 10, 20), 10,
          "points per subsampled domain: not given; Def. 2 asks n_sub << n = 150"),
    Range("domain_addition", "gamma", (0.25, 0.5, 0.75, 1.0), 0.5,
          "inlier spread: not given (Sec. 'Finite-K with asymmetric addition' gives only the "
          "outliers' ||mu_k - mu*|| ~ 2.5). Up to 1.0, where those outliers are still 2.5 inlier "
          "standard deviations out ('harmful outlier'); down to 0.25"),
    Range("domain_addition", "jitter", (0.0, 0.2, 0.5), 0.2,
          "direction of the outliers: the paper (Fig. synthetic_exp_3) gives only ||mu_k - mu*|| ~ 2.5 and the "
          "asymmetric setting; 0 puts every outlier on one ray, 0.5 spreads them over about "
          "+-30 degrees on one side"),
    Range("domain_addition", "tau", (1.0, 1.1, 1.2), 1.1, TAU_WHY),
    Range("domain_addition", "m_frac", (0.25, 0.5, 0.75), 0.5, M_FRAC_WHY),
    Range("domain_addition", "n_sub", (5, 10, 20), 10,
          "points per subsampled domain: not given; Def. 2 asks n_sub << n = 100"),
    Range("symmetric", "m_frac", (0.25, 0.5, 0.75), 0.5, M_FRAC_WHY),
    Range("symmetric", "n_sub", (5, 10, 20), 10,
          "points per subsampled domain: not given; Def. 2 asks n_sub << n = 100 (Sec. 'Finite-K "
          "with symmetric meta-distribution' gives K, gamma, n and tau only)"),
)
"""The open parameters swept, per experiment (values ascending, default included)."""

MAPS: tuple[tuple[str, str, str], ...] = (("asymptotic", "gamma", "p"),
                                          ("domain_addition", "gamma", "jitter"))
"""Two-parameter verdict maps ``(experiment, x, y)`` over the full grids of :data:`RANGES`."""

HEADLINE_RULE = (
    "The headline reading is the most literal one: the quantity the sentence names (eps_K, not "
    "its square, unless the sentence says otherwise), at the K or over the range the sentence "
    "names (the whole curve when it names none), and the event it names (the spikes at outlier "
    "arrivals, not the worst case the same sentence concedes). Which reading agrees with the "
    "paper plays no part.")


class Reading(NamedTuple):
    """One test of a sentence: ``label`` names it, ``compared`` the per-seed quantity decided,
    ``headline`` whether it is the claim's most literal reading (:data:`HEADLINE_RULE`), ``why``
    the reason."""

    label: str
    compared: str
    headline: bool
    why: str


class Claim(NamedTuple):
    """A swept claim: ``text`` is the claim column of its existing ``verdicts.csv`` row, whose
    reading is ``existing``; ``readings`` every fair reading (one headline)."""

    id: str
    figure: str
    text: str
    existing: str
    readings: tuple
    setup: tuple = ()  # ((parameter, value), ...): the figure's fixed choice for this row (layout)


SQUARED_WHY = ("squared error, the loss Thm 3(2) bounds (E eps^2); the sentence says eps_K, so "
               "not the headline")
CLAIMS: tuple[Claim, ...] = (
    Claim("asymptotic.lowest", "asymptotic", "matching's eps_K is the lowest at K=50",
          "eps at K=50", (
              Reading("eps at K=50", "eps(other) - eps(matching) at K=50, each other strategy",
                      True, "the sentence names eps_K and K = 50"),
              Reading("squared error at K=50", "eps^2(other) - eps^2(matching) at K=50", False,
                      SQUARED_WHY))),
    Claim("asymptotic.fastest", "asymptotic", "matching's eps_K decreases fastest (K=5 -> 50)",
          "eps_5 - eps_50", (
              Reading("eps_5 - eps_50", "decrease(matching) - decrease(other), decrease = "
                      "eps_5 - eps_50", True, "how far eps_K falls over the plotted K range"),
              Reading("relative decrease", "(eps_5 - eps_50) / eps_5: matching - other", False,
                      "fastest as a rate: the share of the starting error removed; the sentence "
                      "gives no normalisation"))),
    Claim("asymptotic.largest", "asymptotic", "subsampling suffers the largest errors (Sec. 5; at K=50)",
          "eps at K=50", (
              Reading("mean eps over the K grid", "mean over K of eps(subsampling) - eps(other)",
                      True, "Sec. 5 says it of the synthetic runs as a whole ('subsampling "
                      "suffers the largest errors due to sqrt(d/N) variance amplification') and "
                      "names no K: the whole plotted curve"),
              Reading("eps at K=50", "eps(subsampling) - eps(other) at K=50", False,
                      "the K of the figure's bar panel, chosen by the figure, not the sentence"),
              Reading("squared error at K=50", "eps^2(subsampling) - eps^2(other) at K=50", False,
                      SQUARED_WHY))),
    Claim("domain_addition.theta1", "domain_addition",
          "naive pooling shows Theta(1) jumps when an outlier arrives (\"deterioration never "
          "vanishes\")", "last vs first arrival step", (
              Reading("last vs first arrival step", "pooling's step at the last outlier arrival - "
                      "0.5 x its step at the first", True,
                      "Theta(1): the jump does not shrink as K grows (our cut: keeps half)"),)),
    Claim("domain_addition.blunts", "domain_addition",
          "subsampling blunts the spikes (relative to naive pooling)", "largest step over all K", (
              Reading("mean step at outlier arrivals", "mean over outlier arrivals of "
                      "step(subsampling) - step(pooling)", True,
                      "the spikes are the jumps at outlier arrivals (the figure's (i)); the "
                      "sentence goes on 'but still incurs Omega(1/m) worst-case steps', so the "
                      "worst case is not what it says is blunted"),
              Reading("largest step over all K", "largest step(subsampling) - largest "
                      "step(pooling)", False,
                      "the worst case the same sentence concedes; with a fresh subset at every K "
                      "it mostly measures the redraw"))),
    Claim("domain_addition.final", "domain_addition", "matching has the smallest final error (K=30)",
          "eps at K=30", (
              Reading("eps at K=30", "eps(other) - eps(matching) at K=30", True,
                      "the sentence names the final error; the figure's final K is 30"),
              Reading("squared error at K=30", "eps^2(other) - eps^2(matching) at K=30", False,
                      SQUARED_WHY))),
    Claim("domain_addition.stable", "domain_addition",
          "matching gives the most stable curve (smallest largest step)", "largest step", (
              Reading("largest step", "largest step(other) - largest step(matching)", True,
                      "the paper's 'bounded, shrinking perturbations' and Thm 3's worst-case "
                      "deterioration: the largest step"),
              Reading("mean absolute step", "mean |step|(other) - mean |step|(matching)", False,
                      "stability as the curve's overall wiggle, up or down"))),
    Claim("domain_addition.often", "domain_addition",
          "matching's per-step changes are often non-positive", "fraction of steps <= 0", (
              Reading("fraction of steps <= 0", "fraction of steps <= 0: matching - other", True,
                      "'often' compared with the baselines (a fixed level would be met by "
                      "pooling too)"),)),
    *(Claim(f"symmetric.unbiased.{lay}", "symmetric",
            f"all three strategies are (nearly) unbiased at K=15 under symmetry (layout `{lay}`)",
            "every coordinate within 0.1 gamma", (
                Reading("every coordinate within 0.1 gamma", "E[estimate - mu*] per strategy and "
                        "coordinate, inside +-0.1 gamma", True,
                        "Thm 2's 'unbiased'; 'nearly' as +-0.1 gamma (our margin)"),),
            (("layout", lay),)) for lay in ("balanced", "gaussian")),
    *(Claim(f"symmetric.negligible.{lay}", "symmetric",
            "\"all methods exhibit negligible bias at K=15\" (figure caption; the paper calls eps_K = "
            f"||estimate - mu*|| the bias; layout `{lay}`)", "eps below 0.1 gamma", (
                Reading("eps below 0.1 gamma", "eps per strategy at K=15 < 0.1 gamma", True,
                        "the caption's 'bias' is eps_K, the paper's own name for the error; "
                        "'negligible' as below 0.1 gamma (our cut)"),),
            (("layout", lay),)) for lay in ("balanced", "gaussian")),
)
"""Every swept claim with its readings (exactly one headline each)."""


class Illustration(NamedTuple):
    """Verdict rows of ``figure`` whose claim starts with ``prefix`` cannot fail, for ``why``."""

    figure: str
    prefix: str
    why: str


ILLUSTRATIONS: tuple[Illustration, ...] = (
    Illustration("synthetic_intro", "domain means concentrate along a biased direction",
                 "true by construction: the simulated D_mu shifts a share p of the means by alpha"),
    Illustration("flow_bridge", "Thm 4 (3),(4)",
                 "a certified bound: it fails only if flows.lipschitz_bound is wrong"),
)
"""Rows that are illustrations, not tests (counted apart)."""

OUTSIDE_PREMISE: tuple[Illustration, ...] = (
    Illustration("multimodal", "eps_(K+1,m) <= eps_(K,m) for all m with high probability",
                 "the figure's set-up (contaminated modes) meets neither coverage nor, at every K, "
                 "separation; the row 'under the Lemma's premise' is the test on the Lemma's terms"),
)
"""Rows (exact claim text) that test a lemma's conclusion where its conditions do not hold: kept,
labelled, and counted apart from the tests."""

NOT_SWEPT_WHY: dict[str, str] = {
    "flow_bridge": "one flow fit per seed and data set (40 seeds): a sweep over the flow's settings does "
                   "not fit the figures' time; not swept",
    "multimodal": "its open parameters (R, p, gamma, tau) decide whether the Lemma's premise holds; "
                  "instead of a sweep, the claim is tested once outside and once inside the premise "
                  "(PREMISE)",
    "baselines": "the project's own question (same draws as asymptotic and domain_addition)",
    "phase": "the project's own question; the map itself sweeps share and shift",
    "synthetic_intro": "an illustration (cannot fail)",
}
"""Why a figure's rows have no declared range (their ``robustness`` is ``not swept``)."""

KIND_TEST, KIND_ILLUSTRATION, KIND_OUTSIDE = "test", "illustration", "outside premise"
ROBUST = "robust"
NOT_SWEPT = "not swept"
ANNOTATION_COLUMNS = ("kind", "reading", "headline", "robustness")
"""Columns :func:`annotate` adds to ``verdicts.csv``."""


def claim(claim_id: str) -> Claim:
    """The declared claim ``claim_id``; ValueError naming the choices if there is none."""
    for c in CLAIMS:
        if c.id == claim_id:
            return c
    raise ValueError(f"unknown claim {claim_id!r}; choose from {', '.join(c.id for c in CLAIMS)}")


def ranges(experiment: str) -> tuple[Range, ...]:
    """The :data:`RANGES` of one experiment."""
    return tuple(r for r in RANGES if r.experiment == experiment)


def reading_text(c: Claim, r: Reading) -> str:
    """The claim column of a reading's row: the claim's own text for its existing reading,
    else ``"<text> -- reading: <label>"``."""
    return c.text if r.label == c.existing else f"{c.text} -- reading: {r.label}"


# --- premises ------------------------------------------------------------------------------------

def multimodal_premise(modes: np.ndarray, xbar: np.ndarray, mode: np.ndarray, eps: np.ndarray,
                       tau: float) -> tuple[bool, bool]:
    """The conditions of Lemma 'Multimodal Reduction' at one K: ``(separation, coverage)``.

    ``modes (M, d)`` the modes mu*_m, ``xbar (K, d)`` the domains' sample means, ``mode (K,)``
    each domain's mode, ``eps (M,)`` eps_(K,m) = ||c_(K,m) - mu*_m||, ``tau`` every tau_m.
    ``R_max`` = the largest distance of a domain mean from its own mode. Separation:
    ``min_(i != j) ||mu*_i - mu*_j|| > 2 (tau + R_max + max_m eps_m)``; coverage:
    ``tau >= R_max + eps_m`` for every m."""
    modes, xbar, eps = (np.asarray(a, float) for a in (modes, xbar, eps))
    M = len(modes)
    sep = min(np.linalg.norm(modes[i] - modes[j]) for i in range(M) for j in range(i))
    R_max = float(np.max(np.linalg.norm(xbar - modes[np.asarray(mode)], axis=1)))
    return bool(sep > 2 * (tau + R_max + eps.max())), bool(np.all(tau >= R_max + eps))


# --- measuring a reading on one simulation ---------------------------------------------------------

def _others(s: str) -> list:
    return [o for o in _data.STRATEGIES if o != s]


def _vs(a: np.ndarray, best: str, *, side: str = "greater", threshold: float = 0.0,
        worst: bool = False) -> _verdict.Verdict:
    """``a (S, 3)`` per seed and strategy. ``best`` lowest (``worst=False``: every other minus it
    above the threshold) or highest (``worst=True``: it minus every other), paired per seed; every
    comparison must hold (:func:`poolsim._verdict.all_of`)."""
    j = {s: i for i, s in enumerate(_data.STRATEGIES)}
    parts = [_verdict.decide(a[:, j[best]], a[:, j[o]], side=side, threshold=threshold) if worst
             else _verdict.decide(a[:, j[o]], a[:, j[best]], side=side, threshold=threshold)
             for o in _others(best)]
    return _verdict.all_of(parts)[0]


def _steps(e: np.ndarray, P: dict) -> tuple[np.ndarray, np.ndarray]:
    """``(step (S, nK - 1, 3), arrival (nK - 1,))`` of the domain-addition curve."""
    Ks = np.asarray(P["Ks"])
    return np.diff(e, axis=1), Ks[1:] % P["every"] == 0


def _measures() -> dict[tuple[str, str], Callable[[np.ndarray, dict], _verdict.Verdict]]:
    j = {s: i for i, s in enumerate(_data.STRATEGIES)}

    def rel_drop(e, P):
        return (e[:, 0] - e[:, -1]) / e[:, 0]

    def pool_theta(e, P):
        step, arr = _steps(e, P)
        at = step[:, arr, j["pool"]]
        return _verdict.decide(at[:, -1], 0.5 * at[:, 0])

    def blunt_arrival(e, P):
        step, arr = _steps(e, P)
        at = step[:, arr].mean(axis=1)
        return _verdict.decide(at[:, j["subsample"]], at[:, j["pool"]], side="less")

    def blunt_largest(e, P):
        big = _steps(e, P)[0].max(axis=1)
        return _verdict.decide(big[:, j["subsample"]], big[:, j["pool"]], side="less")

    def margin(P):  # symmetric's 'nearly' / 'negligible': below NEGLIGIBLE x gamma
        from . import symmetric

        return round(symmetric.NEGLIGIBLE * P["gamma"], 12)

    def unbiased(e, P, est):
        return _verdict.all_of([_verdict.within(est[:, j, c], margin=margin(P))
                                for j in range(len(_data.STRATEGIES)) for c in range(est.shape[-1])])[0]

    def negligible(e, P, est):
        return _verdict.all_of([_verdict.decide(e[:, -1, j], threshold=margin(P), side="less")
                                for j in range(len(_data.STRATEGIES))])[0]

    sym = {(f"symmetric.{kind}.{lay}", label): f for lay in ("balanced", "gaussian")
           for kind, label, f in (("unbiased", "every coordinate within 0.1 gamma", unbiased),
                                  ("negligible", "eps below 0.1 gamma", negligible))}
    return {
        **sym,
        ("asymptotic.lowest", "eps at K=50"): lambda e, P: _vs(e[:, -1], "match"),
        ("asymptotic.lowest", "squared error at K=50"): lambda e, P: _vs(e[:, -1] ** 2, "match"),
        ("asymptotic.fastest", "eps_5 - eps_50"):
            lambda e, P: _vs(e[:, 0] - e[:, -1], "match", worst=True),
        ("asymptotic.fastest", "relative decrease"): lambda e, P: _vs(rel_drop(e, P), "match", worst=True),
        ("asymptotic.largest", "mean eps over the K grid"):
            lambda e, P: _vs(e.mean(axis=1), "subsample", worst=True),
        ("asymptotic.largest", "eps at K=50"): lambda e, P: _vs(e[:, -1], "subsample", worst=True),
        ("asymptotic.largest", "squared error at K=50"):
            lambda e, P: _vs(e[:, -1] ** 2, "subsample", worst=True),
        ("domain_addition.theta1", "last vs first arrival step"): pool_theta,
        ("domain_addition.blunts", "mean step at outlier arrivals"): blunt_arrival,
        ("domain_addition.blunts", "largest step over all K"): blunt_largest,
        ("domain_addition.final", "eps at K=30"): lambda e, P: _vs(e[:, -1], "match"),
        ("domain_addition.final", "squared error at K=30"): lambda e, P: _vs(e[:, -1] ** 2, "match"),
        ("domain_addition.stable", "largest step"):
            lambda e, P: _vs(_steps(e, P)[0].max(axis=1), "match"),
        ("domain_addition.stable", "mean absolute step"):
            lambda e, P: _vs(np.abs(_steps(e, P)[0]).mean(axis=1), "match"),
        ("domain_addition.often", "fraction of steps <= 0"):
            lambda e, P: _vs((_steps(e, P)[0] <= 0).mean(axis=1), "match", worst=True),
    }


MEASURES = _measures()
"""``(claim id, reading label) -> f(e (S, nK, 3) eps, P params[, est]) -> Verdict`` (the
symmetric claims also take ``est``)."""


def measure(claim_id: str, label: str, e: np.ndarray, P: dict,
            est: np.ndarray | None = None) -> _verdict.Verdict:
    """Decide reading ``label`` of claim ``claim_id`` on ``e: (S, nK, 3)`` (eps per seed, K and
    strategy, :data:`poolsim.figures._data.STRATEGIES` order) of an experiment with parameters
    ``P``; the symmetric claims need ``est: (S, 3, d)``, estimate - mu* at the last K."""
    if (claim_id, label) not in MEASURES:
        raise ValueError(f"no reading {label!r} of claim {claim_id!r}")
    f = MEASURES[(claim_id, label)]
    if claim_id.startswith("symmetric."):
        if est is None:
            raise ValueError(f"claim {claim_id!r} needs est (estimate - mu* per seed)")
        return f(np.asarray(e, float), P, np.asarray(est, float))
    return f(np.asarray(e, float), P)


def reading_rows(figure: str, e: np.ndarray, P: dict) -> list[dict]:
    """The verdict rows of ``figure``'s readings other than the existing rows' own ones, decided
    on the same draws (``e``, ``P``); they stand beside the existing rows."""
    rows = []
    for c in CLAIMS:
        if c.figure != figure:
            continue
        for r in c.readings:
            if r.label == c.existing:
                continue
            v = measure(c.id, r.label, e, P)
            rows.append(_data.claim(figure, reading_text(c, r), v, r.compared,
                                    note=f"Another reading of the same sentence: {r.why}."
                                         + (" The headline reading (docs/claims.md)." if r.headline
                                            else "")))
    return rows


# --- classifying a reading over the sweep -----------------------------------------------------------

def _fmt_values(vals) -> str:
    return "{" + ", ".join(f"{float(v):g}" for v in vals) + "}"


def classify(rows: pd.DataFrame) -> str:
    """One reading's sweep rows -> its robustness.

    ``rows``: columns ``design`` ("one at a time" or "map X x Y"), ``parameter`` (the parameter
    moved; for a map, "X x Y"), ``value`` (the moved value; for a map, "x, y") and ``verdict``
    (the Holm-adjusted verdict). Result: ``robust`` (holds at every setting), ``fails throughout``
    (does not hold at every setting), ``inconclusive throughout``, else ``holds only for ...``
    (where it holds, per parameter moved one at a time, then each map's count of cells, then
    ``at no value of X (...)`` for the parameters at none of whose values it holds) or ``never
    holds: ...``. Parameters where it holds at every value are not listed."""
    if rows.empty:
        raise ValueError("rows must hold at least one sweep setting")
    got = set(rows["verdict"])
    if got - set(_verdict.OUTCOMES):
        raise ValueError(f"unknown verdicts {sorted(got - set(_verdict.OUTCOMES))}")
    if got == {_verdict.HOLDS}:
        return ROBUST
    if got == {_verdict.DOES_NOT_HOLD}:
        return "fails throughout"
    if got == {_verdict.INCONCLUSIVE}:
        return "inconclusive throughout"
    parts, maps, nowhere = [], [], []
    for (design, param), g in rows.groupby(["design", "parameter"], sort=False):
        if set(g["verdict"]) == {_verdict.HOLDS}:
            continue
        by = {o: list(g.loc[g["verdict"] == o, "value"]) for o in _verdict.OUTCOMES}
        if design != "one at a time":
            maps.append(f"{param}: holds in {len(by[_verdict.HOLDS])} of {len(g)} cells")
            continue
        rest = "; ".join(f"{o} at {param} in {_fmt_values(by[o])}"
                         for o in (_verdict.DOES_NOT_HOLD, _verdict.INCONCLUSIVE) if by[o])
        if by[_verdict.HOLDS]:
            parts.append(f"{param} in {_fmt_values(by[_verdict.HOLDS])} ({rest})")
        else:
            nowhere.append(f"{param} ({rest})")
    text = "; ".join(parts + maps)
    if nowhere:
        text += ("; " if text else "") + "at no value of " + ", ".join(nowhere)
    return ("holds only for " if _verdict.HOLDS in got else "never holds: ") + text


def robustness(sweep: pd.DataFrame) -> pd.DataFrame:
    """Per claim and reading of a sweep table (``sensitivity.csv``): columns claim_id, reading,
    headline, robustness (:func:`classify` of its Holm-adjusted verdicts)."""
    out = []
    for (cid, lab), g in sweep.groupby(["claim_id", "reading"], sort=False):
        g = g.rename(columns={"verdict": "verdict_raw"}).rename(columns={"verdict_holm": "verdict"})
        out.append(dict(claim_id=cid, reading=lab, headline=bool(g["headline"].iloc[0]),
                        robustness=classify(g)))
    return pd.DataFrame(out, columns=["claim_id", "reading", "headline", "robustness"])


# --- verdicts.csv annotations -----------------------------------------------------------------------

def _row_reading(figure: str, text: str):
    """``(claim, reading)`` a verdicts.csv row tests, or ``None`` if it is not a swept claim."""
    for c in CLAIMS:
        if c.figure != figure:
            continue
        for r in c.readings:
            if reading_text(c, r) == text:
                return c, r
    return None


def kind(figure: str, text: str) -> str:
    """:data:`KIND_ILLUSTRATION` for a row of :data:`ILLUSTRATIONS`, :data:`KIND_OUTSIDE` for a
    row of :data:`OUTSIDE_PREMISE` (exact text), else :data:`KIND_TEST`."""
    if any(figure == i.figure and str(text).startswith(i.prefix) for i in ILLUSTRATIONS):
        return KIND_ILLUSTRATION
    if any(figure == i.figure and str(text) == i.prefix for i in OUTSIDE_PREMISE):
        return KIND_OUTSIDE
    return KIND_TEST


def annotate(table: pd.DataFrame, sweep: pd.DataFrame | None) -> pd.DataFrame:
    """``verdicts.csv`` rows plus :data:`ANNOTATION_COLUMNS`: ``kind`` (test / illustration),
    ``reading`` and ``headline`` (yes / no; empty for a claim with no declared readings) and
    ``robustness`` (its reading's :func:`classify` over the sweep ``sweep``; ``not swept`` when
    there is no sweep row for it; the kind for an illustration or a row outside a premise)."""
    table = table.drop(columns=list(ANNOTATION_COLUMNS), errors="ignore").copy()
    rob = {} if sweep is None or sweep.empty else {
        (r.claim_id, r.reading): r.robustness for r in robustness(sweep).itertuples()}
    kinds, labels, heads, robs = [], [], [], []
    for fig, text in zip(table["figure"], table["claim"]):
        k = kind(fig, text)
        hit = _row_reading(fig, text)
        kinds.append(k)
        labels.append(hit[1].label if hit else "")
        heads.append(("yes" if hit[1].headline else "no") if hit else "")
        robs.append(k if k != KIND_TEST else
                    rob.get((hit[0].id, hit[1].label), NOT_SWEPT) if hit else NOT_SWEPT)
    table["kind"], table["reading"], table["headline"], table["robustness"] = kinds, labels, heads, robs
    return table


def read_sweep(*folders: Path) -> pd.DataFrame | None:
    """The first ``sensitivity.csv`` found in ``folders`` (a run's temporary folder, then the
    output folder), or ``None``."""
    for f in folders:
        p = Path(f) / "sensitivity.csv"
        if p.is_file():
            return pd.read_csv(p)
    return None


# --- the one honest summary -------------------------------------------------------------------------

OUTCOME_CLASSES = ("holds across the whole declared range", "holds only in part",
                   "holds at its one set-up (not swept)", "fails", "inconclusive")


def outcome_class(verdict: str, robustness_text: str) -> str:
    """Where a counted row of ``verdicts.csv`` falls in :data:`OUTCOME_CLASSES`: by its
    ``robustness`` when swept, else by its own ``verdict``."""
    if robustness_text == ROBUST:
        return OUTCOME_CLASSES[0]
    if robustness_text.startswith("holds only for"):
        return OUTCOME_CLASSES[1]
    if robustness_text == "fails throughout" or robustness_text.startswith("never holds"):
        return OUTCOME_CLASSES[3] if "does not hold" in robustness_text or \
            robustness_text == "fails throughout" else OUTCOME_CLASSES[4]
    if robustness_text == "inconclusive throughout":
        return OUTCOME_CLASSES[4]
    if robustness_text != NOT_SWEPT:
        raise ValueError(f"unknown robustness {robustness_text!r}")
    return {_verdict.HOLDS: OUTCOME_CLASSES[2], _verdict.DOES_NOT_HOLD: OUTCOME_CLASSES[3],
            _verdict.INCONCLUSIVE: OUTCOME_CLASSES[4]}[verdict]


def counts(table: pd.DataFrame) -> dict:
    """The summary of an annotated ``verdicts.csv`` (:func:`annotate`): ``paper`` -- per
    :data:`OUTCOME_CLASSES` the paper's tested rows (source paper, kind test; of a claim with
    several readings only the headline row), ``part`` -- each in-part row's (figure, claim,
    robustness), ``illustrations``, ``outside_premise``, ``other_readings`` (non-headline rows)
    and ``ours`` (the project's own claims, tests) counted apart."""
    t = table.fillna({"headline": "", "reading": ""})
    paper = t[(t.source == "paper") & (t.kind == KIND_TEST) & (t.headline != "no")]
    cls = [outcome_class(v, r) for v, r in zip(paper.verdict, paper.robustness)]
    part = [(f, c, r) for f, c, r, k in zip(paper.figure, paper.claim, paper.robustness, cls)
            if k == OUTCOME_CLASSES[1]]
    ours = t[(t.source != "paper") & (t.kind == KIND_TEST)]
    return dict(n=len(paper), paper={k: cls.count(k) for k in OUTCOME_CLASSES}, part=part,
                illustrations=int((t.kind == KIND_ILLUSTRATION).sum()),
                outside_premise=int((t.kind == KIND_OUTSIDE).sum()),
                other_readings=int(((t.headline == "no") & (t.kind == KIND_TEST)).sum()),
                ours=len(ours), ours_holds=int((ours.verdict == _verdict.HOLDS).sum()))


def markdown() -> str:
    """The claims page's section on these declarations (``docs/claims.md``, appended by
    ``python -m poolsim.audit``): the headline rule, every reading, the declared ranges, the
    premises and the rows counted apart."""
    lines = ["## Readings, open parameters and premises of the figures' claims", "",
             "Declared in `poolsim/figures/_claims.py` before the sensitivity sweep first ran "
             "(`tests/test_claims.py` pins them); the sweep is `python -m poolsim.figures --only "
             "sensitivity` (`figures/sensitivity.csv`, one row per claim x reading x setting; the "
             "`robustness` column of `figures/verdicts.csv`).", "",
             f"**Headline reading.** {HEADLINE_RULE} Every other fair reading is a labelled row "
             "of `verdicts.csv` beside it (claim text `... -- reading: LABEL`; columns `reading`, "
             "`headline`).", "",
             "| figure | claim | reading | headline | decided on | why |", "|---|---|---|---|---|---|"]
    def cell(text) -> str:
        return str(text).replace("|", "\\|")

    for c in CLAIMS:
        for r in c.readings:
            lines.append(f"| {c.figure} | {cell(c.text)} | {cell(r.label)} | "
                         f"{'yes' if r.headline else 'no'} | {cell(r.compared)} | {cell(r.why)} |")
    lines += ["", "**Open parameters.** Each moves over its range with the others at the "
              "experiment's default; the maps " + ", ".join(f"{x} x {y} ({e})" for e, x, y in MAPS)
              + " cover the full grid. Verdicts are Holm-adjusted over every distinct test of the "
              "sweep (family-wise error 5%).", "",
              "| experiment | parameter | range | default | why this range |", "|---|---|---|---|---|"]
    lines += [f"| {r.experiment} | `{r.parameter}` | {_fmt_values(r.values)} | {r.default:g} | "
              f"{cell(r.why)} |" for r in RANGES]
    lines += ["", "**Robustness** (column `robustness`, per reading): `robust` -- holds at every "
              "setting; `holds only for X in {...} (...)` -- where it holds, per parameter "
              "(parameters where it holds throughout are not listed), then each map's count of "
              "cells, then `at no value of X (...)` for the parameters where it holds at none; `never holds: ...`; `fails "
              "throughout`; `inconclusive throughout`; `not swept` -- the row's set-up has no "
              "declared range:", ""]
    lines += [f"- {fig}: {why}." for fig, why in NOT_SWEPT_WHY.items()]
    lines += ["",
              "**Premises.** Lemma 'Multimodal Reduction' needs separation, min_(i != j) "
              "||mu*_i - mu*_j|| > 2 (tau + R_max + eps_max), and coverage, tau_m >= R_max + "
              "eps_(K,m) for every m (R_max: the largest distance of a domain mean from its mode); "
              "`multimodal_premise` checks both at every K and the multimodal rows print the "
              "shares of K meeting each. Its non-deterioration conclusion is tested on the Lemma's "
              "own terms in a set-up meeting both (row '... under the Lemma's premise').", "",
              "**Counted apart.** Illustrations (cannot fail; `kind` = illustration):"]
    lines += [f"- {i.figure}: '{i.prefix}...' -- {i.why}." for i in ILLUSTRATIONS]
    lines += ["", "Outside the premise (`kind` = outside premise):"]
    lines += [f"- {i.figure}: '{i.prefix}' -- {i.why}." for i in OUTSIDE_PREMISE]
    lines += ["", "The project's own questions (`source` = ours) are counted apart from the paper's "
              "claims."]
    return "\n".join(lines) + "\n"
