"""The paper's synthetic experiments (Appendix "Synthetic Validation of Theoretical Guarantees").

``run(name, *, seeds, **params) -> pandas.DataFrame`` -- one tidy row per (strategy, seed, K) with
``eps = ||estimate - mu_*||_2`` (float64; the column dtypes: :func:`run`). Defaults are the paper's
parameters; values the paper leaves out are our choices, marked "(ours)", and every one is a
parameter. :func:`run`'s docstring lists them all -- the parameters every experiment takes and each
experiment's own -- with their defaults and allowed values, generated from the registry
(:data:`COMMON_PARAMS`, ``EXPERIMENTS[name].params``) that also checks them: a value outside its
allowed range is a ``ValueError`` worded as that table's column.
``metadist=`` replaces the experiment's meta-distribution (any :class:`poolsim.metadist.MetaDist` of
dimension d, e.g. from :func:`poolsim.metadist.from_callable`; eps is then measured from its
``mu_star``); the parameters of the law it replaces (``EXPERIMENTS[name].law_params``, e.g. ``p``,
``alpha``, ``gamma`` and ``mu_star`` for ``asymptotic``) are then a ``ValueError``: they would change
nothing.

Memory (``run``, ``simulate``, ``summarize``): ``memory_budget=`` bytes (or ``"4GB"``,
``"512MiB"``; default the environment variable ``POOLSIM_MEMORY_BUDGET``, else half of the free
host memory, or 3/4 of the device's free memory on an accelerator) bounds the engine's working
memory: chunks hold as many seeds as fit (docs/engine.md). A size of which one seed cannot fit
raises ``MemoryBudgetError`` (a :class:`ValueError`) before any work, naming the
parameters, the bytes one seed needs and the budget.

Multi-process (``jax.distributed``): every process calls :func:`init_distributed` (or
``jax.distributed.initialize``) first, then ``run(..., distributed=True)`` with the same arguments;
each process simulates an equal block of the seeds and every process gets the gathered frame
(write files from ``jax.process_index() == 0`` only). Same seeds -> the single-process frame.

``summarize(name, *, seeds, **params)``: the same experiment reduced on the device to per-K means,
variances and t-intervals of eps and of the paired differences the verdicts use -- no per-seed
arrays on the host, for seed counts of 10^7 and more.

To add an experiment: one more :class:`Experiment` entry in ``EXPERIMENTS``.
"""
from __future__ import annotations

import math
from types import MappingProxyType
from typing import Any, Callable, Mapping, NamedTuple

import jax
import numpy as np
import pandas as pd

from . import _checks, _core, _engine, metadist as md


class Param(NamedTuple):
    """An experiment parameter: ``allowed`` -- a numeric range (``str()`` gives it as ``[0, 1]``,
    ``(0, inf)``, ...; checked by :func:`resolve` with the one range-error wording), a tuple of choices
    (checked too) or a phrase (checked where the value is used) -- and ``doc``, what it means."""

    allowed: Any
    doc: str


_INT1 = _checks.Range(1, math.inf, integer=True)

COMMON = dict(sigma=0.8, d=2, mu_star=0.0, metric="l2", init="median", tol=1e-4, max_iter=100,
              m_frac=0.5, n_sub=10, materialize=True, dtype="float32", chunk=1024, metadist=None)
