"""APRIL-GAN (adsim.methods.baselines.aprilgan) on the tiny open_clip backbone (random weights) and the toy BMAD
data: what makes it APRIL-GAN -- one linear map per stage from the RAW patch tokens into the text space, the
frozen CLIP image score, its Focal + anomalous-channel Dice loss on align_corners=True maps -- each checked
against a computation written the way their code (ByChelsea/VAND-APRIL-GAN: model.py, train.py, test.py,
loss.py) writes it. The output contract and the run folder are covered by test_adsim_baselines.py."""
import json
import math

import pytest
import torch

from adsim.config import recipes
from adsim.config.prompts import prompt_texts
from adsim.config.run import config_from_recipe
from adsim.data import bmad
from adsim.methods.baselines import aprilgan
from adsim.model.head import text_embeddings

pytestmark = pytest.mark.filterwarnings("ignore::adsim.model.backbone.RandomWeightsWarning")
F = torch.nn.functional


def _maps(tiny, seed=0):
    cfg = config_from_recipe(recipes.get("aprilgan"), data="d", out="o", target="Brain", seed=seed)
    return cfg, aprilgan.build_maps(cfg, tiny)


def _images(n=3, seed=3):
    return torch.rand(n, 3, 64, 64, generator=torch.Generator().manual_seed(seed))


def test_recipe_is_their_training_set_up():
    # train.sh (ViT-L-14-336, --features_list 6 12 18 24, --batch_size 8, --epoch 15 for the VisA-trained model),
    # train.py (lr default 0.001, Adam only on the LinearLayer, Focal + Dice, no image loss), test.py (no smoothing)
    r = recipes.get("aprilgan")
    assert (r.method, r.batch_size, r.epochs, r.lr) == ("aprilgan", 8, 15, 1e-3)
    assert (r.beta_focal, r.beta_dice, r.beta_bce, r.smooth_sigma) == (1.0, 1.0, 0.0, 0.0)
    assert (r.prompts, r.clip_norm, r.vaca) == ("mvfa_object", True, False)
    # their prompt_ensemble.py: 7 normal and 5 abnormal state phrases x 35 templates -- the mvfa_object set
    texts = prompt_texts("mvfa_object")
    assert (len(texts["normal"]), len(texts["anomaly"])) == (7 * 35, 5 * 35)
    assert "a bad photo of a broken object." in texts["anomaly"]


def test_per_stage_linear_maps_of_the_raw_patch_tokens(tiny):
    # their LinearLayer: fc[i](tokens[i][:, 1:, :]) on the block outputs of open_clip's transformer as they are
    # (no ln_post, no proj); reference tokens from open_clip's own forward_intermediates (no normalisation)
    _, maps = _maps(tiny)
    spec = tiny.spec
    assert [tuple(fc.weight.shape) for fc in maps.fc] == [(spec.embed_dim, spec.width)] * 4
    assert all(fc.bias is not None for fc in maps.fc)
    x = _images()
    with torch.no_grad():
        ref = tiny.model.visual.forward_intermediates(x, indices=list(spec.adapter_layers), intermediates_only=True,
                                                      output_fmt="NLC")["image_intermediates"]
        want = [F.normalize(F.linear(t, fc.weight, fc.bias), dim=-1) for fc, t in zip(maps.fc, ref)]
        img, tokens = aprilgan.visual_tokens(tiny, x)
        got = aprilgan.stage_features(maps, tokens)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
        # ln_post before the maps (what AnomalyCLIP does) gives other features: the raw tokens are used
        with_ln = [F.normalize(fc(tiny.model.visual.ln_post(t)), dim=-1) for fc, t in zip(maps.fc, ref)]
        assert all(not torch.allclose(g, w, atol=1e-3) for g, w in zip(got, with_ln))
        # each stage has its own map: changing fc[2] changes stage 2 only
        maps.fc[2].weight.add_(0.5)
        moved = aprilgan.stage_features(maps, tokens)
    assert [torch.equal(a, b) for a, b in zip(got, moved)] == [True, True, False, True]
    # the image embedding is open_clip's own (frozen CLIP, encode_image)
    torch.testing.assert_close(img, F.normalize(tiny.model.encode_image(x).float(), dim=-1), rtol=1e-5, atol=1e-6)


