"""The baselines (adsim.methods.baselines: WinCLIP, AnomalyCLIP; MVFA-AD as the ``mvfa`` recipe) on the tiny open_clip
backbone (random weights) and the toy BMAD data: the Method contract shared by every registered method,
WinCLIP's harmonic aggregation against a hand computation, AnomalyCLIP's frozen encoders and its run folder."""
import json
import math

import numpy as np
import pytest
import torch

from adsim.cli.main import main
from adsim.config import recipes
from adsim.config.run import config_from_recipe
from adsim.inference.detector import Detector
from adsim.methods import catalog, registry
from adsim.methods.baselines import anomalyclip, winclip
from adsim.runtime.io import load_torch, read_json
from adsim.training.train import train

pytestmark = [pytest.mark.filterwarnings("ignore::adsim.model.backbone.RandomWeightsWarning"), pytest.mark.slow]  # slow: every baseline trained and benchmarked, ~2 min
TRAIN_RUN = dict(target="Brain", train_domains=("Liver", "Chest"), backbone="tiny", seed=0, device="cpu")


def _rebuild(run):
    """The method of a run folder as ``Detector.from_run`` rebuilds it: a fresh backbone, ``config.json`` and the
    checkpoint through the ``TRAINED`` loader of ``cfg.method``."""
    return Detector.from_run(run, device="cpu").method.eval()


def _train(toy_root, out, recipe: str, **changes):
    r = recipes.override(recipes.get(recipe), **{"epochs": 1, "batch_size": 8, "select": "last", **changes})
    return train(config_from_recipe(r, data=str(toy_root), out=str(out), **TRAIN_RUN), progress=False)


@pytest.fixture(scope="module")
def runs(toy_root, tmp_path_factory):
    """One 1-epoch run folder per registered TRAINED method (its recipe if there is one, else ``clean``)."""
    out = {}
    for name in sorted(registry.TRAINED):
        recipe = name if name in recipes.names() else "clean"
        out[name] = _train(toy_root, tmp_path_factory.mktemp(f"run_{name}"), recipe, method=name,
                           gate_mode="batched" if name == "match" else None)
    return out


def _images(n=6, size=64, seed=3):
    return torch.rand(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("kind,name", [("zero_shot", n) for n in sorted(registry.ZERO_SHOT)]
                         + [("trained", n) for n in sorted(registry.TRAINED)])
def test_every_registered_method_keeps_the_output_contract(kind, name, tiny, request):
    method = catalog.zero_shot(name)(tiny) if kind == "zero_shot" else _rebuild(request.getfixturevalue("runs")[name])
    assert isinstance(method, registry.Method) and method.name == name
    spec = tiny.spec
    assert (method.image_size, method.grid) == (spec.image_size, spec.grid)
    x = _images()
    with torch.inference_mode():
        out = method(x)
        again = method(x)
    assert isinstance(out, registry.Output)
    assert out.scores.shape == (6,) and out.scores.dtype == torch.float32
    assert out.maps.shape == (6, 64, 64) and out.maps.dtype == torch.float32
    assert torch.isfinite(out.scores).all() and torch.isfinite(out.maps).all()
    # scores rank: 6 distinct random images, 6 distinct scores; every map has more than one value
    assert len(set(out.scores.tolist())) == 6
    assert all(len(torch.unique(m)) > 1 for m in out.maps)
    for p in out.patches:  # unit patch features on the patch grid
        assert p.shape[:2] == (6, spec.grid ** 2)
        torch.testing.assert_close(p.norm(dim=-1), torch.ones(6, spec.grid ** 2), rtol=0, atol=1e-5)
    # deterministic: the same images give bit-identical outputs
    assert torch.equal(out.scores, again.scores) and torch.equal(out.maps, again.maps)
    # and a batch of one gives the same scores as the batch (no cross-image dependence)
    with torch.inference_mode():
        one = method(x[2:3])
    torch.testing.assert_close(one.scores, out.scores[2:3], rtol=1e-5, atol=1e-5)


def test_unknown_method_is_a_one_line_error_listing_the_names():
    with pytest.raises(ValueError, match=r"unknown zero-shot method 'nope'; must be one of \(.*'winclip'.*\)") as e:
        catalog.zero_shot("nope")
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match=r"unknown trained method 'nope'; must be one of \(.*'anomalyclip'.*\)"):
        catalog.trained("nope")
    with pytest.raises(ValueError, match=r"recipe field method must be one of \('naive', 'match', 'anomalyclip', 'aprilgan'[^)]*\)"):
        recipes.override(recipes.get("clean"), method="winclip")  # winclip is training-free: no train recipe


