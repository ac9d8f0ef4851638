"""BiLoRA through ``python -m adsim train / eval / predict / table``: the train loop's ``"sequential"`` schedule
(``adsim.methods.registry.Trainer.schedule``) on the toy BMAD data and the tiny backbone (random weights).

What is checked: each domain's phase sees only that domain's batches and trains only that domain's cores
(the earlier cores bitwise unchanged by the later phases); ``--resume`` from inside a domain and from a
domain boundary ends in the bitwise same state as the uninterrupted run; the run folder rebuilds through
``Detector.from_run`` (last and best checkpoint) for ``eval`` and ``predict``; the table runner trains it
leave-one-out beside the paper's ``BiLORA*`` row; a sequential trainer whose trained parameters change per
domain gets its compiled step rebuilt per domain, bilora (same parameters, new buffer values) keeps one
compiled graph per region for all domains; a compile failure falls back with one warning in all; bad
``Trainer`` schedules are refused."""
import json
import warnings

import pandas as pd
import pytest
import torch

from adsim.cli.main import main
from adsim.config import recipes
from adsim.config.run import config_from_recipe
from adsim.inference.detector import Detector
from adsim.methods import registry
from adsim.methods.baselines import bilora
from adsim.runtime.io import load_torch, read_json
from adsim.training import compiled_step
from adsim.training.train import train

pytestmark = pytest.mark.filterwarnings("ignore::adsim.model.backbone.RandomWeightsWarning")
DOMAINS = ("Liver", "Chest", "Retina_RESC")  # two masked domains and a classification-only one
# toy data (conftest: 2 normal + 2 anomalous images per domain and split) x the recipe's train_splits
# (valid, test) = 8 images per domain; batch 4 -> 2 steps per epoch; 2 epochs per domain
EPOCHS, BATCH, STEPS = 2, 4, 2
ARGS = ["--data", "{toy}", "--target", "Brain", "--train-domains", *DOMAINS, "--epochs", str(EPOCHS),
        "--batch-size", str(BATCH), "--backbone", "tiny", "--no-progress", "--device", "cpu", "--compile", "off"]


def _cores(head, domain):
    """Domain ``domain``'s cores, one per adapter weight."""
    return [bd.cores[domain] for bd in bilora.parametrizations(head)]


class Spy:
    """The bilora loss, recording per call the batch's domains, the number of domains started, whether
    exactly the newest domain's cores train, and copies of every earlier domain's cores; ``stop_at``: raise
    at that call (a killed run: the checkpoint of the last finished epoch stays)."""

    def __init__(self, stop_at=None):
        self.calls, self.stop_at = [], stop_at

    def __call__(self, cfg, head, feats, batch):
        if self.stop_at is not None and len(self.calls) + 1 == self.stop_at:
            raise KeyboardInterrupt("killed")
        self.head = head  # the live trained module: after the run, the trained head itself
        started = len(bilora.parametrizations(head)[0].cores)
        newest = {id(p) for p in _cores(head, started - 1)}
        self.calls.append({
            "domains": set(batch["domain"].tolist()), "started": started,
            "only_newest_trains": {id(p) for p in head.parameters() if p.requires_grad} == newest,
            "newest_is_zero": all(float(p.detach().abs().max()) == 0 for p in _cores(head, started - 1)),
            "earlier": [[c.detach().clone() for c in _cores(head, d)] for d in range(started - 1)]})
        return bilora.train_loss(cfg, head, feats, batch)


def _with_loss(monkeypatch, loss):
    monkeypatch.setitem(registry.TRAINERS, "bilora", registry.TRAINERS["bilora"]._replace(loss=loss))


def _args(toy_root, run, *extra):
    return ["train", "--recipe", "bilora", *[a.format(toy=toy_root) for a in ARGS], "--out", str(run), *extra]


