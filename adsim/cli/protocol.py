"""Argument parsing and dispatch for ``python -m adsim {protocol,sweep,figures}``.

Parsing needs only plain-Python modules; torch and the experiment code load inside :func:`main` and the
helpers it calls, so ``--help`` answers at once.
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path
from typing import Any, TypedDict

from adsim.cli import cluster as cluster_cli
from adsim.config import protocol as protocol_choices
from adsim.config import recipes
from adsim.data.simparams import SimParams

# Training per protocol step, simulated data: chosen once on the NAIVE method's fit to its *training*
# domains (loss plateau, training-domain AUC in the range of the paper's real AUCs), never on a target
# or on a comparison of methods. --quick: one seed, fewer images and passes.
class _Training(TypedDict):
    """Training settings of one protocol step: passes over the data, batch size, learning rate."""

    epochs: int
    batch_size: int
    lr: float


SIM_TRAINING: _Training = {"epochs": 3, "batch_size": 32, "lr": 3e-3}
QUICK = {"seeds": 1, "epochs": 2, "n_train": 16, "n_test": 24}
REAL_TRAINING: _Training = {"epochs": 1, "batch_size": 8, "lr": 1e-4}  # lr of the reference set-up


def add_parsers(sub) -> None:
    pr = sub.add_parser("protocol", help="leave-one-out domain addition (AUC after each step, DA score)")
    src = pr.add_mutually_exclusive_group(required=True)
    src.add_argument("--data", help="BMAD in the MVFA layout (real images)")
    src.add_argument("--simulate", action="store_true", help="SIMULATED token features (adsim.data.sim)")
    pr.add_argument("--out", required=True)
    pr.add_argument("--targets", nargs="+", default=None, help="default: every available modality")
    pr.add_argument("--methods", nargs="+", default=list(protocol_choices.METHODS), help=f"of {tuple(protocol_choices.METHODS)}")
    pr.add_argument("--orders", nargs="+", default=list(protocol_choices.ORDERS), help=f"of {protocol_choices.ORDERS}")
    pr.add_argument("--mode", default=None, help=f"one of {protocol_choices.MODES} (default: the recipe's protocol_mode)")
    pr.add_argument("--tasks", nargs="+", default=None,
                    help="AC and/or AS (default: AC everywhere, AS where masks exist)")
    pr.add_argument("--seeds", type=int, default=None, help="number of seeds (default 3; --quick: 1)")
    _common(pr)
    pr.add_argument("--backbone", default="ViT-L-14-336", help="real data: backbone (tiny for tests)")
    pr.add_argument("--checkpoint", default=None, help="real data: local open_clip weights")
    pr.add_argument("--random-weights", action="store_true",
                    help="real data without --checkpoint: build the backbone with RANDOM weights anyway (tests, "
                         "timing: the AUCs are meaningless); without this flag such a run stops at once. "
                         "--backbone tiny is random without asking")
    pr.add_argument("--image-size", type=int, default=None)
    cluster_cli.add_args(pr)

    sw = sub.add_parser("sweep", help="SIMULATED protocol under one-at-a-time simulator parameter changes")
    sw.add_argument("--out", required=True)
    sw.add_argument("--targets", nargs="+", default=None, help="default: every modality")
    sw.add_argument("--methods", nargs="+", default=["naive", "match-geodesic-vaca"])
    sw.add_argument("--seeds", type=int, default=1)
    _common(sw)
    cluster_cli.add_args(sw)

    fg = sub.add_parser("figures", help="ad_final, ad_ablation, ad_modality_gap, ad_variance, ad_table.md")
    fg.add_argument("--from", dest="src", required=True, nargs="+",
                    help="a protocol --out folder; several (one per recipe): OUT/<recipe>/ each and "
                         "OUT/recipes_summary.md")
    fg.add_argument("--sweep", default=None,
                    help="a sweep --out folder (adds ad_sensitivity.png and sensitivity.md)")
    fg.add_argument("--out", required=True)


def _common(p) -> None:
    p.add_argument("--recipe", default="clean", help=f"one of {recipes.names()} (docs/recipes.md)")
    p.add_argument("--set", nargs="+", default=[], metavar="FIELD=VALUE",
                   help="override recipe fields, e.g. gate_mode=batched loss_metric=geodesic")
    p.add_argument("--quick", action="store_true", help=f"simulated: {QUICK}")
    p.add_argument("--sim", nargs="+", default=[], metavar="NAME=VALUE",
                   help=f"simulator parameters, of {SimParams._fields} (inf allowed)")
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--no-progress", dest="progress", action="store_false")


def sim_params(pairs, quick: bool) -> SimParams:
    """``["shared=0.3", ...]`` -> validated :class:`SimParams` (quick sizes first, then the overrides)."""
    from adsim.data import sim  # torch: loaded when a command runs, not for --help

    over: dict[str, Any] = {k: QUICK[k] for k in ("n_train", "n_test")} if quick else {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or name not in SimParams._fields:
            raise ValueError(f"--sim expects NAME=VALUE with NAME in {SimParams._fields}, got {pair!r}")
        try:
            over[name] = float("inf") if value.strip().lower() == "inf" else ast.literal_eval(value)
        except (ValueError, SyntaxError):
            raise ValueError(f"--sim {name}: cannot parse value {value!r}") from None
    return sim.validate(SimParams()._replace(**over))


def _settings(args, data: str, params):
    """The protocol's :class:`adsim.experiments.protocol.Settings` of the parsed ``args``."""
    from adsim.experiments import protocol  # torch: loaded when a command runs, not for --help

    base = SIM_TRAINING if params is not None else REAL_TRAINING
    epochs = args.epochs or (QUICK["epochs"] if args.quick and params is not None else base["epochs"])
    recipe = recipes.override(recipes.get(args.recipe), **recipes.parse_sets(args.set))
    if recipe.method not in ("naive", "match"):  # the protocol trains the adapter head only
        raise ValueError(f"the protocol runs the adapter head (naive / match); recipe {args.recipe!r} trains "
                         f"{recipe.method!r}: use python -m adsim train / eval for it")
    return protocol.Settings(recipe=recipes.as_dict(recipe),
                      data=data, sim=params._asdict() if params is not None else None, epochs=epochs,
                      batch_size=args.batch_size or base["batch_size"], lr=args.lr or base["lr"],
                      backbone=getattr(args, "backbone", None) if params is None else None,
                      checkpoint=getattr(args, "checkpoint", None) if params is None else None,
                      image_size=getattr(args, "image_size", None) if params is None else None)


