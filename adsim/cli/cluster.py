"""The scheduler flags of ``table``, ``protocol`` and ``sweep`` (``docs/cluster.md``): poolsim's
(:func:`poolsim.cluster.add_arguments`, shared with ``python -m poolsim.figures``) plus the two that only a
driver of cell files has, ``--submit-only`` and ``--wait``."""
from __future__ import annotations


def add_args(p) -> None:
    """Add ``--executor``, the scheduler's resources, ``--submit-only`` and ``--wait`` to the sub-parser ``p``."""
    from poolsim import cluster

    g = cluster.add_arguments(p, unit="cell")
    g.add_argument("--submit-only", action="store_true",
                   help="slurm: submit and exit; re-run the same command to collect (or resubmit failures)")
    g.add_argument("--wait", action="store_true",
                   help="if another driver holds --out, wait for it instead of stopping")


def resources(args):
    """The checked :class:`poolsim.cluster.Resources` of the parsed ``args``."""
    from poolsim import cluster

    return cluster.resources_from_args(args)
