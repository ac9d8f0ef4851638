"""The three ways to combine domains (paper §2, Defs. 1-3), built on :mod:`poolsim._core`.

All take ``X: (K, N, d)`` -- K domains padded to N samples of dimension d -- and an optional
``counts: (K,)`` giving each domain's real sample count (the first ``counts[k]`` rows of ``X[k]``
are used; padding must be finite, e.g. zeros). Inputs may be NumPy arrays, jax.numpy arrays or
torch tensors of real numbers (complex, object and string arrays: ``TypeError``); results come back in
the same array library. Any finite data work, up to the dtype's range: data whose magnitude is far
from 1 are processed scaled by an exact power of two (:func:`pow2_exponent`), so nothing overflows or
underflows and ``match`` is equivariant to scaling; ordinary data go through unscaled.
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from array_api_compat import device, is_numpy_namespace

from . import _checks, _core, _threefry

LEVELS = ("domain", "sample")
INITS = ("median", "mean")


class Pooled(NamedTuple):
    """Result of :func:`naive_pool`. ``mean: (d,)``, ``n_samples``: samples pooled."""

    mean: Any
    n_samples: Any


class Subsampled(NamedTuple):
    """Result of :func:`subsample`. ``mean: (d,)``, ``domains: (m,)`` chosen domain indices,
    ``indices: (m, n)`` sample indices drawn (with replacement) inside each chosen domain."""

    mean: Any
    domains: Any
    indices: Any


class Matched(NamedTuple):
    """Result of :func:`match`.

    ``mean: (d,)`` the matched mean (the mean of every sample of the matched set) and
    ``centroid: (d,)`` the fixed point reached -- equal by construction, both kept so code reads
    like the paper. ``included``: 0/1 weights, ``(K,)`` for ``level="domain"``, ``(K, N)`` for
    ``level="sample"``. ``n_iter``: iterations run. ``converged``: the tolerance was met with a
    non-empty matched set. ``n_matched``: samples in the matched set. If an iteration matched
    nothing, ``mean``/``centroid`` are the previous centroid, ``included`` is all zeros and
    ``converged`` is False.
    """

    mean: Any
    centroid: Any
    included: Any
    n_iter: Any
    converged: Any
    n_matched: Any


def real_array(name: str, a: Any) -> None:
    """``TypeError`` naming ``name`` unless ``a`` holds real numbers (bool, integer or real floating):
    complex values would lose their imaginary part in a float cast, and object, string, bytes and
    date arrays are not numbers (NumPy would parse ``"1.5"`` or warn ``ComplexWarning``)."""
    dtype = getattr(a, "dtype", None)
    if dtype is None:
        return
    try:  # NumPy and JAX dtypes; torch dtypes have is_complex / is_floating_point
        kind = np.dtype(dtype).kind
    except TypeError:
        kind = "c" if getattr(dtype, "is_complex", False) else "f"
    if kind not in "biuf":
        raise TypeError(f"{name} must hold real numbers (bool, integer or floating), got dtype {dtype}")


def prepare_domains(X: Any, counts: Any = None):
    """Validate the padded domains every strategy takes, in their array library.

    ``X: (K, N, d)`` (any array library, or a nested list -> NumPy float), ``counts: (K,)`` integers
    in ``[1, N]`` or ``None`` (every domain has N samples) -> ``(X, valid, counts, xp)``: ``X`` as a
    real floating array (the library's default float if it was not one), ``valid: (K, N)`` 0/1 in
    ``X``'s dtype (row ``i`` of domain ``k`` is a real sample iff ``i < counts[k]``), ``counts: (K,)``
    in ``X``'s dtype and ``xp`` the array-API namespace of ``X``. A wrong shape, an empty axis,
    non-finite ``X`` or out-of-range ``counts`` raises ``ValueError``; for a traced ``X`` or ``counts``
    (inside ``jax.jit``, ``vmap``, ``grad``) the value checks are made when the program runs
    (:func:`poolsim._checks.guard`: a run-time error with the same message).
    """
    return _prepare(X, counts)[:4]


def _prepare(X: Any, counts: Any, also: tuple = ()):
    """:func:`prepare_domains` plus ``k = pow2_exponent(X)`` -> ``(X, valid, counts, xp, k)``; ``also``: as
    for :func:`_validate`."""
    X, cnt, xp = _validate(X, counts, also)
    return X, _valid_rows(X, cnt, xp), cnt, xp, _finite_exponent(X, xp)


def _validate(X: Any, counts: Any, also: tuple = ()):
    """:func:`prepare_domains` without the finiteness check of a concrete ``X`` (:func:`_finite_exponent`
    does it) and without ``valid`` (:func:`_valid_rows`) -> ``(X, counts, xp)``.

    A NumPy ``X`` (or a nested list) with a JAX tracer among ``counts`` and ``also`` (the caller's other
    arguments: a traced ``tau``, ``key``, ``init``) becomes a JAX array, so that the computation is traced
    with them (``jax.jit`` over ``tau`` with ``X`` fixed)."""
    try:
        xp = _core.namespace(X)
    except TypeError:
        X = np.asarray(X)
        real_array("X", X)
        X = X.astype(float)
        xp = _core.namespace(X)
    real_array("X", X)
    if is_numpy_namespace(xp) and any(_checks.is_tracer(a) for a in (counts, *also)):
        import jax.numpy as jnp

        X = jnp.asarray(X)
        xp = _core.namespace(X)
    if X.ndim != 3:
        raise ValueError(f"X must have shape (K, N, d), got {tuple(X.shape)}")
    K, N, d = X.shape
    for name, size in (("K", K), ("N", N), ("d", d)):
        if size == 0:
            raise ValueError(f"X has {name} = 0 (shape {tuple(X.shape)}); each of K, N, d must be >= 1")
    if not xp.isdtype(X.dtype, "real floating"):
        X = xp.astype(X, xp.asarray(0.0).dtype)  # the library's default float
    if _checks.is_tracer(X):  # values unknown: checked when the program runs
        X = _checks.finite("X", X)
    if counts is None:
        cnt = xp.full((K,), float(N), dtype=X.dtype)
    elif _checks.is_tracer(counts):
        if tuple(counts.shape) != (K,):
            raise ValueError(f"counts must have shape (K,) = ({K},), got {tuple(counts.shape)}")
        cnt = xp.astype(counts, X.dtype)
        cnt = _checks.guard(cnt, xp.any((cnt != xp.round(cnt)) | ~(cnt >= 1) | ~(cnt <= N)),
                            f"counts must be integers in [1, N={N}]")
    else:
        c = _checks.to_numpy(counts)
        real_array("counts", c)
        if c.shape != (K,):
            raise ValueError(f"counts must have shape (K,) = ({K},), got {c.shape}")
        if not np.all(np.isfinite(c)) or np.any(c != np.round(c)) or c.min() < 1 or c.max() > N:
            raise ValueError(f"counts must be integers in [1, N={N}], got {c.tolist()}")
        cnt = asarray_like(X, c.astype(float))
    return X, cnt, xp


def _valid_rows(X, cnt, xp):
    """``valid: (K, N)`` 0/1 in ``X``'s dtype: row ``i`` of domain ``k`` is a real sample iff ``i < cnt[k]``."""
    return xp.astype(xp.arange(X.shape[1], dtype=X.dtype)[None, :] < cnt[:, None], X.dtype)


def _finite_exponent(X: Any, xp) -> int:
    """``ValueError`` naming ``X`` if it holds NaN or inf (for a JAX tracer: 0, ``X`` checked at run time by
    :func:`_validate`), else
    :func:`pow2_exponent` of ``X``. On NumPy both come from the same two reductions (``min``, ``max``: NaN
    propagates through both, so both are finite iff every value is)."""
    if _checks.is_tracer(X):  # checked at run time by _validate; the scale of unknown values: 0
        return 0
    if is_numpy_namespace(xp):
        lo, hi = float(np.min(X)), float(np.max(X))
        if not (math.isfinite(lo) and math.isfinite(hi)):  # the check's own error, without its cost when fine
            _checks.finite("X", np.array([lo, hi]))
        return _exponent(max(-lo, hi), X.dtype)
    _checks.finite("X", X)
    return pow2_exponent(X)


def pow2_exponent(X: Any) -> int:
    """``k`` such that ``X * 2**k`` has its largest ``|value|`` in ``[0.5, 1)``, when that largest value is
    outside the safe range ``[2**-(q+1), 2**q)`` (``q = maxexp // 4`` of its dtype: 256 for float64, 32
    for float32); else 0, and 0 for an all-zero ``X`` or a JAX tracer (its values are unknown).

    In the safe range, squared norms of any realistic dimension neither overflow nor underflow to 0, so
    data there go through the matching core as they are. Outside it the strategies work on
    ``X * 2**k``: scaling by a power of two is exact in floating point (the mantissas do not change),
    so every sum, square root, comparison and decision is the one of the unscaled data, computed where
    nothing overflows or underflows, and the results are scaled back exactly."""
    if _checks.is_tracer(X):
        return 0
    a = _checks.to_numpy(X)
    # max |a| from the two extremes: two reductions, no |a| temporary the size of X
    return _exponent(max(-float(np.min(a)), float(np.max(a))) if a.size else 0.0, a.dtype)


def _exponent(top: float, dtype) -> int:
    """:func:`pow2_exponent` of data whose largest ``|value|`` is ``top``."""
    if top == 0.0 or not math.isfinite(top):
        return 0
    e = math.frexp(top)[1]  # top = f * 2**e, f in [0.5, 1)
    q = _safe_q(dtype)
    return 0 if -q <= e <= q else -e


def _safe_q(dtype) -> int:
    """``q`` of :func:`pow2_exponent`'s safe range ``[2**-(q+1), 2**q)``: ``maxexp // 4`` of ``dtype``."""
    return np.finfo(dtype).maxexp // 4


def times_pow2(x: Any, k: int):
    """``x * 2**k`` exactly (an array of any library, or a number): in steps of at most ``2**60``, so that
    neither the factor nor an intermediate leaves the dtype's range (float32's ends at ``2**128``)."""
    while k:
        step = max(-60, min(60, k))
        x = x * (2.0 ** step)
        k -= step
    return x


def asarray_like(X: Any, a: Any):
    """Host array ``a`` (NumPy or anything ``np.array`` takes) as an array of ``X``'s library on
    ``X``'s device; a floating ``a`` also gets ``X``'s dtype, an integer one keeps its own."""
    xp = _core.namespace(X)
    a = np.array(a)  # a writable copy: torch warns on read-only arrays (e.g. views of JAX arrays)
    # a traced X has no device to ask for (JAX 0.8's linearize tracers lack one); the trace places it
    out = xp.asarray(a) if _checks.is_tracer(X) else xp.asarray(a, device=device(X))
    return xp.astype(out, X.dtype) if np.issubdtype(a.dtype, np.floating) else out


def _same_library(a: Any, X: Any) -> bool:
    """``a`` is an array of ``X``'s library (keep it as is, e.g. a torch tensor with a graph)."""
    try:
        return hasattr(a, "shape") and _core.namespace(a, X) is _core.namespace(X)
    except TypeError:  # a list, or an array of another library
        return False


def _masked(X, valid, xp):
    """``valid[..., None] * X``; for a C-ordered NumPy ``X`` with every row valid (``valid`` all ones, or
    ``None`` from a caller that knows it) ``X`` itself: the same values in the same layout, so sums of it
    are the same bits, without a temporary the size of ``X``."""
    if valid is None or (is_numpy_namespace(xp) and X.flags.c_contiguous and bool(np.all(valid))):
        return X
    return valid[..., None] * X


def _sample_sum(A, xp):
    """``sum(A, axis=(0, 1))`` of ``A: (K, N, d)`` -> ``(d,)``. NumPy adds a C-ordered ``A``'s rows one
    after another (row ``r`` onto the sum of rows ``< r``); for ``d = 2`` the iterator's cost per row
    dominates, and ``cumsum`` along the rows does the same additions in the same order (its last row
    is the same bits once ``+ 0.0`` is added, as the sum starts from ``+0.0``; tests/test_strategies.py
    checks it) in half the time, for one temporary the size of ``A`` (hence the size limit)."""
    if is_numpy_namespace(xp) and A.shape[-1] == 2 and A.flags.c_contiguous and A.size <= _CUMSUM_MAX:
        return np.cumsum(A.reshape(-1, 2), axis=0)[-1] + 0.0  # the sum starts at +0.0: -0.0 -> 0.0
    return xp.sum(A, axis=(0, 1))


_CUMSUM_MAX = 2**21  # elements: a 16 MiB float64 temporary at most


def domain_means(X, valid, cnt):
    """Per-domain sample means: ``X: (K, N, d)``, ``valid: (K, N)`` 0/1, ``cnt: (K,)`` -> ``(K, d)``
    (the arguments as :func:`prepare_domains` returns them)."""
    xp = _core.namespace(X, valid)
    return xp.sum(_masked(X, valid, xp), axis=1) / cnt[:, None]


def _pooled_mean(X, valid, cnt, xp, k):
    """Def. 1's mean of the prepared domains (:func:`_prepare`, ``k`` its :func:`pow2_exponent`; 0 for
    data in the safe range: computed as they are; ``valid`` ``None``: see :func:`_masked`) -> ``(mean (d,),
    total count ())``."""
    total = xp.sum(cnt)
    return times_pow2(_sample_sum(_masked(times_pow2(X, k), valid, xp), xp) / total, -k), total


def naive_pool(X: Any, counts: Any = None) -> Pooled:
    """Naive pooling (Def. 1): the mean of every sample of every domain.

    ``X: (K, N, d)``, ``counts: (K,)`` -> ``Pooled(mean (d,), n_samples)``.
    ``mean = sum_k sum_{i<N_k} x_{k,i} / sum_k N_k``. NaN or inf anywhere in ``X`` (padding included) is a
    ``ValueError``.

    The sum is first taken as the data are, in one pass over ``X``. That mean stands where every component
    is finite and the largest ``|component|`` is at least ``2**-q`` (``q`` as in :func:`pow2_exponent`:
    ``2**-256`` for float64, ``2**-32`` for float32). Otherwise (NaN or inf in ``X``, which make the sum
    NaN or inf even in padding, as ``0 * inf`` is NaN; a sum that overflowed; a zero or tiny mean) ``X`` is
    checked and the mean recomputed on ``X * 2**pow2_exponent(X)``, the way the other strategies see the
    data. Both ways give the same bits except where the scaled way would lose bits that the first keeps:
    when ``X``'s largest ``|value|`` ``M`` (padding included) is at least ``2**q`` (so ``X`` would be scaled
    down by ``2**-e``, ``M`` in ``[2**(e-1), 2**e)``) and a real sample's nonzero component, or the
    exact mean of a component, is below ``2**(e + minexp)`` in magnitude (``minexp`` the dtype's smallest
    normal exponent, -1022 for float64, -126 for float32; at most ``M * 2**-1021``, ``M * 2**-125``):
    scaled, those values fall below the smallest normal number and lose low bits. There the mean returned
    is the plain floating-point one, without that extra rounding. The same rule runs on every array
    library; for an ``X`` traced by JAX (``jit``) the sum is taken as it is (values unknown).

    Transformations: ``jax.jit``, ``jax.vmap``, ``jax.grad``, ``jax.jacfwd``; torch autograd. Under a JAX
    transformation the NaN/inf check runs with the compiled program (a run-time error, same message).
    """
    plain = _numpy_plain_pool(X) if counts is None else None
    if plain is not None and _plain_mean_stands(plain[0]):
        return Pooled(*plain)
    X, cnt, xp = _validate(X, counts)
    # no counts and a C-ordered NumPy X: summed as it is, without a (K, N) valid array (see _masked)
    valid = None if counts is None and is_numpy_namespace(xp) and X.flags.c_contiguous else _valid_rows(X, cnt, xp)
    if plain is None:
        with np.errstate(over="ignore", invalid="ignore"):  # NumPy: overflow and inf - inf are caught below
            plain = _pooled_mean(X, valid, cnt, xp, 0)
        if _plain_mean_stands(plain[0]):
            return Pooled(*plain)
    k = _finite_exponent(X, xp)  # raises on NaN/inf in X; 0 for a traced X
    return Pooled(*plain) if k == 0 else Pooled(*_pooled_mean(X, valid, cnt, xp, k))


def _numpy_plain_pool(X):
    """:func:`_pooled_mean` of a C-ordered NumPy ``X: (K, N, d)`` of floats with every row valid, ``k = 0``,
    without the array-API layer and the checks (their fixed cost, ~50 us with the caches cold after the pass
    over a large ``X``, is what the plain loop does not pay) -> ``(mean, total)``, or ``None`` for any other
    ``X``. The same sum; the same total ``K N`` (the general path sums K copies of N: every partial sum is an
    integer at most ``K N <= 2**(nmant+1)``, so exact)."""
    if not (type(X) is np.ndarray and X.ndim == 3 and X.size and X.dtype.kind == "f" and X.flags.c_contiguous
            and X.shape[0] * X.shape[1] <= 2 ** (np.finfo(X.dtype).nmant + 1)):
        return None
    total = X.dtype.type(X.shape[0] * X.shape[1])
    with np.errstate(over="ignore", invalid="ignore"):  # overflow and inf - inf: the caller's check sees them
        return _sample_sum(X, np) / total, total


def _plain_mean_stands(mean) -> bool:
    """The unscaled pooled ``mean: (d,)`` is :func:`naive_pool`'s result: known (not traced), every
    component finite and the largest ``|component|`` at least ``2**-q`` (:func:`pow2_exponent`'s ``q``).
    Then ``X`` holds no NaN or inf (they would make the sum NaN or inf) and its largest ``|value|`` is at
    least ``2**-(q+1)`` (no mean exceeds it by more than rounding), so :func:`pow2_exponent` would not
    scale ``X`` up."""
    if _checks.is_tracer(mean):
        return False
    m = _checks.to_numpy(mean)
    top = float(abs(m).max())  # NaN if any component is NaN
    return math.isfinite(top) and top >= 2.0 ** -_safe_q(m.dtype)


def as_key(key: Any):
    """An int seed or a JAX PRNG key (typed or raw) -> a typed JAX key."""
    import jax

    if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        return jax.random.key(int(key))
    if isinstance(key, jax.Array) and jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        return key
    if isinstance(key, jax.Array) and key.shape == (2,) and key.dtype == np.uint32:
        return jax.random.wrap_key_data(key)
    raise ValueError(f"key must be an int seed or a JAX PRNG key, got {type(key).__name__}")


def subsample_indices(key: Any, counts: Any, m: int, n: int):
    """JAX draw for Def. 2: ``m`` distinct domains uniformly, ``n`` indices with replacement in each.

    ``counts: (K,)`` (jax array, may be traced) -> ``(domains (m,), indices (m, n))`` int32.
    """
    import jax
    import jax.numpy as jnp

    kd, ks = jax.random.split(as_key(key))
    K = counts.shape[0]
    domains = jax.random.choice(kd, K, (m,), replace=False)
    size = jnp.asarray(counts)[domains].astype(jnp.int32)
    u = jax.random.uniform(ks, (m, n))
    idx = jnp.minimum(jnp.floor(u * size[:, None]).astype(jnp.int32), size[:, None] - 1)
    return domains.astype(jnp.int32), idx


def subsample(key: Any, X: Any, m: int, n: int, counts: Any = None) -> Subsampled:
    """Uniform subsampling (Def. 2): ``m`` domains uniformly without replacement, then ``n``
    samples from each, uniformly with replacement; the estimate is the mean of those ``m n`` points.

    ``key``: int seed or JAX key: the same seed gives the same ``domains`` and ``indices`` on every
    backend. JAX draws them for JAX input; for NumPy and torch input the same bits are computed with
    NumPy (:mod:`poolsim._threefry`: JAX's Threefry stream, no compile, JAX not imported), or by JAX
    itself where JAX is set up otherwise (another PRNG implementation, non-partitionable Threefry).
    Like JAX's draw the indices depend on ``jax_enable_x64`` (float64 or float32 uniforms).
    ``mean`` is the mean of the same points, summed in each library's order (equal within rounding).
    NaN or inf anywhere in ``X`` is a ``ValueError``, in the points picked or not. The mean is taken of
    the points as they are where it stands (:func:`naive_pool`'s rule: finite, largest ``|component|`` at
    least ``2**-q``), else of the points scaled by ``2**pow2_exponent(X)``: the same bits except in
    :func:`naive_pool`'s documented case. On a C-ordered NumPy ``X`` the check is one threaded pass
    (:func:`_surely_finite`) instead of ``min`` and ``max``.
    ``X: (K, N, d)`` -> ``Subsampled(mean (d,), domains (m,), indices (m, n))``.

    Transformations: ``jax.jit``, ``jax.vmap``, ``jax.grad``, ``jax.jacfwd`` (derivative of the mean of the
    points picked, the draw held fixed); torch autograd. Under a JAX transformation the NaN/inf check runs
    with the compiled program (a run-time error, same message); a NumPy ``X`` with a traced key is drawn
    from and averaged by JAX.
    """
    X, cnt, xp = _validate(X, counts, (key,))
    k = None if _surely_finite(X, xp) else _finite_exponent(X, xp)  # None: not needed yet
    K, N, d = X.shape
    m = _checks.integer("m", m, 1, K)
    n = _checks.integer("n", n, 1)
    if _core.is_jax_namespace(xp):
        domains, idx = subsample_indices(key, cnt, m, n)
        flat_idx = xp.reshape(domains[:, None] * N + idx, (-1,))
    else:
        domains, idx = _host_draw(key, _checks.to_numpy(cnt), m, n)
        flat_idx = np.reshape(domains[:, None] * N + idx, (-1,))
        if not is_numpy_namespace(xp):
            domains, idx, flat_idx = (asarray_like(X, a) for a in (domains, idx, flat_idx))
    picked = xp.take(xp.reshape(X, (K * N, d)), flat_idx, axis=0)
    with np.errstate(over="ignore"):  # an overflowed plain mean is caught below
        mean = _mean_rows(picked, xp)
    if not _plain_mean_stands(mean):
        k = _finite_exponent(X, xp) if k is None else k
        if k:  # only the picked rows are scaled: the same products as scaling X first
            mean = times_pow2(xp.mean(times_pow2(picked, k), axis=0), -k)
    return Subsampled(mean, domains, idx)


def _mean_rows(A, xp):
    """``xp.mean(A, axis=0)`` of ``A: (R, d)``; on NumPy with ``d = 2`` the row sum by :func:`_sample_sum`
    (the same additions in half the time) and ``np.mean``'s own division (``true_divide`` by the count as an
    ``intp``, into the sum's dtype): the same bits."""
    if is_numpy_namespace(xp) and A.shape[-1] == 2 and A.dtype in (np.float32, np.float64):
        s = np.asarray(_sample_sum(A[None], xp))
        return np.true_divide(s, np.intp(A.shape[0]), out=s, casting="unsafe")
    return xp.mean(A, axis=0)


def _surely_finite(X, xp) -> bool:
    """``True`` when a C-ordered NumPy float32/float64 ``X`` holds no NaN or inf, known from one pass:
    its sum of squares (a BLAS dot product, threaded: at ``(200, 100, 256)`` float64 0.6 ms where
    ``min`` and ``max`` take 1.1 ms each, measured) is finite. ``False`` where that is unknown (another
    array, or squares that overflowed): the caller then checks ``X`` in full (:func:`_finite_exponent`)."""
    if not (is_numpy_namespace(xp) and X.dtype in (np.float32, np.float64) and X.flags.c_contiguous):
        return False
    v = X.reshape(-1)
    with np.errstate(over="ignore", invalid="ignore"):
        return math.isfinite(float(np.dot(v, v)))


def _host_draw(key: Any, counts: np.ndarray, m: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`subsample_indices`' draw on the host for NumPy/torch input -> int64 ``(domains, indices)``:
    by :mod:`poolsim._threefry` (JAX's bits in NumPy, no compile) where the JAX settings allow, else by
    JAX itself (another PRNG implementation, non-partitionable Threefry, a traced key, a bad key)."""
    x64, partitionable, impl = _threefry.settings()
    words = _threefry.key_words(key, impl) if partitionable and m * n < 2**32 else None
    if words is not None:
        return _threefry.subsample_draw(words, counts, m, n, np.float64 if x64 else np.float32)
    import jax.numpy as jnp

    domains, idx = subsample_indices(key, jnp.asarray(counts), m, n)
    return np.asarray(domains, dtype=np.int64), np.asarray(idx, dtype=np.int64)


def match(X: Any, tau: Any, *, metric: str = "l2", level: str = "domain", init: Any = "median",
          tol: float = 1e-4, max_iter: int = 100, counts: Any = None) -> Matched:
    """Matching (Def. 3) iterated to a fixed point ``||c_{t+1} - c_t||_2 < tol``.

    ``level="domain"`` (the theorems): domain k is included iff ``M(xbar_k - c_t) < tau`` for its
    sample mean ``xbar_k``, and then all its samples are; ``level="sample"`` (the AD section): each
    sample is gated on its own. ``c_{t+1}`` is the mean of all included samples.

    ``init``: ``"median"`` -- coordinate-wise median of all samples (the paper's synthetic set-up),
    ``"mean"`` -- the pooled mean, or an explicit ``(d,)`` vector.
    ``metric``: ``"l2"``, ``"cosine"`` (1 - cos) or ``"geodesic"`` (angle), see
    :func:`poolsim._core.distance`.

    ``X: (K, N, d)`` -> :class:`Matched`. An empty matched set never yields NaN: the previous
    centroid is kept and ``converged`` is False.

    Transformations: ``jax.jit``, ``jax.vmap``, ``jax.grad`` (reverse mode) and ``jax.jacfwd`` on JAX
    input, torch autograd on torch input. Under a JAX transformation the value checks (``X``, ``init``
    finite; ``tau``, ``tol`` > 0; ``counts``) run with the compiled program: a bad value is a run-time
    error holding the same message. A NumPy ``X`` with a traced ``tau`` is computed by JAX. The
    derivative is the matched mean's with the matched set held fixed (it is locally constant: the gate
    is a step function), ``1 / n_matched`` per matched sample and 0 with respect to ``tau``; it is what
    torch autograd through the loop gives and, at the fixed point, what the implicit function theorem
    gives (:func:`poolsim._core.iterate_match`; the docs' Concepts page, "Transformations").
    """
    X, valid, cnt, xp, k = _prepare(X, counts, (tau, tol, init))
    K, N, d = X.shape
    tau = _checks.positive("tau", tau)
    _checks.choice("metric", metric, _core.METRICS)
    _checks.choice("level", level, LEVELS)
    tol = _checks.positive("tol", tol)
    max_iter = _checks.integer("max_iter", max_iter, 1)
    # data far from 1 in magnitude: matched as X * 2**k, with the l2 radius and the tolerance (data units)
    # scaled alike; cosine and geodesic radii are angles, unchanged (see pow2_exponent)
    if k:
        X = times_pow2(X, k)
        tol = times_pow2(tol, k)
        tau = times_pow2(tau, k) if metric == "l2" else tau
    flat = xp.reshape(X, (K * N, d))
    flat_valid = xp.reshape(valid, (K * N,))
    if isinstance(init, str):
        _checks.choice("init", init, INITS)
        if init == "median":
            c0 = _core.weighted_median(flat, flat_valid)
        else:
            c0 = _pooled_mean(X, valid, cnt, xp, 0)[0]  # X is scaled already
    else:
        real_array("init", init if hasattr(init, "dtype") else np.asarray(init))
        c0 = init if _same_library(init, X) else asarray_like(X, np.asarray(_checks.to_numpy(init), dtype=float))
        if tuple(c0.shape) != (d,):
            raise ValueError(f"init must be 'median', 'mean' or a vector of shape (d,) = ({d},), "
                             f"got shape {tuple(c0.shape)}")
        c0 = _checks.finite("init", c0)
        c0 = times_pow2(xp.astype(c0, X.dtype), k)
    if level == "domain":
        points, mass = domain_means(X, valid, cnt), cnt
    else:
        points, mass = flat, flat_valid
    c, inc, n_iter, conv, total = _core.iterate_match(points, mass, c0, tau, metric,
                                                      tol=tol, max_iter=max_iter)
    if level == "sample":
        inc = xp.reshape(inc, (K, N))
    c = times_pow2(c, -k)
    return Matched(c, c, inc, n_iter, conv, total)
