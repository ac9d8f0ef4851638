"""Command line: ``python -m poolsim.figures [--out DIR] [--seeds S | --paper-seeds]
[--only NAME ... | --all] [--quick] [--check] [--overwrite] [--max-K N] [--format png,pdf]``.

The default run makes the figures of ``FIGURES``; the optional ones (``OPTIONAL``: the ``phase``
decision map, ~2 min of Monte Carlo) only with ``--only NAME`` or ``--all``.

Writes, for each figure NAME, ``NAME.csv`` (every plotted number) and ``NAME.<format>`` files, plus
``verdicts.csv`` (one row per claim, decided by :func:`poolsim.decide_claim` on paired per-seed
differences, with ``verdict_holm``: the verdict after Holm's adjustment over every claim of the
file) and ``summary.md`` (one section per figure, its claim lines rendered from those rows, and a
table of the per-claim and Holm-adjusted verdicts). With ``--only`` the other figures' sections and verdict rows already in DIR are kept.
Everything is first written into a temporary folder ``DIR/.figures-tmp-*`` (git-ignored) and only
moved into DIR (``os.replace``, file by file) once every figure has succeeded, so a failed run
leaves DIR as it was; files get the usual ``0644`` (umask) permissions. The files hold no date or command
line (summary.md names the run's settings and the JAX version; images carry no matplotlib stamp), so a rerun with the same settings
produces the same bytes, and a file whose bytes did not change is not rewritten. A figure whose table
and verdict rows reproduce the ones already in DIR within tolerance (float32 sums in another order on
another CPU; :mod:`poolsim.figures._compare`) is drawn and summarised from the numbers in DIR and its
files are kept, so ``git status`` stays clean after the default run on any x86-64 CPU; a real change
rewrites the files it changes. ``--check`` reruns into a scratch folder and compares with DIR instead
(one table per figure, exit status 1 naming the figure and claim of every difference).

Results are only replaced by results of the same size: ``settings.json`` in DIR records the settings each
figure was made with (seeds, ``--quick``, ``--max-K``; :mod:`poolsim.figures._settings`), and a run whose
settings for a figure differ (a ``--quick`` smoke run, fewer or more seeds, another ``--max-K``) stops
before any work with one line naming the figures and where to write instead (``--out DIR``), unless
``--overwrite`` says that replacing them is meant. Results of a ``--quick`` run are never protected.

``--max-K N`` (figure ``asymptotic``; figures whose ``compute`` takes ``max_K``) runs K beyond the
paper's 50 up to N, with Thm 1's K -> infinity limits overlaid (docs/tutorials/reproduce-a-figure.md).

Seeds: ``--seeds`` (default :data:`DEFAULT_SEEDS`) per experiment; the costly figures cap it
(``baselines``, ``flow_bridge``, ``multimodal``: their ``MAX_SEEDS``). ``--paper-seeds`` runs the
paper's 10 seeds -- then every verdict is "inconclusive" (fewer than 30 seeds).

``--executor processes|slurm`` (and the scheduler's resources, :func:`poolsim.cluster.add_arguments`)
runs the seeds of the figures that accept it (the decision map, ``phase``) as scheduler jobs, logs under
``--jobs-dir``; the CSVs are the same bytes as with the default ``--executor local`` (docs/cluster.md).

Compilation dominates the engine figures' time at small seed counts, so unless ``XLA_FLAGS``
already sets it this CLI compiles with ``--xla_backend_optimization_level=0`` and compiles the
distinct simulations in parallel threads; the figures that share no engine simulation
(``flow_bridge``, ``multimodal``) are computed meanwhile in background threads.
"""
from __future__ import annotations

import argparse
import inspect
import os
import shutil
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

from .. import _cluster
from .._io import file_mode

FORMATS = ("png", "pdf", "svg")
DEFAULT_SEEDS = 1000
PAPER_SEEDS = 10
TMP_PREFIX = ".figures-tmp-"  # git-ignored (.gitignore), so a killed run leaves nothing to commit
JOBS_DIR = ".figures-jobs"  # default --jobs-dir under --out, git-ignored too
_OPT = "--xla_backend_optimization_level"


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line on stderr, exit 2 (argparse prints usage too)
        raise SystemExit(_fail(message, 2))


