"""Mao et al. (adsim.methods.baselines.mao) on the tiny open_clip backbone (random weights) and the toy BMAD data:
what makes it that method as far as its public sources define it -- one normal/abnormal prototype set per SOURCE
domain, trained only by that domain's samples, and a harmonization over the source domains whose weights sum to 1
and follow the domain an image resembles -- plus its scores against a computation written out from the module
docstring (adsim's reading), and a loss that decreases. The output contract and the run folder are covered by
test_adsim_baselines.py (parametrised over every registered trained method, mao included)."""
import math

import numpy as np
import pytest
import torch

from adsim.config import recipes
from adsim.config.run import config_from_recipe
from adsim.data import bmad
from adsim.methods import registry
from adsim.methods.baselines import mao
from adsim.methods.baselines.common import TEMPERATURE

pytestmark = pytest.mark.filterwarnings("ignore::adsim.model.backbone.RandomWeightsWarning")
F = torch.nn.functional
DOMAINS = ("Liver", "Chest", "Retina_RESC")


def _protos(tiny, seed=0, domains=DOMAINS):
    cfg = config_from_recipe(recipes.get("mao"), data="d", out="o", target="Brain", train_domains=domains, seed=seed)
    return cfg, mao.build_prototypes(cfg, tiny)


def _images(n=3, seed=3):
    return torch.rand(n, 3, 64, 64, generator=torch.Generator().manual_seed(seed))


