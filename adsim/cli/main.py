"""``python -m adsim {make-toy-bmad,train,eval,predict,table,protocol,sweep,figures}`` (``COMMAND --help``).

The parser is built from plain-Python modules only (``adsim.config``, ``adsim.data.domains``); torch,
open_clip and the code of a command load in :func:`main` once the arguments are parsed, so ``--help``
answers at once.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import warnings
from pathlib import Path

from adsim.cli import cluster as cluster_cli
from adsim.cli import protocol as protocol_cli
from adsim.config import recipes
from adsim.config.choices import (BACKBONES, COMPILE_CHOICES, DEFAULT_COMPILE, METRICS, SCORES, ZERO_SHOT_METHODS,
                                  require_weights)
from adsim.config.run import config_from_recipe
from adsim.data.domains import DOMAINS

SLICE_AXES = ("axial", "coronal", "sagittal", "0", "1", "2")  # adsim.data.medical.resolve_axis
DESCRIPTION = ("Zero-shot medical anomaly detection on a frozen CLIP ViT: make a toy data set, train, evaluate, "
               "score your own images, DICOM or NIfTI, and run the paper's grids. Nothing is downloaded: "
               "--checkpoint PATH loads local weights. python -m adsim COMMAND --help describes each command.")
"""``python -m adsim --help``'s description: plain text (argparse prints it as it is)."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m adsim", description=DESCRIPTION)
    sub = p.add_subparsers(dest="command", required=True)

    toy = sub.add_parser("make-toy-bmad", help="write a small SIMULATED BMAD-layout data set")
    toy.add_argument("dir")
    toy.add_argument("--n-per-class", type=int, default=8)
    toy.add_argument("--size", type=int, default=64)
    toy.add_argument("--seed", type=int, default=0)

    tr = sub.add_parser("train", help="zero-shot training on every domain except --target")
    tr.add_argument("--data", required=True)
    tr.add_argument("--target", required=True, help=f"one of {DOMAINS}")
    tr.add_argument("--out", required=True, help="run folder")
    tr.add_argument("--recipe", default="clean", help=f"one of {recipes.names()} (docs/recipes.md); the flags "
                    "below only override its fields")
    tr.add_argument("--set", nargs="+", default=[], metavar="FIELD=VALUE",
                    help=f"override any recipe field, of {tuple(f for f in recipes.FIELDS if f != 'name')}")
    tr.add_argument("--train-domains", nargs="+", default=None)
    tr.add_argument("--train-splits", nargs="+", default=None)
    tr.add_argument("--backbone", default="ViT-L-14-336", help=f"one of {tuple(BACKBONES)}")
    tr.add_argument("--checkpoint", default=None,
                    help="local weights: an open_clip state dict or .safetensors file (read without running "
                         "code), or OpenAI's TorchScript file, e.g. ViT-L-14-336px.pt -- TorchScript is loaded "
                         "with torch.jit.load, which is only as safe as the file: use it only from a source you "
                         "trust (none: --random-weights or --backbone tiny)")
    _random_weights_arg(tr)
    tr.add_argument("--image-size", type=int, default=None)
    tr.add_argument("--quick-gelu", action=argparse.BooleanOptionalAction, default=None,
                    help="QuickGELU (the OpenAI weights' own activation) or exact GELU in both CLIP towers "
                         "(default: the recipe's field quick_gelu, what its reference code runs; docs/recipes.md)")
    tr.add_argument("--no-clip-norm", dest="clip_norm", action="store_const", const=False, default=None,
                    help="skip CLIP mean/std normalisation (as the authors did)")
    tr.add_argument("--epochs", type=int, default=None)
    tr.add_argument("--batch-size", type=int, default=None)
    tr.add_argument("--lr", type=float, default=None)
    tr.add_argument("--grad-clip", type=float, default=1.0)
    tr.add_argument("--method", default=None, help=f"one of {recipes.CHOICES['method']}")
    tr.add_argument("--metric", default=None, help=f"one of {METRICS}")
    tr.add_argument("--gate-mode", default=None, help=f"one of {recipes.CHOICES['gate_mode']}")
    tr.add_argument("--update", default=None, help=f"one of {recipes.CHOICES['update']}")
    tr.add_argument("--vaca", action=argparse.BooleanOptionalAction, default=None)
    for name in ("gamma", "beta-dice", "beta-focal", "beta-bce", "lambda-intra", "lambda-inter", "lambda-var"):
        tr.add_argument(f"--{name}", type=float, default=None)
    sel = tr.add_mutually_exclusive_group()
    sel.add_argument("--select-heldout", type=float, default=None, metavar="FRAC",
                     help="select the checkpoint on FRAC held-out data of the TRAINING domains")
    sel.add_argument("--select-on-test", action="store_true",
                     help="AUTHORS' PROTOCOL, optimistic and NOT zero-shot: select on the target's test set")
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--device", default="auto")
    tr.add_argument("--precision", choices=("auto", "fp32", "bf16", "fp16"), default="auto")
    tr.add_argument("--num-workers", type=int, default=0)
    tr.add_argument("--resume", action="store_true",
                    help="continue the run in --out from its last checkpoint (a run stopped at any moment, even "
                         "killed, ends as the uninterrupted run would); without a checkpoint yet it starts over")
    _wait_arg(tr)
    tr.add_argument("--no-progress", dest="progress", action="store_false")
    tr.add_argument("--trunk-cache", action="store_true",
                    help="compute the frozen trunk's tokens once and keep them in RAM (same result, faster epochs)")
    tr.add_argument("--compile", nargs="?", const="auto", default=DEFAULT_COMPILE, choices=COMPILE_CHOICES,
                    metavar="MODE",
                    help="torch.compile the step after the frozen trunk (same result up to float rounding, fewer "
                         "kernel launches; one process; if compilation fails the run goes on eagerly after one "
                         f"warning). MODE: one of {COMPILE_CHOICES}. Default: off (eager). Turn it on for runs of several "
                         "epochs on a CUDA GPU: compiling a ViT-L step costs ~40-60 s per process (less with a warm "
                         "cache, docs/compile.md) and saves ~20-26 ms per step, so it pays back after ~2,000 steps "
                         "(B=16). --compile alone: auto = reduce-overhead on CUDA, default (inductor) elsewhere; "
                         "cuda = reduce-overhead on a CUDA device in one process, eager elsewhere")
    _dist_args(tr)

    ev = sub.add_parser("eval", help="write metrics.json for the target's test split (RUN/ or --out)")
    evsrc = ev.add_mutually_exclusive_group(required=True)
    evsrc.add_argument("--run", "--run-dir", dest="run",
                       help="run folder (spell it --run-dir under torchrun, whose own --run-path swallows --run)")
    evsrc.add_argument("--zero-shot", metavar="METHOD",
                       help=f"a training-free method: one of {ZERO_SHOT_METHODS} or a plugin's (needs --target "
                            "and --out)")
    ev.add_argument("--data", required=True)
    ev.add_argument("--target", default=None, help="default: the run's target (required with --zero-shot)")
    ev.add_argument("--out", default=None, help="with --zero-shot: the folder for metrics.json and overlays/")
    ev.add_argument("--checkpoint", default=None,
                    help="with --run: auto|last|best (default auto); with --zero-shot: local backbone weights "
                         "(none: --random-weights or --backbone tiny)")
    ev.add_argument("--backbone", default="ViT-L-14-336", help=f"with --zero-shot: one of {tuple(BACKBONES)}")
    _random_weights_arg(ev, "with --zero-shot: ")
    ev.add_argument("--image-size", type=int, default=None, help="with --zero-shot")
    ev.add_argument("--smooth-sigma", type=float, default=None, help="default: the run's recipe (smooth_sigma)")
    ev.add_argument("--score", default=None, choices=SCORES,
                    help="image score / pixel map (default: the run's, else logit_max; authors_prob_mean "
                         "= the released code's mean of probabilities, which saturates)")
    ev.add_argument("--batch-size", type=int, default=16)
    ev.add_argument("--device", default="auto")
    ev.add_argument("--no-progress", dest="progress", action="store_false")
    ev.add_argument("--overlays", type=int, default=0, metavar="N",
                    help="also write the N most and N least anomalous test images' heatmaps to RUN/overlays/")
    ev.add_argument("--shots", type=int, default=0, metavar="K",
                    help="few-shot mode: K normal images of the target's valid split in a memory bank (never "
                         "scored; MVFA-AD: 2 4 8 16); 0 = zero-shot")
    ev.add_argument("--shot-seed", type=int, default=0, help="seed of the draw of the --shots images")
    _dist_args(ev)

    pr = sub.add_parser("predict", help="score any images, DICOM or NIfTI (no labels): DIR/scores.csv, "
                        "DIR/report.html, one overlay PNG each")
    pr.add_argument("images", nargs="+", help="image files (PNG/JPEG/TIFF incl. 16-bit, DICOM, NIfTI .nii/.nii.gz) "
                    "and/or folders (every file of a folder is tried; a DICOM series in instance order)")
    src = pr.add_mutually_exclusive_group(required=True)
    src.add_argument("--run", help="a trained run folder")
    src.add_argument("--zero-shot", metavar="METHOD", help=f"a training-free method: one of {ZERO_SHOT_METHODS} or a plugin's")
    pr.add_argument("--out", required=True, help="output folder")
    pr.add_argument("--checkpoint", default=None,
                    help="with --run: auto|last|best (default auto); with --zero-shot: local backbone weights")
    pr.add_argument("--backbone", default="ViT-L-14-336", help=f"with --zero-shot: one of {tuple(BACKBONES)}")
    _random_weights_arg(pr, "with --zero-shot: ")
    pr.add_argument("--image-size", type=int, default=None, help="with --zero-shot")
    pr.add_argument("--batch-size", type=int, default=16)
    pr.add_argument("--device", default="auto")
    pr.add_argument("--strict", action="store_true", help="fail on an unreadable file instead of skipping it")
    pr.add_argument("--no-overlays", dest="overlays", action="store_false")
    pr.add_argument("--shots", type=int, default=0, metavar="K",
                    help="few-shot mode: K images drawn from --normals in a memory bank (never scored)")
    pr.add_argument("--normals", nargs="+", default=None, help="with --shots: normal images/folders of the target")
    pr.add_argument("--shot-seed", type=int, default=0, help="seed of the draw of the --shots images")
    pr.add_argument("--slice-axis", default="axial", choices=SLICE_AXES,
                    help="NIfTI volumes: score every slice along this axis (axial/coronal/sagittal: the voxel axis "
                         "nearest that direction by the affine, no resampling; 0/1/2: a voxel axis)")
    pr.add_argument("--volume-topk", type=int, default=1, metavar="K",
                    help="a volume's score (NIfTI volume, multi-frame DICOM, DICOM series): the mean of its K "
                         "highest slice scores (default 1: the maximum)")
    pr.add_argument("--no-progress", dest="progress", action="store_false")
    _wait_arg(pr)

    cv = sub.add_parser("convert-run", help="rewrite a run folder of an earlier adsim version whose checkpoints "
                        "hold NumPy values, so that they load without running code (only for a run you trust)")
    cv.add_argument("run", help="the run folder")
    protocol_cli.add_parsers(sub)
    _table_parser(sub)
    return p


