"""BiLoRA through ``python -m adsim train / eval / predict / table``: the train loop's ``"sequential"`` schedule
(``adsim.methods.registry.Trainer.schedule``) on the toy BMAD data and the tiny backbone (random weights).

What is checked: each domain's phase sees only that domain's batches and trains only that domain's cores
(the earlier cores bitwise unchanged by the later phases); ``--resume`` from inside a domain and from a
domain boundary ends in the bitwise same state as the uninterrupted run; the run folder rebuilds through
``Detector.from_run`` (last and best checkpoint) for ``eval`` and ``predict``; the table runner trains it
leave-one-out beside the paper's ``BiLORA*`` row; the compiled step is rebuilt per domain and falls back
with one warning in all; bad ``Trainer`` schedules are refused."""
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
