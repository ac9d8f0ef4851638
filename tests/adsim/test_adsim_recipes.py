"""Recipes as data (adsim.config.recipes), the choices they switch, and bad input of every adsim command."""
import dataclasses
import json
import math
import typing

import pytest
import torch

from adsim.cli.main import main
from adsim.config import recipes
from adsim.config.run import RECIPE_FIELDS, RUN_FIELDS, TrainConfig, config_from_recipe, recipe_of, train_domains_of, validate
from adsim.data.domains import DOMAINS
from adsim.model import losses
from adsim.model.head import make_head
from adsim.model.objective import objective


def test_clean_recipe_is_the_trainconfig_default():
    # one source of defaults: TrainConfig's defaults are the clean recipe, field by field
    cfg = TrainConfig(data="d", target="Brain", out="o")
    assert recipe_of(cfg) == recipes.get("clean")


def test_trainconfig_declares_every_recipe_field_with_its_type():
    # TrainConfig is written out for the type checker: the run's own fields, then every recipe field training
    # reads in Recipe's order, with Recipe's annotation, then ``recipe`` (a Recipe field added without its
    # TrainConfig line fails here)
    assert TrainConfig._fields == (*RUN_FIELDS, *RECIPE_FIELDS, "recipe")
    assert set(RECIPE_FIELDS) == set(recipes.FIELDS) - {"name", "protocol_mode"}
    ours, theirs = typing.get_type_hints(TrainConfig), typing.get_type_hints(recipes.Recipe)
    assert {f: ours[f] for f in RECIPE_FIELDS} == {f: theirs[f] for f in RECIPE_FIELDS}


def test_train_domains_of_a_validated_config():
    cfg = TrainConfig(data="d", target="Brain", out="o")
    with pytest.raises(ValueError, match="validate"):
        train_domains_of(cfg)
    # validate() resolves None to every domain except the target, in DOMAINS order
    assert train_domains_of(validate(cfg)) == tuple(d for d in DOMAINS if d != "Brain")
    picked = validate(cfg._replace(train_domains=["liver", "Retina_RESC"]))
    assert train_domains_of(picked) == ("Liver", "Retina_RESC")


@pytest.mark.parametrize("name", recipes.names())
def test_shipped_recipes_validate_and_round_trip(name):
    r = recipes.get(name)
    assert recipes.validate(r) == r
    assert recipes.from_dict(json.loads(json.dumps(recipes.as_dict(r)))) == dataclasses.replace(r, name=r.name)
    cfg = config_from_recipe(r, data="d", target="Brain", out="o")
    # protocol_mode is the protocol's default --mode, not a training field
    assert recipe_of(cfg) == dataclasses.replace(r, protocol_mode="cumulative")


def test_recipes_differ_where_the_docs_say():
    p, a, c = (recipes.get(n) for n in ("paper", "authors", "clean"))
    assert (a.gate_unit, a.gate_filter, a.inter_form, a.intra_power) == ("image_mean", "skip_step", "reciprocal", 1)
    assert (p.gate_unit, p.gate_filter, p.match_branches, p.loss_metric) == ("patch", "centroids", "seg", "geodesic")
    # the authors' lambda ratio: ratio 0.036 times intra 0.5 / inter 1.5 (parse_options.py:22-25)
    assert math.isclose(a.lambda_inter / a.lambda_intra, 3.0)
    assert (a.clip_norm, a.adapter_bias, a.batch_size, a.train_splits, a.select) == (False, False, 1, ("test",), "test")
    assert c.loss_metric == "gate" and c.select == "last"


