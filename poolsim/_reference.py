"""Plain NumPy, loop-based versions of the three strategies: the test oracle.

Written the obvious way on purpose -- explicit Python loops over domains (and over samples
where samples are the unit), ``np.median``,
``np.arccos`` of the clipped cosine -- and sharing no code with :mod:`poolsim._core`, so that an
agreement between the two is evidence, not a tautology. Slow; use the public strategies for work.
"""
from __future__ import annotations

import numpy as np


def _valid_rows(X, counts):
    K, N, _ = X.shape
    counts = [N] * K if counts is None else [int(c) for c in counts]
    return [X[k, : counts[k]] for k in range(K)]


def ref_naive_pool(X, counts=None) -> np.ndarray:
    """Mean of every valid sample, accumulated one domain at a time."""
    total, n = np.zeros(X.shape[2]), 0
    for rows in _valid_rows(np.asarray(X, dtype=float), counts):
        total += rows.sum(axis=0)
        n += len(rows)
    return total / n


def ref_subsample_mean(X, domains, indices) -> np.ndarray:
    """Mean of ``X[domains[j], indices[j, i]]`` over all j, i (loops)."""
    X = np.asarray(X, dtype=float)
    total, n = np.zeros(X.shape[2]), 0
    for j, k in enumerate(np.asarray(domains)):
        for i in np.asarray(indices)[j]:
            total += X[int(k), int(i)]
            n += 1
    return total / n


def ref_subsample(rng: np.random.Generator, X, m, n, counts=None) -> np.ndarray:
    """Def. 2 with NumPy's generator (same law as :func:`poolsim.subsample`, different draws)."""
    X = np.asarray(X, dtype=float)
    K, N, _ = X.shape
    counts = [N] * K if counts is None else list(counts)
    domains = rng.choice(K, size=m, replace=False)
    indices = np.array([rng.integers(0, counts[k], size=n) for k in domains])
    return ref_subsample_mean(X, domains, indices)


def ref_distance(v, c, metric) -> float:
    if metric == "l2":
        return float(np.sqrt(np.sum((v - c) ** 2)))
    nv, nc = np.linalg.norm(v), np.linalg.norm(c)
    cos = 0.0 if nv == 0 or nc == 0 else float(np.dot(v, c) / (nv * nc))
    cos = min(1.0, max(-1.0, cos))
    if metric == "cosine":
        return 1.0 - cos
    if metric == "geodesic":
        return float(np.arccos(cos))
    raise ValueError(f"metric must be one of ('l2', 'cosine', 'geodesic'), got {metric!r}")


def ref_match(X, tau, *, metric="l2", level="domain", init="median", tol=1e-4, max_iter=100,
              counts=None):
    """Def. 3 with loops. Returns ``(centroid, included, n_iter, converged)`` like
    :func:`poolsim.match` (included: list of 0/1 per domain, or per real sample in domain-major
    order)."""
    X = np.asarray(X, dtype=float)
    rows = _valid_rows(X, counts)
    all_samples = np.concatenate(rows, axis=0)
    if isinstance(init, str):
        c = np.median(all_samples, axis=0) if init == "median" else all_samples.mean(axis=0)
    else:
        c = np.asarray(init, dtype=float)
    if level == "domain":
        units = [(r.mean(axis=0), r) for r in rows]  # (what the gate sees, samples it brings)
    else:
        units = [(x, x[None, :]) for r in rows for x in r]
    included = [0] * len(units)
    for t in range(1, max_iter + 1):
        inc = [1 if ref_distance(p, c, metric) < tau else 0 for p, _ in units]
        total, n = np.zeros(X.shape[2]), 0
        for flag, (_, samples) in zip(inc, units):
            if flag:
                total += samples.sum(axis=0)
                n += len(samples)
        if n == 0:
            return c, inc, t, False
        new = total / n
        moved = np.sqrt(np.sum((new - c) ** 2))
        c, included = new, inc
        if moved < tol:
            return c, included, t, True
    return c, included, max_iter, False


def ref_geometric_median(m) -> np.ndarray:
    """argmin_y sum_k ||m_k - y|| of ``m (K, d)`` by Weiszfeld's iteration from the mean, to a step below
    1e-12 (at most 200 steps); an iterate on a data point returns that point."""
    c = m.mean(axis=0)
    for _ in range(200):
        r = np.linalg.norm(m - c, axis=1)
        if np.any(r < 1e-12):
            return m[np.argmin(r)]
        c_new = (m / r[:, None]).sum(axis=0) / (1.0 / r).sum()
        if np.linalg.norm(c_new - c) < 1e-12:
            return c_new
        c = c_new
    return c