def _fail(message: str, code: int = 1) -> int:
    print(f"poolsim.figures: error: {message}", file=sys.stderr)
    return code


def _parser(names) -> argparse.ArgumentParser:
    p = _Parser(prog="python -m poolsim.figures",
                description="Reproduce the paper's synthetic figures (simulated data) as PNG/PDF "
                            "plus a tidy CSV per figure, verdicts.csv (every claim decided on "
                            "paired per-seed differences) and summary.md.")
    p.add_argument("--out", default="figures", type=Path,
                   help="output folder (created if absent; default: figures/)")
    seeds = p.add_mutually_exclusive_group()
    seeds.add_argument("--seeds", default=DEFAULT_SEEDS, type=int,
                       help=f"Monte-Carlo seeds 0..S-1 per experiment (default: {DEFAULT_SEEDS}; "
                            "baselines, flow_bridge and multimodal use at most their MAX_SEEDS)")
    seeds.add_argument("--paper-seeds", action="store_true",
                       help=f"the paper's {PAPER_SEEDS}-seed picture (every verdict then "
                            "inconclusive: too few seeds for an interval)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--only", nargs="+", metavar="NAME",
                       help=f"make only these figures (default: all but the optional "
                            f"{', '.join(_optional(names))}): {', '.join(names)}")
    which.add_argument("--all", action="store_true",
                       help="make every figure, the optional ones too")
    p.add_argument("--quick", action="store_true",
                   help="at most 3 seeds (a smoke run; the numbers are then noisy)")
    p.add_argument("--check", action="store_true",
                   help="rerun into a scratch folder and compare with the results in --out (the committed "
                        "figures/ by default), which stay untouched: one table per figure (largest "
                        "difference in interval half-widths, verdicts); exit 1 naming the figure and "
                        "claim when a verdict differs or a number is out of tolerance")
    p.add_argument("--overwrite", action="store_true",
                   help="replace results in --out that were made with other settings (its settings.json: "
                        "seeds, --quick, --max-K); without it such a run stops before any work, naming the "
                        "figures and where to write instead")
    p.add_argument("--max-K", type=int, default=None, metavar="N", dest="max_K",
                   help="asymptotic: also K = 100, 200, 500, ... up to N (and N itself), on exact "
                        "sufficient statistics, with Thm 1's K -> infinity limits overlaid (default: "
                        "the paper's K <= 50, samples drawn; --max-K 10000: up to minutes)")
    p.add_argument("--format", default="png,pdf",
                   help=f"comma-separated image formats among {', '.join(FORMATS)} (default: png,pdf)")
    g = _cluster.add_arguments(p, unit="seed block")
    g.add_argument("--jobs-dir", type=Path, default=None,
                   help=f"the jobs' logs, a folder every node sees (default: OUT/{JOBS_DIR}, removed after a "
                        "run that succeeded); --executor applies to the figures whose seeds run as jobs "
                        "(the decision map, phase; docs/cluster.md)")
    return p


def _takes_jobs(mod) -> bool:
    """Whether the figure module ``mod``'s ``compute`` accepts ``resources`` (runs its seeds as scheduler jobs)."""
    return "resources" in inspect.signature(mod.compute).parameters


def _takes(mod, option: str) -> bool:
    """Whether the figure module ``mod``'s ``compute`` accepts the keyword ``option``."""
    return option in inspect.signature(mod.compute).parameters


def _optional(names) -> list:
    from . import OPTIONAL

    return [n for n in names if n in OPTIONAL]


def _check_out(out: Path) -> Path:
    """The output folder, created if needed; ValueError if it cannot be written."""
    out = out.expanduser().resolve()
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} exists and is not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"--out {out} cannot be created ({exc.strerror})") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise ValueError(f"--out {out} is not writable")
    return out


def _configure_xla() -> None:
    """Cheaper XLA compiles, unless the user chose an optimisation level (before JAX starts)."""
    flags = os.environ.get("XLA_FLAGS", "")
    if _OPT not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {_OPT}=0".strip()