def _table_parser(sub) -> None:
    tb = sub.add_parser("table", help="Table 1 grid: every target x method x shots (resumable per cell), "
                        "OUT/table.csv and OUT/table.md with the paper's numbers in separate columns")
    tb.add_argument("--data", required=True, help="BMAD in the MVFA layout")
    tb.add_argument("--checkpoint", default=None,
                    help="local open_clip weights (none: --random-weights or --backbone tiny)")
    tb.add_argument("--methods", nargs="+", required=True,
                    help=f"training-free {ZERO_SHOT_METHODS} and/or trained: recipes {recipes.names()} or methods "
                         f"{recipes.CHOICES['method']} of --recipe, trained once per target (leave-one-out)")
    tb.add_argument("--out", required=True)
    tb.add_argument("--shots", nargs="+", type=int, default=[0], help="0 = zero-shot; MVFA-AD: 2 4 8 16")
    tb.add_argument("--shot-seed", type=int, default=0, help="seed of the draw of the k normal shot images")
    tb.add_argument("--targets", nargs="+", default=None, help=f"default: all of {DOMAINS}")
    tb.add_argument("--backbone", default="ViT-L-14-336", help=f"one of {tuple(BACKBONES)}")
    _random_weights_arg(tb)
    tb.add_argument("--epochs", type=int, default=None, help="trained methods (default: the recipe's)")
    tb.add_argument("--recipe", default="clean", help=f"one of {recipes.names()}: the trained methods' recipe")
    tb.add_argument("--seed", type=int, default=0)
    tb.add_argument("--batch-size", type=int, default=16)
    tb.add_argument("--device", default="auto")
    tb.add_argument("--no-progress", dest="progress", action="store_false")
    cluster_cli.add_args(tb)


