"""The one interface every detection method implements, and the registry of methods by name.

A *method* is a ``torch.nn.Module`` whose ``forward(images)`` takes a batch of preprocessed images
``(B, 3, S, S)`` (resized to ``S = image_size``; CLIP mean/std normalised when ``clip_norm``) and
returns an :class:`Output`. Evaluation, ``predict``, the protocol and the table runner only ever call
this interface (through ``adsim.inference.Detector``), so a new method is one file that registers a
builder here -- ``adsim/methods/baselines/`` for the built-in ones, any importable module for a
third-party one (``adsim.methods.catalog`` loads the ``adsim.methods`` entry points) -- never a branch
in the inference code. Lookups by name go through :mod:`adsim.methods.catalog`.

* :data:`ZERO_SHOT` -- training-free methods: ``name -> build(backbone, **options) -> Method``.
* :data:`TRAINED` -- methods trained by ``python -m adsim train``: ``cfg.method -> load(cfg, backbone,
  record, state) -> Method`` that rebuilds the method of a run folder from its ``config.json`` record
  (``Detector.from_run`` adds ``"checkpoint_path"``, the file the state came from) and checkpoint state dict. ``naive`` and ``match`` are the adapter head (:class:`HeadMethod`).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import torch
from torch import nn

from adsim.model.head import anomaly_maps, check_score, features, image_scores, make_head, text_embeddings


class Output(NamedTuple):
    """What a method returns for ``B`` images of side ``S`` (float32, on the method's device).

    ``scores: (B,)`` image anomaly scores, higher = more anomalous; they must *rank* (logits or
    log-probabilities, not saturating probabilities). ``maps: (B, S, S)`` pixel anomaly maps at the
    input resolution, higher = more anomalous. ``patches``: per layer ``(B, N, E)`` unit-norm patch
    features on the ``grid x grid`` patch grid, the features a few-shot memory bank compares (empty
    tuple when the method has none)."""
    scores: torch.Tensor
    maps: torch.Tensor
    patches: tuple = ()


class Method(nn.Module):
    """Base class: subclasses set ``name``, ``image_size``, ``grid``, ``clip_norm`` and ``forward``."""
    name: str = "?"
    image_size: int
    grid: int
    clip_norm: bool = True

    def forward(self, images: torch.Tensor) -> Output:  # pragma: no cover - abstract
        raise NotImplementedError


class HeadMethod(Method):
    """The adapter head of ``adsim.model.head`` (methods ``naive`` and ``match``): image score and pixel map
    as ``adsim.model.head.image_scores`` / ``anomaly_maps`` with the run's ``scoring``; ``patches`` are the
    segmentation features (after VACA when on)."""

    def __init__(self, backbone, head, *, scoring: str, clip_norm: bool = True, name: str = "match"):
        super().__init__()
        self.backbone, self.head, self.scoring = backbone, head, check_score(scoring)
        self.name, self.clip_norm = name, clip_norm
        self.image_size, self.grid = backbone.spec.image_size, backbone.spec.grid

    def forward(self, images: torch.Tensor) -> Output:
        feats = features(self.backbone, self.head, images)
        return Output(image_scores(feats, self.scoring).float(),
                      anomaly_maps(feats, self.grid, self.image_size, self.scoring).float(),
                      tuple(feats.seg))


ZERO_SHOT: dict[str, Callable[..., Method]] = {}
TRAINED: dict[str, Callable[..., Method]] = {}


def _check_name(name) -> str:
    if not isinstance(name, str) or not name or not name.replace("-", "_").isidentifier():
        raise ValueError(f"a method name must be a non-empty identifier-like string (letters, digits, _ or -), "
                         f"got {name!r}")
    return name


def register_zero_shot(name: str, build: Callable[..., Method]) -> Callable[..., Method]:
    """Register a training-free method: ``build(backbone, **options) -> Method`` (``Detector.zero_shot``,
    ``predict --zero-shot NAME``, ``table --methods NAME``). Returns ``build`` (usable as a decorator
    through ``functools.partial``); registering a name again replaces it."""
    ZERO_SHOT[_check_name(name)] = build
    return build


def register_trained(name: str, load: Callable[..., Method]) -> Callable[..., Method]:
    """Register how a trained run of method ``name`` is rebuilt: ``load(cfg, backbone, record, state) ->
    Method`` (``Detector.from_run``, ``eval``, ``predict --run``). Returns ``load``."""
    TRAINED[_check_name(name)] = load
    return load


def _state_mismatch(own: dict, saved: dict) -> str:
    """What differs between a module's state dict and a saved one ('' when they fit)."""
    missing = sorted(set(own) - set(saved))
    unexpected = sorted(set(saved) - set(own))
    shapes = [f"{k} {tuple(saved[k].shape)} vs {tuple(own[k].shape)}" for k in own
              if k in saved and hasattr(saved[k], "shape") and tuple(saved[k].shape) != tuple(own[k].shape)]
    parts = [f"{label} {items[:4]}{' ...' if len(items) > 4 else ''}" for label, items in
             (("missing", missing), ("unexpected", unexpected), ("shape saved vs expected:", shapes)) if items]
    return "; ".join(parts)


def load_head_method(cfg, backbone, record: dict, state: dict) -> HeadMethod:
    """:data:`TRAINED` loader of ``naive`` / ``match`` runs: the adapter head of ``cfg`` (``make_head``)
    with the run's prompts' text embeddings and the checkpoint ``state``; a state dict that does not fit
    -> ``ValueError`` naming the missing, unexpected and mis-shaped entries."""
    spec = backbone.spec
    device = next(backbone.model.parameters()).device
    head = make_head(cfg, spec.width, spec.embed_dim, text_embeddings(backbone, record["prompts"])).to(device)
    diff = _state_mismatch(head.state_dict(), state)
    if diff:
        raise ValueError(f"the checkpoint's head does not fit the {cfg.method!r} head this adsim version builds "
                         f"from the run's config ({diff})")
    head.load_state_dict(state)
    return HeadMethod(backbone, head, scoring=cfg.scoring, clip_norm=cfg.clip_norm, name=cfg.method)


SCHEDULES = ("pooled", "sequential")  # how adsim.training.train presents the training domains to a Trainer


class Trainer(NamedTuple):
    """The one hook of ``adsim.training.train`` for a method with its own trainable part (``adsim.methods.baselines``).

    ``build(cfg, backbone) -> nn.Module``: every trainable parameter and every piece of state the
    checkpoint stores (saved as ``checkpoint["head"]``; the frozen backbone is *not* part of it).
    ``forward(module, backbone, images) -> out``: the training forward pass (run under autocast).
    ``loss(cfg, module, out, batch) -> (loss, {name: detached value})``: the step's objective;
    ``batch`` has ``image``, ``mask``, ``has_mask``, ``label``, ``pixel_domain`` and ``domain`` (int64, the
    sample's index in ``cfg.train_domains``).
    ``method(cfg, backbone, module) -> Method``: the method of the module as it is now (checkpoint
    selection scores it; the module's parameters are shared, not copied).
    ``schedule`` (one of :data:`SCHEDULES`): ``"pooled"`` (default) -- every epoch shuffles the samples of
    all training domains together; ``"sequential"`` -- the domains one at a time in ``cfg.train_domains``
    order, ``cfg.epochs`` epochs each on that domain's samples only, with a fresh optimiser per domain.
    ``start_domain(cfg, module, index) -> None`` (required by ``"sequential"``, unused otherwise): called
    once before domain ``index``'s epochs (0, 1, ...) and, on ``--resume``, again for every domain the
    checkpoint has started, before its state is loaded; it sets which parameters train in that domain
    (``requires_grad``) and may add parameters (the optimiser is built after it)."""
    build: Callable
    forward: Callable
    loss: Callable
    method: Callable
    schedule: str = "pooled"
    start_domain: Callable | None = None


TRAINERS: dict[str, Trainer] = {}


def register_trainer(name: str, trainer: Trainer) -> Trainer:
    """Register the trainable part and loss of method ``name`` (``python -m adsim train --set method=NAME``
    once the recipe allows it). Returns ``trainer``. A ``schedule`` not in :data:`SCHEDULES`, or
    ``"sequential"`` without a callable ``start_domain`` -> ``ValueError``."""
    if trainer.schedule not in SCHEDULES:
        raise ValueError(f"trainer schedule must be one of {SCHEDULES}, got {trainer.schedule!r}")
    if trainer.schedule == "sequential" and not callable(trainer.start_domain):
        raise ValueError(f"trainer schedule 'sequential' needs a callable start_domain(cfg, module, index), "
                         f"got {trainer.start_domain!r}")
    TRAINERS[_check_name(name)] = trainer
    return trainer


register_trained("naive", load_head_method)
register_trained("match", load_head_method)
