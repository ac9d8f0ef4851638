"""Zero-shot training: adapters (+ VACA, + geodesic matching), or a registered method's trainable part, on
every BMAD domain except the target -- pooled (every epoch shuffles all domains together) or, for a
method whose ``Trainer`` asks for it, sequentially (the domains one at a time; :func:`train`).

The target's data is never read unless ``select="test"`` (the authors' protocol, clearly labelled as
optimistic in every output). Default: fixed number of epochs, last checkpoint. One backward pass per
step; autocast (bf16 on GPU, none on CPU; fp16 only with a GradScaler); gradient clipping; a checkpoint
after every epoch, written atomically (a reader sees the previous checkpoint or the new one, never a part),
so a run killed at any moment -- even by SIGKILL inside a write -- resumes at the first unfinished epoch and
ends bitwise where the uninterrupted run ends (tests/adsim/test_adsim_crash.py, benchmarks/crash_soak.py).
"""
from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from adsim.config import recipes
from adsim.config.prompts import prompt_texts
from adsim.config.run import ADDED_FIELDS, TrainConfig, recipe_of, validate
from adsim.data import bmad
from adsim.data.mosaic import Mosaic
from adsim.data.domains import MASKED
from adsim.inference.detector import Detector
from adsim.inference.scoring import run_score, score
from adsim.methods import catalog
from adsim.methods.registry import HeadMethod, Method
from adsim.metrics.functional import auc_percent
from adsim.model.backbone import build_backbone, fingerprint
from adsim.model.head import (
    Head,
    deferred_finite_checks,
    adapter_bottlenecks,
    features_from_bottlenecks,
    make_head,
    text_embeddings,
    trunk_tokens,
)
from adsim.model.objective import objective
from adsim.runtime import distributed
from adsim.runtime.device import autocast_dtype, device_name, resolve_device
from adsim.runtime.io import load_torch, read_json, save_torch, write_json
from adsim.training import compiled_step
from adsim.training.cache import build_trunk_cache


def _trainer(cfg):
    """The method's own :class:`adsim.methods.Trainer`, or ``None`` for the adapter head (naive, match)."""
    return catalog.trainer(cfg.method)


def make_optimizer(cfg: TrainConfig, head: Head) -> torch.optim.Optimizer:
    """Adam with the reference betas ``(0.5, 0.999)`` on every trainable head parameter."""
    return torch.optim.Adam(head.parameters(), lr=cfg.lr, betas=cfg.betas)


def trainer_step(cfg: TrainConfig, trainer, module, backbone, compile_mode: str | None) -> tuple:
    """``(forward(images) -> out, loss_fn, regions)`` of a method's :class:`adsim.methods.registry.Trainer`
    on ``module`` as it is now: compiled (:func:`adsim.training.compiled_step.compiled_trainer`; ``regions``
    its compiled regions) unless ``compile_mode`` is ``None``, else eager (``regions`` ``None``)."""
    if compile_mode is not None:
        return compiled_step.compiled_trainer(cfg, trainer, module, backbone, mode=compile_mode)
    return (lambda x: trainer.forward(module, backbone, x)), trainer.loss, None


def sampler_seed(cfg: TrainConfig, domain: int | None) -> int:
    """Seed of the epoch shuffles (``distributed.sampler`` adds the epoch): ``cfg.seed * 100_003`` for
    the pooled schedule, plus ``1_000 (domain + 1)`` for domain ``domain`` of the sequential one (distinct
    shuffles per domain below 1,000 epochs); a resumed run sees the same order."""
    return cfg.seed * 100_003 + (0 if domain is None else 1_000 * (domain + 1))


def train_epoch(cfg: TrainConfig, head: Head, opt, scaler, batches, forward, grid: int, device, amp, *,
                desc: str = "epoch", progress: bool = False, gather=None, loss_fn=None) -> dict:
    """One pass over ``batches`` (dicts with ``image`` -- the model input: images, or tokens --,
    ``mask``, ``has_mask``, ``label``): forward, :func:`objective`, one backward pass, gradient
    clipping, optimizer step. ``forward(x) -> Features`` is the image path (:func:`adsim.model.head.features`)
    or the token path (``features_from_tokens``). Data-parallel (``adsim.runtime.distributed``): ``forward``
    returns the features of the global batch and ``gather(batch)`` the global batch's labels and masks.
    ``loss_fn(cfg, module, out, batch) -> (loss, parts)``: a method's own objective (its
    :class:`adsim.methods.registry.Trainer`; ``head`` is then that method's trainable module), default the head's
    :func:`objective`. Returns ``{"steps": n, loss name: mean over steps}``. NaN/inf features or a
    NaN/inf loss raise ``ValueError`` at the end of the epoch (before any checkpoint), not at the step:
    the steps read nothing back to the host (:func:`adsim.model.head.deferred_finite_checks`)."""
    head.train()
    with deferred_finite_checks() as pending:  # NaN/inf features: checked at the epoch's end, not per step
        return _epoch_steps(cfg, head, opt, scaler, batches, forward, grid, device, amp, desc, progress, gather,
                            loss_fn, pending)


