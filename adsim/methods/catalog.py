"""Methods by name: the built-in ones and those of installed plugins, looked up in the registry.

Importing this module registers the built-in baselines (``adsim.methods.baselines``) and imports every
module named by an ``adsim.methods`` entry point (a third-party package's ``[project.entry-points]``),
which registers its own methods through :mod:`adsim.methods.registry`. A plugin that fails to import is
reported with one warning and skipped.
"""
from __future__ import annotations

import warnings
from importlib.metadata import entry_points
from typing import Callable

from adsim.methods import baselines  # noqa: F401  (registers the built-in baselines)
from adsim.methods.registry import TRAINED, TRAINERS, ZERO_SHOT, Method, Trainer

ENTRY_POINT_GROUP = "adsim.methods"


class PluginWarning(UserWarning):
    """An ``adsim.methods`` entry point could not be loaded."""


def _load_plugins() -> None:
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            ep.load()
        except Exception as err:  # a broken plugin must not take the built-in methods down with it
            warnings.warn(f"adsim method plugin {ep.name!r} ({ep.value}) failed to load: "
                          f"{type(err).__name__}: {err}", PluginWarning, stacklevel=2)


_load_plugins()


def zero_shot_names() -> tuple:
    """Every registered training-free method, sorted."""
    return tuple(sorted(ZERO_SHOT))


def zero_shot(name: str) -> Callable[..., Method]:
    """The builder of the training-free method ``name``."""
    if name not in ZERO_SHOT:
        raise ValueError(f"unknown zero-shot method {name!r}; must be one of {zero_shot_names()}")
    return ZERO_SHOT[name]


def trained(name: str) -> Callable[..., Method]:
    """The loader of the trained method ``name`` (a run's ``cfg.method``)."""
    if name not in TRAINED:
        raise ValueError(f"unknown trained method {name!r}; must be one of {tuple(sorted(TRAINED))}")
    return TRAINED[name]


def trainer(name: str) -> Trainer | None:
    """The registered :class:`~adsim.methods.registry.Trainer` of method ``name``, or ``None`` for the
    adapter head (``naive``, ``match``), which ``adsim.training`` trains itself."""
    return TRAINERS.get(name)
