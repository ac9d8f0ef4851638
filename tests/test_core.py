"""The one matching core (poolsim._core): same numbers on NumPy, jax.numpy (jit + vmap) and torch
(autograd), finite gradients at the singular points, and closed-form checks of each piece.

Expected values come from: NumPy running the same core (cross-backend agreement), np.median /
np.arccos (independent implementations), or closed forms written out in the comments.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

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
    """Scalar built from every core piece with a (reverse-mode) gradient. iterate_match is left
    out because jax's lax.while_loop has no reverse-mode derivative; torch covers it below."""
    outs = _all_core(x, c, w, f)
    keep = outs[:9] + outs[-3:]
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

    # Gradients: jax.grad (under vmap) equals torch autograd for the differentiable pieces.
    gj = jax.vmap(jax.grad(_differentiable_loss, argnums=(0, 1, 3)))(
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