@pytest.fixture(scope="module")
def reference(toy_root, tmp_path_factory):
    """The uninterrupted CLI run (checkpoint selection on held-out training data) and the spy's record."""
    run = tmp_path_factory.mktemp("bilora") / "run"
    spy = Spy()
    with pytest.MonkeyPatch.context() as mp:
        _with_loss(mp, spy)
        assert main(_args(toy_root, run, "--select-heldout", "0.25")) == 0
    return run, spy


def _final_head(run, checkpoint="last"):
    return Detector.from_run(run, checkpoint=checkpoint, device="cpu").method.head


@pytest.mark.slow
def test_each_phase_sees_one_domain_and_trains_only_its_cores(reference):
    run, spy = reference
    head = _final_head(run)
    # held-out selection takes a quarter of the images out, so a domain has 1 or 2 steps per epoch
    per_domain = [sum(1 for c in spy.calls if c["started"] == d + 1) for d in range(len(DOMAINS))]
    assert all(EPOCHS <= n <= EPOCHS * STEPS for n in per_domain), per_domain
    assert [c["started"] for c in spy.calls] == sorted(c["started"] for c in spy.calls)  # domains in order
    for c in spy.calls:
        assert c["domains"] == {c["started"] - 1}  # batch["domain"]: the index into cfg.train_domains
        assert c["only_newest_trains"]
    firsts = [next(c for c in spy.calls if c["started"] == d + 1) for d in range(len(DOMAINS))]
    assert all(c["newest_is_zero"] for c in firsts)  # every domain's update starts at 0
    for c in spy.calls:  # every earlier core, seen during a later phase, is bitwise its final value
        for d, cores in enumerate(c["earlier"]):
            assert all(torch.equal(core, final) for core, final in zip(cores, _cores(head, d)))
    for d in range(len(DOMAINS)):  # and each domain's update did train
        assert any(float(core.detach().abs().max()) > 0 for core in _cores(head, d))
    hist = read_json(run / "history.json")
    assert [(e["domain"], e["domain_index"], e["epoch"]) for e in hist["history"]] == \
        [(name, d, e) for d, name in enumerate(DOMAINS) for e in range(EPOCHS)]
    assert read_json(run / "config.json")["schedule"] == "sequential"


@pytest.mark.slow
@pytest.mark.parametrize("stop", [(1, 0), (1, 1)], ids=["at-domain-boundary", "inside-a-domain"])
def test_resume_mid_sequence_ends_in_the_uninterrupted_state(reference, toy_root, tmp_path, monkeypatch, stop):
    """Killed at the first step of (domain, epoch) ``stop``; ``--resume`` then continues from the last
    finished epoch -- (0, last epoch): the next domain must start; (1, 0): inside domain 1, optimiser state
    loaded -- and must end bitwise where the uninterrupted run ended (state, optimiser, history, best)."""
    ref, _ = reference
    hist = read_json(ref / "history.json")["history"]
    before = [e for e in hist if (e["domain_index"], e["epoch"]) < stop]
    run = tmp_path / "run"
    with monkeypatch.context() as mp:
        _with_loss(mp, Spy(stop_at=sum(e["steps"] for e in before) + 1))
        with pytest.raises(KeyboardInterrupt):
            main(_args(toy_root, run, "--select-heldout", "0.25"))
    killed = load_torch(run / "checkpoint_last.pt")
    assert (killed["domain"], killed["epoch"]) == (before[-1]["domain_index"], before[-1]["epoch"])
    assert main(_args(toy_root, run, "--select-heldout", "0.25", "--resume")) == 0
    got, want = load_torch(run / "checkpoint_last.pt"), load_torch(ref / "checkpoint_last.pt")
    assert got["head"].keys() == want["head"].keys()
    assert all(torch.equal(got["head"][k], want["head"][k]) for k in want["head"])
    assert got["history"] == want["history"] and got["best"] == want["best"]
    assert (got["domain"], got["epoch"]) == (len(DOMAINS) - 1, EPOCHS - 1)
    adam = [(s["step"], s["exp_avg"], s["exp_avg_sq"]) for s in got["optimizer"]["state"].values()]
    ref_adam = [(s["step"], s["exp_avg"], s["exp_avg_sq"]) for s in want["optimizer"]["state"].values()]
    assert len(adam) == len(ref_adam) and all(torch.equal(a, b) for x, y in zip(adam, ref_adam) for a, b in zip(x, y))


