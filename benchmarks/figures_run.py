"""Benchmark: ``python -m poolsim.figures`` run in-process with a timer around every figure's
``compute``, ``plot`` and ``summarize`` (and the engine prefetch; for ``phase`` also ``run_grid``,
``_cell_frame`` and ``limit_eps``), each with its thread, start and duration; then the process's
wall and CPU time and the load average. Not a test; numbers in benchmarks/results/figures_run.md.

    POOLSIM_CACHE_DIR=$(mktemp -d) python benchmarks/figures_run.py --all --out /tmp/figs

The arguments are the CLI's. Sets ``--xla_backend_optimization_level=0`` like the CLI does, before
JAX starts (the CLI's own setting comes too late here: this script imports the figures first).
"""
import functools
import os
import sys
import threading
import time

T0 = time.perf_counter()
if "--xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()
from poolsim.figures import __main__ as cli, _data, load, available  # noqa: E402
LOG = []

def wrap(obj, attr, label):
    f = getattr(obj, attr)
    @functools.wraps(f)
    def g(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            LOG.append((label, threading.current_thread().name, t - T0, time.perf_counter() - t))
    setattr(obj, attr, g)

for n in available():
    m = load(n)
    for attr in ("compute", "plot", "summarize"):
        wrap(m, attr, f"{n}.{attr}")
    if n == "phase":
        from poolsim import _phase
        wrap(_phase, "run_grid", "phase.run_grid")
        wrap(m, "_cell_frame", "phase._cell_frame")
        wrap(m, "limit_eps", "phase.limit_eps")
wrap(_data, "prefetch", "prefetch(engine sims)")
rc = cli.main(sys.argv[1:])
wall = time.perf_counter() - T0
ru = os.times()
for label, th, start, dur in sorted(LOG, key=lambda r: r[2]):
    print(f"{label:32s} {th:24s} start {start:7.2f}s  {dur:7.2f}s")
print(f"TOTAL wall {wall:.2f}s user {ru.user:.1f}s sys {ru.system:.1f}s load {os.getloadavg()}")
sys.exit(rc)