COMMON_PARAMS = {
    "sigma": Param(_checks.POSITIVE, "within-domain standard deviation (paper)"),
    "d": Param(_INT1, "dimension of the data"),
    "mu_star": Param("a number or a (d,) vector", "the target mean (paper: 0)"),
    "metric": Param(_core.METRICS, "matching's distance (paper: l2)"),
    "init": Param(("median", "mean", "target"), "matching's first centroid: the coordinate-wise median of all "
                  "samples (paper), their mean, or mu_star itself (Thm 2c)"),
    "tol": Param(_checks.POSITIVE, "matching's convergence tolerance (paper)"),
    "max_iter": Param(_INT1, "matching's iteration cap (ours)"),
    "m_frac": Param(_checks.Range(0.0, 1.0, lo_open=True), "subsampling (Def. 2) draws m = ceil(m_frac K) "
                    "domains, with replacement (ours: the paper gives no m)"),
    "n_sub": Param(_INT1, "subsampling: points drawn from each of the m domains (ours; n_sub << n as Def. 2 asks)"),
    "materialize": Param((True, False), "True: draw every sample (the paper's sample-median init); False: exact "
                         "sufficient statistics and the median of the domain means (fast, cost flat in n)"),
    "dtype": Param(("float32", "float64"), "the engine's float type"),
    "chunk": Param(_INT1, "seeds per device call at most"),
    "metadist": Param("None or a poolsim.metadist.MetaDist of dimension d", "replaces the experiment's "
                      "meta-distribution (metadist.from_callable makes one from a sampler)"),
}
"""The parameters every experiment takes (defaults: ``COMMON``): allowed values and meaning."""
_KS = Param("strictly increasing positive integers", "the numbers of domains K the strategies are compared at")
_N = Param(_INT1, "samples per domain")
_TAU = Param(_checks.POSITIVE, "matching's inclusion threshold tau (paper)")
_GAMMA_OURS = Param(_checks.NONNEGATIVE, "spread of the inlier domain means, N(mu_star, gamma^2 I) (ours)")


class Experiment(NamedTuple):
    """A registered experiment: its defaults, how to build its meta-distribution from them,
    ``params``: a :class:`Param` for each of its own parameters (the keys of ``defaults``), and
    ``law_params``: the parameters ``make_metadist`` reads (``d`` aside): a ``metadist=`` given to
    :func:`run` replaces that meta-distribution, so these may not be given beside it."""

    name: str
    description: str
    defaults: dict
    make_metadist: Callable[[dict], md.MetaDist]
    params: Mapping[str, Param] = MappingProxyType({})
    law_params: tuple = ()

EXPERIMENTS = {
    "asymptotic": Experiment(
        "asymptotic",
        "Thm 1: eps_K vs K under an asymmetric (contaminated) D_mu, alpha = 1.5. The paper does not "
        "give the contamination law; ours: fraction p = 0.3 of domains shifted by alpha along e_1, "
        "inlier spread gamma = 0.5.",
        dict(Ks=(5, 10, 20, 30, 40, 50), n=150, tau=1.2, alpha=1.5, p=0.3, gamma=0.5),
        lambda P: md.contaminated(P["p"], P["alpha"], d=P["d"], gamma=P["gamma"], mu_star=P["mu_star"]),
        {"Ks": _KS, "n": _N, "tau": _TAU,
         "alpha": Param(_checks.NONNEGATIVE, "shift of the contaminated domains' means along e_1 (paper)"),
         "p": Param(_checks.UNIT, "share of contaminated domains (ours)"),
         "gamma": _GAMMA_OURS},
        ("p", "alpha", "gamma", "mu_star"),
    ),
    "symmetric": Experiment(
        "symmetric",
        "Thm 2: K = 15 domains from a symmetric D_mu with spread gamma = 1.5. layout='gaussian' draws "
        "i.i.d. N(mu_star, gamma^2 I) means (the theorem's setting); layout='balanced' uses antithetic "
        "pairs whose average is exactly mu_star (the paper's picture).",
        dict(Ks=(15,), n=100, tau=1.0, gamma=1.5, layout="gaussian"),
        lambda P: (md.symmetric_gaussian if P["layout"] == "gaussian" else md.balanced)(
            P["gamma"], d=P["d"], mu_star=P["mu_star"]),
        {"Ks": _KS, "n": _N, "tau": _TAU,
         "gamma": Param(_checks.NONNEGATIVE, "spread of the domain means (paper)"),
         "layout": Param(("gaussian", "balanced"), "gaussian: i.i.d. N(mu_star, gamma^2 I) means (the "
                         "theorem's setting); balanced: antithetic pairs averaging exactly mu_star (the "
                         "paper's picture)")},
        ("gamma", "layout", "mu_star"),
    ),
    "domain_addition": Experiment(
        "domain_addition",
        "Thm 3: K grows 5 -> 30, every third domain an outlier at distance 2.5 from mu_star on one side "
        "(direction e_1 with angular jitter 0.2, ours); inliers N(mu_star, 0.5^2 I) (ours).",
        dict(Ks=tuple(range(5, 31)), n=100, tau=1.1, every=3, radius=2.5, gamma=0.5, jitter=0.2),
        lambda P: md.outlier_schedule(P["every"], P["radius"], d=P["d"], gamma=P["gamma"],
                                      jitter=P["jitter"], mu_star=P["mu_star"]),
        {"Ks": _KS, "n": _N, "tau": _TAU,
         "every": Param(_INT1, "every every-th domain (k = every, 2 every, ...) is an outlier (paper: 3)"),
         "radius": Param(_checks.NONNEGATIVE, "the outliers' distance from mu_star (paper)"),
         "gamma": _GAMMA_OURS,
         "jitter": Param(_checks.NONNEGATIVE, "the outliers' angular jitter around e_1, radians (ours)")},
        ("every", "radius", "gamma", "jitter", "mu_star"),
    ),
}


