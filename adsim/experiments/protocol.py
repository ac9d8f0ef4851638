"""``python -m adsim protocol``: leave-one-out domain addition with the DA score (paper Eq. 15).

For every *cell* ``(target, method, order, mode, seed)`` the five (generally: all available minus one)
training domains are added one at a time in an order -- ``hardest`` (closest to the target first, by the
measured Table-4-style similarity of the source's features, as the paper's "most difficult sequence"),
``reverse`` (farthest first) or ``random`` (a permutation seeded by ``(seed, target)``) -- and after each
step the target's test split is scored: image AUC (task ``AC``) and, for Brain/Liver/Retina_RESC, pixel
AUC (``AS``), in percent. ``cumulative`` trains step i from the same fresh initialisation on domains
1..i pooled (pooled in a canonical order, so the last step is the same model for every order: the
exchangeability the paper tests holds exactly here); ``sequential`` continues step i-1's head and
optimizer on domain i only. Methods: ``naive`` (MVFA-like: no matching, no VACA), ``match-l2``,
``match-cosine``, ``match-geodesic`` (matching with that gate metric, no VACA) and
``match-geodesic-vaca`` (the paper's method), and ``bilora``, the continual-learning baseline of the paper's
Fig. "final": the naive head's objective, but step i trains only domain i, as a BiLoRA update (a bilinear
frequency-domain low-rank delta per adapter weight, earlier domains' deltas frozen;
:mod:`adsim.methods.baselines.bilora`) on step i-1's head, in either mode. Every method of a
(target, seed) starts from the same adapter initialisation and sees the same batches.

Outputs under ``--out`` (all written atomically): ``cells/*.json`` (one per finished cell: the record a
resumed run keeps), ``protocol.csv`` (target, task, method, order, mode, seed, step, added, auc, data),
``da.csv`` (target, task, method, order, mode, seed, da, data; ``poolsim.da_score``),
``similarity.csv`` (measured similarities) and ``variance.csv`` (per-channel class vs modality variance
of the final VACA head, before and after VACA). ``protocol.json`` records the settings; resuming with
other settings is refused.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from adsim.config import recipes
from adsim.config.protocol import METHODS, MODES, ORDERS
from adsim.config.run import config_from_recipe
from adsim.data.domains import DOMAINS, MASKED, TASKS, canonical_domain
from adsim.inference.scoring import score_batches
from adsim.methods.baselines import bilora
from adsim.metrics.functional import auc_percent, smooth
from adsim.model.head import make_head
from adsim.runtime.io import cell_done, read_json, write_json
from adsim.training.train import make_optimizer, train_epoch
from poolsim import cluster, core, da_score
from poolsim.io import atomic_write, folder_lock


class Settings(NamedTuple):
    """Everything besides the grid of cells that fixes a cell's result (compared on resume)."""
    data: str                # "simulated" or the data folder
    sim: dict | None         # simulator parameters (simulated only)
    epochs: int              # passes over the step's training data
    batch_size: int
    lr: float
    backbone: str | None = None
    checkpoint: str | None = None
    image_size: int | None = None
    recipe: dict | None = None  # adsim.config.recipes.as_dict of the recipe (None: clean)


def order_domains(source, target: str, order: str, seed: int) -> list:
    """The training domains of ``target`` in the order they are added."""
    others = [d for d in source.domains if d != target]
    i = source.domains.index(target)
    closest = sorted(others, key=lambda d: (-source.similarity[i, source.domains.index(d)], d))
    if order == "hardest":
        return closest
    if order == "reverse":
        return closest[::-1]
    perm = np.random.default_rng([seed, DOMAINS.index(target), 7]).permutation(len(others))
    return [others[j] for j in perm]


def _seed(*parts) -> int:
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0])


EVAL_BATCH = 500  # scoring is per image in eval mode (VACA uses its running Delta): batch size is free


def _evaluate(source, head, target: str, tasks: tuple, batch_size: int, scoring: str) -> dict:
    batch_size = max(batch_size, EVAL_BATCH)
    out = score_batches(head, source.test_batches(target, batch_size), lambda x: source.forward(head, x),
                        grid=source.grid, size=source.size, device=torch.device("cpu"), maps="AS" in tasks,
                        scoring=scoring)
    res = {"AC": auc_percent(out["labels"], out["scores"])}
    if "AS" in tasks:
        res["AS"] = auc_percent(out["masks"], smooth(out["maps"], source.smooth_sigma))
    return res


