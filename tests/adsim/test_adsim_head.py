"""Backbone creation through open_clip (tiny config), VACA, the interleaved forward."""
import math
import warnings

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from adsim.config.prompts import prompt_ensemble
from adsim.model.backbone import (
    RandomWeightsWarning,
    adapter_layers,
    build_backbone,
    describe_file,
    fingerprint,
    frozen_tokens,
    read_checkpoint,
)
from adsim.model.head import (
    VACA,
    Features,
    Head,
    anomaly_maps,
    features,
    features_from_bottlenecks,
    image_scores,
    text_embeddings,
    vaca_stacked,
)

pytestmark = pytest.mark.filterwarnings("ignore::adsim.model.backbone.RandomWeightsWarning")


def test_adapter_layers_scale_with_depth():
    assert adapter_layers(24) == (5, 11, 17, 23)  # blocks 6, 12, 18, 24 of ViT-L (reference set-up)
    assert adapter_layers(12) == (2, 5, 8, 11)
    assert adapter_layers(4) == (0, 1, 2, 3)
    with pytest.raises(ValueError, match="depth"):
        adapter_layers(3)


def test_tiny_spec_and_random_weight_warning():
    with pytest.warns(RandomWeightsWarning, match="meaningless"):
        bb = build_backbone("tiny", seed=0)
    s = bb.spec
    assert (s.image_size, s.patch_size, s.grid, s.width, s.embed_dim, s.layers) == (64, 8, 8, 64, 32, 4)
    assert not s.pretrained
    # QuickGELU explicit: open_clip builds the MLP activation from the flag
    assert type(bb.model.visual.transformer.resblocks[0].mlp.gelu).__name__ == "QuickGELU"
    assert not any(p.requires_grad for p in bb.model.parameters())
    # same seed -> same random weights (evaluation rebuilds the training backbone)
    assert fingerprint(build_backbone("tiny", seed=0).model) == fingerprint(bb.model)


@pytest.mark.parametrize("kw, msg", [({"name": "ViT-H-99"}, "backbone must be one of"),
                                     ({"name": "tiny", "image_size": 60}, "multiple of the patch size"),
                                     ({"name": "tiny", "checkpoint": "/nonexistent/w.pt"}, "not found")])
def test_backbone_errors(kw, msg):
    name = kw.pop("name")
    with pytest.raises(ValueError, match=msg):
        build_backbone(name, **kw)


def test_local_checkpoint_roundtrip_resize_and_wrong_architecture(tmp_path, tiny):
    good = tmp_path / "tiny.pt"
    torch.save(tiny.model.state_dict(), good)
    loaded = build_backbone("tiny", checkpoint=str(good), seed=123)  # other seed: weights come from the file
    assert loaded.spec.pretrained and fingerprint(loaded.model) == fingerprint(tiny.model)
    # a larger image size: open_clip resizes the 8x8 position-embedding grid to 12x12
    big = build_backbone("tiny", checkpoint=str(good), image_size=96)
    assert big.model.visual.positional_embedding.shape == (12 * 12 + 1, 64)
    bad = tmp_path / "bad.pt"
    sd = tiny.model.state_dict()
    sd.pop("visual.conv1.weight")
    torch.save(sd, bad)
    with pytest.raises(ValueError, match="does not fit backbone"):
        build_backbone("tiny", checkpoint=str(bad))


