"""Inference cost of the baselines: images/s of one ``Method.forward`` for the adapter head (``naive``, the
MVFA-AD recipe's method), WinCLIP (exact masked-token windows), AnomalyCLIP and BiLoRA (the naive head with
five domains' BiLoRA updates, ``adsim.methods.baselines.bilora``), on random-weight backbones (timing only:
no AUC means anything here); and the training-step cost of the head and of BiLoRA's step (``--train``:
forward, the naive objective, backward, Adam). Not part of the tests.

The methods alternate call by call (fair on a shared machine); the table reports the median of ``--iters``
timed calls after one warm-up, each under ``torch.inference_mode()``, and the ratio to the head.

    PYTHONPATH=$PWD python benchmarks/adsim_baselines.py                    # tiny + ViT-B-16, CPU
    PYTHONPATH=$PWD python benchmarks/adsim_baselines.py --backbones ViT-L-14-336 --device cuda --write
"""
from __future__ import annotations

import argparse
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

from adsim.config.prompts import prompt_ensemble  # noqa: E402
from adsim.config.run import TrainConfig  # noqa: E402
from adsim.methods import (
    catalog,  # noqa: E402
    registry,  # noqa: E402
)
from adsim.methods.baselines import anomalyclip, bilora  # noqa: E402
from adsim.model.backbone import RandomWeightsWarning, build_backbone  # noqa: E402
from adsim.model.head import features, make_head, text_embeddings  # noqa: E402
from adsim.model.objective import objective  # noqa: E402

BILORA_DOMAINS = 5  # the protocol's last step: four frozen domains' updates and the current one


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


def methods(backbone, device):
    cfg = TrainConfig(data="d", target="Brain", out="o", method="naive", vaca=False)
    spec = backbone.spec
    head = make_head(cfg, spec.width, spec.embed_dim, text_embeddings(backbone, prompt_ensemble())).to(device)
    return {"naive (head)": registry.HeadMethod(backbone, head, scoring="logit_max", name="naive").eval(),
            "winclip": catalog.zero_shot("winclip")(backbone),
            "anomalyclip": anomalyclip.AnomalyCLIP(backbone, anomalyclip.PromptLearner(backbone).to(device)).eval(),
            "bilora (head + 5 domains' updates)": registry.HeadMethod(backbone, bilora_head(backbone, cfg, device),
                                                                      scoring="logit_max", name="bilora").eval()}


def train_steps(backbone, device, batch: int) -> dict:
    """``{label: step function}``: one training step of the naive head and of BiLoRA's last protocol step
    (only the current domain's cores train) on a random batch."""
    cfg = TrainConfig(data="d", target="Brain", out="o", method="naive", vaca=False)
    spec = backbone.spec
    gen = torch.Generator().manual_seed(1)
    s = spec.image_size
    data = {"image": torch.rand(batch, 3, s, s, generator=gen).to(device),
            "mask": (torch.rand(batch, s, s, generator=gen) < 0.1).float().to(device),
            "has_mask": torch.ones(batch, device=device),
            "label": (torch.arange(batch) % 2).float().to(device)}
    heads = {"naive (head)": make_head(cfg, spec.width, spec.embed_dim,
                                       text_embeddings(backbone, prompt_ensemble())).to(device),
             "bilora (5th domain)": bilora_head(backbone, cfg, device)}
    out = {}
    for label, head in heads.items():
        params = [p for p in head.parameters() if p.requires_grad]
        opt = torch.optim.Adam(params, lr=cfg.lr, betas=cfg.betas)

        def step(head=head, opt=opt):
            loss, _ = objective(cfg, head, features(backbone, head, data["image"]), data, spec.grid)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        out[label] = step
    return out


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def main(argv=None) -> str:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backbones", nargs="+", default=["tiny", "ViT-B-16"])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--write", action="store_true", help="replace the section in benchmarks/RESULTS.md")
    ap.add_argument("--train", action="store_true", help="also time one training step (head, BiLoRA)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    load0 = os.getloadavg()[0]
    torch.set_num_threads(1) if device.type == "cpu" else None
    rows = []
    for name in args.backbones:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RandomWeightsWarning)
            backbone = build_backbone(name, device=device)
        ms = methods(backbone, device)
        s = backbone.spec.image_size
        x = torch.rand(args.batch, 3, s, s, generator=torch.Generator().manual_seed(0)).to(device)
        times = {k: [] for k in ms}
        with torch.inference_mode():
            for m in ms.values():
                m(x)  # warm-up
            for _ in range(args.iters):
                for k, m in ms.items():
                    sync(device)
                    t = time.perf_counter()
                    m(x)
                    sync(device)
                    times[k].append(time.perf_counter() - t)
        if args.train:
            steps = train_steps(backbone, device, args.batch)
            for k, fn in steps.items():
                fn()  # warm-up
                times[f"training step: {k}"] = []
            for _ in range(args.iters):
                for k, fn in steps.items():
                    sync(device)
                    t = time.perf_counter()
                    fn()
                    sync(device)
                    times[f"training step: {k}"].append(time.perf_counter() - t)
        base = statistics.median(times["naive (head)"])
        base_train = statistics.median(times["training step: naive (head)"]) if args.train else None
        for k, v in times.items():
            med = statistics.median(v)
            ref = base_train if k.startswith("training step") else base
            rows.append(f"| {name} ({s} px, grid {backbone.spec.grid}) | {k} | {1000 * med:.1f} | "
                        f"{args.batch / med:.1f} | {med / ref:.2f}x |")
    table = ("| backbone | method | forward (or training step) of a batch [ms] | images/s | time / head's |\n|---|---|---:|---:|---:|\n"
             + "\n".join(rows))
    body = (f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {machine_info()}; torch {torch.__version__}, "
            f"device {device}, {'1 torch thread' if device.type == 'cpu' else ''}; batch {args.batch}, median of "
            f"{args.iters} calls after one warm-up, methods alternating. Random weights (timing only). 1-minute load "
            f"average {load0:.1f} at start, {os.getloadavg()[0]:.1f} at end.\n\n{table}\n\n"
            f"Command: `PYTHONPATH=$PWD python benchmarks/adsim_baselines.py {' '.join(argv or sys.argv[1:])}`. "
            "WinCLIP runs the whole ViT once per window (exact masked-token windows: 2 x 2 and 3 x 3 at stride 1, "
            "each sequence 1 + k^2 tokens) besides the full image; AnomalyCLIP's text embeddings are computed once, "
            "so its forward is the frozen ViT plus four projections; BiLoRA's forward is the head's with every adapter "
            "weight recomputed as W0 + the five domains' bilinear DCT updates. Training-step rows (--train) compare "
            "with the head's training step.")
    if args.write:
        write_section(str(ROOT / "benchmarks" / "RESULTS.md"), "adsim baselines: inference cost "
                      "(benchmarks/adsim_baselines.py)", body)
    print(body)
    return body


if __name__ == "__main__":
    main()
