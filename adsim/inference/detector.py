"""Inference: the one path from images to anomaly scores and pixel maps.

``Detector.from_run(RUN)`` rebuilds a trained run's method (``adsim.methods.registry.TRAINED[cfg.method]``),
``Detector.zero_shot(name, backbone=..., checkpoint=...)`` a training-free one
(``adsim.methods.catalog.zero_shot``). ``predict(images)`` takes a folder, a list of paths, PIL images or a
tensor ``(B, 3, H, W)`` in ``[0, 1]`` and returns a :class:`Prediction` (NumPy; no labels needed);
``score_samples(samples)`` streams labelled ``adsim.data.Sample`` batches (evaluation, model selection).
Both run the method under ``torch.inference_mode()`` batch by batch on the detector's device, with
the training preprocessing (``adsim.data.preprocess``: bicubic resize to the method's image size, CLIP
normalisation when the method's ``clip_norm``); only what the caller keeps accumulates, so peak memory
does not grow with the number of images (``maps=False`` and ``overlays=DIR`` keep no map at all).

Bad input: an unreadable or non-image file is skipped with one :class:`UnreadableImageWarning` line
naming it and the reason (one line for a damaged volume, not one per slice; ``strict=True``:
``ValueError``); a run folder this adsim version cannot rebuild (a config
field unknown to it or missing, a value it does not know, another backbone, a head state dict that
does not fit) raises ``ValueError`` naming what differs.
"""
from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any, Iterator, NamedTuple

import numpy as np
import torch
from tqdm.auto import tqdm

from adsim.config.choices import require_weights
from adsim.config.run import ADDED_FIELDS, TrainConfig, validate
from adsim.data import bmad
from adsim.data.images import image_items
from adsim.data.medical import Source, UnreadableInput
from adsim.inference.overlays import overlay_names, write_overlay
from adsim.inference.scoring import run_score
from adsim.methods import catalog, registry
from adsim.methods.fewshot import attach
from adsim.model.backbone import Backbone, build_backbone, fingerprint
from adsim.runtime.device import autocast_dtype, resolve_device
from adsim.runtime.io import load_torch, read_json

CHECKPOINTS = ("auto", "last", "best")


class UnreadableImageWarning(UserWarning):
    """An input file could not be read as an image and was skipped."""


class BatchScores(NamedTuple):
    """What :meth:`Detector.score_samples` gives per batch of ``b`` images of side ``S``: the fields of
    ``adsim.methods.registry.Output`` on the host: ``scores: (b,)`` and ``maps: (b, S, S)`` float32 NumPy
    (``maps`` ``None`` when not asked for); ``patches`` is left empty."""
    scores: np.ndarray
    maps: np.ndarray | None
    patches: tuple = ()


class Prediction(NamedTuple):
    """``paths``: one name per scored image (the file path; ``<file> [frame i]`` / ``<file> [axial slice
    k]`` for a DICOM frame or NIfTI slice; ``<PIL image i>`` / ``<tensor image i>``); ``scores: (n,)``
    float32, higher = more anomalous; ``maps: (n, S, S)`` float32 pixel maps at the method's input size
    ``S``, or ``None`` with ``maps=False``. ``records``: per scored image, where its score came from
    (:func:`record`: ``path``, ``kind``, ``index``, ``axis``, ``window``, ``volume``, ``description``,
    ``overlay``); ``volumes``: one row per volume (:func:`volume_rows`)."""
    paths: list
    scores: np.ndarray
    maps: np.ndarray | None
    records: list | None = None
    volumes: list | None = None


KINDS = ("image", "frame", "slice", "volume")


