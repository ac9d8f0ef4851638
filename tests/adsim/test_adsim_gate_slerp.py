"""The exact fast sequential gate with the slerp centroid update (``match_sequential(update="slerp")``,
the path of the ``authors`` recipe) against the literal loop of Algorithm 1 (``match(...,
mode="sequential", update="slerp")``, the oracle): identical decisions, centroids within 1e-5 and the
loop's gradients. Features are NumPy-seeded random unit vectors; edge cases: nothing accepted,
antipodal features, a bank buffer written between forward and backward."""
import math

import numpy as np
import pytest
import torch

from adsim.model.matching import CentroidBank, match, match_sequential, slerp_trajectory
from poolsim import _core

S, N, D = 3, 40, 8  # one compiled scan shape per metric for most of the file


def _unit(a):
    return torch.nn.functional.normalize(torch.as_tensor(a, dtype=torch.float32), dim=-1)


def _inputs(seed, *, init="both", invalid=0.0, n=N):
    """Unit features around two random directions (20% on the other label's side) so that the gate
    accepts many and rejects many; labels 40% anomalous; centroids random unit, or zero."""
    rng = np.random.default_rng(seed)
    centre = rng.standard_normal((2, D))
    y = (rng.random(n) < 0.4).astype(np.float32)
    side = np.where(rng.random(n) < 0.2, 1 - y, y).astype(int)
    f = _unit(centre[side][None] / np.linalg.norm(centre[side], axis=-1, keepdims=True)[None]
              + 0.9 * rng.standard_normal((S, n, D)))
    valid = torch.as_tensor((rng.random(n) >= invalid).astype(np.float32))
    c = _unit(rng.standard_normal((2, S, D)))
    flags = {"both": (1.0, 1.0), "pos": (1.0, 0.0), "none": (0.0, 0.0)}[init]
    return (f, torch.as_tensor(y), valid, c[0] * flags[0], c[1] * flags[1], torch.full((S,), flags[0]),
            torch.full((S,), flags[1]))


def _oracle(f, y, valid, c_pos, c_neg, ip, in_, **kw):
    per = [match(f[s], y, valid, c_pos[s], c_neg[s], ip[s], in_[s], mode="sequential", update="slerp", **kw)
           for s in range(f.shape[0])]
    return [torch.stack(t) for t in zip(*per)]


def _same(fast, ref, atol=1e-5):
    for name in ("acc_pos", "acc_neg", "init_pos", "init_neg"):  # 0/1 decisions: identical
        assert torch.equal(getattr(fast, name), ref[fast._fields.index(name)]), name
    torch.testing.assert_close(fast.c_pos, ref[0], rtol=0, atol=atol)
    torch.testing.assert_close(fast.c_neg, ref[1], rtol=0, atol=atol)


