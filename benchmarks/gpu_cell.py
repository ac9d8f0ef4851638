"""One Table-1 cell end to end on the machine at hand, and the Table-1 grid's projected device-hours. Not a test.

A cell of ``python -m adsim table`` for a trained method is a leave-one-out ``train`` (every domain but the
target) followed by an evaluation of the target's test split. This script runs one such cell with the
default recipe (``clean``) in this process: it times every epoch (``adsim.training.train.train_epoch``,
wrapped here, with a device synchronisation on each side) and the evaluation, then projects the grid:

    cell seconds = epochs(recipe) x train images x s/train image + test images x s/test image

with the per-image costs measured here (the steady epochs: every epoch after the first, which carries the
warm-up and compilation) and the image counts of ``--data`` (a BMAD copy; without one, a toy copy is
generated and the projection is labelled as the toy's counts, which are not BMAD's). Every trained method
is projected at the default recipe's per-image cost (their step costs differ: ``benchmarks/adsim_baselines.py
--train-step`` measures them); training-free methods cost the evaluation only. The grid over ``--gpus``
GPUs of one machine (``--executor processes``: independent cells, one per GPU at a time) is the
longest-processing-time-first schedule of the cells (``heapq``), not the total divided by the GPU count.

    python benchmarks/gpu_cell.py --backbone ViT-L-14-336 --device cuda [--data BMAD] [--epochs 2]
        [--targets-file targets.txt] [--out /tmp/cell]

With random weights (no ``--checkpoint``) the AUCs are meaningless; the times are those of the real model.
"""
from __future__ import annotations

import argparse
import heapq
import json
import sys
import time
from pathlib import Path

# the grid's methods: every recipe except the paper's and the authors' variants of "clean", and the training-free ones
SKIP_RECIPES = ("paper", "authors")


def schedule_hours(cells: list[float], gpus: int) -> float:
    """Makespan in hours of independent ``cells`` (seconds) on ``gpus`` workers, longest first."""
    load = [0.0] * max(gpus, 1)
    for c in sorted(cells, reverse=True):
        heapq.heapreplace(load, load[0] + c)
    return max(load) / 3600


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backbone", default="ViT-L-14-336")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--data", default=None, help="a BMAD copy (default: a generated toy copy under --out)")
    ap.add_argument("--n-per-class", type=int, default=16, help="toy copy: images per class, domain and split")
    ap.add_argument("--size", type=int, default=256, help="toy copy: image side in pixels")
    ap.add_argument("--target", default="Liver")
    ap.add_argument("--recipe", default="clean")
    ap.add_argument("--epochs", type=int, default=2, help="epochs timed (>= 2: the first is the warm-up)")
    ap.add_argument("--batch-size", type=int, default=None, help="default: the recipe's")
    ap.add_argument("--gpus", type=int, default=None, help="GPUs of one machine (default: those visible)")
    ap.add_argument("--out", default="/tmp/adsim_cell")
    ap.add_argument("--targets-file", default=None, help="append name|measured|target|ok rows here")
    args = ap.parse_args(argv)
    if args.epochs < 2:
        ap.error("--epochs must be >= 2 (the first epoch is the warm-up)")

    import importlib

    import torch

    from adsim.config import recipes
    from adsim.config.run import config_from_recipe, train_domains_of, validate
    from adsim.data import bmad, make_toy_bmad
    from adsim.data.domains import DOMAINS
    from adsim.evaluation.evaluate import evaluate
    from adsim.methods import catalog
    from adsim.runtime.device import resolve_device

    T = importlib.import_module("adsim.training.train")  # the module (adsim.training.train is also a function)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = Path(args.data) if args.data else make_toy_bmad(out / "data", n_per_class=args.n_per_class,
                                                           size=args.size)
    counts_label = "BMAD copy at --data" if args.data else \
        f"TOY copy ({args.n_per_class} images per class, domain and split: NOT BMAD's counts)"
    device = resolve_device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    recipe = recipes.get(args.recipe)
    recipe = recipes.override(recipe, epochs=args.epochs, **({"batch_size": args.batch_size}
                                                           if args.batch_size else {}))
    run = out / "run"
    cfg = validate(config_from_recipe(recipe, data=str(data), target=args.target, out=str(run),
                                      backbone=args.backbone, seed=0, device=args.device))
    epoch_s: list[float] = []
    inner = T.train_epoch

    def timed_epoch(*a, **k):
        sync()
        t0 = time.perf_counter()
        res = inner(*a, **k)
        sync()
        epoch_s.append(time.perf_counter() - t0)
        return res

    T.train_epoch = timed_epoch  # the benchmark's own instrumentation; train() looks the name up per epoch
    t0 = time.perf_counter()
    T.train(cfg, progress=False)
    train_s = time.perf_counter() - t0
    T.train_epoch = inner
    t0 = time.perf_counter()
    evaluate(run, data, progress=False)
    eval_s = time.perf_counter() - t0

    def n_images(domain, splits):
        return sum(len(bmad.list_split(data, domain, s)) for s in splits)

    n_train = sum(n_images(d, cfg.train_splits) for d in train_domains_of(cfg))
    n_test = n_images(cfg.target, ("test",))
    steady = sorted(epoch_s[1:])[len(epoch_s[1:]) // 2]
    per_train, per_test = steady / n_train, eval_s / n_test
    cells = []
    for target in DOMAINS:
        others = [d for d in DOMAINS if d != target]
        test = n_images(target, ("test",))
        for m in recipes.names():
            if m not in SKIP_RECIPES:
                r = recipes.get(m)
                train_imgs = sum(n_images(d, r.train_splits) for d in others)
                cells.append(r.epochs * train_imgs * per_train + test * per_test)
        cells += [test * per_test for _ in catalog.zero_shot_names()]
    gpus = args.gpus or max(torch.cuda.device_count(), 1)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    rows = [(f"cell train ({args.recipe}, {args.backbone}, {device.type}): seconds per epoch, steady",
             f"{steady:.2f} s ({n_train} train images; first epoch {epoch_s[0]:.2f} s)"),
            ("cell eval: seconds", f"{eval_s:.2f} s ({n_test} test images)"),
            ("cell: train + eval seconds (this run)", f"{train_s + eval_s:.1f} s ({args.epochs} epochs)"),
            (f"Table-1 grid, {len(cells)} cells, projected hours on 1 GPU ({counts_label})",
             f"{schedule_hours(cells, 1):.2f} h"),
            (f"Table-1 grid, projected hours with --executor processes over {gpus} GPU(s)",
             f"{schedule_hours(cells, gpus):.2f} h")]
    print(f"device: {name}")
    for k, v in rows:
        print(f"{k}: {v}")
    (out / "cell.json").write_text(json.dumps({"device": name, "epoch_s": epoch_s, "eval_s": eval_s,
                                               "n_train": n_train, "n_test": n_test, "rows": rows}, indent=1))
    if args.targets_file:
        with open(args.targets_file, "a") as f:
            for k, v in rows:
                f.write(f"{k}|{v}|measured|yes\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
