"""The fast batched matching path (issue 14) against the previous formulation.

References, written here so they stay fixed while the library changes:
* ``_core.geodesic`` (array-API definition: normalise, explicit ``u -/+ v``, ``2 atan2``);
* ``_previous_match``: the batched gate as it was before the fast path (``torch.func.vmap`` over
  slots of the per-slot rule built from ``_core.distance``/``weighted_mean``/``ema_update``);
* ``_previous_matching_losses``: the objective's matching block as it was (two ``geodesic_intra``
  calls through ``_core.geodesic``).
"""
import math
from functools import partial
from typing import NamedTuple

import numpy as np
import pytest
import torch

from adsim.config.run import TrainConfig
from adsim.model import losses
from adsim.model.head import make_head
from adsim.model.matching import CentroidBank, Matched
from adsim.model.objective import matching_losses
from adsim.model.sphere import unit_geodesic
from poolsim import _core


def _unit(x):
    return x / x.norm(dim=-1, keepdim=True)


def _pairs(dtype, seed=0, n=64, d=48):
    """Unit ``f: (n, d)`` and ``c: (n, d)``: random pairs, near-identical (angles 1e-7 .. 1e-2),
    near-antipodal (pi - 1e-7 .. pi - 1e-2), exactly identical and exactly antipodal rows."""
    g = torch.Generator().manual_seed(seed)
    f = _unit(torch.randn(n, d, generator=g, dtype=torch.float64))
    c = _unit(torch.randn(n, d, generator=g, dtype=torch.float64))
    k = n // 4
    scales = torch.logspace(-7, -2, k, dtype=torch.float64)
    noise = _unit(torch.randn(k, d, generator=g, dtype=torch.float64))
    c[:k] = _unit(f[:k] + scales[:, None] * noise)  # near-identical
    c[k:2 * k] = -_unit(f[k:2 * k] + scales[:, None] * noise)  # near-antipodal
    c[2 * k] = f[2 * k]
    c[2 * k + 1] = -f[2 * k + 1]
    return f.to(dtype), c.to(dtype)


def test_unit_geodesic_equals_core_geodesic_float64_values_and_gradients():
    p, c = _pairs(torch.float64)
    p = (p * 3.0).requires_grad_(True)  # features = normalize(p): gradients wrt p compare across forms
    c = c.requires_grad_(True)
    w = torch.linspace(0.5, 1.5, p.shape[0], dtype=torch.float64)
    f = _core.normalize(p)
    new = unit_geodesic(f[:, None, :], c[:, None, :])[:, 0, 0]
    old = _core.geodesic(f, c)
    # float64: both forms take chords of the same unit vectors; they differ by a few ulps of the
    # chords (re-normalisation, summation order), i.e. <= ~1e-15 rad; 1e-13 leaves room
    torch.testing.assert_close(new, old, rtol=0, atol=1e-13)
    # t is not differentiable at 0 and pi (|t| is a cone there): at the two exact rows the forms may
    # pick different subgradients (the renormalised old form sees chord 0 and returns 0; the chord
    # of the given unit vectors is 1e-16 and gives its direction), so t's gradient is compared on
    # the other rows; t^2 (L_intra) is smooth at 0 (compared there) but not at pi
    k = p.shape[0] // 4
    smooth_t, smooth_t2 = torch.ones(p.shape[0], dtype=torch.bool), torch.ones(p.shape[0], dtype=torch.bool)
    smooth_t[2 * k: 2 * k + 2] = False
    smooth_t2[2 * k + 1] = False
    for loss, rows in ((lambda t: (w * t).sum(), smooth_t), (lambda t: (w * t ** 2).sum(), smooth_t2)):
        g_new = torch.autograd.grad(loss(new), (p, c), retain_graph=True)
        g_old = torch.autograd.grad(loss(old), (p, c), retain_graph=True)
        for a, b in zip(g_new, g_old):
            assert torch.isfinite(a).all()
            # gradients of t are unit-size vectors (|dt/df| = 1): absolute 1e-9 is far below any use
            torch.testing.assert_close(a[rows], b[rows], rtol=1e-7, atol=1e-9)


