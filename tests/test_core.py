"""The one matching core (poolsim._core): same numbers on NumPy, jax.numpy (jit + vmap) and torch
(autograd), finite gradients at the singular points, and closed-form checks of each piece.

Expected values come from: NumPy running the same core (cross-backend agreement), np.median /
np.arccos (independent implementations), or closed forms written out in the comments.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="these tests compare the core on NumPy, JAX and torch: the adsim extra")

from poolsim import _core

TAU, ALPHA, TOL, MAX_ITER = 1.5, 0.3, 1e-10, 50
# Per-metric thresholds chosen so that, on the fixed-seed inputs below, the batch has converged
# non-empty matches as well as an empty matched set (the fallback path) for cosine and geodesic.
TAUS = {"l2": TAU, "cosine": 0.6, "geodesic": 1.2}


def _all_core(x, c, w, f):
    """Every core function on one input. x: (n, d) points, c: (d,) centroid, w: (n,) 0/1 mask
    (also the mass), f: (d,) a feature for the centroid updates. Returns a tuple of arrays."""
    out = [_core.distance(x, c, m) for m in _core.METRICS]
    out.append(_core.gate(out[0], TAU))
    out.extend(_core.weighted_mean(x, w, c))
    out.extend(_core.match_step(x, w, c, TAU, "l2"))
    for m in _core.METRICS:
        cm, inc, n_iter, conv, total = _core.iterate_match(x, w, c, TAUS[m], m, tol=TOL,
                                                           max_iter=MAX_ITER)
        out.extend([cm, inc, total, n_iter, conv])
    u = _core.normalize(c)
    out.append(_core.ema_update(u, f, ALPHA))
    out.append(_core.slerp_update(u, f, ALPHA))
    out.append(_core.weighted_median(x, w))
    return tuple(out)


def _differentiable_loss(x, c, w, f):
    """Scalar built from every core piece with a (reverse-mode) gradient: iterate_match's centroid and
    matched mass included (its custom_jvp; a ``lax.while_loop`` alone has no reverse-mode derivative),
    its integer and boolean outputs left out."""
    outs = _all_core(x, c, w, f)
    keep = outs[:9] + tuple(outs[i] for i in (9, 11, 14, 16, 19, 21)) + outs[-3:]
    return sum(o.sum() * (k + 1) for k, o in enumerate(keep))


def _host(a):
    """A torch tensor (or the Python int/bool n_iter, converged of the torch loop) as NumPy."""
    return a.detach().numpy() if torch.is_tensor(a) else np.asarray(a)


def _inputs(rng, B=3, n=6, d=3):
    x = rng.normal(size=(B, n, d))
    c = rng.normal(size=(B, d)) * 0.3
    w = np.ones((B, n))
    w[0, [1, 4]] = 0.0  # masked rows (even count of 4 valid rows)
    w[1, 2] = 0.0  # odd count of 5 valid rows
    f = rng.normal(size=(B, d))
    return x, c, w, f


@pytest.mark.slow
def test_core_same_results_numpy_jax_jit_vmap_torch(rng):
    x, c, w, f = _inputs(rng)
    B = x.shape[0]
    # NumPy: one batch element at a time.
    ref = [_all_core(x[b], c[b], w[b], f[b]) for b in range(B)]
    ref = [np.stack([np.asarray(r[i]) for r in ref]) for i in range(len(ref[0]))]

    # jax.numpy inside jit(vmap(...)) over the batch axis.
    jax_out = jax.jit(jax.vmap(_all_core))(*(jnp.asarray(a) for a in (x, c, w, f)))
    assert len(jax_out) == len(ref)
    for i, (a, r) in enumerate(zip(jax_out, ref)):
        np.testing.assert_allclose(np.asarray(a), r, rtol=1e-10, atol=1e-12, err_msg=f"jax output {i}")
    # The inputs exercise both paths of iterate_match: converged matches and empty matched sets.
    conv = np.concatenate([ref[i] for i in (13, 18, 23)])
    assert conv.any() and not conv.all()

    # torch with autograd; the backward pass goes through everything, iterate_match included.
    tx, tc, tf = (torch.tensor(a, requires_grad=True) for a in (x, c, f))
    tw = torch.tensor(w)
    t_out = [_all_core(tx[b], tc[b], tw[b], tf[b]) for b in range(B)]
    for i, r in enumerate(ref):
        got = np.stack([np.asarray(_host(t_out[b][i])) for b in range(B)])
        np.testing.assert_allclose(got, r, rtol=1e-10, atol=1e-12, err_msg=f"torch output {i}")
    loss = sum(o.sum() for b in range(B) for o in t_out[b] if torch.is_tensor(o) and o.is_floating_point())
    loss.backward()
    for g in (tx.grad, tc.grad, tf.grad):
        assert g is not None and torch.isfinite(g).all()

    # Gradients: jax.grad (under jit and vmap: one compile, not one per operation) equals torch
    # autograd for the differentiable pieces.
    gj = jax.jit(jax.vmap(jax.grad(_differentiable_loss, argnums=(0, 1, 3))))(
        *(jnp.asarray(a) for a in (x, c, w, f)))
    tx2, tc2, tf2 = (torch.tensor(a, requires_grad=True) for a in (x, c, f))
    sum(_differentiable_loss(tx2[b], tc2[b], tw[b], tf2[b]) for b in range(B)).backward()
    for a, t in zip(gj, (tx2.grad, tc2.grad, tf2.grad)):
        assert np.all(np.isfinite(np.asarray(a)))
        np.testing.assert_allclose(np.asarray(a), t.numpy(), rtol=1e-8, atol=1e-10)


# Points where a naive implementation has a 0/0 or an infinite derivative:
# identical vectors (||x-c|| = 0, cos = 1), a zero vector, cos = +1 with x != c, cos = -1.
_C = np.array([0.6, -0.8, 0.0])
SINGULAR = {
    "identical": (_C, _C),
    "zero_x": (np.zeros(3), _C),
    "both_zero": (np.zeros(3), np.zeros(3)),
    "cos_plus_1": (2.5 * _C, _C),
    "cos_minus_1": (-1.5 * _C, _C),
}


@pytest.mark.parametrize("metric", _core.METRICS)
@pytest.mark.parametrize("case", list(SINGULAR))
def test_finite_gradients_at_singular_points(metric, case):
    x, c = SINGULAR[case]
    gx, gc = jax.grad(lambda a, b: _core.distance(a, b, metric), argnums=(0, 1))(
        jnp.asarray(x), jnp.asarray(c))
    assert np.all(np.isfinite(gx)) and np.all(np.isfinite(gc))
    tx, tc = torch.tensor(x, requires_grad=True), torch.tensor(c, requires_grad=True)
    val = _core.distance(tx, tc, metric)
    val.backward()
    assert torch.isfinite(val) and torch.isfinite(tx.grad).all() and torch.isfinite(tc.grad).all()
    # The value itself, from the definitions: l2 = ||x - c||; cosine = 1 - cos; geodesic =
    # arccos(cos); a zero vector has cos = 0 by the core's convention (documented in _core).
    nx, nc = np.linalg.norm(x), np.linalg.norm(c)
    cos = 0.0 if nx == 0 or nc == 0 else x @ c / (nx * nc)
    expected = {"l2": np.linalg.norm(x - c), "cosine": 1 - cos, "geodesic": np.arccos(cos)}[metric]
    np.testing.assert_allclose(val.item(), expected, atol=1e-12)


@pytest.mark.parametrize("case", ["identical", "zero_x", "cos_plus_1", "cos_minus_1"])
def test_finite_gradients_of_centroid_updates(case):
    f, c = SINGULAR[case]
    for upd in (_core.ema_update, _core.slerp_update):
        for a in (0.5, ALPHA):
            g = jax.grad(lambda cc, ff: upd(cc, ff, a).sum(), argnums=(0, 1))(jnp.asarray(c), jnp.asarray(f))
            assert all(np.all(np.isfinite(np.asarray(gi))) for gi in g), (upd.__name__, a)
            out = upd(c, f, a)
            assert np.all(np.isfinite(out)) and np.linalg.norm(out) == pytest.approx(1.0)


@pytest.mark.parametrize("n", [5, 6])
@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_weighted_median_matches_numpy_median(rng, n, backend):
    x = rng.normal(size=(n, 4))
    masks = [np.ones(n), (np.arange(n) % 3 != 1).astype(float)]  # all rows; rows 1, 4 masked
    for w in masks:
        # Oracle: np.median of the kept rows (mean of the two middle values for even counts).
        expected = np.median(x[w > 0], axis=0)
        if backend == "numpy":
            got = _core.weighted_median(x, w)
        else:
            got = _core.weighted_median(torch.tensor(x), torch.tensor(w)).numpy()
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-15)
        if int(w.sum()) % 2 == 0:
            # Why the core sorts: torch.median returns the lower middle value, which differs here.
            lower = torch.median(torch.tensor(x[w > 0]), dim=0).values.numpy()
            assert np.all(np.abs(lower - expected) > 1e-12)


@pytest.mark.parametrize("block,tile", [(1 << 22, 1 << 16), (24, 7), (5, 1)], ids=["default", "small", "one-column"])
def test_weighted_median_numpy_selection_equals_the_sort(rng, monkeypatch, block, tile):
    """On NumPy the median is found by selection on blocks of columns; the oracle is the sort the core
    does on the other backends, written out here: sort the kept rows, ``0.5 * (s[lo] + s[hi])`` -- the
    same arithmetic on the same two order statistics, so equal bit for bit. Small blocks and tiles put
    several blocks, partial last blocks and tiles, and one-column blocks in play."""
    monkeypatch.setattr(_core, "_MEDIAN_BLOCK", block)
    monkeypatch.setattr(_core, "_TILE", tile)
    for n, d, dtype in ((1, 3, np.float64), (2, 5, np.float32), (9, 7, np.float64), (40, 13, np.float32)):
        x = rng.normal(size=(n, d)).astype(dtype)
        x[rng.random((n, d)) < 0.3] = dtype(0.25)  # ties
        for w in (None, np.ones(n), (rng.random(n) < 0.6).astype(dtype)):
            if w is not None and not (w > 0).any():
                w[0] = 1.0
            kept = x if w is None else x[w > 0]
            srt = np.sort(kept, axis=0)
            expected = 0.5 * (srt[(len(kept) - 1) // 2] + srt[len(kept) // 2])
            got = _core.weighted_median(x, w)
            assert got.dtype == dtype
            np.testing.assert_array_equal(got, expected)
            torch_w = None if w is None else torch.tensor(w)
            np.testing.assert_array_equal(_core.weighted_median(torch.tensor(x), torch_w).numpy(), expected)


def test_weighted_median_default_weights(rng):
    x = rng.normal(size=(7, 2))
    np.testing.assert_array_equal(_core.weighted_median(x), np.median(x, axis=0))


def test_geodesic_equals_arccos_of_clipped_cosine(rng):
    a, b = rng.normal(size=(2, 500, 4))
    cos = np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    # Oracle: the definition d_G = arccos(clip(cos, -1, 1)) (paper §anomaly detection).
    np.testing.assert_allclose(_core.geodesic(a, b), np.arccos(np.clip(cos, -1, 1)), rtol=0, atol=1e-12)
    np.testing.assert_allclose(_core.distance(a, b, "cosine"), 1 - cos, rtol=0, atol=1e-12)
    # Near-parallel pairs: arccos loses digits, the 2 atan2 form does not; the true angle of
    # (1, 0) and (1, 1e-9) is atan(1e-9) = 1e-9 (to 1e-27).
    near = _core.geodesic(np.array([1.0, 0.0]), np.array([1.0, 1e-9]))
    assert near == pytest.approx(1e-9, rel=1e-12)


def test_ema_and_slerp_unit_norm_zero_init_and_arc_fraction(rng):
    c = _core.normalize(rng.normal(size=(200, 5)))
    f = rng.normal(size=(200, 5))
    alpha = rng.uniform(0.05, 0.95, size=(200, 1))
    for upd in (_core.ema_update, _core.slerp_update):
        out = upd(c, f, alpha)
        np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-12)
        # Zero-initialised centroid (paper: c^(0) = 0) becomes the first feature's direction.
        np.testing.assert_allclose(upd(np.zeros(5), f[0], 0.7), f[0] / np.linalg.norm(f[0]), atol=1e-12)

    # Slerp moves a fraction (1 - alpha) of the arc: angle(c', c) = (1-alpha) t, angle(c', f) = alpha t
    # with t = angle(c, f); both together also put c' on the great circle through c and f.
    def ang(a, b):
        u, v = a / np.linalg.norm(a, axis=-1, keepdims=True), b / np.linalg.norm(b, axis=-1, keepdims=True)
        return np.arccos(np.clip(np.sum(u * v, axis=-1), -1, 1))

    out = _core.slerp_update(c, f, alpha)
    t = ang(c, f)
    np.testing.assert_allclose(ang(out, c), (1 - alpha[:, 0]) * t, atol=1e-7)
    np.testing.assert_allclose(ang(out, f), alpha[:, 0] * t, atol=1e-7)

    # Closed forms for e1 -> e2 (t = pi/2): slerp with alpha = 0.25 lands at angle 3 pi / 8 from
    # e1; EMA with alpha = 0.5 is (e1 + e2) / sqrt(2), the same point as slerp with alpha = 0.5.
    e1, e2 = np.eye(3)[0], np.eye(3)[1]
    np.testing.assert_allclose(_core.slerp_update(e1, e2, 0.25),
                               [np.cos(3 * np.pi / 8), np.sin(3 * np.pi / 8), 0], atol=1e-15)
    np.testing.assert_allclose(_core.ema_update(e1, e2, 0.5), [2 ** -0.5, 2 ** -0.5, 0], atol=1e-15)
    np.testing.assert_allclose(_core.slerp_update(e1, e2, 0.5), [2 ** -0.5, 2 ** -0.5, 0], atol=1e-15)
    # Without renormalisation EMA is the plain convex combination alpha c + (1 - alpha) f.
    np.testing.assert_allclose(_core.ema_update(e1, e2, 0.25, renormalize=False), [0.25, 0.75, 0])


def test_weighted_mean_and_empty_gate_fallback():
    x = np.array([[0.0, 0.0], [2.0, 4.0], [10.0, 10.0]])
    # (1*[0,0] + 3*[2,4]) / 4 = [1.5, 3.0]; the third row has weight 0.
    mean, total = _core.weighted_mean(x, np.array([1.0, 3.0, 0.0]), np.zeros(2))
    np.testing.assert_array_equal(mean, [1.5, 3.0])
    assert total == 4.0
    # All weights zero: the fallback, not 0/0.
    fb = np.array([7.0, -7.0])
    mean, total = _core.weighted_mean(x, np.zeros(3), fb)
    np.testing.assert_array_equal(mean, fb)
    assert total == 0.0
    # Gate is strict: M(v) < tau, so a point exactly at tau is out.
    np.testing.assert_array_equal(_core.gate(np.array([0.5, 1.0, 1.5]), 1.0), [1.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="metric"):
        _core.distance(x, fb, "manhattan")


# ---------------------------------------------------------------- padding rows and the stopping rule
# Issue 16's two surviving mutants: (1) match_step without the ``mass > 0`` mask reports padding
# rows as matched; (2) the NumPy/torch loop stopping at 100 * tol instead of tol. Both are checked
# on every backend, at the core (here) and through poolsim.match (tests/test_strategies.py).
ARRAYS = {"numpy": np.asarray, "jax": jnp.asarray, "torch": torch.tensor}


@pytest.mark.parametrize("backend", list(ARRAYS))
def test_padding_rows_are_never_included(backend):
    """Rows of mass 0 are padding: never in ``included`` even when they sit on the centroid."""
    arr = ARRAYS[backend]
    # three real points near the origin, two padding rows (mass 0) exactly at the centroid c = 0
    points = arr(np.array([[0.1, 0.0], [-0.1, 0.0], [0.0, 0.2], [0.0, 0.0], [0.05, 0.0]]))
    mass = arr(np.array([1.0, 2.0, 1.0, 0.0, 0.0]))
    c0 = arr(np.zeros(2))
    C = arr(np.array([[0.0, 0.0], [5.0, 5.0]]))  # multimodal: mode 0 owns the three real rows
    # every row is within tau of c (cosine distance <= 2 < 2.5, angle <= pi < 3.5): only the mask
    # keeps the padding out
    expected = [1.0, 1.0, 1.0, 0.0, 0.0]
    # JAX: in one jitted program (the same operations, compiled once instead of one by one)
    run = jax.jit(_padding_outputs) if backend == "jax" else _padding_outputs
    outs = run(points, mass, c0, arr(np.array([1e-3, 0.0])), C, arr(np.array([1.0, 1.0])))
    for metric, (inc, total, inc_it, w, tot) in outs.items():
        np.testing.assert_array_equal(_host(inc), expected, err_msg=metric)
        assert float(_host(total)) == 4.0  # 1 + 2 + 1: the matched mass counts real points only
        np.testing.assert_array_equal(_host(inc_it), expected)
        np.testing.assert_array_equal(_host(w), np.stack([expected, np.zeros(5)], axis=1))
        np.testing.assert_array_equal(_host(tot), [4.0, 0.0])


def _padding_outputs(points, mass, c0, shift, C, taus):
    """Per metric (with its tau): match_step's ``(included, total)`` at ``c0 + shift``, iterate_match's
    ``included`` (L2) from ``c0``, and multi_match_step's ``(weights, totals)`` for the modes ``C``."""
    out = {}
    for metric, tau in (("l2", 1.0), ("cosine", 2.5), ("geodesic", 3.5)):
        _, inc, total = _core.match_step(points, mass, c0 + shift, tau, metric)
        _, inc_it, _, _, _ = _core.iterate_match(points, mass, c0, tau, "l2", tol=1e-12, max_iter=20)
        _, w, tot = _core.multi_match_step(points, mass, C, taus, "l2")
        out[metric] = (inc, total, inc_it, w, tot)
    return out