def test_vaca_shapes_gradients_and_running_delta():
    torch.manual_seed(0)
    vaca = VACA(16, gamma=2.0)
    p = torch.nn.functional.normalize(torch.randn(3, 5, 16), dim=-1).requires_grad_(True)
    text = torch.nn.functional.normalize(torch.randn(2, 16), dim=-1)
    out, var, w = vaca(p, text)
    assert out.shape == (3, 5, 16) and w.shape == (16,) and var.shape == ()
    torch.testing.assert_close(out.norm(dim=-1), torch.ones(3, 5))
    assert bool((w >= 1.0).all())  # w = 1 + gamma * softplus(.) >= 1
    # Delta (Algorithm 1): |mean_{b,n} P (t_normal - t_anomaly)| -- recomputed here independently
    delta = (p.detach().mean(dim=(0, 1)) * (text[0] - text[1])).abs()
    torch.testing.assert_close(vaca.delta_running, delta)
    torch.testing.assert_close(var, torch.var(delta * w, correction=0))
    # L_var reaches the MLP only (Delta is a detached statistic)
    grads = torch.autograd.grad(var, [p, *vaca.mlp.parameters()], allow_unused=True)
    assert grads[0] is None and all(g is not None and torch.isfinite(g).all() for g in grads[1:])
    # the reweighted features carry gradient to the input and to the MLP
    g_in = torch.autograd.grad(out.sum() * 0 + (out[..., 0]).sum(), p)[0]
    assert torch.isfinite(g_in).all() and g_in.abs().sum() > 0
    # evaluation uses the running Delta: a test image's output does not depend on its batch mates
    vaca.eval()
    one, _, _ = vaca(p[:1], text)
    allb, _, _ = vaca(p, text)
    torch.testing.assert_close(one, allb[:1])


def _head(tiny, **kw):
    return Head(tiny.spec.width, tiny.spec.embed_dim, text_embeddings(tiny, prompt_ensemble()), **kw)


def test_prompts_and_text_embeddings(tiny):
    prompts = prompt_ensemble()
    assert len(prompts["normal"]) == len(prompts["anomaly"]) == 30
    assert not set(prompts["normal"]) & set(prompts["anomaly"])
    t = text_embeddings(tiny, prompts)
    assert t.shape == (2, 32)
    torch.testing.assert_close(t.norm(dim=-1), torch.ones(2))


@pytest.mark.parametrize("vaca", [True, False])
def test_features_shapes_and_adapter_gradients(tiny, vaca):
    torch.manual_seed(0)
    head = _head(tiny, vaca=vaca)
    x = torch.randn(2, 3, 64, 64)
    f = features(tiny, head, x)
    assert len(f.seg) == len(f.det) == 4
    assert f.seg[0].shape == (2, 64, 32) and f.seg_logits[0].shape == (2, 64) and f.image_logits.shape == (4, 2)
    torch.testing.assert_close(f.seg[2].norm(dim=-1), torch.ones(2, 64))
    loss = f.image_logits.sum() + torch.stack(f.seg_logits).sum() + f.var
    loss.backward()
    # every adapter (also the first, whose effect flows through the later frozen blocks) gets gradient
    for a in (*head.seg_adapters, *head.det_adapters):
        assert a.down.weight.grad is not None and a.down.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in tiny.model.parameters())
    maps, scores = anomaly_maps(f, 8, 64, "authors_prob_mean"), image_scores(f)
    assert maps.shape == (2, 64, 64) and scores.shape == (2,)
    assert bool(((maps >= 0) & (maps <= 1)).all())  # probabilities
    torch.testing.assert_close(scores, f.image_logits.mean(0))  # default: layer mean of max logits


def test_frozen_tokens_match_open_clip_blocks(tiny):
    x = torch.randn(1, 3, 64, 64)
    toks = frozen_tokens(tiny, x)
    assert len(toks) == 4 and toks[0].shape == (1, 64, 64)


def test_features_reject_nan_and_wrong_size(tiny):
    head = _head(tiny)
    x = torch.randn(1, 3, 64, 64)
    x[0, 0, 0, 0] = math.nan
    with pytest.raises(ValueError, match="NaN"):
        features(tiny, head, x)
    with pytest.raises(ValueError, match="images must have shape"):
        features(tiny, head, torch.randn(1, 3, 72, 72))


