"""Zero-shot training: adapters (+ VACA, + geodesic matching) on every BMAD domain except the target.

The target's data is never read unless ``select="test"`` (the authors' protocol, clearly labelled as
optimistic in every output). Default: fixed number of epochs, last checkpoint. One backward pass per
step; autocast (bf16 on GPU, none on CPU; fp16 only with a GradScaler); gradient clipping; a checkpoint
after every epoch, written atomically, so a killed run resumes at the first unfinished epoch.
"""
from __future__ import annotations

import random
from collections import namedtuple
from pathlib import Path

import numpy as np
import open_clip
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from poolsim import _core

from . import _compile as C
from . import data as D
from . import distributed as DD
from . import losses as L
from . import recipes as R
from ._io import autocast_dtype, load_torch, read_json, resolve_device, save_torch, write_json
from .backbone import build_backbone, fingerprint
from .head import Head, _score, adapter_bottlenecks, text_embeddings, trunk_tokens

METHODS = R.CHOICES["method"]  # naive, match: the adapter head; others: a Trainer (adsim._method.TRAINERS)
SELECTIONS = ("last", "heldout", "test")


# The run's own fields (name, default); data, target and out are required.
_RUN = (("data", None), ("target", None), ("out", None),
        ("train_domains", None),  # None: every domain except the target
        ("backbone", "ViT-L-14-336"), ("checkpoint", None), ("image_size", None), ("quick_gelu", True),
        ("betas", (0.5, 0.999)), ("grad_clip", 1.0), ("holdout_frac", 0.2), ("seed", 0), ("device", "auto"),
        ("precision", "auto"), ("num_workers", 0))
_RUN_FIELDS = tuple(n for n, _ in _RUN)
# Every recipe field that training reads (protocol_mode is the protocol's), defaults = the clean recipe,
# plus ``recipe``: the name of the recipe the run started from (its fields may have been overridden).
_RECIPE = tuple((f, getattr(R.RECIPES["clean"], f)) for f in R.FIELDS if f not in ("name", "protocol_mode"))
TrainConfig = namedtuple("TrainConfig", [n for n, _ in (*_RUN, *_RECIPE)] + ["recipe"],
                         defaults=[v for _, v in (*_RUN[3:], *_RECIPE)] + ["clean"])
TrainConfig.__doc__ = """A training run: the run's own fields (``data``, ``target``, ``out``, ``backbone``, ...)
plus every field of :class:`adsim.recipes.Recipe` with the ``clean`` recipe's values as defaults;
:func:`config_from_recipe` builds one from any recipe."""


def validate(cfg: TrainConfig) -> TrainConfig:
    """Canonical domain names and every choice checked; returns the normalised config."""
    target = D.canonical_domain(cfg.target)
    domains = tuple(D.canonical_domain(d) for d in (cfg.train_domains or [d for d in D.DOMAINS if d != target]))
    if target in domains:
        raise ValueError(f"zero-shot: the target {target} must not be a training domain ({domains})")
    if not domains or len(set(domains)) != len(domains):
        raise ValueError(f"train_domains must be distinct and non-empty, got {domains}")
    recipe_of(cfg)  # every method choice: one-line error naming the field and the allowed values
    for s in cfg.train_splits:
        if s not in D.SPLITS:
            raise ValueError(f"train_splits must be drawn from {D.SPLITS}, got {s!r}")
    for name in ("epochs", "batch_size"):
        if not isinstance(getattr(cfg, name), int) or getattr(cfg, name) < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {getattr(cfg, name)!r}")
    if not cfg.lr > 0 or not cfg.grad_clip > 0:
        raise ValueError(f"lr and grad_clip must be > 0, got {cfg.lr!r}, {cfg.grad_clip!r}")
    return cfg._replace(target=target, train_domains=domains, train_splits=tuple(cfg.train_splits),
                        betas=tuple(cfg.betas))


def _trainer(cfg):
    """The method's own :class:`adsim._method.Trainer`, or ``None`` for the adapter head (naive, match)."""
    from ._method import TRAINERS
    return TRAINERS.get(cfg.method)


def recipe_of(cfg: TrainConfig) -> R.Recipe:
    """The validated recipe a config runs (its recipe fields; ``protocol_mode`` is the recipe default)."""
    fields = {f: getattr(cfg, f) for f in R.FIELDS if f not in ("name", "protocol_mode")}
    return R.validate(R.Recipe(name=cfg.recipe, **fields))