def _make(names, out: Path, seeds: int, quick: bool, formats, only: bool, paper: bool,
          keep: bool | None = None, resources=None, jobs_dir: Path | None = None,
          max_K: int | None = None, sweep_from: Path | None = None) -> "Written":
    """``keep`` (default: ``only``): keep the other figures' verdict rows and sections already in
    ``out`` (the default run keeps the optional figures' ones). ``resources``
    (:class:`poolsim.cluster.Resources`): the figures that take it run their seeds as scheduler jobs,
    logs under ``jobs_dir``. ``sweep_from`` (default ``out``): where the verdicts' robustness column
    reads ``sensitivity.csv`` when this run does not make it (``--check``: the committed folder)."""
    keep = only if keep is None else keep
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd
    from tqdm import tqdm

    from . import _claims, _data, _renders, _settings, available, load

    modules = [load(n) for n in names]
    S = _data.n_seeds(seeds, quick)
    jobs = [job for m in modules for job in getattr(m, "SIMULATIONS", [])]
    tmp = Path(tempfile.mkdtemp(prefix=TMP_PREFIX, dir=out))
    close: list = []  # tables that reproduce the committed ones within tolerance, not bit for bit
    written: list = []
    mode = file_mode()

    stop = threading.Event()  # set when this thread fails: the background figure stops early

    def compute(name, mod):
        total = (mod.progress_total(seeds, quick) if hasattr(mod, "progress_total")
                 else S * max(1, len(getattr(mod, "SIMULATIONS", ()))))
        with tqdm(total=total, desc=f"{name} (seeds)", unit="seed", leave=False) as bar:
            def progress(n):
                if stop.is_set():
                    raise RuntimeError(f"{name}: stopped (the figure run failed elsewhere)")
                bar.update(n)

            jobs = {"resources": resources, "jobs_dir": jobs_dir} if resources is not None and _takes_jobs(mod) else {}
            if max_K is not None and _takes(mod, "max_K"):
                jobs["max_K"] = max_K
            return mod.compute(seeds=seeds, quick=quick, progress=progress, **jobs)

    # Figures that share no engine simulation (no SIMULATIONS: flow fits, the multimodal loop) are
    # computed in two background threads from the start (each its own figure), while this thread
    # runs the engine simulations and the other figures: most of their time is XLA work or NumPy
    # that releases the GIL, and the figure run otherwise leaves one of the two cores idle half the
    # time (with one background thread, multimodal waited for the flow fits: a warm run took 18 s
    # instead of 15 s on 2 cores, benchmarks/results/figures_run.md).
    # Results do not depend on the thread (every computation has its own seeds); plotting stays in
    # this thread (matplotlib is not thread-safe).
    # The bars: "figures" on the first line from the start (made before the background threads make
    # theirs) to the end, below it the simulations' bar and the background figures' bars, each removed when
    # done. "figures" is closed last, after the background threads and their bars have ended, and ends its
    # line: an error printed after this function starts on a line of its own, and no bar writes after it.
    figures_bar = tqdm(total=len(modules), desc="figures", unit="fig")
    background = ThreadPoolExecutor(max_workers=2)
    pending = {name: background.submit(compute, name, mod)
               for name, mod in zip(names, modules) if not hasattr(mod, "SIMULATIONS")}
    try:
        if jobs:
            with tqdm(total=S * len({(n, tuple(sorted(p.items()))) for n, p in jobs}),
                      desc="simulating (seeds)", unit="seed", leave=False) as bar:
                _data.prefetch(jobs, seeds=S, progress=bar.update)
        sections, verdicts = {}, []
        old_verdicts = _text(out / "verdicts.csv")
        for name, mod in zip(names, modules):
            df = pending[name].result() if name in pending else compute(name, mod)
            df = _as_committed(df, name, _text(out / f"{name}.csv"), old_verdicts, close)
            df.to_csv(tmp / f"{name}.csv", index=False)
            if not _renders.load(mod, name, formats, df, tmp):  # drawn before from these very inputs
                fig = mod.plot(df)
                try:
                    for fmt in formats:
                        # a fixed salt: SVG element ids are hashes of it (a random one by default)
                        with matplotlib.rc_context({"svg.hashsalt": f"poolsim.figures {name}"}):
                            fig.savefig(tmp / f"{name}.{fmt}", dpi=150, metadata=_metadata(fmt))
                finally:
                    plt.close(fig)
                _renders.store(mod, name, formats, df, tmp)
            sections[name] = mod.summarize(df).rstrip("\n") + "\n"
            verdicts.append(_data.verdicts_of(df))
            figures_bar.update(1)
        table = pd.concat(verdicts, ignore_index=True)
        if keep:  # keep the other figures' rows and sections already in --out
            table, sections = _merge(out, names, table, sections)
        table = _claims.annotate(_data.with_holm(table), _claims.read_sweep(tmp, sweep_from or out))
        table.to_csv(tmp / "verdicts.csv", index=False)
        made = {n: _settings.of(m, seeds, quick, max_K) for n, m in zip(names, modules)}
        kept = {n: v for n, v in _settings.read(out).items() if n not in names and n in available()} if keep else {}
        (tmp / _settings.FILE).write_text(_settings.render({**kept, **made}, available()))
        (tmp / "summary.md").write_text(_summary(names, seeds, S, quick, paper, sections, table, max_K))
        # summary.md last: when no other file changed and the summary differs only in its "Run settings"
        # line, the run reproduced every number it made and that line still names the run that made them
        # (an --only run, or another JAX version, would otherwise rewrite that line alone)
        for f in sorted(tmp.iterdir(), key=lambda f: (f.name == "summary.md", f.name)):
            if f.name == "summary.md" and not written and _same_but_run_line(f, out / f.name):
                continue
            if _same_bytes(f, out / f.name) or (f.suffix == ".csv" and _equivalent(f, out / f.name)):
                continue  # a rerun that changes nothing (beyond float noise) rewrites nothing
            os.chmod(f, mode)
            os.replace(f, out / f.name)
            written.append(f.name)
    finally:
        stop.set()
        background.shutdown(wait=True, cancel_futures=True)
        figures_bar.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return Written(written, close)