def _one_step_then_exact():
    """1-D data where the first step moves by tol <= 0.9/900 = 1e-3 < 100 tol (tol = 1e-4) and the
    second by exactly 0: a mass of 899 at 0 and one point at 0.9, tau = 1, c0 = 0. Step 1 gates
    both in and moves c to (899 * 0 + 0.9) / 900 = 1e-3; step 2 gates the same set (c_2 = c_1), so
    the correct rule stops at t = 2 and a rule that accepted moves < 100 tol would stop at t = 1."""
    return np.array([[0.0], [0.9]]), np.array([899.0, 1.0]), np.zeros(1), 1.0, 1e-4


def _assert_stopping_rule(run, c0, tol):
    """``run(max_iter) -> (c, included, n_iter, converged, total)``. A converged result at
    ``n_iter = t`` must have ``||c_t - c_{t-1}|| < tol`` and no earlier step below tol, where
    ``c_{t-1}`` is the result of the same run cut at ``max_iter = t - 1`` (``c_0 = c0``)."""
    c, _, n_iter, conv, _ = run(50)
    n_iter = int(_host(n_iter))
    assert bool(_host(conv))
    prev = [np.asarray(c0)] + [_host(run(t)[0]) for t in range(1, n_iter)]
    steps = [np.linalg.norm(b - a) for a, b in zip(prev, prev[1:] + [_host(c)])]
    assert steps[-1] < tol, steps
    assert all(s >= tol for s in steps[:-1]), steps
    for t in range(1, n_iter):  # cut before convergence: not converged, ran every iteration
        out = run(t)
        assert not bool(_host(out[3])) and int(_host(out[2])) == t
    return n_iter, steps


