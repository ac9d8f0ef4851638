"""BiLoRA (adsim.methods.baselines.bilora): the DCT bases, the per-domain bilinear updates and their measured
near-orthogonality, the freezing of earlier domains, the protection of an earlier domain's scores, and the
protocol method ``bilora`` (curves, DA, paired claims)."""
from pathlib import Path

import pandas as pd
import pytest
import torch

from adsim.cli.main import main
from adsim.experiments import figures
from adsim.methods.baselines import bilora
from adsim.model.head import Head, features_from_bottlenecks, features_from_tokens
from poolsim import core

pytestmark = pytest.mark.filterwarnings("ignore::adsim.model.backbone.RandomWeightsWarning")
WIDTH, EMBED, LAYERS = 32, 16, 2  # the simulator's default token and text sizes (adsim.data.simparams)


def naive_head(seed=0):
    torch.manual_seed(seed)
    text = core.normalize(torch.randn(2, EMBED))
    return Head(WIDTH, EMBED, text, n_layers=LAYERS, vaca=False, matching=False)


def test_dct_basis_is_orthonormal_and_its_first_column_constant():
    for n in (1, 5, 16, 32):
        c = bilora.dct_basis(n).double()
        # C^T C = I is the property the orthogonality argument rests on (module docstring)
        assert torch.allclose(c.T @ c, torch.eye(n, dtype=torch.float64), atol=1e-6)
        assert torch.allclose(c[:, 0], torch.full((n,), n ** -0.5, dtype=torch.float64), atol=1e-7)
    with pytest.raises(ValueError, match="n must be"):
        bilora.dct_basis(0)


def test_attach_freezes_everything_but_the_current_domains_cores():
    head = naive_head()
    bds = bilora.attach(head)
    assert bilora.trainable(head) == []  # no domain yet: nothing trains
    n_slots = 2 * 2 * LAYERS  # seg + det adapters, down + up, per layer
    assert len(bds) == n_slots
    # rank: min(RANK, min(m, n) // 2) = min(8, 16 // 2) = 8 for the (16, 32) and (32, 16) weights
    assert {bd.rank for bd in bds} == {8}
    first = bilora.add_domain(head, 0, seed=3)
    assert len(first) == n_slots and bilora.trainable(head) == first
    for p in first:
        p.data.normal_()
    trained = [p.detach().clone() for p in first]
    second = bilora.add_domain(head, 1, seed=3)
    # every domain trains the same core tensors (a compiled step keeps its graph); the first domain's
    # values moved into the frozen bank (a buffer, not a parameter) and the core restarts at zero
    assert bilora.trainable(head) == second and all(a is b for a, b in zip(first, second))
    assert all(float(p.detach().abs().max()) == 0 for p in second)
    for bd, want in zip(bds, trained):
        assert torch.equal(bd.bank[0], want) and torch.equal(bd.cores[0], want) and bd.cores[1] is bd.core
        assert not any(b is bd.bank for b in head.parameters())
    with pytest.raises(ValueError, match="domain must be the next domain index 2"):
        bilora.add_domain(head, 5, seed=3)
    # a head with VACA or matching is not the naive head BiLoRA adapts
    with pytest.raises(ValueError, match="naive adapter head"):
        bilora.attach(Head(WIDTH, EMBED, core.normalize(torch.randn(2, EMBED)), n_layers=1, vaca=True,
                           matching=False))


def _filled(capacity, n_domains=3, seed=6):
    """A head with ``capacity`` domain slots and ``n_domains`` started, every core from a seeded generator."""
    head = naive_head()
    bilora.attach(head, capacity=capacity)
    gen = torch.Generator().manual_seed(seed)
    for t in range(n_domains):
        for p in bilora.add_domain(head, t, seed=2):
            p.data.copy_(torch.randn(p.shape, generator=gen))
    return head