def _epoch_steps(cfg, head, opt, scaler, batches, forward, grid, device, amp, desc, progress, gather, loss_fn,
                 pending) -> dict:
    """:func:`train_epoch`'s loop. A step reads nothing back to the host (no GPU sync), except the
    authors' gate filter (``gate_filter="skip_step"``, below), the exact slerp gate's replay
    (``adsim.model.matching.moved_steps``) and, with ``progress``, every 10th step's loss and finite flag."""
    sums, steps = {}, 0
    bar = tqdm(batches, desc=desc, disable=not progress, leave=False)
    for batch in bar:
        batch = _batch_to(batch, device)
        with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
            feats = forward(batch["image"])
        if gather is not None:  # data-parallel: the loss is computed on the global batch
            batch = gather(batch)
        loss, parts = objective(cfg, head, feats, batch, grid) if loss_fn is None else loss_fn(cfg, head, feats, batch)
        # the authors' gate filter: no optimiser step when no sample passed (a host sync, this mode only)
        skip = (cfg.gate_filter == "skip_step" and getattr(head, "centroids", None) is not None
                and float(parts["n_pass"]) == 0)
        parts["skipped"] = torch.tensor(float(skip))
        parts["loss"] = loss.detach()
        pending.add(torch.isfinite(parts["loss"]))  # every method's loss, read at the epoch's end
        if skip:
            for k, v in parts.items():
                sums[k] = sums.get(k, 0.0) + v
            steps += 1
            continue
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()  # the single backward pass of the step
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(head.parameters(), cfg.grad_clip)
        scaler.step(opt)
        scaler.update()
        for k, v in parts.items():
            sums[k] = sums.get(k, 0.0) + v
        steps += 1
        if progress and steps % 10 == 1:  # a host sync, so not every step
            pending.check()
            bar.set_postfix(loss=f"{float(loss.detach()):.4f}")
    return {"steps": steps, **{k: float(v) / max(steps, 1) for k, v in sums.items()}}


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _config_record(cfg: TrainConfig, backbone, prompts) -> dict:
    import open_clip  # loaded already with the backbone

    return {"config": cfg._asdict(), "recipe": recipes.as_dict(recipe_of(cfg)), "backbone_spec": backbone.spec._asdict(),
            "backbone_fingerprint": fingerprint(backbone.model), "prompts": prompts,
            "versions": {"torch": torch.__version__, "open_clip": open_clip.__version__},
            "protocol": ("AUTHORS' PROTOCOL: checkpoint selected on the TARGET's test set -- optimistic, "
                         "not zero-shot") if cfg.select == "test" else "zero-shot: target never used"}


class _DomainFlags(torch.utils.data.Dataset):
    """Adds ``pixel_domain`` (1 where the sample's domain has pixel masks, so that
    ``cls_only_pixel_loss="none"`` can drop the pixel loss of classification-only domains) and ``domain``
    (int64: the sample's domain as an index into ``domains``, ``cfg.train_domains``) to every item."""

    def __init__(self, dataset, samples, domains):
        index = {d: i for i, d in enumerate(domains)}
        self.dataset = dataset
        self.flags = [float(s.domain in MASKED) for s in samples]
        self.domains = [index[s.domain] for s in samples]

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        return {**self.dataset[i], "pixel_domain": torch.tensor(self.flags[i]),
                "domain": torch.tensor(self.domains[i], dtype=torch.int64)}


def _batch_to(batch, device):
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def execution_record(ddp, device: torch.device, *, compile_mode: str | None, trunk_cache: bool) -> dict:
    """``config.json``'s ``"execution"``: how this (re)start ran -- ``world_size`` (processes, e.g.
    torchrun's), ``device`` (its type) and ``device_name`` (:func:`adsim.runtime.device.device_name`: the
    GPU's name, or ``"cpu"``), the resolved ``compile`` mode (``None``: eager) and ``trunk_cache``."""
    return {"world_size": ddp.size, "device": device.type, "device_name": device_name(device),
            "compile": compile_mode, "trunk_cache": trunk_cache}


