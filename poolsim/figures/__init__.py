"""``python -m poolsim.figures``: the paper's synthetic figures, one module per figure.

Each module ``poolsim.figures.NAME`` follows the figure-module contract: ``NAME``, ``TITLE``,
``compute(*, seeds, quick, progress=None) -> DataFrame``, ``plot(df) -> Figure``,
``summarize(df) -> str`` and, optionally, ``SIMULATIONS`` (the ``(experiment, params)`` pairs it
reads, so the CLI can compile them up front and in parallel).

``FIGURES`` are always present. ``OPTIONAL`` figures are listed when their module is installed (they
are written on other branches); once merged, their names can move to ``FIGURES``.
"""
from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

FIGURES = ("synthetic_intro", "asymptotic", "symmetric", "domain_addition", "baselines")
OPTIONAL = ("flow_bridge", "multimodal")


def available() -> tuple[str, ...]:
    """The figure names this installation can make, in order (``FIGURES`` then present ``OPTIONAL``)."""
    return FIGURES + tuple(n for n in OPTIONAL if importlib.util.find_spec(f"{__name__}.{n}"))


def load(name: str) -> ModuleType:
    """The module of figure ``name``; ValueError naming the choices if there is none."""
    names = available()
    if name not in names:
        missing = " (listed as optional, but its module is not installed)" if name in OPTIONAL else ""
        raise ValueError(f"unknown figure {name!r}{missing}; choose from {', '.join(names)}")
    return importlib.import_module(f"{__name__}.{name}")


__all__ = ["FIGURES", "OPTIONAL", "available", "load"]