def test_the_weight_is_the_sum_over_the_started_domains_whatever_the_capacity():
    """Slots not started add exact zeros: the adapted weights are bitwise equal for a head that grew one
    slot per domain (capacity 0) and heads holding 3 or 6 slots, and equal to ``W0 + sum_t C_m[:, P_t] K_t
    C_n[:, Q_t]^T`` computed here in float64 from the bases, supports and cores (module docstring)."""
    heads = {c: _filled(c) for c in (0, 3, 6)}
    assert [bilora.parametrizations(h)[0].capacity for h in heads.values()] == [3, 3, 6]
    for (_, lin0), (_, lin3), (_, lin6), bd in zip(*(bilora.adapted_linears(h) for h in heads.values()),
                                                    bilora.parametrizations(heads[6])):
        assert torch.equal(lin0.weight, lin3.weight) and torch.equal(lin0.weight, lin6.weight)
        c_m, c_n = bilora.dct_basis(bd.basis_rows.shape[0]).double(), bilora.dct_basis(bd.basis_cols.shape[0]).double()
        want = lin6.parametrizations.weight.original.double() + sum(
            c_m[:, p] @ k.double() @ c_n[:, q].T for p, q, k in zip(bd.rows, bd.cols, bd.cores))
        torch.testing.assert_close(lin6.weight.double(), want, rtol=0, atol=1e-5)
        assert len(bd.cores) == 3 and bd.domains == 3


def test_a_per_domain_layout_state_loads_and_scores_as_it_was_written():
    """``data/bilora_per_domain_state.pt`` was written by the bilora.py of commit b755121 (one parameter
    per domain; ``_bilora_legacy.py``) with the scores that code computed: it loads into heads of any
    capacity (a run of 3 or 5 training domains, or one that grows) and scores as written.

    The parameters load bit for bit (no arithmetic). The scores are float32 arithmetic done again here,
    on whatever CPU runs the test: another CPU's kernels (MKL / oneDNN pick code by instruction set and
    sum in another order) change the last bits, so they are compared within float32 rounding --
    PyTorch's float32 tolerance (``rtol`` 1.3e-6, about 11 units of float32 epsilon, ``atol`` 1e-5 for
    scores near zero). On the writing CPU they came out bitwise; with ``ONEDNN_MAX_CPU_ISA=SSE41
    MKL_CBWR=COMPATIBLE`` the first seg output differs by 1 ulp (1.2e-7), and a wrong layout or domain
    order would move the scores by whole units."""
    saved = torch.load(Path(__file__).parent / "data" / "bilora_per_domain_state.pt", weights_only=True)
    assert any(k.endswith("weight.0.cores.2") for k in saved["state"])  # the per-domain layout
    assert bilora.domains_in(saved["state"]) == saved["domains"] == 3
    for capacity in (0, 3, 5):
        head = naive_head(seed=4)
        bilora.attach(head, capacity=capacity)
        for t in range(saved["domains"]):
            bilora.add_domain(head, t, seed=saved["seed"])
        head.load_state_dict(saved["state"])
        with torch.no_grad():
            feats = features_from_tokens(head, saved["x"])
        torch.testing.assert_close(feats.image_logits, saved["image_logits"], rtol=1.3e-6, atol=1e-5)
        torch.testing.assert_close(feats.seg[0], saved["seg0"], rtol=1.3e-6, atol=1e-5)
        assert bilora.domains_in(head.state_dict()) == 3
        assert all(bd.capacity == max(capacity, 3) for bd in bilora.parametrizations(head))
        # the third domain's core is the parameter that would train on; the first two are frozen in the bank
        bd = bilora.parametrizations(head)[0]
        prefix = "seg_adapters.0.down.parametrizations.weight.0."
        assert torch.equal(bd.core, saved["state"][prefix + "cores.2"]) and bd.core.requires_grad
        assert torch.equal(bd.bank[1], saved["state"][prefix + "cores.1"])


def _logits(head, x):
    """``features_from_tokens(head, x).image_logits`` without the NaN check (a host read: a graph break)."""
    mids = [[getattr(head, f"{kind}_adapters")[k](x[:, k])[0] for k in range(head.n_layers)] for kind in ("seg", "det")]
    return features_from_bottlenecks(head, *mids, check=False).image_logits