def record(name: str, src, window: str, overlay: str | None = None) -> dict:
    """Where one scored picture came from: ``path`` (the file, or the name of a PIL/tensor image),
    ``kind`` (``image``, ``frame`` or ``slice``), ``index`` (frame/slice, None for a 2-D image), ``axis``
    (a slice's axis name and voxel axis), ``window`` (how stored values became pixels), ``volume`` (the
    volume it belongs to, or None), ``description`` (DICOM Modality and Series Description), ``overlay``
    (its overlay file name, if written)."""
    if isinstance(src, Source):
        axis = f"{src.axis_name} (voxel axis {src.axis})" if src.kind == "slice" else None
        return {"path": str(src.path), "kind": src.kind, "index": src.index, "axis": axis, "window": window,
                "volume": src.volume, "description": src.description, "overlay": overlay}
    return {"path": name, "kind": "image", "index": None, "axis": None, "window": window, "volume": None,
            "description": "", "overlay": overlay}


def volume_rows(records: list, scores, topk: int = 1) -> list:
    """One row per volume of ``records`` (in order of first appearance): ``path`` (the volume: its file,
    or ``<folder> [series N]``), ``kind`` ``"volume"``, ``score`` = the mean of its ``topk`` highest
    slice/frame scores (``topk = 1``: the maximum), ``n`` (pictures scored), ``window`` (its pictures'
    window, or ``"per picture"`` when they differ), ``rule``, ``last`` (position of its last picture)."""
    _check_topk(topk)
    groups: dict[str, list[int]] = {}  # volume -> positions of its pictures
    for i, r in enumerate(records):
        if r.get("volume"):
            groups.setdefault(r["volume"], []).append(i)
    rows = []
    for name, idx in groups.items():
        s = np.sort(np.asarray([float(scores[i]) for i in idx]))[::-1]
        k = min(topk, len(s))
        windows = {records[i]["window"] for i in idx}
        axes = {records[i]["axis"] for i in idx}
        rows.append({"path": name, "kind": "volume", "index": None,
                     "axis": axes.pop() if len(axes) == 1 else None, "score": float(s[:k].mean()), "n": len(idx),
                     "window": windows.pop() if len(windows) == 1 else "per picture",
                     "rule": "max of the slice scores" if k == 1 else f"mean of the {k} highest slice scores",
                     "description": records[idx[0]]["description"], "last": idx[-1]})
    return rows


def _check_topk(topk) -> None:
    if not isinstance(topk, int) or isinstance(topk, bool) or topk < 1:
        raise ValueError(f"volume top-k must be an integer >= 1, got {topk!r}")


class Run(NamedTuple):
    """A run folder, rebuilt: its validated config, ``config.json`` record, frozen backbone (on
    ``device``), checkpoint head state dict and ``{"file", "epoch"}`` of the checkpoint."""
    cfg: TrainConfig
    record: dict
    backbone: Backbone
    state: dict
    checkpoint: dict
    device: torch.device


def _run_config(record: dict, where: Path):
    """``TrainConfig`` of a ``config.json`` record; a field unknown to this version, a missing field (except
    those of ``adsim.config.run.ADDED_FIELDS``, read with the value older runs ran) or an unknown value ->
    ``ValueError`` naming it."""

    fields = record.get("config")
    if not isinstance(fields, dict):
        raise ValueError(f"{where} has no 'config' object: not a run folder of this adsim version")
    fields = {**{k: v for k, v in ADDED_FIELDS.items() if k not in fields}, **fields}
    unknown = sorted(set(fields) - set(TrainConfig._fields))
    missing = sorted(set(TrainConfig._fields) - set(fields))
    if unknown or missing:
        what = "; ".join(part for part in (unknown and f"fields unknown to this adsim version: {unknown}",
                                            missing and f"fields missing: {missing}") if part)
        raise ValueError(f"{where} was written by another adsim version or recipe set ({what})")
    for key in ("backbone_fingerprint", "prompts"):
        if key not in record:
            raise ValueError(f"{where} lacks {key!r}: written by another adsim version")
    values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}  # JSON's
    cfg = TrainConfig(**values)
    try:
        return validate(cfg)
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None