class Written(NamedTuple):
    """What :func:`_make` did: ``files`` (names) it wrote or replaced; ``reproduced``: figure tables
    (and their verdict rows) whose numbers differed from the ones in the folder only within
    tolerance (:mod:`poolsim.figures._compare`), so they and their images were kept."""

    files: list
    reproduced: list


def _text(path: Path) -> str | None:
    return path.read_text(encoding="utf-8") if path.is_file() else None


def _equivalent(new: Path, old: Path) -> bool:
    """``old`` exists and ``new`` reproduces its numbers within tolerance (:func:`_compare.compare`)."""
    from . import _compare

    if not old.is_file():
        return False
    key = _compare.VERDICT_KEY if new.name == "verdicts.csv" else None
    return _compare.compare(new.read_text(encoding="utf-8"), old.read_text(encoding="utf-8"), key).same


def _as_committed(df, name: str, old_csv: str | None, old_verdicts: str | None, close: list):
    """A figure's frame with the numbers already in the output folder where the rerun reproduces
    them within tolerance: its table (``old_csv``) and, separately, its verdict rows (of
    ``old_verdicts``). Plotting and summarising the result then gives the committed images and
    summary lines byte for byte (same code), whatever float noise the CPU added. Names of the
    tables kept although not bit-identical are appended to ``close``."""
    from . import _compare, _data

    if old_csv is not None:
        diff = _compare.compare(df.to_csv(index=False), old_csv)
        if diff.same:
            df = _compare.snap_frame(df, old_csv)
            if not diff.bitwise:
                close.append(f"{name}.csv")
    if old_verdicts is not None and df.attrs.get("verdicts"):
        mine = _data.verdicts_of(df)
        theirs = _compare.rows_where(old_verdicts, "figure", name, mine.columns)
        diff = _compare.compare(mine.to_csv(index=False), theirs, _compare.VERDICT_KEY)
        if diff.same:
            df.attrs["verdicts"] = _compare.snap_rows(df.attrs["verdicts"], old_verdicts)
            if not diff.bitwise:
                close.append(f"{name} claims")
    return df


