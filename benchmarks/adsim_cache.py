"""Frozen-trunk cache (issue 14, item 2): epoch time with and without ``--trunk-cache``, and the cache's
RAM cost. Not part of the tests.

Measures, in one run and on this machine, one training epoch of ``adsim.training.train.train_epoch`` on a
SIMULATED toy BMAD (``adsim.data.toy``, random-weight backbone) for

* ``images``: the ordinary path (decode + resize the PNGs, the whole interleaved forward), and
* ``cached``: the trunk tokens computed once (``adsim.training.cache.build_trunk_cache``), epochs start at the
  first adapter;

the two alternate epoch by epoch (a fair comparison on a shared machine); the table reports medians
over the epochs after the first and the one-off cache build time. Both runs start from the same seed and
must log the same losses (checked, printed). Then it computes the cache size
``n_images x (1 + N) x W x 4 bytes`` (+ ``S x S`` bytes per mask) for the real backbones -- from
open_clip's model configs, nothing is downloaded -- and, with ``--bmad DIR``, the image counts of a
real BMAD copy in the MVFA layout (per zero-shot target: valid + test of the other five domains).

    python benchmarks/adsim_cache.py                          # tiny backbone, CPU, ~1-2 minutes
    python benchmarks/adsim_cache.py --bmad /data/bmad        # + exact cache sizes for that copy
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import open_clip
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from montecarlo import machine_info, write_section  # noqa: E402

from adsim.config.choices import BACKBONES  # noqa: E402
from adsim.config.prompts import prompt_ensemble
from adsim.config.run import TrainConfig  # noqa: E402
from adsim.data import bmad  # noqa: E402
from adsim.data.domains import DOMAINS, SPLITS
from adsim.data.toy import make_toy_bmad  # noqa: E402
from adsim.model.backbone import RandomWeightsWarning, build_backbone
from adsim.model.head import adapter_bottlenecks, features, make_head, text_embeddings
from adsim.model.head import features_from_bottlenecks as _score  # noqa: E402
from adsim.runtime import distributed  # noqa: E402
from adsim.training.cache import build_trunk_cache  # noqa: E402
from adsim.training.train import make_optimizer, train_epoch

TITLE = "adsim frozen-trunk cache (CPU, tiny backbone)"


def cache_bytes_per_image(name: str) -> tuple:
    """``(tokens (1 + N), width W, image size S, bytes per image)`` of ``adsim.training.cache`` for a backbone."""
    cfg_name, size = BACKBONES[name]
    if name == "tiny":
        from adsim.model.backbone import _register_tiny
        _register_tiny()
    vision = open_clip.get_model_config(cfg_name)["vision_cfg"]
    n_tokens = 1 + (size // vision["patch_size"]) ** 2
    return n_tokens, vision["width"], size, n_tokens * vision["width"] * 4 + size * size


def bmad_counts(root) -> dict:
    """Images per domain (valid + test) of a BMAD copy in the MVFA layout."""
    return {d: sum(len(bmad.list_split(root, d, s)) for s in SPLITS) for d in DOMAINS}


def _run(args, root):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RandomWeightsWarning)  # random weights by design: timing only
        backbone = build_backbone("tiny", seed=0)
    spec, device = backbone.spec, torch.device("cpu")
    cfg = TrainConfig(data=str(root), target="Brain", out="", backbone="tiny", batch_size=args.batch_size)
    samples = [s for d in DOMAINS if d != "Brain" for sp in SPLITS for s in bmad.list_split(root, d, sp)]
    images = bmad.ImageDataset(samples, spec.image_size)
    t0, c0 = time.perf_counter(), time.process_time()
    cache = build_trunk_cache(backbone, images, device=device, batch_size=args.batch_size)
    build_s = (time.perf_counter() - t0, time.process_time() - c0)
    text = text_embeddings(backbone, prompt_ensemble())
    runs = {}
    for mode, dataset, forward in (
            ("images", images, lambda head: (lambda x: features(backbone, head, x))),
            ("cached", cache, lambda head: (lambda x: _score(head, *adapter_bottlenecks(backbone, head, x))))):
        torch.manual_seed(0)
        head = make_head(cfg, spec.width, spec.embed_dim, text)
        runs[mode] = {"dataset": dataset, "head": head, "opt": make_optimizer(cfg, head), "fwd": forward(head),
                      "seconds": [], "cpu": [], "losses": []}
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    for epoch in range(args.epochs):
        for r in runs.values():  # alternate: both modes see the same machine load
            loader = torch.utils.data.DataLoader(r["dataset"], batch_size=args.batch_size,
                                                 sampler=distributed.sampler(r["dataset"], 0, epoch, distributed.world()))
            t0, c0 = time.perf_counter(), time.process_time()
            out = train_epoch(cfg, r["head"], r["opt"], scaler, loader, r["fwd"], spec.grid, device, None)
            r["seconds"].append(time.perf_counter() - t0)
            r["cpu"].append(time.process_time() - c0)
            r["losses"].append(out["loss"])
    return len(samples), build_s, runs


def run(args) -> str:
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        root = make_toy_bmad(Path(tmp) / "toy", n_per_class=args.n_per_class, size=args.image_px, seed=0)
        n, build_s, runs = _run(args, root)
    img, cached = (statistics.median(runs[m]["seconds"][1:]) for m in ("images", "cached"))
    img_cpu, cached_cpu = (statistics.median(runs[m]["cpu"][1:]) for m in ("images", "cached"))
    same = runs["images"]["losses"] == runs["cached"]["losses"]
    lines = [f"Measured {time.strftime('%Y-%m-%d')} on {machine_info()}, torch {torch.__version__}, "
             f"{args.threads} torch thread(s); "
             f"load average at the end {open('/proc/loadavg').read().split()[0]} (shared machine).",
             f"Command: `python benchmarks/adsim_cache.py --epochs {args.epochs} --n-per-class {args.n_per_class} "
             f"--image-px {args.image_px} --batch-size {args.batch_size}`.",
             f"SIMULATED toy BMAD (`adsim.data.toy`, {args.image_px} px PNGs resized to 64 px), {n} training images "
             f"(target Brain), tiny backbone (4 blocks, width 64, random weights), batch {args.batch_size}, "
             f"matching + VACA. Medians over epochs 2..{args.epochs}; the two modes alternate epoch by epoch.",
             "CPU time (this process, one thread) is the steadier figure on a shared machine.",
             "", "| mode | epoch wall (s) | ratio | epoch CPU (s) | ratio |", "|---|---:|---:|---:|---:|",
             f"| images (decode + full forward) | {img:.3f} | 1.00 | {img_cpu:.3f} | 1.00 |",
             f"| cached trunk tokens | {cached:.3f} | {cached / img:.2f} | {cached_cpu:.3f} | {cached_cpu / img_cpu:.2f} |",
             f"| one-off cache build | {build_s[0]:.3f} | {build_s[0] / img:.2f} | {build_s[1]:.3f} | "
             f"{build_s[1] / img_cpu:.2f} |", "",
             "Every epoch, wall s, images / cached: "
             + ", ".join(f"{a:.2f} / {c:.2f}" for a, c in zip(runs["images"]["seconds"], runs["cached"]["seconds"]))
             + ".",
             f"Per-epoch losses identical with and without the cache: {same} "
             f"({', '.join(f'{x:.6f}' for x in runs['cached']['losses'])}).", "",
             "Cache cost per image: `(1 + N) x W x 4 B` float32 tokens + `S x S` B mask "
             "(from open_clip's model configs):", "",
             "| backbone | image px | tokens 1 + N | width W | MB / image | GB per 10,000 images |",
             "|---|---:|---:|---:|---:|---:|"]
    for name in ("tiny", "ViT-B-16", "ViT-L-14-336"):
        tok, width, size, b = cache_bytes_per_image(name)
        lines.append(f"| {name} | {size} | {tok} | {width} | {b / 1e6:.3f} | {b * 1e4 / 1e9:.1f} |")
    if args.bmad:
        counts = bmad_counts(args.bmad)
        per = cache_bytes_per_image("ViT-L-14-336")[3]
        lines += ["", f"BMAD copy at `{args.bmad}` (valid + test per domain): {counts}.", "",
                  "| zero-shot target | training images | ViT-L-14-336 cache (GB) |", "|---|---:|---:|"]
        for target in DOMAINS:
            k = sum(v for d, v in counts.items() if d != target)
            lines.append(f"| {target} | {k} | {k * per / 1e9:.1f} |")
    else:
        lines += ["", "No BMAD copy was available here (no network, no data), so its image counts were not "
                  "measured: the cache of one zero-shot run holds the valid + test images of the five training "
                  "domains; multiply their number by the MB / image above (or rerun with `--bmad DIR`)."]
    lines += ["", "Under torchrun every rank holds the whole cache (RAM x number of processes per node). "
              "The trunk is only blocks 0..adapter_layers[0] (1 of 4 tiny blocks; 6 of 24 ViT-L blocks), so "
              "on a GPU the saving is mainly image decoding/resizing plus a quarter of the frozen forward."]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--n-per-class", type=int, default=16)
    ap.add_argument("--image-px", type=int, default=256, help="size of the toy PNGs on disk")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--bmad", default=None, help="a real BMAD copy (MVFA layout) to count images in")
    ap.add_argument("--results", default=str(ROOT / "benchmarks" / "RESULTS.md"))
    args = ap.parse_args(argv)
    if args.epochs < 2:
        ap.error("--epochs must be >= 2 (the first epoch is not counted)")
    body = run(args)
    print(body)
    if args.results:
        write_section(args.results, TITLE, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
