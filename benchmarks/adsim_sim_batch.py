"""Cost of the authors' batch size (1) in the SIMULATED protocol, against the simulator's 32.

One protocol training step as ``adsim.experiments.protocol.run_cell`` runs it (authors recipe, match-geodesic-vaca,
one pass over one modality's training split of the default simulator: 2 x n_train = 48 images), timed
at each batch size in the same process (wall and process CPU seconds; best of ``--repeat``). The ratio
is what a protocol cell costs more at that batch size, since a cell is these steps plus scoring.

    PYTHONPATH=$PWD python benchmarks/adsim_sim_batch.py [--batch-sizes 32 1] [--repeat 2]
"""
from __future__ import annotations

import argparse
import os
import platform
import time

import torch

from adsim.config import recipes
from adsim.config.run import config_from_recipe
from adsim.data import sim
from adsim.experiments import protocol, sources
from adsim.model.head import make_head
from adsim.training.train import make_optimizer, train_epoch


def one_pass(source, recipe, batch_size: int) -> tuple:
    spec = protocol.METHODS["match-geodesic-vaca"]
    rec = recipes.override(recipe, method=spec["method"], metric=spec["metric"], vaca=spec["vaca"], epochs=1,
                     batch_size=batch_size, lr=3e-3)
    cfg = config_from_recipe(rec, data="simulated", target="Brain", out="", seed=0, precision="fp32")
    torch.manual_seed(0)
    head = make_head(cfg, source.width, source.embed_dim, source.text, n_layers=source.n_layers)
    opt, scaler = make_optimizer(cfg, head), torch.amp.GradScaler("cpu", enabled=False)
    batches = source.train_batches(["Liver"], batch_size, 0)
    w, c = time.perf_counter(), time.process_time()
    train_epoch(cfg, head, opt, scaler, batches, lambda x: source.forward(head, x), source.grid,
                torch.device("cpu"), None)
    return time.perf_counter() - w, time.process_time() - c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-sizes", nargs="+", type=int, default=[32, 1])
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(1)  # as the protocol runs
    source = sources.simulated(sim.SimParams(), 0)
    recipe = recipes.get("authors")
    one_pass(source, recipe, args.batch_sizes[0])  # warm-up (JIT of the sequential gate)
    res = {}
    for bs in args.batch_sizes:
        res[bs] = min((one_pass(source, recipe, bs) for _ in range(args.repeat)), key=lambda t: t[1])
    base = res[args.batch_sizes[0]]
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}, "
          f"torch {torch.__version__}; one pass over 48 simulated images, authors recipe, match-geodesic-vaca")
    for bs, (wall, cpu) in res.items():
        print(f"batch {bs:3d}: wall {wall:7.2f} s, cpu {cpu:7.2f} s, cpu x{cpu / base[1]:.1f} of batch "
              f"{args.batch_sizes[0]}")


if __name__ == "__main__":
    main()