def main(args) -> str:
    """Run one of the three commands; returns a one-line summary. Bad input raises ``ValueError``."""
    # the experiment code and torch load here, once a command runs (not for --help)
    from adsim.experiments import protocol, sources
    from adsim.experiments.figures import make_figures, recipes_summary, sweep_figures
    from adsim.experiments.sweep import sweep
    from adsim.runtime.files import check_writable
    from adsim.runtime.io import read_json
    from poolsim.io import atomic_write_text

    check_writable(args.out)  # before any work
    if args.command == "figures":
        if len(args.src) == 1:
            written = make_figures(args.src[0], args.out, sweep_dir=args.sweep)
            return f"wrote {len(written)} files to {args.out}: {', '.join(p.name for p in written)}"
        runs: dict[str, str] = {}
        for src in args.src:
            rec = read_json(Path(src, "protocol.json")) if Path(src, "protocol.json").is_file() else {}
            name = (rec.get("recipe") or {}).get("name", Path(src).name)
            if name in runs:
                raise ValueError(f"two --from folders run the recipe {name!r}: {runs[name]} and {src}")
            runs[name] = src
        written = [p for name, src in runs.items() for p in make_figures(src, Path(args.out, name))]
        written.append(atomic_write_text(Path(args.out, "recipes_summary.md"), recipes_summary(runs)))
        if args.sweep is not None:  # the sweep is one run of its own: its figure and table go to --out
            written += sweep_figures(args.sweep, args.out)
        return f"wrote {len(written)} files under {args.out} ({', '.join(runs)}; recipes_summary.md)"
    seeds = args.seeds if args.seeds is not None else (QUICK["seeds"] if args.quick else 3)
    jobs = {"resources": cluster_cli.resources(args), "wait": args.wait}
    if args.command == "sweep":
        params = sim_params(args.sim, args.quick)
        table = sweep(args.out, params, _settings(args, "simulated", params), methods=tuple(args.methods),
                      seeds=seeds, progress=args.progress, targets=args.targets, **jobs)
        return f"sweep: {len(table)} rows in {args.out}/sweep.csv (SIMULATED)"
    if args.simulate:
        params = sim_params(args.sim, args.quick)
        settings = _settings(args, "simulated", params)
        mode = args.mode or settings.recipe["protocol_mode"]
        res = protocol.run(args.out, functools.partial(sources.simulated, params), settings, targets=args.targets,
                    methods=args.methods, orders=args.orders, mode=mode, seeds=seeds, tasks=args.tasks,
                    progress=args.progress, **jobs)
    else:
        if args.sim:
            raise ValueError("--sim applies to --simulate only")
        settings = _settings(args, str(args.data), None)
        mode = args.mode or settings.recipe["protocol_mode"]
        src = sources.Lazy(sources.real, args.data, backbone=args.backbone, checkpoint=args.checkpoint,
                           image_size=args.image_size, clip_norm=settings.recipe["clip_norm"],
                           smooth_sigma=settings.recipe["smooth_sigma"], prompts=settings.recipe["prompts"],
                           quick_gelu=settings.recipe["quick_gelu"])
        built = src(0)  # bad data fail here, before any cell; the driver keeps it for its own cells
        res = protocol.run(args.out, src, settings, targets=args.targets, methods=args.methods,
                    orders=args.orders, mode=mode, seeds=seeds, tasks=args.tasks, progress=args.progress,
                    domains=built.domains, masked=built.masked, **jobs)
    if res["pending"]:
        return (f"protocol: submitted {len(res['pending'])} cells, kept {len(res['skipped'])} finished cells; "
                f"re-run the same command to collect them into {args.out}/protocol.csv")
    return (f"protocol: computed {len(res['computed'])} cells, kept {len(res['skipped'])} finished cells; "
            f"wrote {args.out}/protocol.csv and da.csv")