def _seeds(seeds: Any) -> np.ndarray:
    if isinstance(seeds, (int, np.integer)) and not isinstance(seeds, bool):
        if seeds <= 0:
            raise ValueError(f"seeds must be a positive count or a list of seeds, got {seeds}")
        return np.arange(int(seeds))
    arr = np.asarray(seeds)
    if arr.ndim != 1 or arr.size == 0 or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"seeds must be a positive count or a non-empty list of ints, got {seeds!r}")
    if arr.min() < 0 or arr.max() >= 2**32:
        raise ValueError("seeds must lie in [0, 2**32)")
    return arr.astype(np.int64)


def resolve(name: str, params: dict) -> tuple[dict, md.MetaDist]:
    """Defaults + overrides, validated; returns ``(params, metadist)``."""
    if name not in EXPERIMENTS:
        raise ValueError(f"name must be one of {tuple(EXPERIMENTS)}, got {name!r}")
    exp = EXPERIMENTS[name]
    P = {**COMMON, **exp.defaults}
    unknown = set(params) - set(P)
    if unknown:
        raise ValueError(f"unknown parameter(s) {sorted(unknown)} for experiment {name!r}; "
                         f"allowed: {sorted(P)}")
    P.update(params)
    Ks = tuple(int(k) for k in np.atleast_1d(P["Ks"]))
    if not Ks or Ks[0] < 1 or any(b <= a for a, b in zip(Ks, Ks[1:])):
        raise ValueError(f"Ks must be strictly increasing positive integers, got {P['Ks']!r}")
    P["Ks"] = Ks
    for key, param in {**COMMON_PARAMS, **exp.params}.items():  # the ranges and choices run()'s tables show
        if isinstance(param.allowed, _checks.Range):
            param.allowed.check(key, P[key])
        elif isinstance(param.allowed, tuple):
            _checks.choice(key, P[key], param.allowed)
    dist = P["metadist"] if P["metadist"] is not None else exp.make_metadist(P)
    if not isinstance(dist, md.MetaDist):
        raise ValueError("metadist must be a poolsim.metadist.MetaDist (see metadist.from_callable)")
    if dist.d != P["d"]:
        raise ValueError(f"metadist has d = {dist.d} but d = {P['d']}")
    if P["metadist"] is not None:
        ignored = [k for k in exp.law_params if k in params]
        if ignored:
            raise ValueError(f"{', '.join(ignored)} set the {name!r} experiment's own meta-distribution, which "
                             f"metadist= replaces: leave them out (the target mu_star is the metadist's)")
        P["mu_star"] = dist.mu_star  # the target eps is measured from, as the engine's summaries do
    # Shape check: a wrong (K, d) raises here, naming the meta-distribution. Traced, not run:
    # running the sampler op by op compiles each operation (~2 s in a fresh process, measured).
    jax.eval_shape(lambda: dist(0, Ks[-1]))
    return P, dist


class _Sampler:
    """``key -> (K_max, d)`` means; equal (and hashing equal) when built from the same experiment
    parameters (``chunk`` aside), so a second :func:`spec` call with the same arguments reuses the
    compiled engine.
    A user-supplied ``metadist`` compares by identity. ``store_key``: the parameters as a string
    when they alone decide the sampler (a registered experiment's meta-distribution), so that
    the engine's compiled programs can be stored across processes; ``None`` for a user-supplied
    ``metadist``."""

    def __init__(self, dist: md.MetaDist, K_max: int, ident: Any, store_key: str | None = None):
        self.dist, self.K_max, self.ident, self.store_key = dist, K_max, ident, store_key

    def __call__(self, key):
        return self.dist.sample(key, self.K_max)

    def __eq__(self, other):
        return isinstance(other, _Sampler) and self.ident == other.ident

    def __hash__(self):
        return hash(self.ident)