def test_unit_geodesic_float32_as_accurate_as_core_geodesic():
    f, c = _pairs(torch.float32, seed=1)
    # reference: the same float32 inputs, evaluated in float64
    ref = _core.geodesic(f.double(), c.double())
    new = unit_geodesic(f[:, None, :], c[:, None, :])[:, 0, 0].double()
    old = _core.geodesic(f, c).double()
    err_new, err_old = (new - ref).abs(), (old - ref).abs()
    # chord form in float32: a few ulps of the chords (ulp(2) = 2.4e-7) -> <= 1e-6 rad everywhere,
    # including angles of 1e-7 and pi - 1e-7; arccos(<f, c>) is off by ~sqrt(2 * 6e-8) = 3.5e-4 there
    assert float(err_new.max()) <= 1e-6
    assert float(err_old.max()) <= 1e-6
    k = f.shape[0] // 4
    arccos = torch.arccos(torch.clip((f * c).sum(-1), -1, 1)).double()
    assert float((arccos - ref).abs()[:k].max()) > 1e-5  # the form the chord formula avoids is worse


def _previous_match(f, y, valid, c_pos, c_neg, init_pos, init_neg, *, metric, alpha=0.5, update="ema"):
    """The batched rule of ``adsim.model.matching.match`` before the fast path (one slot)."""
    f = _core.normalize(f.float())
    y, valid = y.to(f.dtype), valid.to(f.dtype)
    is_pos, is_neg = (1.0 - y) * valid, y * valid
    d_pos, d_neg = _core.distance(f, c_pos, metric), _core.distance(f, c_neg, metric)
    inf = torch.full_like(d_pos, float("inf"))
    ok_pos = torch.where(init_pos > 0, _core.gate(d_pos, torch.where(init_neg > 0, d_neg, inf)), 1.0)
    ok_neg = torch.where(init_neg > 0, _core.gate(d_neg, torch.where(init_pos > 0, d_pos, inf)), 1.0)
    acc_pos, acc_neg = ok_pos * is_pos, ok_neg * is_neg
    new = []
    for c, acc, init in ((c_pos, acc_pos, init_pos), (c_neg, acc_neg, init_neg)):
        mean, total = _core.weighted_mean(f, acc, c)
        mean = _core.normalize(mean)
        moved = _core.ema_update(c, mean, alpha) if update == "ema" else _core.slerp_update(c, mean, alpha)
        has = (total > 0).to(f.dtype)
        new.append((has * moved + (1.0 - has) * c, torch.maximum(init, has)))
    (c_pos, init_pos), (c_neg, init_neg) = new
    return Matched(c_pos, c_neg, acc_pos, acc_neg, init_pos, init_neg)


def _load(bank, state):
    with torch.no_grad():
        for buf, val in zip((bank.c_pos, bank.c_neg, bank.init_pos, bank.init_neg), state):
            buf.copy_(val)


def _state(g, slots, d):
    c = _unit(torch.randn(2, slots, d, generator=g))
    init = torch.ones(2, slots)
    init[1, 0] = 0.0  # slot 0: anomaly centroid uninitialised (zero)
    c[1, 0] = 0.0
    return c[0], c[1], init[0], init[1]