@pytest.mark.slow
def test_eval_and_predict_rebuild_the_run_from_its_folder(reference, toy_root, tmp_path):
    run, _ = reference
    last = load_torch(run / "checkpoint_last.pt")["head"]
    method = Detector.from_run(run, checkpoint="last", device="cpu").method
    assert isinstance(method, registry.HeadMethod) and method.name == "bilora"
    assert method.head.state_dict().keys() == last.keys()
    assert all(torch.equal(v, last[k]) for k, v in method.head.state_dict().items())
    # the best checkpoint (held-out selection) holds the domains started when it was written
    best = read_json(run / "history.json")["best"]
    best_head = _final_head(run, "best")
    assert len(bilora.parametrizations(best_head)[0].cores) == best["domain_index"] + 1
    assert bilora.domains_in(load_torch(run / "checkpoint_best.pt")["head"]) == best["domain_index"] + 1
    assert main(["eval", "--run", str(run), "--data", str(toy_root), "--no-progress", "--device", "cpu"]) == 0
    m = read_json(run / "metrics.json")
    assert m["method"] == "bilora" and 0 <= m["image_auc"] <= 100 and 0 <= m["pixel_auc"] <= 100
    image = next((toy_root / "Brain_AD" / "test" / "Ungood" / "img").glob("*.png"))
    assert main(["predict", "--run", str(run), "--out", str(tmp_path / "pred"), str(image), "--device", "cpu"]) == 0
    assert len(pd.read_csv(tmp_path / "pred" / "scores.csv")) == 1


def _scores(method, x):
    with torch.inference_mode():
        out = method.eval()(x)
    return out.scores, out.maps


def _trained(run, spy):
    """``(cfg, the trained head as a method, the backbone)``: the live head of the run (the spy kept it)."""
    loaded = Detector.from_run(run, checkpoint="last", device="cpu")
    cfg = loaded.info["config"]
    return cfg, bilora.as_method(cfg, loaded.method.backbone, spy.head), loaded.method.backbone


def _other_draw(monkeypatch):
    """draw_support as a torch release whose randperm sequence differs would give: other frequencies."""
    draw = bilora.draw_support
    monkeypatch.setattr(bilora, "draw_support", lambda m, n, rank, seed, domain, slot:
                        draw(m, n, rank, seed + 7, domain, slot))


def _supports(head):
    return {k: v for k, v in head.state_dict().items() if k.rsplit(".", 1)[-1] in bilora.SUPPORTS}


@pytest.mark.slow
def test_a_reloaded_head_scores_bitwise_like_the_trained_one(reference, monkeypatch):
    run, spy = reference
    cfg, trained, backbone = _trained(run, spy)
    x = torch.rand(3, 3, 64, 64, generator=torch.Generator().manual_seed(11))
    want = _scores(trained, x)
    # the global torch RNG in another state and draw_support giving other frequencies at load: the saved
    # supports are used, so the reloaded head scores bitwise like the trained head
    torch.manual_seed(12345)
    torch.rand(1000)
    _other_draw(monkeypatch)
    again = Detector.from_run(run, checkpoint="last", device="cpu").method
    got = _scores(again, x)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    saved = load_torch(run / "checkpoint_last.pt")["head"]
    assert len(_supports(again.head)) == 2 * len(bilora.parametrizations(again.head))
    assert all(torch.equal(v, saved[k]) for k, v in _supports(again.head).items())
    # what this draw gives differs from the trained supports (so the checks above can fail)
    fresh = bilora.bilora_head(cfg, backbone, read_json(run / "config.json")["prompts"])
    for d in range(len(DOMAINS)):
        bilora.start_domain(cfg, fresh, d)
    assert any(not torch.equal(v, saved[k]) for k, v in _supports(fresh).items())