def config_from_recipe(recipe: R.Recipe, **run) -> TrainConfig:
    """``TrainConfig`` with every recipe field from ``recipe`` and the run's own fields from ``run``."""
    bad = sorted(set(run) - set(_RUN_FIELDS))
    if bad:
        raise ValueError(f"{bad[0]!r} is not a run field (recipe fields are set on the recipe); "
                         f"run fields: {_RUN_FIELDS}")
    fields = {f: getattr(recipe, f) for f in R.FIELDS if f not in ("name", "protocol_mode")}
    return TrainConfig(**fields, recipe=recipe.name, **run)


def make_head(cfg: TrainConfig, width: int, embed_dim: int, text, n_layers: int = 4) -> Head:
    """The head a config asks for: ``width`` = token dimension, ``embed_dim`` = text dimension.
    ``adapter_bias=False`` removes the adapters' biases (the authors' ``bias=False``, CLIP/adapter.py:22,26);
    ``gate_tau="fixed"`` gives the centroid gate the fixed radius ``tau``."""
    head = Head(width, embed_dim, text, n_layers=n_layers, vaca=cfg.vaca, gamma=cfg.gamma,
                matching=cfg.method == "match", metric=cfg.metric, gate_mode=cfg.gate_mode,
                alpha=cfg.alpha, update=cfg.update)
    if not cfg.adapter_bias:
        for ad in (*head.seg_adapters, *head.det_adapters):
            for lin in (ad.down, ad.up):
                lin.register_parameter("bias", None)
    if head.centroids is not None:
        head.centroids.tau = float(cfg.tau) if cfg.gate_tau == "fixed" else None
    return head


def make_optimizer(cfg: TrainConfig, head: Head) -> torch.optim.Optimizer:
    """Adam with the reference betas ``(0.5, 0.999)`` on every trainable head parameter."""
    return torch.optim.Adam(head.parameters(), lr=cfg.lr, betas=cfg.betas)


def _match_sets(cfg: TrainConfig, feats, labels, masks, has_mask, grid: int) -> list:
    """The features the gate sees: ``[(first slot, f (L, n, E) unit, y (n,), valid (n,), owner (n,))]``.

    Patch labels come from the mask pooled to the patch grid: normal if no lesion pixel, anomalous if at
    least half lesion, unknown (not matched) in between or without a known mask. ``gate_unit="patch"``:
    every patch token (Algorithm 1); ``"image_mean"``: per image the mean of its normal and the mean of
    its anomalous patch tokens (the authors' code, train_zero_da.py:323,354). ``match_branches="seg+det"``
    adds the detection branch's per-image mean token (slots L..2L-1; train_zero_da.py:192)."""
    b, n_layers = labels.shape[0], len(feats.seg)
    frac = F.adaptive_avg_pool2d(masks[:, None], grid).flatten(1)  # (B, N)
    normal = has_mask[:, None] * (frac == 0).to(frac.dtype)
    anomalous = has_mask[:, None] * (frac >= 0.5).to(frac.dtype)
    seg = torch.stack(feats.seg)  # (L, B, N, E)
    img = torch.arange(b, device=labels.device)
    if cfg.gate_unit == "patch":
        sets = [(0, seg.flatten(1, 2), (frac >= 0.5).to(frac.dtype).flatten(), (normal + anomalous).flatten(),
                 img.repeat_interleave(frac.shape[1]))]
    else:
        def mean(w):  # (B, N) weights -> (L, B, E) unit mean token
            return _core.normalize((seg * w[None, :, :, None]).sum(2))
        sets = [(0, torch.cat([mean(normal), mean(anomalous)], 1),
                 torch.cat([torch.zeros_like(labels), torch.ones_like(labels)]),
                 torch.cat([(normal.sum(1) > 0), (anomalous.sum(1) > 0)]).to(labels.dtype), img.repeat(2))]
    if cfg.match_branches == "seg+det":
        f_img = _core.normalize(torch.stack([d.mean(dim=1) for d in feats.det]))  # (L, B, E)
        sets.append((n_layers, f_img, labels, torch.ones_like(labels), img))
    return sets