# poolsim.core.namespace -> array_api_compat's lru_cache'd lookup: dynamo warns that it traces through it
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")
def test_starting_a_domain_keeps_the_compiled_graph():
    """The head's forward compiled once (dynamo, ``CompileCounter`` backend: counts the graphs it is
    given) serves three domains: starting a domain changes buffer values, not what dynamo guards on, so
    no recompile; the compiled forward gives the eager one's scores in every domain."""
    from torch._dynamo.testing import CompileCounter

    head = naive_head()
    bilora.attach(head, capacity=3)
    counter = CompileCounter()
    torch._dynamo.reset()
    fn = torch.compile(lambda x: _logits(head, x), backend=counter, dynamic=False)
    x = torch.randn(3, LAYERS, 4, WIDTH)
    gen = torch.Generator().manual_seed(3)
    for t in range(3):
        for p in bilora.add_domain(head, t, seed=1):
            p.data.copy_(torch.randn(p.shape, generator=gen))
        fn(x).sum().backward()
        torch.testing.assert_close(fn(x), features_from_tokens(head, x).image_logits, rtol=1e-6, atol=1e-6)
        assert counter.frame_count == 1, f"domain {t}: {counter.frame_count} graphs"
    torch._dynamo.reset()


def test_a_new_domain_starts_from_the_previous_function():
    head = naive_head()
    bilora.attach(head)
    bilora.add_domain(head, 0, seed=1)
    for p in bilora.trainable(head):
        p.data.normal_()
    x = torch.randn(3, LAYERS, 4, WIDTH)
    before = features_from_tokens(head, x).image_logits
    bilora.add_domain(head, 1, seed=1)  # zero cores: the same weights, so the same scores
    assert torch.equal(features_from_tokens(head, x).image_logits, before)


def test_gradient_clipping_sees_only_the_current_domains_gradient():
    # train_epoch clips with clip_grad_norm_(head.parameters()): a frozen core's last .grad would inflate that
    # norm and shrink the new domain's step, so adding a domain drops it
    head = naive_head()
    bilora.attach(head)
    first = bilora.add_domain(head, 0, seed=2)
    x = torch.randn(3, LAYERS, 4, WIDTH)
    features_from_tokens(head, x).image_logits.sum().backward()
    assert any(p.grad is not None for p in first)  # the det adapters' cores (the image logits' path)
    second = bilora.add_domain(head, 1, seed=2)
    assert all(p.grad is None for p in first)
    features_from_tokens(head, x).image_logits.square().sum().backward()
    # the clipping norm over the whole head equals the norm of the current cores' gradients alone
    expected = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in second
                                                     if p.grad is not None]))
    total = torch.nn.utils.clip_grad_norm_(head.parameters(), float("inf"))
    torch.testing.assert_close(total, expected)


def test_updates_of_different_domains_are_near_orthogonal_as_measured():
    head = naive_head()
    bilora.attach(head)
    n_domains = 5
    gen = torch.Generator().manual_seed(0)
    for t in range(n_domains):
        for p in bilora.add_domain(head, t, seed=7):
            p.data.copy_(torch.randn(p.shape, generator=gen))
    cos = bilora.update_cosines(head)
    assert cos.shape == (2 * 2 * LAYERS, n_domains, n_domains)
    assert torch.allclose(torch.diagonal(cos, dim1=1, dim2=2), torch.ones(1, dtype=torch.float64), atol=1e-6)
    exact_zero = 0
    for slot, bd in enumerate(bilora.parametrizations(head)):
        for s in range(n_domains):
            for t in range(s + 1, n_domains):
                bound = bilora.overlap_bound(bd, s, t)
                # Cauchy-Schwarz on the shared frequency pairs (module docstring): |cos| <= bound
                assert abs(float(cos[slot, s, t])) <= bound + 1e-6
                if bound == 0.0:
                    exact_zero += 1
                    assert abs(float(cos[slot, s, t])) < 1e-6
    # independent draws of 8 of 16 rows and 8 of 32 columns: P(no shared row or no shared column) is at
    # least P(no shared column) = C(24, 8) / C(32, 8) = 0.071 per pair; over 8 slots x 10 pairs some pairs
    # share nothing (seed 7: counted, not assumed -- the assertion only needs one)
    assert exact_zero >= 1
    # on average the updates are far from aligned: the expected squared cosine of two random cores on
    # k shared of r^2 = 64 pairs is about k / 64^2 per pair, and k averages (8/16)(8/32) 64 = 8
    off = cos[:, *torch.triu_indices(n_domains, n_domains, 1)].abs()
    assert float(off.mean()) < 0.2