def _features_from_logits(det_logits, seg_logits=None):
    """A ``Features`` holding only given logits ``(L, B, N)`` (what the scoring functions read)."""
    seg_logits = det_logits if seg_logits is None else seg_logits
    return Features(seg=[], det=[], seg_logits=list(seg_logits), det_logits=list(det_logits),
                    image_logits=det_logits.amax(dim=2), var=torch.zeros(()), det_raw=[])


def test_scores_rank_when_probabilities_saturate():
    # 10 normal and 10 anomalous images, 4 layers x 16 patches, every patch logit >= 20 (sigmoid is
    # exactly 1.0 in float32 there). By construction every anomalous image has larger max and mean
    # logits than every normal one, so the true ranking gives AUC = 1 (closed form); the authors'
    # patch mean of probabilities ties every image (AUC = 0.5).
    g = torch.Generator().manual_seed(0)
    base = torch.cat([torch.arange(10.0), 20.0 + torch.arange(10.0)])  # normal 0..9, anomalous 20..29
    z = 20.0 + base[None, :, None] + torch.rand(4, 20, 16, generator=g)  # (L, B, N), all in [20, 50)
    labels = np.r_[np.zeros(10), np.ones(10)]
    feats = _features_from_logits(z)
    assert bool((torch.sigmoid(z) == 1.0).all())  # saturation in float32: the premise of the test
    for score in ("logit_max", "logit_mean"):
        assert roc_auc_score(labels, image_scores(feats, score).numpy()) == 1.0
    authors = image_scores(feats, "authors_prob_mean").numpy()
    assert np.all(authors == 1.0) and roc_auc_score(labels, authors) == 0.5
    # the pixel maps rank too: anomalous patches (logits + 20) above normal ones
    mask = torch.zeros(4, 2, 16)
    mask[:, 1] = 20.0
    zmap = 20.0 + mask + torch.rand(4, 2, 16, generator=g)
    maps = anomaly_maps(_features_from_logits(zmap), 4, 8).numpy()
    gt = np.r_[np.zeros(64), np.ones(64)]
    assert roc_auc_score(gt, maps.ravel()) == 1.0
    assert roc_auc_score(gt, anomaly_maps(_features_from_logits(zmap), 4, 8, "authors_prob_mean").numpy().ravel()) == 0.5


def test_score_definitions_by_hand():
    # 2 layers, 1 image, 3 patches: layer mean of max / mean / mean of sigmoids, computed by hand
    z = torch.tensor([[[0.0, 1.0, 2.0]], [[-2.0, 0.0, 4.0]]])
    feats = _features_from_logits(z)
    torch.testing.assert_close(image_scores(feats, "logit_max"), torch.tensor([3.0]))
    torch.testing.assert_close(image_scores(feats, "logit_mean"), torch.tensor([(1.0 + 2.0 / 3.0) / 2]))
    expected = (torch.sigmoid(z[0]).mean() + torch.sigmoid(z[1]).mean()) / 2
    torch.testing.assert_close(image_scores(feats, "authors_prob_mean"), expected[None])
    assert image_scores(feats).item() == 3.0  # default: logit_max


def test_unknown_score():
    feats = _features_from_logits(torch.zeros(1, 1, 4))
    with pytest.raises(ValueError, match="score must be one of"):
        image_scores(feats, "prob_max")
    with pytest.raises(ValueError, match="score must be one of"):
        anomaly_maps(feats, 2, 4, "prob_max")