def _sections(text: str) -> dict:
    """``{figure name: its section}`` of an existing summary.md (sections start ``## NAME -- ``)."""
    import re

    parts = re.split(r"(?m)^(?=## )", text)
    return {m.group(1): p.rstrip("\n") + "\n" for p in parts
            if (m := re.match(r"## (\S+) -- ", p))}


def _merge(out: Path, names, table, sections):
    """This run's verdict rows and sections plus the other figures' ones already in ``out``."""
    import pandas as pd

    from . import _data, available

    old_csv, old_md = out / "verdicts.csv", out / "summary.md"
    if old_csv.is_file():
        old = pd.read_csv(old_csv)
        if set(_data.VERDICT_COLUMNS) <= set(old.columns):  # the Holm column is recomputed
            old = old[list(_data.VERDICT_COLUMNS)]
            table = pd.concat([old[~old["figure"].isin(names)], table], ignore_index=True)
    old_sections = _sections(old_md.read_text()) if old_md.is_file() else {}
    merged = {n: sections.get(n, old_sections.get(n)) for n in available()}
    merged = {n: v for n, v in merged.items() if v is not None}
    order = {n: i for i, n in enumerate(available())}
    table = table.sort_values("figure", key=lambda c: c.map(order), kind="stable")
    return table.reset_index(drop=True), merged


def _same_but_run_line(new: Path, old: Path) -> bool:
    """``old`` exists and equals ``new`` but for the header line naming the run's settings."""
    if not old.is_file():
        return False

    def rest(path):
        return [ln for ln in path.read_text(encoding="utf-8").splitlines() if "Run settings: `" not in ln]
    return rest(new) == rest(old)


def _same_bytes(new: Path, old: Path) -> bool:
    """``old`` exists and holds exactly ``new``'s bytes."""
    import filecmp

    return old.is_file() and filecmp.cmp(new, old, shallow=False)


def _metadata(fmt: str) -> dict:
    """savefig metadata without creation dates or the matplotlib version, so that a rerun with the same
    seeds writes the same bytes, also under another matplotlib version (SVG ids: a fixed ``svg.hashsalt``)."""
    return {"png": {"Software": None}, "pdf": {"CreationDate": None, "Creator": None, "Producer": None},
            "svg": {"Date": None, "Creator": None}}[fmt]


def _summary(names, seeds: int, S: int, quick: bool, paper: bool, sections: dict, table,
             max_K: int | None = None) -> str:
    """summary.md: a header, the multiplicity table and one section per figure (``sections``: this run's
    ``names`` and any kept from earlier runs). The header names the settings that make the numbers and
    not the command line or a date, so that rerunning the same settings writes the same bytes."""
    import jax

    from .. import _verdict

    flags = (" --quick" if quick else "") + (" --paper-seeds" if paper else
                                             "" if seeds == DEFAULT_SEEDS else f" --seeds {seeds}") \
        + ("" if max_K is None else f" --max-K {max_K}")
    kept = [n for n in sections if n not in names]
    made = (f"Run settings: `python -m poolsim.figures{flags}` (JAX {jax.__version__})"
            + (f"; the sections of {', '.join(kept)} were kept from an earlier run (each states its "
               f"seeds; `--only NAME` remakes one)" if kept else ""))
    picture = f"the paper's {PAPER_SEEDS}-seed picture" if paper else f"{S} seeds"
    counts = table["verdict"].value_counts()
    head = [
        "# Synthetic figures: paper's claims vs this run",
        "",
        f"All data are SIMULATED (poolsim JAX Monte-Carlo engine, `poolsim.experiments`) unless a "
        f"row says REAL; {picture} (0..{S - 1}) per engine experiment (the costly figures use the "
        f"first seeds only; each section states its count), the paper's parameters unless marked "
        f"(ours). {made}.",
        "",
        f"Verdicts (`verdicts.csv`, one row per claim): each claim is decided on the PAIRED "
        f"per-seed difference of the quantities it compares, with a 95% Student-t interval: "
        f"**holds** if the interval lies on the claimed side of the threshold, **does not hold** "
        f"if it lies on the other side, **inconclusive** if it contains the threshold or there are "
        f"fewer than {_verdict.MIN_SEEDS} seeds. Where the paper gives no threshold, ours is named. "
        f"This file: " + ", ".join(f"{counts.get(o, 0)} {o}" for o in _verdict.OUTCOMES) + ".",
        "",
        *_holm_lines(table),
        "",
    ]
    return "\n".join(head) + "\n" + "\n".join(sections.values())


