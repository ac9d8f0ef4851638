"""The decision map: pooling vs subsampling vs matching over a grid of heterogeneity, in one
compiled program.

Two meta-distributions, each over a grid of (outlier share, outlier shift):

* ``"contaminated"`` (:func:`poolsim.metadist.contaminated`): ``mu_k = gamma z_k + B_k alpha e_1``,
  ``B_k = 1[U_k < p]``;
* ``"outlier_schedule"`` (the ``domain_addition`` law, :func:`poolsim.metadist.outlier_schedule`,
  generalised from "every third domain" to any share ``s = j / SHARE_DENOM``): domain k is an
  outlier iff ``floor(k j / D) > floor((k - 1) j / D)`` (a Beatty sequence: ``j / D = 1 / every``
  gives exactly ``k % every == 0``), placed at ``radius * normalize(e_1 + jitter z_k)``.

Domain sample means use the engine's exact sufficient statistics (``xbar_k = mu_k + sigma/sqrt(n)
e_k``; subsampling's ``q`` from :func:`poolsim._engine.collision_law`); matching is domain-level,
L2, started at the coordinate-wise median of the domain means (the engine's
``materialize=False`` path), tolerance ``tol``, at most ``max_iter`` iterations.

Every cell of a grid shares the seed's random numbers (common random numbers: the same ``z``,
``U``, noise and subsampling draws in every cell), so neighbouring cells differ only by the
parameters; share and shift are *traced* arrays, so one compiled program serves the whole grid.
Per chunk of seeds the program returns only per-cell sums and cross-products of the per-seed
values (``Gram``), so memory does not grow with the seed count and every paired difference of two
compared quantities gets its exact mean and variance (:func:`Moments.paired`).

Per cell and K the compared values are: eps of pooling, of subsampling, of matching at each
``tau`` of the grid ``taus``, and of matching at the data-driven tau rules (:data:`RULES`):

* ``median_dist_c``: ``tau = c * median pairwise distance between the K domain sample means``;
* ``plug_in``: :func:`poolsim.theory.recommend_tau` (L2: ``m_M = L_M = 1``, ``margin = 2``, no
  harmful distance) with ``eps_K`` estimated from the data (ours): a pilot matching at
  ``tau = median pairwise distance`` gives a matched set S; ``eps_hat = sqrt(tr Cov_S(xbar) / |S|)``
  (the standard error of the matched mean, as if the matched domains were an unbiased sample of
  the inliers); ``tau = 2 eps_hat``. Fewer than two matched domains: the pilot tau itself.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from . import _engine, _rng

LAWS = ("contaminated", "outlier_schedule")
SHARE_DENOM = 36  # outlier_schedule shares are j / 36 (1/3 = 12/36 is the paper's "every third")
MEDIAN_DIST_C = (0.5, 1.0, 1.5)
RULES = tuple(f"median_dist_{c:g}" for c in MEDIAN_DIST_C) + ("plug_in",)
PLUG_IN_MARGIN = 2.0


class GridSpec(NamedTuple):
    """Static part of a map (hashable: it keys the compiled program). ``Ks``: the K values read
    (prefixes of one draw of ``max(Ks)`` domains); ``ns``: samples per domain; ``taus``: the tau
    grid (fixed taus, ascending)."""

    law: str
    Ks: tuple
    ns: tuple
    taus: tuple
    sigma: float = 0.8
    gamma: float = 0.5
    jitter: float = 0.2
    m_frac: float = 0.5
    n_sub: int = 10
    tol: float = 1e-4
    max_iter: int = 100
    d: int = 2

    @property
    def names(self) -> tuple:
        """Names of the per-seed values, in order: pool, subsample, match@tau..., match@rule..."""
        return (("pool", "subsample") + tuple(f"tau={t:g}" for t in self.taus) + RULES)


class Moments(NamedTuple):
    """Per-cell sufficient statistics over seeds. ``sums (..., V)``, ``gram (..., V, V)`` (sums of
    products of the per-seed values), ``n`` seeds, ``aux (..., A)`` means of auxiliary values
    (the rules' mean tau, the mean number of matched domains at each tau)."""

    sums: np.ndarray
    gram: np.ndarray
    n: int
    aux: np.ndarray

    def mean(self, i: int) -> np.ndarray:
        return self.sums[..., i] / self.n

    def paired(self, i: int, j: int, w: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
        """Mean and sample variance (ddof 1) over seeds of ``value_i - w value_j`` per cell."""
        n = self.n
        m = (self.sums[..., i] - w * self.sums[..., j]) / n
        ss = (self.gram[..., i, i] - 2 * w * self.gram[..., i, j] + w * w * self.gram[..., j, j])
        var = np.maximum(ss - n * m * m, 0.0) / max(n - 1, 1)
        return m, var


def _check_grid(law, shares, shifts):
    if law not in LAWS:
        raise ValueError(f"law must be one of {LAWS}, got {law!r}")
    shares = np.asarray(shares, float).ravel()
    shifts = np.asarray(shifts, float).ravel()
    if shares.size == 0 or not np.all(np.isfinite(shares)) or shares.min() < 0 or shares.max() > 1:
        raise ValueError(f"shares must be a non-empty list of numbers in [0, 1], got {shares}")
    if shifts.size == 0 or not np.all(np.isfinite(shifts)) or shifts.min() < 0:
        raise ValueError(f"shifts must be a non-empty list of finite numbers >= 0, got {shifts}")
    if law == "outlier_schedule":
        j = shares * SHARE_DENOM
        if not np.allclose(j, np.round(j), atol=1e-9):
            raise ValueError(f"outlier_schedule shares must be multiples of 1/{SHARE_DENOM}, "
                             f"got {shares}")
    return shares, shifts


def _sorted_median(x):
    """Coordinate-wise median over axis -2 of ``x (..., K, d)`` (NumPy's convention)."""
    K = x.shape[-2]
    s = jnp.sort(x, axis=-2)
    return 0.5 * (s[..., (K - 1) // 2, :] + s[..., K // 2, :])


def _match(xt, c0, tau, spec: GridSpec):
    """Domain-level L2 matching for a batch: ``xt (..., d, K)`` domain means (all count equally:
    equal n), ``c0 (..., d)``, ``tau (...)`` -> ``(c (..., d), matched count (...))``. The same
    iteration as :func:`poolsim._core.iterate_match`: gate ``||xbar_k - c|| < tau``, move to the
    mean of the gated domains, stop at ``||c_next - c|| < tol`` or when nothing is gated (the
    previous centroid is kept) or after ``max_iter`` trips."""
    def body(state):
        t, c, cnt, done = state
        dist = jnp.sqrt(jnp.sum((xt - c[..., None]) ** 2, axis=-2))  # (..., K)
        w = (dist < tau[..., None]).astype(xt.dtype)
        total = jnp.sum(w, axis=-1)
        has = total > 0
        mean = jnp.sum(w[..., None, :] * xt, axis=-1) / jnp.where(has, total, 1.0)[..., None]
        c_next = jnp.where(has[..., None], mean, c)
        moved = jnp.sqrt(jnp.sum((c_next - c) ** 2, axis=-1)) < spec.tol
        new_done = ~has | moved
        keep = done[..., None]
        return (t + 1, jnp.where(keep, c, c_next), jnp.where(done, cnt, total),
                done | new_done)

    state = (jnp.int32(0), c0, jnp.zeros(c0.shape[:-1], xt.dtype), jnp.zeros(c0.shape[:-1], bool))
    _, c, cnt, _ = jax.lax.while_loop(lambda s: (s[0] < spec.max_iter) & ~jnp.all(s[3]), body,
                                      state)
    return c, cnt


def _draws(spec: GridSpec, keys):
    """Every random number of a chunk of seeds, shared by all cells."""
    Kmax, d, nK = max(spec.Ks), spec.d, len(spec.Ks)

    def one(key):
        kz, ku, ke, kp, kq, ks = jax.random.split(key, 6)
        return (jax.random.normal(kz, (Kmax, d)), jax.random.uniform(ku, (Kmax,)),
                jax.random.normal(ke, (Kmax, d)), jax.random.uniform(kp, (nK, Kmax)),
                jax.random.uniform(kq, (nK, Kmax)), jax.random.normal(ks, (nK, Kmax, d)))

    return jax.vmap(one)(keys)


def _chunk(spec: GridSpec, keys, weight, shares, shifts):
    """One chunk of seeds over the whole grid -> per-cell sums, Gram and auxiliary sums.

    ``weight (S,)``: 1 for a real seed, 0 for the padding of the last chunk. ``shares (P,)``,
    ``shifts (A,)`` traced; the n axis is static (its subsampling law differs)."""
    Z, U, E, prio, uq, zs = _draws(spec, keys)  # (S, Kmax, d), (S, Kmax), ...
    S, Kmax, d = Z.shape
    dtype = Z.dtype
    k = jnp.arange(1, Kmax + 1)
    e1 = jnp.zeros(d, dtype).at[0].set(1.0)
    if spec.law == "contaminated":
        out = (U[None, :, :] < shares[:, None, None]).astype(dtype)  # (P, S, Kmax)
        base = spec.gamma * Z  # (S, Kmax, d)
        mu = (base[None, None] + out[:, None, :, :, None] * shifts[None, :, None, None, None]
              * e1)  # (P, A, S, Kmax, d)
    else:
        j = jnp.round(shares * SHARE_DENOM).astype(jnp.int32)
        out = ((k[None, :] * j[:, None]) // SHARE_DENOM
               > ((k[None, :] - 1) * j[:, None]) // SHARE_DENOM)  # (P, Kmax)
        u = e1 + spec.jitter * Z
        u = u / jnp.linalg.norm(u, axis=-1, keepdims=True)  # (S, Kmax, d)
        mu = jnp.where(out[:, None, None, :, None], shifts[None, :, None, None, None] * u,
                       spec.gamma * Z)  # (P, A, S, Kmax, d)
    stats, aux = [], []
    for ni, n in enumerate(spec.ns):
        values, auxv = [], []
        xbar = mu + spec.sigma / math.sqrt(n) * E  # (P, A, S, Kmax, d)
        lv, lp = _engine.collision_law(n, spec.n_sub)
        cdf = jnp.asarray(np.cumsum(lp)[:-1], dtype)
        q = jnp.asarray(lv, dtype)[jnp.searchsorted(cdf, uq, method="compare_all")]  # (S, nK, Kmax)
        spread = spec.sigma * jnp.sqrt(jnp.maximum(q / spec.n_sub ** 2 - 1.0 / n, 0.0))
        for ki, K in enumerate(spec.Ks):
            x = xbar[..., :K, :]
            pool = jnp.mean(x, axis=-2)
            m = max(1, min(K, math.ceil(spec.m_frac * K)))
            p_ = prio[:, ki, :K]
            rank = jnp.sum(p_[:, None, :] < p_[:, :, None], axis=-1)  # (S, K)
            chosen = (rank < m).astype(dtype)
            dom = x + (spread[:, ki, :K, None] * zs[:, ki, :K, :])
            sub = jnp.sum(chosen[:, :, None] * dom, axis=-2) / m
            c0 = _sorted_median(x)
            xt = jnp.swapaxes(x, -1, -2)  # (P, A, S, d, K)
            taus = jnp.asarray(spec.taus, dtype)
            T = len(spec.taus)
            cg, cnt = _match(xt[None], jnp.broadcast_to(c0[None], (T,) + c0.shape),
                             jnp.broadcast_to(taus[:, None, None, None], (T,) + c0.shape[:-1]),
                             spec)  # (T, P, A, S, d)
            diff = x[..., :, None, :] - x[..., None, :, :]
            pd_ = jnp.sqrt(jnp.sum(diff * diff, axis=-1))  # (P, A, S, K, K)
            iu = np.triu_indices(K, 1)
            med = jnp.median(pd_[..., iu[0], iu[1]], axis=-1)  # (P, A, S)
            crule = jnp.asarray(MEDIAN_DIST_C, dtype)
            tr = crule[:, None, None, None] * med[None]
            cr, cntr = _match(xt[None], jnp.broadcast_to(c0[None], tr.shape + (d,)), tr, spec)
            # plug-in: eps_hat from the pilot (c = 1) matched set
            pilot = cr[MEDIAN_DIST_C.index(1.0)]
            dist = jnp.sqrt(jnp.sum((x - pilot[..., None, :]) ** 2, axis=-1))
            w = (dist < med[..., None]).astype(dtype)
            ns_ = jnp.sum(w, axis=-1)
            mean_w = jnp.sum(w[..., None] * x, axis=-2) / jnp.maximum(ns_, 1.0)[..., None]
            var_w = (jnp.sum(w[..., None] * (x - mean_w[..., None, :]) ** 2, axis=(-2, -1))
                     / jnp.maximum(ns_ - 1.0, 1.0))
            eps_hat = jnp.sqrt(var_w / jnp.maximum(ns_, 1.0))
            tp = jnp.where(ns_ >= 2, PLUG_IN_MARGIN * eps_hat, med)
            tp = jnp.maximum(tp, 1e-6)
            cp, cntp = _match(xt, c0, tp, spec)
            ests = jnp.concatenate([pool[None], sub[None], cg, cr, cp[None]], axis=0)  # (V,P,A,S,d)
            eps = jnp.sqrt(jnp.sum(ests ** 2, axis=-1))  # (V, P, A, S)
            values.append(eps)
            wsum = lambda a: jnp.sum(a * weight, axis=-1)  # noqa: E731  (summed over real seeds)
            auxv.append(jnp.concatenate([wsum(tr), wsum(tp)[None], wsum(cnt), wsum(cntr),
                                         wsum(cntp)[None]], axis=0))  # (Aux, P, A)
        v = jnp.stack(values)  # (nK, V, P, A, S)
        vw = v * weight
        stats.append((jnp.sum(vw, axis=-1), jnp.einsum("kvpas,kwpas->kpavw", vw, v)))
        aux.append(jnp.stack(auxv))  # (nK, Aux, P, A)
    sums = jnp.stack([s for s, _ in stats])  # (nn, nK, V, P, A)
    gram = jnp.stack([g for _, g in stats])  # (nn, nK, P, A, V, V)
    return sums, gram, jnp.stack(aux)


@functools.lru_cache(maxsize=16)
def _compiled(spec: GridSpec) -> Callable:
    return jax.jit(functools.partial(_chunk, spec))


def aux_names(spec: GridSpec) -> tuple:
    """Names of :attr:`Moments.aux` entries: the rules' mean tau (median_dist_c and plug_in),
    then the mean matched-domain count at each tau of the grid and each rule."""
    return (tuple(f"tau of {r}" for r in RULES)
            + tuple(f"matched domains, tau={t:g}" for t in spec.taus)
            + tuple(f"matched domains, {r}" for r in RULES))


def run_grid(spec: GridSpec, shares, shifts, *, seeds: int | np.ndarray, chunk: int = 32,
             progress: Callable[[int], None] | None = None) -> Moments:
    """The map's statistics for every cell: ``Moments`` with ``sums (n_n, n_K, P, A, V)``, ``gram
    (n_n, n_K, P, A, V, V)``, ``aux (n_n, n_K, P, A, Aux)`` over seeds ``0..seeds-1`` (or the
    given seeds). Seed s uses ``jax.random.key(s)``'s stream (through the engine's fast key), so
    a seed's values do not depend on the chunking. ``chunk`` seeds per call of the compiled
    program (one compile per ``spec``, grid size and chunk)."""
    shares, shifts = _check_grid(spec.law, shares, shifts)
    if isinstance(seeds, (int, np.integer)) and not isinstance(seeds, bool):
        if seeds < 1:
            raise ValueError(f"seeds must be a positive count, got {seeds}")
        seeds = np.arange(int(seeds))
    seeds = np.asarray(seeds, np.int64)
    if chunk < 1:
        raise ValueError(f"chunk must be a positive integer, got {chunk}")
    fn = _compiled(spec)
    sh, sf = jnp.asarray(shares, jnp.float32), jnp.asarray(shifts, jnp.float32)
    tot = None
    for start in range(0, len(seeds), chunk):
        block = seeds[start:start + chunk]
        padded = np.concatenate([block, np.full(chunk - len(block), block[-1])])
        keys = jax.vmap(_rng.fast_key)(jnp.asarray(padded, dtype=jnp.uint32))
        weight = jnp.asarray(np.arange(chunk) < len(block), jnp.float32)
        part = [np.asarray(t, np.float64) for t in fn(keys, weight, sh, sf)]
        tot = part if tot is None else [a + b for a, b in zip(tot, part)]
        if progress is not None:
            progress(len(block))
    tot_s, tot_g, tot_a = tot
    n = len(seeds)
    sums = np.moveaxis(tot_s, 2, -1)  # (nn, nK, P, A, V)
    return Moments(sums, tot_g, n, np.moveaxis(tot_a / n, 2, -1))  # aux: (nn, nK, P, A, Aux)


__all__ = ["LAWS", "RULES", "GridSpec", "Moments", "run_grid", "aux_names"]