@pytest.mark.parametrize("alpha", [0.5, 0.3])  # 0.3: where slerp differs from the EMA (see below)
@pytest.mark.parametrize("metric", _core.METRICS)
@pytest.mark.parametrize("case", [dict(init="both"), dict(init="pos"), dict(init="none"), dict(invalid=0.3)],
                         ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_slerp_same_decisions_and_centroids_as_the_literal_loop(metric, case, alpha):
    args = _inputs(1, **case)
    fast = match_sequential(*args, metric=metric, update="slerp", alpha=alpha)
    _same(fast, _oracle(*args, metric=metric, alpha=alpha))
    # the data exercise both outcomes of the gate many times (else the comparison is vacuous)
    assert 0 < fast.acc_pos.sum() < fast.acc_pos.numel() and fast.acc_neg.sum() > 0


@pytest.mark.slow
def test_slerp_fixed_radius_and_other_alpha_follow_the_loop():
    args = _inputs(2)
    for kw in (dict(tau=1.2), dict(alpha=0.8)):
        _same(match_sequential(*args, update="slerp", **kw), _oracle(*args, **kw))


@pytest.mark.parametrize("init", ["both", "none"])
def test_slerp_gradients_are_the_literal_loop_gradients(init):
    f, y, valid, c_pos, c_neg, ip, in_ = _inputs(3, init=init)
    w = torch.as_tensor(np.random.default_rng(9).standard_normal((2, S, D)), dtype=torch.float32)
    grads = []
    for run in (lambda *a: match_sequential(*a, update="slerp"), lambda *a: _oracle(*a)[:2]):
        x = f.clone().requires_grad_(True)
        cp = c_pos.clone().requires_grad_(True)
        out = run(x, y, valid, cp, c_neg, ip, in_)
        loss = (w[0] * out[0]).sum() + (w[1] * out[1]).sum()
        grads.append(torch.autograd.grad(loss, (x, cp)))
    for g_fast, g_ref in zip(*grads):
        torch.testing.assert_close(g_fast, g_ref, rtol=1e-4, atol=1e-6)
    assert grads[0][0].abs().sum() > 0


def test_nothing_accepted_leaves_the_centroids_and_passes_no_gradient():
    f, y, _, *state = _inputs(4)
    valid = torch.zeros(N)  # no feature has a label: the gate accepts none
    x = f.clone().requires_grad_(True)
    fast = match_sequential(x, y, valid, *state, update="slerp")
    _same(fast, _oracle(f, y, valid, *state))
    assert fast.acc_pos.sum() == 0 and fast.acc_neg.sum() == 0
    assert torch.equal(fast.c_pos, state[0]) and torch.equal(fast.c_neg, state[1])
    # every label normal but every feature next to c- (far from c+): the gate rejects them all
    c_neg = _unit(np.random.default_rng(5).standard_normal((S, D)))
    f2 = _unit(c_neg[:, None] + 0.01 * torch.as_tensor(np.random.default_rng(6).standard_normal((S, N, D)),
                                                      dtype=torch.float32))
    args = (f2, torch.zeros(N), torch.ones(N), -c_neg, c_neg, torch.ones(S), torch.ones(S))
    fast = match_sequential(*args, update="slerp")
    _same(fast, _oracle(*args))
    assert fast.acc_pos.sum() == 0 and torch.equal(fast.c_pos, -c_neg)


@pytest.mark.slow
def test_antipodal_features_follow_the_literal_loop():
    # f = -c exactly: no unique arc; _core.slerp_update falls back to the EMA, which (alpha 0.5) keeps c
    c = torch.eye(D)[:S]
    f = torch.cat([-c[:, None], torch.ones(S, 1, D), -c[:, None]], 1)
    for alpha in (0.5, 0.3):
        args = (f, torch.zeros(3), torch.ones(3), c, torch.zeros(S, D), torch.ones(S), torch.zeros(S))
        fast = match_sequential(*args, update="slerp", alpha=alpha)
        _same(fast, _oracle(*args, alpha=alpha))
        assert fast.acc_pos[:, 0].all()  # accepted: the anomaly centroid is uninitialised
        assert torch.isfinite(fast.c_pos).all() and not torch.equal(fast.c_pos, c)


def test_slerp_trajectory_closed_form_by_hand():
    # c0 = e1 and one move towards f = e2 (90 degrees apart): slerp keeps the fraction alpha of the arc
    # from f, i.e. the result is at angle (1 - alpha) * 90 degrees from e1 in the (e1, e2) plane
    e = torch.eye(3)
    for alpha in (0.5, 0.25):
        out = slerp_trajectory(e[1][None, None], e[0][None], torch.ones(1, 1), alpha)
        t = (1 - alpha) * math.pi / 2
        torch.testing.assert_close(out, torch.tensor([[math.cos(t), math.sin(t), 0.0]]))
    # two moves of alpha = 0.5 towards e2: 45 then 67.5 degrees
    out = slerp_trajectory(torch.stack([e[1], e[1]])[None], e[0][None], torch.ones(1, 2), 0.5)
    torch.testing.assert_close(out, torch.tensor([[math.cos(3 * math.pi / 8), math.sin(3 * math.pi / 8), 0.0]]))
    # not moved: the start centroid (a zero one too), as a new tensor
    z = torch.zeros(1, 3)
    out = slerp_trajectory(e[1][None, None], z, torch.zeros(1, 1), 0.5)
    assert torch.equal(out, z) and out.data_ptr() != z.data_ptr()


def test_bank_slerp_equals_the_loop_and_survives_its_buffer_update_before_backward():
    f, y, valid, *state = _inputs(7)
    bank = CentroidBank(S, D, mode="sequential", update="slerp")
    bank.c_pos[:], bank.c_neg[:], bank.init_pos[:], bank.init_neg[:] = state
    x = f.clone().requires_grad_(True)
    out = bank.step(0, x, y, torch.zeros(N))  # nothing accepted: the centroids come back unchanged
    loss = (x * out.c_pos[:, None]).sum()  # saves c_pos for the gradient w.r.t. x
    out2 = bank.step(0, x, y, valid)  # writes the bank's buffers in place
    _same(out2, _oracle(f, y, valid, *state))
    torch.testing.assert_close(bank.c_pos, _oracle(f, y, valid, *state)[0], rtol=0, atol=1e-5)
    (loss + out2.c_pos.sum()).backward()  # must not see a modified saved tensor
    assert torch.isfinite(x.grad).all()


@pytest.mark.slow
def test_slerp_at_one_half_is_the_renormalised_ema_and_differs_elsewhere():
    # the midpoint of the arc between unit c and f is (c + f) / ||c + f||: at alpha = 0.5 the slerp and
    # the renormalised EMA of the paper are the same update (up to rounding); at alpha = 0.3 they differ
    args = _inputs(8)
    for alpha, same in ((0.5, True), (0.3, False)):
        a = match_sequential(*args, update="slerp", alpha=alpha)
        b = match_sequential(*args, update="ema", alpha=alpha)
        close = torch.equal(a.acc_pos, b.acc_pos) and torch.allclose(a.c_pos, b.c_pos, rtol=0, atol=1e-5)
        assert close == same, alpha