@torch.no_grad()
def variance_rows(source, head, batch_size: int) -> list:
    """Per channel of the last layer's unit image features (detection branch, normalised patch mean)
    over every domain's test split: class variance ``mean_k ((mu_anom - mu_norm) / 2)^2`` and modality
    variance ``Var_k(mu_k)``, before and after VACA (paper Fig. "variance_plot")."""
    head.eval()
    stats = {}
    for d in source.domains:
        before, after, labels = [], [], []
        for batch in source.test_batches(d, max(batch_size, EVAL_BATCH)):
            f = source.forward(head, batch["image"])
            before.append(core.normalize(f.det_raw[-1].mean(1)))
            after.append(core.normalize(f.det[-1].mean(1)))
            labels.append(batch["label"])
        y = torch.cat(labels).bool()
        stats[d] = {k: torch.cat(v) for k, v in (("before", before), ("after", after))}
        stats[d]["y"] = y
    rows = []
    for which in ("before", "after"):
        cls = torch.stack([((s[which][s["y"]].mean(0) - s[which][~s["y"]].mean(0)) / 2) ** 2
                           for s in stats.values()]).mean(0)
        mod = torch.stack([s[which].mean(0) for s in stats.values()]).var(0, correction=0)
        rows.append((cls.numpy(), mod.numpy()))
    (cb, mb), (ca, ma) = rows
    return [{"channel": c, "class_before": float(cb[c]), "modality_before": float(mb[c]),
             "class_after": float(ca[c]), "modality_after": float(ma[c])} for c in range(len(cb))]


@torch.no_grad()
def vaca_gains(head) -> list:
    """Per VACA slot (layer, task) of a trained head: the channel gains ``w = 1 + gamma a`` at the
    running ``Delta`` (what evaluation uses): spread (max/min, sd) and the Pearson correlation of ``w``
    with ``Delta``. ``w`` constant (sd 0) means VACA is inert there (correlation then NaN)."""
    rows = []
    for k, v in enumerate(head.vaca or []):
        delta = v.delta_running.float()
        w = 1.0 + v.gamma * torch.nn.functional.softplus(v.mlp(delta))
        sd_w, sd_d = float(w.std(correction=0)), float(delta.std(correction=0))
        corr = float(((w - w.mean()) * (delta - delta.mean())).mean() / (sd_w * sd_d)) if sd_w > 0 and sd_d > 0 \
            else float("nan")
        rows.append({"slot": k, "task": "seg" if k < head.n_layers else "det", "layer": k % head.n_layers,
                     "w_min": float(w.min()), "w_max": float(w.max()), "w_ratio": float(w.max() / w.min()),
                     "w_sd": sd_w, "corr_w_delta": corr})
    return rows


