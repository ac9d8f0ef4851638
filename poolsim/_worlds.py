"""Plausible worlds for :func:`poolsim.advise`: laws of the domain means, fitted to a user's K
domains, from which new data sets with a *known* target can be drawn.

A world is a centre ``c`` (the target: the inliers' mean), an inlier law ``N(c, B + sigma^2/n_k I)``
(``B`` the between-domain covariance, ``sigma^2 / n_k`` the noise of a domain mean of ``n_k``
samples), an outlier share ``p`` and a law of the outliers. Two families of fits, both of which may
be plausible for the same data (:func:`plausible`):

* ``robust``: a high-breakdown isotropic fit on distances only, so any ``d`` (``d`` = 768 with K = 6
  included): concentration steps of the ``h = K // 2 + 1`` domain means nearest the centre, from the
  geometric median (Rousseeuw and Van Driessen's C-step, on ``||m_k - c||^2``), the spread from
  those ``h`` with the chi-squared consistency factor of the trimmed set, then one reweighting at the
  ``chi2_d`` 0.975 quantile. Its outliers are the observed domains beyond that cut, resampled *as
  they are* (offset from ``c``, noise included): no direction or shape is assumed for them.
* ``mixture k spherical``: scikit-learn's ``GaussianMixture`` with ``k`` = 1..3 spherical components
  (whichever have at most K / 2 parameters, and only where at least two values of ``k`` fit, so that
  the BIC has an alternative), every fit within :data:`BIC_MARGIN` of the lowest BIC; the heaviest
  component is the inlier law and the others, as fitted, the outliers' law.

A fitted world is then checked against the data it was fitted to (:func:`fit_p_values`): the
observed value of two rotation-invariant statistics of the domain means against their law in
:data:`GOF_DRAWS` draws from the world -- the *asymmetry* ``||pooled mean - geometric median||``
over the root mean square distance from the mean (outliers on one side pull the pool away from the
median) and the *anisotropy* (the largest eigenvalue's share of the centred means' scatter: the
paper's inlier law is isotropic, so a spread along one direction is evidence of outliers along it).
Both are one-sided: a world is implausible when the data are more asymmetric or more anisotropic
than it makes them, at the 5% level per statistic (:data:`GOF_LEVEL`). A world that fits the BIC
but not these (say one wide isotropic cloud, for data that are two overlapping ones) is dropped;
when every world is dropped the data are outside all of them, and all are kept.

Draws (:func:`draw`) are exact in distribution for every estimator that depends on the domain
means only through inner products (pooling, subsampling, matching from the geometric median):
an isotropic world in ``d`` dimensions is drawn in ``r + K`` (``r`` the outliers' rank) -- the
inliers' components orthogonal to the outliers' span are replaced by the rows of a Bartlett
factor of their Wishart Gram matrix -- so ``d`` enters only through that Gram law.
"""
from __future__ import annotations

import math
from typing import Iterator, NamedTuple

import numpy as np

BIC_MARGIN = 6.0  # mixture fits within this BIC of the best are plausible ("strong" evidence is > 6)
REWEIGHT_QUANTILE = 0.975  # the robust fit's reweighting cut, the MCD's customary one
MAX_COMPONENTS = 3
GOF_LEVEL = 0.05  # a world whose Monte Carlo p-value of either statistic is below this is implausible
GOF_DRAWS = 1000  # draws per world for those p-values (standard error <= 0.007 at p = 0.05)
# spherical components: the paper's law of the domain means is isotropic about its centre; full
# covariances were measured too (benchmarks/advise_validation.py) and moved no answer for the better
COVARIANCES = ("spherical",)


class World(NamedTuple):
    """One fitted law of the domain means. ``centre (d,)``: the target; ``between (d, d)`` or a
    float (isotropic, per coordinate): the inliers' between-domain covariance; ``share``: the
    outlier share p; ``weights (K,)``: the observed domains that are outliers (resampling
    probabilities, sum 1, or all 0 when p = 0); ``bic``: BIC above the best mixture (0 for
    ``robust``); ``components``: a mixture's outlier components ``(probability, mean offset from
    the centre (d,), covariance (d, d))``, drawn instead of resampling ``weights`` when present;
    ``fit_p``: the smaller of the world's two goodness-of-fit p-values (:func:`fit_p_values`)."""

    name: str
    centre: np.ndarray
    between: object
    share: float
    weights: np.ndarray
    bic: float
    components: tuple = ()
    fit_p: float = 1.0

    @property
    def spread(self) -> float:
        """Root mean square distance of a noise-free inlier mean from the centre."""
        b = self.between
        tr = float(np.trace(b)) if np.ndim(b) == 2 else float(b) * self.centre.shape[0]
        return math.sqrt(max(tr, 0.0))


