"""The run configuration: a run's own fields plus every recipe field, validated in one place.

``TrainConfig`` is what ``python -m adsim train`` records in ``RUN/config.json`` and what inference
rebuilds a run from. :func:`validate` is the one check of its values: the run's own fields here, every
recipe field through :func:`adsim.config.recipes.validate` -- so a value is accepted or refused the same
way through ``--recipe``, ``--set``, the flags and a ``config.json``.
"""
from __future__ import annotations

from collections import namedtuple

from adsim.config import recipes
from adsim.data.domains import DOMAINS, canonical_domain

METHODS = recipes.CHOICES["method"]  # naive, match: the adapter head; others: a registered Trainer

# The run's own fields (name, default); data, target and out are required.
RUN_DEFAULTS = (("data", None), ("target", None), ("out", None),
                ("train_domains", None),  # None: every domain except the target
                ("backbone", "ViT-L-14-336"), ("checkpoint", None), ("image_size", None),
                ("betas", (0.5, 0.999)), ("grad_clip", 1.0), ("holdout_frac", 0.2), ("seed", 0),
                ("device", "auto"), ("precision", "auto"), ("num_workers", 0))
RUN_FIELDS = tuple(n for n, _ in RUN_DEFAULTS)
# Every recipe field that training reads (protocol_mode is the protocol's), defaults = the clean recipe.
RECIPE_FIELDS = tuple(f for f in recipes.FIELDS if f not in ("name", "protocol_mode"))
_RECIPE_DEFAULTS = tuple((f, getattr(recipes.RECIPES["clean"], f)) for f in RECIPE_FIELDS)
# Recipe fields added after run folders were first written, with the value every run written before them ran
# (no mosaic, Dice per image, scikit-learn's KMeans): a config.json without one of them is read with this value.
ADDED_FIELDS = {"aug_rate": 0.0, "dice_unit": "image", "kmeans": "sklearn"}
# plus ``recipe``: the name of the recipe the run started from (its fields may have been overridden)
TrainConfig = namedtuple("TrainConfig", [n for n, _ in (*RUN_DEFAULTS, *_RECIPE_DEFAULTS)] + ["recipe"],
                         defaults=[v for _, v in (*RUN_DEFAULTS[3:], *_RECIPE_DEFAULTS)] + ["clean"])
TrainConfig.__doc__ = """A training run: the run's own fields (``data``, ``target``, ``out``, ``backbone``, ...)
plus every field of :class:`adsim.config.recipes.Recipe` with the ``clean`` recipe's values as defaults;
:func:`config_from_recipe` builds one from any recipe."""


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
                        betas=tuple(cfg.betas))


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