def test_unknown_recipe_and_field_are_one_line_errors():
    with pytest.raises(ValueError, match=r"unknown recipe 'nope'; must be one of "
                                         r"\('paper', 'authors', 'clean', 'mvfa', 'anomalyclip', 'aprilgan'[^)]*\)"):
        recipes.get("nope")
    with pytest.raises(ValueError, match="unknown recipe field 'gate_size'; fields:"):
        recipes.override(recipes.get("clean"), gate_size=3)
    with pytest.raises(ValueError, match=r"recipe field gate_unit must be one of \('patch', 'image_mean'\)"):
        recipes.override(recipes.get("clean"), gate_unit="pixel")
    with pytest.raises(ValueError, match="unknown recipe field"):
        recipes.parse_sets(["gate_size=3"])
    with pytest.raises(ValueError, match="is not implemented"):
        recipes.override(recipes.get("clean"), update="slerp_delta")
    with pytest.raises(ValueError, match="is not implemented"):
        recipes.override(recipes.get("clean"), renorm_after_vaca=False)
    with pytest.raises(ValueError, match="lr and tau must be > 0"):
        recipes.override(recipes.get("clean"), lr=0.0)


def test_metric_equivalence_only_where_provable():
    c = recipes.get("clean")
    assert recipes.metric_equivalence(c) is None  # the gate metric enters L_intra / L_inter
    assert recipes.metric_equivalence(recipes.override(c, loss_metric="geodesic")) is not None
    assert recipes.metric_equivalence(recipes.override(c, loss_metric="geodesic", gate_tau="fixed")) is None


def _unit(x):
    return x / x.norm(dim=-1, keepdim=True)


def test_loss_metric_changes_intra_by_the_closed_form():
    # f at angle theta from c: d_G = theta, l2 = 2 sin(theta / 2), cosine = 1 - cos(theta)
    theta = 0.7
    c = torch.tensor([1.0, 0.0])
    f = torch.tensor([[math.cos(theta), math.sin(theta)]])
    acc = torch.ones(1)
    for metric, want in (("geodesic", theta), ("l2", 2 * math.sin(theta / 2)), ("cosine", 1 - math.cos(theta))):
        assert math.isclose(float(losses.intra(f, acc, c, metric=metric, power=2)), want ** 2, rel_tol=1e-5)
        assert math.isclose(float(losses.intra(f, acc, c, metric=metric, power=1)), want, rel_tol=1e-5)
    # the authors' reciprocal separation 1 / (d + 1e-6) carries no gradient (they read centroid.data)
    c2 = torch.tensor([0.0, 1.0], requires_grad=True)
    r = losses.inter(c, c2, 1.0, form="reciprocal")
    assert math.isclose(float(r), 1 / (math.pi / 2 + 1e-6), rel_tol=1e-6) and not r.requires_grad