# ----------------------------------------------------------------------------------------------- WinCLIP

def test_windows_on_a_3x3_grid():
    # the four 2x2 windows of a 3x3 grid, row-major patch indices (written out by hand)
    assert winclip.windows(3, 2).tolist() == [[0, 1, 3, 4], [1, 2, 4, 5], [3, 4, 6, 7], [4, 5, 7, 8]]
    assert winclip.windows(3, 3).tolist() == [list(range(9))]
    assert winclip.windows(3, 1).tolist() == [[i] for i in range(9)]


def test_harmonic_aggregation_matches_the_hand_computation():
    # WinCLIP Sec. 4.2: M_ij = |W_ij| / sum_{w covers ij} 1 / ascore_0(w). Window probabilities chosen by hand;
    # the reference is that definition in float64 plain Python, window coverage from the list above.
    p = [0.9, 0.6, 0.3, 0.2]
    cover = [[0, 1, 3, 4], [1, 2, 4, 5], [3, 4, 6, 7], [4, 5, 7, 8]]
    want = []
    for patch in range(9):
        ps = [p[w] for w in range(4) if patch in cover[w]]
        want.append(len(ps) / sum(1 / q for q in ps))
    # a few by hand: patch 0 -> 0.9; patch 1 -> 2 / (1/0.9 + 1/0.6) = 0.72; centre -> 4 / 11.111 = 0.36
    assert math.isclose(want[0], 0.9) and math.isclose(want[1], 0.72) and math.isclose(want[4], 0.36)
    z = torch.logit(torch.tensor([p], dtype=torch.float64)).float()
    got = torch.sigmoid(winclip.harmonic_log_odds(z, winclip.windows(3, 2), 9).double())[0]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)


def test_harmonic_log_odds_do_not_saturate():
    # window logits where every probability is 1.0 in float32: the log-odds still rank exactly;
    # logit(M) = -log(mean exp(-z)) (closed form of the harmonic mean of sigmoids), in float64 by hand
    z = torch.tensor([[30.0, 40.0, 50.0, 60.0]])
    assert torch.sigmoid(z).eq(1.0).all()
    got = winclip.harmonic_log_odds(z, winclip.windows(3, 2), 9)[0].double()
    cover = [[0, 1, 3, 4], [1, 2, 4, 5], [3, 4, 6, 7], [4, 5, 7, 8]]
    for patch in range(9):
        zs = [float(z[0, w]) for w in range(4) if patch in cover[w]]
        want = -math.log(sum(math.exp(-v) for v in zs) / len(zs))
        assert math.isclose(float(got[patch]), want, rel_tol=1e-6), patch
    assert got[0] == 30.0 and got[8] == 60.0 and len(set(got.tolist())) == 9


def test_winclip_window_of_the_whole_grid_is_the_image(tiny):
    # one window covering every patch = the full token set: its embedding must be the class token's, so the
    # masked-token path is checked against the plain forward (map = image log-odds everywhere)
    m = winclip.build(tiny, scales=(tiny.spec.grid,), image_score="cls")
    with torch.inference_mode():
        out = m(_images(3))
    for s, mp in zip(out.scores, out.maps):
        torch.testing.assert_close(mp, torch.full_like(mp, float(s)), rtol=1e-4, atol=1e-4)
    # "cls+max" = log((sigmoid(z_cls) + sigmoid(max map)) / 2); here max map = z_cls, so = logsigmoid(z_cls)
    both = winclip.build(tiny, scales=(tiny.spec.grid,), image_score="cls+max")
    with torch.inference_mode():
        got = both(_images(3)).scores
    torch.testing.assert_close(got, torch.nn.functional.logsigmoid(out.scores), rtol=1e-4, atol=1e-5)