def geometric_median(M: np.ndarray, iters: int = 60) -> np.ndarray:
    """Weiszfeld's iteration from the mean, batched: ``M (..., K, D) -> (..., D)``. Rotation
    invariant (unlike the coordinate-wise median), so it can be computed in any orthonormal frame;
    a point within ``1e-9`` of the scale of ``M`` of the iterate gets weight ``1e9 / scale``."""
    c = M.mean(axis=-2)
    floor = 1e-9 * max(float(np.max(np.abs(M))), 1e-300)
    for _ in range(iters):
        r = np.sqrt(np.maximum(np.sum((M - c[..., None, :]) ** 2, axis=-1), 0.0))
        w = 1.0 / np.maximum(r, floor)
        c = np.einsum("...k,...kd->...d", w, M) / w.sum(axis=-1)[..., None]
    return c


def robust(means: np.ndarray, sizes: np.ndarray, sigma: float) -> World:
    """The ``robust`` world of the module docstring: ``means (K, d)``, ``sizes (K,)``."""
    from scipy import stats

    K, d = means.shape
    noise = sigma * sigma / sizes
    h = K // 2 + 1
    c = geometric_median(means)
    for _ in range(100):  # C-steps: the h nearest never get farther on average, so this ends
        near = np.argsort(np.sum((means - c) ** 2, axis=1), kind="stable")[:h]
        nxt = means[near].mean(axis=0)
        if np.array_equal(nxt, c):
            break
        c = nxt

    def spread(r2, kept, quantile):
        q = stats.chi2.ppf(quantile, d)
        kappa = stats.chi2.cdf(q, d + 2) / stats.chi2.cdf(q, d)  # E[chi2_d | chi2_d < q] / d
        return float(np.mean(r2[kept]) / (d * kappa))

    r2 = np.sum((means - c) ** 2, axis=1)
    total = spread(r2, np.argsort(r2, kind="stable")[:h], h / K)
    between = max(total - float(noise.mean()), 0.0)
    inl = r2 <= (between + noise) * stats.chi2.ppf(REWEIGHT_QUANTILE, d)
    c = means[inl].mean(axis=0)
    r2 = np.sum((means - c) ** 2, axis=1)
    total = spread(r2, inl, REWEIGHT_QUANTILE)
    between = max(total - float(noise[inl].mean()), 0.0)
    out = ~inl
    weights = out / out.sum() if out.any() else np.zeros(K)
    return World("robust", c, between, float(out.mean()), weights, 0.0)