def matching_losses(cfg: TrainConfig, head: Head, feats, labels, masks, has_mask, grid: int) -> tuple:
    """``(L_intra, L_inter, keep (B,))`` of the centroid matching (means over the matched sets and
    layers); updates the centroids (training mode). ``keep`` is the per-sample loss weight: 0 for a
    sample that failed the gate under ``gate_filter="skip_step"``, else 1. Every matched feature is a
    unit vector (``_match_sets``), so the gate and ``L_intra`` skip re-normalising, and ``L_intra``
    takes both centroids of a slot in one pass."""
    lm = cfg.metric if cfg.loss_metric == "gate" else "geodesic"
    sets = _match_sets(cfg, feats, labels, masks, has_mask, grid)
    matched = [(f, owner, v, head.centroids.step(start, f, y, v, unit=True)) for start, f, y, v, owner in sets]
    keep = torch.ones_like(labels)
    if cfg.gate_filter == "skip_step":
        failed = torch.zeros_like(labels)
        for _, owner, v, m in matched:  # a valid unit that neither centroid accepted failed the gate
            failed = failed.index_add(0, owner, (v * (1.0 - m.acc_pos - m.acc_neg)).amax(0))
        keep = (failed == 0).to(labels.dtype)
    norm = len(matched) * head.n_layers
    intra = inter = 0.0
    for f, owner, _, m in matched:
        k = keep[owner]
        acc_pos, acc_neg = m.acc_pos * k, m.acc_neg * k
        both = L.intra(f, torch.stack([acc_pos, acc_neg], -2), torch.stack([m.c_pos, m.c_neg], -2), metric=lm,
                       power=cfg.intra_power, unit=True)  # (L, 2)
        intra = intra + both.sum() / norm
        inter = inter + L.inter(m.c_pos, m.c_neg, m.init_pos * m.init_neg, metric=lm,
                                form=cfg.inter_form).sum() / norm
        if cfg.inter_form == "reciprocal":
            inter = inter + (L.cross(f, acc_pos, m.c_neg, m.init_neg, metric=lm)
                             + L.cross(f, acc_neg, m.c_pos, m.init_pos, metric=lm)).sum() / norm
    return intra, inter, keep


def objective(cfg: TrainConfig, head: Head, feats, batch, grid: int) -> tuple:
    """``L_total = b1 Dice + b2 Focal + b3 BCE + l1 L_intra + l2 L_inter + l_var Var`` (means over
    layers). Updates the centroids (training mode). With ``gate_filter="skip_step"`` a sample with a
    gate failure (any matched unit, any layer) gets weight 0 in every loss term (the authors skip its
    optimiser step; ``n_pass`` = samples left). Returns ``(loss, {name: detached value})``."""
    labels, masks, has_mask = batch["label"], batch["mask"], batch["has_mask"]
    if cfg.cls_only_pixel_loss == "none" and "pixel_domain" in batch:
        has_mask = has_mask * batch["pixel_domain"]  # no pixel loss on either class without masks
    size = masks.shape[-1]
    n_layers = head.n_layers
    parts = dict.fromkeys(("intra", "inter"), 0.0)
    keep = torch.ones_like(labels)  # (B,) per-sample loss weight
    if head.centroids is not None:
        parts["intra"], parts["inter"], keep = matching_losses(cfg, head, feats, labels, masks, has_mask, grid)
    # all layers at once: (L*B, S, S) logits against the masks repeated per layer (= mean over layers)
    z = F.interpolate(torch.stack(feats.seg_logits).reshape(-1, 1, grid, grid), size=(size, size),
                      mode="bilinear", align_corners=False)[:, 0]
    masks_l, valid_l = masks.repeat(n_layers, 1, 1), (has_mask * keep).repeat(n_layers)
    parts["dice"] = L.dice_loss(torch.sigmoid(z), masks_l, valid_l)
    parts["focal"] = L.focal_loss(z, masks_l, valid_l)
    parts["bce"] = L.bce_loss(feats.image_logits.flatten(), labels.repeat(n_layers), keep.repeat(n_layers))
    parts["var"] = feats.var
    parts["n_pass"] = keep.sum()
    loss = (cfg.beta_dice * parts["dice"] + cfg.beta_focal * parts["focal"] + cfg.beta_bce * parts["bce"]
            + cfg.lambda_intra * parts["intra"] + cfg.lambda_inter * parts["inter"]
            + cfg.lambda_var * parts["var"])
    # on the loss's device (a naive run's 0.0 terms too: a CPU constant would keep CUDA graphs off, _compile)
    return loss, {k: torch.as_tensor(v, device=loss.device).detach().float() for k, v in parts.items()}