def _per_domain_layout(state: dict) -> dict:
    """``state`` rewritten in the per-domain layout without supports (what bilora saved before the supports
    and the fixed-size storage): ``cores.<t>`` = ``bank[t]`` for the finished domains and ``core`` for the
    last started one; ``bank``, ``core``, ``started`` and the supports dropped."""
    out = {}
    for key, value in state.items():
        prefix, _, name = key.rpartition(".")
        if name == "started":
            for t in range(int(value)):
                out[f"{prefix}.cores.{t}"] = state[f"{prefix}.core"] if t == int(value) - 1 else state[f"{prefix}.bank"][t]
        elif name not in ("bank", "core", *bilora.SUPPORTS):
            out[key] = value
    return out


@pytest.mark.slow
def test_a_checkpoint_without_saved_supports_loads_with_a_warning(reference, tmp_path, monkeypatch):
    run, spy = reference
    cfg, trained, backbone = _trained(run, spy)
    x = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(12))
    want = _scores(trained, x)
    old = tmp_path / "old-run"
    old.mkdir()
    for name in ("config.json", "history.json"):
        (old / name).write_text((run / name).read_text())
    ckpt = load_torch(run / "checkpoint_last.pt")
    # saved the way a bilora checkpoint was saved before the supports were part of the state: one parameter
    # per domain (cores.<t>) and no supports
    ckpt["head"] = _per_domain_layout(ckpt["head"])
    assert not any(k.rsplit(".", 1)[-1] in bilora.SUPPORTS for k in ckpt["head"])
    assert sum(k.endswith(".cores.2") for k in ckpt["head"]) == len(bilora.parametrizations(spy.head))
    torch.save(ckpt, old / "checkpoint_last.pt")
    with pytest.warns(bilora.SupportsRederivedWarning, match="re-derived from the run's seed 0") as rec:
        method = Detector.from_run(old, checkpoint="last", device="cpu").method
    ours = [str(w.message) for w in rec if w.category is bilora.SupportsRederivedWarning]
    assert len(ours) == 1 and str(old / "checkpoint_last.pt") in ours[0] and "cannot be proven equal" in ours[0]
    got = _scores(method, x)  # this torch draws what the run drew: equal here
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    # where the draw differs (another randperm sequence) the re-derived head scores differently: why it warns
    _other_draw(monkeypatch)
    with pytest.warns(bilora.SupportsRederivedWarning):
        other = Detector.from_run(old, checkpoint="last", device="cpu").method
    assert not torch.equal(_scores(other, x)[0], want[0])
    # a state loaded straight into a head (the train loop's --resume) warns too, once
    head = bilora.bilora_head(cfg, backbone, read_json(run / "config.json")["prompts"])
    for d in range(len(DOMAINS)):
        bilora.start_domain(cfg, head, d)
    with pytest.warns(bilora.SupportsRederivedWarning, match="without saved frequency supports") as rec:
        head.load_state_dict(ckpt["head"])
    assert sum(w.category is bilora.SupportsRederivedWarning for w in rec) == 1


@pytest.mark.slow
def test_a_state_of_another_method_is_refused(reference, tiny):
    run, _ = reference
    cfg = config_from_recipe(recipes.get("bilora"), data="", target="Brain", out="")
    record = read_json(run / "config.json")
    with pytest.raises(ValueError, match="not a bilora state"):
        bilora.load(cfg, tiny, record, {"fc.0.weight": torch.zeros(2, 2)})
    state = dict(load_torch(run / "checkpoint_last.pt")["head"])
    state.pop("det_adapters.0.up.parametrizations.weight.0.bank")
    with pytest.raises(ValueError, match="does not fit the bilora head"):
        bilora.load(cfg, tiny, record, state)