def test_winclip_prompts_and_options(tiny):
    ens = winclip.prompt_ensemble("object")
    assert len(ens["normal"]) == 7 * 21 and len(ens["anomaly"]) == 4 * 21
    assert "a photo of a damaged object." in ens["anomaly"] and "a photo of a flawless object." in ens["normal"]
    m = winclip.build(tiny)
    torch.testing.assert_close(m.text.norm(dim=-1), torch.ones(2))
    assert m.smooth_sigma == 0.0  # no reference smooths WinCLIP's maps
    for bad, msg in (({"scales": (0,)}, "window scale must be an integer in"),
                     ({"scales": (tiny.spec.grid + 1,)}, "window scale must be an integer in"),
                     ({"scales": (2, 2)}, "scales must be distinct"),
                     ({"temperature": 0.0}, "temperature must be a finite number > 0"),
                     ({"image_score": "max"}, "image_score must be one of"),
                     ({"object": ""}, "object must be a non-empty string"),
                     ({"smooth_sigma": -1.0}, "smooth_sigma must be a finite number >= 0")):
        with pytest.raises(ValueError, match=msg):
            winclip.build(tiny, **bad)
    with pytest.raises(ValueError, match=r"images must be a tensor of shape \(B, 3, 64, 64\)"):
        m(torch.rand(1, 3, 32, 32))


# ----------------------------------------------------------------------------------------------- AnomalyCLIP

def test_learned_prompt_path_is_the_text_encoder(tiny):
    # with the learned vectors set to the placeholder's own token embeddings, the replaced-embedding path must
    # give exactly open_clip's encode_text of the tokenised prompts
    learner = anomalyclip.PromptLearner(tiny, depth=1)  # no deep prompts
    with torch.no_grad():
        learner.ctx.copy_(tiny.model.token_embedding(learner.tokens)[:, 1:1 + learner.n_ctx])
        want = torch.nn.functional.normalize(tiny.model.encode_text(learner.tokens).float(), dim=-1)
        torch.testing.assert_close(anomalyclip.text_features(tiny, learner), want, rtol=0, atol=1e-6)
    assert list(anomalyclip.PromptLearner(tiny).state_dict()) == ["ctx", "deep"]  # only the prompts are checkpointed


def test_deep_prompts_replace_positions_1_to_t_before_block_1(tiny):
    # With the same learned vectors in both prompts, positions 1..t after text block 0 are identical in the two
    # prompts (causal attention: they see only the start token and the learned vectors). Deep prompts equal to
    # those hidden states must therefore change nothing: the result equals the path without deep prompts.
    t, model = 4, tiny.model
    deep = anomalyclip.PromptLearner(tiny, depth=2, t=t, seed=1)
    flat = anomalyclip.PromptLearner(tiny, depth=1, seed=1)
    assert deep.deep.shape == (1, t, model.token_embedding.weight.shape[1])
    with torch.no_grad():
        for lr in (deep, flat):
            lr.ctx[1] = deep.ctx[0]
        x = model.token_embedding(deep.tokens)
        x = torch.cat([x[:, :1], deep.ctx, x[:, 1 + deep.n_ctx:]], dim=1) + model.positional_embedding
        assert model.transformer.batch_first
        h = model.transformer.resblocks[0](x, attn_mask=model.attn_mask)[:, 1:1 + t]
        torch.testing.assert_close(h[0], h[1])
        random_deep = anomalyclip.text_features(tiny, deep)
        deep.deep[0] = h[0]
        torch.testing.assert_close(anomalyclip.text_features(tiny, deep), anomalyclip.text_features(tiny, flat), rtol=1e-5, atol=1e-6)
        assert not torch.allclose(random_deep, anomalyclip.text_features(tiny, flat), atol=1e-4)  # and random ones do act