def spec(name: str, **params) -> tuple[_engine.Spec, dict]:
    """The engine's static :class:`~poolsim._engine.Spec` for an experiment, and the parameters."""
    P, dist = resolve(name, params)
    K_max = P["Ks"][-1]
    mu = tuple(float(v) for v in dist.mu_star)
    # ``chunk`` (seeds per program call) is left out: it changes the programs' argument shapes,
    # which the compiled-program caches key on anyway, not what the programs compute, so runs with
    # another ``chunk`` reuse the programs of every shape they share
    ident = (name, K_max, id(dist)) if P["metadist"] is not None else (
        name, K_max, repr(sorted((k, v) for k, v in P.items() if k not in ("metadist", "chunk"))))
    store_key = None if P["metadist"] is not None else repr(ident)
    return _engine.Spec(_Sampler(dist, K_max, ident, store_key), K_max, P["d"], P["Ks"], int(P["n"]),
                        float(P["sigma"]), float(P["tau"]), P["metric"], P["init"], float(P["tol"]),
                        int(P["max_iter"]), float(P["m_frac"]), int(P["n_sub"]), mu,
                        bool(P["materialize"])), P


def init_distributed(coordinator_address: str | None = None, num_processes: int | None = None,
                     process_id: int | None = None, **kwargs) -> None:
    """Check the ``jax.distributed`` settings, then call ``jax.distributed.initialize`` with them.

    ``coordinator_address`` ("HOST:PORT" of process 0; default: the environment variable
    ``JAX_COORDINATOR_ADDRESS``), ``num_processes`` >= 1 and ``process_id`` in
    ``[0, num_processes)``; all three may be left out on Slurm / Open MPI / TPU, where JAX
    detects them. ``kwargs`` go to ``jax.distributed.initialize`` unchanged. A malformed value
    raises ValueError naming the argument or environment variable (JAX's own errors for these
    are an IndexError or a bare int() failure). Call it before any other JAX computation.
    """
    import os

    import jax

    given = coordinator_address is not None
    address = coordinator_address if given else os.environ.get("JAX_COORDINATOR_ADDRESS")
    name = "coordinator_address" if given else "environment variable JAX_COORDINATOR_ADDRESS"
    if address is not None:
        host, _, port = str(address).rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{name} must be 'HOST:PORT' with PORT in 1..65535 (the address of "
                             f"process 0), got {address!r}")
    ids = os.environ.get("JAX_LOCAL_DEVICE_IDS")
    if ids is not None and not all(p.strip().isdigit() for p in ids.split(",")):
        raise ValueError(f"environment variable JAX_LOCAL_DEVICE_IDS must be comma-separated "
                         f"device numbers such as '0,1', got {ids!r}")
    if num_processes is not None:
        _checks.integer("num_processes", num_processes, 1)
    if process_id is not None:
        _checks.integer("process_id", process_id, 0,
                        num_processes - 1 if num_processes is not None else math.inf)
    if address is None and process_id is not None and num_processes is not None and num_processes > 1:
        raise ValueError("coordinator_address is not set: pass coordinator_address='HOST:PORT' "
                         "(process 0's address) or set the environment variable "
                         "JAX_COORDINATOR_ADDRESS")
    jax.distributed.initialize(address, num_processes, process_id, **kwargs)


