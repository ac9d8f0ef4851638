"""Claims audit: ``python -m poolsim.audit [--out FILE] [--seeds S]`` writes ``docs/claims.md``.

One row per numbered claim of the paper: what was checked, the measured figure (Monte-Carlo means
with 95% Student-t intervals over replications, or counts of exhaustive random checks) and a
verdict: *holds*, *holds under an extra condition (named)* or *does not hold (counterexample)*.
All randomness comes from fixed seeds; the numbers change only with ``--seeds``.
Thm 4 and the multimodal Lemma reuse the simulations of the ``flow_bridge`` and ``multimodal``
figure modules (one small flow fit, 200 Adam steps; the quick multimodal run). Monte-Carlo
verdicts use the project's one rule, :func:`poolsim.decide_claim` (three outcomes); each row names
the kind of evidence it is, and rows that cannot fail (identities, properties true by
construction) are labelled as not counting as evidence.
"""
from __future__ import annotations

import argparse
import math
import sys
from typing import Callable, NamedTuple

import numpy as np

from ._io import atomic_write_text

SIGMA = 0.8  # the paper's synthetic sigma (Appendix)
HIGH_P = 0.9  # "with high probability" / "non-deterioration regime": a share >= 0.9 (our cut)
HOLDS, DOES_NOT = "holds", "does not hold"


class Row(NamedTuple):
    claim: str
    checked: str
    measured: str
    verdict: str
    kind: str = ("Monte Carlo estimates with 95% intervals vs the stated value; verdict by the "
                 "named condition or counterexample")  # what sort of evidence the row is (KINDS)


MC = "Monte Carlo: 95% t interval, three-way rule (poolsim.decide_claim)"
EXPLICIT = "explicit counterexample (exact arithmetic)"
RANDOM = "exhaustive random check + hypothesis property tests"
NUMERIC = "numerical integration (theory.match_limit)"
NOT_EVIDENCE = "cannot fail (identity / true by construction): not counted as evidence"
EXISTENCE = "existence claim: not checkable by simulation"
REDUCTION = "reduction to another row (no separate check)"
KINDS = (MC, EXPLICIT, RANDOM, NUMERIC, NOT_EVIDENCE, EXISTENCE, REDUCTION, Row._field_defaults["kind"])


def _ci(est, digits: int = 3) -> str:
    """``mean [lo, hi]``: 95% Student-t interval (n - 1 dof) from an ``_mc.Estimate`` (scalar)."""
    from scipy import stats

    m, h = float(est.mean), float(stats.t.ppf(0.975, est.n - 1)) * float(est.se)
    return f"{m:.{digits}f} [{m - h:.{digits}f}, {m + h:.{digits}f}]"


def _v(v) -> str:
    """A :class:`poolsim.Verdict` as ``estimate [lo, hi] (n=...)`` (no interval below 30)."""
    if math.isnan(v.ci_low):
        return f"{v.estimate:.3f} (n={v.n_seeds}: too few for an interval)"
    return f"{v.estimate:.3f} [{v.ci_low:.3f}, {v.ci_high:.3f}] (n={v.n_seeds})"


def _prop(k: int, n: int) -> str:
    p = k / n
    h = 1.96 * math.sqrt(max(p * (1 - p), 0.25 / n) / n)
    return f"{p:.3f} [{max(p - h, 0):.3f}, {min(p + h, 1):.3f}] (n={n})"