def _random_weights_arg(p, when: str = "") -> None:
    p.add_argument("--random-weights", action="store_true",
                   help=f"{when}without --checkpoint, build the backbone with RANDOM weights anyway (tests, timing: "
                        f"the scores are meaningless); without this flag such a command stops at once, naming "
                        f"--checkpoint. --backbone tiny (the small test backbone) is random without asking")


def _check_weights(args) -> None:
    """Before any work: a backbone this command builds without ``--checkpoint`` needs ``--random-weights``
    (``adsim.config.choices.require_weights``), and ``--random-weights`` needs a backbone to build."""
    if not hasattr(args, "random_weights"):
        return
    if isinstance(getattr(args, "recipe", None), str):  # a wrong recipe or --set is the first thing to hear of
        recipes.override(recipes.get(args.recipe), **recipes.parse_sets(getattr(args, "set", None)))
    builds = {"train": True, "table": True, "protocol": not getattr(args, "simulate", False),
              "eval": args.command == "eval" and args.zero_shot is not None,
              "predict": args.command == "predict" and args.zero_shot is not None}[args.command]
    if builds:
        require_weights(args.backbone, args.checkpoint, args.random_weights, cli=True)
    elif args.random_weights:
        raise ValueError("--random-weights goes with " + ("--data (the simulator builds no backbone)"
                                                           if args.command == "protocol" else
                                                           "--zero-shot (a run folder fixes its own weights)"))