def test_table_trains_it_leave_one_out_beside_the_paper_row(toy_root, tmp_path):
    from adsim.data import reference as paper
    from adsim.experiments import table

    assert table.method_kind("bilora") == "trained"
    out = tmp_path / "table"
    table.run(out, toy_root, methods=["bilora"], targets=["Liver"], shots=[0], backbone="tiny", epochs=1,
              batch_size=8, progress=False)
    run = out / "runs" / "Liver" / "bilora"
    cfg = json.loads((run / "config.json").read_text())["config"]
    assert cfg["method"] == "bilora" and "Liver" not in cfg["train_domains"]  # leave-one-out
    # one phase per training domain, in cfg.train_domains order
    assert [e["domain"] for e in read_json(run / "history.json")["history"]] == cfg["train_domains"]
    df = pd.read_csv(out / "table.csv")
    assert {"bilora k=0 AC", "bilora k=0 AS", "paper-reported BiLORA* AC"} <= set(df.columns)
    # the paper's Table 1 row "BiLORA*" (adsim/data/reference.py)
    assert df["paper-reported BiLORA* AC"][0] == paper.TABLE1["BiLORA*"][("Liver", "AC")]


def test_a_trainer_schedule_is_checked_when_registered():
    trainer = registry.TRAINERS["bilora"]
    with pytest.raises(ValueError, match=r"trainer schedule must be one of \('pooled', 'sequential'\), got 'shuffled'"):
        registry.register_trainer("x_bad", trainer._replace(schedule="shuffled"))
    with pytest.raises(ValueError, match="'sequential' needs a callable start_domain"):
        registry.register_trainer("x_bad", trainer._replace(start_domain=None))
    assert "x_bad" not in registry.TRAINERS
    assert registry.Trainer(*trainer[:4]).schedule == "pooled"  # the default: the other methods' loop


class _Backend:
    """A torch.compile backend: ``aot_eager`` counting the graphs it compiled, or failing at every compile."""

    def __init__(self, fail=False):
        from torch._dynamo.backends.registry import lookup_backend
        self.inner, self.fail, self.graphs = lookup_backend("aot_eager"), fail, 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        if self.fail:
            raise RuntimeError("injected compiler failure")
        return self.inner(gm, example_inputs)


class _PerDomain(torch.nn.Module):
    """A minimal sequential trainer's module: one weight vector per started domain, the newest one trained."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.ParameterList()


def _start(cfg, module, index):
    for p in module.w:
        p.requires_grad_(False)
    module.w.append(torch.nn.Parameter(torch.full((3,), 0.1 * (index + 1))))


def _toy_forward(module, backbone, images):
    return images.mean((2, 3)) @ sum(module.w)  # (B,): every started domain's weights


def _toy_loss(cfg, module, out, batch):
    loss = ((out - batch["label"].float()) ** 2).mean()
    return loss, {"mse": loss.detach()}


TOY = registry.Trainer(build=lambda cfg, backbone: _PerDomain(), forward=_toy_forward, loss=_toy_loss,
                       method=None, schedule="sequential", start_domain=_start)


def _api_run(toy_root, out, compile_mode, trainer=TOY, epochs=1, resume=False, domains=2):
    """A run on ``domains`` domains (``epochs`` each); ``trainer`` in place of bilora's (the generic schedule)."""
    r = recipes.override(recipes.get("bilora"), epochs=epochs, batch_size=BATCH)
    cfg = config_from_recipe(r, data=str(toy_root), out=str(out), target="Brain", train_domains=DOMAINS[:domains],
                             backbone="tiny", seed=0, device="cpu")
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(registry.TRAINERS, "bilora", trainer)
        return train(cfg, progress=False, compile_mode=compile_mode, resume=resume)


def test_resume_with_more_epochs_continues_from_the_checkpoints_domain(toy_root, tmp_path):
    """A finished 1-epoch-per-domain run resumed with ``--epochs 2``: only the checkpoint's domain (the
    last) trains on, to 2 epochs; the earlier domain keeps its 1 epoch and its weights."""
    run = _api_run(toy_root, tmp_path / "run", None)
    w0 = load_torch(run / "checkpoint_last.pt")["head"]["w.0"]
    _api_run(toy_root, run, None, epochs=2, resume=True)
    hist = read_json(run / "history.json")["history"]
    assert [(e["domain_index"], e["epoch"]) for e in hist] == [(0, 0), (1, 0), (1, 1)]
    assert torch.equal(load_torch(run / "checkpoint_last.pt")["head"]["w.0"], w0)