def run_cell(source, settings: Settings, target, method, order, mode, seed, tasks, memo=None) -> dict:
    """Train and score one cell; returns ``{"rows": [...], "variance": [...]}``. ``memo`` (a dict) reuses
    cumulative steps already computed in this process for the same (target, method, seed, domain set):
    such a step is the same deterministic model whichever order reached it."""
    memo = {} if memo is None else memo
    spec = METHODS[method]
    recipe = recipes.override(recipe_of_settings(settings), method=spec["method"], metric=spec["metric"],
                        vaca=spec["vaca"], epochs=settings.epochs, batch_size=settings.batch_size, lr=settings.lr)
    cfg = config_from_recipe(recipe, data=settings.data, target=target, out="", seed=seed, precision="fp32")
    cpu = torch.device("cpu")
    t_idx = DOMAINS.index(target)
    domains = order_domains(source, target, order, seed)

    continual = spec.get("continual")

    def new_head():
        torch.manual_seed(_seed(seed, t_idx, 11))  # same adapters for every method of (target, seed)
        head = make_head(cfg, source.width, source.embed_dim, source.text, n_layers=source.n_layers)
        if continual == "bilora":
            bilora.attach(head)
        return head, make_optimizer(cfg, head), torch.amp.GradScaler("cpu", enabled=False)

    def next_domain(state, step):
        """BiLoRA: freeze the earlier domains' updates, add domain ``step``'s; a fresh optimiser on them."""
        head, _, scaler = state
        cores = bilora.add_domain(head, step - 1, _seed(seed, t_idx, 13))
        return head, torch.optim.Adam(cores, lr=cfg.lr, betas=cfg.betas), scaler

    def fit(state, doms, step):
        head, opt, scaler = state
        for epoch in range(settings.epochs):
            batches = source.train_batches(doms, settings.batch_size, _seed(seed, t_idx, step, epoch))
            train_epoch(cfg, head, opt, scaler, batches, lambda x: source.forward(head, x), source.grid, cpu, None)

    rows: list[dict] = []
    variance: dict[str, list] = {}  # the last step's: {"channels": [...], "gains": [...]}
    state = None
    for step in range(1, len(domains) + 1):
        last = step == len(domains)
        key = (target, method, seed, frozenset(domains[:step]))
        if continual == "bilora":
            state = next_domain(state or new_head(), step)
            fit(state, [domains[step - 1]], step)
            res = _evaluate(source, state[0], target, tasks, settings.batch_size, cfg.scoring)
            var: dict[str, list] = {"channels": [], "gains": []}
        elif mode == "cumulative" and key in memo:
            res, var = memo[key]
        else:
            if mode == "cumulative" or state is None:
                state = new_head()
            fit(state, domains[:step] if mode == "cumulative" else [domains[step - 1]], step)
            res = _evaluate(source, state[0], target, tasks, settings.batch_size, cfg.scoring)
            var = ({"channels": variance_rows(source, state[0], settings.batch_size),
                    "gains": vaca_gains(state[0])} if last and spec["vaca"] else {"channels": [], "gains": []})
            if mode == "cumulative":
                memo[key] = (res, var)
        rows += [{"task": t, "step": step, "added": domains[step - 1], "auc": res[t]} for t in tasks]
        variance = var
    out: dict[str, Any] = {"rows": rows, "variance": variance["channels"], "vaca_gains": variance["gains"], "order_domains": domains}
    if continual == "bilora":  # measured near-orthogonality of the domains' updates (all adapter weights)
        assert state is not None  # set by the loop's first step
        cos = bilora.update_cosines(state[0])
        pairs = cos[:, *torch.triu_indices(len(domains), len(domains), 1)].abs()
        out["bilora_update_cosine"] = {"max_abs": float(pairs.nan_to_num(0.0).max()),
                                       "mean_abs": float(pairs.nan_to_num(0.0).mean())}
    return out


def recipe_of_settings(settings: Settings) -> recipes.Recipe:
    return recipes.get("clean") if settings.recipe is None else recipes.from_dict(settings.recipe)


def shared_methods(recipe: recipes.Recipe, methods) -> dict:
    """``{method: method whose cells it shares}`` for the gate-metric ablation: where
    :func:`adsim.config.recipes.metric_equivalence` proves l2 / cosine / geodesic identical under ``recipe``,
    ``match-geodesic`` (else the first of them in ``methods``) is computed and the others copy its cells
    (recorded as ``shared_with``); otherwise every method maps to itself."""
    out = {m: m for m in methods}
    group = sorted((m for m in methods if METHODS[m]["method"] == "match" and not METHODS[m]["vaca"]),
                   key=lambda m: m != "match-geodesic")
    if group and recipes.metric_equivalence(recipes.override(recipe, method="match")) is not None:
        for m in group[1:]:
            out[m] = group[0]
    return out


def _cell_name(target, method, order, mode, seed) -> str:
    return f"{target}__{method}__{order}__{mode}__s{seed}.json"


def write_csv(path: Path, df: pd.DataFrame) -> None:
    """Write ``df`` to ``path`` as CSV without its index, atomically (``poolsim.io.atomic_write``: a reader
    never sees a half-written file; an interrupted write leaves the previous file)."""
    atomic_write(path, lambda fh: fh.write(df.to_csv(index=False).encode()))


