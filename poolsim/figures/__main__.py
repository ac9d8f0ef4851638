"""Command line: ``python -m poolsim.figures [--out DIR] [--seeds S] [--only NAME ...] [--quick]
[--format png,pdf]``.

Writes, for each figure NAME, ``NAME.csv`` (every plotted number) and ``NAME.<format>`` files, plus
``summary.md`` (one section per figure made in this run). Everything is first written into a
temporary folder next to DIR and only moved into DIR (``os.replace``, file by file) once every
figure has succeeded, so a failed run leaves DIR as it was.

Compilation dominates the run time (each simulation itself takes well under a second), so unless
``XLA_FLAGS`` already sets it this CLI compiles with ``--xla_backend_optimization_level=0`` and
compiles the distinct simulations in parallel threads.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

FORMATS = ("png", "pdf", "svg")
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
                            "plus a tidy CSV per figure and summary.md.")
    p.add_argument("--out", default="figures", type=Path,
                   help="output folder (created if absent; default: figures/)")
    p.add_argument("--seeds", default=10, type=int,
                   help="Monte-Carlo seeds 0..S-1 per experiment (default: 10, as in the paper)")
    p.add_argument("--only", nargs="+", metavar="NAME",
                   help=f"make only these figures (default: all): {', '.join(names)}")
    p.add_argument("--quick", action="store_true",
                   help="at most 3 seeds (a smoke run; the numbers are then noisy)")
    p.add_argument("--format", default="png,pdf",
                   help=f"comma-separated image formats among {', '.join(FORMATS)} (default: png,pdf)")
    return p


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


def _make(names, out: Path, seeds: int, quick: bool, formats, only: bool) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from tqdm import tqdm

    from . import _data, load

    modules = [load(n) for n in names]
    S = _data.n_seeds(seeds, quick)
    jobs = [job for m in modules for job in getattr(m, "SIMULATIONS", [])]
    tmp = Path(tempfile.mkdtemp(prefix=".figures-tmp-", dir=out))
    try:
        if jobs:
            with tqdm(total=S * len({(n, tuple(sorted(p.items()))) for n, p in jobs}),
                      desc="simulating (seeds)", unit="seed") as bar:
                _data.prefetch(jobs, seeds=S, progress=bar.update)
        sections = []
        for name, mod in zip(names, tqdm(modules, desc="figures", unit="fig")):
            units = S * max(1, len(getattr(mod, "SIMULATIONS", ())))
            with tqdm(total=units, desc=f"{name} (seeds)", unit="seed", leave=False) as bar:
                df = mod.compute(seeds=seeds, quick=quick, progress=bar.update)
            df.to_csv(tmp / f"{name}.csv", index=False)
            fig = mod.plot(df)
            try:
                for fmt in formats:
                    fig.savefig(tmp / f"{name}.{fmt}", dpi=150, metadata=_metadata(fmt))
            finally:
                plt.close(fig)
            sections.append(mod.summarize(df))
        (tmp / "summary.md").write_text(_summary(names if only else None, seeds, S, quick, sections))
        for f in sorted(tmp.iterdir()):
            os.replace(f, out / f.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _metadata(fmt: str) -> dict:
    # No creation dates in the files, so a re-run with the same seeds gives the same bytes (PDF/SVG).
    return {"pdf": {"CreationDate": None}, "svg": {"Date": None}}.get(fmt, {})


def _summary(only, seeds: int, S: int, quick: bool, sections) -> str:
    import jax

    cmd = "python -m poolsim.figures" + (" --quick" if quick else "") + f" --seeds {seeds}"
    if only:
        cmd += " --only " + " ".join(only)
    head = [
        "# Synthetic figures: paper's claims vs this run",
        "",
        f"All data are SIMULATED (poolsim JAX Monte-Carlo engine, `poolsim.experiments`), "
        f"{S} seeds (0..{S - 1}) per experiment, the paper's parameters unless marked (ours). "
        f"Regenerate with `{cmd}` (JAX {jax.__version__}). \"holds\" / \"does not hold\" compare "
        f"the paper's qualitative claim with this run's numbers; intervals are 95% Student-t over "
        f"seeds.",
        "",
    ]
    return "\n".join(head + sections)


def main(argv=None) -> int:
    from . import available

    names_all = available()
    args = _parser(names_all).parse_args(argv)
    try:
        if args.seeds <= 0:
            raise ValueError(f"--seeds must be a positive integer, got {args.seeds}")
        names = list(dict.fromkeys(args.only or names_all))
        bad = [n for n in names if n not in names_all]
        if bad:
            raise ValueError(f"unknown figure(s) {', '.join(bad)}; choose from {', '.join(names_all)}")
        formats = [f.strip().lower() for f in args.format.split(",") if f.strip()]
        if not formats or any(f not in FORMATS for f in formats):
            raise ValueError(f"--format must be a comma-separated subset of {', '.join(FORMATS)}, "
                             f"got {args.format!r}")
        out = _check_out(args.out)
        _configure_xla()
        _make(names, out, args.seeds, args.quick, list(dict.fromkeys(formats)), bool(args.only))
    except (ValueError, OSError) as exc:
        return _fail(str(exc))
    print(f"wrote {len(names)} figure(s) and summary.md to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
