"""Inference and training-step cost of the baselines: images/s of one ``Method.forward`` for the adapter head
(``naive``, the MVFA-AD recipe's method), WinCLIP (exact masked-token windows), AnomalyCLIP, APRIL-GAN, AdaCLIP and
Mao et al. (prototypes of the 5 source domains of a Brain run), and
(``--train-step``) one training step (forward, loss, backward, no optimiser step) of the head and of every
registered trainer, on random-weight backbones (timing only: no AUC means anything here). Not part of the tests.

The methods alternate call by call (fair on a shared machine); the table reports the median of ``--iters``
timed calls after one warm-up, each under ``torch.inference_mode()``, and the ratio to the head.

    PYTHONPATH=$PWD python benchmarks/adsim_baselines.py                    # tiny + ViT-B-16, CPU
    PYTHONPATH=$PWD python benchmarks/adsim_baselines.py --backbones ViT-L-14-336 --device cuda --write
    PYTHONPATH=$PWD python benchmarks/adsim_baselines.py --train-step --write        # training steps
"""
from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from montecarlo import machine_info, write_section  # noqa: E402

from adsim.config import recipes  # noqa: E402
from adsim.config.prompts import prompt_ensemble  # noqa: E402
from adsim.config.run import TrainConfig, config_from_recipe  # noqa: E402
from adsim.methods import (
    catalog,  # noqa: E402
    registry,  # noqa: E402
)
from adsim.methods.baselines import adaclip, anomalyclip, aprilgan, bilora, mao  # noqa: E402
from adsim.model.backbone import RandomWeightsWarning, build_backbone  # noqa: E402
from adsim.model.head import make_head, text_embeddings


BILORA_DOMAINS = 5  # the protocol's five added domains


def bilora_head(backbone, cfg, device):
    """The naive head with :data:`BILORA_DOMAINS` domains' BiLoRA updates (nonzero cores: the weights are
    recomputed from all of them at every forward, as in the protocol)."""
    spec = backbone.spec
    head = make_head(cfg, spec.width, spec.embed_dim, text_embeddings(backbone, prompt_ensemble())).to(device)
    bilora.attach(head)
    for t in range(BILORA_DOMAINS):
        for p in bilora.add_domain(head, t, seed=0):
            p.data.normal_(0.0, 1e-3)
    return head


def recipe_config(name: str):
    """The training config of method ``name``: its own recipe where it has one (its prompt set), else ``clean``'s."""
    if name in recipes.names():
        return config_from_recipe(recipes.get(name), data="d", out="o", target="Brain")
    return TrainConfig(data="d", target="Brain", out="o", method=name)


def methods(backbone, device):
    cfg = TrainConfig(data="d", target="Brain", out="o", method="naive", vaca=False)
    spec = backbone.spec
    head = make_head(cfg, spec.width, spec.embed_dim, text_embeddings(backbone, prompt_ensemble())).to(device)
    return {"naive (head)": registry.HeadMethod(backbone, head, scoring="logit_max", name="naive").eval(),
            "winclip": catalog.zero_shot("winclip")(backbone),
            "anomalyclip": anomalyclip.AnomalyCLIP(backbone, anomalyclip.PromptLearner(backbone).to(device)).eval(),
            "aprilgan": aprilgan.APRILGAN(backbone, aprilgan.build_maps(cfg, backbone).to(device)).eval(),
            "adaclip": adaclip.AdaCLIP(backbone, adaclip.build_prompts(recipe_config("adaclip"), backbone).to(device)).eval(),
            "adaclip (kmeans=torch)": adaclip.AdaCLIP(backbone, adaclip.build_prompts(
                recipe_config("adaclip")._replace(kmeans="torch"), backbone).to(device)).eval(),
            "mao": mao.Mao(backbone, mao.build_prototypes(cfg, backbone).to(device)).eval(),
            "bilora (head + 5 domains' updates)": registry.HeadMethod(backbone, bilora_head(backbone, cfg, device),
                                                                      scoring="logit_max", name="bilora").eval()}