def _wait_arg(p) -> None:
    p.add_argument("--wait", action="store_true",
                   help="if another process is writing to --out, wait for it to finish (default: stop with an "
                        "error naming it)")


def _dist_args(p) -> None:
    p.add_argument("--dist-timeout", type=float, default=600.0, metavar="SECONDS",
                   help="under torchrun: fail (instead of hanging) when a collective waits longer than this")


def _train_config(args):
    """The run's config: ``--recipe``, then ``--set``, then the explicit flags (each only overrides)."""
    select = "test" if args.select_on_test else "heldout" if args.select_heldout else None
    flags = dict(train_splits=tuple(args.train_splits) if args.train_splits else None, clip_norm=args.clip_norm,
                 epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, method=args.method,
                 metric=args.metric, gate_mode=args.gate_mode, update=args.update, vaca=args.vaca,
                 gamma=args.gamma, beta_dice=args.beta_dice, beta_focal=args.beta_focal, beta_bce=args.beta_bce,
                 lambda_intra=args.lambda_intra, lambda_inter=args.lambda_inter, lambda_var=args.lambda_var,
                 select=select, quick_gelu=args.quick_gelu)
    recipe = recipes.override(recipes.override(recipes.get(args.recipe), **recipes.parse_sets(args.set)), **flags)
    return config_from_recipe(
        recipe, data=args.data, target=args.target, out=args.out, train_domains=args.train_domains,
        backbone=args.backbone, checkpoint=args.checkpoint, image_size=args.image_size,
        grad_clip=args.grad_clip, holdout_frac=args.select_heldout or 0.2,
        seed=args.seed, device=args.device, precision=args.precision, num_workers=args.num_workers)


def _smooth_sigma(run) -> float:
    """The run's recipe value (runs written before recipes existed: 4.0, the old default)."""
    from adsim.runtime.io import read_json

    path = Path(run) / "config.json"
    return float(read_json(path)["config"].get("smooth_sigma", 4.0)) if path.is_file() else 4.0


def _one_line_warning(message, category, filename, lineno, file=None, line=None):
    print(f"warning: {message}", file=sys.stderr)


