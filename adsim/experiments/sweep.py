"""``python -m adsim sweep``: sensitivity of the simulated protocol to the simulator parameters that
matter most (``adsim.data.sim.SWEEP``: the mean text alignment ``shared`` and the concentration of its prior,
``align_concentration`` (``inf``: every modality at the mean, the fixed-fraction simulator), the anomaly
shift, the scale of the off-diagonal of Table 4), varied one at a time around the defaults.

Each configuration is a resumable protocol run in ``OUT/<param>=<value>/`` (the default configuration
once, in ``OUT/default/``, reused for every parameter); ``OUT/sweep.csv`` collects final AUC (after the
last domain) and DA per (param, value, method, target, task, seed), rewritten after every configuration.
SIMULATED data only. ``python -m adsim
figures --sweep OUT`` turns it into ``ad_sensitivity.png`` and ``sensitivity.md`` (95% t-intervals).
"""
from __future__ import annotations

import functools
from pathlib import Path

import pandas as pd

from adsim.data import sim
from adsim.experiments import protocol, sources
from poolsim import cluster
from poolsim.io import folder_lock


def sweep(out, base: sim.SimParams, settings: protocol.Settings, *, methods=("naive", "match-geodesic-vaca"),
          orders=("hardest",), seeds: int = 1, grid=sim.SWEEP, progress: bool = True,
          resources: cluster.Resources | None = None, wait: bool = False, targets=None) -> pd.DataFrame:
    """Run (or resume) the sweep; returns the ``sweep.csv`` table. ``targets``: the held-out domains of
    every configuration (default: all of them, as :func:`adsim.experiments.protocol.run`). ``resources`` / ``wait``: as
    :func:`adsim.experiments.protocol.run`, per configuration (its cells run as jobs, one configuration
    after another); ``OUT`` itself is locked for the sweep. With ``submit_only`` the table holds the
    configurations already finished."""
    out = Path(out)
    for name in grid:
        if name not in sim.SimParams._fields:
            raise ValueError(f"unknown simulator parameter {name!r}; one of {sim.SimParams._fields}")
    rows = []
    table = pd.DataFrame()
    with folder_lock(out, wait=wait):
        for name, values in grid.items():
            for value in values:
                params = sim.validate(base._replace(**{name: value}))
                folder = out / ("default" if params == sim.validate(base) else f"{name}={value}")
                st = settings._replace(sim=params._asdict())
                done = protocol.run(folder, functools.partial(sources.simulated, params), st, targets=targets,
                                    methods=methods, orders=orders, seeds=seeds, progress=progress, resources=resources, wait=wait)
                if done["pending"]:
                    continue
                da = pd.read_csv(folder / "da.csv")
                proto = pd.read_csv(folder / "protocol.csv")
                final = proto[proto["step"] == proto["step"].max()].drop(columns=["step", "added", "data"])
                merged = da.merge(final, on=["target", "task", "method", "order", "mode", "seed"])
                rows.append(merged.assign(param=name, value=value, default=getattr(base, name)))
                table = pd.concat(rows, ignore_index=True).rename(columns={"auc": "final_auc"})
                # after every configuration: a stopped sweep keeps its rows
                protocol.write_csv(out / "sweep.csv", table)
    return table