def mixtures(means: np.ndarray, sizes: np.ndarray, sigma: float) -> list[World]:
    """The ``mixture`` worlds of the module docstring (none when even one spherical component has
    more than K / 2 parameters)."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.mixture import GaussianMixture

    K, d = means.shape
    noise = float(np.mean(sigma * sigma / sizes))
    fits = []
    for cov in COVARIANCES:
        for k in range(1, MAX_COMPONENTS + 1):
            per = 1 if cov == "spherical" else d * (d + 1) // 2  # covariance parameters
            if (k - 1) + k * (d + per) > K / 2:
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConvergenceWarning)
                gm = GaussianMixture(k, covariance_type=cov, n_init=3, random_state=0,
                                     reg_covar=1e-6 * max(noise, 1e-12)).fit(means)
            fits.append((float(gm.bic(means)), gm, cov))
    if len({f[1].n_components for f in fits}) < 2:  # a BIC margin needs an alternative to compare with
        return []
    low = min(f[0] for f in fits)
    worlds = []
    for b, gm, cov in fits:
        if b - low > BIC_MARGIN:
            continue
        j = int(np.argmax(gm.weights_))
        cj = gm.covariances_[j]
        total = cj * np.eye(d) if cov == "spherical" else np.asarray(cj)
        vals, vecs = np.linalg.eigh(total - noise * np.eye(d))
        between = (vecs * np.maximum(vals, 0.0)) @ vecs.T
        other = 1.0 - gm.predict_proba(means)[:, j]
        share = 1.0 - float(gm.weights_[j])
        weights = other / other.sum() if other.sum() > 0 and share > 0 else np.zeros(K)
        others = [i for i in range(gm.n_components) if i != j]
        comps = tuple((gm.weights_[i] / max(share, 1e-300), gm.means_[i] - gm.means_[j],
                       gm.covariances_[i] * np.eye(d) if cov == "spherical" else gm.covariances_[i])
                      for i in others)
        worlds.append(World(f"mixture {gm.n_components} {cov}", gm.means_[j], between,
                            share if weights.any() else 0.0, weights, b - low, comps))
    return worlds


def fit_statistics(M: np.ndarray, n: np.ndarray) -> np.ndarray:
    """The asymmetry and anisotropy of the module docstring: ``M (..., K, D)``, ``n (..., K)`` ->
    ``(..., 2)``. Rotation invariant (the anisotropy from the eigenvalues of the centred means'
    Gram matrix), so a world drawn in ``r + K`` dimensions gives them the law of ``d``."""
    K = M.shape[-2]
    pool = np.einsum("...k,...kd->...d", n, M) / n.sum(axis=-1)[..., None]
    C = M - M.mean(axis=-2, keepdims=True)
    # the nonzero eigenvalues of the K x K Gram matrix are those of the D x D scatter: the smaller one
    gram = "...kd,...jd->...kj" if K <= M.shape[-1] else "...kd,...ke->...de"
    ev = np.linalg.eigvalsh(np.einsum(gram, C, C))
    total = np.maximum(ev.sum(axis=-1), 1e-300)
    asym = np.linalg.norm(pool - geometric_median(M), axis=-1) / np.sqrt(total / K)
    return np.stack([asym, ev[..., -1] / total], axis=-1)


def fit_p_values(world: World, means: np.ndarray, sizes: np.ndarray, sigma: float,
                 rng: np.random.Generator, draws: int = GOF_DRAWS) -> np.ndarray:
    """One-sided Monte Carlo p-values ``(2,)`` of the observed :func:`fit_statistics` of ``means
    (K, d)`` under ``world``: ``(1 + #{draws at least as extreme}) / (1 + draws)``."""
    obs = fit_statistics(means, sizes)
    # ~32 MB per (chunk, K, D) array
    sim = np.concatenate([fit_statistics(M, n) for M, n in draw_chunks(world, means, sizes, sigma, rng, draws, 4e6)])
    return (1.0 + np.sum(sim >= obs, axis=0)) / (1.0 + draws)


class Plausible(NamedTuple):
    """:func:`plausible`'s answer: the ``robust`` fit (always; its centre and spread scale the
    advice's tau grid), the ``worlds`` kept and the ``rejected`` ones (each with its ``fit_p``)."""

    robust: World
    worlds: list
    rejected: list


def plausible(means: np.ndarray, sizes: np.ndarray, sigma: float, rng: np.random.Generator) -> Plausible:
    """Every world of the module docstring for ``means (K, d)``, robust first, split by the
    goodness-of-fit check (all kept when none passes it); ``rng`` draws the check's worlds."""
    fitted = [robust(means, sizes, sigma)] + mixtures(means, sizes, sigma)
    fitted = [w._replace(fit_p=float(fit_p_values(w, means, sizes, sigma, rng).min())) for w in fitted]
    kept = [w for w in fitted if w.fit_p >= GOF_LEVEL]
    if not kept:
        return Plausible(fitted[0], fitted, [])
    return Plausible(fitted[0], kept, [w for w in fitted if w.fit_p < GOF_LEVEL])


def draw_chunks(world: World, means: np.ndarray, sizes: np.ndarray, sigma: float, rng: np.random.Generator,
                S: int, elements: float, per_draw: int = 1) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """:func:`draw`'s ``S`` data sets in chunks of at most ``elements / per_draw`` numbers per data set
    and domain coordinate (the draws' dimension is at most ``r + K <= 2K``, or ``d``): bounded memory for
    any S. Each chunk is drawn when the caller asks for it, so ``rng`` is shared with the caller's use of
    it between chunks in a fixed order."""
    K, d = means.shape
    chunk = max(1, min(S, int(elements // (K * (min(d, 2 * K) + K) * per_draw))))
    for lo in range(0, S, chunk):
        yield draw(world, means, sizes, sigma, rng, min(chunk, S - lo))


def draw(world: World, means: np.ndarray, sizes: np.ndarray, sigma: float,
         rng: np.random.Generator, S: int) -> tuple[np.ndarray, np.ndarray]:
    """``S`` data sets of K domain means from ``world``, centred on its target (the target is 0):
    ``(M (S, K, D), n (S, K))``, the sizes resampled from ``sizes`` (an outlier keeps its own).
    ``D = d``, or ``r + K`` for an isotropic world with ``d > r + K`` (module docstring)."""
    K, d = means.shape
    offsets = means - world.centre
    out = rng.random((S, K)) < world.share
    pick = rng.choice(K, size=(S, K), p=world.weights) if world.weights.any() else np.zeros((S, K), int)
    out &= bool(world.weights.any())
    n = np.where(out, sizes[pick], sizes[rng.integers(0, K, size=(S, K))]).astype(float)
    scale = np.sqrt(sigma * sigma / n)  # (S, K) the noise sd of each inlier mean
    if world.components:  # a mixture world: its outliers are fresh draws from its other components
        probs = np.array([w for w, _, _ in world.components])
        which = rng.choice(len(probs), size=(S, K), p=probs / probs.sum())
        z = rng.standard_normal((S, K, d))
        fresh = np.zeros((S, K, d))
        for i, (_, mean, cov) in enumerate(world.components):
            ch = np.linalg.cholesky(np.asarray(cov) + 1e-12 * np.eye(d))
            fresh = np.where((which == i)[..., None], mean + z @ ch.T, fresh)
        offsets_pick = fresh
    else:
        offsets_pick = offsets[pick]
    if np.ndim(world.between) == 2:
        chol = np.linalg.cholesky(world.between + 1e-12 * np.eye(d) * max(world.spread ** 2, 1e-12))
        inl = rng.standard_normal((S, K, d)) @ chol.T + scale[..., None] * rng.standard_normal((S, K, d))
        return np.where(out[..., None], offsets_pick, inl), n
    sd = np.sqrt(float(world.between) + scale * scale)  # isotropic: one sd per inlier mean
    used = offsets[world.weights > 0]
    basis = np.linalg.qr(used.T)[0] if used.size else np.zeros((d, 0))
    if used.size:  # keep the directions the outliers really span
        basis = basis[:, np.linalg.norm(used @ basis, axis=0) > 1e-12 * max(np.abs(used).max(), 1e-300)]
    r = basis.shape[1]
    if d <= r + K:  # small d: draw as it is
        return np.where(out[..., None], offsets_pick, sd[..., None] * rng.standard_normal((S, K, d))), n
    # span part: outliers' coordinates, inliers' Gaussian coordinates; the d - r orthogonal
    # coordinates of K isotropic normals have the Gram law of the rows of a Bartlett factor L (K, K)
    # of Wishart_K(d - r, I): L_ii ~ sqrt(chi2_{d - r - i}), L_ij ~ N(0, 1) below the diagonal
    span = np.where(out[..., None], (offsets @ basis)[pick], sd[..., None] * rng.standard_normal((S, K, r)))
    L = np.tril(rng.standard_normal((S, K, K)), -1)
    idx = np.arange(K)
    L[:, idx, idx] = np.sqrt(rng.chisquare(d - r - idx, size=(S, K)))
    rest = np.where(out[..., None], 0.0, sd[..., None] * L)
    return np.concatenate([span, rest], axis=-1), n


__all__ = ["BIC_MARGIN", "GOF_DRAWS", "GOF_LEVEL", "Plausible", "World", "draw", "draw_chunks", "fit_p_values", "fit_statistics",
           "geometric_median", "mixtures", "plausible", "robust"]
