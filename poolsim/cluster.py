"""Grid cells as jobs on a cluster scheduler (submitit): Slurm job arrays, or one process per cell here.

An experiment grid (the adsim Table 1 and protocol, a poolsim decision map split by seed blocks) is a
list of independent :class:`Job` s. :func:`run_jobs` hands them to `submitit <https://github.com/
facebookincubator/submitit>`_ -- the optional extra ``pip install -e ".[cluster]"`` -- and waits:

* ``executor="processes"``: submitit's ``LocalExecutor``, one child process per job on this machine,
  at most ``max_concurrent`` at a time; with ``gpus_per_cell > 0`` each running job gets its own
  GPUs (``CUDA_VISIBLE_DEVICES``) out of ``gpus`` (default ``0 .. max_concurrent * gpus_per_cell - 1``);
* ``executor="slurm"``: one ``sbatch`` job array (``%max_concurrent`` running at once), resources per
  array task; ``submit_only=True`` returns once submitted (a later call attaches to the jobs still
  queued or running, recorded in ``folder/<name>.job``, instead of submitting them again).

A job that fails -- an exception, a killed worker, a node lost -- is submitted again up to ``retries``
times; whatever it had checkpointed is its own business (the adsim cells resume from their run folders).
A job is *checkpointable* in submitit's sense: on a Slurm time limit or pre-emption it is requeued with
the same arguments. Each job runs under :func:`poolsim.io.folder_lock` of ``folder/<name>/`` with
``wait=True``, so two copies of one job (a requeue racing an orphan of a killed driver) never run at
once: the second waits and then finds the result already written. Jobs that still fail are returned
with the path of their log. ``executor="local"`` is not handled here: callers keep their own
in-process loop for it, so that nothing changes without a scheduler.

The queueing itself is submitit's (and Slurm's); this module only keeps at most ``max_concurrent``
local jobs in flight (submitit's ``LocalExecutor`` starts whatever it is given) and resubmits failures.
"""
from __future__ import annotations

from ._cluster import (
    EXECUTORS as EXECUTORS,
    CellJob as CellJob,
    GridFailed as GridFailed,
    Job as Job,
    Outcome as Outcome,
    Resources as Resources,
    add_arguments as add_arguments,
    check_resources as check_resources,
    failure_report as failure_report,
    make_executor as make_executor,
    require_submitit as require_submitit,
    resources_from_args as resources_from_args,
    run_jobs as run_jobs,
)

__all__ = ["EXECUTORS", "CellJob", "GridFailed", "Job", "Outcome", "Resources", "add_arguments", "check_resources",
           "failure_report", "make_executor", "require_submitit", "resources_from_args", "run_jobs"]
