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


def from_callable(fn: Callable[[Any, int], Any], *, d: int, mu_star: Any = 0.0,
                  name: str = "custom", mean: Any = None, cov: Any = None,
                  symmetric: bool = False, iid: bool = True) -> MetaDist:
    """Wrap a user callable ``fn(key, K) -> (K, d)`` (JAX, traceable for the engine) as a
    :class:`MetaDist`. The returned shape is checked on every call."""
    if not callable(fn):
        raise ValueError(f"fn must be callable as fn(key, K) -> (K, d), got {type(fn).__name__}")
    d = _checks.integer("d", d, 1)
    mu = _vec("mu_star", mu_star, d)
    if cov is not None:
        cov = np.asarray(cov, dtype=float)
        if cov.shape != (d, d) or not np.all(np.isfinite(cov)):
            raise ValueError(f"cov must be a finite (d, d) = ({d}, {d}) matrix, got shape {cov.shape}")
    return MetaDist(name, d, fn, mu, None if mean is None else _vec("mean", mean, d), cov,
                    bool(symmetric), bool(iid), {})