@pytest.mark.parametrize("backend", ["numpy", "jax", "jax-jit", "torch"])
def test_iterate_match_stops_exactly_below_tol(backend):
    points, mass, c0, tau, tol = _one_step_then_exact()
    arr = ARRAYS[backend.split("-")[0]]
    p, m, c = arr(points), arr(mass), arr(c0)

    def run(max_iter):
        f = lambda p, m, c: _core.iterate_match(p, m, c, tau, "l2", tol=tol, max_iter=max_iter)  # noqa: E731
        return (jax.jit(f) if backend == "jax-jit" else f)(p, m, c)

    n_iter, steps = _assert_stopping_rule(run, c0, tol)
    assert n_iter == 2 and tol <= steps[0] < 100 * tol and steps[1] == 0.0
    np.testing.assert_allclose(_host(run(50)[0]), [0.9 / 900], rtol=1e-15)


def _float32_outputs(x, c, w, f, C, taus, two):
    """Every core function's outputs on float32 inputs (``two``: the scalar 2 as an array)."""
    outs = [_core.distance(x, c, m) for m in _core.METRICS]
    outs += [_core.gate(outs[0], 1.0), _core.normalize(x), _core.safe_norm(x),
             _core.cosine_similarity(x, c), _core.geodesic(x, c), *_core.weighted_mean(x, w, c),
             _core.ema_update(c, f), _core.ema_update(c, f, renormalize=False),
             _core.slerp_update(c, f), _core.weighted_median(x, w), _core.weighted_median(x),
             *_core.match_step(x, w, c, 1.0, "l2"),
             *_core.running_update(c, two, x[0], 1.0, "l2"),
             _core.exclusive_gate(_core.distance(x[:, None, :], C[None], "l2"), taus),
             *_core.multi_match_step(x, w, C, taus, "l2")]
    c_it, inc, _, _, total = _core.iterate_match(x, w, c, 1.0, "l2", tol=1e-6, max_iter=10)
    return outs + [c_it, inc, total]


