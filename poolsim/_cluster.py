"""Grid cells as scheduler jobs: the implementation of :mod:`poolsim.cluster`, whose docstring describes it."""
from __future__ import annotations

import contextlib
import json
import logging
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple

from ._io import atomic_write_text, folder_lock

EXECUTORS = ("local", "processes", "slurm")
"""The executor names: ``local`` runs cells in this process, ``processes`` as local submitit jobs, ``slurm`` as a Slurm
job array."""
# Slurm states of a job that is still going to run or finish (``sacct``)
_ACTIVE = ("PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "RESIZING", "SUSPENDED")


class Resources(NamedTuple):
    """Where and how the cells of a grid run.

    ``executor``: ``"local"`` (the caller's own sequential loop, no scheduler), ``"processes"`` or
    ``"slurm"`` (see the module). ``max_concurrent``: jobs running at once. ``gpus_per_cell``: GPUs
    of one job. ``cpus_per_cell``: CPU cores of one job (Slurm ``--cpus-per-task``). ``time_min``: wall
    time limit of one job in minutes (then checkpoint and requeue). ``partition``: Slurm partition.
    ``retries``: resubmissions of a failed job. ``gpus``: ``processes`` only, the GPU ids handed out.
    ``slurm``: further ``sbatch`` options, e.g. ``{"account": "lab", "qos": "high"}``. ``setup``:
    shell lines run before the job (e.g. ``module load cuda``, ``source .venv/bin/activate``).
    ``submit_only``: Slurm: submit and return, without waiting. ``poll_s``: seconds between checks.
    """
    executor: str = "local"
    max_concurrent: int = 1
    gpus_per_cell: int = 0
    cpus_per_cell: int = 1
    time_min: int = 24 * 60
    partition: str | None = None
    retries: int = 2
    gpus: tuple = ()
    slurm: dict = {}
    setup: tuple = ()
    submit_only: bool = False
    poll_s: float = 1.0


class Job(NamedTuple):
    """One grid cell: ``fn(*args)`` in a job of its own. ``name``: unique in the grid and usable as a
    file name (it names the job's lock folder, record and logs). ``fn`` must be importable or picklable
    (cloudpickle) and must not depend on having run before in the same process."""
    name: str
    fn: Callable
    args: tuple = ()


class Outcome(NamedTuple):
    """What :func:`run_jobs` saw. ``results``: ``{name: return value}`` of the jobs that finished;
    ``failed``: ``[(name, log path, last line of the error)]`` after every retry; ``pending``: names
    submitted but not waited for (``submit_only``)."""
    results: dict
    failed: list
    pending: list


class GridFailed(RuntimeError):
    """Jobs that still failed after their retries. ``failed``: ``[(name, log path, reason)]``; the message
    has one line per job (:func:`failure_report`)."""

    def __init__(self, failed: list):
        self.failed = list(failed)
        super().__init__(f"{len(self.failed)} job(s) failed after their retries (re-run the same command to "
                         f"retry them):\n{failure_report(self.failed)}")


def check_resources(res: Resources) -> Resources:
    """``res`` with its fields checked: ``ValueError`` naming the field and its allowed values."""
    if res.executor not in EXECUTORS:
        raise ValueError(f"--executor must be one of {EXECUTORS}, got {res.executor!r}")
    for name in ("max_concurrent", "cpus_per_cell", "time_min"):
        v = getattr(res, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be an integer >= 1, got {v!r}")
    for name in ("gpus_per_cell", "retries"):
        v = getattr(res, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be an integer >= 0, got {v!r}")
    if res.executor == "processes" and res.gpus and res.gpus_per_cell and len(res.gpus) < res.gpus_per_cell:
        raise ValueError(f"--gpus {list(res.gpus)}: fewer GPUs than --gpus-per-cell {res.gpus_per_cell}")
    if res.submit_only and res.executor != "slurm":
        raise ValueError("--submit-only needs --executor slurm (local jobs end with the driver)")
    return res


def require_submitit():
    """The ``submitit`` module, or ``ValueError`` saying how to install the extra."""
    try:
        import submitit
    except ImportError:
        raise ValueError('--executor processes/slurm needs submitit: pip install -e ".[cluster]"') from None
    return submitit


class CellJob:
    """What a job runs: ``fn(*args)`` under the folder lock of ``lock`` (``wait=True``).

    Checkpointable the way submitit expects (a ``checkpoint`` method): on a time limit or a pre-emption
    the same call is requeued, and ``fn`` resumes from whatever it wrote."""

    def __init__(self, fn: Callable, lock):
        self.fn, self.lock = fn, str(lock)

    def __call__(self, *args) -> Any:
        with folder_lock(self.lock, wait=True):
            return self.fn(*args)

    def checkpoint(self, *args):
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(self, *args)


def _gpu_slots(res: Resources) -> list:
    if res.executor != "processes" or res.gpus_per_cell == 0:
        return [()] * res.max_concurrent
    ids = tuple(res.gpus) or tuple(range(res.max_concurrent * res.gpus_per_cell))
    return [ids[i:i + res.gpus_per_cell] for i in range(0, len(ids) - res.gpus_per_cell + 1, res.gpus_per_cell)]


def make_executor(folder, res: Resources):
    """The submitit executor of ``res`` (logs and pickles under ``folder``), parameters set."""
    submitit = require_submitit()
    if res.executor == "processes":
        ex = submitit.LocalExecutor(folder=str(folder))
        ex.update_parameters(timeout_min=res.time_min, gpus_per_node=res.gpus_per_cell, setup=list(res.setup))
        return ex
    if res.executor != "slurm":
        raise ValueError(f"executor {res.executor!r} runs no jobs; one of {EXECUTORS[1:]}")
    ex = submitit.SlurmExecutor(folder=str(folder))
    params = dict(time=res.time_min, nodes=1, ntasks_per_node=1, cpus_per_task=res.cpus_per_cell,
                  array_parallelism=res.max_concurrent, job_name="poolsim-cell", setup=list(res.setup),
                  stderr_to_stdout=True)
    if res.gpus_per_cell:
        params["gpus_per_node"] = res.gpus_per_cell
    if res.partition:
        params["partition"] = res.partition
    known = {k: v for k, v in res.slurm.items() if k in ("account", "qos", "constraint", "mem", "exclude",
                                                          "comment", "nodelist", "mail_user", "mail_type")}
    extra = {k: v for k, v in res.slurm.items() if k not in known}
    ex.update_parameters(**params, **known, **({"additional_parameters": extra} if extra else {}))
    return ex


def _reason(job) -> str:
    try:
        err = job.exception()
    except Exception as e:  # the scheduler lost the job (e.g. a killed controller): no result pickle
        err = e
    if err is None:
        return "finished without a result"
    lines = [ln.strip() for ln in str(err).strip().splitlines() if ln.strip()]
    rules = [i for i, ln in enumerate(lines) if set(ln) == {"-"}]  # submitit frames the traceback in "----"
    if len(rules) >= 2:
        lines = lines[rules[-2] + 1:rules[-1]] or lines
    return lines[-1] if lines else type(err).__name__


def _log(job) -> Path:
    return Path(job.paths.stderr if job.paths.stderr.exists() else job.paths.stdout)


def _attach(folder: Path, name: str):
    """A Slurm job of ``name`` recorded by an earlier driver and still queued or running, else None."""
    rec = folder / f"{name}.job"
    if not rec.is_file():
        return None
    import submitit

    job = submitit.SlurmJob(folder=str(folder / "logs"), job_id=json.loads(rec.read_text())["job_id"])
    try:
        state = job.state
    except Exception:  # no sacct here: treat as gone, the job's lock keeps a live copy from running twice
        return None
    return job if state.split()[0] in _ACTIVE else None


def run_jobs(folder, jobs: list, res: Resources, *, done: Callable[[str], bool] | None = None,
             progress: bool = True, desc: str = "jobs", on_finish: Callable[[str], None] | None = None) -> Outcome:
    """Run every job of ``jobs`` as a scheduler job (``res.executor``: ``processes`` or ``slurm``).

    ``folder``: the jobs' logs (``folder/logs``), lock folders and records. ``done(name)``: whether a
    finished job's result is really there (e.g. its cell file); a job that exits without it counts as
    failed and is resubmitted. ``on_finish(name)`` is called in the driver after each finished job (e.g. to
    rewrite a partial table). Returns an :class:`Outcome`; submitit's log lines stay off the terminal."""
    res = check_resources(res)
    folder = Path(folder)
    (folder / "logs").mkdir(parents=True, exist_ok=True)
    ex = make_executor(folder / "logs", res)
    slots = _gpu_slots(res)
    by_name = {j.name: j for j in jobs}
    if len(by_name) != len(jobs):
        raise ValueError("job names must be distinct")
    quiet = logging.getLogger("submitit")
    level, quiet.level = quiet.level, logging.ERROR
    running, queue, tries = {}, [], {j.name: 0 for j in jobs}  # running: name -> (job, GPU slot index)
    results, failed = {}, []
    for j in jobs:
        old = _attach(folder, j.name) if res.executor == "slurm" else None
        if old is not None:
            running[j.name] = (old, None)
        else:
            queue.append(j)
    from tqdm.auto import tqdm

    bar = tqdm(total=len(jobs), desc=desc, disable=not progress)  # closed on every way out (finally)
    try:
        while queue or running:
            used = {slot for _, slot in running.values()}
            free = [None] * len(queue) if res.executor == "slurm" else [i for i in range(len(slots)) if i not in used]
            batch, queue = queue[:len(free)], queue[len(free):]
            if batch:
                submitted = []
                with ex.batch() if res.executor == "slurm" and len(batch) > 1 else contextlib.nullcontext():
                    for j, slot in zip(batch, free):
                        if slot is not None and slots[slot]:
                            ex.update_parameters(visible_gpus=list(slots[slot]))
                        submitted.append((j, ex.submit(CellJob(j.fn, folder / j.name), *j.args), slot))
                for j, sj, slot in submitted:  # an array's job ids exist once its batch is submitted
                    running[j.name] = (sj, slot)
                    if res.executor == "slurm":
                        atomic_write_text(folder / f"{j.name}.job", json.dumps({"job_id": sj.job_id}) + "\n")
            if res.submit_only:
                return Outcome(results, failed, sorted(running))
            time.sleep(res.poll_s)
            for name, (sj, _) in list(running.items()):
                if not sj.done():
                    continue
                del running[name]
                if done is None:
                    try:
                        results[name], ok = sj.result(), True
                    except Exception:
                        ok = False
                else:
                    ok = done(name)
                    if ok:
                        results[name] = None
                if ok:
                    bar.update(1)
                    if on_finish is not None:
                        on_finish(name)
                elif tries[name] < res.retries:
                    tries[name] += 1
                    queue.append(by_name[name])
                else:
                    failed.append((name, str(_log(sj)), _reason(sj)))
                    bar.update(1)
    except BaseException:
        if res.executor == "processes":  # local jobs are children of this driver: end them with it
            for sj, _ in running.values():
                sj.cancel(check=False)
        raise
    finally:
        bar.close()
        quiet.level = level
    return Outcome(results, failed, [])


def add_arguments(parser, *, unit: str = "cell"):
    """Add ``--executor`` and the scheduler's resources to the argparse ``parser`` (one argument group,
    returned, so that a command can add its own options to it). ``unit``: what one job runs, for the help
    texts (``"cell"``, ``"seed block"``). :func:`resources_from_args` turns the parsed values into
    :class:`Resources`; plain argparse, so that ``--help`` needs no scheduler."""
    g = parser.add_argument_group("scheduler (pip install -e \".[cluster]\"; docs/cluster.md)")
    g.add_argument("--executor", default="local",
                   help=f"local (default: everything in this process, one {unit} after another), processes "
                        f"(one process per {unit} on this machine, submitit's local executor) or slurm (one "
                        f"Slurm job array, one {unit} per array task)")
    g.add_argument("--max-concurrent", type=int, default=1, metavar="N", help=f"{unit}s running at once")
    g.add_argument("--gpus-per-cell", type=int, default=0, metavar="N", help=f"GPUs of one {unit}")
    g.add_argument("--cpus-per-cell", type=int, default=1, metavar="N", help="slurm: --cpus-per-task")
    g.add_argument("--time-limit", type=int, default=24 * 60, metavar="MINUTES",
                   help=f"per {unit}; at the limit a job checkpoints and is requeued (slurm)")
    g.add_argument("--partition", default=None, help="slurm partition")
    g.add_argument("--retries", type=int, default=2, metavar="N", help=f"resubmissions of a failed {unit}")
    g.add_argument("--gpus", nargs="+", type=int, default=[], metavar="ID",
                   help="processes: the GPU ids to hand out (default 0 .. max-concurrent x gpus-per-cell - 1)")
    g.add_argument("--slurm-set", nargs="+", default=[], metavar="KEY=VALUE",
                   help="further sbatch options, e.g. account=lab qos=high constraint=a100")
    g.add_argument("--setup", nargs="+", default=[], metavar="LINE",
                   help="shell lines each job runs first, e.g. 'source .venv/bin/activate'")
    return g


def resources_from_args(args) -> Resources:
    """The checked :class:`Resources` of ``args`` parsed with the options of :func:`add_arguments`
    (``args.submit_only``, if the command has it, too). ``ValueError`` names a bad option."""
    slurm = {}
    for pair in args.slurm_set:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--slurm-set expects KEY=VALUE, got {pair!r}")
        slurm[key.replace("-", "_")] = value
    res = Resources(executor=args.executor, max_concurrent=args.max_concurrent, gpus_per_cell=args.gpus_per_cell,
                    cpus_per_cell=args.cpus_per_cell, time_min=args.time_limit, partition=args.partition,
                    retries=args.retries, gpus=tuple(args.gpus), slurm=slurm, setup=tuple(args.setup),
                    submit_only=getattr(args, "submit_only", False),
                    poll_s=30.0 if args.executor == "slurm" else 1.0)
    return check_resources(res)


def failure_report(failed: list) -> str:
    """One line per failed job: ``name: reason (log: path)``."""
    return "\n".join(f"{name}: {why} (log: {log})" for name, log, why in failed)


__all__ = ["EXECUTORS", "CellJob", "GridFailed", "Job", "Outcome", "Resources", "add_arguments", "check_resources",
           "failure_report", "make_executor", "require_submitit", "resources_from_args", "run_jobs"]