def load_run(run, *, checkpoint: str = "auto", device: str = "auto") -> Run:
    """Rebuild a run folder's config, backbone (weights checked against the run's fingerprint) and
    checkpoint state; ``checkpoint``: ``"auto"`` (best when the run selected one, else last),
    ``"last"`` or ``"best"``."""
    run = Path(run)
    where = run / "config.json"
    if not where.is_file():
        raise ValueError(f"{run} is not a run folder (no config.json)")
    record = read_json(where)
    cfg = _run_config(record, where)
    if checkpoint not in CHECKPOINTS:
        raise ValueError(f"checkpoint must be one of {CHECKPOINTS}, got {checkpoint!r}")
    if checkpoint == "auto":
        checkpoint = "best" if cfg.select != "last" else "last"
    path = run / f"checkpoint_{checkpoint}.pt"
    if not path.is_file():
        raise ValueError(f"missing checkpoint {path}")
    dev = resolve_device(device)
    backbone = build_backbone(cfg.backbone, image_size=cfg.image_size, checkpoint=cfg.checkpoint,
                              quick_gelu=cfg.quick_gelu, seed=cfg.seed, device=dev)
    saved_spec = record.get("backbone_spec")
    if isinstance(saved_spec, dict):
        now = {k: list(v) if isinstance(v, tuple) else v for k, v in backbone.spec._asdict().items()}
        diff = sorted(k for k in set(now) | set(saved_spec) if now.get(k) != saved_spec.get(k))
        if diff:
            raise ValueError(f"{where}: this adsim version builds {cfg.backbone} differently "
                             f"({', '.join(f'{k}: run {saved_spec.get(k)!r}, now {now.get(k)!r}' for k in diff)})")
    fp = fingerprint(backbone.model)
    if not math.isclose(fp, record["backbone_fingerprint"], rel_tol=1e-9, abs_tol=1e-6):
        raise ValueError(f"backbone weights differ from the run's (fingerprint {fp} vs "
                         f"{record['backbone_fingerprint']}): wrong --checkpoint or a changed file")
    ckpt = load_torch(path, map_location=dev)
    if not isinstance(ckpt.get("head"), dict) or "epoch" not in ckpt:
        raise ValueError(f"checkpoint {path} has no 'head' state dict and 'epoch': not an adsim run checkpoint")
    return Run(cfg, record, backbone, ckpt["head"], {"file": path.name, "epoch": int(ckpt["epoch"])}, dev)


class _Images(torch.utils.data.Dataset):
    """``(name, source)`` items (a path, a PIL image or an ``adsim.data.medical.Source``) -> ``{"index",
    "image", "window"}``, or ``{"index", "error"}`` for a file that cannot be read as an image (the caller
    warns or raises)."""

    def __init__(self, items: list, size: int, clip_norm: bool):
        self.items, self.size, self.clip_norm = items, size, clip_norm

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        src = self.items[i][1]
        try:
            image, window = bmad.load_image(src, self.size, clip_norm=self.clip_norm)
            return {"index": i, "image": image, "window": window}
        except UnreadableInput as err:  # names the file itself: the reason alone
            return {"index": i, "error": err.reason}
        except bmad.UNREADABLE as err:
            return {"index": i, "error": f"{type(err).__name__}: {err}"}


def _collate(items: list) -> dict:
    ok = [it for it in items if "image" in it]
    return {"index": [it["index"] for it in ok], "image": torch.stack([it["image"] for it in ok]) if ok else None,
            "window": [it["window"] for it in ok],
            "errors": [(it["index"], it["error"]) for it in items if "error" in it]}


