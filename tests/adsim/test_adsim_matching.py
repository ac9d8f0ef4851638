"""Gates and centroid updates of the detector (adsim.model.matching), which call poolsim._core on torch."""
import math

import numpy as np
import pytest
import torch

from adsim.model.matching import CentroidBank, match
from poolsim import _core

E1, E2, E3 = torch.eye(3)
ONE, ZERO = torch.tensor(1.0), torch.tensor(0.0)


def _unit(v):
    v = torch.as_tensor(v, dtype=torch.float32)
    return v / v.norm()


@pytest.mark.parametrize("metric", _core.METRICS)
@pytest.mark.parametrize("update", ["ema", "slerp"])
@pytest.mark.parametrize("label", [0, 1])
def test_sequential_equals_batched_for_one_feature(metric, update, label):
    g = torch.Generator().manual_seed(3)
    c_pos, c_neg = _unit(torch.randn(8, generator=g)), _unit(torch.randn(8, generator=g))
    for _ in range(20):
        f = torch.randn(1, 8, generator=g)
        y, v = torch.tensor([float(label)]), torch.ones(1)
        a = match(f, y, v, c_pos, c_neg, ONE, ONE, metric=metric, mode="sequential", update=update)
        b = match(f, y, v, c_pos, c_neg, ONE, ONE, metric=metric, mode="batched", update=update)
        for x, z in zip(a, b):
            torch.testing.assert_close(x, z, rtol=1e-6, atol=1e-6)


def test_label_consistency_by_hand():
    # c+ = e1 (normal), c- = e2 (anomaly). Geodesic distances by hand: f near e1 has d+ < d-.
    near_pos, near_neg = _unit([1.0, 0.2, 0.0]), _unit([0.2, 1.0, 0.0])
    f = torch.stack([near_pos, near_pos, near_neg, near_neg])
    y = torch.tensor([0.0, 1.0, 0.0, 1.0])  # normal@c+, anomaly@c+, normal@c-, anomaly@c-
    m = match(f, y, torch.ones(4), E1, E2, ONE, ONE, mode="batched")
    # only label-consistent and strictly closer features are matched
    assert m.acc_pos.tolist() == [1.0, 0.0, 0.0, 0.0]
    assert m.acc_neg.tolist() == [0.0, 0.0, 0.0, 1.0]
    # EMA with alpha = 0.5 then renormalisation (paper, §Centroid update): c+ = normalize(e1 + f0)
    torch.testing.assert_close(m.c_pos, _unit(E1 + near_pos))
    torch.testing.assert_close(m.c_neg, _unit(E2 + near_neg))
    seq = match(f, y, torch.ones(4), E1, E2, ONE, ONE, mode="sequential")
    assert seq.acc_pos.tolist() == [1.0, 0.0, 0.0, 0.0] and seq.acc_neg.tolist() == [0.0, 0.0, 0.0, 1.0]


def test_invalid_labels_are_never_matched():
    f = torch.stack([E1, E1])
    m = match(f, torch.tensor([0.0, 0.0]), torch.tensor([0.0, 1.0]), E1 * 0, E2 * 0, ZERO, ZERO)
    assert m.acc_pos.tolist() == [0.0, 1.0]


def test_zero_init_first_feature_initialises_and_other_never_blocks():
    # both centroids zero: the first normal feature initialises c+ to f/||f|| (EMA of a zero centroid)
    f = torch.tensor([[3.0, 4.0, 0.0]])
    m = match(f, torch.zeros(1), torch.ones(1), torch.zeros(3), torch.zeros(3), ZERO, ZERO, mode="sequential")
    torch.testing.assert_close(m.c_pos, torch.tensor([0.6, 0.8, 0.0]))
    assert float(m.init_pos) == 1.0 and float(m.init_neg) == 0.0
    # c- still uninitialised: a normal feature far from c+ is still matched (the other is infinitely far)
    m2 = match(-f, torch.zeros(1), torch.ones(1), m.c_pos, m.c_neg, m.init_pos, m.init_neg)
    assert m2.acc_pos.tolist() == [1.0]


def test_identical_vectors_no_nan_and_finite_gradients():
    # f == c+ == c-: d+ = d- = 0, neither strictly closer -> skipped, nothing NaN
    f = E3.clone().repeat(3, 1).requires_grad_(True)
    for mode in ("sequential", "batched"):
        m = match(f, torch.tensor([0.0, 1.0, 0.0]), torch.ones(3), E3, E3, ONE, ONE, mode=mode)
        assert m.acc_pos.sum() == 0 and m.acc_neg.sum() == 0
        total = sum(t.sum() for t in m) + _core.geodesic(f, m.c_pos).sum()
        (grad,) = torch.autograd.grad(total, f)
        assert torch.isfinite(grad).all()
        assert all(torch.isfinite(t).all() for t in m)