def _sha256(path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _weights(path) -> str:
    return "random (no --checkpoint): scores are meaningless" if path is None else f"{path} (sha256 {_sha256(path)})"


def _settings(args, det) -> dict:
    """What produced a prediction, for report.html: backbone, weights (file and sha256, or random),
    recipe, method, shots, and the reading options."""
    spec = det.info.get("backbone")
    out = {"method": det.method.name}
    if args.run is not None:
        cfg = det.info["config"]
        ckpt = Path(args.run) / det.info["checkpoint"]["file"]
        out.update({"run": args.run, "recipe": getattr(cfg, "recipe", None) or "-", "backbone": cfg.backbone,
                    "backbone weights": _weights(cfg.checkpoint),
                    "head checkpoint": f"{ckpt} (epoch {det.info['checkpoint']['epoch']}, sha256 {_sha256(ckpt)})",
                    "scoring": det.info.get("scoring")})
    else:
        out.update({"zero-shot method": args.zero_shot, "recipe": "- (training-free)", "backbone": args.backbone,
                    "backbone weights": _weights(args.checkpoint)})
    if spec is not None:
        out["image size"] = spec.image_size
    out["shots"] = (f"{det.info['shots']} (seed {det.info['shot_seed']}: {', '.join(det.info['shot_files'])})"
                    if det.info.get("shots") else "0 (zero-shot)")
    out.update({"slice axis": args.slice_axis, "volume score": "max of the slice scores" if args.volume_topk == 1
                else f"mean of the {args.volume_topk} highest slice scores", "inputs": " ".join(args.images)})
    return out


def _one_line_for(category, show):
    """``warnings.showwarning`` printing ``category`` as one ``warning:`` line and the rest with ``show``."""
    def shown(message, cat, filename, lineno, file=None, line=None):
        if issubclass(cat, category):
            return _one_line_warning(message, cat, filename, lineno, file, line)
        return show(message, cat, filename, lineno, file, line)
    return shown


def _predict(args) -> str:
    """``predict``: scores.csv (``adsim.inference.report``: where each score came from; written
    atomically), report.html and, unless ``--no-overlays``, one overlay PNG per picture in ``--out``;
    unreadable files are skipped with one ``warning:`` line each. The caller holds ``--out``'s lock."""
    # torch, open_clip and the methods load here, once the command runs
    from adsim.data.images import image_items
    from adsim.inference.detector import Detector, UnreadableImageWarning
    from adsim.inference.report import write_report, write_scores_csv
    from adsim.methods.fewshot import exclude_shots
    from adsim.runtime.io import write_json

    if args.run is not None:
        if args.backbone != "ViT-L-14-336" or args.image_size is not None:
            raise ValueError("--backbone and --image-size go with --zero-shot; a run folder fixes its own")
        det = Detector.from_run(args.run, checkpoint=args.checkpoint or "auto", device=args.device)
    else:
        det = Detector.zero_shot(args.zero_shot, backbone=args.backbone, checkpoint=args.checkpoint,
                                 image_size=args.image_size, device=args.device, random_weights=args.random_weights)
    out = Path(args.out)
    images = args.images
    if args.shots or args.normals:
        if not args.shots or not args.normals:
            raise ValueError("--shots K and --normals IMAGES go together (K normal images of the target)")
        det = det.with_shots(args.normals, args.shots, seed=args.shot_seed, batch_size=args.batch_size)
        images = exclude_shots([src for _, src in image_items(images, axis=args.slice_axis)],
                               det.method.paths)  # never scored
        write_json(out / "shots.json", {k: det.info[k] for k in ("shots", "shot_seed", "shot_files", "weight")})
    skipped = []

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, UnreadableImageWarning):
            skipped.append(str(message))
        _one_line_warning(message, category, filename, lineno, file, line)

    with warnings.catch_warnings():
        warnings.showwarning = show  # the CLI reports each skipped file on one line
        warnings.simplefilter("always", UnreadableImageWarning)
        pred = det.predict(images, batch_size=args.batch_size, maps=False, progress=args.progress,
                           strict=args.strict, overlays=out / "overlays" if args.overlays else None,
                           axis=args.slice_axis, volume_topk=args.volume_topk)
    write_scores_csv(out / "scores.csv", pred)
    reasons = [tuple(m.removeprefix("skipped ").split(": not a readable image ", 1)) for m in skipped]
    write_report(out / "report.html", pred, _settings(args, det), overlays=out / "overlays" if args.overlays else None,
                 skipped=[(r[0], r[1][1:-1] if r[1].startswith("(") and r[1].endswith(")") else r[1])
                          if len(r) == 2 else (r[0], "") for r in reasons])
    volumes = f" and {len(pred.volumes)} volumes" if pred.volumes else ""
    return (f"scored {len(pred.paths)} images{volumes} with {det.method.name}: {out / 'scores.csv'}, "
            f"{out / 'report.html'}" + (f", overlays in {out / 'overlays'}" if args.overlays else ""))