def train_epoch(cfg: TrainConfig, head: Head, opt, scaler, batches, forward, grid: int, device, amp, *,
                desc: str = "epoch", progress: bool = False, gather=None, loss_fn=None) -> dict:
    """One pass over ``batches`` (dicts with ``image`` -- the model input: images, or tokens --,
    ``mask``, ``has_mask``, ``label``): forward, :func:`objective`, one backward pass, gradient
    clipping, optimizer step. ``forward(x) -> Features`` is the image path (:func:`adsim.head.features`)
    or the token path (``features_from_tokens``). Data-parallel (``adsim.distributed``): ``forward``
    returns the features of the global batch and ``gather(batch)`` the global batch's labels and masks.
    ``loss_fn(cfg, module, out, batch) -> (loss, parts)``: a method's own objective (its
    :class:`adsim._method.Trainer`; ``head`` is then that method's trainable module), default the head's
    :func:`objective`. Returns ``{"steps": n, loss name: mean over steps}``."""
    head.train()
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
            bar.set_postfix(loss=f"{float(loss.detach()):.4f}")
    return {"steps": steps, **{k: float(v) / max(steps, 1) for k, v in sums.items()}}


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _config_record(cfg: TrainConfig, backbone, prompts) -> dict:
    return {"config": cfg._asdict(), "recipe": R.as_dict(recipe_of(cfg)), "backbone_spec": backbone.spec._asdict(),
            "backbone_fingerprint": fingerprint(backbone.model), "prompts": prompts,
            "versions": {"torch": torch.__version__, "open_clip": open_clip.__version__},
            "protocol": ("AUTHORS' PROTOCOL: checkpoint selected on the TARGET's test set -- optimistic, "
                         "not zero-shot") if cfg.select == "test" else "zero-shot: target never used"}


class _PixelDomain(torch.utils.data.Dataset):
    """Adds ``pixel_domain`` (1 where the sample's domain has pixel masks) to every item, so that
    ``cls_only_pixel_loss="none"`` can drop the pixel loss of classification-only domains."""

    def __init__(self, dataset, samples):
        self.dataset, self.flags = dataset, [float(s.domain in D.MASKED) for s in samples]

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        return {**self.dataset[i], "pixel_domain": torch.tensor(self.flags[i])}