def train(cfg: TrainConfig, *, resume: bool = False, progress: bool = True, trunk_cache: bool = False,
          compile_mode: str | None = compiled_step.DEFAULT) -> Path:
    """Train and checkpoint under ``cfg.out``; returns the run folder.

    Under torchrun, data-parallel (``adsim.runtime.distributed``; ``cfg.batch_size`` is the global batch).
    ``trunk_cache``: compute the frozen trunk's tokens once and train from them (``adsim.training.cache``;
    same result, less time per epoch, RAM for the cache). ``compile_mode`` (one of
    ``adsim.training.compiled_step.CHOICES``; default ``"off"``: eager, ``docs/compile.md`` says when
    compiling pays back; ``"cuda"``: compiled with CUDA graphs on a CUDA device in one process, eager elsewhere): ``torch.compile`` the step
    after the frozen trunk (``adsim.training.compiled_step``; same result up to float rounding, fewer
    kernel launches; one process; falls back to eager with one warning if compilation fails). Both are
    run settings, not recipe fields: recorded in ``config.json`` under ``"execution"`` (with the world
    size and the device), and ``--resume`` may change them.

    A method whose :class:`adsim.methods.registry.Trainer` has ``schedule="sequential"`` trains one phase
    per training domain, in ``cfg.train_domains`` order: ``trainer.start_domain(cfg, module, index)``, a
    fresh optimiser (:func:`make_optimizer`), then ``cfg.epochs`` epochs on that domain's samples only
    (``cfg.epochs`` per domain, so ``len(train_domains) * epochs`` epochs in all). The checkpoints record
    ``(domain, epoch)``, so ``--resume`` continues inside the interrupted domain (optimiser state
    included); a changed ``--epochs`` applies from the checkpoint's domain on (that domain continues to
    the new count; the domains before it keep theirs). History entries name the
    domain (``domain``, ``domain_index``); checkpoint selection scores after every epoch of every domain.
    The step (compiled or eager) is rebuilt for every domain, as the set of trained parameters changes;
    after a compile fallback the remaining domains train eagerly (one warning in all)."""

    cfg = validate(cfg)
    if trunk_cache and cfg.aug_rate > 0:
        raise ValueError(f"--trunk-cache computes each image's tokens once: it cannot train on the mosaic "
                         f"augmentation (aug_rate {cfg.aug_rate}); set aug_rate=0 or drop --trunk-cache")
    ddp = distributed.setup(cfg.device)  # [distributed] world size 1 without torchrun
    if compile_mode not in (None, "off", compiled_step.DEFAULT):  # asked for: one-line error before any work
        compiled_step.check_compatible(cfg, world_size=ddp.size)
    local_batch = distributed.local_batch_size(cfg.batch_size, ddp)
    progress = progress and ddp.rank == 0
    out = Path(cfg.out)
    last = out / "checkpoint_last.pt"
    if last.exists() and not resume:
        raise ValueError(f"{out} already holds a run; pass --resume to continue it or choose another --out")
    if resume and not last.exists():
        resume = False  # stopped before its first checkpoint (or never started): it starts over
    if resume:
        saved = read_json(out / "config.json")["config"]
        now = _jsonable(cfg._asdict())
        diff = sorted(k for k in now if k != "epochs" and now[k] != saved.get(k, ADDED_FIELDS.get(k)))
        if diff:
            raise ValueError(f"--resume with a different configuration ({diff}); only --epochs may change")
    _seed_everything(cfg.seed)
    device = distributed.local_device(resolve_device(cfg.device), ddp)
    amp = autocast_dtype(cfg.precision, device)
    compile_mode = compiled_step.resolve_mode(compile_mode, device, world_size=ddp.size)
    backbone = build_backbone(cfg.backbone, image_size=cfg.image_size, checkpoint=cfg.checkpoint,
                              quick_gelu=cfg.quick_gelu, seed=cfg.seed, device=device)
    spec = backbone.spec
    prompts = prompt_texts(cfg.prompts)
    trainer = _trainer(cfg)  # a method's own trainable module and loss, or None: the adapter head
    if trainer is None:
        head = make_head(cfg, spec.width, spec.embed_dim, text_embeddings(backbone, prompts)).to(device)
    else:
        if ddp.size > 1 or trunk_cache:
            raise ValueError(f"method {cfg.method} trains in one process without --trunk-cache")
        head = trainer.build(cfg, backbone).to(device)
    # "sequential" (adsim.methods.registry.SCHEDULES): one phase per training domain, each with its own
    # optimiser built after trainer.start_domain; otherwise one phase over the pooled domains
    sequential = trainer is not None and trainer.schedule == "sequential"
    opt = None if sequential else make_optimizer(cfg, head)
    scaler = torch.amp.GradScaler(device.type, enabled=amp is torch.float16)

    samples = [s for d in cfg.train_domains for sp in cfg.train_splits for s in bmad.list_split(cfg.data, d, sp)]
    selection = []
    if cfg.select == "heldout":
        samples, selection = bmad.holdout(samples, cfg.holdout_frac, cfg.seed)
    elif cfg.select == "test":
        selection = bmad.list_split(cfg.data, cfg.target, "test")
    if selection:
        bmad.require_both_classes(selection, f"selection set ({cfg.select})")
    record = _jsonable(_config_record(cfg, backbone, prompts))
    record["n_train_images"] = len(samples)
    record["schedule"] = trainer.schedule if trainer is not None else "pooled"
    # of the latest (re)start; "compile_failed" is added if the compiled step falls back to eager
    record["execution"] = execution_record(ddp, device, compile_mode=compile_mode, trunk_cache=trunk_cache)
    if ddp.rank == 0:
        write_json(out / "config.json", record)

    # where training goes on: (phase, epoch) -- the phase is the domain index when sequential, else 0
    start, history, best = (0, 0), [], None
    if resume:
        ckpt = resume_checkpoint(last, device)
        phase = ckpt.get("domain") or 0
        if sequential:  # the checkpoint's parameters exist once every domain it started has started
            for d in range(phase + 1):
                trainer.start_domain(cfg, head, d)
            opt = make_optimizer(cfg, head)
        head.load_state_dict(ckpt["head"])
        opt.load_state_dict(ckpt["optimizer"])
        scaler.load_state_dict(ckpt["scaler"])
        start, history, best = (phase, ckpt["epoch"] + 1), ckpt["history"], ckpt["best"]
        if ddp.rank == 0:  # as the checkpoint has it: a stop between the two writes left it an epoch behind
            write_json(out / "history.json", {"history": history, "best": best, "select": cfg.select})
    dataset = bmad.ImageDataset(samples, spec.image_size, clip_norm=cfg.clip_norm)
    mosaic = None  # the 2 x 2 mosaic augmentation (recipe aug_rate), drawn per (phase, epoch, item)
    if cfg.aug_rate > 0:
        dataset = mosaic = Mosaic(dataset, [s.domain for s in samples], cfg.aug_rate, seed=cfg.seed)
    loss_fn, regions = None, None
    if trainer is None:
        if trunk_cache and start[1] < cfg.epochs:
            dataset = build_trunk_cache(backbone, dataset, device=device, amp=amp, batch_size=local_batch,
                                        num_workers=cfg.num_workers, progress=progress)
            per_rank = lambda h, x: adapter_bottlenecks(backbone, h, x)  # noqa: E731
        else:
            per_rank = lambda h, x: adapter_bottlenecks(backbone, h, trunk_tokens(backbone, x))  # noqa: E731
        if compile_mode is None:
            forward = distributed.data_parallel(head, per_rank, features_from_bottlenecks, device)
        else:  # one process (resolve_mode, check_compatible): the trunk eager, the rest of the step compiled
            forward = (lambda x: x) if trunk_cache else (lambda x: trunk_tokens(backbone, x))  # noqa: E731
            loss_fn = compiled_step.compiled_loss(cfg, head, backbone, spec.grid, amp, mode=compile_mode)
            regions = loss_fn.regions
    dataset = _DomainFlags(dataset, samples, cfg.train_domains)

    def run_phase(domain, first_epoch, data, opt, forward, loss_fn, regions):
        """Epochs ``first_epoch .. cfg.epochs - 1`` on ``data`` (domain index ``domain``, ``None``: pooled),
        each followed by checkpoint selection, the history entry and the checkpoint."""
        nonlocal best
        name = "" if domain is None else f"{cfg.train_domains[domain]} "
        for epoch in range(first_epoch, cfg.epochs):
            if mosaic is not None:
                mosaic.set_epoch(epoch, 0 if domain is None else domain + 1)
            loader = torch.utils.data.DataLoader(data, batch_size=local_batch,
                                                 sampler=distributed.sampler(data, sampler_seed(cfg, domain), epoch, ddp),
                                                 num_workers=cfg.num_workers, pin_memory=device.type == "cuda")
            where = {"epoch": epoch} if domain is None else \
                {"domain": cfg.train_domains[domain], "domain_index": domain, "epoch": epoch}
            entry = {**where, **train_epoch(cfg, head, opt, scaler, loader, forward, spec.grid, device, amp,
                                            desc=f"{name}epoch {epoch + 1}/{cfg.epochs}", progress=progress,
                                            gather=distributed.gather_dict if ddp.size > 1 else None,
                                            loss_fn=loss_fn)}
            distributed.check_in_sync(head)
            if regions is not None and regions.fell_back and "compile_failed" not in record["execution"]:
                record["execution"]["compile_failed"] = True  # this run trained eagerly after the warning
                if ddp.rank == 0:
                    write_json(out / "config.json", record)
            if selection:
                scored = head if trainer is None else trainer.method(cfg, backbone, head)
                entry["selection_score"] = selection_score(backbone, scored, selection, cfg, device)
                if best is None or entry["selection_score"] > best["score"]:
                    best = {**where, "score": entry["selection_score"]}
                    if ddp.rank == 0:
                        save_torch(out / "checkpoint_best.pt", {"epoch": epoch, "domain": domain,
                                                                "head": head.state_dict()})
            history.append(entry)
            if ddp.rank == 0:  # [distributed] one writer; every rank holds the same state
                save_torch(last, {"epoch": epoch, "domain": domain, "head": head.state_dict(),
                                  "optimizer": opt.state_dict(), "scaler": scaler.state_dict(),
                                  "history": history, "best": best})
                write_json(out / "history.json", {"history": history, "best": best, "select": cfg.select})

    for phase in range(start[0], len(cfg.train_domains) if sequential else 1):
        domain = phase if sequential else None
        data = dataset
        if sequential:
            if not (resume and phase == start[0]):  # a domain the checkpoint has not started
                trainer.start_domain(cfg, head, domain)
                opt = make_optimizer(cfg, head)
            data = torch.utils.data.Subset(dataset, [i for i, d in enumerate(dataset.domains) if d == domain])
            if not len(data):
                raise ValueError(f"train domain {cfg.train_domains[domain]} has no training images in splits "
                                 f"{cfg.train_splits}")
        first = start[1] if phase == start[0] else 0
        if first >= cfg.epochs:
            continue
        if trainer is not None:  # built per phase: a sequential phase may change which parameters train
            eager = compile_mode is None or record["execution"].get("compile_failed", False)
            forward, loss_fn, regions = trainer_step(cfg, trainer, head, backbone, None if eager else compile_mode)
        run_phase(domain, first, data, opt, forward, loss_fn, regions)
    distributed.barrier()  # the files exist for every rank when train() returns
    return out