def test_batched_order_independent_sequential_order_dependent():
    g = torch.Generator().manual_seed(0)
    f = torch.randn(64, 6, generator=g)
    y = (torch.arange(64) % 2).float()
    c_pos, c_neg = _unit(torch.randn(6, generator=g)), _unit(torch.randn(6, generator=g))
    perm = torch.randperm(64, generator=g)
    b1 = match(f, y, torch.ones(64), c_pos, c_neg, ONE, ONE, mode="batched")
    b2 = match(f[perm], y[perm], torch.ones(64), c_pos, c_neg, ONE, ONE, mode="batched")
    torch.testing.assert_close(b1.c_pos, b2.c_pos)
    torch.testing.assert_close(b1.acc_pos[perm], b2.acc_pos)
    # centroids stay on the unit sphere in both modes
    s = match(f, y, torch.ones(64), c_pos, c_neg, ONE, ONE, mode="sequential")
    for c in (b1.c_pos, b1.c_neg, s.c_pos, s.c_neg):
        assert math.isclose(float(c.norm()), 1.0, rel_tol=1e-5)


def test_batched_gate_matches_numpy_from_scratch():
    # independent NumPy implementation of the rule: matched iff label-consistent and
    # arccos(<f,c_y>) < arccos(<f,c_other>)
    rng = np.random.default_rng(5)
    f = rng.normal(size=(200, 5))
    f /= np.linalg.norm(f, axis=1, keepdims=True)
    y = rng.integers(0, 2, 200)
    cp, cn = rng.normal(size=5), rng.normal(size=5)
    cp, cn = cp / np.linalg.norm(cp), cn / np.linalg.norm(cn)
    dp, dn = np.arccos(np.clip(f @ cp, -1, 1)), np.arccos(np.clip(f @ cn, -1, 1))
    m = match(torch.tensor(f), torch.tensor(y), torch.ones(200), torch.tensor(cp), torch.tensor(cn),
              torch.tensor(1.0), torch.tensor(1.0))
    assert m.acc_pos.numpy().tolist() == ((y == 0) & (dp < dn)).astype(float).tolist()
    assert m.acc_neg.numpy().tolist() == ((y == 1) & (dn < dp)).astype(float).tolist()


def test_bank_stores_detached_state_only_in_training():
    bank = CentroidBank(2, 3)
    f = torch.tensor([[[1.0, 0.0, 0.0]]], requires_grad=True)  # (S=1 slot, n=1, d=3)
    bank.step(1, f, torch.zeros(1), torch.ones(1))
    assert bank.init_pos.tolist() == [0.0, 1.0] and not bank.c_pos.requires_grad
    bank.eval()
    bank.step(0, f, torch.zeros(1), torch.ones(1))
    assert bank.init_pos.tolist() == [0.0, 1.0]


@pytest.mark.parametrize("mode", ["batched", "sequential"])
def test_bank_slots_equal_one_match_per_slot(mode):
    # the bank vmaps match() over slots (batched) or loops (sequential): same as calling it per slot
    g = torch.Generator().manual_seed(1)
    f, y, v = torch.randn(3, 40, 5, generator=g), (torch.rand(40, generator=g) < 0.4).float(), torch.ones(40)
    bank = CentroidBank(4, 5, mode=mode)
    bank.c_pos[1:] = torch.nn.functional.normalize(torch.randn(3, 5, generator=g), dim=-1)
    bank.c_neg[1:] = torch.nn.functional.normalize(torch.randn(3, 5, generator=g), dim=-1)
    bank.init_pos[1:], bank.init_neg[1:3] = 1.0, 1.0  # slot 3: anomaly centroid uninitialised
    before = [t.clone() for t in (bank.c_pos, bank.c_neg, bank.init_pos, bank.init_neg)]
    out = bank.step(1, f, y, v)
    for s in range(3):
        ref = match(f[s], y, v, *(t[s + 1] for t in before), mode=mode)
        for a, b in zip(out, ref):
            torch.testing.assert_close(a[s], b)
    torch.testing.assert_close(bank.c_pos[1:], out.c_pos)
    assert bank.init_neg[3] == 1.0 and bank.init_pos[0] == 0.0  # slot 0 untouched


@pytest.mark.parametrize("kw", [{"metric": "manhattan"}, {"mode": "parallel"}, {"update": "mean"}])
def test_bad_options(kw):
    with pytest.raises(ValueError, match="must be one of"):
        match(E1[None], torch.zeros(1), torch.ones(1), E1, E2, ONE, ONE, **kw)


def test_bad_alpha():
    with pytest.raises(ValueError, match="alpha"):
        CentroidBank(1, 3, alpha=1.0)


def test_scan_backend_jax_keeps_cuda_tensors_off_the_triton_kernel(monkeypatch):
    """The backend choice for a CUDA tensor (the tensor is a stand-in with CUDA's device type and the
    kernel a stand-in that could run, so no GPU is needed): ``"auto"`` takes the kernel, ``"jax"`` never
    does, and ``scan_device="cpu"`` keeps the scan on the host."""
    from types import SimpleNamespace

    from adsim.model import matching

    gate = SimpleNamespace(MAX_D=1024, interpreted=lambda: False)
    monkeypatch.setattr(matching, "_triton_gate", lambda: gate)
    f = SimpleNamespace(device=SimpleNamespace(type="cuda"), shape=(8, 100, 768))
    assert matching._use_triton(f, "auto", "auto")
    assert not matching._use_triton(f, "jax", "auto")
    assert not matching._use_triton(f, "auto", "cpu")
    assert not matching._use_triton(SimpleNamespace(device=SimpleNamespace(type="cuda"), shape=(1, 4, 2048)),
                                    "auto", "auto")  # wider than the kernel's MAX_D