def da_table(protocol: pd.DataFrame) -> pd.DataFrame:
    """``da.csv`` from ``protocol.csv`` rows: Eq. 15 on the AUCs ordered by step (``poolsim.da_score``;
    the paper's weights for five steps)."""
    keys = ["target", "task", "method", "order", "mode", "seed", "data"]
    out = []
    for k, g in protocol.sort_values("step").groupby(keys, sort=True):
        out.append({**dict(zip(keys, k)), "steps": len(g), "da": da_score(g["auc"].to_numpy())})
    return pd.DataFrame(out, columns=[*keys, "steps", "da"])


def write_outputs(out: Path, kind: str) -> pd.DataFrame:
    """Rebuild the CSVs from ``cells/*.json`` (atomic writes); returns the protocol table."""
    rows, var, gains = [], [], []
    for f in sorted((out / "cells").glob("*.json")):
        cell = read_json(f)
        k = cell["key"]
        rows += [{**k, **r, "data": kind} for r in cell["rows"]]
        var += [{**k, **r, "data": kind} for r in cell["variance"]]
        gains += [{**k, **r, "data": kind} for r in cell.get("vaca_gains", [])]
    cols = ["target", "task", "method", "order", "mode", "seed", "step", "added", "auc", "data"]
    protocol = pd.DataFrame(rows).reindex(columns=cols)
    write_csv(out / "protocol.csv", protocol)
    write_csv(out / "da.csv", da_table(protocol))
    if var:
        vcols = ["target", "method", "order", "mode", "seed", "channel", "class_before", "modality_before",
                 "class_after", "modality_after", "data"]
        write_csv(out / "variance.csv", pd.DataFrame(var).reindex(columns=vcols))
    if gains:
        write_csv(out / "vaca_gains.csv", pd.DataFrame(gains))
    return protocol


def check_request(domains, masked, targets, methods, orders, mode, tasks, seeds) -> tuple:
    """Validate the grid; returns ``(targets, tasks_by_target)``. One-line ``ValueError`` on bad input."""
    if len(domains) < 2:
        raise ValueError(f"need at least two modalities for leave-one-out, got {list(domains)}")
    targets = tuple(canonical_domain(t) for t in (targets or domains))
    missing = [t for t in targets if t not in domains]
    if missing:
        raise ValueError(f"target(s) {missing} not available; available modalities: {list(domains)}")
    for name, values, allowed in (("method", methods, tuple(METHODS)), ("order", orders, ORDERS),
                                  ("mode", [mode], MODES), ("task", tasks or [], TASKS)):
        bad = [v for v in values if v not in allowed]
        if bad:
            raise ValueError(f"unknown {name} {bad[0]!r}; must be one of {allowed}")
    if not isinstance(seeds, int) or seeds < 1:
        raise ValueError(f"seeds must be an integer >= 1, got {seeds!r}")
    by_target: dict[str, tuple[str, ...]] = {}
    for t in targets:
        if tasks is None:  # default: AC everywhere, AS where masks exist
            by_target[t] = ("AC", "AS") if t in masked else ("AC",)
        else:
            if "AS" in tasks and t not in masked:
                raise ValueError(f"target {t} has no pixel masks: pixel AUC (task AS) is only defined for "
                                 f"{list(masked)}")
            by_target[t] = tuple(x for x in TASKS if x in tasks)
    return targets, by_target