def _printable(name: str) -> str:
    """``name`` on one line: control characters (a newline in a file name) shown escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in name)


class Detector:
    """A method (``adsim.methods.registry.Method``) on a device, ready to score images.

    Attributes: ``method``, ``device`` (``torch.device``), ``info`` (dict: where the method came from,
    e.g. the run folder and checkpoint). ``precision``: autocast of the forward pass (``"auto"``: bf16
    on GPU, float32 on CPU; see ``adsim.runtime.io.autocast_dtype``)."""

    def __init__(self, method: registry.Method, *, device="auto", precision: str = "auto", info: dict | None = None):
        self.device = resolve_device(device) if isinstance(device, str) else torch.device(device)
        self.method = method.to(self.device)
        self.amp = autocast_dtype(precision, self.device)
        self.info = dict(info or {})

    def __repr__(self):
        return f"Detector({self.method.name}, image_size={self.method.image_size}, device={self.device})"

    @classmethod
    def from_run(cls, run, *, checkpoint: str = "auto", device: str = "auto", scoring: str | None = None):
        """The method a ``python -m adsim train`` run folder trained, with its checkpoint (``"auto"``,
        ``"last"``, ``"best"``) and precision. ``scoring``: override of the run's score (one of
        ``adsim.model.head.SCORES``; default: the run's recipe)."""
        r = load_run(run, checkpoint=checkpoint, device=device)
        load = catalog.trained(r.cfg.method)
        cfg = r.cfg._replace(scoring=run_score(r.cfg, scoring))
        # the loader may name the checkpoint file in a message (e.g. a bilora state without saved supports)
        method = load(cfg, r.backbone, {**r.record, "checkpoint_path": str(Path(run) / r.checkpoint["file"])},
                      r.state)
        info = {"run": str(run), "checkpoint": r.checkpoint, "config": cfg, "backbone": r.backbone.spec,
                "scoring": cfg.scoring}
        return cls(method, device=r.device, precision=cfg.precision, info=info)

    @classmethod
    def zero_shot(cls, method: str = "winclip", *, backbone: str = "ViT-L-14-336", checkpoint: str | None = None,
                  image_size: int | None = None, device: str = "auto", seed: int = 0, precision: str = "auto",
                  random_weights: bool = False, **options):
        """A training-free method of ``adsim.methods.catalog`` on a frozen backbone with local ``checkpoint``
        weights. Without a checkpoint the backbone's weights are random and its scores meaningless, so that
        has to be asked for: ``random_weights=True`` (tests, timing; still warned with
        ``RandomWeightsWarning``), or ``backbone="tiny"``, the small test backbone, random by design;
        otherwise ``ValueError`` naming ``checkpoint=``, before anything is built. ``options`` go to the
        method's builder."""
        require_weights(backbone, checkpoint, random_weights)
        build = catalog.zero_shot(method)
        dev = resolve_device(device)
        bb = build_backbone(backbone, image_size=image_size, checkpoint=checkpoint, seed=seed, device=dev)
        info = {"zero_shot": method, "backbone": bb.spec, "checkpoint": checkpoint, "options": options}
        return cls(build(bb, **options), device=dev, precision=precision, info=info)

    def with_shots(self, normal_images, k: int, *, seed: int = 0, batch_size: int = 16) -> "Detector":
        """Few-shot mode (``adsim.methods.fewshot``, MVFA-AD's k-shot setting): ``k`` of ``normal_images`` (normal
        images of the target: a folder, paths, PIL images or ``adsim.data.Sample`` s), drawn with ``seed``,
        in a memory bank fused with this detector's zero-shot output. Returns a new detector; never score
        the shots (``adsim.methods.fewshot.exclude_shots``)."""
        return attach(self, normal_images, k, seed=seed, batch_size=batch_size)

    def _forward(self, x: torch.Tensor, maps: bool) -> BatchScores:
        self.method.eval()
        with torch.inference_mode(), torch.autocast(self.device.type, dtype=self.amp or torch.float32,
                                                    enabled=self.amp is not None):
            out = self.method(x.to(self.device, non_blocking=True))
            return BatchScores(out.scores.float().cpu().numpy(), out.maps.float().cpu().numpy() if maps else None)

    def score_samples(self, samples, *, batch_size: int = 16, maps: bool = True, progress: bool = False,
                      desc: str = "scoring", num_workers: int = 0) -> Iterator[tuple]:
        """Stream ``adsim.data.Sample`` s in order: per batch ``(BatchScores, batch)`` with ``scores
        (b,)`` and ``maps (b, S, S)`` (``None`` with ``maps=False``) as NumPy (:class:`BatchScores`) and
        ``batch`` the ``adsim.data.ImageDataset`` batch (``label``, ``mask``, ``index``, ...)."""
        _check_batch_size(batch_size)
        ds = bmad.ImageDataset(samples, self.method.image_size, clip_norm=self.method.clip_norm)
        loader = torch.utils.data.DataLoader(ds, batch_size=batch_size, shuffle=False, num_workers=num_workers,
                                             pin_memory=self.device.type == "cuda")
        for batch in tqdm(loader, desc=desc, disable=not progress, leave=False):
            yield self._forward(batch["image"], maps), batch

    def predict(self, images, *, batch_size: int = 16, maps: bool = True, progress: bool = False,
                strict: bool = False, overlays=None, num_workers: int = 0, axis="axial",
                volume_topk: int = 1) -> Prediction:
        """Score ``images`` (see :func:`image_items`: also DICOM files and series, NIfTI volumes sliced
        along ``axis``, 16-bit PNG/TIFF, read by ``adsim.data.medical``); no labels needed. ``maps=False``
        keeps no pixel map; ``overlays=DIR`` writes one heatmap PNG per image while streaming
        (``adsim.inference.overlays``; names: ``adsim.inference.overlays.overlay_names``). Unreadable
        files are skipped with one warning naming each and the reason (``strict=True``: ``ValueError``);
        ``paths`` lists the images actually scored, ``records`` where each came from, ``volumes`` one
        score per volume (:func:`volume_rows`: the mean of its ``volume_topk`` highest slice scores;
        1 = the maximum)."""
        _check_batch_size(batch_size)
        _check_topk(volume_topk)
        items = image_items(images, axis=axis)
        if not items:
            raise ValueError(f"images: nothing to score in {images!r}")
        names: list[str] | None = None
        if overlays is not None:
            names = overlay_names([f"{src.stem}.png" if isinstance(src, Source) else n for n, src in items])
        ds = _Images(items, self.method.image_size, self.method.clip_norm)
        loader = torch.utils.data.DataLoader(ds, batch_size=batch_size, shuffle=False, num_workers=num_workers,
                                             collate_fn=_collate, pin_memory=self.device.type == "cuda")
        paths: list[str] = []
        batch_scores: list[np.ndarray] = []
        all_maps: list[np.ndarray] = []
        records: list[dict] = []
        warned = set()  # (file, reason): a damaged volume is one warning, not one per slice or frame
        for batch in tqdm(loader, desc="predict", disable=not progress, leave=False):
            for i, err in batch["errors"]:
                name, src = items[i]
                if isinstance(src, Source):
                    name = str(src.path)
                if strict:
                    raise ValueError(f"cannot read {_printable(name)} as an image ({err})")
                if (name, err) not in warned:
                    warned.add((name, err))
                    warnings.warn(f"skipped {_printable(name)}: not a readable image ({err})",
                                  UnreadableImageWarning, stacklevel=2)
            if batch["image"] is None:
                continue
            out = self._forward(batch["image"], maps or overlays is not None)
            paths += [items[i][0] for i in batch["index"]]
            records += [record(items[i][0], items[i][1], w, names[i] if names else None)
                        for i, w in zip(batch["index"], batch["window"])]
            batch_scores.append(out.scores)
            if out.maps is not None:  # asked for: maps, overlays or both
                if maps:
                    all_maps.append(out.maps)
                if names is not None:  # overlays
                    shown = bmad.unnormalise(batch["image"], clip_norm=self.method.clip_norm)  # (b, 3, S, S)
                    rgb = shown.permute(0, 2, 3, 1).numpy()
                    for j, i in enumerate(batch["index"]):
                        write_overlay(Path(overlays) / names[i], rgb[j], out.maps[j], score=float(out.scores[j]))
        if not paths:
            raise ValueError(f"images: none of the {len(items)} inputs is a readable image")
        scores = np.concatenate(batch_scores)
        return Prediction(paths, scores, np.concatenate(all_maps) if maps else None, records,
                          volume_rows(records, scores, volume_topk))


def _check_batch_size(batch_size) -> None:
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