def test_scores_and_maps_are_their_test_py(tiny):
    # test.py, zero-shot mode: image = softmax(100 f_img @ T)[1] of the frozen image embedding; pixel = layer sum
    # of softmax(interpolate(100 p @ T, align_corners=True))[1]; written here as there (two channels, softmax)
    _, maps = _maps(tiny)
    with torch.no_grad():
        for fc in maps.fc:  # trained-looking maps: not the initialisation
            fc.weight.normal_(0, 0.2, generator=torch.Generator().manual_seed(1))
    x = _images()
    method = aprilgan.APRILGAN(tiny, maps, map_score="prob_sum").eval()
    with torch.no_grad():
        out = method(x)
        img, tokens = aprilgan.visual_tokens(tiny, x)
        text = maps.text.T  # (E, 2)
        probs_img = (100.0 * img @ text).softmax(dim=-1)[:, 1]
        want_map = 0
        for layer, (fc, t) in enumerate(zip(maps.fc, tokens)):
            p = fc(t)
            p = p / p.norm(dim=-1, keepdim=True)
            am = 100.0 * p @ text
            b, n, c = am.shape
            h = int(math.isqrt(n))
            am = F.interpolate(am.permute(0, 2, 1).reshape(b, 2, h, h), size=64, mode="bilinear", align_corners=True)
            want_map = want_map + torch.softmax(am, dim=1)[:, 1]
    torch.testing.assert_close(torch.sigmoid(out.scores), probs_img, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.maps, want_map, rtol=1e-5, atol=1e-5)
    # the default map is the layer mean of the log-odds: the same per-layer quantity, not saturating
    mean = aprilgan.APRILGAN(tiny, maps).eval()
    with torch.no_grad():
        lo = mean(x)
    torch.testing.assert_close(lo.scores, out.scores)
    assert not torch.allclose(lo.maps, out.maps)
    # the image score does not depend on the trained maps (their zero-shot image score is plain CLIP's)
    _, other = _maps(tiny, seed=5)
    with torch.no_grad():
        assert torch.equal(aprilgan.APRILGAN(tiny, other).eval()(x).scores, lo.scores)
        assert not torch.equal(aprilgan.APRILGAN(tiny, other).eval()(x).maps, lo.maps)
    with pytest.raises(ValueError, match=r"map_score must be one of \('logit_mean', 'prob_sum'\)"):
        aprilgan.APRILGAN(tiny, maps, map_score="max")


def _their_focal(logit2, target, gamma=2.0):
    # loss.py FocalLoss on the softmax output (apply_nonlin None, alpha None -> 1), without the 1e-5 smoothing
    prob = logit2.permute(0, 2, 3, 1).reshape(-1, 2)
    idx = target.reshape(-1).long()
    pt = prob.gather(1, idx[:, None])[:, 0]
    return (-(1 - pt) ** gamma * pt.log()).mean()


def _their_dice(prob, target):
    # loss.py BinaryDiceLoss: smooth 1, per image, 1 - mean over the batch
    n = target.shape[0]
    i, t = prob.reshape(n, -1), target.reshape(n, -1)
    return 1 - ((2 * (i * t).sum(1) + 1) / (i.sum(1) + t.sum(1) + 1)).sum() / n


