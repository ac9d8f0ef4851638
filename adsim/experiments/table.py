"""``python -m adsim table``: the paper's Table 1 as a grid of cells -- every target x method x shots.

A *cell* is one (target, method, k) evaluation on the target's ``test`` split: ``k = 0`` is zero-shot,
``k > 0`` the few-shot mode of :mod:`adsim.methods.fewshot` (k normal images of the target's ``valid`` split in a
memory bank; they are never scored). Methods:

* training-free (:func:`adsim.methods.catalog.zero_shot_names`, e.g. ``winclip``): built once per target, no training;
* trained (a recipe name of :mod:`adsim.config.recipes`, or a ``method`` value of the ``--recipe``, e.g.
  ``naive``/``match``, or a name registered in :data:`adsim.methods.registry.TRAINED`): trained ONCE per target,
  leave-one-out (every other domain, :func:`adsim.training.train.train`), in ``OUT/runs/<target>/<method>/``, and
  reused by every k. A run folder with ``trained.json`` is finished and never retrained; one with a
  checkpoint but no ``trained.json`` was interrupted and resumes (``train(resume=True)``).

Every finished cell is a file ``OUT/cells/<target>__<method>__k<k>.json`` (written atomically); a re-run
skips it, so an interrupted table resumes where it stopped. ``OUT/table.csv`` and ``OUT/table.md`` are
rebuilt from the cells: one row per target, one column per method x k x task (AC = image AUROC, AS =
pixel AUROC, percent; each cell file keeps every metrics.json entry: AP, F1-max, AUPRO), and -- in
SEPARATE columns headed "paper-reported" -- the paper's Table 1 (``adsim.data.reference.TABLE1``, zero-shot
only: the paper reports no few-shot numbers) for the row that corresponds to each method. The header
says when the AUCs are meaningless (random-weight backbone) and which methods selected their checkpoint
on the target's test set (a recipe with ``select="test"``: optimistic, not zero-shot).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from adsim.config import recipes
from adsim.config.choices import require_weights
from adsim.config.run import config_from_recipe
from adsim.data import bmad, reference
from adsim.data.domains import DOMAINS, MASKED, TASKS, canonical_domain
from adsim.evaluation.evaluate import split_metrics
from adsim.inference.detector import Detector
from adsim.methods import catalog
from adsim.methods.baselines import mao
from adsim.methods.fewshot import for_target, support_shots
from adsim.methods.registry import TRAINED
from adsim.runtime.io import cell_done, read_json, write_json
from adsim.training.train import train
from poolsim import cluster
from poolsim.io import atomic_write, folder_lock

# our method name -> the paper's Table-1 row it corresponds to (reference.TABLE1); "*" rows are the
# paper authors' re-implementations. "match" = the paper's method only under the paper/authors recipe.
PAPER_ROW = {"naive": "MVFA-AD*", "mvfa": "MVFA-AD*", "match": "Ours", "paper": "Ours", "authors": "Ours",
             "winclip": "WinCLIP", "anomalyclip": "AnomalyCLIP*",
             "aprilgan": "APRIL-GAN", "bilora": "BiLORA*", "adaclip": "AdaCLIP", "mao": "Mao et al."}
# methods that implement only what their public sources define: the table's header says so, in these words
READINGS = {"mao": mao.LABEL}
RANDOM_WEIGHTS = ("RANDOM-WEIGHT BACKBONE (no --checkpoint): the AUCs of this run are MEANINGLESS; they only "
                  "show that the pipeline runs.")


def method_kind(name: str, recipe: str = "clean") -> str:
    """``"zero_shot"`` or ``"trained"``; ``ValueError`` listing the known methods otherwise."""
    if name in catalog.zero_shot_names():
        return "zero_shot"
    if name in recipes.names() or name in recipes.CHOICES["method"] or name in TRAINED:
        return "trained"
    raise ValueError(f"unknown method {name!r}; training-free: {catalog.zero_shot_names()}, trained: recipes "
                     f"{recipes.names()} or methods {tuple(dict.fromkeys((*recipes.CHOICES['method'], *TRAINED)))}")


def cell_name(target: str, method: str, shots: int) -> str:
    return f"{target}__{method}__k{shots}.json"


def check_request(targets, methods, shots, recipe: str) -> tuple:
    """Canonical targets, methods (validated) and shots (each an integer >= 0, sorted, distinct)."""
    targets = [canonical_domain(t) for t in (targets or DOMAINS)]
    if not methods:
        raise ValueError("--methods: give at least one method")
    for m in methods:
        method_kind(m, recipe)
    for k in shots:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
            raise ValueError(f"--shots must be integers >= 0 (0 = zero-shot; MVFA-AD: 2 4 8 16), got {k!r}")
    if len(set(targets)) != len(targets) or len(set(methods)) != len(methods):
        raise ValueError(f"--targets and --methods must be distinct, got {targets}, {methods}")
    return targets, list(methods), sorted(set(int(k) for k in shots))


def train_run(out: Path, data, target: str, method: str, *, recipe: str, backbone: str, checkpoint,
              epochs, seed: int, device: str, progress: bool) -> Path:
    """The leave-one-out run of a trained ``method`` for ``target``: trained once, resumed if interrupted."""

    run = out / "runs" / target / method
    if (run / "trained.json").is_file():
        return run
    base = recipes.get(method) if method in recipes.names() else recipes.override(recipes.get(recipe), method=method)
    if epochs is not None:
        base = recipes.override(base, epochs=epochs)
    cfg = config_from_recipe(base, data=str(data), target=target, out=str(run), backbone=backbone,
                             checkpoint=checkpoint, seed=seed, device=device)
    train(cfg, resume=(run / "checkpoint_last.pt").is_file(), progress=progress)
    write_json(run / "trained.json", {"target": target, "method": method, "recipe": base.name,
                                      "epochs": base.epochs})
    return run


def _detector(out, data, target, method, opts):

    if method_kind(method, opts["recipe"]) == "zero_shot":
        return Detector.zero_shot(method, backbone=opts["backbone"], checkpoint=opts["checkpoint"],
                                  device=opts["device"], seed=opts["seed"],
                                  random_weights=opts["checkpoint"] is None)  # asked for: run() checked it
    run = train_run(out, data, target, method, recipe=opts["recipe"], backbone=opts["backbone"],
                    checkpoint=opts["checkpoint"], epochs=opts["epochs"], seed=opts["seed"],
                    device=opts["device"], progress=opts["progress"])
    return Detector.from_run(run, device=opts["device"])


def evaluate_cell(detector, data, target: str, shots: int, *, shot_seed: int = 0, smooth_sigma: float = 0.0,
                  batch_size: int = 16) -> dict:
    """metrics.json entries of one cell on ``target``'s test split (``image_auc``, ``pixel_auc``, AP,
    F1-max, AUPRO, percent; streamed through :class:`adsim.metrics.Accumulator` as ``eval`` does, pixel
    maps Gaussian-smoothed with ``smooth_sigma``). ``shots > 0``: few-shot (:func:`adsim.methods.fewshot.for_target`:
    shots from the target's ``valid`` normals, excluded from the scored images)."""

    samples, info = bmad.list_split(data, target, "test"), {"shots": 0}
    if shots:
        detector, samples, info = for_target(detector, data, target, shots, seed=shot_seed, batch_size=batch_size)
    bmad.require_both_classes(samples, f"{target} test split")
    scored, _ = split_metrics(detector, samples, batch_size=batch_size, pixel=target in MASKED, progress=False,
                         desc=f"{target} k={shots}", smooth_sigma=smooth_sigma)
    return {**scored, **info, "n_images": len(samples)}


def _paper_columns(methods) -> dict:
    """``{column: {target: value}}`` of the paper's Table 1 for the rows our methods correspond to."""
    cols = {}
    for row in dict.fromkeys(PAPER_ROW[m] for m in methods if m in PAPER_ROW):
        for task in TASKS:
            values = {t: v for (t, tk), v in reference.TABLE1[row].items() if tk == task}
            if values:
                cols[f"paper-reported {row} {task}"] = values
    return cols


def build_table(out, targets, methods, shots) -> pd.DataFrame:
    """One row per target: this run's cells (``"<method> k=<k> AC|AS"``), then the paper's columns."""
    out = Path(out)
    rows = []
    for t in targets:
        row = {"target": t}
        for m in methods:
            for k in shots:
                path = out / "cells" / cell_name(t, m, k)
                cell = read_json(path)["metrics"] if cell_done(path) else {}
                row[f"{m} k={k} AC"] = cell.get("image_auc", np.nan)
                if any(x in MASKED for x in targets):  # AS: masked targets only (others: missing)
                    row[f"{m} k={k} AS"] = cell.get("pixel_auc", np.nan)
        rows.append(row)
    df = pd.DataFrame(rows)
    for col, values in _paper_columns(methods).items():
        df[col] = [values.get(t, np.nan) for t in targets]
    return df


def _markdown(df: pd.DataFrame) -> str:
    """A pipe table ('-' where a value is missing); hand-written: pandas needs ``tabulate`` for this."""
    def fmt(v):
        return v if isinstance(v, str) else "-" if pd.isna(v) else f"{v:.2f}"
    lines = ["| " + " | ".join(df.columns) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


def write_outputs(out, targets, methods, shots, record: dict) -> pd.DataFrame:
    out = Path(out)
    df = build_table(out, targets, methods, shots)
    atomic_write(out / "table.csv", lambda fh: fh.write(df.to_csv(index=False, float_format="%.2f").encode()))
    header = [f"# Table 1 grid: {', '.join(methods)} x shots {shots}", "",
              f"This run: data `{record['data']}`"
              f"{' (SIMULATED toy data, make-toy-bmad)' if bmad.simulated(record['data']) else ''}, backbone `{record['backbone']}`"
              f" ({'pretrained weights' if record['pretrained'] else 'random weights'}), recipe of each trained "
              f"method: {', '.join(f'{m} `{r}`' for m, r in record['recipes'].items()) or 'none'}, shot seed "
              f"{record['shot_seed']}. AUROC in percent; AC = image, "
              "AS = pixel (masked domains only); k = number of normal target images in the few-shot bank "
              "(k = 0: zero-shot).",
              f"Columns headed \"paper-reported\": {reference.TABLE1_SOURCE} (real BMAD, the authors' runs; "
              "zero-shot only), never computed here; the row shown for each method: "
              + ", ".join(f"{m} -> {PAPER_ROW[m]}" for m in record["methods"] if m in PAPER_ROW)
              + (" (\"Ours\" is the paper's recipe; compare the recipe each method ran with)"
                 if any(PAPER_ROW.get(m) == "Ours" for m in record["methods"]) else "") + ".", ""]
    readings = [f"**{m}: {READINGS[m]}.**" for m in record["methods"] if m in READINGS]
    header += readings + ([""] if readings else [])
    if not record["pretrained"]:
        header += [f"**{RANDOM_WEIGHTS}**", ""]
    if record.get("selected_on_test"):
        header += [f"**{', '.join(record['selected_on_test'])}: checkpoint selected on the TARGET's test set (the "
                   "recipe's authors' protocol): optimistic, NOT zero-shot.**", ""]
    md = "\n".join(header) + "\n" + _markdown(df) + "\n"
    atomic_write(out / "table.md", lambda fh: fh.write(md.encode()))
    return df


def run(out, data, *, methods, targets=None, shots=(0,), recipe: str = "clean", backbone: str = "ViT-L-14-336",
        checkpoint=None, epochs=None, seed: int = 0, shot_seed: int = 0, device: str = "auto",
        batch_size: int = 16, progress: bool = True, resources: cluster.Resources | None = None,
        wait: bool = False, random_weights: bool = False) -> dict:
    """Compute every missing cell and write the table. Returns ``{"computed": [...], "skipped": [...],
    "pending": [...]}``.

    Without ``checkpoint`` the backbone's weights are random and every AUC meaningless: that needs
    ``random_weights=True`` (or ``backbone="tiny"``), else ``ValueError`` before any work
    (``adsim.config.choices.require_weights``; the table then says so in its header).

    ``resources`` (:class:`poolsim.cluster.Resources`, default ``executor="local"``): ``local`` computes
    the cells one after another in this process; ``processes`` / ``slurm`` make each (target, method) with
    missing cells one job -- its training run (resumed from its checkpoint when resubmitted) and its k
    evaluations -- and write the same ``table.csv`` from the cell files. The output folder is locked for
    the run (:func:`poolsim.io.folder_lock`; ``wait``: wait for another driver instead of failing)."""
    require_weights(backbone, checkpoint, random_weights)
    targets, methods, shots = check_request(targets, methods, shots, recipe)
    recipes.get(recipe)
    for t in targets:  # bad data fail now, not hours into the grid
        bmad.require_both_classes(bmad.list_split(data, t, "test"), f"{t} test split")
        if max(shots) > 0:
            support_shots(data, t, max(shots))  # ValueError naming --shots and the allowed range
    out = Path(out)
    resources = resources or cluster.Resources()
    settings = {"data": str(Path(data).resolve()), "methods": methods, "recipe": recipe, "backbone": backbone,
                "checkpoint": None if checkpoint is None else str(Path(checkpoint).resolve()), "epochs": epochs,
                "seed": seed, "shot_seed": shot_seed}
    with folder_lock(out, wait=wait):
        if (out / "table.json").is_file():
            saved = read_json(out / "table.json")["settings"]
            diff = sorted(k for k in settings
                          if k != "methods" and json.loads(json.dumps(settings[k])) != saved.get(k))
            if diff:
                raise ValueError(f"{out} holds a table run with other settings {diff}; use another --out")
        write_json(out / "table.json", {"settings": settings, "note": "cells/*.json are the record; the tables are "
                                        "rebuilt from them"})
        opts = {"recipe": recipe, "backbone": backbone, "checkpoint": checkpoint, "epochs": epochs, "seed": seed,
                "device": device, "progress": progress, "shot_seed": shot_seed, "batch_size": batch_size}
        grid = [(t, m, k) for t in targets for m in methods for k in shots]
        todo = [c for c in grid if not cell_done(out / "cells" / cell_name(*c))]
        skipped = [cell_name(*c) for c in grid if c not in todo]
        if resources.executor == "local":
            computed, pending, failed = _run_here(out, data, todo, opts), [], []
        else:
            computed, pending, failed = _run_jobs(out, data, todo, opts, resources)
        if not pending:
            _write_tables(out, grid, targets, methods, shots, settings)
        if failed:
            raise cluster.GridFailed(failed)
    return {"computed": computed, "skipped": skipped, "pending": pending}


def _write_cell(out: Path, det, data, t: str, m: str, k: int, opts: dict, t0: float) -> str:
    """Evaluate cell (t, m, k) with ``det`` and write ``OUT/cells/<name>`` (atomic); returns the name."""
    cfg = det.info.get("config")  # trained: the run's recipe sigma; training-free: the method's own, else --recipe's
    own = getattr(det.method, "smooth_sigma", None)
    sigma = cfg.smooth_sigma if cfg is not None else own if own is not None else recipes.get(opts["recipe"]).smooth_sigma
    metrics = evaluate_cell(det, data, t, k, shot_seed=opts["shot_seed"], smooth_sigma=sigma,
                            batch_size=opts["batch_size"])
    pretrained = bool(det.info["backbone"].pretrained)
    write_json(out / "cells" / cell_name(t, m, k),
               {"key": {"target": t, "method": m, "shots": k}, "metrics": metrics, "pretrained": pretrained,
                "recipe": getattr(cfg, "recipe", None), "select": getattr(cfg, "select", None),
                "seconds": time.perf_counter() - t0})
    return cell_name(t, m, k)


def _run_here(out: Path, data, todo: list, opts: dict) -> list:
    """The cells of ``todo`` one after another in this process; one detector per (target, method)."""
    computed, base = [], {}
    bar = tqdm(todo, desc="table cells", disable=not opts["progress"])
    for t, m, k in bar:
        bar.set_postfix_str(f"{t} {m} k={k}")
        t0 = time.perf_counter()
        if (t, m) not in base:  # one detector per (target, method) at a time, reused across k
            base = {(t, m): _detector(out, data, t, m, opts)}
        computed.append(_write_cell(out, base[(t, m)], data, t, m, k, opts, t0))
    return computed


def compute_pair(out, data, target: str, method: str, shots: list, opts: dict) -> list:
    """The job of one (target, method) (:func:`poolsim.cluster.run_jobs`): its training run if trained
    (resumed from ``checkpoint_last.pt`` after a kill or a pre-emption) and every missing cell of
    ``shots``, as the sequential runner computes them. ``opts["threads"]``: torch threads (the driver's,
    so that the numbers do not depend on the executor). Returns the names of the cells written."""
    out = Path(out)
    ks = [k for k in shots if not cell_done(out / "cells" / cell_name(target, method, k))]
    if not ks:
        return []
    if opts.get("threads"):
        torch.set_num_threads(opts["threads"])
    t0 = time.perf_counter()
    det = _detector(out, data, target, method, opts)
    names = []
    for k in ks:
        names.append(_write_cell(out, det, data, target, method, k, opts, t0))
        t0 = time.perf_counter()
    return names


def _run_jobs(out: Path, data, todo: list, opts: dict, resources) -> tuple:
    """One job per (target, method) of ``todo``; returns ``(computed, pending, failed)``, ``failed`` as
    :class:`poolsim.cluster.Outcome`'s (jobs still failing after their retries)."""
    pairs: dict = {}
    for t, m, k in todo:
        pairs.setdefault((t, m), []).append(k)
    job_opts = {**opts, "progress": False,
                "threads": torch.get_num_threads() if resources.executor == "processes" else resources.cpus_per_cell}
    jobs = [cluster.Job(f"{t}__{m}", compute_pair, (str(out), str(data), t, m, ks, job_opts))
            for (t, m), ks in pairs.items()]

    def done(name):
        t, m = name.split("__")
        return all(cell_done(out / "cells" / cell_name(t, m, k)) for k in pairs[(t, m)])

    outcome = cluster.run_jobs(out / "jobs", jobs, resources, done=done, progress=opts["progress"],
                               desc="table jobs (target, method)")
    if outcome.pending:
        return [], list(outcome.pending), []
    computed = [cell_name(t, m, k) for t, m, k in todo if cell_done(out / "cells" / cell_name(t, m, k))]
    return computed, [], outcome.failed


def _write_tables(out: Path, grid, targets, methods, shots, settings: dict) -> None:
    cells = [read_json(out / "cells" / cell_name(*c)) for c in grid if cell_done(out / "cells" / cell_name(*c))]
    pretrained = bool(cells) and all(c.get("pretrained", False) for c in cells)
    on_test = sorted({c["key"]["method"] for c in cells if c.get("select") == "test"})
    used = {c["key"]["method"]: c["recipe"] for c in cells if c.get("recipe")}
    write_outputs(out, targets, methods, shots, {**settings, "pretrained": pretrained, "selected_on_test": on_test,
                                                 "recipes": {m: used[m] for m in methods if m in used}})