@pytest.mark.parametrize("metric", _core.METRICS)
@pytest.mark.parametrize("update", ["ema", "slerp"])
def test_bank_batched_step_equals_previous_vmap(metric, update):
    g = torch.Generator().manual_seed(7)
    slots, n, d = 3, 300, 24
    p = torch.randn(slots, n, d, generator=g).requires_grad_(True)
    y, v = (torch.rand(n, generator=g) < 0.3).float(), (torch.rand(n, generator=g) < 0.9).float()
    state = _state(g, slots, d)
    bank = CentroidBank(slots, d, metric=metric, update=update)  # training mode: step stores its result
    r = torch.randn(2, slots, d, generator=g)  # a random linear read-out of the new centroids

    def scalar(m):
        return (m.c_pos * r[0]).sum() + (m.c_neg * r[1]).sum()

    old = torch.func.vmap(partial(_previous_match, metric=metric, update=update),
                          in_dims=(0, None, None, 0, 0, 0, 0))(p, y, v, *state)
    (g_old,) = torch.autograd.grad(scalar(old), p)
    for unit in (False, True):
        _load(bank, state)
        f = _core.normalize(p) if unit else p
        new = bank.step(0, f, y, v, unit=unit)
        assert new.acc_pos.sum() > 0 and new.acc_neg.sum() > 0  # the gate did something
        for a, b in zip(new, old):
            assert a.shape == b.shape
            # gate decisions identical; centroids equal to float32 rounding (means of 300 unit rows)
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        (g_new,) = torch.autograd.grad(scalar(new), p)
        torch.testing.assert_close(g_new, g_old, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(bank.c_pos, new.c_pos.detach())  # the stored state is the result


def _previous_matching_losses(bank, f_seg, f_img, y_patch, v_patch, labels):
    intra = inter = 0.0
    n_layers = f_seg.shape[0]
    state = [t.clone() for t in (bank.c_pos, bank.c_neg, bank.init_pos, bank.init_neg)]
    for start, f, y, v in ((0, f_seg, y_patch, v_patch), (n_layers, f_img, labels, torch.ones_like(labels))):
        sl = slice(start, start + n_layers)
        m = torch.func.vmap(partial(_previous_match, metric="geodesic"), in_dims=(0, None, None, 0, 0, 0, 0))(
            f, y, v, *(t[sl] for t in state))

        def intra_old(acc, c):
            d2 = _core.geodesic(f, c[..., None, :]) ** 2
            return (acc * d2).sum(-1) / torch.clamp(acc.sum(-1), min=1.0)
        intra = intra + (intra_old(m.acc_pos, m.c_pos) + intra_old(m.acc_neg, m.c_neg)).sum() / (2 * n_layers)
        inter = inter + losses.geodesic_inter(m.c_pos, m.c_neg, m.init_pos * m.init_neg).sum() / (2 * n_layers)
    return intra, inter


class _Case(NamedTuple):
    masks: torch.Tensor
    batch: dict
    raw: list
    feats: object
    f_seg: torch.Tensor
    f_img: torch.Tensor
    y_patch: torch.Tensor
    v_patch: torch.Tensor


def _matching_case(g, n_layers, b, grid, e, size) -> _Case:
    """Masks (every other image a lesion; image 4 without a mask), labels, random token leaves ``raw`` and
    their unit features, and the previous block's inputs derived from them as in ``matching_losses``
    (checked against it by value in the tests)."""
    masks = torch.zeros(b, size, size)
    masks[1::2, 4:12, 4:12] = 1.0
    batch = {"mask": masks, "has_mask": torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 1.0]),
             "label": torch.tensor([float(i % 2) for i in range(b)])}
    raw = [torch.randn(b, grid * grid, e, generator=g).requires_grad_(True) for _ in range(2 * n_layers)]

    class Feats:
        seg = [_core.normalize(t) for t in raw[:n_layers]]
        det = [_core.normalize(t) for t in raw[n_layers:]]

    frac = torch.nn.functional.adaptive_avg_pool2d(masks[:, None], grid).flatten(1)
    y_patch = (frac >= 0.5).float().flatten()
    v_patch = (batch["has_mask"][:, None] * ((frac == 0) | (frac >= 0.5)).float()).flatten()
    f_seg = torch.stack([s.flatten(0, 1) for s in Feats.seg])
    f_img = _core.normalize(torch.stack([d.mean(dim=1) for d in Feats.det]))
    return _Case(masks, batch, raw, Feats, f_seg, f_img, y_patch, v_patch)


def test_matching_losses_equal_previous_objective_block():
    g = torch.Generator().manual_seed(11)
    n_layers, b, grid, e, size = 4, 6, 5, 16, 20
    text = _unit(torch.randn(2, e, generator=g))
    cfg = TrainConfig(data="", target="Brain", out="", gate_mode="batched")  # the previous block's gate
    head = make_head(cfg, e, e, text, n_layers=n_layers).train()
    _load(head.centroids, _state(g, 2 * n_layers, e))
    case = _matching_case(g, n_layers, b, grid, e, size)
    masks, batch, raw, Feats = case.masks, case.batch, case.raw, case.feats
    f_seg, f_img, y_patch, v_patch = case.f_seg, case.f_img, case.y_patch, case.v_patch
    old = _previous_matching_losses(head.centroids, f_seg, f_img, y_patch, v_patch, batch["label"])
    new = matching_losses(cfg, head, Feats, batch["label"], masks, batch["has_mask"], grid)
    assert new[2].tolist() == [1.0] * b  # gate_filter="centroids": every sample keeps its losses
    new = new[:2]
    assert float(new[0].detach()) > 0 and float(new[1].detach()) < 0  # something matched, both centroids exist
    for a, b_ in zip(new, old):
        torch.testing.assert_close(a, b_, rtol=1e-5, atol=1e-6)
    g_new = torch.autograd.grad(new[0] + new[1], raw, retain_graph=True)
    g_old = torch.autograd.grad(old[0] + old[1], raw)
    for a, b_ in zip(g_new, g_old):
        torch.testing.assert_close(a, b_, rtol=1e-4, atol=1e-6)