def test_loss_is_their_train_py_and_only_the_maps_learn(toy_root, tiny):
    samples = bmad.list_split(toy_root, "Liver", "test")  # Liver: a pixel-mask domain, normals and anomalies
    batch = next(iter(torch.utils.data.DataLoader(bmad.ImageDataset(samples, 64), batch_size=4)))
    batch["pixel_domain"] = torch.ones(4)
    assert batch["has_mask"].all() and batch["mask"].amax() > 0
    cfg, maps = _maps(tiny)
    out = aprilgan._forward(maps, tiny, batch["image"])
    loss, parts = aprilgan.aprilgan_loss(cfg, maps, out, batch)
    assert set(parts) == {"focal", "dice"}  # no image loss
    # train.py: per layer two-channel logits upsampled (align_corners=True), softmax, Focal + Dice[:, 1]; summed
    with torch.no_grad():
        gt = (batch["mask"] > 0.5).float()
        want = 0.0
        for z in out["z_maps"]:  # (B, N): the two channels' difference; the channels themselves are z * (0, 1) + c
            two = torch.stack([torch.zeros_like(z), z], dim=1).reshape(4, 2, 8, 8)
            up = torch.softmax(F.interpolate(two, size=64, mode="bilinear", align_corners=True), dim=1)
            want = want + _their_focal(up, gt) + _their_dice(up[:, 1], gt)
    torch.testing.assert_close(loss.detach(), want, rtol=1e-4, atol=1e-5)
    loss.backward()
    assert all(fc.weight.grad is not None and fc.weight.grad.abs().sum() > 0 for fc in maps.fc)
    assert all(p.grad is None and not p.requires_grad for p in tiny.model.parameters())
    assert not maps.text.requires_grad and list(maps.state_dict()) == [f"fc.{i}.{w}" for i in range(4)
                                                                         for w in ("weight", "bias")]
    # a classification-only batch (pixel_domain 0) under cls_only_pixel_loss="none" contributes nothing
    batch["pixel_domain"] = torch.zeros(4)
    zero, _ = aprilgan.aprilgan_loss(cfg, maps, aprilgan._forward(maps, tiny, batch["image"]), batch)
    assert float(zero.detach()) == 0.0


def test_text_is_the_prompt_ensemble_and_bad_states_are_refused(tiny):
    cfg, maps = _maps(tiny)
    torch.testing.assert_close(maps.text, text_embeddings(tiny, prompt_texts("mvfa_object")))
    with pytest.raises(ValueError, match="not an aprilgan state"):
        aprilgan.load(cfg, tiny, {"prompts": prompt_texts("mvfa_object")}, {"ctx": torch.zeros(2, 12, 8)})
    state = maps.state_dict()
    state["fc.0.weight"] = torch.zeros(3, 3)
    with pytest.raises(ValueError, match="does not fit the aprilgan maps of this backbone"):
        aprilgan.load(cfg, tiny, {"prompts": prompt_texts("mvfa_object")}, state)
    with pytest.raises(ValueError, match=r"text must be a \(2, 8\) tensor"):
        aprilgan.LinearMaps(tiny.spec.width, 8, torch.zeros(3, 8))
    with pytest.raises(ValueError, match="stages must be an integer >= 1"):
        aprilgan.LinearMaps(tiny.spec.width, 8, torch.zeros(2, 8), stages=0)


def test_train_eval_and_predict_through_the_cli(tmp_path, cli_run):
    from adsim.inference.detector import Detector

    run, state, hist, m = cli_run("aprilgan", tmp_path)
    assert sorted(state) == sorted(f"fc.{i}.{w}" for i in range(4) for w in ("weight", "bias"))  # no CLIP weights
    assert set(hist[0]) >= {"loss", "focal", "dice"} and math.isfinite(hist[0]["loss"])
    method = Detector.from_run(run, device="cpu").method
    assert isinstance(method, aprilgan.APRILGAN)
    assert all(torch.equal(fc.weight, state[f"fc.{i}.weight"]) for i, fc in enumerate(method.maps.fc))
    assert m["method"] == "aprilgan" and 0 <= m["image_auc"] <= 100 and 0 <= m["pixel_auc"] <= 100


def test_table_trains_it_leave_one_out_beside_the_paper_row(toy_root, tmp_path):
    import pandas as pd

    from adsim.data import reference
    from adsim.experiments import table

    out = tmp_path / "table"
    table.run(out, toy_root, methods=["aprilgan"], targets=["Liver"], shots=[0], backbone="tiny", epochs=1,
              batch_size=8, progress=False)
    cfg = json.loads((out / "runs" / "Liver" / "aprilgan" / "config.json").read_text())["config"]
    assert cfg["method"] == "aprilgan" and "Liver" not in cfg["train_domains"]  # leave-one-out
    df = pd.read_csv(out / "table.csv")
    assert {"aprilgan k=0 AC", "aprilgan k=0 AS", "paper-reported APRIL-GAN AC"} <= set(df.columns)
    # the paper's Table 1 row "APRIL-GAN" (adsim/data/reference.py)
    assert df["paper-reported APRIL-GAN AC"][0] == reference.TABLE1["APRIL-GAN"][("Liver", "AC")]