def run(out, source_for_seed, settings: Settings, *, targets=None, methods=tuple(METHODS), orders=ORDERS,
        mode: str = "cumulative", seeds: int = 3, tasks=None, progress: bool = True, domains=None,
        masked=MASKED, resources: cluster.Resources | None = None, wait: bool = False) -> dict:
    """Run (or resume) the protocol. ``source_for_seed(seed) -> Source`` is called lazily, once per seed
    that still has cells to compute. Returns ``{"computed": [cell names], "skipped": [...], "pending": [...]}``.

    ``resources`` (:class:`poolsim.cluster.Resources`, default ``executor="local"``): ``local`` computes the
    cells one after another in this process; ``processes`` / ``slurm`` make each missing cell a job
    (:func:`poolsim.cluster.run_jobs`; ``source_for_seed`` is then pickled into every job, so it should build
    its source rather than hold one) and merge the same CSVs from the cell files. The output folder is
    locked for the run (:func:`poolsim.io.folder_lock`; ``wait``: wait for another driver instead of failing)."""
    domains = tuple(domains or DOMAINS)
    targets, by_target = check_request(domains, masked, targets, list(methods), list(orders), mode, tasks, seeds)
    out = Path(out)
    recipe = recipe_of_settings(settings)
    shared = shared_methods(recipe, list(methods))
    why = recipes.metric_equivalence(recipes.override(recipe, method="match"))
    settings = settings._replace(recipe=recipes.as_dict(recipe))  # recorded in full (None = clean)
    record = {"settings": settings._asdict(), "mode_note": "cells/*.json are the record; CSVs are rebuilt",
              "recipe": recipes.as_dict(recipe),
              "metric_equivalence": ({"why": why, "copies": {m: r for m, r in shared.items() if r != m}}
                                     if any(r != m for m, r in shared.items()) else None)}
    resources = resources or cluster.Resources()
    with folder_lock(out, wait=wait):
        if (out / "protocol.json").exists():
            saved = read_json(out / "protocol.json")["settings"]
            if isinstance(saved.get("recipe"), dict):  # a recipe field added since then: the Recipe default it ran
                saved = {**saved,
                         "recipe": json.loads(json.dumps(recipes.as_dict(recipes.from_dict(saved["recipe"]))))}
            now = json.loads(json.dumps(record["settings"]))
            diff = sorted(k for k in now if now[k] != saved.get(k))
            if diff:
                raise ValueError(f"{out} holds a protocol run with other settings {diff}; use another --out")
        # representatives first, so that a method sharing their cells finds them computed
        ordered = sorted(methods, key=lambda m: shared[m] != m)
        grid = [(t, m, o, s) for s in range(seeds) for t in targets for m in ordered for o in orders]
        todo = [c for c in grid if not cell_done(out / "cells" / _cell_name(*c[:3], mode, c[3]))]
        skipped = [_cell_name(*c[:3], mode, c[3]) for c in grid if c not in todo]
        write_json(out / "protocol.json", record)
        if resources.executor == "local":
            computed, pending = _run_here(out, source_for_seed, settings, todo, shared, mode, by_target, progress)
        else:
            computed, pending = _run_jobs(out, source_for_seed, settings, todo, shared, mode, by_target, progress,
                                          resources)
        if not pending:
            write_outputs(out, settings_kind(settings))
    return {"computed": computed, "skipped": skipped, "pending": pending}


def _cell_record(t, m, o, mode, s, cell: dict, seconds: float) -> dict:
    return {"key": {"target": t, "method": m, "order": o, "mode": mode, "seed": s}, **cell, "seconds": seconds}


def _copy_of(out: Path, rep: str, t, o, mode, s) -> dict:
    """A cell of a method proven identical to ``rep`` (protocol.json "metric_equivalence"): copied, marked."""
    cell = {k: v for k, v in read_json(out / "cells" / _cell_name(t, rep, o, mode, s)).items()
            if k in ("rows", "variance", "vaca_gains", "order_domains")}
    return {**cell, "shared_with": rep}


def _run_here(out, source_for_seed, settings, todo, shared, mode, by_target, progress) -> tuple:
    """The cells of ``todo`` one after another in this process; returns ``(computed, pending=[])``."""
    source, seed_of_source, computed, last_write = None, None, [], time.monotonic()
    memo: dict = {}  # run_cell's cumulative steps of the current seed
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: more threads only add contention on a shared CPU
    try:
        bar = tqdm(todo, desc="protocol cells", disable=not progress)
        for t, m, o, s in bar:
            bar.set_postfix_str(f"{t} {m} {o} s{s}")
            if s != seed_of_source:  # one seed's data in memory at a time
                source, seed_of_source, memo = source_for_seed(s), s, {}
                write_similarity(out, source.domains, source.similarity, s)
            t0 = time.perf_counter()
            if shared[m] != m:
                cell = _copy_of(out, shared[m], t, o, mode, s)
            else:
                cell = run_cell(source, settings, t, m, o, mode, s, by_target[t], memo)
            name = _cell_name(t, m, o, mode, s)
            write_json(out / "cells" / name, _cell_record(t, m, o, mode, s, cell, time.perf_counter() - t0))
            computed.append(name)
            if time.monotonic() - last_write > 30:
                write_outputs(out, settings_kind(settings))
                last_write = time.monotonic()
    finally:
        torch.set_num_threads(threads)
    return computed, []


