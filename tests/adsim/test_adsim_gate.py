"""The exact fast sequential gate (adsim.model.matching.match_sequential) against the literal loop of
Algorithm 1 (``match(..., mode="sequential")``, the oracle): same decisions, centroids within 1e-5,
and its documented gradient (EMA normalisers held constant)."""
import pytest
import torch

from adsim.model.matching import CentroidBank, ema_trajectory, match, match_sequential
from poolsim import _core

S, N, D = 3, 48, 8  # one compiled shape per metric for the whole file (compilation is the slow part)


def _inputs(seed, *, init="both", labels="mixed", invalid=0.0):
    """Clustered unit features (two noisy directions, 20% label noise) so that many features are
    accepted and many rejected; centroids initialised, half-initialised or zero."""
    g = torch.Generator().manual_seed(seed)
    centre = torch.nn.functional.normalize(torch.randn(2, D, generator=g), dim=-1)
    y = (torch.rand(N, generator=g) < 0.4).float()
    side = torch.where(torch.rand(N, generator=g) < 0.2, 1 - y, y).long()
    f = centre[side][None] + 0.9 * torch.randn(S, N, D, generator=g)
    if labels == "normal":
        y = torch.zeros(N)
    elif labels == "anomaly":
        y = torch.ones(N)
    valid = (torch.rand(N, generator=g) >= invalid).float()
    c = torch.nn.functional.normalize(torch.randn(2, S, D, generator=g), dim=-1)
    flags = {"both": (1.0, 1.0), "pos": (1.0, 0.0), "none": (0.0, 0.0)}[init]
    c_pos, c_neg = c[0] * flags[0], c[1] * flags[1]  # an uninitialised centroid is zero
    return f, y, valid, c_pos, c_neg, torch.full((S,), flags[0]), torch.full((S,), flags[1])


def _oracle(f, y, valid, c_pos, c_neg, ip, in_, **kw):
    per = [match(f[s], y, valid, c_pos[s], c_neg[s], ip[s], in_[s], mode="sequential", **kw) for s in range(S)]
    return [torch.stack(t) for t in zip(*per)]


CASES = [dict(init="both"), dict(init="pos"), dict(init="none"), dict(labels="normal"),
         dict(labels="anomaly", init="none"), dict(invalid=0.3), dict(invalid=1.0)]


