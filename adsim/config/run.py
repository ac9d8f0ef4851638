"""The run configuration: a run's own fields plus every recipe field, validated in one place.

``TrainConfig`` is what ``python -m adsim train`` records in ``RUN/config.json`` and what inference
rebuilds a run from. :func:`validate` is the one check of its values: the run's own fields here, every
recipe field through :func:`adsim.config.recipes.validate` -- so a value is accepted or refused the same
way through ``--recipe``, ``--set``, the flags and a ``config.json``.
"""
from __future__ import annotations

from typing import NamedTuple

from adsim.config import recipes
from adsim.data.domains import DOMAINS, canonical_domain

METHODS = recipes.CHOICES["method"]  # naive, match: the adapter head; others: a registered Trainer

_CLEAN = recipes.RECIPES["clean"]


class TrainConfig(NamedTuple):
    """A training run: the run's own fields (``data``, ``target``, ``out``, ``backbone``, ...)
    plus every field of :class:`adsim.config.recipes.Recipe` with the ``clean`` recipe's values as defaults;
    :func:`config_from_recipe` builds one from any recipe."""

    # The run's own fields; data, target and out are required.
    data: str
    target: str
    out: str
    train_domains: tuple[str, ...] | None = None  # None: every domain except the target
    backbone: str = "ViT-L-14-336"
    checkpoint: str | None = None
    image_size: int | None = None
    betas: tuple[float, float] = (0.5, 0.999)  # Adam's (beta1, beta2)
    grad_clip: float = 1.0
    holdout_frac: float = 0.2
    seed: int = 0
    device: str = "auto"
    precision: str = "auto"
    num_workers: int = 0
    # Every recipe field that training reads (protocol_mode is the protocol's), in Recipe's order and with
    # Recipe's types, defaults = the clean recipe (tests/adsim/test_adsim_recipes.py checks the three).
    method: str = _CLEAN.method
    metric: str = _CLEAN.metric
    gate_unit: str = _CLEAN.gate_unit
    gate_filter: str = _CLEAN.gate_filter
    gate_mode: str = _CLEAN.gate_mode
    gate_tau: str = _CLEAN.gate_tau
    tau: float = _CLEAN.tau
    match_branches: str = _CLEAN.match_branches
    update: str = _CLEAN.update
    alpha: float = _CLEAN.alpha
    loss_metric: str = _CLEAN.loss_metric
    intra_power: int = _CLEAN.intra_power
    inter_form: str = _CLEAN.inter_form
    vaca: bool = _CLEAN.vaca
    vaca_branches: str = _CLEAN.vaca_branches
    renorm_after_vaca: bool = _CLEAN.renorm_after_vaca
    gamma: float = _CLEAN.gamma
    prompts: str = _CLEAN.prompts
    clip_norm: bool = _CLEAN.clip_norm
    adapter_bias: bool = _CLEAN.adapter_bias
    quick_gelu: bool = _CLEAN.quick_gelu
    aug_rate: float = _CLEAN.aug_rate
    train_splits: tuple = _CLEAN.train_splits
    batch_size: int = _CLEAN.batch_size
    epochs: int = _CLEAN.epochs
    lr: float = _CLEAN.lr
    beta_dice: float = _CLEAN.beta_dice
    beta_focal: float = _CLEAN.beta_focal
    beta_bce: float = _CLEAN.beta_bce
    dice_unit: str = _CLEAN.dice_unit
    kmeans: str = _CLEAN.kmeans
    lambda_intra: float = _CLEAN.lambda_intra
    lambda_inter: float = _CLEAN.lambda_inter
    lambda_var: float = _CLEAN.lambda_var
    cls_only_pixel_loss: str = _CLEAN.cls_only_pixel_loss
    select: str = _CLEAN.select
    scoring: str = _CLEAN.scoring
    smooth_sigma: float = _CLEAN.smooth_sigma
    # the name of the recipe the run started from (its fields may have been overridden)
    recipe: str = "clean"


# Every recipe field that training reads: TrainConfig's fields after the run's own.
RECIPE_FIELDS = tuple(f for f in recipes.FIELDS if f not in ("name", "protocol_mode"))
RUN_FIELDS = tuple(f for f in TrainConfig._fields if f not in RECIPE_FIELDS and f != "recipe")
# The run's own fields (name, default); data, target and out are required (default None here).
RUN_DEFAULTS = tuple((f, TrainConfig._field_defaults.get(f)) for f in RUN_FIELDS)
# Recipe fields added after run folders were first written, with the value every run written before them ran
# (no mosaic, Dice per image, scikit-learn's KMeans): a config.json without one of them is read with this value.
ADDED_FIELDS = {"aug_rate": 0.0, "dice_unit": "image", "kmeans": "sklearn"}


def validate(cfg: TrainConfig) -> TrainConfig:
    """Canonical domain names, the run's fields and every recipe field checked (one-line
    ``ValueError`` naming the field and the allowed values); returns the normalised config."""
    target = canonical_domain(cfg.target)
    domains = tuple(canonical_domain(d) for d in (cfg.train_domains or [d for d in DOMAINS if d != target]))
    if target in domains:
        raise ValueError(f"zero-shot: the target {target} must not be a training domain ({domains})")
    if not domains or len(set(domains)) != len(domains):
        raise ValueError(f"train_domains must be distinct and non-empty, got {domains}")
    recipe = recipe_of(cfg)
    if not isinstance(cfg.grad_clip, (int, float)) or not cfg.grad_clip > 0:
        raise ValueError(f"grad_clip must be > 0, got {cfg.grad_clip!r}")
    return cfg._replace(target=target, train_domains=domains, train_splits=recipe.train_splits,
                        betas=(*cfg.betas,))  # a tuple (a config.json holds a list)


def train_domains_of(cfg: TrainConfig) -> tuple[str, ...]:
    """The training domains of a config that :func:`validate` returned (canonical names in order; it
    replaces ``train_domains=None`` by every domain except the target); ``None`` -> ``ValueError``."""
    if cfg.train_domains is None:
        raise ValueError("cfg.train_domains is None: pass the config validate(cfg) returns")
    return cfg.train_domains


def recipe_of(cfg: TrainConfig) -> recipes.Recipe:
    """The validated recipe a config runs (its recipe fields; ``protocol_mode`` is the recipe default)."""
    return recipes.validate(recipes.Recipe(name=cfg.recipe, **{f: getattr(cfg, f) for f in RECIPE_FIELDS}))


def config_from_recipe(recipe: recipes.Recipe, **run) -> TrainConfig:
    """``TrainConfig`` with every recipe field from ``recipe`` and the run's own fields from ``run``."""
    bad = sorted(set(run) - set(RUN_FIELDS))
    if bad:
        raise ValueError(f"{bad[0]!r} is not a run field (recipe fields are set on the recipe); "
                         f"run fields: {RUN_FIELDS}")
    return TrainConfig(**{f: getattr(recipe, f) for f in RECIPE_FIELDS}, recipe=recipe.name, **run)