def simulate(name: str, *, seeds: Any = 10, progress: Callable[[int], None] | None = None,
             shard: bool = True, distributed: bool = False, summary: bool = False,
             fields: tuple | None = None, memory_budget: Any = None,
             **params) -> tuple[Any, dict]:
    """Raw per-seed arrays (:class:`poolsim._engine.SeedResult`, leading axis S), or with
    ``summary=True`` their on-device reduction (:class:`poolsim._engine.Summary`), and the
    resolved parameters. ``fields``: the SeedResult fields to bring to the host (default all;
    the others are ``None``). ``distributed=True``: see the module docstring (multi-process).
    ``memory_budget``: bytes or a string such as ``"4GB"`` (module docstring, Memory)."""
    s, P = spec(name, **params)
    seed_arr = _seeds(seeds)
    if not isinstance(distributed, bool):
        raise ValueError(f"distributed must be True or False, got {distributed!r}")
    res = _engine.simulate(s, seed_arr, dtype=P["dtype"], chunk=P["chunk"], shard=shard,
                           progress=progress, distributed=distributed, summary=summary,
                           fields=fields, memory_budget=memory_budget)
    P["seeds"] = seed_arr
    return res, P


# The SeedResult fields :func:`frame` reads: all that :func:`run` brings to the host.
FRAME_FIELDS = ("estimates", "n_domains", "converged", "n_iter")


# Rows per block of :func:`eps`: its float64 temporaries stay in cache, not the size of the frame.
_EPS_BLOCK = 1 << 16


def eps(estimates: np.ndarray, mu_star: Any) -> np.ndarray:
    """``||estimate - mu_*||_2`` in float64 over the last axis: ``estimates (..., d)`` ->
    ``(...)``. The same numbers as ``np.linalg.norm(estimates.astype(float) - mu, axis=-1)``
    (which sums the squares left to right for ``d < 8``, as this does), computed in blocks of
    rows so that its only full-size allocation is the result."""
    d = estimates.shape[-1]
    mu = np.broadcast_to(np.asarray(mu_star, dtype=float), (d,))
    flat = np.asarray(estimates).reshape(-1, d)
    out = np.empty(len(flat))
    tmp = np.empty(min(_EPS_BLOCK, len(flat)))
    for a in range(0, len(flat), _EPS_BLOCK):
        x, o = flat[a:a + _EPS_BLOCK], out[a:a + _EPS_BLOCK]
        if d >= 8:  # NumPy's pairwise summation then groups the terms differently: use it
            o[...] = np.linalg.norm(x.astype(float) - mu, axis=-1)
            continue
        t = tmp[:len(o)]
        o[...] = 0.0
        for j in range(d):
            np.subtract(x[:, j], mu[j], out=t, dtype=float)
            np.multiply(t, t, out=t)
            o += t
        np.sqrt(o, out=o)
    return out.reshape(estimates.shape[:-1])


def _shared(a: np.ndarray) -> np.ndarray:
    """``a`` itself where pandas may write into it; a copy of a read-only array (the per-seed
    arrays gathered straight from an accelerator), which pandas could not assign into."""
    return a if a.flags.writeable else a.copy()