def train_steps(backbone, device, batch: int) -> dict:
    """``name -> step()``: forward + loss + backward of one batch (random images, half anomalous with a square
    mask) for the adapter head (``naive``: ``features`` + ``objective``) and every registered trainer."""
    from adsim.model.head import features
    from adsim.model.objective import objective

    s, spec = backbone.spec.image_size, backbone.spec
    gen = torch.Generator().manual_seed(0)
    mask = torch.zeros(batch, s, s)
    mask[batch // 2:, s // 4: s // 2, s // 4: s // 2] = 1.0
    data = {"image": torch.rand(batch, 3, s, s, generator=gen), "mask": mask,
            "has_mask": torch.ones(batch), "label": (torch.arange(batch) >= batch // 2).float(),
            "pixel_domain": torch.ones(batch), "domain": torch.arange(batch) % 5}
    data = {k: v.to(device) for k, v in data.items()}
    steps = {}
    cfg = TrainConfig(data="d", target="Brain", out="o", method="naive", vaca=False)
    head = make_head(cfg, spec.width, spec.embed_dim, text_embeddings(backbone, prompt_ensemble())).to(device).train()

    def head_step():
        loss, _ = objective(cfg, head, features(backbone, head, data["image"]), data, spec.grid)
        loss.backward()
    steps["naive (head)"] = head_step
    variants = [(name, trainer, recipe_config(name)) for name, trainer in sorted(registry.TRAINERS.items())]
    variants += [("adaclip (kmeans=torch)", registry.TRAINERS["adaclip"],  # HSF's KMeans on the device
                  recipe_config("adaclip")._replace(kmeans="torch"))]
    for name, trainer, tcfg in variants:
        module = trainer.build(tcfg, backbone).to(device).train()
        if trainer.schedule == "sequential":  # BiLoRA: the step of the 5th domain (four frozen updates before it)
            for t in range(BILORA_DOMAINS):
                trainer.start_domain(tcfg, module, t)
            name = f"{name} ({BILORA_DOMAINS}th domain)"

        def step(trainer=trainer, module=module, tcfg=tcfg):
            loss, _ = trainer.loss(tcfg, module, trainer.forward(module, backbone, data["image"]), data)
            loss.backward()
        steps[name] = step
    return steps


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def alternating_times(calls: dict, device, iters: int) -> dict:
    """``{label: [seconds]}``: one warm-up call of each, then ``iters`` rounds calling them in turn, so that
    a change of machine load hits every method alike."""
    for f in calls.values():
        f()
    times = {k: [] for k in calls}
    for _ in range(iters):
        for k, f in calls.items():
            sync(device)
            t = time.perf_counter()
            f()
            sync(device)
            times[k].append(time.perf_counter() - t)
    return times


def table_rows(name: str, backbone, times: dict, batch: int) -> list:
    """One table row per method: median ms of a batch, images/s, and the ratio to the head's median."""
    base = statistics.median(times["naive (head)"])
    out = []
    for k, v in times.items():
        med = statistics.median(v)
        out.append(f"| {name} ({backbone.spec.image_size} px, grid {backbone.spec.grid}) | {k} | {1000 * med:.1f} | "
                   f"{batch / med:.1f} | {med / base:.2f}x |")
    return out


def main(argv=None) -> str:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backbones", nargs="+", default=["tiny", "ViT-B-16"])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--write", action="store_true", help="replace the section in benchmarks/RESULTS.md")
    ap.add_argument("--train-step", action="store_true", help="time training steps instead of inference")
    args = ap.parse_args(argv)
    if args.train_step:
        return report(
            args, argv, lambda backbone, device: train_steps(backbone, device, args.batch), "training step of a batch",
            "steps after one warm-up (forward, loss, backward; no optimiser step)",
            "The head's step runs the adapters inside the tower (gradient through the later frozen blocks); "
            "AnomalyCLIP's runs the frozen visual tower without gradient and the text tower with it (learned "
            "prompts); APRIL-GAN's runs the frozen tower without gradient and four linear maps with it; Mao et "
            "al.'s runs it without gradient and only the prototypes with it.",
            "adsim baselines: training-step cost (benchmarks/adsim_baselines.py --train-step)")

    def forwards(backbone, device):
        s = backbone.spec.image_size
        x = torch.rand(args.batch, 3, s, s, generator=torch.Generator().manual_seed(0)).to(device)
        return {k: functools.partial(m, x) for k, m in methods(backbone, device).items()}
    return report(
        args, argv, forwards, "forward of a batch", "calls after one warm-up",
        "WinCLIP runs the whole ViT once per window (exact masked-token windows: 2 x 2 and 3 x 3 at stride 1, "
        "each sequence 1 + k^2 tokens) besides the full image; AnomalyCLIP's text embeddings are computed once, "
        "so its forward is the frozen ViT plus four projections.",
        "adsim baselines: inference cost (benchmarks/adsim_baselines.py)", inference=True)


def report(args, argv, calls, what: str, timed: str, notes: str, section: str, *, inference: bool = False) -> str:
    """Time ``calls(backbone, device) -> {name: call}`` on every ``--backbones`` (methods alternating; under
    ``torch.inference_mode()`` when ``inference``), print the table of ``what`` with the machine, the
    command and ``notes``, and with ``--write`` replace ``section`` of benchmarks/RESULTS.md with it."""
    device = torch.device(args.device)
    load0 = os.getloadavg()[0]
    torch.set_num_threads(1) if device.type == "cpu" else None
    rows = []
    for name in args.backbones:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RandomWeightsWarning)
            backbone = build_backbone(name, device=device)
        timed_calls = calls(backbone, device)
        with torch.inference_mode(inference):
            times = alternating_times(timed_calls, device, args.iters)
        rows += table_rows(name, backbone, times, args.batch)
    table = (f"| backbone | method | {what} [ms] | images/s | time / head |\n|---|---|---:|---:|---:|\n"
             + "\n".join(rows))
    body = (f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {machine_info()}; torch {torch.__version__}, "
            f"device {device}, {'1 torch thread' if device.type == 'cpu' else ''}; batch {args.batch}, median of "
            f"{args.iters} {timed}, methods alternating. Random weights (timing only). 1-minute load average "
            f"{load0:.1f} at start, {os.getloadavg()[0]:.1f} at end.\n\n{table}\n\n"
            f"Command: `PYTHONPATH=$PWD python benchmarks/adsim_baselines.py {' '.join(argv or sys.argv[1:])}`. "
            + notes)
    if args.write:
        write_section(str(ROOT / "benchmarks" / "RESULTS.md"), section, body)
    print(body)
    return body


if __name__ == "__main__":
    main()
