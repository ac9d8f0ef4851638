"""Where a new process's first ``experiments.run`` goes: start-up, stored programs, compiles, the run, the frame.

Not a test. Runs two fresh Python processes one after the other with the same new program store
(``POOLSIM_CACHE_DIR``): *cold* (nothing stored: every engine program is traced, lowered and compiled,
then stored) and *warm* (the engine's programs load from the store). Each process times, in order:

* ``import jax`` and the backend's start (``jax.devices()``), ``import poolsim.experiments``;
* its first and second ``experiments.run(NAME, seeds=S, materialize=False, chunk=C)`` (10^6 seeds and
  131,072 per chunk by default, the GPU session's call), each split into
  - ``store load``: executables read from the program store (``poolsim._programs``), with their count;
  - ``engine compile``: the engine's programs traced, lowered and compiled (cold process), with their count;
  - ``other compiles``: XLA compilations outside the engine's programs (``jax.monitoring``'s backend
    compile events: the device-side gather's slices and concatenations on the accelerator path, small
    eager ops), with their count;
  - ``simulate``: the rest of ``poolsim._engine.simulate`` (dispatch, the programs running, transfers);
  - ``frame``: building the pandas frame from the per-seed arrays.

Prints one markdown table (rows: process x call) and, with ``--out FILE``, writes it there too. Runs on
any backend (a CPU smoke run: ``--seeds 20000``); ``POOLSIM_ENGINE_PATH=accelerator`` runs the GPU's
code path on a CPU. ``benchmarks/gpu_session.sh`` section ``mc`` runs it on the device.

    python benchmarks/engine_first_call.py [--seeds 1000000] [--chunk 131072] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap

_CHILD = textwrap.dedent("""
    import json, sys, time
    t0 = time.perf_counter()
    import jax
    t1 = time.perf_counter()
    devices = jax.devices()
    t2 = time.perf_counter()
    from poolsim import _engine, _programs, experiments as ex
    t3 = time.perf_counter()
    acc = {"load": [0.0, 0], "engine_compile": [0.0, 0], "xla": [0.0, 0], "simulate": [0.0, 0],
           "frame": [0.0, 0]}
    inside = []  # the XLA compiles inside the engine's own compile are counted there

    def timed(key, fn, nest=False):
        def wrapper(*a, **k):
            t = time.perf_counter()
            if nest:
                inside.append(1)
            try:
                return fn(*a, **k)
            finally:
                if nest:
                    inside.pop()
                acc[key][0] += time.perf_counter() - t
                acc[key][1] += 1
        return wrapper

    _programs._load = timed("load", _programs._load)
    _programs.Program._compile = timed("engine_compile", _programs.Program._compile, nest=True)
    _engine.simulate = timed("simulate", _engine.simulate)
    ex.frame = timed("frame", ex.frame)

    def listener(event, duration, **kw):
        if event == "/jax/core/compile/backend_compile_duration" and not inside:
            acc["xla"][0] += duration
            acc["xla"][1] += 1

    jax.monitoring.register_event_duration_secs_listener(listener)
    S, C = int(sys.argv[1]), int(sys.argv[2])
    calls = []
    for _ in range(2):
        for v in acc.values():
            v[:] = [0.0, 0]
        t = time.perf_counter()
        ex.run("domain_addition", seeds=S, materialize=False, chunk=C)
        calls.append({"total": time.perf_counter() - t, **{k: list(v) for k, v in acc.items()}})
    print(json.dumps({"import_jax": t1 - t0, "backend": t2 - t1, "import_poolsim": t3 - t2,
                      "platform": devices[0].platform, "device": getattr(devices[0], "device_kind", ""),
                      "path": _engine.accelerator_path(), "calls": calls}))
""")


def _child(seeds: int, chunk: int, cache: str, timeout: float) -> dict:
    env = {**os.environ, "POOLSIM_CACHE_DIR": cache, "PYTHONUNBUFFERED": "1"}
    here = os.path.dirname(os.path.abspath(__file__))
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(here), env.get("PYTHONPATH", "")])
    p = subprocess.run([sys.executable, "-c", _CHILD, str(seeds), str(chunk)], env=env, capture_output=True,
                       text=True, timeout=timeout)
    if p.returncode:
        raise SystemExit(f"child failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def table(rows: dict, seeds: int, chunk: int) -> str:
    """Markdown: one row per (process, call), the columns of the module docstring (seconds)."""
    first = next(iter(rows.values()))
    lines = [f"`experiments.run('domain_addition', seeds={seeds:,}, materialize=False, chunk={chunk:,})` in a new "
             f"process, backend {first['platform']} {first['device']}, accelerator path {first['path']}; "
             "seconds (count).", "",
             "| process | start-up: import jax / backend / import poolsim | call | total | store load | engine compile "
             "| other compiles | simulate (rest) | frame | unaccounted |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in rows.items():
        start = f"{r['import_jax']:.2f} / {r['backend']:.2f} / {r['import_poolsim']:.2f}"
        for i, c in enumerate(r["calls"]):
            load, comp, xla, sim, fr = (c[k] for k in ("load", "engine_compile", "xla", "simulate", "frame"))
            rest = sim[0] - load[0] - comp[0] - xla[0]
            other = c["total"] - sim[0] - fr[0]
            lines.append(f"| {name} | {start if i == 0 else ''} | {('first', 'second')[i]} | {c['total']:.2f} "
                         f"| {load[0]:.2f} ({load[1]}) | {comp[0]:.2f} ({comp[1]}) | {xla[0]:.2f} ({xla[1]}) "
                         f"| {rest:.2f} | {fr[0]:.2f} | {other:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=1_000_000)
    ap.add_argument("--chunk", type=int, default=131_072)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per process")
    ap.add_argument("--out", help="also write the table to this file")
    ap.add_argument("--targets", help="append the issue's target rows (name|measured|target|met) to this file "
                                      "(benchmarks/gpu_targets.py)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="poolsim-first-call-") as cache:
        rows = {name: _child(args.seeds, args.chunk, cache, args.timeout) for name in ("cold", "warm")}
    text = table(rows, args.seeds, args.chunk)
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")
    if args.targets:
        cold, warm = rows["cold"]["calls"][0]["total"], rows["warm"]["calls"][0]["total"]
        frame = rows["warm"]["calls"][1]["total"]
        with open(args.targets, "a") as fh:
            for name, got, limit in ((f"engine: first run() in a new process, cold store ({args.seeds:,} seeds)", cold,
                                      20.0),
                                     ("engine: first run() in a new process, warm store", warm, 5.0),
                                     ("engine: run() once compiled (frame built)", frame, 2.0)):
                fh.write(f"{name}|{got:.2f} s|<= {limit:g} s|{'yes' if got <= limit else 'NO'}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