def frame(name: str, res: _engine.SeedResult, P: dict) -> pd.DataFrame:
    """Tidy frame from :func:`simulate`'s output: one row per (seed, K, strategy), seed-major,
    ``N = S * len(Ks) * 3`` rows. Reads only :data:`FRAME_FIELDS`. Columns and dtypes:

    * ``experiment``, ``strategy``: categoricals (int8 codes; compare with strings as usual);
    * ``seed``: uint32 (seeds lie in ``[0, 2**32)``, the engine's own seed type);
    * ``K``, ``n_domains``, ``n_iter``: int32 (``n_iter`` is 0 for pool and subsample);
    * ``converged``: bool (True for pool and subsample);
    * ``eps``: float64, ``||estimate - mu_*||_2`` formed in float64 (:func:`eps`);
    * ``est_0`` .. ``est_{d-1}``: float64, the estimate's coordinates exactly as the engine computed
      them (in its ``dtype``, float32 by default), widened so that pandas' reductions of them
      (``df.est_0.mean()``, ``groupby(...).var()``) accumulate in float64 as they always did: pandas
      reduces a float32 column in float32.

    Integer columns are 32-bit, not smaller: NumPy's float functions give float64 for 32-bit
    integers (``np.sqrt(df.K)``) but float32 or float16 for 16- or 8-bit ones; pandas reduces them
    in 64 bits.

    Few new bytes (the frame's first build costs page faults, not arithmetic): ``n_domains`` (and
    ``est_*`` for a float64 engine) are views of ``res``'s arrays (so the frame shares their memory:
    copy the frame before writing into it if you keep using ``res``), the other columns are one
    allocation each, written in place, handed to pandas without a copy (one block per column)."""
    S, nK, n_strat, d = res.estimates.shape
    N = S * nK * n_strat
    shape = (S, nK, n_strat)

    def filled(dtype, fill, last):  # ones/zeros with the matching column (index 2) from `last`
        col = np.full(N, fill, dtype)
        col.reshape(shape)[..., 2] = last
        return col

    # a float32 engine's estimates: one contiguous (writable) float64 copy; a float64 engine's:
    # the array itself, copied only where it is read-only
    wide = _shared(res.estimates.astype(np.float64, copy=False))
    cols = {
        "experiment": pd.Categorical.from_codes(np.zeros(N, np.int8), categories=[name]),
        "strategy": pd.Categorical.from_codes(np.tile(np.arange(n_strat, dtype=np.int8), S * nK),
                                              categories=list(_engine.STRATEGIES)),
        "seed": np.repeat(np.asarray(P["seeds"]).astype(np.uint32), nK * n_strat),
        "K": np.tile(np.repeat(np.asarray(P["Ks"], np.int32), n_strat), S),
        "eps": eps(res.estimates, P["mu_star"]).reshape(N),
        "n_domains": _shared(res.n_domains.astype(np.int32, copy=False)).reshape(N),
        "converged": filled(bool, True, res.converged),
        "n_iter": filled(np.int32, 0, res.n_iter),
    }
    for j in range(d):
        cols[f"est_{j}"] = wide[..., j].reshape(N)  # a strided view of `wide`, no further copy
    if not np.isfinite(cols["eps"].max()):  # eps >= 0: the max is finite iff every entry is
        raise RuntimeError(f"non-finite eps in experiment {name!r}; this is a bug, please report")
    return pd.DataFrame(cols, copy=False)


def run(name: str, *, seeds: Any = 10, progress: Callable[[int], None] | None = None,
        distributed: bool = False, memory_budget: Any = None, **params) -> pd.DataFrame:
    """Run a registered experiment for ``seeds`` (a count S -> seeds 0..S-1, or a list of seeds).

    Returns the per-seed frame (:func:`frame`): ``S * len(Ks) * 3`` rows, one per (seed, K,
    strategy), seed-major. Columns and dtypes: ``experiment``, ``strategy`` categorical;
    ``seed`` uint32; ``K``, ``n_domains``, ``n_iter`` int32; ``converged`` bool; ``eps`` and
    ``est_0`` .. ``est_{d-1}`` float64 (the estimates exactly as the engine computed them).

    Same seeds and parameters -> identical frames. Only the fields the frame reads cross from the
    device. ``params``: the experiment's parameters, all with defaults (the tables below, generated from
    :data:`COMMON_PARAMS` and ``EXPERIMENTS[name].params``; :func:`parameter_table` prints one).
    ``distributed=True`` runs the seeds across the processes of a ``jax.distributed`` job (module
    docstring; raises RuntimeError if ``jax.distributed`` was not initialised).
    ``memory_budget``: bytes or a string such as ``"4GB"`` bounding the engine's working memory
    (module docstring, Memory); the frame itself comes on top.

    <!-- generated at import -->
    """
    res, P = simulate(name, seeds=seeds, progress=progress, distributed=distributed,
                      fields=FRAME_FIELDS, memory_budget=memory_budget, **params)
    return frame(name, res, P)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _allowed(allowed: Any) -> str:
    if isinstance(allowed, _checks.Range):
        return f"integer in {allowed}" if allowed.integer else str(allowed)
    if isinstance(allowed, tuple):
        return ", ".join(repr(a) for a in allowed)
    return str(allowed)