class _Root(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def _openai_archive(state: dict, path):
    """A TorchScript archive whose ``state_dict()`` is ``state``: the module tree follows the dotted
    keys, as in OpenAI's released ``ViT-*.pt`` files (their keys are open_clip's CLIP keys)."""
    root = _Root()
    for key, value in state.items():
        *parents, leaf = key.split(".")
        mod = root
        for name in parents:
            if not hasattr(mod, name):
                mod.add_module(name, torch.nn.Module())
            mod = getattr(mod, name)
        mod.register_buffer(leaf, value.clone())
    with warnings.catch_warnings():  # TorchScript is deprecated in torch; OpenAI's files still use it
        warnings.simplefilter("ignore", FutureWarning)
        torch.jit.save(torch.jit.script(root), str(path))
    return path


def test_openai_torchscript_checkpoint_loads(tmp_path, tiny):
    # OpenAI ships fp16 weights plus three non-weight entries; build such an archive from the tiny model
    ref = tiny.model.state_dict()
    sd = {k: v.half() if v.is_floating_point() else v for k, v in ref.items()}
    sd.update(input_resolution=torch.tensor(64), context_length=torch.tensor(77), vocab_size=torch.tensor(49408))
    path = _openai_archive(sd, tmp_path / "ViT-tiny-openai.pt")
    assert describe_file(path).startswith("a TorchScript archive")
    state = read_checkpoint(path)
    assert set(state) == set(ref)  # the three extras dropped, every weight present
    loaded = build_backbone("tiny", checkpoint=str(path), seed=123)
    assert loaded.spec.pretrained
    for k, v in loaded.model.state_dict().items():  # the file's fp16 values, in float32
        torch.testing.assert_close(v, ref[k].half().to(v.dtype), rtol=0, atol=0)
    big = build_backbone("tiny", checkpoint=str(path), image_size=96)  # position embeddings resized
    assert big.model.visual.positional_embedding.shape == (12 * 12 + 1, 64)


def test_wrapped_and_prefixed_state_dict_loads(tmp_path, tiny):
    path = tmp_path / "ddp.pt"
    torch.save({"epoch": 3, "state_dict": {f"module.{k}": v for k, v in tiny.model.state_dict().items()}}, path)
    assert fingerprint(build_backbone("tiny", checkpoint=str(path), seed=7).model) == fingerprint(tiny.model)


def _garbage(tmp_path):
    import zipfile

    files = {"notes.txt": b"these are not weights\n", "random.bin": bytes(range(200, 256)) * 10}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    with zipfile.ZipFile(tmp_path / "other.zip", "w") as z:
        z.writestr("readme.md", "hello")
    return files


@pytest.mark.parametrize("name, what", [("notes.txt", "a text file"), ("random.bin", "unrecognised binary"),
                                        ("other.zip", "zip archive that is not a PyTorch file"),
                                        ("truncated.pt", "damaged zip"), ("empty.pt", "an empty file"),
                                        ("no_tensors.pt", "not a state dict")])
def test_unreadable_checkpoints_say_what_the_file_is(tmp_path, tiny, name, what):
    _garbage(tmp_path)
    good = tmp_path / "good.pt"
    torch.save(tiny.model.state_dict(), good)
    (tmp_path / "truncated.pt").write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    (tmp_path / "empty.pt").write_bytes(b"")
    torch.save({"epoch": 3, "note": "no weights"}, tmp_path / "no_tensors.pt")
    path = tmp_path / name
    with pytest.raises(ValueError, match="expected an open_clip") as info:
        build_backbone("tiny", checkpoint=str(path))
    msg = str(info.value)
    assert str(path) in msg and what in msg and "TorchScript" in msg


def test_score_batches_and_run_score_pass_the_scoring_through():
    from types import SimpleNamespace

    from adsim.inference.scoring import run_score, score_batches

    z = torch.tensor([[[30.0, 20.0, 20.0, 20.0]], [[40.0, 20.0, 20.0, 20.0]]])  # (L=2, B=1, N=4): 2 x 2 grid
    batch = {"image": torch.zeros(1, 3, 4, 4), "label": torch.ones(1), "mask": torch.zeros(1, 4, 4)}
    run = lambda scoring: score_batches(torch.nn.Identity(), [batch], lambda x: _features_from_logits(z),  # noqa: E731
                                        grid=2, size=4, device=torch.device("cpu"), maps=True, scoring=scoring)
    assert run("logit_max")["scores"].tolist() == [35.0]  # mean over layers of 30 and 40
    out = run("authors_prob_mean")
    assert out["scores"].tolist() == [1.0] and out["maps"].max() <= 1.0
    assert run_score(SimpleNamespace()) == "logit_max"  # a config without a scoring field: the default
    assert run_score(SimpleNamespace(scoring="authors_prob_mean")) == "authors_prob_mean"  # a recipe's choice
    assert run_score(SimpleNamespace(scoring="authors_prob_mean"), "logit_mean") == "logit_mean"  # override
    with pytest.raises(ValueError, match="score must be one of"):
        run("probability")


def _vaca_modules(n, dim, seed, **kw):
    torch.manual_seed(seed)  # every module its own random MLP
    return torch.nn.ModuleList(VACA(dim, **kw) for _ in range(n))


def test_vaca_stacked_matches_each_module_over_training_steps_and_in_eval():
    # Oracle: each module's own VACA.forward on its slot. Tolerances: float32 rounding only (the batched
    # matmuls and reductions sum in another order), i.e. assert_close's float32 defaults (rtol 1.3e-6,
    # atol 1e-5).
    stacked, oracle = _vaca_modules(6, 16, 0, gamma=2.0), _vaca_modules(6, 16, 0, gamma=2.0)
    g = torch.Generator().manual_seed(1)
    text = torch.nn.functional.normalize(torch.randn(2, 16, generator=g), dim=-1)
    for step in range(4):
        if step == 3:  # evaluation: the running Delta of the three training steps
            stacked.eval()
            oracle.eval()
        raw = (torch.randn(6, 3, 5, 16, generator=g) + 0.5).requires_grad_(True)
        raw_o = raw.detach().clone().requires_grad_(True)
        out, var, w = vaca_stacked(list(stacked), torch.nn.functional.normalize(raw, dim=-1), text, raw=raw)
        outs = [m(torch.nn.functional.normalize(raw_o[s], dim=-1), text, raw=raw_o[s]) for s, m in enumerate(oracle)]
        assert out.shape == (6, 3, 5, 16) and var.shape == (6,) and w.shape == (6, 16)
        torch.testing.assert_close(out, torch.stack([o[0] for o in outs]))
        torch.testing.assert_close(var, torch.stack([o[1] for o in outs]))
        torch.testing.assert_close(w, torch.stack([o[2] for o in outs]))
        # a loss reaching every output: the same gradients to the tokens and to every module's MLP
        weights = torch.randn(6, 3, 5, 16, generator=g)
        ((out * weights).sum() + var.sum()).backward()
        (sum((o[0] * weights[s]).sum() + o[1] for s, o in enumerate(outs))).backward()
        torch.testing.assert_close(raw.grad, raw_o.grad)
        for (name, p), q in zip(stacked.named_parameters(), oracle.parameters()):
            assert p.grad is not None, name
            torch.testing.assert_close(p.grad, q.grad, msg=name)
        stacked.zero_grad()
        oracle.zero_grad()
        for a, b in zip(stacked, oracle):  # running statistics and counters written back per module
            torch.testing.assert_close(a.delta_running, b.delta_running)
            assert int(a.n_tracked) == int(b.n_tracked) == min(step + 1, 3)
    assert not torch.equal(stacked[0].delta_running, stacked[1].delta_running)  # per-slot statistics


def test_vaca_stacked_runs_modules_of_different_configuration_one_by_one():
    mods = _vaca_modules(3, 16, 0)
    mods[1].gamma = 3.0  # not stackable: each module's own forward (exactly its values)
    oracle = _vaca_modules(3, 16, 0)
    oracle[1].gamma = 3.0
    p = torch.nn.functional.normalize(torch.randn(3, 2, 4, 16), dim=-1)
    text = torch.nn.functional.normalize(torch.randn(2, 16), dim=-1)
    out, var, w = vaca_stacked(list(mods), p, text)
    for s, m in enumerate(oracle):
        o, v, ww = m(p[s], text)
        assert torch.equal(out[s], o) and torch.equal(var[s], v) and torch.equal(w[s], ww)
        assert torch.equal(mods[s].delta_running, m.delta_running)


def _per_layer_features(head, seg_mid, det_mid):
    """The head's scoring written out layer by layer with each VACA module's own forward (the oracle of
    the stacked ``features_from_bottlenecks``): ``(seg, det, seg_logits, det_logits, image_logits, var, det_raw)``."""
    direction = head.text[1] - head.text[0]
    out = [[], [], [], [], None, torch.zeros(()), []]
    for k in range(head.n_layers):
        xs, xd = seg_mid[k].float(), det_mid[k].float()
        ps, pd = torch.nn.functional.normalize(xs, dim=-1), torch.nn.functional.normalize(xd, dim=-1)
        out[6].append(pd)
        if head.vaca is not None:
            ps, v_s, _ = head.vaca[k](ps, head.text, raw=xs)
            pd, v_d, _ = head.vaca[head.n_layers + k](pd, head.text, raw=xd)
            out[5] = out[5] + v_s + v_d
        out[0].append(ps)
        out[1].append(pd)
        out[2].append(100.0 * ps @ direction)
        out[3].append(100.0 * pd @ direction)
    out[4] = torch.stack([z.amax(dim=1) for z in out[3]])
    return out


@pytest.mark.parametrize("vaca", [True, False])
def test_features_from_bottlenecks_match_the_per_layer_oracle(vaca):
    # Oracle: the per-layer loop with each VACA module's own forward. Tolerances: float32 rounding
    # (assert_close's float32 defaults, rtol 1.3e-6, atol 1e-5); the logits are 100 <f, t>, hence atol 1e-4
    text = torch.nn.functional.normalize(torch.randn(2, 32, generator=torch.Generator().manual_seed(0)), dim=-1)
    torch.manual_seed(0)
    head = Head(64, 32, text, vaca=vaca).train()
    torch.manual_seed(0)
    oracle = Head(64, 32, text, vaca=vaca).train()
    g = torch.Generator().manual_seed(2)
    for step in range(3):
        if step == 2:
            head.eval()
            oracle.eval()
        mids = [torch.randn(2, 9, 32, generator=g).requires_grad_(True) for _ in range(8)]
        mids_o = [t.detach().clone().requires_grad_(True) for t in mids]
        f = features_from_bottlenecks(head, mids[:4], mids[4:])
        ref = _per_layer_features(oracle, mids_o[:4], mids_o[4:])
        for name, got, want in zip(Features._fields, f, ref):
            tol = {"rtol": 1.3e-6, "atol": 1e-4} if "logits" in name else {}
            torch.testing.assert_close(torch.stack(list(got)) if isinstance(got, list) else got,
                                       torch.stack(want) if isinstance(want, list) else want, msg=name, **tol)
        weights = torch.randn(4, 2, 9, 32, generator=g)
        loss = (torch.stack(f.seg) * weights).sum() + torch.stack(f.seg_logits).sum() + f.image_logits.sum() + f.var
        loss_o = ((torch.stack(ref[0]) * weights).sum() + torch.stack(ref[2]).sum() + ref[4].sum() + ref[5])
        loss.backward()
        loss_o.backward()
        for a, b in zip(mids, mids_o):
            torch.testing.assert_close(a.grad, b.grad)
        for (name, p), q in zip(head.named_parameters(), oracle.parameters()):
            if q.grad is not None:
                torch.testing.assert_close(p.grad, q.grad, msg=name)
        head.zero_grad()
        oracle.zero_grad()
    for (name, a), b in zip(head.state_dict().items(), oracle.state_dict().values()):
        torch.testing.assert_close(a, b, msg=name)