def ref_match_means(m, n, tau, c, tol=1e-4, max_iter=100) -> np.ndarray:
    """Domain-level L2 matching on domain means ``m (K, d)`` with sizes ``n (K,)`` from ``c``: include
    ``||m_k - c|| < tau``, move to the size-weighted mean of the included, stop below ``tol``; an empty
    set keeps ``c``."""
    for _ in range(max_iter):
        inside = np.linalg.norm(m - c, axis=1) < tau
        if not inside.any():
            return c
        new = (n[inside, None] * m[inside]).sum(axis=0) / n[inside].sum()
        if np.linalg.norm(new - c) < tol:
            return new
        c = new
    return c


def ref_true_risks(observe, taus, fresh) -> tuple[np.ndarray, np.ndarray]:
    """Errors ``||estimate||`` (the target is 0) of pooling ``(fresh,)`` and of matching from the geometric
    median at each tau ``(fresh, T)`` on ``fresh`` data sets ``observe() -> (means (K, d), sizes (K,))``,
    one at a time with :func:`ref_geometric_median` and :func:`ref_match_means`."""
    pool, match = np.zeros(fresh), np.zeros((fresh, len(taus)))
    for i in range(fresh):
        m, n = observe()
        pool[i] = np.linalg.norm((n[:, None] * m).sum(axis=0) / n.sum())
        c0 = ref_geometric_median(m)
        match[i] = [np.linalg.norm(ref_match_means(m, n, t, c0)) for t in taus]
    return pool, match


def ref_outlier_schedule(rng: np.random.Generator, K, *, d, every, radius, gamma, jitter, mu_star=0.0):
    """NumPy twin of :func:`poolsim.metadist.outlier_schedule` (same law, NumPy draws)."""
    v = np.eye(d)[0]
    means = []
    for k in range(1, K + 1):
        z = rng.standard_normal(d)
        if k % every == 0:
            u = v + jitter * z
            means.append(mu_star + radius * u / np.linalg.norm(u))
        else:
            means.append(mu_star + gamma * z)
    return np.array(means)


def ref_domain_addition(rng: np.random.Generator, *, Ks, n, sigma, tau, every, radius, gamma,
                        jitter, d, m_frac, n_sub, tol, max_iter, metric="l2", samples=None):
    """The domain-addition experiment, one seed, plain loops: for each K the three estimates on
    the first K domains. ``samples: (K_max, n, d)`` shares the engine's draws; otherwise means and
    samples are drawn here with ``rng``. Returns ``{strategy: (len(Ks), d) estimates}``."""
    K_max = max(Ks)
    if samples is None:
        means = ref_outlier_schedule(rng, K_max, d=d, every=every, radius=radius, gamma=gamma,
                                     jitter=jitter)
        samples = np.array([mu + sigma * rng.standard_normal((n, d)) for mu in means])
    out = {"pool": [], "subsample": [], "match": []}
    for K in Ks:
        X = samples[:K]
        out["pool"].append(ref_naive_pool(X))
        out["subsample"].append(ref_subsample(rng, X, max(1, min(K, int(np.ceil(m_frac * K)))), n_sub))
        out["match"].append(ref_match(X, tau, metric=metric, tol=tol, max_iter=max_iter)[0])
    return {k: np.array(v) for k, v in out.items()}


def ref_match_multimodal(X, taus, init, *, metric="l2", level="domain", tol=1e-4, max_iter=100):
    """Multimodal matching with loops (paper's rule: mode m iff inside ball m and outside every
    other ball). ``init``: (M, d) centroids. Returns ``(centroids (M, d), labels, n_iter)`` with
    labels a flat list over domains (or samples), -1 for unassigned."""
    X = np.asarray(X, dtype=float)
    rows = _valid_rows(X, None)
    units = ([(r.mean(axis=0), r) for r in rows] if level == "domain"
             else [(x, x[None, :]) for r in rows for x in r])
    C = [np.asarray(c, dtype=float) for c in init]
    labels = [-1] * len(units)
    for t in range(1, max_iter + 1):
        labels = []
        for p, _ in units:
            inside = [m for m in range(len(C)) if ref_distance(p, C[m], metric) < taus[m]]
            labels.append(inside[0] if len(inside) == 1 else -1)
        new = []
        for m in range(len(C)):
            total, n = np.zeros(X.shape[2]), 0
            for lab, (_, samples) in zip(labels, units):
                if lab == m:
                    for x in samples:
                        total += x
                        n += 1
            new.append(total / n if n else C[m])
        moved = max(np.sqrt(np.sum((a - b) ** 2)) for a, b in zip(new, C))
        C = new
        if moved < tol:
            return np.array(C), labels, t
    return np.array(C), labels, max_iter