def _batch(n=4, domains=(0, 2, 0, 2)):
    # half normal, half anomalous with a square mask; every sample from a masked domain
    mask = torch.zeros(n, 64, 64)
    mask[n // 2:, 16:32, 16:32] = 1.0
    return {"image": _images(n, seed=5), "mask": mask, "has_mask": torch.ones(n), "pixel_domain": torch.ones(n),
            "label": (torch.arange(n) >= n // 2).float(), "domain": torch.tensor(domains, dtype=torch.int64)}


def test_registered_and_wired_like_the_other_trained_baselines():
    assert "mao" in registry.TRAINERS and "mao" in registry.TRAINED  # so test_adsim_baselines parametrises it
    assert "mao" in recipes.CHOICES["method"]
    r = recipes.get("mao")  # adsim's choices (no training setting is public): docs/recipes.md, section mao
    assert (r.method, r.batch_size, r.epochs, r.lr, r.vaca, r.select) == ("mao", 8, 15, 1e-3, False, "last")
    assert (r.beta_bce, r.beta_focal, r.beta_dice, r.lambda_intra, r.smooth_sigma) == (1.0, 1.0, 1.0, 1.0, 0.0)
    from adsim.data import reference
    from adsim.experiments import table
    # Mao et al.'s own Table 1 (zero-shot AUROC: Brain MRI 73.7, OCT2017 91.2), as the paper's Table 1 row
    # "Mao et al." reproduces them (adsim/data/reference.py)
    assert table.PAPER_ROW["mao"] == "Mao et al."
    assert reference.TABLE1["Mao et al."] == {("Brain", "AC"): 73.7, ("Retina_OCT2017", "AC"): 91.2}
    assert "adsim's reading" in table.READINGS["mao"]


def test_one_prototype_set_per_source_domain_and_stage(tiny):
    _, protos = _protos(tiny)
    e, stages = tiny.spec.embed_dim, len(tiny.spec.adapter_layers)
    assert tuple(protos.glob.shape) == (3, 2, e) and tuple(protos.local.shape) == (3, stages, 2, e)
    assert sorted(protos.state_dict()) == ["glob", "local"]  # nothing of CLIP is trainable or saved
    _, other = _protos(tiny, domains=("Liver", "Chest"))
    assert other.glob.shape[0] == 2
    _, again = _protos(tiny)
    assert torch.equal(again.glob, protos.glob)  # seeded
    assert not torch.equal(_protos(tiny, seed=1)[1].glob, protos.glob)


def test_a_domain_prototypes_learn_only_from_that_domain(tiny):
    cfg, protos = _protos(tiny)
    batch = _batch(domains=(0, 2, 0, 2))  # no sample of domain 1 (Chest)
    loss, parts = mao.mao_loss(cfg, protos, mao._forward(protos, tiny, batch["image"]), batch)
    assert set(parts) == {"bce_global", "bce_local", "focal", "dice", "attract"}
    loss.backward()
    for grad in (protos.glob.grad, protos.local.grad):
        assert torch.count_nonzero(grad[1]) == 0  # exactly zero: domain 1 had no sample
        assert grad[0].abs().sum() > 0 and grad[2].abs().sum() > 0
    assert all(p.grad is None for p in tiny.model.parameters())
    # the same images labelled as domain 1 move only domain 1
    protos.zero_grad()
    batch["domain"] = torch.ones(4, dtype=torch.int64)
    mao.mao_loss(cfg, protos, mao._forward(protos, tiny, batch["image"]), batch)[0].backward()
    assert torch.count_nonzero(protos.glob.grad[[0, 2]]) == 0 and torch.count_nonzero(protos.local.grad[[0, 2]]) == 0


def _bilinear_matrix(grid, size):
    """``(size, grid)`` weights of bilinear upsampling with ``align_corners=False``, written out: output pixel
    ``o`` samples the input at ``(o + 0.5) grid / size - 0.5`` (clamped at 0), between its two neighbours."""
    w = np.zeros((size, grid))
    for o in range(size):
        src = max((o + 0.5) * grid / size - 0.5, 0.0)
        i0 = int(math.floor(src))
        i1, frac = min(i0 + 1, grid - 1), src - i0
        w[o, i0] += 1.0 - frac
        w[o, i1] += frac
    return w


def test_loss_terms_are_each_samples_own_domain(tiny):
    cfg, protos = _protos(tiny)
    batch = _batch(domains=(1, 0, 2, 1))
    out = mao._forward(protos, tiny, batch["image"])
    _, parts = mao.mao_loss(cfg, protos, out, batch)
    with torch.no_grad():
        g, feats = mao.visual_features(tiny, batch["image"])
        q = F.normalize(protos.glob, dim=-1)
        d = batch["domain"].tolist()
        zg = torch.stack([(g[i] @ q[d[i], 1] - g[i] @ q[d[i], 0]) / TEMPERATURE for i in range(4)])
        want = F.binary_cross_entropy_with_logits(zg, batch["label"])
        attract = torch.stack([1 - g[i] @ q[d[i], int(batch["label"][i])] for i in range(4)]).mean()
    torch.testing.assert_close(parts["bce_global"], want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(parts["attract"], attract, rtol=1e-5, atol=1e-6)
    # bce_local, focal and Dice written out in NumPy float64 (module docstring): each sample's own domain's
    # local prototypes; per stage the patch log-odds, their top-K mean averaged over the stages -> BCE; the
    # patch log-odds bilinearly upsampled (align_corners=False) to the mask -> Focal (gamma 2) and Dice
    # (smooth 1) of sigmoid, per (stage, sample), averaged
    ql = F.normalize(protos.local.detach().double(), dim=-1).numpy()
    labels, masks = batch["label"].double().numpy(), (batch["mask"] > 0.5).double().numpy()
    n, grid, size = feats[0].shape[1], tiny.spec.grid, masks.shape[-1]
    k = max(1, math.ceil(0.01 * n))
    up = _bilinear_matrix(grid, size)
    bce_local, focal, dice = 0.0, [], []
    for b in range(4):
        s = 0.0
        for l, f in enumerate(feats):
            p = f[b].double().numpy()
            z = (p @ ql[d[b], l, 1] - p @ ql[d[b], l, 0]) / TEMPERATURE  # (N,)
            s += np.sort(z)[::-1][:k].mean() / len(feats)
            zz = up @ z.reshape(grid, grid) @ up.T  # (S, S)
            prob = 1.0 / (1.0 + np.exp(-zz))
            pt = np.where(masks[b] >= 0.5, prob, 1.0 - prob)
            focal.append(np.mean(-((1.0 - pt) ** 2) * np.log(pt)))
            dice.append(1.0 - (2.0 * (prob * masks[b]).sum() + 1.0) / (prob.sum() + masks[b].sum() + 1.0))
        bce_local += (np.log1p(np.exp(-s)) if labels[b] == 1 else np.log1p(np.exp(s))) / 4
    for name, want_v in (("bce_local", bce_local), ("focal", np.mean(focal)), ("dice", np.mean(dice))):
        assert math.isclose(float(parts[name]), want_v, rel_tol=1e-4, abs_tol=1e-6), (name, float(parts[name]), want_v)
    # a classification-only domain's samples (pixel_domain 0) give no pixel loss
    batch["pixel_domain"] = torch.zeros(4)
    _, none = mao.mao_loss(cfg, protos, out, batch)
    assert float(none["focal"]) == 0.0 and float(none["dice"]) == 0.0


def test_harmonization_weights_sum_to_one_and_follow_the_resembled_domain():
    gen = torch.Generator().manual_seed(0)
    glob = torch.randn(3, 2, 16, generator=gen)
    q = F.normalize(glob, dim=-1)
    g = F.normalize(torch.randn(5, 16, generator=gen), dim=-1)
    w = mao.harmonization_weights(g, glob)
    # written out: softmax over m of max_c cos(g, q_mc) / 0.07 (module docstring), float64
    for b in range(5):
        logits = [max(float(g[b].double() @ q[m, c].double()) for c in range(2)) / 0.07 for m in range(3)]
        top = max(logits)
        den = sum(math.exp(v - top) for v in logits)
        for m in range(3):
            assert math.isclose(float(w[b, m]), math.exp(logits[m] - top) / den, rel_tol=1e-5, abs_tol=1e-7)
    torch.testing.assert_close(w.sum(1), torch.ones(5))
    # an image moved step by step onto domain 2's abnormal prototype: its weight of domain 2 rises to the largest
    steps = [F.normalize((1 - t) * g[0] + t * q[2, 1], dim=-1) for t in (0.0, 0.25, 0.5, 0.75, 1.0)]
    w2 = mao.harmonization_weights(torch.stack(steps), glob)[:, 2]
    assert all(b > a for a, b in zip(w2, w2[1:]))
    assert int(mao.harmonization_weights(steps[-1][None], glob).argmax()) == 2
    with pytest.raises(ValueError, match="temperature must be a number > 0"):
        mao.harmonization_weights(g, glob, temperature=0)


def test_the_method_weights_the_domain_whose_prototypes_an_image_is_near(tiny):
    _, protos = _protos(tiny)
    x = _images(2)
    with torch.no_grad():
        g, _ = mao.visual_features(tiny, x)
        protos.glob[1] = g[0]  # both of Chest's global prototypes at image 0's global token
        protos.glob[2] = g[1]
    method = mao.Mao(tiny, protos, DOMAINS).eval()
    with torch.inference_mode():
        w = method.weights(x)
    assert w.argmax(1).tolist() == [1, 2]
    torch.testing.assert_close(w.sum(1), torch.ones(2))


@pytest.mark.slow
def test_the_attraction_term_teaches_the_weights_the_source_domains(toy_root, tiny):
    # only the attraction term (beta_* = 0): 60 Adam steps (lr 1e-2) on the toy test images of three source
    # domains; afterwards the harmonization weights give each image's own domain more than chance (1/3) on
    # average and the largest weight for at least 2 of 3 images (10 of 12 in the run that set these bounds)
    doms = DOMAINS
    cfg = config_from_recipe(recipes.override(recipes.get("mao"), beta_bce=0.0, beta_focal=0.0, beta_dice=0.0),
                             data="d", out="o", target="Brain", train_domains=doms)
    protos = mao.build_prototypes(cfg, tiny)
    samples = [s for d in doms for s in bmad.list_split(toy_root, d, "test")]
    batch = next(iter(torch.utils.data.DataLoader(bmad.ImageDataset(samples, 64), batch_size=len(samples))))
    batch["domain"] = torch.tensor([doms.index(s.domain) for s in samples], dtype=torch.int64)
    batch["pixel_domain"] = torch.ones(len(samples))
    method, rows = mao.Mao(tiny, protos, doms).eval(), torch.arange(len(samples))
    opt = torch.optim.Adam(protos.parameters(), lr=1e-2)
    for _ in range(60):
        loss, _ = mao.mao_loss(cfg, protos, mao._forward(protos, tiny, batch["image"]), batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        w = method.weights(batch["image"])
    assert float(w[rows, batch["domain"]].mean()) > 1 / 3
    assert int((w.argmax(1) == batch["domain"]).sum()) >= 2 * len(samples) // 3


def test_scores_and_maps_match_the_written_out_computation(tiny):
    _, protos = _protos(tiny, seed=4)
    method = mao.Mao(tiny, protos, DOMAINS).eval()
    x = _images(2)
    with torch.inference_mode():
        out = method(x)
        g, feats = mao.visual_features(tiny, x)
    n, grid = tiny.spec.grid ** 2, tiny.spec.grid
    k = max(1, math.ceil(0.01 * n))  # TOPK_FRACTION 0.01 (module docstring)
    assert mao.top_k(n) == k
    qg, ql = F.normalize(protos.glob.detach().double(), dim=-1), F.normalize(protos.local.detach().double(), dim=-1)
    stages = len(feats)
    for b in range(2):
        gb = g[b].double()
        sims = [max(float(gb @ qg[m, c]) for c in range(2)) / 0.07 for m in range(3)]
        w = torch.softmax(torch.tensor(sims, dtype=torch.float64), 0)
        score, patch = 0.0, torch.zeros(n, dtype=torch.float64)
        for m in range(3):
            zg = float(gb @ qg[m, 1] - gb @ qg[m, 0]) / TEMPERATURE
            local, zmap = 0.0, torch.zeros(n, dtype=torch.float64)
            for l in range(stages):
                p = feats[l][b].double()
                z = (p @ ql[m, l, 1] - p @ ql[m, l, 0]) / TEMPERATURE  # (N,)
                local += float(torch.sort(z, descending=True).values[:k].mean()) / stages
                zmap += z / stages
            score += float(w[m]) * (zg + local)
            patch += float(w[m]) * zmap
        assert math.isclose(float(out.scores[b]), score, rel_tol=1e-4, abs_tol=1e-4)
        want = F.interpolate(patch.reshape(1, 1, grid, grid), size=64, mode="bilinear", align_corners=False)[0, 0]
        torch.testing.assert_close(out.maps[b].double(), want, rtol=1e-4, atol=1e-4)
    assert len(out.patches) == stages and all(torch.equal(a, b) for a, b in zip(out.patches, feats))


def test_a_few_training_steps_decrease_the_loss(toy_root, tiny):
    cfg, protos = _protos(tiny, domains=("Liver", "Chest"))
    samples = [s for d in ("Liver", "Chest") for s in bmad.list_split(toy_root, d, "test")]
    batch = next(iter(torch.utils.data.DataLoader(bmad.ImageDataset(samples, 64), batch_size=len(samples))))
    batch["domain"] = torch.tensor([("Liver", "Chest").index(s.domain) for s in samples], dtype=torch.int64)
    batch["pixel_domain"] = torch.tensor([float(s.domain == "Liver") for s in samples])
    opt = torch.optim.Adam(protos.parameters(), lr=cfg.lr)
    history = []
    for _ in range(15):
        loss, _ = mao.mao_loss(cfg, protos, mao._forward(protos, tiny, batch["image"]), batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        history.append(float(loss.detach()))
    assert history[-1] < 0.9 * history[0], history


def test_bad_input_is_refused_with_the_argument_named(tiny):
    cfg, protos = _protos(tiny)
    with pytest.raises(ValueError, match="not a mao state"):
        mao.load(cfg, tiny, {}, {"fc.0.weight": torch.zeros(1)})
    state = protos.state_dict()
    state["glob"] = torch.zeros(2, 2, tiny.spec.embed_dim)  # two domains, the run has three
    with pytest.raises(ValueError, match="does not fit the mao prototypes"):
        mao.load(cfg, tiny, {}, state)
    with pytest.raises(ValueError, match="domains must be an integer >= 1"):
        mao.Prototypes(0, 4, 8)
    with pytest.raises(ValueError, match="domains must name the 3 source domains"):
        mao.Mao(tiny, protos, ("Liver",))
    with pytest.raises(ValueError, match="images must be a tensor of shape"):
        mao.Mao(tiny, protos).eval()(torch.zeros(1, 3, 32, 32))


def test_train_eval_predict_and_table_through_the_cli(toy_root, tmp_path, cli_run):
    import pandas as pd

    from adsim.experiments import table
    from adsim.inference.detector import Detector
    from adsim.runtime.io import read_json

    run, state, hist, m = cli_run("mao", tmp_path)
    assert sorted(state) == ["glob", "local"] and state["glob"].shape[0] == 2  # Liver, Chest
    assert {"loss", "bce_global", "bce_local", "focal", "dice", "attract"} <= set(hist[0])
    method = Detector.from_run(run, device="cpu").method
    assert isinstance(method, mao.Mao) and method.domains == ("Liver", "Chest")
    assert torch.equal(method.protos.glob, state["glob"])
    assert m["method"] == "mao" and 0 <= m["image_auc"] <= 100 and 0 <= m["pixel_auc"] <= 100
    # the table: leave-one-out on the other five domains, the paper's "Mao et al." row, the header's label, and
    # k = 2 through adsim's few-shot mode on the method's patch tokens
    out = tmp_path / "table"
    table.run(out, toy_root, methods=["mao"], targets=["Brain"], shots=[0, 2], backbone="tiny", epochs=1,
              batch_size=8, progress=False)
    cfg = read_json(out / "runs" / "Brain" / "mao" / "config.json")["config"]
    assert cfg["method"] == "mao" and len(cfg["train_domains"]) == 5 and "Brain" not in cfg["train_domains"]
    df = pd.read_csv(out / "table.csv")
    assert df["paper-reported Mao et al. AC"][0] == 73.7  # the reference row's Brain AC
    assert 0 <= df["mao k=2 AC"][0] <= 100 and read_json(out / "cells" / "Brain__mao__k2.json")["metrics"]["shots"] == 2
    assert f"**mao: {mao.LABEL}.**" in (out / "table.md").read_text()