def test_matching_losses_refuse_a_head_without_centroids():
    cfg = TrainConfig(data="", target="Brain", out="", method="naive")
    head = make_head(cfg, 16, 16, _unit(torch.randn(2, 16)), n_layers=2)
    assert head.centroids is None
    with pytest.raises(ValueError, match="centroids"):
        matching_losses(cfg, head, None, torch.zeros(2), torch.zeros(2, 8, 8), torch.ones(2), 4)


def test_geodesic_intra_several_centroids_equals_one_at_a_time():
    g = torch.Generator().manual_seed(2)
    f = torch.randn(3, 50, 8, generator=g, dtype=torch.float64)
    acc = (torch.rand(3, 2, 50, generator=g) < 0.5).to(torch.float64)
    c = torch.randn(3, 2, 8, generator=g, dtype=torch.float64)
    both = losses.geodesic_intra(f, acc, c)
    for k in range(2):
        # reference: mean of squared _core.geodesic over the accepted rows
        d2 = _core.geodesic(f, c[:, k, None, :]) ** 2
        ref = (acc[:, k] * d2).sum(-1) / acc[:, k].sum(-1)
        torch.testing.assert_close(both[:, k], ref, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(losses.geodesic_intra(f, acc[:, k], c[:, k]), ref, rtol=1e-12, atol=1e-14)
    unit = _core.normalize(f)
    torch.testing.assert_close(losses.geodesic_intra(unit, acc, c, unit=True), both, rtol=1e-12, atol=1e-14)
    assert math.isclose(float(losses.geodesic_intra(f, torch.zeros(3, 2, 50, dtype=torch.float64), c).sum()), 0.0)
    assert np.isfinite(both.detach().numpy()).all()


def test_vaca_from_raw_tokens_equals_from_unit_tokens():
    # normalize(normalize(x) * w) = normalize(x * w): each row of normalize(x) is x's row times a
    # positive factor. The raw path must give the same P~ and the same gradients w.r.t. x (float32
    # rounding: 1e-5 relative) while skipping the inner normalisation in the backward pass.
    from adsim.model.head import VACA

    g = torch.Generator().manual_seed(4)
    torch.manual_seed(4)  # the MLP's initial weights
    vaca = VACA(16, gamma=2.0).train()
    x = (3.0 * torch.randn(3, 10, 16, generator=g)).requires_grad_(True)
    x_zero = torch.zeros(1, 10, 16).requires_grad_(True)  # zero rows stay zero on both paths
    text = _unit(torch.randn(2, 16, generator=g))
    r = torch.randn(3, 10, 16, generator=g)
    outs, grads = [], []
    for raw in (False, True):
        p = _core.normalize(x)
        out, var, w = vaca(p, text, raw=x if raw else None)
        assert torch.isfinite(out).all()
        outs.append(out)
        grads.append(torch.autograd.grad((out * r).sum() + var, (x, *vaca.mlp.parameters())))
        zero, _, _ = vaca(_core.normalize(x_zero), text, raw=x_zero if raw else None)
        assert float(zero.detach().abs().max()) == 0.0
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-6)
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("tau", [None, 1.6])
def test_bank_steps_of_several_sets_equal_the_previous_rule_per_set(tau):
    # sets in any order, two adjacent (one centroid update for both) and one after a gap (slot 2 untouched);
    # oracle: _previous_match per slot (tau: the fixed-radius gate written out below), values and gradients
    g = torch.Generator().manual_seed(3)
    d = 12
    bank = CentroidBank(7, d, tau=tau)
    state = _state(g, 7, d)
    _load(bank, state)
    sets = [(3, 2, 40), (0, 2, 25), (5, 2, 9)]  # (start, slots, n)
    feats = [torch.randn(s, n, d, generator=g).requires_grad_(True) for _, s, n in sets]
    labels = [((torch.rand(n, generator=g) < 0.4).float(), (torch.rand(n, generator=g) < 0.9).float())
              for _, _, n in sets]
    outs = bank.steps([(start, f, y, v) for (start, _, _), f, (y, v) in zip(sets, feats, labels)])
    r = torch.randn(2, 7, d, generator=g)  # a random linear read-out of the new centroids
    got = sum((m.c_pos * r[0, st:st + s]).sum() + (m.c_neg * r[1, st:st + s]).sum() for (st, s, _), m in zip(sets, outs))
    g_got = torch.autograd.grad(got, feats)
    want = 0.0
    for (st, s, _), f, (y, v), m in zip(sets, feats, labels, outs):
        sl = slice(st, st + s)
        ref = torch.func.vmap(partial(_previous_match, metric="geodesic"), in_dims=(0, None, None, 0, 0, 0, 0))(
            f, y, v, *(t[sl] for t in state))
        if tau is not None:  # fixed radius: own centroid within tau (an uninitialised own centroid accepts)
            with torch.no_grad():
                fu = _core.normalize(f)
                for k, (c, init) in enumerate(((state[0][sl], state[2][sl]), (state[1][sl], state[3][sl]))):
                    ok = torch.where(init[:, None] > 0, (_core.geodesic(fu, c[:, None]) < tau).float(), 1.0)
                    lab = (1.0 - y) * v if k == 0 else y * v
                    torch.testing.assert_close(m[2 + k], ok * lab)
            assert 0 < float(m.acc_pos.sum() + m.acc_neg.sum()) < 2 * s * float(v.sum())  # some accepted, not all
            continue
        for a, b in zip(m, ref):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)  # as test_bank_batched_step_equals_previous_vmap
        want = want + (ref.c_pos * r[0, sl]).sum() + (ref.c_neg * r[1, sl]).sum()
    for (st, s, _), m in zip(sets, outs):  # the stored state is the result; slot 2 untouched
        torch.testing.assert_close(bank.c_pos[st:st + s], m.c_pos.detach())
        torch.testing.assert_close(bank.init_neg[st:st + s], m.init_neg)
    assert torch.equal(bank.c_pos[2], state[0][2]) and torch.equal(bank.c_neg[2], state[1][2])
    if tau is None:
        for a, b in zip(g_got, torch.autograd.grad(want, feats)):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def _generic_matching_losses(cfg, bank, f_seg, f_img, y_patch, v_patch, owner, labels):
    """The matching block written with the generic, normalising loss calls (``losses.intra/inter/cross``
    without the unit shortcuts) on ``_previous_match`` per slot; ``cfg``'s gate filter, intra power and
    inter form. Returns ``(intra, inter, keep)``."""
    state = [t.clone() for t in (bank.c_pos, bank.c_neg, bank.init_pos, bank.init_neg)]
    n_layers, b = f_seg.shape[0], labels.shape[0]
    sets = [(0, f_seg, y_patch, v_patch, owner)]
    if cfg.match_branches == "seg+det":
        sets.append((n_layers, f_img, labels, torch.ones_like(labels), torch.arange(b)))
    ms = []
    for start, f, y, v, own in sets:
        sl = slice(start, start + n_layers)
        ms.append(torch.func.vmap(partial(_previous_match, metric="geodesic"), in_dims=(0, None, None, 0, 0, 0, 0))(
            f, y, v, *(t[sl] for t in state)))
    keep = torch.ones(b)
    if cfg.gate_filter == "skip_step":
        failed = torch.zeros(b)
        for (_, _, _, v, own), m in zip(sets, ms):
            for j in range(own.shape[0]):  # any layer: a valid unit neither centroid accepted
                if float((v[j] * (1.0 - m.acc_pos[:, j] - m.acc_neg[:, j])).max()) > 0:
                    failed[own[j]] = 1.0
        keep = (failed == 0).float()
    intra = inter = 0.0
    norm = len(sets) * n_layers
    for (_, f, _, _, own), m in zip(sets, ms):
        ap, an = m.acc_pos * keep[own], m.acc_neg * keep[own]
        intra = intra + (losses.intra(f, ap, m.c_pos, power=cfg.intra_power)
                         + losses.intra(f, an, m.c_neg, power=cfg.intra_power)).sum() / norm
        inter = inter + losses.inter(m.c_pos, m.c_neg, m.init_pos * m.init_neg, form=cfg.inter_form).sum() / norm
        if cfg.inter_form == "reciprocal":
            inter = inter + (losses.cross(f, ap, m.c_neg, m.init_neg) + losses.cross(f, an, m.c_pos, m.init_pos)).sum() / norm
    return intra, inter, keep