class Context:
    """Shared simulations, computed once and reused by several rows."""

    def __init__(self, seeds: int):
        import jax

        jax.config.update("jax_enable_x64", True)
        self.seeds = seeds
        self.big = max(8, seeds // 50)
        self._cache: dict = {}

    def get(self, name: str, fn: Callable):
        if name not in self._cache:
            self._cache[name] = fn()
        return self._cache[name]


# --------------------------------------------------------------------------- simulations
def _finite_K(ctx: Context, kind: str):
    """Paper's symmetric experiment: K = 15, N = 20, d = 2, tau = 1, m = 5, n = 10, c0 = mu*."""
    import jax
    import jax.numpy as jnp

    from . import _mc, metadist

    md = {"symmetric": metadist.symmetric_gaussian(1.5, d=2),
          "skewed": metadist.skewed(1.0, d=2)}[kind]
    X = _mc.domains(md, 100, ctx.seeds, 16, 20, SIGMA)
    # the true domain means _mc.domains drew (same key split), for Thm 3's eps_K = ||mu_bar_K - mu*||
    mu = np.asarray(md(jax.random.split(jax.random.key(100))[0], ctx.seeds * 16)).reshape(
        ctx.seeds, 16, 2)
    keys = jax.random.split(jax.random.key(101), ctx.seeds)
    pooled, sub, matched, _ = _mc.estimates(X[:, :15], keys, 1.0, jnp.zeros(2), m=5, n=10)
    sub = np.asarray(sub).mean(axis=1)
    sub_next = np.asarray(_mc.subsample_points(X, jax.random.split(jax.random.key(102), ctx.seeds),
                                               m=5, n=10)).mean(axis=1)
    return md, {"pool": np.asarray(pooled), "subsample": np.asarray(sub),
                "match": np.asarray(matched), "subsample_next": sub_next,
                "eps_K": np.linalg.norm(mu[:, :15].mean(axis=1) - md.mu_star, axis=1)}


def _large_K(ctx: Context, kind: str):
    """K = 3000 domains, N = 20, d = 1, tau = 1, median init; m = K/2 subsampled with n = 5."""
    import jax

    from . import _mc, metadist

    md = {"symmetric": metadist.symmetric_gaussian(1.0, d=1), "skewed": metadist.skewed(1.0, d=1)}[kind]
    K = 3000
    X = _mc.domains(md, 200, ctx.big, K, 20, SIGMA)
    keys = jax.random.split(jax.random.key(201), ctx.big)
    pooled, pts, matched, inc = _mc.estimates(X, keys, 1.0, None, m=K // 2, n=5)
    pts = np.asarray(pts)[..., 0]
    flat = np.asarray(X).reshape(ctx.big, -1)
    z = (flat - flat.mean(axis=1, keepdims=True)) / flat.std(axis=1, keepdims=True)
    return md, {"pool_var": _mc.pooled_cov(X)[:, 0, 0], "sub_var": pts.var(axis=1),
                "match_var": _mc.pooled_cov(X, inc)[:, 0, 0], "match_c": np.asarray(matched)[:, 0],
                "pool_skew": (z ** 3).mean(axis=1)}


# --------------------------------------------------------------------------- rows
def thm1(ctx: Context):
    from . import _mc, theory

    md, sk = ctx.get("largeK_skewed", lambda: _large_K(ctx, "skewed"))
    want = float(theory.pool_limit(md, sigma=SIGMA).cov[0, 0])
    skew_true = 2 * 1.0 / want ** 1.5  # third cumulant of scale (E - 1) is 2 scale^3
    pool, sub, skew = (_mc.mean_se(sk[k]) for k in ("pool_var", "sub_var", "pool_skew"))
    rows = [Row("Thm 1(a) naive pooling -> N(mu*, sigma^2 I + Sigma_mu)",
                f"skewed(1) d=1, K=3000, N=20, {ctx.big} reps: variance and skewness of the pooled "
                "samples",
                f"var {_ci(pool)} vs sigma^2+Sigma_mu = {want:.3f}; skewness {_ci(skew)} "
                f"(mixture law: {skew_true:.3f}, a Gaussian: 0)",
                "holds under an extra condition (mean/covariance always; the limit is Gaussian only "
                "if D_mu is Gaussian -- otherwise the mixture E N(mu, sigma^2 I))"),
            Row("Thm 1(b) subsampling (fixed n) -> N(mu*, sigma^2 I + Sigma_mu)",
                "same data, m = K/2 = 1500 domains, n = 5: variance of the m n points",
                f"var {_ci(sub)} vs {want:.3f}",
                "holds under an extra condition (m -> infinity with K; same Gaussian caveat as (a))")]
    md_s, sy = ctx.get("largeK_symmetric", lambda: _large_K(ctx, "symmetric"))
    lim = theory.match_limit(md_s, sigma=SIGMA, tau=1.0, N=20)
    lim_sk = theory.match_limit(md, sigma=SIGMA, tau=1.0, N=20)
    v, vs, cs = _mc.mean_se(sy["match_var"]), _mc.mean_se(sk["match_var"]), _mc.mean_se(sk["match_c"])
    rows.append(Row(
        "Thm 1(c) matching at fixed tau -> N(mu*, sigma^2 I)",
        "K=3000, N=20, tau=1, median init: matched-sample variance and centroid vs "
        "theory.match_limit (fixed point of the K->inf iteration) and vs the paper's sigma^2",
        f"symmetric gamma=1: var {_ci(v)}, match_limit {lim.cov[0, 0]:.3f} ({lim.method}), paper "
        f"{SIGMA ** 2:.2f}; skewed(1): centroid {_ci(cs)} (match_limit {lim_sk.centroid[0]:.3f}, "
        f"mu* = 0), var {_ci(vs)} (match_limit {lim_sk.cov[0, 0]:.3f})",
        f"{DOES_NOT} at fixed tau (counterexample: symmetric_gaussian gamma=1, sigma=0.8, tau=1: "
        f"limit covariance sigma^2 + Cov(mu | |mu - c*| < tau) = {lim.cov[0, 0]:.3f}, not 0.64; "
        "for skewed D_mu the premise c_n -> mu* fails too). Holds only as tau -> 0 "
        "(with K tau^d -> infinity)"))
    return rows


UNBIASED = 0.1  # "unbiased": every coordinate of E[estimate - mu*] within +-0.1 (ours; gamma = 1.5)


def _unbiased(est: np.ndarray):
    """``est (S, d)`` estimates (mu* = 0): per-coordinate equivalence verdicts and their text."""
    from . import _verdict

    vs = [_verdict.within(est[:, i], margin=UNBIASED) for i in range(est.shape[1])]
    v, _ = _verdict.all_of(vs)
    return v, ", ".join(f"coord {i}: {_v(x)}" for i, x in enumerate(vs))


def thm2(ctx: Context):
    _, est = ctx.get("finiteK_symmetric", lambda: _finite_K(ctx, "symmetric"))
    rows = []
    rule = (f"; unbiased = every coordinate's 95% interval of E[estimate] inside +-{UNBIASED} "
            "(ours)")
    for part, name, what in (("a", "pool", "naive pooling"), ("b", "subsample", "subsampling (m=5, n=10)"),
                             ("c", "match", "matching, c0 = mu*, tau = 1, L2")):
        v, text = _unbiased(est[name])
        extra = ("" if part != "c" or v.verdict != HOLDS else
                 " (the proof's 'selected set is symmetric' is false pathwise; unbiasedness follows "
                 "from reflection equivariance)")
        rows.append(Row(f"Thm 2({part}) {what} unbiased under symmetric D_mu",
                        f"symmetric_gaussian gamma=1.5, d=2, K=15, N=20, {v.n_seeds} reps: mean of "
                        "the estimate (mu* = 0)" + rule, text, v.verdict + extra, MC))
    _, skw = ctx.get("finiteK_skewed", lambda: _finite_K(ctx, "skewed"))
    cells = {name: _unbiased(skw[name]) for name in ("pool", "subsample")}
    verdict = _all([c[0] for c in cells.values()])
    rows.append(Row("Thm 2(a),(b) need only E mu = mu*, not symmetry (pooling and subsampling are "
                    "linear in the domain means)",
                    "skewed(1) d=2 (asymmetric, E mu = mu* = 0), K=15, N=20, m=5, n=10, "
                    f"{ctx.seeds} reps: mean of the estimate" + rule,
                    "; ".join(f"{'pooling' if k == 'pool' else 'subsampling'}: {t}"
                              for k, (_, t) in cells.items()),
                    verdict + " (E[mean of domain means] = E mu by linearity; symmetry is needed "
                    "only for matching, Thm 2(c))", MC))
    rows.append(_takeaway(ctx))
    return rows


def _all(vs) -> str:
    """The verdict of a claim that needs every part (:func:`poolsim._verdict.all_of`)."""
    from . import _verdict

    return _verdict.all_of(vs)[0].verdict


def _bimodal(a: float = 1.5, gamma: float = 0.3):
    """Symmetric bimodal D_mu in d = 1: ``mu = +-a + gamma z`` with equal weights (mu* = 0)."""
    import jax
    import jax.numpy as jnp

    from . import metadist

    def sample(key, K):
        k1, k2 = jax.random.split(key)
        sign = jnp.where(jax.random.bernoulli(k1, 0.5, (K, 1)), 1.0, -1.0)
        return a * sign + gamma * jax.random.normal(k2, (K, 1))

    return metadist.from_callable(sample, d=1, name="symmetric_bimodal", symmetric=True,
                                  mean=0.0, cov=[[a ** 2 + gamma ** 2]])


def _takeaway(ctx: Context) -> Row:
    """Thm 2 takeaway inside its premise: symmetric (bimodal) D_mu, c0 != mu*, several tau."""
    from . import theory

    md = ctx.get("bimodal", _bimodal)
    taus, c0 = (0.5, 1.0, 2.0, 4.0, 16.0), 1.0
    lim = {t: theory.match_limit(md, sigma=SIGMA, tau=t, init=np.array([c0]), key=800)
           for t in taus}
    at_mu = {t: theory.match_limit(md, sigma=SIGMA, tau=t, init=np.zeros(1), key=801)
             for t in (0.5, 2.0)}
    hit = [t for t in taus if abs(float(lim[t].centroid[0])) < 0.05]
    return Row(
        "Thm 2 takeaway: under symmetric D_mu, even if c0 != mu*, an appropriate tau makes the "
        "matched mean converge to mu*",
        f"inside the premise: symmetric bimodal D_mu (mu = +-1.5 + 0.3 z, equal weights, d=1, "
        f"mu* = 0), sigma={SIGMA}, c0 = {c0} (a point between mu* and a mode); K -> inf fixed point "
        f"c*(tau) (theory.match_limit, {lim[taus[0]].method})",
        "c*(tau) from c0 = 1: " + ", ".join(f"tau={t:g}: {float(lim[t].centroid[0]):.3f}"
                                            for t in taus)
        + "; from c0 = mu*: " + ", ".join(f"tau={t:g}: c* {float(v.centroid[0]):.3f}, limit var "
                                         f"{float(v.cov[0, 0]):.3f}" for t, v in at_mu.items())
        + f" (pooling: var {SIGMA ** 2 + 1.5 ** 2 + 0.3 ** 2:.3f})",
        ("holds under an extra condition (tau large enough to straddle both modes: c*(tau) = mu* "
         f"only for tau in {{{', '.join(f'{t:g}' for t in hit)}}}; smaller tau locks onto the "
         "nearer mode). 'Appropriate tau' is met trivially by tau -> inf, i.e. naive pooling; and "
         "tau changes the limit covariance even under symmetry (var above)") if hit and
        len(hit) < len(taus) else ("holds" if hit else DOES_NOT),
        NUMERIC)


def thm3(ctx: Context):
    import jax

    from . import _core, _mc, metadist, theory

    rows = []
    # (1) naive pooling: projection bound is deterministic; Theta(1) jumps under Assumption 2?
    md = metadist.contaminated(0.3, 2.5, d=2)
    Kmax, S = 1001, max(200, ctx.seeds // 5)
    mu = np.asarray(md(jax.random.key(300), S * Kmax)).reshape(S, Kmax, 2)
    bar = np.cumsum(mu, axis=1) / np.arange(1, Kmax + 1)[None, :, None]
    eps = np.linalg.norm(bar - md.mu_star, axis=-1)
    jump = {K: eps[:, K] - eps[:, K - 1] for K in (10, 100, 1000)}
    bound_ok = all(np.all(jump[K] <= np.linalg.norm(mu[:, K] - bar[:, K - 1], axis=1) / (K + 1) + 1e-12)
                   for K in jump)
    setup = (f"contaminated p=0.3, alpha=2.5, d=2, {S} streams of K up to 1000: per-step change "
             "eps_(K+1) - eps_K of the pooled mean")
    rows.append(Row(
        "Thm 3(1) naive pooling lower bound eps_(K+1) >= K/(K+1) eps_K + xi_(K+1)/(K+1)",
        "deterministic projection step of the proof: hypothesis property test over random "
        "sequences of means; " + setup,
        f"no violation; every jump <= ||mu_(K+1) - bar mu_K||/(K+1): {bound_ok}", HOLDS,
        NOT_EVIDENCE + " (the triangle inequality for a running mean)"))
    rows.append(Row(
        "Thm 3(1) naive pooling: Theta(1) per-step jumps eps_(K+1) >= eps_K + Theta(1) with "
        "constant probability", setup,
        "P(jump > 0.1): " + ", ".join(f"K={K}: {_prop(int(np.sum(j > 0.1)), j.size)}" for K, j in
                                      jump.items()) + f"; max jump at K=1000: {jump[1000].max():.4f}",
        f"{DOES_NOT} under Assumption 2 (counterexample above: a step moves the mean by "
        "||mu_(K+1) - bar mu_K||/(K+1); a Theta(1) jump needs ||mu_(K+1)|| = Omega(K), probability "
        "<= C exp(-beta K) by 2(b); the proof itself yields only (c - eps_K)/(K+1))"))
    # (2) subsampling: E[eps_{K+1}^2] <= eps_K^2 + lambda_max/m + d sigma^2/(m n), with the
    # theorem's own eps_K = ||mean of the first K domain means - mu*||
    from . import _verdict

    mds, est = ctx.get("finiteK_symmetric", lambda: _finite_K(ctx, "symmetric"))
    e2_next = np.sum(est["subsample_next"] ** 2, axis=1)
    lam = float(np.linalg.eigvalsh(mds.cov).max())
    bound = lam / 5 + 2 * SIGMA ** 2 / 50
    slack = e2_next - (est["eps_K"] ** 2 + bound)
    v = _verdict.decide(slack, threshold=0.0, side="less")
    tr = float(np.trace(mds.cov))
    mse = theory.mse_subsample(mds, sigma=SIGMA, m=5, n=10, N=20)
    rows.append(Row(
        "Thm 3(2) subsampling: E[eps_{K+1}^2] <= eps_K^2 + lambda_max(Sigma)/m + d sigma^2/(m n)",
        f"symmetric_gaussian gamma=1.5, d=2, K=15 -> 16, m=5, n=10, N=20, {ctx.seeds} reps; the "
        "theorem's eps_K = ||mean of the first K true domain means - mu*||, eps_(K+1) the "
        "subsampling estimate's error: per rep eps_(K+1)^2 - eps_K^2 - bound, claim: mean < 0",
        f"E[eps_(K+1)^2 - eps_K^2 - bound] = {_v(v)}; E[eps_(K+1)^2] = "
        f"{_ci(_mc.mean_se(e2_next))} (theory.mse_subsample {mse:.3f}); bound with lambda_max: "
        f"{bound:.3f}, with Tr Sigma_mu: {tr / 5 + 2 * SIGMA ** 2 / 50:.3f}",
        v.verdict + (" (d = 2: the proof's Tr Sigma <= lambda_max step is wrong for d > 1; with "
                     "Tr Sigma_mu in place of lambda_max the inequality has room)"
                     if v.verdict == DOES_NOT else ""), MC))
    # (3) matching: running-mean steps, non-deterioration probability
    mdm = metadist.symmetric_gaussian(1.0, d=2)
    S3, steps = max(200, ctx.seeds // 5), 600
    stream = np.asarray(mdm(jax.random.key(301), S3 * steps)).reshape(steps, S3, 2)
    c, cnt = np.zeros((S3, 2)), np.zeros(S3)
    better = {k: [np.zeros(S3), np.zeros(S3)] for k in ("|S| 20-60", "|S| 200-400")}
    worst = 0.0
    for k in range(steps):
        x = stream[k]
        e_before = np.linalg.norm(c, axis=1)
        c_new, cnt_new, acc = _core.running_update(c, cnt, x, 1.0, "l2")
        moved = np.linalg.norm(c_new - c, axis=1)
        worst = max(worst, float(np.max(moved * (cnt + 1))))  # <= tau / m_M = 1
        cond = (acc > 0) & (np.linalg.norm(x, axis=1) <= e_before + 1.0)
        for key, (lo, hi) in (("|S| 20-60", (20, 60)), ("|S| 200-400", (200, 400))):
            sel = cond & (cnt >= lo) & (cnt <= hi)
            better[key][0] += sel & (np.linalg.norm(c_new, axis=1) <= e_before)
            better[key][1] += sel
        c, cnt = c_new, cnt_new
    setup = (f"running-mean matching (the proof's update), symmetric_gaussian gamma=1, d=2, tau=1, "
             f"L2, c0 = mu*, {S3} streams x {steps} domains")
    rows.append(Row(
        "Thm 3(3) matching: excluded -> eps unchanged (+ noise); included -> eps_(K+1) <= eps_K + "
        "tau/(m_M(|S_K|+1)) (+ noise)", setup + "; hypothesis property tests of single steps",
        f"max step x (|S|+1) m_M / tau = {worst:.4f} (<= 1)",
        "holds under an extra condition (the running-mean update of the proof; Def. 3 re-run to a "
        "fixed point after adding a domain can jump Theta(1): 200 domains at 0, 200 at 1.001, "
        "tau=1, add one at 0.9 -> the warm-started centroid moves 0.5, bound 0.005)",
        NOT_EVIDENCE + " for the running-mean update (an accepted step moves c by ||x - c||/(|S|+1) "
        "< tau/(|S|+1) identically); the Def. 3 counterexample is " + EXPLICIT))
    shares = {k: np.where(v[1] > 0, v[0] / np.maximum(v[1], 1), np.nan) for k, v in better.items()}
    nd = {k: _verdict.decide(v, threshold=HIGH_P) for k, v in shares.items()}
    rows.append(Row(
        "Thm 3(3) matching: if M(mu_(K+1) - mu*) <= eps_K + tau/L_M then P(eps_(K+1) <= eps_K) >= "
        "1 - exp(-Omega(|S_K|))",
        setup + "; steps where the new domain is accepted and meets the condition; per stream "
        f"the share with eps_(K+1) <= eps_K, claim: mean share >= {HIGH_P} ('high probability', "
        "our cut)",
        "P(non-deterioration), mean over streams: " + "; ".join(f"{k}: {_v(v)}"
                                                                for k, v in nd.items()),
        _all(nd.values()) + " (the probability stays near 1/2 as |S_K| grows; e.g. eps_K = 0: any "
        "accepted mu != mu* increases the error)", MC))
    rows.append(_corollary_conclusion(ctx))
    rows.append(Row(
        "Table 'theoretical_comparison' (error dynamics)",
        "rows of Thm 3 above",
        "see Thm 3(1)-(3)",
        f"{DOES_NOT} as a whole: naive pooling's Theta(1) worst case fails (O(1/K) under "
        "Assumption 2); subsampling's Omega(1/m) worst case holds (one outlier at distance c moves "
        "the mean by c/m); matching's O(1/|S_K|) holds for the running-mean update only; matching's "
        "'non-deterioration w.h.p.' fails", REDUCTION))
    return rows


def _corollary_conclusion(ctx: Context) -> Row:
    """Corollary 'optimal tau', closing sentence: tau slightly above L_M eps_K -> non-deterioration.
    Running-mean matching (L2, L_M = 1) started at the mean of 20 domains; before every step
    tau = 1.1 eps_K with the current eps_K (the corollary's choice, oracle knowledge of mu*)."""
    import jax

    from . import _core, _verdict, metadist

    md = metadist.contaminated(0.3, 2.5, d=2)
    S, warm, steps = max(200, ctx.seeds // 5), 20, 400
    mu = np.asarray(md(jax.random.key(310), S * (warm + steps))).reshape(S, warm + steps, 2)
    c, cnt = mu[:, :warm].mean(axis=1), np.full(S, float(warm))
    hit, acc_n = np.zeros(S), np.zeros(S)
    for k in range(warm, warm + steps):
        e = np.linalg.norm(c - md.mu_star, axis=1)
        c, cnt, acc = _core.running_update(c, cnt, mu[:, k], 1.1 * e, "l2")
        acc = np.asarray(acc) > 0
        hit += acc & (np.linalg.norm(c - md.mu_star, axis=1) <= e)
        acc_n += acc
    share = np.where(acc_n > 0, hit / np.maximum(acc_n, 1), np.nan)
    v = _verdict.decide(share, threshold=HIGH_P)
    return Row(
        "Corollary 'optimal tau', conclusion: choosing tau slightly above L_M eps_K yields a "
        "non-deterioration regime",
        f"contaminated p=0.3, alpha=2.5, d=2, {S} streams: running-mean matching (L2, L_M = 1) "
        f"started at the mean of {warm} domains, then {steps} domains, tau = 1.1 eps_K reset "
        "before every step (needs mu*: an oracle choice); per stream the share of ACCEPTED steps "
        f"with eps_(K+1) <= eps_K (rejected steps leave eps unchanged and are not counted: with a "
        f"small tau most steps are rejected, which is no evidence), claim: >= {HIGH_P} (our cut)",
        f"share of accepted steps without deterioration {_v(v)}; accepted per stream "
        f"{float(np.mean(acc_n)):.1f} of {steps}",
        v.verdict + " (an accepted domain lies within 1.1 eps_K of the centroid, not necessarily "
        "closer to mu* than the centroid: (a), (b) bound inclusion, not the direction of the step)"
        if v.verdict != HOLDS else v.verdict, MC)


def corollaries(ctx: Context):
    import jax
    import jax.numpy as jnp

    from . import _core, _strategies, metadist, theory

    rng = np.random.default_rng(400)
    n = 20_000
    viol, checked = {}, {}
    cases = [("l2", 1.0, "l2", 0.0, math.pi), ("0.5*l2", 0.5, "l2", 0.0, math.pi),
             ("geodesic cap pi/2", 1.0, "geodesic", 0.0, math.pi / 2),
             ("cosine annulus [0.3, 2]", 1.0, "cosine", 0.3, 2.0)]
    for name, s, metric, t0, t1 in cases:
        m, L = (s, s) if metric == "l2" else theory.cap_constants(metric, t1, theta_min=t0)
        c = rng.normal(size=(n, 3))
        if metric == "l2":
            x = rng.normal(size=(n, 3)) * 2
        else:
            c /= np.linalg.norm(c, axis=1, keepdims=True)
            w = rng.normal(size=(n, 3))
            w -= np.sum(w * c, axis=1, keepdims=True) * c
            w /= np.linalg.norm(w, axis=1, keepdims=True)
            t = rng.uniform(t0, t1, size=(n, 1))
            x = np.cos(t) * c + np.sin(t) * w
        star = c + rng.normal(size=(n, 3)) * rng.uniform(0, 0.5, size=(n, 1))
        eps, r = np.linalg.norm(c - star, axis=1), np.linalg.norm(x - star, axis=1)
        M = s * np.asarray(_core.distance(x, c, metric))
        tau = rng.uniform(0.05, 3.0, size=n)
        a = r > eps + tau / m
        b = r < tau / L - eps
        viol[name] = (int(np.sum(a & (M <= tau))), int(np.sum(b & (M >= tau))))
        checked[name] = (int(a.sum()), int(b.sum()))
    setup = (f"{n} random (mu*, c_K, mu, tau) per metric; constants from theory.cap_constants "
             "(cosine has no m_M > 0 near angle 0: an annulus of angles); hypothesis property tests")
    rows = [Row("Corollary 'optimal tau' (a) safe exclusion: ||mu - mu*|| > eps_K + tau/m_M => rejected",
                setup, "; ".join(f"{k}: {viol[k][0]} violations / {checked[k][0]}" for k in viol),
                f"{HOLDS} (cosine/geodesic: for unit vectors on a cap, see theory.cap_constants)",
                RANDOM),
            Row("Corollary 'optimal tau' (b) guaranteed inclusion: ||mu - mu*|| <= tau/L_M - eps_K => "
                "accepted", setup,
                "; ".join(f"{k}: {viol[k][1]} violations / {checked[k][1]}" for k in viol)
                + " (strict premise); boundary: L2, c_K = mu*, ||mu - mu*|| = tau = 1 -> M = tau, rejected",
                f"{HOLDS} (the boundary case ||mu - mu*|| = tau/L_M - eps_K with M = tau exactly is "
                "rejected by the strict gate of Def. 3, M < tau: a measure-zero event, not a "
                "failure)", RANDOM)]
    # exchangeability
    X = np.asarray(metadist.contaminated(0.3, 3.0, d=2)(jax.random.key(401), 8))[:, None, :] \
        + 0.3 * rng.normal(size=(8, 5, 2))
    diffs = []
    for _ in range(50):
        p = rng.permutation(8)
        diffs.append(np.abs(_strategies.naive_pool(X).mean - _strategies.naive_pool(X[p]).mean).max())
        a, b = _strategies.match(X, 1.0), _strategies.match(X[p], 1.0)
        diffs.append(np.abs(np.asarray(a.mean) - np.asarray(b.mean)).max())
    from scipy import stats

    draw = jax.jit(jax.vmap(lambda k, x: _strategies.subsample(k, x, 3, 2).mean[0], in_axes=(0, None)))
    p = rng.permutation(8)
    ks = stats.ks_2samp(np.asarray(draw(jax.random.split(jax.random.key(402), 3000), jnp.asarray(X))),
                        np.asarray(draw(jax.random.split(jax.random.key(403), 3000), jnp.asarray(X[p]))))
    # order dependence of the sequential rules: running mean (Thm 3 proof) and EMA (AD method)
    xbar = X.mean(axis=1)  # (8, d) domain means, processed one by one
    c0 = np.median(X.reshape(-1, 2), axis=0)  # order-free start
    finals: dict[str, list] = {"running mean": [], "EMA alpha=0.5": []}
    for _ in range(50):
        p = rng.permutation(8)
        c, cnt = c0.copy(), np.asarray(1.0)
        ce = c0.copy()
        for x in xbar[p]:
            c, cnt, _ = (np.asarray(a) for a in _core.running_update(c, cnt, x, 1.0, "l2"))
            if np.linalg.norm(x - ce) < 1.0:
                ce = np.asarray(_core.ema_update(ce, x, 0.5, renormalize=False))
        finals["running mean"].append(c)
        finals["EMA alpha=0.5"].append(ce)

    def spread(cs):
        cs = np.stack(cs)
        distinct = len({tuple(np.round(c, 9)) for c in cs})
        far = max(np.linalg.norm(a - b) for a in cs for b in cs)
        return f"{distinct} distinct centroids / 50 orders, max distance {far:.3f}"

    rows.append(Row("Corollary exchangeability (a) pooling, (b) subsampling",
                    "50 random permutations of 8 domains (pooling: pointwise); subsampling: KS "
                    "test of 3000 vs 3000 draws; hypothesis property tests",
                    f"max |difference| pooling = {max(diffs[0::2]):.1e}; subsampling KS "
                    f"p = {ks.pvalue:.2f}", HOLDS,
                    NOT_EVIDENCE + " (symmetric functions of the domains by definition; the KS "
                    "test checks the code)"))
    rows.append(Row("Corollary exchangeability (c) matching",
                    "same 8 domains (contaminated p=0.3, alpha=3), tau=1, L2: Def. 3's batch fixed "
                    "point (median init) vs the sequential rules applied domain by domain in 50 "
                    "random orders from the same order-free start (coordinate-wise median): the "
                    "running-mean update of the Thm 3 proof, and the AD method's EMA (alpha = 0.5, "
                    "Euclidean, accept iff ||xbar - c|| < tau)",
                    f"batch fixed point: max |difference| = {max(diffs[1::2]):.1e}; "
                    + "; ".join(f"{k}: {spread(v)}" for k, v in finals.items()),
                    "holds under an extra condition (the batch fixed point of Def. 3 only: it is a "
                    "symmetric function of the domains. The running-mean rule of the Thm 3 proof "
                    "and the EMA rule of the AD method depend on the order, see the distinct "
                    "centroids)", NOT_EVIDENCE + " for the batch fixed point; the order "
                    "dependence is an " + EXPLICIT))
    return rows


def example1(ctx: Context):
    import jax

    from . import _mc, metadist

    p, c, K = 0.1, 5.0, 20_000
    md = metadist.contaminated(p, c, d=1, gamma=0.0)
    reps = max(4, ctx.seeds // 100)
    mu = np.asarray(md(jax.random.key(500), reps * K)).reshape(reps, K)
    e = _mc.mean_se(mu.mean(axis=1))
    K0 = 10
    mu2 = np.asarray(md(jax.random.key(501), 2000 * K0)).reshape(2000, K0)
    hit = np.any(mu2 > 0, axis=1)
    setup = "mu_k = mu* + c w.p. p, else mu* (p=0.1, c=5, mu*=0)"
    return [Row("Example 1: P(at least one of K domains at mu*+c) = 1-(1-p)^K",
                f"{setup}; 2000 reps of K={K0}",
                f"{_prop(int(hit.sum()), hit.size)} vs 1-(1-p)^10 = {1 - (1 - p) ** K0:.3f}", HOLDS,
                NOT_EVIDENCE + " (an identity for i.i.d. draws; the simulation checks the code)"),
            Row("Example 1: LLN gives (1/K) sum mu_k -> mu* a.s.", f"{setup}; {reps} reps of K={K}",
                f"(1/K) sum mu_k = {_ci(e)}",
                f"{DOES_NOT} (counterexample above: the LLN gives E mu = mu* + p c = {p * c:.2f}; the "
                "example also contradicts Assumption 2(a) E mu = mu*)")]


def matched_set(ctx: Context):
    import jax

    from . import _core, _mc, metadist, theory

    rows = [Row("Matched-set property 1: S(tau1) subset of S(tau2) for tau1 < tau2",
                "fixed centroid: hypothesis tests; Def. 3 fixed point: explicit 1-D configuration",
                "fixed centroid: no violation; fixed point: init 0, means {0, 1.05 x100, 2.1 x100}: "
                "S(0.5) = {0}, S(1.1) excludes 0",
                f"{HOLDS} (the property is stated for a fixed centroid c_n, where it is immediate. "
                "Note: the fixed point of the Def. 3 iteration is not monotone in tau, its centroid "
                "moves with tau -- see the configuration)", RANDOM)]
    # properties 2 and 4 with M = 0.5 ||.||: the explicit counterexample
    s, tau = 0.5, 1.0
    pts, c = np.array([[-1.5], [1.5]]), np.zeros(1)
    inc = np.asarray(_core.gate(s * _core.distance(pts, c, "l2"), tau))
    gap = abs(np.abs(pts[inc > 0, 0]).mean() - 0.0)
    var = float(np.var(pts[inc > 0, 0]))
    rows.append(Row("Matched-set property 2: |mean ||x|| - ||c_n||| <= L_M tau",
                    "hypothesis search over random sets + explicit case, M = 0.5 ||.|| "
                    "(m_M = L_M = 0.5), tau = 1, c = 0, S = {-1.5, +1.5} (M = 0.75 < tau)",
                    f"gap = {gap:.2f} > L_M tau = 0.5; valid bound tau/m_M = 2",
                    f"{DOES_NOT} (counterexample above; the proof uses ||v|| <= L_M M(v), the wrong "
                    "direction). Valid: tau/m_M; the paper's constant suffices iff L_M m_M >= 1",
                    EXPLICIT))
    # property 3: slopes
    slopes = []
    for d in (1, 2, 3):
        md, n = metadist.symmetric_gaussian(1.0, d=d), 100_000
        taus = np.geomspace(0.1, 0.3, 5)
        draws = np.asarray(md(jax.random.key(600 + d), n * 5)).reshape(5, n, d)
        counts = [np.sum(np.asarray(_core.gate(_core.distance(x, np.zeros(d), "l2"), t)))
                  for x, t in zip(draws, taus)]
        slope, se, exact = _mc.loglog_slope(taus, counts, n, [theory.ball_mass(md, t) for t in taus])
        h = 1.96 * se
        slopes.append(f"d={d}: {slope:.3f} [{slope - h:.3f}, {slope + h:.3f}] (exact curve "
                      f"{exact:.3f})")
    rows.append(Row("Matched-set property 3: P(M(X - c_n) < tau) ~ tau^d (geometric decay)",
                    "symmetric_gaussian gamma=1, c = mu*, tau in [0.1, 0.3], 1e5 independent draws "
                    "per tau: weighted log-log slope", "; ".join(slopes),
                    "holds (continuous positive density at c_n)"))
    rows.append(Row("Matched-set property 4: matched variance <= (L_M tau)^2",
                    "same counterexample as property 2",
                    f"variance = {var:.2f} > (L_M tau)^2 = 0.25; valid bound (tau/m_M)^2 = 4",
                    f"{DOES_NOT} (counterexample above); valid constant (tau/m_M)^2", EXPLICIT))
    return rows


def robustness(ctx: Context):
    from . import metadist, theory

    from scipy import optimize, stats

    md = metadist.skewed(1.0, d=1)
    cs = {t: float(theory.match_limit(md, sigma=SIGMA, tau=t).centroid[0]) for t in (0.5, 1.0, 2.0)}
    law = stats.exponnorm(1.0 / 0.3, loc=-1.0, scale=0.3)  # 0.3 z + (E - 1), skewed(1)'s law
    mode = optimize.minimize_scalar(lambda y: -law.pdf(y), bounds=(-2, 2), method="bounded").x
    sym = {t: float(theory.match_limit(metadist.symmetric_gaussian(1.0, d=1), sigma=SIGMA,
                                       tau=t).centroid[0]) for t in (0.5, 1.0, 2.0)}
    bim = ctx.get("bimodal", _bimodal)
    centred = {t: theory.match_limit(bim, sigma=SIGMA, tau=t, init=np.zeros(1), key=802)
               for t in (0.5, 1.0, 2.0, 4.0)}
    good = [t for t, v in centred.items() if abs(float(v.centroid[0])) < 0.05]
    bad = [t for t in centred if t not in good]
    off = {t: float(theory.match_limit(bim, sigma=SIGMA, tau=t, init=np.array([1.0]),
                                       key=803).centroid[0]) for t in (1.0, 2.0)}
    return [Row("'Double robustness': consistency if either the inclusion rule or the centroid "
                "update is right; mild misspecification of tau does not change the limit",
                "inside the premise (symmetric D_mu): K -> inf fixed point c*(tau) and limit "
                "variance (theory.match_limit) for a symmetric bimodal D_mu (mu = +-1.5 + 0.3 z, "
                "d=1) from a centred start c0 = mu* and from c0 = 1; outside it: skewed(1) "
                "(E mu = mu* = 0, asymmetric)",
                "symmetric bimodal, c0 = mu*: " + ", ".join(
                    f"tau={t:g}: c* {float(v.centroid[0]):.1e}, var {float(v.cov[0, 0]):.3f}"
                    for t, v in centred.items())
                + "; c0 = 1: " + ", ".join(f"c*({t:g}) = {v:.3f}" for t, v in off.items())
                + "; skewed: " + ", ".join(f"c*({t}) = {v:.3f}" for t, v in cs.items())
                + f" (mode of D_mu {mode:.3f}, mean 0); symmetric Gaussian: "
                + ", ".join(f"c*({t}) = {v:.1e}" for t, v in sym.items()),
                (f"{DOES_NOT} inside its premise: symmetric bimodal D_mu, centred start, "
                 f"tau in {{{', '.join(f'{t:g}' for t in bad)}}} -> c* at a mode (mu* = 0 is an "
                 "unstable fixed point when few domains lie near it); c* = mu* only for tau in "
                 f"{{{', '.join(f'{t:g}' for t in good)}}}, i.e. towards naive pooling (tau -> inf "
                 "meets 'appropriate tau' trivially). " if bad else
                 f"{HOLDS} for the centre inside its premise (c* = mu* for every tau tried). ")
                + "Even where c* = mu*, tau changes the limit covariance (var above), so 'does not "
                "change the limit' fails for the law; outside the premise (skewed) the limit moves "
                "with tau and misses mu*. No propensity/outcome model pair is defined, so no "
                "double-robust estimator is analysed", NUMERIC)]


def premises(ctx: Context):
    """The paper's own set-ups against its standing assumptions."""
    import jax

    from . import _mc, _verdict, experiments

    P, md = experiments.resolve("asymptotic", {})
    mu = np.asarray(md(jax.random.key(900), 200_000))
    v = _verdict.decide(mu[:, 0], threshold=0.0)
    e = _mc.mean_se(mu[:, 1])
    return [
        Row("Assumption 2(a) E mu_k = mu* in the paper's own asymmetric experiments (synthetic "
            "Thm 1 / Thm 3 figures, Example 1)",
            "the simulated asymptotic experiment's D_mu (contaminated: share p = 0.3 shifted by "
            "alpha = 1.5 along e1, our p): 200000 draws of mu_k, coordinate 1 vs mu*_1 = 0",
            f"E mu_1 = {_v(v)} vs p alpha = {P['p'] * P['alpha']:.3f}; E mu_2 = {_ci(e)}",
            f"{DOES_NOT} (E mu = mu* + p alpha e1 by construction; the domain-addition experiment "
            "puts every third domain at radius 2.5 on one side, Example 1 shifts by p c: an "
            "asymmetric D_mu with mean mu* needs a skewed law, as skewed(scale) here. Results under "
            "these set-ups test the strategies, not the theorems' premises)",
            NOT_EVIDENCE + " (the law's mean is known exactly; the draws only confirm the code)"),
        Row("Positivity (Sec. 5): every relevant domain has a nonzero chance of inclusion",
            "the inclusion rule of Def. 3 / Corollary 'optimal tau': I_k = 1{M(mu_k - c) < tau} "
            "given the centroid c",
            "I_k is a deterministic function of mu_k (and c): P(I_k = 1 | mu_k) is 0 or 1",
            f"{DOES_NOT} by construction (inclusion probability 0 for every domain with "
            "M(mu_k - c) >= tau, however relevant; the propensity analogy needs a randomised "
            "inclusion rule)", NOT_EVIDENCE + " (a property of the definition)"),
    ]


def _in_ball(rng, n: int, d: int, radius: float) -> np.ndarray:
    """``n`` points uniform in the ball ``||z|| <= radius`` of R^d: ``(n, d)``."""
    u = rng.normal(size=(n, d))
    return radius * rng.uniform(size=(n, 1)) ** (1 / d) * u / np.linalg.norm(u, axis=1, keepdims=True)


def _flows(ctx: Context):
    """The flow_bridge figure's simulated set-up (banana domains, contaminated D_mu, p = 0.3),
    one ``vmap``-ed fit of S flows plus one flow fitted to Uniform([-1, 1]^2) (same n, so the
    same compiled fit); per seed the figure's own Thm 4 / KL measurements."""
    from .figures import flow_bridge as fb
    from .flows import fit_flows

    S, p = max(4, ctx.seeds // 125), 0.3
    P = {**fb.PARAMS, "steps": 200}
    draws = fb.simulated_draws(np.arange(S), p, P)
    square = np.random.default_rng(700).uniform(-1, 1, size=(P["K"] * P["n"], 2))
    fl = fit_flows(np.arange(S + 1) + 701, np.stack([X.reshape(-1, 2) for X, _, _ in draws]
                                                   + [square]), steps=P["steps"])
    per_seed = []
    for s, ((X, mus, target), flow) in enumerate(zip(draws, fl)):
        per_seed.append({**fb.one_seed(X, target, flow, P["tau_rel"]), **fb.kl_divergences(flow, X, mus, P, s)})
    return P, p, fl[:S], fl[S], per_seed


def thm4(ctx: Context):
    from . import _mc

    P, p, fl, square, per_seed = _flows(ctx)
    S = len(fl)
    col = lambda k: _mc.mean_se([r[k] for r in per_seed])  # noqa: E731
    cfg = fl[0].config
    setup = (f"flow_bridge set-up: banana domains x = (u1, u2 + {P['b']} (u1^2 - 1)), u ~ "
             f"N(mu_k, {P['sigma']}^2 I), mu_k ~ contaminated(p={p}, alpha={P['alpha']}, "
             f"gamma={P['gamma']}), K={P['K']}, n={P['n']}; flow: {cfg.n_layers} affine couplings, "
             f"width {cfg.width}, s_max {cfg.s_max}, {cfg.steps} Adam steps, 20% held out; {S} seeds")
    # Thm 4(1): achieved fit; compact support makes the paper's KL direction infinite
    rev = col("fit/reverse KL (paper's direction)")
    z = np.random.default_rng(702).normal(size=(4000, 2))
    outside = int(np.sum(np.any(np.abs(np.asarray(square.forward(z))) > 1, axis=1)))
    rows = [Row(
        "Thm 4(1) universal approximation: KL(T_# p_Z || p_data) < eps",
        setup + "; p_data known exactly (mixture of the K banana laws): forward KL(p || q) on "
        "held-out points, the paper's reverse KL(T_# p_Z || p) from 2000 flow samples. Compact "
        "support: the same flow fitted to Uniform([-1, 1]^2), share of 4000 flow samples outside "
        "the square",
        f"forward KL {_ci(col('fit/forward KL (held-out)'))} nats; reverse KL "
        f"{_ci(rev)} nats; held-out NLL "
        f"{_ci(col('fit/held-out NLL'))}; uniform square: flow mass outside the support "
        f"{_prop(outside, z.shape[0])}",
        f"{DOES_NOT} as stated (p_data compactly supported: for every continuous bijection T of "
        "R^d, T_# N(0, I) charges the open complement of the support, so KL(T_# p_Z || p_data) = "
        "+inf; counterexample: Uniform([-1, 1]^2) above). For p_data with a positive density it "
        "is an existence claim (one T per eps; the cited universal-approximation results), not "
        "checkable by simulation: achieved KL as measured, no eps-approximation claimed",
        EXISTENCE + "; the compact-support case is an " + EXPLICIT)]
    # Thm 4(2): certified prod C_l on a ball vs the largest observed ratio
    rng, radii, n = np.random.default_rng(703), (1.0, 2.0, 4.0, 8.0), 5000
    rr = np.array(radii)[:, None, None]
    bound, ratio = np.empty((S, len(radii))), np.empty((S, len(radii)))
    for s, flow in enumerate(fl):
        a = np.stack([_in_ball(rng, n, 2, r) for r in radii])
        near = a + 1e-3 * rng.normal(size=a.shape)  # half the pairs close: local slopes
        b = np.concatenate([np.stack([_in_ball(rng, n // 2, 2, r) for r in radii]),
                            near[:, n // 2:]], axis=1)
        nb = np.linalg.norm(b, axis=-1, keepdims=True)
        b = np.where(nb > rr, b * rr / nb, b)  # keep every point in its ball
        Ta = np.asarray(flow.forward(a.reshape(-1, 2))).reshape(a.shape)
        Tb = np.asarray(flow.forward(b.reshape(-1, 2))).reshape(b.shape)
        ratio[s] = np.max(np.linalg.norm(Ta - Tb, axis=-1) / np.linalg.norm(a - b, axis=-1), axis=1)
        bound[s] = [flow.lipschitz_bound(r) for r in radii]
    viol = int(np.sum(ratio > bound))
    rows.append(Row(
        "Thm 4(2) Lipschitz control: L_T <= prod_l C_l (C_l >= sup ||J_l||_op)",
        f"the {S} fitted flows above: certified prod C_l on the latent ball ||z|| <= r "
        f"(flows.lipschitz_bound, exact singular values) vs the largest ratio ||T(z1) - T(z2)|| / "
        f"||z1 - z2|| over {n} pairs in the ball (half uniform, half 1e-3 apart); also a "
        "hypothesis property test (tests/test_flows.py)",
        "; ".join(f"r={r:g}: certified {_ci(_mc.mean_se(bound[:, i]), 1)}, observed max "
                  f"{_ci(_mc.mean_se(ratio[:, i]), 2)}" for i, r in enumerate(radii))
        + f"; violations {viol} / {bound.size}",
        "holds under an extra condition (on a bounded set ||z|| <= r only: an affine coupling's "
        "Jacobian has the term x2 e^s s'(x1), unbounded in |x2| however the conditioner is "
        "constrained, so no finite global L_T exists unless s is constant -- the certified bound "
        "and the observed slopes both grow with r). Valid but loose: "
        f"{np.mean(bound[:, 0] / ratio[:, 0]):.0f}x (r=1) to "
        f"{np.mean(bound[:, -1] / ratio[:, -1]):.0f}x (r={radii[-1]:g}) the observed ratio"))
    # Thm 4(3), (4): latent matched set S_Z = {z : ||z - c_z|| < tau}, mapped through T
    L, rms, off = col("thm4/bound L_T tau"), col("thm4/rms spread"), col("thm4/mean offset")
    held = sum(r["thm4/rms spread"] <= r["thm4/bound L_T tau"] for r in per_seed)
    held4 = sum(r["thm4/mean offset"] <= r["thm4/bound L_T tau"] for r in per_seed)
    latent = (setup + "; latent matching (poolsim.match of the domains' latent means, tau_z = "
              f"{P['tau_rel']} x median distance), S_Z = latent samples with ||z - c_z|| < tau_z "
              f"(|S_Z| = {_ci(col('thm4/|S_Z|'), 0)}), L_T = lipschitz_bound(||c_z|| + tau_z) "
              "(the ball containing S_Z)")
    caveat = ("holds under an extra condition (L_T certified on the ball ||z|| <= ||c_z|| + tau, "
              "Thm 4(2)'s radius caveat); the proof is sound (pointwise ||T(z) - T(c_z)|| <= L_T "
              "tau) but the bound is vacuous here: ")
    rows += [Row("Thm 4(3) variance preservation: mean ||x - T(c_z)||^2 over S_X <= L_T^2 tau^2",
                 latent, f"rms spread sqrt(mean ||x - T(c_z)||^2) = {_ci(rms)} vs L_T tau = "
                 f"{_ci(L, 1)}; held in {held}/{S} seeds",
                 caveat + f"{L.mean / rms.mean:.0f}x the measured rms spread",
                 NOT_EVIDENCE + " (a certified bound: fails only if flows.lipschitz_bound is "
                 "wrong)"),
             Row("Thm 4(4) concentration: ||xbar - T(c_z)|| <= L_T tau", latent,
                 f"||xbar - T(c_z)|| = {_ci(off)} vs L_T tau = {_ci(L, 1)}; held in {held4}/{S} "
                 "seeds", caveat + f"{L.mean / off.mean:.0f}x the measured offset (and (4) "
                 "follows from (3) by Jensen: offset <= rms spread)",
                 NOT_EVIDENCE + " (as Thm 4(3))")]
    return rows


def _multimodal(ctx: Context, **override):
    """The multimodal figure's per-seed run (quick: K up to 18) with parameters overridden."""
    from .figures import multimodal as mm

    P = {**mm.PARAMS, **mm.QUICK, **override}
    return P, [mm.one_seed(s, P) for s in range(max(40, ctx.seeds // 25))]


def lemma_multimodal(ctx: Context):
    from . import _mc
    from .figures.multimodal import STRATEGIES

    runs = {name: _multimodal(ctx, **o) for name, o in
            (("separated", {"R": 8.0}), ("violated", {"R": 1.0}),
             ("separated+coverage", {"R": 20.0, "tau": 3.0, "p": 0.0}))}

    def desc(name):
        P, out = runs[name]
        return (f"R={P['R']:g}, tau={P['tau']:g}, p={P['p']:g}: separation met at "
                f"{_ci(_mc.mean_se([o['lemma'] for o in out]), 2)} of K, wrong-mode share "
                f"{_ci(_mc.mean_se([o['wrong'] for o in out]), 3)}, unassigned "
                f"{_ci(_mc.mean_se([o['unassigned'] for o in out]), 3)}")

    def nondet(name, strat=STRATEGIES[1]):
        _, out = runs[name]
        return _ci(_mc.mean_se([np.mean([o["nd"][(strat, m)] for m in range(3)]) for o in out]), 2)

    P, out = runs["separated"]
    setup = (f"multimodal figure set-up: M=3 modes on a circle of radius R, per-mode "
             f"contaminated D_mu (p, alpha={P['alpha']}, gamma={P['gamma']}, outward), n={P['n']}, "
             f"domain-level match_multimodal (kmeans++median init on K0={P['K0']}, then warm "
             f"starts), K = {P['K0']}..{P['K_max']}, {len(out)} seeds; the Lemma's separation "
             "min ||mu_i* - mu_j*|| > 2 (tau + R_max + eps_max) checked at every K")
    from . import _verdict

    clean = _verdict.no_counterexample([o["wrong_separated"] for o in runs["separated"][1]])
    return [Row("Lemma (multimodal reduction) (a), (b): under separation no sample is matched to a "
                "wrong mode; M independent unimodal problems",
                setup + "; also hypothesis property tests (tests/test_multimodal.py)",
                "separated: " + desc("separated") + f"; share of seeds with a wrong-mode "
                f"assignment at a separated K {_v(clean)} (Clopper-Pearson); violated: "
                + desc("violated"),
                f"{clean.verdict}" + (" (the triangle-inequality proof is sound; coverage is not "
                                      "needed for (a)). " if clean.verdict == HOLDS else ". ")
                + "Violated separation gives wrong-mode assignments (R=1 above); separation is "
                "sufficient, not necessary", MC),
            Row("Lemma (multimodal reduction) (c): per-mode convergence as in Thm 1",
                "reduction to Thm 1(c) per mode", "see Thm 1(c) row",
                "holds under an extra condition (those of Thm 1(c): tau -> 0 with K tau^d -> inf "
                "and symmetric D_mu per mode; at fixed tau the per-mode limit is not "
                "N(mu_m*, sigma^2 I))", REDUCTION),
            Row("Lemma (multimodal reduction) (d) / Sec. 'Multimodal': eps_(K+1,m) <= eps_(K,m) "
                "for all m w.h.p.",
                setup + "; share of steps adding a mode-m domain with eps_(K+1,m) <= eps_(K,m), "
                "mean over modes; 'separated+coverage' meets both of the Lemma's conditions",
                f"separated: matching {nondet('separated')} (pooling with true labels "
                f"{nondet('separated', STRATEGIES[0])}); separated+coverage: "
                + desc("separated+coverage") + " (coverage in effect: every domain within tau of "
                f"its own mode's centroid), matching {nondet('separated+coverage')}",
                f"{DOES_NOT} (counterexample: R=20, tau=3, p=0 satisfies separation and coverage; "
                "every domain is then matched, matching equals per-mode pooling, and a new inlier "
                "raises eps_m about as often as it lowers it -- Thm 3(3)'s non-deterioration "
                "failure, per mode)")]


CHECKS = (premises, thm1, thm2, thm3, corollaries, example1, matched_set, robustness, thm4,
          lemma_multimodal)


def run(seeds: int = 1000, progress: bool = True) -> list[Row]:
    """All rows, in paper order within each group."""
    from tqdm import tqdm

    ctx = Context(seeds)
    rows: list[Row] = []
    with tqdm(CHECKS, desc="claims audit", disable=not progress, file=sys.stderr) as bar:  # closed if a check fails
        for check in bar:
            rows.extend(check(ctx))
    return rows


def render(rows: list[Row], seeds: int) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    head = ["# Claims audit", "",
            "Generated by `python -m poolsim.audit` "
            f"(`--seeds {seeds}`; simulated data only, fixed seeds). Intervals are 95% (Student-t over "
            "replications, mean +- t SE; normal approximation for proportions and slopes). Paper: "
            "*Beyond Pooling* (AISTATS 2026). "
            "Deterministic claims are also property-tested in `tests/test_theory_properties.py`; "
            "Monte-Carlo claims in `tests/test_theory_montecarlo.py`.", "",
            "Verdicts: Monte-Carlo rows are decided by one rule (`poolsim.decide_claim`): the claim "
            "holds if the 95% interval of the quantity (a paired difference where two things are "
            "compared) lies on the claimed side of the threshold, does not hold if it lies on the "
            "other side, and is **inconclusive** if it contains the threshold or rests on fewer "
            "than 30 replications. Thresholds the paper does not give are ours and named in the "
            "row. *holds under an extra condition* names the condition; a counterexample decides "
            "*does not hold*. Rows whose check cannot fail (an identity, a property true by "
            "construction) say so in the 'Kind of evidence' column and are not evidence for or "
            f"against the paper: {sum(r.kind.startswith(NOT_EVIDENCE[:20]) for r in rows)} of "
            f"{len(rows)} rows.", "",
            "| Claim | What was checked | Measured (this run) | Kind of evidence | Verdict |",
            "|---|---|---|---|---|"]
    body = [f"| {cell(r.claim)} | {cell(r.checked)} | {cell(r.measured)} | {cell(r.kind)} | "
            f"{cell(r.verdict)} |" for r in rows]
    from .figures import _claims

    return "\n".join(head + body) + "\n\n" + _claims.markdown()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m poolsim.audit",
                                 description="Claims audit: one row per numbered claim of the paper (what was "
                                             "checked, the measured figure, the verdict), written to "
                                             "docs/claims.md.")
    ap.add_argument("--out", default="docs/claims.md", help="output markdown file (default: %(default)s)")
    ap.add_argument("--seeds", type=int, default=1000,
                    help="Monte-Carlo replications for finite-K checks; large-K checks use "
                         "max(8, seeds // 50), Thm 4's flow fits max(4, seeds // 125), the "
                         "multimodal Lemma max(40, seeds // 25) (default: %(default)s)")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    if args.seeds < 20:
        ap.error(f"--seeds must be an integer >= 20, got {args.seeds}")
    rows = run(args.seeds, progress=not args.quiet)
    atomic_write_text(args.out, render(rows, args.seeds))
    print(f"wrote {len(rows)} claims to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