def _eval(args) -> dict:
    """``eval``: a run (``--run``) or a training-free method (``--zero-shot``, metrics.json in ``--out``)."""
    from adsim.evaluation.evaluate import evaluate, evaluate_zero_shot
    from adsim.runtime.files import check_writable

    if args.zero_shot is not None:
        if args.target is None or args.out is None:
            raise ValueError("eval --zero-shot needs --target (the domain to score) and --out (where metrics.json goes)")
        if args.score is not None:
            raise ValueError("--score chooses a trained head's score; a training-free method has its own")
        check_writable(args.out)  # before any work
        sigma = args.smooth_sigma if args.smooth_sigma is not None else recipes.get("clean").smooth_sigma
        return evaluate_zero_shot(args.zero_shot, args.data, args.target, args.out, backbone=args.backbone,
                                  checkpoint=args.checkpoint, image_size=args.image_size, smooth_sigma=sigma,
                                  batch_size=args.batch_size, device=args.device, progress=args.progress,
                                  overlays=args.overlays, shots=args.shots, shot_seed=args.shot_seed,
                                  random_weights=args.random_weights)
    if args.out is not None or args.backbone != "ViT-L-14-336" or args.image_size is not None:
        raise ValueError("--out, --backbone and --image-size go with --zero-shot; a run folder fixes its own and "
                         "gets metrics.json")
    checkpoint = args.checkpoint or "auto"
    if checkpoint not in ("auto", "last", "best"):
        raise ValueError(f"with --run, --checkpoint must be one of ('auto', 'last', 'best'), got {checkpoint!r}")
    if Path(args.run, "config.json").is_file():
        check_writable(args.run, "--run")  # metrics.json goes there
    sigma = args.smooth_sigma if args.smooth_sigma is not None else _smooth_sigma(args.run)
    return evaluate(args.run, args.data, args.target, checkpoint=checkpoint, smooth_sigma=sigma,
                    batch_size=args.batch_size, device=args.device, progress=args.progress, scoring=args.score,
                    overlays=args.overlays, shots=args.shots, shot_seed=args.shot_seed)


def _convert_run(run) -> str:
    """``convert-run``: every ``checkpoint_*.pt`` of ``run`` made loadable without running code
    (``adsim.runtime.io.convert_checkpoint``)."""
    from adsim.runtime.io import convert_checkpoint

    files = sorted(Path(run).glob("checkpoint_*.pt"))
    if not Path(run, "config.json").is_file() or not files:
        raise ValueError(f"{run} is not a run folder (no config.json and checkpoint_*.pt)")
    return "\n".join(convert_checkpoint(f) for f in files)


def _out_of_memory(err: RuntimeError) -> bool:
    """CUDA's OutOfMemoryError, or the CPU allocator's failure message."""
    import torch

    text = str(err)
    return isinstance(err, torch.OutOfMemoryError) or "can't allocate memory" in text \
        or "not enough memory" in text


def _make_toy(args) -> int:
    """``make-toy-bmad``: NumPy and PIL only (no torch), so it starts at once."""
    from adsim.data.toy import make_toy_bmad
    from adsim.runtime.files import check_writable, os_error_line

    try:
        check_writable(args.dir, "make-toy-bmad DIR")  # before any work
        root = make_toy_bmad(args.dir, n_per_class=args.n_per_class, size=args.size, seed=args.seed)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"error: {os_error_line(err)}", file=sys.stderr)
        return 2
    print(f"wrote SIMULATED toy BMAD to {root}")
    return 0


def _random_weights_once(show):
    """``warnings.showwarning`` printing the backbone's random-weights notice (``RandomWeightsWarning``) as one
    ``warning:`` line and the rest with ``show``; :func:`main`'s "once" filter shows it once per process."""
    def shown(message, cat, filename, lineno, file=None, line=None):
        # the category is named through sys.modules: its module was loaded by whoever issued the warning,
        # and importing it here would load torch and open_clip for commands that never build a backbone
        backbone = sys.modules.get("adsim.model.backbone")
        if backbone is not None and issubclass(cat, backbone.RandomWeightsWarning):
            return _one_line_warning(message, cat, filename, lineno, file, line)
        return show(message, cat, filename, lineno, file, line)
    return shown


def main(argv=None) -> int:
    """``python -m adsim`` with the arguments ``argv`` (default: the process's); returns the exit status."""
    args = _parser().parse_args(argv)
    if args.command == "make-toy-bmad":
        return _make_toy(args)
    try:
        _check_weights(args)  # before any work, before torch loads: a random backbone must be asked for
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    with warnings.catch_warnings():
        warnings.showwarning = _random_weights_once(warnings.showwarning)
        warnings.filterwarnings("once", message=r"backbone \S+ has RANDOM weights", category=UserWarning)
        return _command(args)


