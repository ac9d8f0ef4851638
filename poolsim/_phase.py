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

* ``c x median distance``: ``tau = c * median_k ||xbar_k - med||``, the median distance of the K
  domain sample means to their coordinate-wise median ``med`` (the matching's start): a robust
  spread of the domains, computable by any user. (All K (K-1)/2 pairwise distances would be the
  other natural scale -- about sqrt(2) times this one for Gaussian inliers -- but their median
  cost ~3x the rest of the program, so the map uses the distance to the median.)
* ``plug-in recommend_tau``: :func:`poolsim.theory.recommend_tau` (L2: ``m_M = L_M = 1``,
  ``margin = 2``, no harmful distance) with ``eps_K`` estimated from the data (ours): a pilot
  matching at ``tau = 2 x median distance`` gives a matched set S;
  ``eps_hat = sqrt(tr Cov_S(xbar) / |S|)`` (the standard error of the matched mean, as if the
  matched domains were an unbiased sample of the inliers); ``tau = 2 eps_hat``. Fewer than two
  matched domains: the pilot tau itself.
"""
from __future__ import annotations

import functools
import hashlib
import math
import pickle
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from . import _cache, _checks, _cluster, _engine, _programs, _rng

LAWS = ("contaminated", "outlier_schedule")
SHARE_DENOM = 36  # outlier_schedule shares are j / 36 (1/3 = 12/36 is the paper's "every third")
MEDIAN_DIST_C = (1.0, 2.0, 3.0)
PILOT_C = 2.0  # the plug-in rule's pilot: tau = PILOT_C x median distance to the median
RULES = tuple(f"{c:g} x median distance" for c in MEDIAN_DIST_C) + ("plug-in recommend_tau",)
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

    def var(self, i: int) -> np.ndarray:
        """Sample variance (ddof 1) over seeds of value i per cell."""
        m = self.mean(i)
        return np.maximum(self.gram[..., i, i] - self.n * m * m, 0.0) / max(self.n - 1, 1)

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


def _lower_median_pair(v):
    """``(s[(K - 1) // 2], s[K // 2])`` of ``s = sort(v)`` along the last axis of ``v (..., K)``:
    the two middle order statistics, exactly those values (``top_k`` of ``-v`` returns the
    ``K // 2 + 1`` smallest in ascending order, and negation is exact). XLA's CPU sort calls its
    comparator once per comparison; its ``top_k`` is a partial sort about 3x faster here."""
    K = v.shape[-1]
    low = -jax.lax.top_k(-v, K // 2 + 1)[0]
    return low[..., (K - 1) // 2], low[..., K // 2]


def _sorted_median(x):
    """Coordinate-wise median over axis -2 of ``x (..., K, d)`` (NumPy's convention)."""
    a, b = _lower_median_pair(jnp.swapaxes(x, -1, -2))
    return 0.5 * (a + b)


SHRINK = 8  # each compaction stage of the matching keeps at most 1/SHRINK of the rows
STAGES = 2  # compaction stages after the first pass over every row (each costs compile time)


def _match(xs, c0, tau, spec: GridSpec, stages: int = STAGES):
    """Domain-level L2 matching for a batch of rows: ``xs`` a tuple of d arrays ``(R0, K)``, the
    coordinates of the domain sample means (one array per coordinate, so every reduction runs over
    the contiguous domain axis; every domain counts equally: equal n), ``c0 (R0, d)`` the starts,
    ``tau (T, R0)`` one tau per row and start -> ``(c (T, R0, d), matched domains (T, R0))``. The
    iteration of :func:`poolsim._core.iterate_match`: gate ``||xbar_k - c|| < tau`` (compared as
    squares), move to the mean of the gated domains, stop at ``||c_next - c|| < tol``, or when
    nothing is gated (the previous centroid is kept), or after ``max_iter`` trips.

    Rows that have stopped are frozen by a select, so a row's result does not depend on the rows
    iterated with it. Most rows stop within 2-5 trips and one in a thousand needs 10-20, so the
    rows still iterating are compacted: the first pass iterates all ``T R0`` rows until at most
    ``T R0 / SHRINK`` still move, gathers those into a batch of that size, iterates it until at
    most ``1 / SHRINK`` of it still moves, and so on for ``stages`` stages; the last one iterates
    to the end. One batch to the end would cost the slowest row's trip count for every row, about
    5x the trips the rows need (measured on the figure's grid). Per chunk of the figure's
    contaminated program (2-core CPU, CPU time): 560-820 ms without compaction, ~310 ms with two
    stages of 1/8, 350-380 ms with four of 1/4; its compile: 9, 22 and 33 s."""
    T, R0 = tau.shape
    R, d = T * R0, len(xs)
    dtype = xs[0].dtype
    tol2 = spec.tol ** 2

    def step(xs, tau2, c, cnt, done):
        # xs: d arrays (..., K) that broadcast against c (..., d) without its last axis
        d2 = sum((x - c[..., i:i + 1]) ** 2 for i, x in enumerate(xs))
        w = (d2 < tau2[..., None]).astype(dtype)
        total = jnp.sum(w, axis=-1)
        has = total > 0
        denom = jnp.where(has, total, 1.0)
        mean = jnp.stack([jnp.sum(w * x, axis=-1) for x in xs], axis=-1) / denom[..., None]
        c_next = jnp.where(has[..., None], mean, c)
        moved = jnp.sum((c_next - c) ** 2, axis=-1) < tol2
        return (jnp.where(done[..., None], c, c_next), jnp.where(done, cnt, total),
                done | ~has | moved)

    def iterate(xs, tau2, state, limit: int):
        """Trips while fewer than ``max_iter`` were made and more than ``limit`` rows move."""
        return jax.lax.while_loop(
            lambda s: (s[0] < spec.max_iter) & (jnp.sum(~s[3]) > limit),
            lambda s: (s[0] + 1,) + step(xs, tau2, *s[1:]), state)

    sizes = [max(1, R // SHRINK ** (i + 1)) for i in range(stages)]
    tau2 = tau * tau
    state = (jnp.int32(0), jnp.broadcast_to(c0, (T, R0, d)), jnp.zeros((T, R0), dtype),
             jnp.zeros((T, R0), bool))
    t, c, cnt, done = iterate(xs, tau2, state, sizes[0] if stages else 0)
    c, cnt, done, tau2 = c.reshape(R, d), cnt.reshape(R), done.reshape(R), tau2.reshape(R)
    for i, size in enumerate(sizes):
        # the rows still moving (all of them: at most `size` once fewer than max_iter trips were
        # made; past max_iter none moves again), padded with index R (dropped on the way back)
        idx = jnp.nonzero(~done, size=size, fill_value=R)[0]
        row = jnp.minimum(idx, R - 1)
        sub = (t, c[row], cnt[row], idx >= R)
        t, cb, cntb, doneb = iterate(tuple(x[row % R0] for x in xs), tau2[row], sub,
                                     sizes[i + 1] if i + 1 < stages else 0)
        c = c.at[idx].set(cb, mode="drop")
        cnt = cnt.at[idx].set(cntb, mode="drop")
        done = done.at[idx].set(doneb, mode="drop")
    return c.reshape(T, R0, d), cnt.reshape(T, R0)


def _median_distance(x, centre):
    """Median over the K rows of ``x (..., K, d)`` of their distance to ``centre (..., d)``."""
    dist = jnp.sqrt(jnp.sum((x - centre[..., None, :]) ** 2, axis=-1))
    a, b = _lower_median_pair(dist)
    return 0.5 * (a + b)


def _draws(spec: GridSpec, keys):
    """Every random number of a chunk of seeds, shared by all cells."""
    Kmax, d, nK = max(spec.Ks), spec.d, len(spec.Ks)

    def one(key):
        kz, ku, ke, kp, kq, ks = jax.random.split(key, 6)
        return (jax.random.normal(kz, (Kmax, d)), jax.random.uniform(ku, (Kmax,)),
                jax.random.normal(ke, (Kmax, d)), jax.random.uniform(kp, (nK, Kmax)),
                jax.random.uniform(kq, (nK, Kmax)), jax.random.normal(ks, (nK, Kmax, d)))

    return jax.vmap(one)(keys)


def _chunk(spec: GridSpec, draws, weight, shares, shifts, taus, sigma, gamma):
    """One chunk of seeds over the whole grid -> per-cell sums, Gram and auxiliary sums.

    ``draws``: :func:`_draws` of the chunk's keys, computed by a program of their own (inside
    this one XLA fuses the random-number hash and the normal transform into every consumer,
    recomputing them for each of the P x A cells and each tau of the matching batch).
    ``weight (S,)``: 1 for a real seed, 0 for the padding of the last chunk. ``shares (P,)``,
    ``shifts (A,)``, ``taus (T,)``, ``sigma``, ``gamma`` traced (their values in ``spec`` are
    not read, so one compiled program serves every value); the n axis is static (its subsampling
    law differs)."""
    Z, U, E, prio, uq, zs = draws  # (S, Kmax, d), (S, Kmax), ...
    S, Kmax, d = Z.shape
    dtype = Z.dtype
    k = jnp.arange(1, Kmax + 1)
    e1 = jnp.zeros(d, dtype).at[0].set(1.0)
    if spec.law == "contaminated":
        out = (U[None, :, :] < shares[:, None, None]).astype(dtype)  # (P, S, Kmax)
        base = gamma * Z  # (S, Kmax, d)
        mu = (base[None, None] + out[:, None, :, :, None] * shifts[None, :, None, None, None]
              * e1)  # (P, A, S, Kmax, d)
    else:
        j = jnp.round(shares * SHARE_DENOM).astype(jnp.int32)
        out = ((k[None, :] * j[:, None]) // SHARE_DENOM
               > ((k[None, :] - 1) * j[:, None]) // SHARE_DENOM)  # (P, Kmax)
        u = e1 + spec.jitter * Z
        u = u / jnp.linalg.norm(u, axis=-1, keepdims=True)  # (S, Kmax, d)
        mu = jnp.where(out[:, None, None, :, None], shifts[None, :, None, None, None] * u,
                       gamma * Z)  # (P, A, S, Kmax, d)
    stats, aux = [], []
    for ni, n in enumerate(spec.ns):
        values, auxv = [], []
        xbar = mu + sigma / math.sqrt(n) * E  # (P, A, S, Kmax, d)
        lv, lp = _engine.collision_law(n, spec.n_sub)
        cdf = jnp.asarray(np.cumsum(lp)[:-1], dtype)
        q = jnp.asarray(lv, dtype)[jnp.searchsorted(cdf, uq, method="compare_all")]  # (S, nK, Kmax)
        spread = sigma * jnp.sqrt(jnp.maximum(q / spec.n_sub ** 2 - 1.0 / n, 0.0))
        for ki, K in enumerate(spec.Ks):
            x = xbar[..., :K, :]
            pool = jnp.mean(x, axis=-2)
            m = max(1, min(K, math.ceil(spec.m_frac * K)))
            p_ = prio[:, ki, :K]
            rank = jnp.sum(p_[:, None, :] < p_[:, :, None], axis=-1)  # (S, K)
            chosen = (rank < m).astype(dtype)
            dom = x + (spread[:, ki, :K, None] * zs[:, ki, :K, :])
            sub = jnp.sum(chosen[:, :, None] * dom, axis=-2) / m
            c0 = _sorted_median(x)  # (P, A, S, d)
            shape = c0.shape[:-1]
            rows = int(np.prod(shape))
            xs = tuple(x[..., i].reshape(rows, K) for i in range(d))
            c0f = c0.reshape(rows, d)
            T = taus.shape[0]
            med = _median_distance(x, c0).reshape(rows)
            crule = jnp.asarray(MEDIAN_DIST_C, dtype)
            # one batch: every grid tau and every median-distance rule, rows (tau, cell-seed)
            tau_all = jnp.concatenate([jnp.broadcast_to(taus[:, None], (T, rows)),
                                       crule[:, None] * med[None]])
            nt = T + len(MEDIAN_DIST_C)
            c_all, cnt_all = _match(xs, c0f, tau_all, spec)
            c_all = c_all.reshape((nt,) + shape + (d,))
            cnt_all = cnt_all.reshape((nt,) + shape)
            cg, cr = c_all[:T], c_all[T:]
            cnt, cntr = cnt_all[:T], cnt_all[T:]
            tr = (crule[:, None] * med[None]).reshape((len(MEDIAN_DIST_C),) + shape)
            # plug-in: eps_hat from the pilot (c = 1) matched set
            med = med.reshape(shape)
            pilot = cr[MEDIAN_DIST_C.index(PILOT_C)]
            t_pilot = PILOT_C * med
            dist2 = jnp.sum((x - pilot[..., None, :]) ** 2, axis=-1)
            w = (dist2 < (t_pilot * t_pilot)[..., None]).astype(dtype)
            ns_ = jnp.sum(w, axis=-1)
            mean_w = jnp.sum(w[..., None] * x, axis=-2) / jnp.maximum(ns_, 1.0)[..., None]
            var_w = (jnp.sum(w[..., None] * (x - mean_w[..., None, :]) ** 2, axis=(-2, -1))
                     / jnp.maximum(ns_ - 1.0, 1.0))
            eps_hat = jnp.sqrt(var_w / jnp.maximum(ns_, 1.0))
            tp = jnp.maximum(jnp.where(ns_ >= 2, PLUG_IN_MARGIN * eps_hat, t_pilot), 1e-6)
            cp, cntp = _match(xs, c0f, tp.reshape(1, -1), spec)
            cp, cntp = cp.reshape(shape + (d,)), cntp.reshape(shape)
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


# The figures CLI sets --xla_backend_optimization_level=0 for the whole process (compiling the
# engine's many programs dominates there); these programs are compiled once and then run hundreds of
# chunks, so they ask for full backend optimisation (measured ~4x faster per chunk on CPU). The draws
# ask for it too: the level changes the last bit of some normals, and a scheduler job's process (or a
# caller whose JAX started before the flag was set) must draw the same numbers as the driver.
_COMPILER_OPTIONS = {"xla_backend_optimization_level": 3}


@functools.lru_cache(maxsize=16)
def _compiled(spec: GridSpec) -> Callable:
    """The map's two programs (draws, then the chunk's statistics), kept in the program store
    (:class:`poolsim._programs.Program`): ``spec`` (plain numbers and strings) and the compiler
    options decide what they trace to, so a second process loads them instead of compiling."""
    ident = f"{spec!r} {sorted(_COMPILER_OPTIONS.items())!r}"
    draws = _programs.Program(jax.jit(functools.partial(_draws, spec), compiler_options=_COMPILER_OPTIONS),
                              "phase-draws", ident)
    chunk = _programs.Program(jax.jit(functools.partial(_chunk, spec), compiler_options=_COMPILER_OPTIONS),
                              "phase-chunk", ident)
    return lambda keys, *args: chunk(draws(keys), *args)


def aux_names(spec: GridSpec) -> tuple:
    """Names of :attr:`Moments.aux` entries: the rules' mean tau (median_dist_c and plug_in),
    then the mean matched-domain count at each tau of the grid and each rule."""
    return (tuple(f"tau of {r}" for r in RULES)
            + tuple(f"matched domains, tau={t:g}" for t in spec.taus)
            + tuple(f"matched domains, {r}" for r in RULES))


def _parts(spec: GridSpec, shares, shifts, seeds: np.ndarray, chunk: int, progress=None) -> list:
    """Per chunk of ``seeds``: the compiled program's ``[sums, gram, aux]`` (float64), in seed order."""
    _cache.enable_jax_cache()
    # the traced parameters are left out of the compiled program's cache key
    fn = _compiled(spec._replace(taus=len(spec.taus), sigma=None, gamma=None))
    dt = jnp.float32
    traced = (jnp.asarray(spec.taus, dt), jnp.asarray(spec.sigma, dt), jnp.asarray(spec.gamma, dt))
    sh, sf = jnp.asarray(shares, jnp.float32), jnp.asarray(shifts, jnp.float32)
    parts = []
    for start in range(0, len(seeds), chunk):
        block = seeds[start:start + chunk]
        padded = np.concatenate([block, np.full(chunk - len(block), block[-1])])
        keys = jax.vmap(_rng.fast_key)(jnp.asarray(padded, dtype=jnp.uint32))
        weight = jnp.asarray(np.arange(chunk) < len(block), jnp.float32)
        parts.append([np.asarray(t, np.float64) for t in fn(keys, weight, sh, sf, *traced)])
        if progress is not None:
            progress(len(block))
    return parts


def _job_parts(x64: bool, *args) -> list:
    """:func:`_parts` in a scheduler job, under the driver's ``jax_enable_x64`` (a fresh process has
    its own default, and the program's dtypes follow it)."""
    jax.config.update("jax_enable_x64", x64)
    return _parts(*args)


def run_grid(spec: GridSpec, shares, shifts, *, seeds: int | np.ndarray, chunk: int = 16,
             progress: Callable[[int], None] | None = None, resources=None, jobs_dir=None) -> Moments:
    """The map's statistics for every cell: ``Moments`` with ``sums (n_n, n_K, P, A, V)``, ``gram
    (n_n, n_K, P, A, V, V)``, ``aux (n_n, n_K, P, A, Aux)`` over seeds ``0..seeds-1`` (or the
    given seeds). Seed s uses ``jax.random.key(s)``'s stream (through the engine's fast key), so
    a seed's values do not depend on the chunking. ``chunk`` seeds per call of the compiled
    program (one compile per ``spec``, grid size and chunk).

    ``resources`` (:class:`poolsim.cluster.Resources`, executor ``processes`` or ``slurm``): the seeds
    are split into ``max_concurrent`` blocks of whole chunks, each a scheduler job (its own process and
    compile; logs under ``jobs_dir``, a folder every job can reach), and the chunks' sums are added in the
    same order as here: the same ``Moments``, bit for bit."""
    shares, shifts = _check_grid(spec.law, shares, shifts)
    taus = np.asarray(spec.taus, float)
    if taus.size == 0 or not np.all(np.isfinite(taus)) or taus.min() <= 0:
        raise ValueError(f"taus must be a non-empty tuple of finite numbers > 0, got {spec.taus}")
    _checks.POSITIVE.check("sigma", spec.sigma)
    _checks.NONNEGATIVE.check("gamma", spec.gamma)
    if not spec.Ks or min(spec.Ks) < 2 or list(spec.Ks) != sorted(set(spec.Ks)):
        raise ValueError(f"Ks must be strictly increasing integers >= 2, got {spec.Ks}")
    if not spec.ns or min(spec.ns) < 1:
        raise ValueError(f"ns must be integers >= 1, got {spec.ns}")
    if isinstance(seeds, (int, np.integer)) and not isinstance(seeds, bool):
        if seeds < 1:
            raise ValueError(f"seeds must be a positive count, got {seeds}")
        seeds = np.arange(int(seeds))
    seeds = np.asarray(seeds, np.int64)
    if chunk < 1:
        raise ValueError(f"chunk must be a positive integer, got {chunk}")
    if resources is not None and resources.executor != "local" and jobs_dir is None:
        raise ValueError("jobs_dir: give a folder for the jobs' logs (shared by every node under slurm)")
    if resources is not None and resources.submit_only:
        raise ValueError("submit_only: the decision map waits for its seed blocks (their sums are its result)")
    if resources is not None and resources.executor != "local":
        # seed blocks as scheduler jobs; each returns its chunks' parts, summed below in seed order
        n_chunks = -(-len(seeds) // chunk)
        per = chunk * -(-n_chunks // resources.max_concurrent)
        x64 = bool(jax.config.jax_enable_x64)
        jobs = []
        for i in range(0, len(seeds), per):
            args = (x64, spec, shares, shifts, seeds[i:i + per], chunk)
            # the name carries a digest of the job's arguments: a Slurm job of another grid recorded in
            # jobs_dir (a killed driver's) is never attached to as if it were this one
            digest = hashlib.sha256(pickle.dumps(args)).hexdigest()[:12]
            jobs.append(_cluster.Job(f"seeds_{i}_{digest}", _job_parts, args))
        outcome = _cluster.run_jobs(jobs_dir, jobs, resources, progress=False, desc="decision map seed blocks")
        if outcome.failed:
            raise _cluster.GridFailed(outcome.failed)
        parts = [p for j in jobs for p in outcome.results[j.name]]
        if progress is not None:
            progress(len(seeds))
    else:
        parts = _parts(spec, shares, shifts, seeds, chunk, progress)
    tot = None
    for part in parts:
        tot = part if tot is None else [a + b for a, b in zip(tot, part)]
    tot_s, tot_g, tot_a = tot
    n = len(seeds)
    sums = np.moveaxis(tot_s, 2, -1)  # (nn, nK, P, A, V)
    return Moments(sums, tot_g, n, np.moveaxis(tot_a / n, 2, -1))  # aux: (nn, nK, P, A, Aux)


__all__ = ["LAWS", "RULES", "GridSpec", "Moments", "run_grid", "aux_names"]