@pytest.mark.parametrize("options", [{}, {"gate_filter": "skip_step", "inter_form": "reciprocal", "intra_power": 1},
                                     {"match_branches": "seg"}])
def test_matching_losses_equal_the_generic_formulas(options):
    g = torch.Generator().manual_seed(12)
    n_layers, b, grid, e, size = 4, 6, 5, 16, 20
    cfg = TrainConfig(data="", target="Brain", out="", gate_mode="batched")._replace(**options)
    head = make_head(cfg, e, e, _unit(torch.randn(2, e, generator=g)), n_layers=n_layers).train()
    state = _state(g, 2 * n_layers, e)
    if cfg.gate_filter == "skip_step":  # only slot L initialised (others accept all): some samples pass the gate
        for t in state:
            t[:n_layers].zero_()
            t[n_layers + 1:].zero_()
    _load(head.centroids, state)
    case = _matching_case(g, n_layers, b, grid, e, size)
    masks, has_mask, labels, raw = case.masks, case.batch["has_mask"], case.batch["label"], case.raw
    owner = torch.arange(b).repeat_interleave(grid * grid)
    old = _generic_matching_losses(cfg, head.centroids, case.f_seg, case.f_img, case.y_patch, case.v_patch, owner,
                                   labels)
    new = matching_losses(cfg, head, case.feats, labels, masks, has_mask, grid)
    assert torch.equal(new[2], old[2])
    if cfg.gate_filter == "skip_step":
        assert 0 < float(new[2].sum()) < b  # some samples failed the gate, some passed
    for a, b_ in zip(new[:2], old[:2]):
        torch.testing.assert_close(a, b_, rtol=1e-5, atol=1e-6)  # float32 rounding, as above
    g_new = torch.autograd.grad(new[0] + new[1], raw, retain_graph=True, allow_unused=True)
    g_old = torch.autograd.grad(old[0] + old[1], raw, allow_unused=True)
    for a, b_ in zip(g_new, g_old):  # None: a detection token without the detection branch
        assert (a is None) == (b_ is None)
        if a is not None:
            torch.testing.assert_close(a, b_, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("update", ["ema", "slerp"])
def test_matching_losses_of_the_exact_gate_equal_the_renormalising_losses(update, monkeypatch):
    # matching_losses takes the gate's centroids as unit vectors (no renormalisation in L_intra / L_inter);
    # oracle: the same block with the normalising loss formulas (the exact gate's centroids are unit too)
    g = torch.Generator().manual_seed(13)
    n_layers, b, grid, e, size = 4, 6, 5, 16, 20
    cfg = TrainConfig(data="", target="Brain", out="", gate_mode="sequential", update=update)
    head = make_head(cfg, e, e, _unit(torch.randn(2, e, generator=g)), n_layers=n_layers).train()
    state = _state(g, 2 * n_layers, e)
    case = _matching_case(g, n_layers, b, grid, e, size)
    args = (case.feats, case.batch["label"], case.masks, case.batch["has_mask"], grid)
    _load(head.centroids, state)
    new = matching_losses(cfg, head, *args)
    intra, inter = losses.intra, losses.inter
    monkeypatch.setattr(losses, "intra", lambda *a, **k: intra(*a, **{**k, "unit_c": False}))
    monkeypatch.setattr(losses, "inter", lambda *a, **k: inter(*a, **{**k, "unit": False}))
    _load(head.centroids, state)
    old = matching_losses(cfg, head, *args)
    assert float(new[0].detach()) > 0 and float(new[1].detach()) < 0  # something matched, both centroids exist
    for a, b_ in zip(new[:2], old[:2]):
        torch.testing.assert_close(a, b_, rtol=1e-5, atol=1e-6)  # float32 rounding, as above
    g_new = torch.autograd.grad(new[0] + new[1], case.raw, retain_graph=True)
    g_old = torch.autograd.grad(old[0] + old[1], case.raw)
    for a, b_ in zip(g_new, g_old):
        torch.testing.assert_close(a, b_, rtol=1e-4, atol=1e-6)
