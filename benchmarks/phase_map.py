"""Benchmark: the decision map's Monte Carlo (``poolsim._phase``) -- a 20 x 20 grid of (share,
shift) cells x 1 000 seeds in one compiled program, compilation included.

Not a test. Each measurement is a fresh process (so the compile is counted, as a user running
``python -m poolsim.figures --only phase`` pays it), timed from before ``import jax`` to the last
chunk's reduced statistics on the host. Cases:

* ``single``: one law (contaminated), one K (50), one n (150), the figure's 10-tau grid and its four
  tau rules -- 400 cells, the issue's ">= 400 cells x >= 1 000 seeds in <= 2 min" target;
* ``law``: one law at the figure's 2 K x 2 n (1 600 cell decisions), as the figure runs it.

Every case runs ``--repeat`` times (default 2; the machine is shared: the load average is printed
with each time). Prints a Markdown table; ``--write`` replaces the "Decision map" section of
``benchmarks/RESULTS.md``.

    python benchmarks/phase_map.py [--seeds 1000] [--repeat 2] [--write]
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

CHILD = r"""
import sys, time
t0 = time.perf_counter()
import jax
from poolsim import _phase
from poolsim.figures import phase
case, seeds = sys.argv[1], int(sys.argv[2])
cfg = phase.LAWS["contaminated"]
spec = phase.spec("contaminated")
if case == "single":
    spec = spec._replace(Ks=(50,), ns=(150,))
m = _phase.run_grid(spec, cfg["shares"], cfg["shifts"], seeds=seeds)
cells = m.sums.shape[0] * m.sums.shape[1] * m.sums.shape[2] * m.sums.shape[3]
print(f"{time.perf_counter() - t0:.2f} {cells} {jax.default_backend()}")
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args(argv)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root}
    rows = []
    for case in ("single", "law"):
        for _ in range(args.repeat):
            r = subprocess.run([sys.executable, "-c", CHILD, case, str(args.seeds)], env=env,
                               capture_output=True, text=True, check=True)
            secs, cells, backend = r.stdout.split()
            load = os.getloadavg()[0]
            rows.append(f"| {case} | {cells} | {args.seeds} | {backend} | {float(secs):.1f} | "
                        f"{load:.1f} |")
            print(rows[-1], flush=True)
    table = "\n".join(["| case | cells | seeds | backend | wall s (compile included) | load avg |",
                       "|---|---|---|---|---|---|", *rows])
    print(table)
    if args.write:
        path = os.path.join(root, "benchmarks", "RESULTS.md")
        text = open(path).read()
        section = ("## Decision map (`poolsim._phase`, benchmarks/phase_map.py)\n\n"
                   f"{os.cpu_count()} CPU cores, shared with other jobs (load average per row).\n\n"
                   + table + "\n")
        if "## Decision map" in text:
            text = re.sub(r"## Decision map.*?(?=\n## |\Z)", section, text, flags=re.S)
        else:
            text = text.rstrip("\n") + "\n\n" + section
        with open(path, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