@pytest.fixture(scope="module")
def eager_run(toy_root, tmp_path_factory):
    return _api_run(toy_root, tmp_path_factory.mktemp("eager") / "run", None)


@pytest.mark.slow
def test_the_compiled_step_is_rebuilt_per_domain_and_trains_like_eager(eager_run, toy_root, tmp_path, monkeypatch):
    """Graph capture + AOTAutograd (``aot_eager``) of a minimal sequential trainer: a fresh pair of compiled
    regions per domain (the trained parameters change), the eager run's weights within the compile tests'
    float32 tolerance (tests/adsim/test_adsim_compile.py docstring)."""
    backend = _Backend()
    monkeypatch.setattr(compiled_step, "BACKEND", backend)
    run = _api_run(toy_root, tmp_path / "run", "default")
    # the forward and the loss region of each of the 2 domains: 4 graphs (the last batch has the same shape)
    assert backend.graphs == 2 * 2
    assert "compile_failed" not in read_json(run / "config.json")["execution"]
    got, want = (load_torch(r / "checkpoint_last.pt")["head"] for r in (run, eager_run))
    assert got.keys() == want.keys() == {"w.0", "w.1"}
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-7, msg=k)
    assert not torch.equal(want["w.1"], torch.full((3,), 0.2))  # domain 1's weights trained


@pytest.mark.slow
def test_a_compile_failure_falls_back_once_for_all_domains(eager_run, toy_root, tmp_path, monkeypatch):
    """A failing backend: one CompileFallbackWarning in the whole run (the later domains train eagerly
    without trying again), recorded in config.json, and the eager run's weights bitwise (nothing ran twice)."""
    backend = _Backend(fail=True)
    monkeypatch.setattr(compiled_step, "BACKEND", backend)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        run = _api_run(toy_root, tmp_path / "run", "default")
    fallbacks = [w for w in rec if issubclass(w.category, compiled_step.CompileFallbackWarning)]
    assert len(fallbacks) == 1 and backend.graphs == 1
    assert read_json(run / "config.json")["execution"]["compile_failed"] is True
    got, want = (load_torch(r / "checkpoint_last.pt")["head"] for r in (run, eager_run))
    assert all(torch.equal(got[k], want[k]) for k in want)


@pytest.mark.slow
def test_bilora_compiles_once_for_all_domains_and_trains_like_eager(toy_root, tmp_path, monkeypatch):
    """bilora's own trainer (parametrised adapter weights, frozen tower) compiled with ``aot_eager`` over
    three domains: two graphs in all -- the forward and the loss region, traced at the first domain and
    reused by the next two (starting a domain writes buffers; nothing dynamo guards on changes) -- and the
    eager run's head within the compile tests' tolerance (~60 s on 2 shared CPU cores: dynamo traces the
    tiny tower once)."""
    from torch._dynamo.utils import counters

    trainer = registry.TRAINERS["bilora"]
    eager = _api_run(toy_root, tmp_path / "eager", None, trainer, domains=3)
    backend = _Backend()
    monkeypatch.setattr(compiled_step, "BACKEND", backend)
    counters.clear()
    run = _api_run(toy_root, tmp_path / "run", "default", trainer, domains=3)
    # 8 toy images per domain at batch 4: no smaller last batch, so one shape per region
    assert [e["domain_index"] for e in read_json(run / "history.json")["history"]] == [0, 1, 2]
    assert backend.graphs == 2, backend.graphs
    assert counters["stats"]["unique_graphs"] == 2 and not counters["recompiles"], dict(counters["recompiles"])
    assert "compile_failed" not in read_json(run / "config.json")["execution"]
    got, want = (load_torch(r / "checkpoint_last.pt")["head"] for r in (run, eager))
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-4, atol=1e-6, msg=k)