def _sim_batch(n=4, grid=2, width=12, embed=8, layers=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    tokens = _unit(torch.randn(n, layers, grid * grid, width, generator=g))
    labels = torch.tensor([0.0, 1.0] * (n // 2))
    masks = torch.zeros(n, grid, grid)
    masks[1::2, 0, 0] = 1.0
    batch = {"image": tokens, "label": labels, "mask": masks, "has_mask": torch.ones(n),
             "pixel_domain": torch.ones(n)}
    text = _unit(torch.randn(2, embed, generator=g))
    return batch, text, (width, embed, layers, grid)


def _objective(cfg, seed=0):
    from adsim.model.head import features_from_tokens
    batch, text, (w, e, layers, grid) = _sim_batch(seed=seed)
    torch.manual_seed(0)
    head = make_head(cfg, w, e, text, n_layers=layers)
    return objective(cfg, head, features_from_tokens(head, batch["image"]), batch, grid), head


def test_skip_step_zeroes_every_loss_of_a_failing_sample():
    # batched gate: every feature is gated against the batch-start centroids, so empty centroids accept
    # everything (the sequential gate would gate all but the first feature of each class)
    base = config_from_recipe(recipes.override(recipes.get("clean"), gate_filter="skip_step", gate_mode="batched"),
                              data="d", target="Brain", out="o")
    (_, parts), head = _objective(base)
    assert float(parts["n_pass"]) == 4
    # a gate with fixed radius 0 rejects every feature once the centroids exist: nobody passes
    cfg = base._replace(gate_tau="fixed", tau=1e-9)
    batch, text, (w, e, layers, grid) = _sim_batch()
    from adsim.model.head import features_from_tokens
    torch.manual_seed(0)
    head = make_head(cfg, w, e, text, n_layers=layers)
    head.train()
    objective(cfg, head, features_from_tokens(head, batch["image"]), batch, grid)  # initialises the centroids
    loss, parts = objective(cfg, head, features_from_tokens(head, batch["image"]), batch, grid)
    assert float(parts["n_pass"]) == 0
    for k in ("dice", "focal", "bce", "intra"):
        assert float(parts[k]) == 0.0, k


def test_adapter_bias_and_cls_only_pixel_loss():
    cfg = config_from_recipe(recipes.get("authors"), data="d", target="Brain", out="o")
    head = make_head(cfg, 12, 8, _unit(torch.randn(2, 8)), n_layers=2)
    assert all(lin.bias is None for ad in head.seg_adapters for lin in (ad.down, ad.up))
    # classification-only domain: with "none" no pixel loss on either class, with "normals" the normals count
    clean = config_from_recipe(recipes.get("clean"), data="d", target="Brain", out="o")
    batch, text, (w, e, layers, grid) = _sim_batch()
    from adsim.model.head import features_from_tokens
    batch["pixel_domain"] = torch.zeros(4)
    batch["has_mask"] = torch.tensor([1.0, 0.0, 1.0, 0.0])
    for choice, zero in (("none", True), ("normals", False)):
        c = clean._replace(cls_only_pixel_loss=choice)
        torch.manual_seed(0)
        head = make_head(c, w, e, text, n_layers=layers)
        _, parts = objective(c, head, features_from_tokens(head, batch["image"]), batch, grid)
        assert (float(parts["dice"]) == 0.0) == zero


def test_image_mean_unit_matches_two_features_per_image():
    cfg = config_from_recipe(recipes.override(recipes.get("clean"), gate_unit="image_mean", match_branches="seg"),
                             data="d", target="Brain", out="o")
    (_, parts), head = _objective(cfg)
    # 4 images: 4 normal means + 2 anomalous means (images 1 and 3 have a lesion patch) initialise the slots
    assert torch.all(head.centroids.init_pos[:2] == 1) and torch.all(head.centroids.init_neg[:2] == 1)
    assert torch.all(head.centroids.init_pos[2:] == 0)  # seg only: the det slots are never matched


# ---- bad input of every command -------------------------------------------------------------------

def _unwritable(tmp_path):
    # a folder below a regular file cannot be created, even by root (a chmod'ed folder can)
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    return blocker / "sub"


@pytest.mark.parametrize("argv", [
    ["make-toy-bmad", "{out}"],
    ["train", "--data", "{data}", "--target", "Brain", "--out", "{out}", "--backbone", "tiny"],
    ["protocol", "--simulate", "--quick", "--out", "{out}"],
    ["sweep", "--quick", "--out", "{out}"],
    ["figures", "--from", "{data}", "--out", "{out}"]])
def test_unwritable_out_is_one_line_error_before_work(argv, tmp_path, capsys):
    out = _unwritable(tmp_path)
    assert main([a.format(out=out, data=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "not writable" in err and len(err.splitlines()) == 1


def test_out_that_is_a_file_is_one_line_error(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    for argv in (["make-toy-bmad", str(f)], ["protocol", "--simulate", "--quick", "--out", str(f)],
                 ["figures", "--from", str(tmp_path), "--out", str(f)]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert "is not a folder" in err and len(err.splitlines()) == 1


def test_cli_unknown_recipe_or_field(tmp_path, capsys):
    for argv, msg in ((["--recipe", "nope"], "unknown recipe 'nope'; must be one of"),
                      (["--set", "gate_size=2"], "unknown recipe field 'gate_size'"),
                      (["--set", "gate_unit=pixel"], "gate_unit must be one of")):
        assert main(["protocol", "--simulate", "--quick", "--out", str(tmp_path / "p"), *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert msg in err and len(err.splitlines()) == 1
        assert main(["train", "--data", str(tmp_path), "--target", "Brain", "--out", str(tmp_path / "t"),
                     *argv]) == 2
        assert msg in capsys.readouterr().err


def test_corrupt_config_and_checkpoint_name_the_file(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text("{not json")
    assert main(["eval", "--run", str(run), "--data", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert str(run / "config.json") in err and "corrupt" in err
    from adsim.runtime.io import load_torch
    (run / "checkpoint_last.pt").write_bytes(b"\x00garbage")
    with pytest.raises(ValueError, match=f"checkpoint {run / 'checkpoint_last.pt'} is corrupt"):
        load_torch(run / "checkpoint_last.pt")


# ---- verdicts, shared metric cells, recipe summary ------------------------------------------------

def test_verdict_interval_is_scipys_one_sample_t_interval():
    from scipy import stats

    from poolsim import _verdict as verdict
    rng = __import__("numpy").random.default_rng(0)
    d = rng.normal(0.3, 1.0, 40)
    v = verdict.decide(d)
    ci = stats.ttest_1samp(d, 0.0).confidence_interval(0.95)  # independent implementation
    assert math.isclose(v.ci_low, ci.low, rel_tol=1e-9) and math.isclose(v.ci_high, ci.high, rel_tol=1e-9)
    assert verdict.decide(d + 5.0).verdict == verdict.HOLDS and verdict.decide(d - 5.0).verdict == verdict.DOES_NOT_HOLD
    assert verdict.decide(d - 5.0, side="less").verdict == verdict.HOLDS
    assert verdict.decide(d - d.mean()).verdict == verdict.INCONCLUSIVE  # interval around the threshold
    few = verdict.decide(d[:29] + 5.0)
    assert few.verdict == verdict.INCONCLUSIVE and math.isnan(few.ci_low)  # fewer than 30 pairs: no interval
    with pytest.raises(ValueError, match="paired"):
        verdict.decide(d, d[:3])


@pytest.mark.slow
def test_protocol_computes_provably_identical_metrics_once(tmp_path):
    from adsim.data import sim
    from adsim.experiments import protocol, sources
    params = sim.validate(sim.SimParams(n_train=4, n_test=6, n_layers=1))
    src = sources.simulated(params, 0)
    for name, over, shared in (("geo", {"loss_metric": "geodesic"}, True), ("clean", {}, False)):
        rec = recipes.as_dict(dataclasses.replace(recipes.override(recipes.get("clean"), **over), name=name))
        st = protocol.Settings(data="simulated", sim=params._asdict(), epochs=1, batch_size=16, lr=3e-3, recipe=rec)
        out = tmp_path / name
        protocol.run(out, lambda s: src, st, targets=["Chest"], methods=["match-l2", "match-geodesic"],
              orders=["hardest"], seeds=1, progress=False)
        l2 = json.loads((out / "cells" / "Chest__match-l2__hardest__cumulative__s0.json").read_text())
        geo = json.loads((out / "cells" / "Chest__match-geodesic__hardest__cumulative__s0.json").read_text())
        eq = json.loads((out / "protocol.json").read_text())["metric_equivalence"]
        if shared:
            assert l2["shared_with"] == "match-geodesic" and l2["rows"] == geo["rows"]
            assert eq["copies"] == {"match-l2": "match-geodesic"} and "increasing functions" in eq["why"]
        else:
            assert "shared_with" not in l2 and eq is None
    figs = tmp_path / "figs"
    assert main(["figures", "--from", str(tmp_path / "geo"), str(tmp_path / "clean"), "--out", str(figs)]) == 0
    summary = (figs / "recipes_summary.md").read_text()
    assert "| claim | geo | clean |" in summary and "identical by construction" in summary
    assert (figs / "geo" / "ad_table.md").is_file() and (figs / "clean" / "ad_table.md").is_file()


def test_simulator_default_test_set_has_power():
    from adsim.data import sim
    # Hanley-McNeil standard error of an AUC near 0.5 with n per class: sqrt((1/12)(2/n)) <= 1.3 points
    n = sim.SimParams().n_test
    assert n >= 1000 and 100 * math.sqrt((1 / 12) * (2 / n)) <= 1.3


def test_fixed_tau_gate_separates_the_metrics_that_the_adaptive_gate_cannot():
    from adsim.model.matching import match
    # f at angle 0.5 rad from c+ (and far from c-): geodesic 0.5, l2 = 2 sin(0.25) = 0.4948 (closed forms)
    f = torch.tensor([[math.cos(0.5), math.sin(0.5), 0.0]])
    c_pos, c_neg, one = torch.tensor([1.0, 0.0, 0.0]), torch.tensor([0.0, 0.0, 1.0]), torch.tensor(1.0)
    y, valid = torch.zeros(1), torch.ones(1)

    def accepted(metric, tau):
        return float(match(f, y, valid, c_pos, c_neg, one, one, metric=metric, tau=tau).acc_pos[0])
    assert accepted("geodesic", None) == accepted("l2", None) == 1.0  # adaptive: own centroid closer
    assert accepted("l2", 0.497) == 1.0 and accepted("geodesic", 0.497) == 0.0  # fixed radius: they differ


# The CLIP towers' activation each recipe's reference code runs (docs/recipes.md, column "activation"):
# exact GELU where the reference builds CLIP(**model_cfg) from a config without quick_gelu -- MVFA-AD and the
# Beyond-Pooling fork at 240 px (CLIP/clip.py create_model), APRIL-GAN at 518 px (open_clip factory), AdaCLIP
# (custom_clip.py); QuickGELU where the reference's block has it (AnomalyCLIP_lib/AnomalyCLIP.py
# ResidualAttentionBlock) or has no code (paper, bilora, mao) or is this project's default (clean): the OpenAI
# weights' own activation.
REFERENCE_QUICK_GELU = {"paper": True, "authors": False, "clean": True, "mvfa": False, "anomalyclip": True,
                        "aprilgan": False, "bilora": True, "adaclip": False, "mao": True}


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::adsim.model.backbone.RandomWeightsWarning")
def test_each_recipe_runs_its_references_activation_and_the_flag_overrides_it(toy_root, tmp_path):
    import open_clip

    from adsim.model.backbone import build_backbone

    assert {n: recipes.get(n).quick_gelu for n in recipes.names()} == REFERENCE_QUICK_GELU
    for quick in (True, False):
        bb = build_backbone("tiny", quick_gelu=quick)
        for tower in (bb.model.visual.transformer, bb.model.transformer):
            act = tower.resblocks[0].mlp.gelu
            assert isinstance(act, open_clip.transformer.QuickGELU) if quick else type(act) is torch.nn.GELU
    # the CLI: the recipe's value unless --quick-gelu / --no-quick-gelu says otherwise; recorded in config.json
    common = ["--data", str(toy_root), "--target", "Brain", "--backbone", "tiny", "--epochs", "1", "--device", "cpu",
              "--no-progress", "--train-domains", "Liver", "--compile", "off"]
    for extra, want in (([], False), (["--quick-gelu"], True)):
        out = tmp_path / f"run{len(extra)}"
        assert main(["train", "--recipe", "mvfa", *common, "--out", str(out), "--set", "select=last", *extra]) == 0
        assert json.loads((out / "config.json").read_text())["config"]["quick_gelu"] is want
