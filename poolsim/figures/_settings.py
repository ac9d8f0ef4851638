"""The settings each figure in an output folder was made with (``settings.json``), and the rule that keeps a
run with other settings from replacing them.

``settings.json`` maps every figure name to the settings its numbers depend on::

    {"asymptotic": {"seeds": 1000, "quick": false, "max_K": null}, ...}

``seeds`` is the run's seed count (``--quick`` caps it at ``QUICK_SEEDS``; the costly figures' own
``MAX_SEEDS`` caps come on top, as the code fixes them), ``quick`` whether ``--quick`` was given (it also
shrinks some figures' grids) and ``max_K`` the ``--max-K`` of the figures that take it (else ``null``).
Every run writes it with the other files (same bytes when nothing changed, so ``git status`` stays clean),
merged with the entries of the figures it did not make.

A run whose settings for a figure differ from the ones recorded for it in ``--out`` would replace those
results with results of another size: :func:`conflicts` lists them, and the CLI refuses before any work
unless ``--overwrite`` is given. Results of a ``--quick`` run are never protected (a smoke run is not
worth keeping over a real one).
"""
from __future__ import annotations

import json
from pathlib import Path

FILE = "settings.json"


def of(mod, seeds: int, quick: bool, max_K: int | None) -> dict:
    """The settings figure module ``mod``'s numbers depend on in a run with these options."""
    import inspect

    from . import _data

    takes_max_K = "max_K" in inspect.signature(mod.compute).parameters
    return {"seeds": _data.n_seeds(seeds, quick), "quick": bool(quick),
            "max_K": max_K if takes_max_K else None}


def read(folder: Path) -> dict:
    """``{figure: settings}`` recorded in ``folder`` (empty without a readable ``settings.json``)."""
    try:
        data = json.loads((folder / FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, dict)} if isinstance(data, dict) else {}


def render(entries: dict, order) -> str:
    """``settings.json``'s text: one line per figure, in ``order`` (the figures' own order)."""
    rank = {n: i for i, n in enumerate(order)}
    names = sorted(entries, key=lambda n: (rank.get(n, len(rank)), n))
    lines = [f"  {json.dumps(n)}: {json.dumps(entries[n], sort_keys=False)}" for n in names]
    return "{\n" + ",\n".join(lines) + "\n}\n"


def describe(s: dict) -> str:
    """A run's settings in words: ``1000 seeds``, ``--quick (3 seeds)``, ``1000 seeds, --max-K 500``."""
    text = f"--quick ({s.get('seeds')} seeds)" if s.get("quick") else f"{s.get('seeds')} seeds"
    return text + (f", --max-K {s['max_K']}" if s.get("max_K") is not None else "")


def conflicts(recorded: dict, planned: dict) -> list:
    """``[(figure, recorded settings)]``: the figures of ``planned`` (``{figure: settings}``) whose results
    in the folder were made with other settings, except those of a ``--quick`` run."""
    return [(n, recorded[n]) for n, s in planned.items()
            if n in recorded and recorded[n] != s and not recorded[n].get("quick")]