def _batch_to(batch, device):
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def train(cfg: TrainConfig, *, resume: bool = False, progress: bool = True, trunk_cache: bool = False,
          compile_mode: str | None = None) -> Path:
    """Train and checkpoint under ``cfg.out``; returns the run folder.

    Under torchrun, data-parallel (``adsim.distributed``; ``cfg.batch_size`` is the global batch).
    ``trunk_cache``: compute the frozen trunk's tokens once and train from them (``adsim.cache``;
    same result, less time per epoch, RAM for the cache). ``compile_mode`` (one of
    ``adsim._compile.MODES``; ``None``: eager): ``torch.compile`` the step after the frozen trunk
    (``adsim._compile``; same result up to float rounding, fewer kernel launches; batched gate, one
    process). Both are run settings, not recipe fields: recorded in ``config.json`` under
    ``"execution"``, and ``--resume`` may change them."""
    from .evaluate import selection_score  # evaluate imports train's helpers

    cfg = validate(cfg)
    ddp = DD.setup(cfg.device)  # [distributed] world size 1 without torchrun
    if compile_mode is not None:  # before any work: one-line error for a setting the compiled step lacks
        C.check_compatible(cfg, trainer=_trainer(cfg), world_size=ddp.size)
    local_batch = DD.local_batch_size(cfg.batch_size, ddp)
    progress = progress and ddp.rank == 0
    out = Path(cfg.out)
    last = out / "checkpoint_last.pt"
    if last.exists() and not resume:
        raise ValueError(f"{out} already holds a run; pass --resume to continue it or choose another --out")
    if resume:
        if not last.exists():
            raise ValueError(f"--resume: no checkpoint {last}")
        saved = read_json(out / "config.json")["config"]
        now = _jsonable(cfg._asdict())
        diff = sorted(k for k in now if k != "epochs" and now[k] != saved.get(k))
        if diff:
            raise ValueError(f"--resume with a different configuration ({diff}); only --epochs may change")
    _seed_everything(cfg.seed)
    device = DD.local_device(resolve_device(cfg.device), ddp)
    amp = autocast_dtype(cfg.precision, device)
    if compile_mode is not None:
        compile_mode = C.resolve_mode(compile_mode, device)
    backbone = build_backbone(cfg.backbone, image_size=cfg.image_size, checkpoint=cfg.checkpoint,
                              quick_gelu=cfg.quick_gelu, seed=cfg.seed, device=device)
    spec = backbone.spec
    prompts = R.prompts(cfg.prompts)
    trainer = _trainer(cfg)  # a method's own trainable module and loss, or None: the adapter head
    if trainer is None:
        head = make_head(cfg, spec.width, spec.embed_dim, text_embeddings(backbone, prompts)).to(device)
    else:
        if ddp.size > 1 or trunk_cache:
            raise ValueError(f"method {cfg.method} trains in one process without --trunk-cache")
        head = trainer.build(cfg, backbone).to(device)
    opt = make_optimizer(cfg, head)
    scaler = torch.amp.GradScaler(device.type, enabled=amp is torch.float16)

    samples = [s for d in cfg.train_domains for sp in cfg.train_splits for s in D.list_split(cfg.data, d, sp)]
    selection = []
    if cfg.select == "heldout":
        samples, selection = D.holdout(samples, cfg.holdout_frac, cfg.seed)
    elif cfg.select == "test":
        selection = D.list_split(cfg.data, cfg.target, "test")
    if selection:
        D.require_both_classes(selection, f"selection set ({cfg.select})")
    record = _jsonable(_config_record(cfg, backbone, prompts))
    record["n_train_images"] = len(samples)
    record["execution"] = {"compile": compile_mode, "trunk_cache": trunk_cache}  # of the latest (re)start
    if ddp.rank == 0:
        write_json(out / "config.json", record)

    start, history, best = 0, [], None
    if resume:
        ckpt = load_torch(last, map_location=device)
        head.load_state_dict(ckpt["head"])
        opt.load_state_dict(ckpt["optimizer"])
        scaler.load_state_dict(ckpt["scaler"])
        start, history, best = ckpt["epoch"] + 1, ckpt["history"], ckpt["best"]
    dataset = D.ImageDataset(samples, spec.image_size, clip_norm=cfg.clip_norm)
    loss_fn = None if trainer is None else trainer.loss
    if trainer is not None:  # a method's own training forward (adsim._method.Trainer)
        forward = lambda x: trainer.forward(head, backbone, x)  # noqa: E731
    else:
        if trunk_cache and start < cfg.epochs:
            from .cache import build_trunk_cache
            dataset = build_trunk_cache(backbone, dataset, device=device, amp=amp, batch_size=local_batch,
                                        num_workers=cfg.num_workers, progress=progress)
            per_rank = lambda h, x: adapter_bottlenecks(backbone, h, x)  # noqa: E731
        else:
            per_rank = lambda h, x: adapter_bottlenecks(backbone, h, trunk_tokens(backbone, x))  # noqa: E731
        if compile_mode is None:
            forward = DD.data_parallel(head, per_rank, _score, device)
        else:  # one process (check_compatible): the trunk eager, the rest of the step compiled
            forward = (lambda x: x) if trunk_cache else (lambda x: trunk_tokens(backbone, x))  # noqa: E731
            loss_fn = C.compiled_loss(cfg, head, backbone, spec.grid, amp, mode=compile_mode)
    dataset = _PixelDomain(dataset, samples)
    for epoch in range(start, cfg.epochs):
        # shuffling depends only on (seed, epoch): a resumed run sees the same order
        loader = torch.utils.data.DataLoader(dataset, batch_size=local_batch,
                                             sampler=DD.sampler(dataset, cfg.seed * 100_003, epoch, ddp),
                                             num_workers=cfg.num_workers, pin_memory=device.type == "cuda")
        entry = {"epoch": epoch, **train_epoch(cfg, head, opt, scaler, loader, forward, spec.grid, device, amp,
                                                desc=f"epoch {epoch + 1}/{cfg.epochs}", progress=progress,
                                                gather=DD.gather_dict if ddp.size > 1 else None,
                                                loss_fn=loss_fn)}
        DD.check_in_sync(head)
        if selection:
            scored = head if trainer is None else trainer.method(cfg, backbone, head)
            entry["selection_score"] = selection_score(backbone, scored, selection, cfg, device)
            if best is None or entry["selection_score"] > best["score"]:
                best = {"epoch": epoch, "score": entry["selection_score"]}
                if ddp.rank == 0:
                    save_torch(out / "checkpoint_best.pt", {"epoch": epoch, "head": head.state_dict()})
        history.append(entry)
        if ddp.rank == 0:  # [distributed] one writer; every rank holds the same state
            save_torch(last, {"epoch": epoch, "head": head.state_dict(), "optimizer": opt.state_dict(),
                              "scaler": scaler.state_dict(), "history": history, "best": best})
            write_json(out / "history.json", {"history": history, "best": best, "select": cfg.select})
    DD.barrier()  # the files exist for every rank when train() returns
    return out


def _jsonable(obj):
    """Tuples -> lists recursively, so a config compares equal to its JSON round trip."""
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return obj