@pytest.mark.parametrize("backend", list(ARRAYS))
def test_float32_in_float32_out(backend):
    """Every core function keeps a float32 input float32 (0/1 weights and fallbacks included), so
    torch models in float32 and JAX without x64 never get silently promoted to float64."""
    arr = lambda a: ARRAYS[backend](np.asarray(a, dtype=np.float32))  # noqa: E731
    x = arr([[0.1, 0.0], [1.0, 1.0], [3.0, -1.0]])
    c, w, f = arr([0.2, 0.1]), arr([1.0, 1.0, 0.0]), arr([0.0, 1.0])
    C, taus = arr([[0.0, 0.0], [3.0, -1.0]]), arr([1.0, 0.5])
    # JAX: in one jitted program (its dtype rules are those of the same operations run one by
    # one, which would each be compiled on their own)
    run = jax.jit(_float32_outputs) if backend == "jax" else _float32_outputs
    outs = run(x, c, w, f, C, taus, arr(2.0))
    for i, o in enumerate(outs):
        assert str(o.dtype).endswith("float32"), (i, o.dtype)


@pytest.mark.parametrize("backend", list(ARRAYS))
def test_running_update_closed_form(backend):
    """Proof of Thm 3(3): accept iff M(x - c) < tau, then c' = (count c + x) / (count + 1) and
    count' = count + 1; a rejected x changes nothing. Batched over a leading axis."""
    arr = ARRAYS[backend]
    c = np.array([[0.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
    x = np.array([[0.6, 0.8], [3.0, 4.0], [1.0, 2.0]])  # distances 1, 5, 1
    count = np.array([3.0, 3.0, 1.0])
    c2, n2, acc = _core.running_update(arr(c), arr(count), arr(x), 1.5, "l2")
    np.testing.assert_array_equal(_host(acc), [1.0, 0.0, 1.0])
    np.testing.assert_array_equal(_host(n2), [4.0, 3.0, 2.0])
    # (3 * 0 + (0.6, 0.8)) / 4 = (0.15, 0.2); rejected: (0, 0); (1 * (1, 1) + (1, 2)) / 2 = (1, 1.5)
    np.testing.assert_allclose(_host(c2), [[0.15, 0.2], [0.0, 0.0], [1.0, 1.5]], rtol=1e-15)
    # strict gate: a point at distance exactly tau is rejected
    _, _, acc = _core.running_update(arr(c[0]), arr(np.array(3.0)), arr(x[0]), 1.0, "l2")
    assert float(_host(acc)) == 0.0
    # another metric: geodesic angle between (1, 0) and (0, 1) is pi/2 < 2 -> accepted, count 0
    # -> the new centroid is x itself
    c3, n3, acc = _core.running_update(arr(np.array([1.0, 0.0])), arr(np.array(0.0)),
                                       arr(np.array([0.0, 1.0])), 2.0, "geodesic")
    assert float(_host(acc)) == 1.0 and float(_host(n3)) == 1.0
    np.testing.assert_allclose(_host(c3), [0.0, 1.0], atol=1e-15)


def test_mixing_array_libraries_is_a_type_error():
    """One call, one array library: a NumPy array next to a torch tensor is refused with
    array-api-compat's TypeError (never silently converted), by every core entry point."""
    x, c, w = np.ones((3, 2)), np.zeros(2), np.ones(3)
    t = torch.tensor
    C, taus = np.zeros((2, 2)), np.ones(2)
    calls = {
        "distance": lambda: _core.distance(t(x), c, "l2"),
        "cosine_similarity": lambda: _core.cosine_similarity(x, t(c)),
        "geodesic": lambda: _core.geodesic(t(x), c),
        "weighted_mean": lambda: _core.weighted_mean(x, t(w), c),
        "weighted_mean fallback": lambda: _core.weighted_mean(x, w, t(c)),
        "ema_update": lambda: _core.ema_update(t(c), c),
        "slerp_update": lambda: _core.slerp_update(c, t(c)),
        "match_step points": lambda: _core.match_step(t(x), w, c, 1.0, "l2"),
        "match_step mass": lambda: _core.match_step(x, t(w), c, 1.0, "l2"),
        "match_step c": lambda: _core.match_step(x, w, t(c), 1.0, "l2"),
        "iterate_match points": lambda: _core.iterate_match(t(x), w, c, 1.0, "l2", tol=1e-6, max_iter=3),
        "iterate_match mass": lambda: _core.iterate_match(x, t(w), c, 1.0, "l2", tol=1e-6, max_iter=3),
        "iterate_match c0": lambda: _core.iterate_match(x, w, t(c), 1.0, "l2", tol=1e-6, max_iter=3),
        "running_update": lambda: _core.running_update(c, 1.0, t(c), 1.0, "l2"),
        "multi_match_step points": lambda: _core.multi_match_step(t(x), w, C, taus, "l2"),
        "multi_match_step mass": lambda: _core.multi_match_step(x, t(w), C, taus, "l2"),
        "multi_match_step C": lambda: _core.multi_match_step(x, w, t(C), taus, "l2"),
    }
    for name, call in calls.items():
        with pytest.raises(TypeError, match="[Mm]ultiple namespaces"):
            call()
            pytest.fail(name)


@pytest.mark.parametrize("backend", list(ARRAYS))
def test_slerp_antipodal_falls_back_to_ema_with_the_same_alpha(backend):
    """Antipodal c and f have no unique great-circle arc; slerp_update then returns
    ema_update(c, f, alpha) with the caller's alpha: alpha c + (1 - alpha) f renormalised, which
    for f = -k c is sign(alpha - (1 - alpha) k) c (and c itself when that sum is exactly 0)."""
    arr = ARRAYS[backend]
    c = np.array([0.6, -0.8, 0.0])
    for alpha, k, expected in ((0.3, 1.0, -c), (0.7, 1.0, c), (0.5, 1.0, c), (0.3, 2.5, -c),
                               (0.6, 2.5, -c), (0.8, 2.5, c)):
        got = _host(_core.slerp_update(arr(c), arr(-k * c), alpha))
        np.testing.assert_allclose(got, expected, atol=1e-12, err_msg=f"alpha={alpha}, k={k}")
        np.testing.assert_allclose(got, _host(_core.ema_update(arr(c), arr(-k * c), alpha)), atol=1e-12)
