"""``python -m poolsim.figures``: the paper's synthetic figures, one module per figure.

Each module ``poolsim.figures.NAME`` follows the figure-module contract: ``NAME``, ``TITLE``,
``compute(*, seeds, quick, progress=None) -> DataFrame``, ``plot(df) -> Figure``,
``summarize(df) -> str`` and, optionally, ``SIMULATIONS`` (the ``(experiment, params)`` pairs it
reads, so the CLI can compile them up front and in parallel).

To add a figure: write ``poolsim/figures/NAME.py`` to that contract and add NAME to ``FIGURES``.
"""
from __future__ import annotations

import importlib
from types import ModuleType

FIGURES = ("synthetic_intro", "asymptotic", "symmetric", "domain_addition", "baselines",
           "flow_bridge", "multimodal")


def available() -> tuple[str, ...]:
    """The figure names, in the order they are made."""
    return FIGURES


def load(name: str) -> ModuleType:
    """The module of figure ``name``; ValueError naming the choices if there is none."""
    names = available()
    if name not in names:
        raise ValueError(f"unknown figure {name!r}; choose from {', '.join(names)}")
    return importlib.import_module(f"{__name__}.{name}")


__all__ = ["FIGURES", "available", "load"]
