"""Time (and optionally profile) ONE simulated protocol cell per recipe (issue 12). Not part of the tests.

A cell is what ``python -m adsim protocol --simulate`` computes per (target, method, order, mode, seed):
``adsim.experiments.protocol.run_cell`` on ``adsim.experiments.sources.simulated``, the recipe's own protocol mode and batch
size (``authors``: batch 1, as figures/adsim/README.md runs it; the others: the simulator's 32), the
simulator's lr. Each (code, recipe) runs in a fresh process that computes the same cell ``--repeats``
times: the first run includes JAX's import and compilation (once per process and input shape, as in a
protocol run's first cell), the later ones are the steady-state per-cell time of a protocol run.

``--code DIR`` (repeatable, ``label=DIR``) times other checkouts of the packages (e.g. the commit
before a change: ``git archive BASE adsim poolsim | tar -x -C /tmp/base``) in the same run, and the
cells' AUCs are compared between them (a speed-up must not change a result).
``--profile N`` prints cProfile's top N functions (internal time) of the last repeat per process.

    PYTHONPATH=$PWD python benchmarks/adsim_protocol_cell.py --recipes authors clean \\
        --code before=/tmp/base [--n-train 24 --n-test 1000 --epochs 1] [--profile 15]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def worker(a) -> dict:
    import torch

    from adsim.cli.protocol import SIM_TRAINING
    from adsim.config import recipes
    from adsim.data import sim
    from adsim.experiments import protocol, sources

    rec = recipes.get(a.recipe)
    params = sim.validate(sim.SimParams()._replace(n_train=a.n_train, n_test=a.n_test))
    bs = rec.batch_size if a.recipe == "authors" else SIM_TRAINING["batch_size"]
    settings = protocol.Settings(recipe=recipes.as_dict(rec), data="simulated", sim=params._asdict(), epochs=a.epochs,
                          batch_size=bs, lr=SIM_TRAINING["lr"])
    torch.set_num_threads(1)  # as protocol.run
    src = sources.simulated(params, a.seed)
    times, aucs, prof = [], [], None
    for _ in range(a.repeats):
        prof = cProfile.Profile() if a.profile else None
        t0 = time.perf_counter()
        if prof:
            prof.enable()
        cell = protocol.run_cell(src, settings, a.target, a.method, "hardest", rec.protocol_mode, a.seed,
                          ("AC", "AS"))
        if prof:
            prof.disable()
        times.append(time.perf_counter() - t0)
        aucs.append([r["auc"] for r in cell["rows"]])
    text = ""
    if prof:
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(a.profile)
        buf2 = io.StringIO()
        pstats.Stats(prof, stream=buf2).sort_stats("cumulative").print_stats(a.profile)
        text = buf.getvalue() + buf2.getvalue()
    return {"times": times, "aucs": aucs, "mode": rec.protocol_mode,
            "batch_size": bs, "profile": text}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipes", nargs="+", default=["authors", "clean"])
    ap.add_argument("--method", default="match-geodesic")
    ap.add_argument("--target", default="Brain")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-train", type=int, default=24)
    ap.add_argument("--n-test", type=int, default=1000)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--profile", type=int, default=0)
    ap.add_argument("--code", action="append", default=[], metavar="LABEL=DIR")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(argparse.Namespace(**{**vars(a), "recipe": a.worker}))))
        return
    codes = [("this", str(ROOT))] + [tuple(c.split("=", 1)) for c in a.code]
    res = {}
    for recipe in a.recipes:
        for label, path in codes[::-1]:  # the other checkouts first, this one last
            cmd = [sys.executable, __file__, "--worker", recipe] + [
                f"--{k.replace('_', '-')}={v}" for k, v in vars(a).items()
                if k in ("method", "target", "seed", "n_train", "n_test", "epochs", "repeats", "profile")]
            env = {**os.environ, "PYTHONPATH": path, "JAX_PLATFORMS": "cpu"}
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, cwd=path)
            res[recipe, label] = json.loads(out.stdout.strip().splitlines()[-1])
            r = res[recipe, label]
            print(f"\n== {recipe} [{label}: {path}] mode {r['mode']}, batch {r['batch_size']}: "
                  f"cell seconds {', '.join(f'{t:.2f}' for t in r['times'])}")
            if r["profile"]:
                print(r["profile"])
    print(f"\n{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, 1-minute load average {os.getloadavg()[0]:.2f}; cell: target "
          f"{a.target}, {a.method}, hardest, seed {a.seed}, n_train {a.n_train}, n_test {a.n_test}, "
          f"epochs {a.epochs}")
    print("| recipe | code | first cell [s] (with JAX compile) | steady cell [s] | steady / this | "
          "max abs AUC difference to 'this' [pp] | repeats bit-identical |")
    print("|---|---|---:|---:|---:|---:|---|")
    for (recipe, label), r in res.items():
        this = res[recipe, "this"]
        diff = max(abs(x - y) for a, b in zip(r["aucs"], this["aucs"]) for x, y in zip(a, b))
        steady = min(r["times"][1:] or r["times"])
        ratio = steady / min(this["times"][1:] or this["times"])
        print(f"| {recipe} | {label} | {r['times'][0]:.2f} | {steady:.2f} | {ratio:.2f} | {diff:.2g} | "
              f"{'yes' if all(a == r['aucs'][0] for a in r['aucs']) else 'NO'} |")


if __name__ == "__main__":
    main()