@pytest.mark.parametrize("metric", _core.METRICS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
@pytest.mark.parametrize("seed", [0])
def test_same_decisions_and_centroids_as_the_literal_loop(metric, case, seed):
    args = _inputs(seed, **case)
    fast = match_sequential(*args, metric=metric)
    ref = _oracle(*args, metric=metric)
    for name in ("acc_pos", "acc_neg", "init_pos", "init_neg"):  # 0/1 decisions: identical
        assert torch.equal(getattr(fast, name), ref[fast._fields.index(name)]), name
    torch.testing.assert_close(fast.c_pos, ref[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(fast.c_neg, ref[1], rtol=0, atol=1e-5)
    if case.get("invalid") == 1.0:  # nothing has a label: nothing matched, centroids untouched
        assert fast.acc_pos.sum() == 0 and fast.acc_neg.sum() == 0
        torch.testing.assert_close(fast.c_pos, args[3])
    elif "labels" not in case:  # the clustered data exercise both decisions many times
        assert 0 < fast.acc_pos.sum() < fast.acc_pos.numel() and fast.acc_neg.sum() > 0


def test_decisions_depend_on_order_like_the_loop():
    # a permutation changes the sequential decisions; the fast gate follows the loop in both orders
    f, y, valid, *state = _inputs(3)
    perm = torch.randperm(N, generator=torch.Generator().manual_seed(0))
    a = match_sequential(f[:, perm], y[perm], valid[perm], *state)
    b = _oracle(f[:, perm], y[perm], valid[perm], *state)
    assert torch.equal(a.acc_pos, b[2]) and torch.equal(a.acc_neg, b[3])
    c = match_sequential(f, y, valid, *state)
    assert not torch.equal(c.acc_pos[:, perm], a.acc_pos)


def _detached_loop(f, acc, c0, alpha):
    """Independent reference for the fast gate's gradient: the literal EMA recursion over the oracle's
    accepted features with every normaliser ||alpha c + (1 - alpha) f|| detached, then one final
    renormalisation (what the fast gate documents)."""
    fn = _core.normalize(f)
    c = c0
    for j in range(fn.shape[0]):
        if acc[j] > 0:
            u = alpha * c + (1 - alpha) * fn[j]
            c = u / u.norm().detach()
    return _core.normalize(c)


@pytest.mark.parametrize("init", ["both", "none"])
def test_gradient_is_the_loop_gradient_with_detached_normalisers(init):
    f, y, valid, *state = _inputs(4, init=init)
    f = f.requires_grad_(True)
    w = torch.randn(2, S, D, generator=torch.Generator().manual_seed(9))
    fast = match_sequential(f, y, valid, *state)
    (g_fast,) = torch.autograd.grad((w[0] * fast.c_pos).sum() + (w[1] * fast.c_neg).sum(), f)
    ref = 0.0
    for s in range(S):
        ref = ref + (w[0, s] * _detached_loop(f[s], fast.acc_pos[s], state[0][s], 0.5)).sum()
        ref = ref + (w[1, s] * _detached_loop(f[s], fast.acc_neg[s], state[1][s], 0.5)).sum()
    (g_ref,) = torch.autograd.grad(ref, f)
    torch.testing.assert_close(g_fast, g_ref, rtol=1e-4, atol=1e-6)
    assert g_fast.abs().sum() > 0
    # rejected features get no gradient from the centroids (as in the literal loop)
    rejected = (fast.acc_pos + fast.acc_neg) == 0
    assert torch.all(g_fast[rejected] == 0)


def test_gradient_equals_the_literal_loop_when_each_centroid_moves_once():
    # one EMA step: normalize(u / r) with r constant has the Jacobian of normalize(u) (scale
    # invariance), so the fast and the literal gradients coincide exactly here
    g = torch.Generator().manual_seed(5)
    f = torch.randn(S, 2, D, generator=g, requires_grad=True)
    y, valid = torch.tensor([0.0, 1.0]), torch.ones(2)
    c = torch.nn.functional.normalize(torch.randn(2, S, D, generator=g), dim=-1)
    state = (c[0], c[1], torch.zeros(S), torch.zeros(S))  # uninitialised flags: both accepted
    w = torch.randn(2, S, D, generator=g)
    fast = match_sequential(f, y, valid, *state)
    assert fast.acc_pos[:, 0].all() and fast.acc_neg[:, 1].all()
    lit = _oracle(f, y, valid, *state)
    gf = torch.autograd.grad((w[0] * fast.c_pos + w[1] * fast.c_neg).sum(), f)[0]
    gl = torch.autograd.grad((w[0] * lit[0] + w[1] * lit[1]).sum(), f)[0]
    torch.testing.assert_close(gf, gl, rtol=1e-4, atol=1e-6)


def test_ema_trajectory_closed_form_by_hand():
    # c0 = e1, one move towards f = e2 with alpha = 0.5: u = (0.5, 0.5), r = sqrt(0.5) -> (1, 1)/sqrt 2
    e = torch.eye(2)
    r = torch.tensor([[0.5 ** 0.5]])
    out = ema_trajectory(e[1][None, None], e[0][None], torch.ones(1, 1), r, 0.5)
    torch.testing.assert_close(out, torch.tensor([[1.0, 1.0]]) / 2 ** 0.5)
    # nothing moved: the start centroid comes back unchanged (even a zero one)
    z = ema_trajectory(e[1][None, None], torch.zeros(1, 2), torch.zeros(1, 1), r, 0.5)
    assert torch.equal(z, torch.zeros(1, 2))


def test_antipodal_feature_leaves_the_centroid_like_the_literal_loop():
    # alpha = 0.5, f = -c: the EMA is 0/0 and _core.ema_update keeps c; the fast path must agree
    c = torch.eye(D)[:S]  # basis vectors: f = -c is exactly antipodal after normalisation
    f = torch.cat([-c[:, None], torch.ones(S, 1, D)], 1)
    args = (f, torch.zeros(2), torch.ones(2), c, torch.zeros(S, D), torch.ones(S), torch.zeros(S))
    fast, ref = match_sequential(*args), _oracle(*args)
    assert torch.equal(fast.acc_pos, ref[2]) and fast.acc_pos[:, 0].all()  # accepted, c- uninitialised
    torch.testing.assert_close(fast.c_pos, ref[0], rtol=0, atol=1e-5)
    assert not torch.equal(fast.c_pos, c)  # the second feature did move it


@pytest.mark.slow
def test_bank_sequential_uses_the_exact_gate_for_both_updates():
    args = _inputs(6)
    for update in ("ema", "slerp"):
        bank = CentroidBank(S, D, mode="sequential", update=update)
        bank.c_pos[:], bank.c_neg[:], bank.init_pos[:], bank.init_neg[:] = args[3:]
        out = bank.step(0, *args[:3])
        ref = _oracle(*args, update=update)
        assert torch.equal(out.acc_pos, ref[2]) and torch.equal(out.acc_neg, ref[3])
        torch.testing.assert_close(bank.c_pos, ref[0], rtol=0, atol=1e-5)


@pytest.mark.parametrize("kw, msg", [({"update": "slerp_delta"}, "centroid update must be one of"), ({"alpha": 1.0}, "alpha"),
                                     ({"metric": "manhattan"}, "metric must be one of"),
                                     ({"scan_device": "tpu"}, "scan_device must be one of")])
def test_bad_options(kw, msg):
    with pytest.raises(ValueError, match=msg):
        match_sequential(*_inputs(0), **kw)


def test_bad_shapes():
    f, y, valid, *state = _inputs(0)
    with pytest.raises(ValueError, match=r"f \(S, n, d\)"):
        match_sequential(f[0], y, valid, *state)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run with JAX_PLATFORMS=cuda,cpu "
                    "to put the scan on the GPU; the test suite's default JAX_PLATFORMS=cpu scans on the host)")
@pytest.mark.parametrize("scan_device", ["auto", "cpu"])
def test_exact_gate_on_cuda_tensors_matches_the_literal_loop(scan_device):
    args = _inputs(0)
    x = [a.cuda() for a in args]
    x[0].requires_grad_(True)
    fast = match_sequential(*x, scan_device=scan_device, scan_backend="jax")  # the Triton kernel: its own file
    ref = _oracle(*args)
    assert fast.c_pos.device.type == "cuda"
    assert torch.equal(fast.acc_pos.cpu(), ref[2]) and torch.equal(fast.acc_neg.cpu(), ref[3])
    torch.testing.assert_close(fast.c_pos.cpu(), ref[0], rtol=0, atol=1e-5)
    (g,) = torch.autograd.grad(fast.c_pos.sum() + fast.c_neg.sum(), x[0])
    assert torch.isfinite(g).all() and g.abs().sum() > 0