def _command(args) -> int:
    """Run a parsed command other than ``make-toy-bmad``: 0 on success, 2 on bad input or a full disk."""
    # torch and the command's code load here, after parsing (``--help`` never gets this far)
    from adsim.runtime import distributed
    from adsim.runtime.files import check_writable, os_error_line, remove_stale_temporaries
    from poolsim import cluster
    from poolsim.io import FolderBusyError, folder_lock

    try:
        if args.command in ("train", "eval"):  # torchrun: join the process group (no-op otherwise)
            distributed.setup(args.device, args.dist_timeout)

        if args.command == "predict":
            check_writable(args.out)  # before any work
            with folder_lock(args.out, wait=args.wait):  # one writer per output folder
                print(_predict(args))
        elif args.command == "convert-run":
            print(_convert_run(args.run))
        elif args.command in ("protocol", "sweep", "figures"):
            print(protocol_cli.main(args))
        elif args.command == "table":
            from adsim.experiments.table import run as run_table

            check_writable(args.out)  # before any work
            done = run_table(args.out, args.data, methods=args.methods, targets=args.targets, shots=args.shots,
                             recipe=args.recipe, backbone=args.backbone, checkpoint=args.checkpoint,
                             epochs=args.epochs, seed=args.seed, shot_seed=args.shot_seed, device=args.device,
                             batch_size=args.batch_size, progress=args.progress,
                             resources=cluster_cli.resources(args), wait=args.wait,
                             random_weights=args.random_weights)
            if done["pending"]:
                print(f"submitted {len(done['pending'])} jobs, {len(done['skipped'])} cells already done; re-run "
                      "the same command to collect them")
            else:
                print(f"{len(done['computed'])} cells computed, {len(done['skipped'])} already done; "
                      f"wrote {Path(args.out) / 'table.md'}")
        elif args.command == "train":
            from adsim.training.compiled_step import CompileFallbackWarning
            from adsim.training.train import train

            cfg = _train_config(args)
            check_writable(args.out)  # before any work
            if cfg.select == "test":
                print("WARNING: select='test' selects the checkpoint on the TARGET's test set "
                      "(authors' protocol): the result is optimistic and not zero-shot", file=sys.stderr)
            # one writer per run folder: the main process holds the lock (torchrun's other ranks write nothing)
            lock = folder_lock(args.out, wait=args.wait) if distributed.is_main() else contextlib.nullcontext()
            with lock, warnings.catch_warnings():  # a compiler failure: one "warning:" line, the run goes on
                if distributed.is_main():
                    remove_stale_temporaries(args.out)
                warnings.showwarning = _one_line_for(CompileFallbackWarning, warnings.showwarning)
                warnings.simplefilter("always", CompileFallbackWarning)
                out = train(cfg, resume=args.resume, progress=args.progress, trunk_cache=args.trunk_cache,
                            compile_mode=args.compile)
            if distributed.is_main():
                print(f"run written to {out}")
        else:
            metrics = _eval(args)
            if distributed.is_main():
                print(json.dumps(metrics, indent=2))
    except (ValueError, FolderBusyError) as err:  # FolderBusyError: another process writes to --out
        print(f"error: {err}", file=sys.stderr)
        return 2
    except cluster.GridFailed as err:  # cells that failed as jobs: one line each, with its log
        print(f"error: {err}", file=sys.stderr)
        return 1
    except OSError as err:  # a full disk, a read-only folder: one line naming the file, never a traceback
        print(f"error: {os_error_line(err)}", file=sys.stderr)
        return 2
    except RuntimeError as err:
        if _out_of_memory(err):
            print(f"error: out of memory ({str(err).strip().splitlines()[0][:160]}): lower --batch-size "
                  f"or --image-size", file=sys.stderr)
            return 2
        w = distributed.world()
        if w.size == 1:
            raise
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        print(f"error: rank {w.rank} of {w.size}: distributed training failed -- a peer process died, or a "
              f"collective waited longer than --dist-timeout {args.dist_timeout:g} s ({first})", file=sys.stderr)
        return 1
    finally:
        if args.command in ("train", "eval"):
            distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