def _holm_lines(table) -> list:
    """The multiplicity paragraph and the per-claim vs Holm-adjusted verdict table."""
    from . import _data
    from .. import _verdict

    col = _data.HOLM_COLUMN
    fam = int((table["side"] != "zero").sum())
    counts = table[col].value_counts()
    lines = [
        f"Many claims at once: each verdict above is decided at 95% on its own, so among "
        f"{len(table)} claims some could be misdecided by chance. Column `{col}` of "
        f"`verdicts.csv` is the verdict after Holm's step-down adjustment over the {fam} tested "
        f"claims of this file (family-wise error <= 5%; p-value: the two-sided t-test of each "
        f"claim's paired difference against its threshold; 'no counterexample' claims are "
        f"deterministic checks, not tests, and keep their verdict). Holm-adjusted: "
        + ", ".join(f"{counts.get(o, 0)} {o}" for o in _verdict.OUTCOMES) + ".",
        "",
        "| figure | claim | per-claim verdict | Holm-adjusted |",
        "|---|---|---|---|",
    ]
    for r in table.itertuples():
        mark = "" if r.verdict == getattr(r, col) else " (changed)"
        lines.append(f"| {r.figure} | {r.claim.replace('|', '/')} | {r.verdict} | "
                     f"{getattr(r, col)}{mark} |")
    return lines


def main(argv=None) -> int:
    from . import available, load

    names_all = available()
    args = _parser(names_all).parse_args(argv)
    try:
        if args.seeds <= 0:
            raise ValueError(f"--seeds must be a positive integer, got {args.seeds}")
        names = list(dict.fromkeys(args.only or (
            names_all if args.all else [n for n in names_all if n not in _optional(names_all)])))
        bad = [n for n in names if n not in names_all]
        if bad:
            raise ValueError(f"unknown figure(s) {', '.join(bad)}; choose from {', '.join(names_all)}")
        formats = [f.strip().lower() for f in args.format.split(",") if f.strip()]
        if not formats or any(f not in FORMATS for f in formats):
            raise ValueError(f"--format must be a comma-separated subset of {', '.join(FORMATS)}, "
                             f"got {args.format!r}")
        res = _cluster.resources_from_args(args)
        if res.executor != "local" and not any(_takes_jobs(load(n)) for n in names):
            raise ValueError(f"--executor {res.executor}: none of the figures made ({', '.join(names)}) runs "
                             f"seed blocks as jobs; those that do: "
                             f"{', '.join(n for n in names_all if _takes_jobs(load(n)))}")
        if args.max_K is not None and not any(_takes(load(n), "max_K") for n in names):
            raise ValueError(f"--max-K: none of the figures made ({', '.join(names)}) takes it; those that do: "
                             f"{', '.join(n for n in names_all if _takes(load(n), 'max_K'))}")
        if args.max_K is not None:
            from .asymptotic import ks_for

            try:  # a bad value fails here, before any work, naming the allowed range
                ks_for(args.max_K)
            except ValueError as exc:
                raise ValueError(f"--max-K: {exc}") from None
        seeds = PAPER_SEEDS if args.paper_seeds else args.seeds
        settings = dict(seeds=seeds, quick=args.quick, paper=seeds == PAPER_SEEDS and not args.quick,
                        resources=None if res.executor == "local" else res, max_K=args.max_K)
        if args.check:
            return _check(names, args, settings)
        replaced = _replacing(args.out, names, settings, args.overwrite)  # before any work
        out = _check_out(args.out)
        _configure_xla()
        jobs_dir = (args.jobs_dir or out / JOBS_DIR).expanduser().resolve()
        done = _make(names, out, settings["seeds"], args.quick, list(dict.fromkeys(formats)), bool(args.only),
                     settings["paper"],  # --seeds 10 is the paper's picture too
                     keep=bool(args.only) or len(names) < len(names_all),
                     resources=settings["resources"], jobs_dir=jobs_dir, max_K=args.max_K)
        if res.executor != "local" and args.jobs_dir is None:
            shutil.rmtree(jobs_dir, ignore_errors=True)  # kept after a failure: the error names its logs
    except (ValueError, OSError, _cluster.GridFailed) as exc:
        return _fail(str(exc))
    print(f"made {len(names)} figure(s) in {out}: "
          + (f"wrote {', '.join(done.files)}" if done.files else "no file changed")
          + (f"; kept {', '.join(done.reproduced)}: reproduced within tolerance, not bit for bit "
             f"(docs/getting-started.md, 'Reproduced or changed')" if done.reproduced else "")
          + (f"; --overwrite replaced the results of {_listed(replaced)}" if replaced else ""), file=sys.stderr)
    return 0


