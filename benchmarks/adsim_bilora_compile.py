"""BiLoRA's compiled training step across its domains: graphs compiled per domain and compile seconds per
domain, in a process with a cold compile cache and in a second process with the warm cache. Not a test.

Each measurement is a child process (``--child``) that runs ``adsim.training.train.train`` for the
``bilora`` recipe on toy data (``--domains`` training domains, one epoch each, one batch shape) with
``compile_mode=--mode``; both children share one fresh ``POOLSIM_CACHE_DIR`` (``adsim.runtime.compile_cache``),
so the first fills the inductor cache (cold) and the second reads it (warm). At every domain's start and
at the end the child reads dynamo's unique-graph count (``torch._dynamo.utils.counters["stats"]``) and its
cumulative compile time (``torch._dynamo.utils.compile_times``, ``_compile.compile_inner``: tracing, AOT
autograd and the backend, cache loads included). Expected: the first domain compiles the forward and the
loss region (2 graphs), every later domain 0 (``adsim.methods.baselines.bilora``: the domain index is a
buffer); warm compile seconds well below cold ones (issue target for ViT-L on a GPU: <= 10 s).

Prints one line per process and appends ``name|measured|target|ok`` rows to ``--targets``.

    python benchmarks/adsim_bilora_compile.py [--backbone tiny] [--device cpu] [--mode default]
        [--domains 3] [--batch 4] [--timeout 300] [--targets targets.txt]

(on a CUDA GPU: ``--backbone ViT-L-14-336 --device cuda --mode auto``; ``benchmarks/gpu_session.sh``, section bl)
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOMAINS = ("Liver", "Chest", "Retina_RESC", "Retina_OCT2017", "Histopathology")  # training domains, target Brain


def _compile_seconds() -> float:
    from torch._dynamo.utils import compile_times

    names, values = compile_times(repr="csv", aggregate=True)
    return float(dict(zip(names, values)).get("_compile.compile_inner", 0.0))


def child(args) -> int:
    """One process: train bilora compiled, recording graphs and compile seconds at every domain start."""
    import warnings

    import torch
    from torch._dynamo.utils import counters

    from adsim.config import recipes
    from adsim.config.run import config_from_recipe
    from adsim.methods import catalog, registry
    from adsim.training.train import train

    warnings.simplefilter("ignore")  # random-weights and compile notices: this prints its own line
    catalog.trainer("bilora")  # registers the built-in methods
    marks = []

    def mark():
        marks.append({"graphs": int(counters["stats"]["unique_graphs"]), "compile_s": _compile_seconds(),
                      "t": time.perf_counter()})

    trainer = registry.TRAINERS["bilora"]

    def start_domain(cfg, head, index):
        mark()
        trainer.start_domain(cfg, head, index)

    registry.TRAINERS["bilora"] = trainer._replace(start_domain=start_domain)
    r = recipes.override(recipes.get("bilora"), epochs=1, batch_size=args.batch)
    cfg = config_from_recipe(r, data=args.data, out=str(Path(args.child).parent / "run"), target="Brain",
                             train_domains=DOMAINS[:args.domains], backbone=args.backbone, device=args.device,
                             image_size=args.image_size, seed=0)
    t0 = time.perf_counter()
    run = train(cfg, progress=False, compile_mode=args.mode)
    mark()
    execution = json.loads((run / "config.json").read_text())["execution"]
    per = [{"graphs": b["graphs"] - a["graphs"], "compile_s": b["compile_s"] - a["compile_s"], "wall_s": b["t"] - a["t"]}
           for a, b in zip(marks, marks[1:])]
    Path(args.child).write_text(json.dumps({"domains": per, "wall_s": time.perf_counter() - t0,
                                            "execution": execution, "torch": torch.__version__}))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backbone", default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--mode", default="default", help="train's compile_mode (default, reduce-overhead, auto)")
    ap.add_argument("--domains", type=int, default=3, choices=range(2, len(DOMAINS) + 1))
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--image-size", type=int, default=None)
    ap.add_argument("--timeout", type=float, default=300, help="seconds per process")
    ap.add_argument("--warm-target", type=float, default=10.0, help="seconds of compilation allowed warm")
    ap.add_argument("--targets", default=None, help="file to append name|measured|target|ok rows to")
    ap.add_argument("--data", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)
    rows = []

    def row(text):
        rows.append(text)
        if args.targets:  # row by row: a cut run keeps its rows
            with open(args.targets, "a") as f:
                f.write(text + "\n")

    with tempfile.TemporaryDirectory(prefix="bilora_compile_") as tmp:
        tmp = Path(tmp)
        sys.path.insert(0, str(ROOT))
        from adsim.data.toy import make_toy_bmad

        # toy data: n normal + n anomalous per domain and split, valid + test = 4 n images per domain;
        # n = batch / 2 gives exactly two full batches per domain (one batch shape: no recompile for it)
        data = make_toy_bmad(tmp / "data", n_per_class=max(1, args.batch // 2), size=64, seed=1)
        env = {**os.environ, "POOLSIM_CACHE_DIR": str(tmp / "cache"), "PYTHONPATH": str(ROOT)}
        compiled = {}  # process -> compile seconds
        for name in ("cold", "warm"):
            out = tmp / name / "result.json"
            out.parent.mkdir()
            cmd = [sys.executable, __file__, "--child", str(out), "--data", str(data), "--backbone", args.backbone,
                   "--device", args.device, "--mode", args.mode, "--domains", str(args.domains),
                   "--batch", str(args.batch)] + (["--image-size", str(args.image_size)] if args.image_size else [])
            t0 = time.perf_counter()
            try:
                p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
                rc, log = p.returncode, p.stdout + p.stderr
            except subprocess.TimeoutExpired:
                rc, log = 124, f"timed out after {args.timeout:.0f} s"
            wall = time.perf_counter() - t0
            if rc != 0 or not out.is_file():
                print(f"bilora compile, {name} cache: exit {rc} after {wall:.0f} s\n{log[-3000:]}", flush=True)
                row(f"bilora compiled train, {name} cache ({args.backbone}, {args.mode})|exit {rc}|exit 0|NO")
                break
            res = json.loads(out.read_text())
            graphs = [d["graphs"] for d in res["domains"]]
            secs = [d["compile_s"] for d in res["domains"]]
            fell = bool(res["execution"].get("compile_failed"))
            print(f"bilora compile, {name} cache ({args.backbone}, {args.device}, mode {args.mode}, "
                  f"{args.domains} domains): graphs compiled per domain {graphs}, compile s per domain "
                  f"{[round(s, 1) for s in secs]}, total compile {sum(secs):.1f} s, train {res['wall_s']:.1f} s, "
                  f"process {wall:.1f} s{', FELL BACK to eager' if fell else ''}", flush=True)
            if name == "cold":
                later = sum(graphs[1:])
                row(f"bilora: graphs compiled by domains 2..{args.domains} ({args.backbone}, {args.mode})|"
                            f"{later} (first domain {graphs[0]})|0|{'yes' if later == 0 and not fell else 'NO'}")
            else:
                row(f"bilora: warm second-process compile time ({args.backbone}, {args.mode})|"
                            f"{sum(secs):.1f} s (cold {compiled['cold']:.1f} s)|<= {args.warm_target:g} s|"
                            f"{'yes' if sum(secs) <= args.warm_target and not fell else 'NO'}")
            compiled[name] = sum(secs)
    return 0 if rows and all(r.endswith("|yes") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
