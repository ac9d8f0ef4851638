"""Soak test of hard stops: ``python -m adsim train`` killed by SIGKILL at many seeded random moments and
resumed, compared bitwise with an uninterrupted run (tests/adsim/_crash.py does the killing and the
comparison; tests/adsim/test_adsim_crash.py runs a handful of moments in CI).

    python benchmarks/crash_soak.py --rounds 5 --kills 4 --seed 0 [--schedule pooled|sequential]
        [--write benchmarks/results/crash_soak.md]

Each round: a fresh run folder killed at ``--kills`` moments in turn (half inside an atomic write of
checkpoint_last.pt, checkpoint_best.pt or history.json, half at a uniform random time of the
reference run's duration), ``--resume`` after each, then ``--resume`` to the end; the result must equal
the reference run bitwise (head, optimiser, scaler, history, best checkpoint, history.json).
"""
import argparse
import datetime
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "adsim")]

import _crash  # noqa: E402

COMMON = ["--target", "Brain", "--train-domains", "Liver", "Chest", "--backbone", "tiny", "--batch-size", "4",
          "--device", "cpu", "--no-progress", "--compile", "off"]
SCHEDULES = {"pooled": ["--epochs", "3", "--select-heldout", "0.25"],
             "sequential": ["--recipe", "bilora", "--epochs", "2", "--select-heldout", "0.25"]}


def _machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    return (f"nproc {os.cpu_count()}, {cpu}, {datetime.date.today()}, commit {commit.strip()}, "
            f"python {platform.python_version()}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--kills", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--schedule", choices=sorted(SCHEDULES), default="pooled")
    p.add_argument("--write", default=None, help="append the results to this markdown file")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="adsim-soak-"))
    data = work / "toy"
    subprocess.run([sys.executable, "-m", "adsim", "make-toy-bmad", str(data), "--n-per-class", "2", "--size", "64",
                    "--seed", "1"], check=True, cwd=ROOT, capture_output=True)
    train = ["--data", str(data), *COMMON, *SCHEDULES[args.schedule]]
    ref = work / "reference"
    rc, seconds = _crash.run_child(["train", *train, "--out", str(ref)])
    assert rc == 0
    rng = np.random.default_rng(args.seed)
    rows, equal, kills = [], 0, 0
    for r in range(args.rounds):
        moments = _crash.random_moments(rng, args.kills, seconds, 3)
        log = _crash.kill_and_resume(train, work / f"round{r}", moments)
        diff = _crash.differences(ref, work / f"round{r}")
        equal += not diff
        kills += sum(rc == -9 for _, rc, _ in log)
        rows.append(f"| {r} | {', '.join(f'{m}: {rc}' for m, rc, _ in log)} | {'bitwise equal' if not diff else diff} |")
        print(rows[-1], flush=True)
    text = "\n".join([
        f"### {args.schedule}: {args.rounds} rounds x {args.kills} moments, seed {args.seed}", "",
        f"Machine: {_machine()}. Reference run: {seconds:.1f} s.", "",
        f"**{equal} of {args.rounds} rounds ended bitwise equal to the uninterrupted run; {kills} processes were "
        f"killed (a timed moment after the process ended kills nothing).**", "",
        "| round | moments (return code: -9 = SIGKILLed) | result |", "|---|---|---|", *rows, ""])
    print(text)
    if args.write:
        with open(args.write, "a") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()