def parameter_table(name: str | None = None) -> str:
    """The parameters of experiment ``name`` as a Markdown table (parameter, default, allowed values,
    meaning): its own (``EXPERIMENTS[name]``), or with ``name=None`` the ones every experiment takes
    (:data:`COMMON_PARAMS`). Allowed ranges read ``[0, 1]`` (ends included), ``(0, inf)`` (excluded)."""
    if name is not None and name not in EXPERIMENTS:
        raise ValueError(f"name must be None or one of {tuple(EXPERIMENTS)}, got {name!r}")
    defaults, params = (COMMON, COMMON_PARAMS) if name is None else (EXPERIMENTS[name].defaults,
                                                                      EXPERIMENTS[name].params)
    rows = ["| parameter | default | allowed | meaning |", "|---|---|---|---|"]
    for key, value in defaults.items():
        param = params.get(key, Param("-", "-"))
        rows.append(f"| `{key}` | `{value!r}` | {_cell(_allowed(param.allowed))} | {_cell(param.doc)} |")
    return "\n".join(rows)


def _parameters_doc() -> str:
    parts = ["**Parameters every experiment takes**", "", parameter_table()]
    for name, exp in EXPERIMENTS.items():
        parts += ["", f"**Experiment `{name}`**: {exp.description}", "", parameter_table(name)]
    return "\n".join(parts)


def _fill(doc: str, text: str, mark: str = "<!-- generated at import -->") -> str:
    """``doc`` with its ``mark`` line replaced by ``text``, indented as the mark was."""
    lines = doc.splitlines()
    i = next(j for j, ln in enumerate(lines) if ln.strip() == mark)
    pad = lines[i][:len(lines[i]) - len(lines[i].lstrip())]
    return "\n".join(lines[:i] + [pad + t if t else t for t in text.splitlines()] + lines[i + 1:])


run.__doc__ = _fill(run.__doc__ or "", _parameters_doc())


def summarize(name: str, *, seeds: Any = 10, progress: Callable[[int], None] | None = None,
              distributed: bool = False, memory_budget: Any = None, **params) -> pd.DataFrame:
    """:func:`run`'s numbers reduced on the device, for seed counts whose per-seed frame would not
    fit in host memory: one row per (K, quantity) with ``n_seeds``, ``mean``, ``var`` (ddof 1),
    ``ci_low``, ``ci_high``. Quantities: eps of each strategy (interval as :func:`ci95`), and the
    paired per-seed differences ``"pool - match"``, ``"subsample - match"``, ``"subsample - pool"``
    (estimate and interval as :func:`poolsim.decide_claim` on the two eps columns: NaN interval
    under ``MIN_SEEDS`` seeds). Equal to the same statistics of :func:`run`'s frame up to float
    rounding (eps is formed in float64 when JAX's x64 mode is on, else in float32).
    ``memory_budget``: as for :func:`run`."""
    from scipy import stats

    from . import _verdict

    summ, P = simulate(name, seeds=seeds, progress=progress, distributed=distributed, summary=True,
                       memory_budget=memory_budget, **params)
    n = summ.n_seeds
    half = (stats.t.ppf(0.5 + _verdict.LEVEL / 2, n - 1) * np.sqrt(summ.var / n) if n > 1
            else np.zeros_like(summ.mean))
    paired = np.array([q not in _engine.STRATEGIES for q in _engine.QUANTITIES])
    if n < _verdict.MIN_SEEDS:
        half = np.where(paired, np.nan, half)
    nK, Q = summ.mean.shape
    return pd.DataFrame({
        "experiment": name,
        "K": np.repeat(np.asarray(P["Ks"]), Q),
        "quantity": np.tile(np.array(_engine.QUANTITIES), nK),
        "n_seeds": n,
        "mean": summ.mean.ravel(),
        "var": summ.var.ravel(),
        "ci_low": (summ.mean - half).ravel(),
        "ci_high": (summ.mean + half).ravel(),
    })


def ci95(values: Any) -> tuple[float, float, float]:
    """Mean and a 95% Student-t interval over seeds (``scipy.stats.t``); width 0 for one seed.
    Non-finite entries (e.g. an undefined per-mode error) are left out; all NaN if none is left."""
    from scipy import stats

    v = np.asarray(values, dtype=float).ravel()
    v = v[np.isfinite(v)]
    if v.size == 0:
        return math.nan, math.nan, math.nan
    m = float(v.mean())
    if v.size < 2:
        return m, m, m
    h = float(stats.t.ppf(0.975, v.size - 1) * v.std(ddof=1) / math.sqrt(v.size))
    return m, m - h, m + h