def _planned(names, settings) -> dict:
    """``{figure: settings.json entry}`` of a run with ``settings`` (:func:`main`'s dict)."""
    from . import _settings, load

    return {n: _settings.of(load(n), settings["seeds"], settings["quick"], settings["max_K"]) for n in names}


def _listed(pairs) -> str:
    """``asymptotic, symmetric made with 1000 seeds; phase made with --quick (3 seeds)`` for
    ``[(figure, settings)]``."""
    from . import _settings

    groups: dict = {}
    for n, s in pairs:
        groups.setdefault(_settings.describe(s), []).append(n)
    return "; ".join(f"{', '.join(ns)} made with {how}" for how, ns in groups.items())


def _replacing(out_arg: Path, names, settings, overwrite: bool) -> list:
    """The figures whose results in ``--out`` this run would replace with results made with other settings
    (``[(figure, recorded settings)]``; :func:`poolsim.figures._settings.conflicts`). Without ``overwrite``
    any such figure is a ValueError: one line naming them, this run's settings and where to write instead."""
    from . import _settings

    folder = out_arg.expanduser().resolve()
    planned = _planned(names, settings)
    bad = _settings.conflicts(_settings.read(folder) if folder.is_dir() else {}, planned)
    if bad and not overwrite:
        it = "it" if len(bad) == 1 else "them"
        raise ValueError(f"{out_arg / _settings.FILE} records {_listed(bad)}; this run would replace {it} "
                         f"with {_settings.describe(planned[bad[0][0]])}: write elsewhere with --out DIR, "
                         f"compare without writing with --check, or replace {it} on purpose with --overwrite")
    return bad


def _check(names, args, settings) -> int:
    """``--check``: make ``names`` into a scratch folder, compare with ``--out``; 0 when every
    number is within tolerance and every verdict equal, else 1 (each difference on stderr)."""
    from . import _check as check

    committed = args.out.expanduser().resolve()
    if not committed.is_dir():
        raise ValueError(f"--check compares with --out {committed}, which is not a folder")
    from . import _settings

    planned = _planned(names, settings)
    other = _settings.conflicts(_settings.read(committed), planned)
    if other:  # not an error: a smaller run may be checked on purpose, but its numbers differ by design
        print(f"poolsim.figures --check: note: {committed / _settings.FILE} records {_listed(other)}; this "
              f"run uses {_settings.describe(planned[other[0][0]])}, so its numbers differ by "
              f"design", file=sys.stderr)
    _configure_xla()
    scratch = Path(tempfile.mkdtemp(prefix="poolsim-figures-check-"))
    try:
        jobs_dir = (args.jobs_dir or scratch / JOBS_DIR).expanduser().resolve()
        _make(names, scratch, settings["seeds"], settings["quick"], [], False, settings["paper"],
              keep=False, resources=settings["resources"], jobs_dir=jobs_dir, max_K=settings["max_K"],
              sweep_from=committed)
        rep = check.report(names, scratch, committed)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(rep.text)
    for line in rep.problems:
        print(f"poolsim.figures --check: {line}", file=sys.stderr)
    verdict = (f"{len(rep.problems)} difference(s) beyond tolerance" if rep.problems else
               "every number within tolerance and every verdict equal")
    print(f"poolsim.figures --check: {', '.join(names)} vs {committed}: {verdict}", file=sys.stderr)
    return 1 if rep.problems else 0


if __name__ == "__main__":
    sys.exit(main())
