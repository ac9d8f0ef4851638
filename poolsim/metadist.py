"""Meta-distributions D_mu over domain means (paper §2, Assumption 2, Example 1, Appendix figures).

Every factory has the same shape: it checks its parameters and returns a :class:`MetaDist`, a small
NamedTuple that is called as ``metadist(key, K) -> (K, d)`` JAX array of domain means (``key``: int
seed or JAX key). Sampling is pure JAX, so the Monte-Carlo engine can ``vmap`` it over seeds. For
the built-in factories except :func:`balanced`, the first ``K`` rows of a draw of ``K_max`` rows
are the draw of ``K`` (domains arrive in order; ``balanced`` puts its unpaired domain last).

Each result documents E[mu_k] (``mean``), Cov[mu_k] (``cov``), whether D_mu is symmetric about
mu_* (Def. 4, ``symmetric``) and whether the K means are i.i.d. (``iid``). To add a
meta-distribution, write one more factory here in the same shape.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import numpy as np

from . import _checks
from ._strategies import as_key

__all__ = ["MetaDist", "symmetric_gaussian", "balanced", "contaminated", "skewed",
           "outlier_schedule", "from_callable"]


class MetaDist(NamedTuple):
    """A meta-distribution. Call it: ``metadist(key, K) -> (K, d)`` domain means.

    ``mean``/``cov`` are E[mu_k] (d,) and Cov[mu_k] (d, d) as NumPy arrays, or None where they are
    not defined by the law alone (e.g. they depend on K). ``params`` holds the factory's arguments.
    """

    name: str
    d: int
    sample: Callable[[Any, int], Any]
    mu_star: np.ndarray
    mean: np.ndarray | None
    cov: np.ndarray | None
    symmetric: bool
    iid: bool
    params: dict

    def __call__(self, key: Any, K: int):
        K = _checks.integer("K", K, 1)
        out = self.sample(as_key(key), K)
        if tuple(out.shape) != (K, self.d):
            raise ValueError(f"meta-distribution {self.name!r} returned shape {tuple(out.shape)}; "
                             f"expected (K, d) = ({K}, {self.d})")
        return out


def _vec(name: str, value: Any, d: int) -> np.ndarray:
    v = np.broadcast_to(np.asarray(value, dtype=float), (d,)).copy() if np.ndim(value) == 0 else (
        np.asarray(value, dtype=float))
    if v.shape != (d,):
        raise ValueError(f"{name} must be a scalar or a vector of shape (d,) = ({d},), got {v.shape}")
    if not np.all(np.isfinite(v)):
        raise ValueError(f"{name} contains NaN or inf")
    return v


def _unit(direction: Any, d: int) -> np.ndarray:
    v = np.eye(d)[0] if direction is None else _vec("direction", direction, d)
    n = np.linalg.norm(v)
    if n == 0:
        raise ValueError("direction must be a nonzero vector")
    return v / n


def _nonneg(name: str, value: Any) -> float:
    return float(_checks.NONNEGATIVE.check(name, value))


def symmetric_gaussian(gamma: float, *, d: int, mu_star: Any = 0.0) -> MetaDist:
    """``mu_k ~ N(mu_*, gamma^2 I)`` i.i.d. -- symmetric about mu_*; E = mu_*, Cov = gamma^2 I.

    The paper's "symmetric D_mu, spread gamma = 1.5" (Appendix, Thm 2 experiment). Unbiased is not
    small: with K = 15 the mean of the draws still scatters by gamma / sqrt(K) around mu_*.
    """
    import jax

    d = _checks.integer("d", d, 1)
    g = _nonneg("gamma", gamma)
    mu = _vec("mu_star", mu_star, d)
    return MetaDist("symmetric_gaussian", d,
                    lambda key, K: mu + g * jax.random.normal(key, (K, d)),
                    mu, mu, g * g * np.eye(d), True, True, {"gamma": g})


def balanced(gamma: float, *, d: int, mu_star: Any = 0.0) -> MetaDist:
    """Antithetic ("symmetrically oriented") means: ``mu_* + gamma z_j`` and ``mu_* - gamma z_j``
    for pairs ``z_j ~ N(0, I)``, plus one domain at mu_* when K is odd.

    The paper's picture for Thm 2: the sample mean of the K means is exactly mu_* for every draw.
    Not i.i.d. (the means come in mirrored pairs); each mean is marginally N(mu_*, gamma^2 I) (or
    exactly mu_* for the odd one), so E = mu_* and it is symmetric about mu_*.
    """
    import jax.numpy as jnp
    import jax

    d = _checks.integer("d", d, 1)
    g = _nonneg("gamma", gamma)
    mu = _vec("mu_star", mu_star, d)

    def sample(key, K):
        z = g * jax.random.normal(key, ((K + 1) // 2, d))
        pairs = jnp.stack([z, -z], axis=1).reshape(-1, d)[:K]
        if K % 2:  # the last row is an unpaired +z: put it at mu_* instead
            pairs = pairs.at[-1].set(0.0)
        return mu + pairs

    return MetaDist("balanced", d, sample, mu, mu, None, True, False, {"gamma": g})


def contaminated(p: float, alpha: float, *, d: int, gamma: float = 0.5, direction: Any = None,
                 mu_star: Any = 0.0) -> MetaDist:
    """Directional-mass contamination (Assumption 2(d), Example 1; the paper's "asymmetric").

    ``mu_k = mu_* + gamma z_k + B_k alpha v`` with ``z_k ~ N(0, I)``, ``B_k ~ Bernoulli(p)``, unit
    ``v`` (default e_1): a majority near mu_* and a fraction p shifted by alpha along v.
    E = mu_* + p alpha v (so the pooled mean is *biased* unless p alpha = 0),
    Cov = gamma^2 I + p (1 - p) alpha^2 v v^T. Not symmetric for 0 < p < 1 and alpha > 0.
    ``gamma`` is not given by the paper; 0.5 is our choice.
    """
    import jax

    d = _checks.integer("d", d, 1)
    p = float(_checks.UNIT.check("p", p))
    a, g = _nonneg("alpha", alpha), _nonneg("gamma", gamma)
    mu, v = _vec("mu_star", mu_star, d), _unit(direction, d)

    def sample(key, K):
        kz, kb = jax.random.split(key)
        b = jax.random.bernoulli(kb, p, (K, 1))
        return mu + g * jax.random.normal(kz, (K, d)) + b * (a * v)

    return MetaDist("contaminated", d, sample, mu, mu + p * a * v,
                    g * g * np.eye(d) + p * (1 - p) * a * a * np.outer(v, v),
                    p * a == 0 or p == 1, True,
                    {"p": p, "alpha": a, "gamma": g, "direction": v})


def skewed(scale: float, *, d: int, gamma: float = 0.3, direction: Any = None,
           mu_star: Any = 0.0) -> MetaDist:
    """Skewed but mean-preserving: ``mu_k = mu_* + gamma z_k + scale (E_k - 1) v``,
    ``E_k ~ Exponential(1)``, ``z_k ~ N(0, I)``.

    E = mu_* exactly (E[E_k - 1] = 0), Cov = gamma^2 I + scale^2 v v^T, but the mass piles up on
    the -v side: the density's mode is near ``mu_* - scale v`` (where E_k = 0) while a long tail
    runs along +v. Not symmetric for scale > 0. Use it to ask whether matching converges to the
    mean or to the mode.
    """
    import jax

    d = _checks.integer("d", d, 1)
    s, g = _nonneg("scale", scale), _nonneg("gamma", gamma)
    mu, v = _vec("mu_star", mu_star, d), _unit(direction, d)

    def sample(key, K):
        kz, ke = jax.random.split(key)
        e = jax.random.exponential(ke, (K, 1))
        return mu + g * jax.random.normal(kz, (K, d)) + s * (e - 1.0) * v

    return MetaDist("skewed", d, sample, mu, mu, g * g * np.eye(d) + s * s * np.outer(v, v),
                    s == 0, True, {"scale": s, "gamma": g, "direction": v})


def outlier_schedule(every: int = 3, radius: float = 2.5, *, d: int, gamma: float = 0.5,
                     direction: Any = None, jitter: float = 0.2, mu_star: Any = 0.0) -> MetaDist:
    """Domain-addition schedule (Appendix, Thm 3 figure): domain k = 1, 2, ... is an outlier when
    ``k % every == 0``, else an inlier ``mu_* + gamma z_k``.

    An outlier sits at exactly ``||mu_k - mu_*|| = radius`` in direction
    ``normalize(v + jitter z_k)`` around a fixed unit ``v`` (default e_1), so the outliers are on
    one side -- asymmetric addition. Not i.i.d. (depends on position k); E and Cov depend on K and
    are None. ``gamma`` and ``jitter`` are our choices; the paper gives only ``every = 3`` and
    ``radius ~ 2.5``.
    """
    import jax
    import jax.numpy as jnp

    d = _checks.integer("d", d, 1)
    every = _checks.integer("every", every, 1)
    r, g, j = _nonneg("radius", radius), _nonneg("gamma", gamma), _nonneg("jitter", jitter)
    mu, v = _vec("mu_star", mu_star, d), _unit(direction, d)

    def sample(key, K):
        z = jax.random.normal(key, (K, d))
        u = v + j * z
        u = u / jnp.linalg.norm(u, axis=1, keepdims=True)
        outlier = (jnp.arange(1, K + 1) % every == 0)[:, None]
        return mu + jnp.where(outlier, r * u, g * z)

    return MetaDist("outlier_schedule", d, sample, mu, None, None, False, False,
                    {"every": every, "radius": r, "gamma": g, "jitter": j, "direction": v})


# Domains per key when from_callable traces a sampler to check it.
_PROBE_K = 8


def from_callable(fn: Callable[[Any, int], Any], *, d: int, mu_star: Any = 0.0,
                  name: str = "custom", mean: Any = None, cov: Any = None,
                  symmetric: bool = False, iid: bool = True) -> MetaDist:
    """Wrap a user sampler ``fn(key, K) -> (K, d)`` as a :class:`MetaDist`.

    ``fn`` draws the K domain means from the typed JAX PRNG ``key`` it is given, with JAX random
    functions, e.g. Student-t means ``lambda key, K: 0.5 * jax.random.t(key, 2.0, (K, d))``. The
    Monte-Carlo engine runs it inside ``jax.jit`` and ``jax.vmap``, one key per seed, so
    ``from_callable`` traces it that way first (``jax.vmap`` over two keys, 8 domains each; traced,
    not compiled or run) and raises ``ValueError`` for a sampler that

    * cannot be traced (it converts the key or a draw to NumPy or to a Python number), or
    * ignores its key: its draws are not computed from it, as NumPy's or Python's random numbers are
      not -- traced, they are drawn once, and every seed would get the same domain means.

    Such a sampler is refused rather than run per seed on the host: its draws would not follow the
    seeds (the same seeds would not give the same results) and a host call per seed would serialise
    the engine's compiled draws. ``mu_star`` (the target ``eps`` is measured from), ``mean`` and
    ``cov`` (E[mu_k] and Cov[mu_k], for :mod:`poolsim.theory`; ``None``: unknown) and the flags are
    yours to state. The returned shape is checked on every call.
    """
    if not callable(fn):
        raise ValueError(f"fn must be callable as fn(key, K) -> (K, d), got {type(fn).__name__}")
    d = _checks.integer("d", d, 1)
    mu = _vec("mu_star", mu_star, d)
    if cov is not None:
        cov = np.asarray(cov, dtype=float)
        if cov.shape != (d, d) or not np.all(np.isfinite(cov)):
            raise ValueError(f"cov must be a finite (d, d) = ({d}, {d}) matrix, got shape {cov.shape}")
    _try_sampler(fn, d, name)
    return MetaDist(name, d, fn, mu, None if mean is None else _vec("mean", mean, d), cov,
                    bool(symmetric), bool(iid), {})


def _try_sampler(fn: Callable[[Any, int], Any], d: int, name: str) -> None:
    """``ValueError`` unless ``fn(key, _PROBE_K)`` traces under ``jax.vmap`` over two keys (as the engine runs
    it), returns an array and depends on its key.

    Traced, not run (compiling a sampler such as ``jax.random.t`` takes seconds): the draws depend on the
    key iff the traced program's output is computed from its input, which :func:`_reads_input` finds in
    the program. A NumPy sampler's draws are a constant of that program."""
    import jax

    how = (f"write it with JAX random functions of the key it is given, e.g. "
           f"lambda key, K: jax.random.t(key, 2.0, (K, {d}))")
    keys = jax.random.split(jax.random.key(0), 2)
    try:
        program, out = jax.make_jaxpr(jax.vmap(lambda key: fn(key, _PROBE_K)), return_shape=True)(keys)
    except jax.errors.JAXTypeError as e:  # a tracer converted to NumPy, a Python number or a bool
        raise ValueError(f"sampler {name!r} cannot be traced by JAX ({type(e).__name__}): the engine runs "
                         f"it under jax.jit and jax.vmap, one key per seed; {how}") from e
    except Exception as e:  # noqa: BLE001 - any other failure of the user's code, named, with its traceback
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ValueError(f"sampler {name!r} failed when traced by JAX ({type(e).__name__}: {first}); {how}") from e
    if not isinstance(out, jax.ShapeDtypeStruct):
        raise ValueError(f"sampler {name!r} returned {type(out).__name__}, not a (K, d) array; {how}")
    if not _reads_input(program.jaxpr):
        raise ValueError(f"sampler {name!r} ignores its key (NumPy's or Python's random numbers are drawn "
                         f"once, when JAX traces it): every seed would get the same domain means; {how}")


def _reads_input(jaxpr) -> bool:
    """Some output of ``jaxpr`` (a ``jax.make_jaxpr`` program) is computed from one of its inputs.

    Forward through the equations: an equation with a dependent input makes every output dependent (an
    over-approximation for equations with inner programs, never an under-approximation). Variables are
    followed by identity; literals and captured constants never depend on the inputs."""
    live = {id(v) for v in jaxpr.invars}
    for eqn in jaxpr.eqns:
        if any(id(v) in live for v in eqn.invars):
            live.update(id(v) for v in eqn.outvars)
    return any(id(v) in live for v in jaxpr.outvars)
