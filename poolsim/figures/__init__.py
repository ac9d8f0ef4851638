"""``python -m poolsim.figures``: the paper's synthetic figures, one module per figure.

Each module ``poolsim.figures.NAME`` follows the figure-module contract: ``NAME``, ``TITLE``,
``compute(*, seeds, quick, progress=None) -> DataFrame``, ``plot(df) -> Figure``,
``summarize(df) -> str`` and, optionally, ``SIMULATIONS`` (the ``(experiment, params)`` pairs it
reads, so the CLI can compile them up front and in parallel).

To add a figure: write ``poolsim/figures/NAME.py`` to that contract and add NAME to ``FIGURES``
(made by default) or ``OPTIONAL`` (made only with ``--only NAME`` or ``--all``: figures that do not
fit the default run's time budget).
"""
from __future__ import annotations

import importlib
from types import ModuleType

FIGURES = ("synthetic_intro", "asymptotic", "symmetric", "domain_addition", "baselines",
           "flow_bridge", "multimodal")
"""The figures ``python -m poolsim.figures`` makes by default, in order."""
OPTIONAL = ("phase", "sensitivity")
"""Figures made only by ``--only NAME`` or ``--all`` (the decision map and the claims' sensitivity
sweep: minutes of Monte Carlo each)."""


def available() -> tuple[str, ...]:
    """Every figure name (default and optional), in the order they are made."""
    return FIGURES + OPTIONAL


def load(name: str) -> ModuleType:
    """The module of figure ``name``; ValueError naming the choices if there is none."""
    names = available()
    if name not in names:
        raise ValueError(f"unknown figure {name!r}; choose from {', '.join(names)}")
    return importlib.import_module(f"{__name__}.{name}")


__all__ = ["FIGURES", "OPTIONAL", "available", "load"]