RESUME_KEYS = ("epoch", "head", "optimizer", "scaler", "history", "best")


def resume_checkpoint(path: Path, device) -> dict:
    """``checkpoint_last.pt`` for ``--resume``: a torch file (``adsim.runtime.io.load_torch``; a damaged
    or truncated file -> ``ValueError`` naming it) holding every entry a resume needs
    (:data:`RESUME_KEYS`; otherwise ``ValueError`` naming the missing ones)."""
    ckpt = load_torch(path, map_location=device)
    missing = [k for k in RESUME_KEYS if k not in ckpt]
    if missing or not isinstance(ckpt["head"], dict) or not isinstance(ckpt["history"], list):
        raise ValueError(f"checkpoint {path} lacks {missing or 'a head state dict and a history list'}: "
                         "not a complete adsim training checkpoint")
    return ckpt


def _jsonable(obj):
    """Tuples -> lists recursively, so a config compares equal to its JSON round trip."""
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return obj


def selection_score(backbone, head, samples, cfg, device) -> float:
    """Model-selection criterion: mean over domains of the image AUC (plus pixel AUC where masks
    exist, averaged). With ``select="heldout"`` the samples are held-out *training-domain* data.
    ``head``: the adapter head, or a method's :class:`adsim.methods.registry.Method` (``Trainer.method``)."""
    was_training = head.training
    method = head if isinstance(head, Method) else HeadMethod(backbone, head, scoring=run_score(cfg),
                                                               clip_norm=cfg.clip_norm, name=cfg.method)
    detector = Detector(method, device=device, precision=cfg.precision)
    values = []
    for domain in sorted({s.domain for s in samples}):
        sub = [s for s in samples if s.domain == domain]
        if len({s.label for s in sub}) < 2:
            continue
        has_masks = domain in MASKED
        out = score(detector, sub, batch_size=cfg.batch_size, maps=has_masks)
        values.append(auc_percent(out["labels"], out["scores"]))
        if has_masks and out["masks"].any():
            values.append(auc_percent(out["masks"], out["maps"]))
    head.train(was_training)
    if not values:
        raise ValueError("selection set has no domain with both normal and anomalous images")
    return float(np.mean(values))