def test_dpam_is_vv_attention_beside_the_unmodified_tower(tiny):
    import copy
    # V-V attention = torch's own multi-head attention with the query and key projections set to the value's
    block = tiny.model.visual.transformer.resblocks[1]
    c = block.attn.embed_dim
    vv = copy.deepcopy(block.attn)
    with torch.no_grad():
        vv.in_proj_weight[:2 * c] = block.attn.in_proj_weight[2 * c:].repeat(2, 1)
        vv.in_proj_bias[:2 * c] = block.attn.in_proj_bias[2 * c:].repeat(2)
    h = torch.randn(2, 5, c, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = vv(h, h, h, need_weights=False)[0] if vv.batch_first else \
            vv(*(h.transpose(0, 1),) * 3, need_weights=False)[0].transpose(0, 1)
        torch.testing.assert_close(anomalyclip.vv_attention(block, h), want, rtol=1e-5, atol=1e-6)
        # the image embedding comes from the unmodified tower either way; the patch features change with DPAM
        x = _images(2)
        img_d, p_d = anomalyclip.visual_features(tiny, x, dpam=True)
        img_o, p_o = anomalyclip.visual_features(tiny, x, dpam=False)
        img_ln, _ = anomalyclip.visual_features(tiny, x, image_ln_post=True)
        full = tiny.model.encode_image(x)
        last = tiny.model.visual.transformer(tiny.model.visual._embeds(x))  # the unmodified tower's last block
    torch.testing.assert_close(img_d, img_o, rtol=0, atol=0)
    # AnomalyCLIP.py:387: x_ori[0, :, :] @ self.proj -- the class token without ln_post
    want = torch.nn.functional.normalize(last[:, 0] @ tiny.model.visual.proj, dim=-1)
    torch.testing.assert_close(img_o, want, rtol=1e-5, atol=1e-6)
    # image_ln_post=True: CLIP's own image embedding (encode_image: ln_post, then proj)
    torch.testing.assert_close(img_ln, torch.nn.functional.normalize(full.float(), dim=-1), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(img_o, img_ln, atol=1e-3)
    assert all(not torch.allclose(a, b, atol=1e-3) for a, b in zip(p_d, p_o))
    # the dual path written as AnomalyCLIP's ResidualAttentionBlock.forward does it (a [x, x_ori] pair: the
    # first DPAM block starts it from its input; every block: x += VV(ln_1(x_ori)), x_ori = block(x_ori))
    visual, spec = tiny.model.visual, tiny.spec
    with torch.no_grad():
        t = visual._embeds(x)
        for blk in visual.transformer.resblocks[:spec.adapter_layers[0]]:
            t = blk(t)
        pair, ref = t, []
        for i, blk in enumerate(visual.transformer.resblocks):
            if i < spec.adapter_layers[0]:
                continue
            if not isinstance(pair, list):
                pair = [pair, pair]
            new, ori = pair
            pair = [new + anomalyclip.vv_attention(blk, blk.ln_1(ori)), blk(ori)]
            if i in spec.adapter_layers:
                ref.append(torch.nn.functional.normalize(visual.ln_post(pair[0][:, 1:]) @ visual.proj, dim=-1))
    for got, want in zip(p_d, ref):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_anomalyclip_load_refuses_a_foreign_state(tiny):
    cfg = config_from_recipe(recipes.get("anomalyclip"), data="d", out="o", target="Brain")
    with pytest.raises(ValueError, match="not an anomalyclip prompt state"):
        anomalyclip.load(cfg, tiny, {}, {"seg_adapters.0.down.weight": torch.zeros(1)})
    state = anomalyclip.PromptLearner(tiny).state_dict()
    state["ctx"] = torch.zeros(2, 12, 7)  # another text width
    with pytest.raises(ValueError, match="does not fit the anomalyclip prompts of this backbone"):
        anomalyclip.load(cfg, tiny, {}, state)


def test_only_the_prompts_get_gradients(toy_root, tiny):
    from adsim.data import bmad
    samples = bmad.list_split(toy_root, "Liver", "test")
    batch = next(iter(torch.utils.data.DataLoader(bmad.ImageDataset(samples, 64), batch_size=4)))
    cfg = config_from_recipe(recipes.get("anomalyclip"), data="d", out="o", target="Brain")
    learner = anomalyclip.PromptLearner(tiny)
    loss, parts = anomalyclip.glocal_loss(cfg, learner, anomalyclip._forward(learner, tiny, batch["image"]), batch)
    loss.backward()
    assert set(parts) == {"bce", "focal", "dice"} and all(torch.isfinite(v) for v in parts.values())
    assert float(parts["focal"]) > 0 and float(parts["dice"]) > 0  # Liver has masks: the pixel loss is on
    assert learner.ctx.grad is not None and torch.isfinite(learner.ctx.grad).all()
    assert learner.ctx.grad[0].abs().sum() > 0 and learner.ctx.grad[1].abs().sum() > 0
    assert learner.deep.shape[0] >= 1 and learner.deep.grad is not None and learner.deep.grad.abs().sum() > 0
    assert all(p.grad is None and not p.requires_grad for p in tiny.model.parameters())


def test_glocal_loss_upsamples_probabilities_as_anomalyclip(toy_root, tiny):
    # train.py:88-100 with model_load.py:222-235: per-patch two-way softmax of sim / 0.07, the probabilities
    # interpolated (bilinear, align_corners False), Focal on the two-channel map + Dice(ch 1, gt) + Dice(ch 0, 1 - gt),
    # times lam = 4 (recipe beta_focal = beta_dice = 4), plus the image CE (beta_bce 1); written here as there
    from adsim.data import bmad
    F = torch.nn.functional
    samples = bmad.list_split(toy_root, "Liver", "test")
    batch = next(iter(torch.utils.data.DataLoader(bmad.ImageDataset(samples, 64), batch_size=4)))
    batch["pixel_domain"] = torch.ones(4)
    cfg = config_from_recipe(recipes.get("anomalyclip"), data="d", out="o", target="Brain")
    learner = anomalyclip.PromptLearner(tiny)
    out = anomalyclip._forward(learner, tiny, batch["image"])
    with torch.no_grad():
        loss, _ = anomalyclip.glocal_loss(cfg, learner, out, batch)
        gt = batch["mask"]
        want = 0.0
        for z in out["z_maps"]:
            sm = torch.stack([torch.zeros_like(z), z], dim=-1).softmax(-1)  # (B, N, 2): softmax(sim / 0.07)
            up = F.interpolate(sm.reshape(4, 8, 8, 2).permute(0, 3, 1, 2), (64, 64), mode="bilinear")
            pt = torch.where(gt >= 0.5, up[:, 1], up[:, 0])
            focal = (-(1 - pt) ** 2 * pt.log()).mean()
            dice = [1 - ((2 * (p * g).flatten(1).sum(1) + 1) / (p.flatten(1).sum(1) + g.flatten(1).sum(1) + 1)).mean()
                    for p, g in ((up[:, 1], gt), (up[:, 0], 1 - gt))]
            want = want + focal + dice[0] + dice[1]
        want = 4.0 * want + F.cross_entropy(torch.stack([torch.zeros_like(out["z_img"]), out["z_img"]], 1),
                                            batch["label"].long())
    torch.testing.assert_close(loss, want, rtol=1e-4, atol=1e-5)
    # upsample="logit" (the log-odds upsampled, then sigmoid) is another loss
    logit_learner = anomalyclip.PromptLearner(tiny, upsample="logit")
    with torch.no_grad():
        other, _ = anomalyclip.glocal_loss(cfg, logit_learner, out, batch)
    assert not torch.isclose(other, loss, rtol=1e-4)
    with pytest.raises(ValueError, match=r"upsample must be one of \('prob', 'logit'\)"):
        anomalyclip.PromptLearner(tiny, upsample="nearest")


def test_anomalyclip_run_folder_rebuilds_identically(runs, toy_root, tiny):
    run = runs["anomalyclip"]
    record = read_json(run / "config.json")
    assert record["config"]["method"] == "anomalyclip" and record["recipe"]["name"] == "anomalyclip"
    state = load_torch(run / "checkpoint_last.pt")["head"]
    assert set(state) == {"ctx", "deep"}  # no backbone weights in the checkpoint
    assert not torch.equal(state["ctx"], anomalyclip.PromptLearner(tiny, seed=0).ctx.detach())  # training moved them
    hist = read_json(run / "history.json")["history"]
    assert hist[0]["steps"] == 2 and all(math.isfinite(hist[0][k]) for k in ("loss", "bce", "focal", "dice"))
    a, b = _rebuild(run), _rebuild(run)  # two fresh loads, each with its own backbone
    # the trained prompts, not a fresh initialisation
    assert torch.equal(a.learner.ctx, state["ctx"]) and torch.equal(a.learner.deep, state["deep"])
    with torch.inference_mode():
        oa, ob = a(_images()), b(_images())
    assert torch.equal(oa.scores, ob.scores) and torch.equal(oa.maps, ob.maps)
    # and the eval command scores it through the same run folder
    assert main(["eval", "--run", str(run), "--data", str(toy_root), "--no-progress", "--device", "cpu"]) == 0
    m = json.loads((run / "metrics.json").read_text())
    assert m["method"] == "anomalyclip" and 0 <= m["image_auc"] <= 100 and 0 <= m["pixel_auc"] <= 100


def test_anomalyclip_checkpoint_selection_scores_the_learned_prompts(toy_root, tmp_path):
    # select="heldout": each epoch the AnomalyCLIP method of the current prompts is scored on held-out
    # training-domain images; the best epoch's prompts are checkpointed and rebuilt by Detector.from_run
    run = _train(toy_root, tmp_path / "r", "anomalyclip", epochs=2, select="heldout")
    hist = read_json(run / "history.json")
    assert all(0 <= h["selection_score"] <= 100 for h in hist["history"]) and hist["best"]["epoch"] in (0, 1)
    best = load_torch(run / "checkpoint_best.pt")
    assert best["epoch"] == hist["best"]["epoch"]
    assert torch.equal(Detector.from_run(run, device="cpu").method.learner.ctx, best["head"]["ctx"])


# ----------------------------------------------------------------------------------------------- MVFA-AD

def test_mvfa_recipe_is_mvfa_ad():
    # MediaBrain-SJTU/MVFA-AD (docs/recipes.md column "mvfa" gives file:line for each value)
    r = recipes.get("mvfa")
    assert (r.method, r.vaca) == ("naive", False)  # adapters only: no centroids, no VACA
    assert (r.clip_norm, r.adapter_bias, r.prompts) == (False, False, "mvfa_object")
    assert (r.train_splits, r.batch_size, r.epochs, r.lr) == (("test",), 1, 50, 1e-4)
    assert (r.select, r.scoring, r.smooth_sigma, r.cls_only_pixel_loss) == ("test", "authors_prob_mean", 0.0, "none")


def test_mvfa_recipe_trains_and_evaluates(toy_root, tmp_path):
    run = tmp_path / "mvfa"
    assert main(["train", "--recipe", "mvfa", "--data", str(toy_root), "--target", "Chest", "--train-domains",
                 "Liver", "--out", str(run), "--epochs", "1", "--backbone", "tiny", "--no-progress",
                 "--device", "cpu"]) == 0
    assert main(["eval", "--run", str(run), "--data", str(toy_root), "--no-progress", "--device", "cpu"]) == 0
    m = json.loads((run / "metrics.json").read_text())
    assert (m["method"], m["vaca"], m["scoring"], m["select"]) == ("naive", False, "authors_prob_mean", "test")
    assert "NOT a zero-shot result" in m["warning"]  # MVFA selects its checkpoint on the target's test set
    state = load_torch(run / "checkpoint_best.pt")["head"]
    assert not any("bias" in k for k in state) and not any("vaca" in k or "centroid" in k for k in state)


def test_protocol_refuses_a_recipe_that_is_not_the_adapter_head(tmp_path, capsys):
    # the protocol trains the adapter head (naive / match); the anomalyclip recipe is trained by `train`
    assert main(["protocol", "--simulate", "--quick", "--recipe", "anomalyclip", "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err.strip()
    assert "the protocol runs the adapter head" in err and len(err.splitlines()) == 1


def test_anomalyclip_resume_matches_an_uninterrupted_run(toy_root, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _train(toy_root, a, "anomalyclip", epochs=2)
    _train(toy_root, b, "anomalyclip", epochs=1)
    r = recipes.override(recipes.get("anomalyclip"), epochs=2, batch_size=8, select="last")
    train(config_from_recipe(r, data=str(toy_root), out=str(b), **TRAIN_RUN), resume=True, progress=False)
    sa, sb = (load_torch(p / "checkpoint_last.pt") for p in (a, b))
    assert sa["epoch"] == sb["epoch"] == 1
    assert all(torch.equal(sa["head"][k], sb["head"][k]) for k in ("ctx", "deep"))


# ------------------------------------------- the Table-1 baselines with their own trainer (APRIL-GAN, AdaCLIP)

@pytest.mark.parametrize("name,parts", [("aprilgan", {"focal", "dice"}), ("adaclip", {"image", "focal", "dice"})])
def test_trained_baseline_through_train_eval_and_predict(name, parts, toy_root, tmp_path, tiny):
    run = tmp_path / "run"
    assert main(["train", "--recipe", name, "--data", str(toy_root), "--target", "Brain", "--train-domains",
                 "Liver", "--out", str(run), "--epochs", "1", "--backbone", "tiny", "--no-progress",
                 "--device", "cpu"]) == 0
    state = load_torch(run / "checkpoint_last.pt")["head"]
    cfg = config_from_recipe(recipes.get(name), data="d", out="o", target="Brain")
    assert sorted(state) == sorted(catalog.trainer(name).build(cfg, tiny).state_dict())  # no CLIP weights
    hist = read_json(run / "history.json")["history"]
    assert set(hist[0]) >= {"loss", *parts} and math.isfinite(hist[0]["loss"])
    method = Detector.from_run(run, device="cpu").method
    assert method.name == name
    own = method.state_dict()  # the trained module is a submodule of the method: its keys carry a prefix
    assert all(any(k.endswith("." + key) and torch.equal(own[k], v) for k in own) for key, v in state.items())
    assert main(["eval", "--run", str(run), "--data", str(toy_root), "--no-progress", "--device", "cpu"]) == 0
    m = read_json(run / "metrics.json")
    assert m["method"] == name and 0 <= m["image_auc"] <= 100 and 0 <= m["pixel_auc"] <= 100
    image = next((toy_root / "Brain_AD" / "test" / "Ungood" / "img").glob("*.png"))
    assert main(["predict", "--run", str(run), "--out", str(tmp_path / "pred"), str(image), "--device", "cpu"]) == 0
    assert (tmp_path / "pred" / "scores.csv").is_file()


@pytest.mark.parametrize("name,target", [("aprilgan", "Liver"), ("adaclip", "Brain")])
def test_table_trains_a_baseline_leave_one_out_beside_its_paper_row(name, target, toy_root, tmp_path):
    import pandas as pd

    from adsim.data import reference
    from adsim.experiments import table

    out = tmp_path / "table"
    table.run(out, toy_root, methods=[name], targets=[target], shots=[0], backbone="tiny", epochs=1,
              batch_size=8, progress=False)
    cfg = json.loads((out / "runs" / target / name / "config.json").read_text())["config"]
    assert cfg["method"] == name and target not in cfg["train_domains"]  # leave-one-out
    df = pd.read_csv(out / "table.csv")
    row = table.PAPER_ROW[name]  # the paper's Table 1 row (adsim/data/reference.py): "APRIL-GAN", "AdaCLIP"
    assert {f"{name} k=0 AC", f"{name} k=0 AS", f"paper-reported {row} AC"} <= set(df.columns)
    assert df[f"paper-reported {row} AC"][0] == reference.TABLE1[row][(target, "AC")]


BENCHMARK_MODES = ((), ("--train-step",))


@pytest.fixture(scope="module")
def benchmark_out():
    """``{mode: stdout}`` of ``python benchmarks/adsim_baselines.py --backbones tiny --iters 1 --batch 2 *MODE`` for
    each of :data:`BENCHMARK_MODES`: the script run as ``__main__`` (``runpy.run_path``, with its ``sys.argv``) once
    per mode, one after the other in ONE child interpreter (each mode builds its own backbone and methods; the
    second is spared the interpreter's start and torch's import)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    script = root / "benchmarks" / "adsim_baselines.py"
    code = ("import runpy, sys\n"
            f"for mode in {[list(m) for m in BENCHMARK_MODES]!r}:\n"
            f"    sys.argv = [{str(script)!r}, '--backbones', 'tiny', '--iters', '1', '--batch', '2', *mode]\n"
            "    print('@@ MODE', *mode, flush=True)\n"
            "    runpy.run_path(sys.argv[0], run_name='__main__')\n")
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    parts = proc.stdout.split("@@ MODE")[1:]
    assert len(parts) == len(BENCHMARK_MODES), proc.stdout[-3000:]
    return {mode: part for mode, part in zip(BENCHMARK_MODES, parts)}


@pytest.mark.parametrize("mode", BENCHMARK_MODES)
def test_cost_benchmark_runs_every_registered_method(mode, benchmark_out):
    # benchmarks/adsim_baselines.py builds every registered method / trainer itself (its rows are RESULTS.md's
    # and the GPU script's section 5): one timed call per method on the tiny backbone, each must get a row
    rows = [line.split("|")[2].strip() for line in benchmark_out[mode].splitlines() if line.startswith("| tiny")]
    names = set(registry.TRAINERS) if mode else {"winclip", "anomalyclip", "aprilgan", "adaclip", "mao", "bilora"}
    assert all(any(r.split(" (")[0] == n for r in rows) for n in names), rows