def compute_cell(out, source_for_seed, settings: Settings, cell: tuple, mode: str, tasks: tuple) -> str:
    """One cell ``(target, method, order, seed)`` in a job of its own (:func:`poolsim.cluster.run_jobs`): the
    cell file ``OUT/cells/<name>`` (atomic), and the seed's measured similarity in
    ``OUT/jobs/similarity_s<seed>.json`` for the driver's ``similarity.csv``. A finished cell is left as
    it is. Same numbers as the sequential runner: ``run_cell`` is deterministic given its arguments,
    one torch thread in both. Returns the cell file's name."""
    out = Path(out)
    t, m, o, s = cell
    name = _cell_name(t, m, o, mode, s)
    if cell_done(out / "cells" / name):
        return name
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    source = source_for_seed(s)
    sim_file = out / "jobs" / f"similarity_s{s}.json"
    if not sim_file.is_file():
        write_json(sim_file, {"domains": list(source.domains), "similarity": source.similarity.tolist()})
    result = run_cell(source, settings, t, m, o, mode, s, tasks)
    write_json(out / "cells" / name, _cell_record(t, m, o, mode, s, result, time.perf_counter() - t0))
    return name


def _run_jobs(out, source_for_seed, settings, todo, shared, mode, by_target, progress, resources) -> tuple:
    """The cells of ``todo`` as scheduler jobs; then the copies and ``similarity.csv`` in this process.
    Returns ``(computed, pending)``; cells still failing after the retries -> :class:`poolsim.cluster.GridFailed`."""
    names = {_cell_name(c[0], c[1], c[2], mode, c[3]): c for c in todo}
    jobs = [cluster.Job(name[:-len(".json")], compute_cell,
                        (str(out), source_for_seed, settings, c, mode, by_target[c[0]]))
            for name, c in names.items() if shared[c[1]] == c[1]]
    last = [time.monotonic()]

    def finished(_):  # a stopped driver keeps its partial CSVs, as the sequential runner does
        if time.monotonic() - last[0] > 30:
            write_outputs(out, settings_kind(settings))
            last[0] = time.monotonic()

    outcome = cluster.run_jobs(out / "jobs", jobs, resources, done=lambda n: cell_done(out / "cells" / f"{n}.json"),
                       progress=progress, desc="protocol cells", on_finish=finished)
    if outcome.pending:
        return [], [f"{n}.json" for n in outcome.pending]
    for s in sorted({c[3] for c in todo}):
        sim_file = out / "jobs" / f"similarity_s{s}.json"
        if sim_file.is_file():
            rec = read_json(sim_file)
            write_similarity(out, rec["domains"], np.asarray(rec["similarity"]), s)
    computed = [f"{j.name}.json" for j in jobs if j.name in outcome.results]
    for name, (t, m, o, s) in names.items():
        if shared[m] != m and cell_done(out / "cells" / _cell_name(t, shared[m], o, mode, s)):
            write_json(out / "cells" / name, _cell_record(t, m, o, mode, s, _copy_of(out, shared[m], t, o, mode, s),
                                                          0.0))
            computed.append(name)
    if outcome.failed:
        write_outputs(out, settings_kind(settings))
        raise cluster.GridFailed(outcome.failed)
    return computed, []


def settings_kind(settings: Settings) -> str:
    return "simulated" if settings.data == "simulated" else "real"


def write_similarity(out: Path, domains, similarity, seed: int) -> None:
    """Replace ``seed``'s rows of ``OUT/similarity.csv`` by ``similarity (D, D)`` over ``domains``."""
    path = out / "similarity.csv"
    old = pd.read_csv(path) if path.exists() else pd.DataFrame(columns=["seed", "domain_a", "domain_b", "cosine"])
    old = old[old["seed"] != seed]
    new = pd.DataFrame([{"seed": seed, "domain_a": a, "domain_b": b, "cosine": float(similarity[i, j])}
                        for i, a in enumerate(domains) for j, b in enumerate(domains)])
    write_csv(path, pd.concat([old, new], ignore_index=True) if len(old) else new)
