"""Backbone creation through open_clip (tiny config), VACA, the interleaved forward."""
import math

import pytest
import torch

from adsim.backbone import RandomWeightsWarning, adapter_layers, build_backbone, fingerprint, frozen_tokens
from adsim.head import VACA, Head, anomaly_maps, features, image_scores, prompt_ensemble, text_embeddings

pytestmark = pytest.mark.filterwarnings("ignore::adsim.backbone.RandomWeightsWarning")


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
    maps, scores = anomaly_maps(f, 8, 64), image_scores(f)
    assert maps.shape == (2, 64, 64) and scores.shape == (2,)
    assert bool(((maps >= 0) & (maps <= 1)).all())


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