def test_an_earlier_domain_is_protected_when_its_tokens_avoid_the_new_domains_frequencies():
    """Deterministic construction of BiLoRA's protection claim: domain A's tokens lie in the span of the
    DCT column frequencies that domain B's updates do not use, so B's updates ``C_m[:, P] K C_n[:, Q]^T``
    map them to 0 and A's scores are exactly unchanged by training on B; plain sequential fine-tuning of
    the same head on the same B batches changes them."""
    heads = {"bilora": naive_head(seed=5), "plain": naive_head(seed=5)}
    bilora.attach(heads["bilora"])
    bilora.add_domain(heads["bilora"], 0, seed=2)
    cores_b = bilora.add_domain(heads["bilora"], 1, seed=2)
    used = set()
    for bd, (name, _) in zip(bilora.parametrizations(heads["bilora"]), bilora.adapted_linears(heads["bilora"])):
        if name.endswith("down"):  # the layers that read the tokens (the bottleneck is what is scored)
            used |= set(bd.cols[1].tolist())
    free = [k for k in range(WIDTH) if k not in used]
    assert len(free) >= WIDTH - 2 * LAYERS * 8  # at most 2 L down layers x 8 columns are used
    basis = bilora.dct_basis(WIDTH)[:, free]
    gen = torch.Generator().manual_seed(1)
    x_a = torch.randn(16, LAYERS, 9, len(free), generator=gen) @ basis.T  # (B, L, N, W) in the free span
    x_b = torch.randn(16, LAYERS, 9, WIDTH, generator=gen)
    opts = {"bilora": torch.optim.Adam(cores_b, lr=1e-2),
            "plain": torch.optim.Adam(heads["plain"].parameters(), lr=1e-2)}
    drift = {}
    for name, head in heads.items():
        before = features_from_tokens(head, x_a).image_logits.detach()
        for _ in range(5):
            loss = -features_from_tokens(head, x_b).image_logits.mean()  # any training signal on B
            opts[name].zero_grad()
            loss.backward()
            opts[name].step()
        drift[name] = float((features_from_tokens(head, x_a).image_logits.detach() - before).abs().max())
    assert any(float(c.detach().abs().max()) > 0 for c in cores_b)  # B's update did train
    assert drift["bilora"] < 1e-4  # float32 round-off only
    assert drift["plain"] > 1e-2


@pytest.mark.slow
def test_protocol_runs_bilora_with_curves_da_and_paired_claims(tmp_path):
    out = tmp_path / "run"
    argv = ["protocol", "--simulate", "--quick", "--targets", "Chest", "--methods", "naive", "bilora",
            "match-geodesic-vaca", "--orders", "hardest", "--out", str(out), "--no-progress",
            "--sim", "n_train=6", "n_test=8", "n_layers=2", "--epochs", "1", "--batch-size", "16"]
    assert main(argv) == 0
    proto, da = pd.read_csv(out / "protocol.csv"), pd.read_csv(out / "da.csv")
    b = proto[proto["method"] == "bilora"].sort_values("step")
    assert list(b["step"]) == [1, 2, 3, 4, 5] and b["auc"].between(0, 100).all()  # AUC after each step
    assert len(da[da["method"] == "bilora"]) == 1  # one curve: Chest AC, hardest, 1 seed
    cell = pd.read_json(next((out / "cells").glob("*bilora*")), typ="series")
    measured = cell["bilora_update_cosine"]
    assert 0.0 <= measured["mean_abs"] <= measured["max_abs"] <= 1.0 + 1e-9
    claims = {c["claim"]: c for c in figures.claims(proto, da)}
    for text in ("Paper: matching + VACA has higher DA than BiLoRA (continual learning, one domain per step).",
                 "Paper: BiLoRA has higher DA than naive pooling (MVFA)."):
        # one pair (1 seed x 1 target x 1 task) is below the paired rule's 30 pairs: inconclusive
        assert claims[text]["verdict"] == "inconclusive" and claims[text]["n"] == 1
