"""The scheduler flags shared by ``table``, ``protocol`` and ``sweep`` (``docs/cluster.md``).

Plain Python, so that ``--help`` answers at once; the values are checked by
:func:`poolsim.cluster.check_resources` when the command runs.
"""
from __future__ import annotations


def add_args(p) -> None:
    """Add ``--executor`` and the scheduler's resources to the sub-parser ``p``."""
    g = p.add_argument_group("scheduler (pip install -e \".[cluster]\"; docs/cluster.md)")
    g.add_argument("--executor", default="local",
                   help="local (default: the cells one after another in this process), processes (one "
                        "process per cell on this machine, submitit's local executor) or slurm (one Slurm "
                        "job array, one cell per array task)")
    g.add_argument("--max-concurrent", type=int, default=1, metavar="N", help="cells running at once")
    g.add_argument("--gpus-per-cell", type=int, default=0, metavar="N")
    g.add_argument("--cpus-per-cell", type=int, default=1, metavar="N", help="slurm: --cpus-per-task")
    g.add_argument("--time-limit", type=int, default=24 * 60, metavar="MINUTES",
                   help="per cell; at the limit a cell checkpoints and is requeued (slurm)")
    g.add_argument("--partition", default=None, help="slurm partition")
    g.add_argument("--retries", type=int, default=2, metavar="N", help="resubmissions of a failed cell")
    g.add_argument("--gpus", nargs="+", type=int, default=[], metavar="ID",
                   help="processes: the GPU ids to hand out (default 0 .. max-concurrent x gpus-per-cell - 1)")
    g.add_argument("--slurm-set", nargs="+", default=[], metavar="KEY=VALUE",
                   help="further sbatch options, e.g. account=lab qos=high constraint=a100")
    g.add_argument("--setup", nargs="+", default=[], metavar="LINE",
                   help="shell lines each job runs first, e.g. 'source .venv/bin/activate'")
    g.add_argument("--submit-only", action="store_true",
                   help="slurm: submit and exit; re-run the same command to collect (or resubmit failures)")
    g.add_argument("--wait", action="store_true",
                   help="if another driver holds --out, wait for it instead of stopping")


def resources(args):
    """The :class:`poolsim.cluster.Resources` of the parsed ``args`` (checked)."""
    from poolsim import cluster

    slurm = {}
    for pair in args.slurm_set:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--slurm-set expects KEY=VALUE, got {pair!r}")
        slurm[key.replace("-", "_")] = value
    res = cluster.Resources(executor=args.executor, max_concurrent=args.max_concurrent,
                            gpus_per_cell=args.gpus_per_cell, cpus_per_cell=args.cpus_per_cell,
                            time_min=args.time_limit, partition=args.partition, retries=args.retries,
                            gpus=tuple(args.gpus), slurm=slurm, setup=tuple(args.setup),
                            submit_only=args.submit_only, poll_s=1.0 if args.executor != "slurm" else 30.0)
    return cluster.check_resources(res)
