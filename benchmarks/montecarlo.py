"""Benchmark: the JAX Monte-Carlo engine vs the plain NumPy reference on `domain_addition`.

Not a test. Measures, in one run and on this machine:

1. seeds/s of the NumPy loop reference (``poolsim._reference.ref_domain_addition``, samples drawn,
   sample-median init -- the paper's set-up) and of the engine, both paths: ``materialize=True``
   (same work as the reference) and the sufficient-statistics path (``materialize=False``), at
   100, 1 000 and 10 000 seeds; engine times exclude compilation (reported separately);
2. the sufficient-statistics path at n = 1e2 ... 1e5 samples per domain (its cost should be flat).

With ``--baseline REV`` the engine as committed at git revision REV (``poolsim/_engine.py`` or the
package ``poolsim/_engine/``; the rest of poolsim is this tree's) is timed in the same run, so before/after ratios share the machine's load.

Everything is measured ``--repeat`` times (default 3; the machine is shared) and every cell is
the median; the targets line lists each run's ratios. A profile line splits one chunk's time
into the engine's two programs (draws, estimates) and the host sample medians.

Then the user calls at ``--big`` seeds (default 10^5): ``run``, ``summarize``, the frame build and
the materialised ``simulate``, as ratios against the reference timed in the same run.

Writes a Markdown table with machine info and the load average to
``benchmarks/results/montecarlo.md`` (section "Monte-Carlo engine (CPU)", replaced in place)
unless ``--no-write``.

    python benchmarks/montecarlo.py [--seeds 100 1000 10000] [--ref-max-seeds N] [--baseline REV]
                                    [--repeat 3] [--no-write]
"""
from __future__ import annotations

import argparse
import os
import platform
import re
import sys
import time

import numpy as np

NOTE = ("What changed in this pass (host, `run`'s frame): the per-seed frame is built from "
        "as few new bytes as it can be -- `n_domains` and `est_*` are views of the gathered engine "
        "arrays (`est_*` in the engine's dtype, float32 by default), `seed` is uint32 and `K`, "
        "`n_iter` int32 (were int64 and float64 columns), `eps` is formed in row blocks without a "
        "full-size float64 temporary: ~180 MB of new columns at 10^5 seeds where it was ~650 MB. "
        "Same numbers: the frame's values equal the engine arrays exactly and `eps` is bitwise "
        "the same (tests/test_engine_frame.py).\n\n")


def machine_info() -> str:
    import jax

    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"jax {jax.__version__} ({jax.devices()[0].platform}), NumPy {np.__version__}")


def call_times(fn, *, iters: int, warmup: int = 0) -> list[float]:
    """Seconds of each of ``iters`` timed calls of ``fn()``, after ``warmup`` untimed calls (compile,
    caches). The benchmarks' one timing loop: they report its median or its minimum."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def time_reference(S: int) -> float:
    from poolsim import _reference
    from poolsim import experiments as ex

    P = {**ex.COMMON, **ex.EXPERIMENTS["domain_addition"].defaults}
    kw = {k: P[k] for k in ("Ks", "n", "sigma", "tau", "every", "radius", "gamma", "jitter", "d",
                            "m_frac", "n_sub", "tol", "max_iter")}
    rng = np.random.default_rng(0)
    t = time.perf_counter()
    for _ in range(S):
        _reference.ref_domain_addition(rng, **kw)
    return time.perf_counter() - t


def load_engine(rev: str | None):
    """``poolsim._engine``, or its version at git revision ``rev`` loaded as a separate module."""
    import importlib.util
    import subprocess
    import tempfile

    from poolsim import _engine

    if rev is None:
        return _engine
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def show(path: str) -> str:
        return subprocess.run(["git", "show", f"{rev}:{path}"], cwd=root, check=True,
                              capture_output=True, text=True).stdout

    files = subprocess.run(["git", "ls-tree", "-r", "--name-only", rev, "poolsim/_engine/"], cwd=root,
                           check=True, capture_output=True, text=True).stdout.split()
    name = "poolsim._engine_baseline"
    folder = os.path.join(tempfile.mkdtemp(), "_engine_baseline")
    os.makedirs(folder)
    if files:  # the engine package (poolsim/_engine/*.py): its modules import each other relatively
        for f in files:
            with open(os.path.join(folder, os.path.basename(f)), "w") as out:
                out.write(show(f))
        spec = importlib.util.spec_from_file_location(name, os.path.join(folder, "__init__.py"),
                                                      submodule_search_locations=[folder])
    else:  # one module, poolsim/_engine.py (a module of poolsim: ``from . import _core`` is poolsim's)
        path = os.path.join(folder, "_engine_baseline.py")
        with open(path, "w") as out:
            out.write(show("poolsim/_engine.py"))
        spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def time_engine(S: int, engine=None, **params) -> tuple[float, float]:
    """(first call incl. compile, best of two warm calls) in seconds."""
    from poolsim import _engine as current
    from poolsim import experiments as ex

    spec, P = ex.spec("domain_addition", **params)
    _engine = engine or current

    seeds = np.arange(S)
    t = time.perf_counter()
    _engine.simulate(spec, seeds, dtype=P["dtype"], chunk=P["chunk"])
    first = time.perf_counter() - t
    warm = []
    for _ in range(2):
        t = time.perf_counter()
        _engine.simulate(spec, seeds, dtype=P["dtype"], chunk=P["chunk"])
        warm.append(time.perf_counter() - t)
    return first, min(warm)


def profile(S: int = 2048) -> str:
    """Where the current engine's time goes, one chunk of ``S`` seeds per path (best of 3 warm
    calls, ms): program 1 (all random draws), program 2 (estimates), and inside program 2 the
    host prefix medians (timed alone on the same samples)."""
    import jax
    import jax.numpy as jnp

    from poolsim import _engine
    from poolsim import experiments as ex

    def best(f, *a):
        return 1e3 * min(call_times(lambda: jax.block_until_ready(f(*a)), iters=3, warmup=1))

    seeds = jnp.arange(S, dtype=jnp.uint32)
    out = []
    for mat in (True, False):
        spec, P = ex.spec("domain_addition", materialize=mat)
        draw_fn, est_fn = _engine.compiled(spec, P["dtype"])
        draws = draw_fn(seeds)
        if mat:  # the sample medians run on the host between the programs
            smp = np.asarray(draws.samples).reshape(S, -1, spec.d)
            med = _engine.host_prefix_medians(smp, spec.n, spec.Ks)
            cells = [best(draw_fn, seeds), best(est_fn, draws, med),
                     best(lambda x, s=spec: _engine.host_prefix_medians(x, s.n, s.Ks), smp)]
        else:
            cells = [best(draw_fn, seeds), best(est_fn, draws)]
        out.append(f"{'materialised' if mat else 'sufficient statistics'}: draws {cells[0]:.0f} ms, "
                   f"estimates {cells[1]:.0f} ms" + (f" (plus host sample medians {cells[2]:.0f} ms between them)"
                                                     if mat else ""))
    return f"Profile, one chunk of {S:,} seeds (best of 3, ms, load {os.getloadavg()[0]:.1f}): " + \
        "; ".join(out) + ".\n\n"


def interleaved(calls: dict, repeat: int) -> dict:
    """``{name: [(wall s, process CPU s), ...]}``: the calls timed in turn, ``repeat`` rounds
    (each round calls every one once), so that every call sees the same stretch of the machine's
    load. CPU time counts every thread of this process (XLA's included)."""
    out = {k: [] for k in calls}
    for _ in range(repeat):
        for k, f in calls.items():
            t, c = time.perf_counter(), time.process_time()
            f()
            out[k].append((time.perf_counter() - t, time.process_time() - c))
    return out


def _warm(name: str, **kw) -> None:
    """Compile the chunk-size programs of ``summarize`` and ``run`` with a cheap call (two chunks
    of :data:`poolsim._engine.SMALL_CHUNK`-plus seeds take the same compiled shape as any larger
    run)."""
    from poolsim import _engine
    from poolsim import experiments as ex

    small = 2 * _engine.SMALL_CHUNK + 1
    ex.summarize(name, seeds=small, **kw)
    ex.run(name, seeds=small, **kw)


def user_calls(S: int, repeat: int) -> str:
    """Issue 31's targets at ``S`` seeds (sufficient path): what a user calls -- ``run`` (per-seed
    frame) and ``summarize`` (on-device reduction), timed interleaved (:func:`interleaved`),
    ``simulate`` of the frame's fields and the frame build alone -- and the materialised
    ``simulate``, each against the NumPy reference timed in the same run (on at most 300 seeds,
    scaled). Best of ``repeat`` warm calls."""
    from poolsim import experiments as ex

    def best(f):
        return min(call_times(f, iters=repeat))

    ref = time_reference(300) / 300 * S
    kw = dict(seeds=S, materialize=False)
    _warm("domain_addition", materialize=False)
    _warm("domain_addition", materialize=True)
    pair = interleaved({"run": lambda: ex.run("domain_addition", **kw),
                        "summarize": lambda: ex.summarize("domain_addition", **kw)}, repeat)
    t_run, t_sum = (min(w for w, _ in pair[k]) for k in ("run", "summarize"))
    c_run, c_sum = (min(c for _, c in pair[k]) for k in ("run", "summarize"))
    rounds = [r[0] / s[0] for r, s in zip(pair["run"], pair["summarize"])]
    t_sim = best(lambda: ex.simulate("domain_addition", fields=ex.FRAME_FIELDS, **kw))
    res, P = ex.simulate("domain_addition", fields=ex.FRAME_FIELDS, **kw)
    t_frame = best(lambda: ex.frame("domain_addition", res, P))
    res = None
    t_mat = best(lambda: ex.simulate("domain_addition", seeds=S, fields=ex.FRAME_FIELDS))
    met = lambda r, t: f"{r:,.0f}x ({'met' if r >= t else 'NOT met'}, target >= {t}x)"  # noqa: E731
    return (f"User calls at {S:,} seeds (best of {repeat}, `run` and `summarize` interleaved; "
            f"load {os.getloadavg()[0]:.1f}; reference {ref:,.0f} s scaled from 300 "
            f"seeds): sufficient `run` {t_run:.2f} s = {met(ref / t_run, 350)}; `summarize` "
            f"{t_sum:.2f} s = {met(ref / t_sum, 350)}; `run` / `summarize` {t_run / t_sum:.3f} "
            f"wall, {c_run / c_sum:.3f} CPU time (target <= 1.15; per round, wall: "
            f"{', '.join(f'{r:.3f}' for r in rounds)}); of `run`: `simulate` of the frame's "
            f"fields {t_sim:.2f} s, frame (rebuilt from the same arrays) {t_frame:.2f} s; "
            f"materialised `simulate` {t_mat:.2f} s = {met(ref / t_mat, 50)}.\n\n")


def split(S: int, name: str = "domain_addition", materialize: bool = False,
          repeat: int = 2) -> dict:
    """Where the wall time of ``summarize`` and ``run`` goes at ``S`` seeds (seconds, best of 2
    warm calls each; the user calls best of ``repeat`` rounds, interleaved): ``programs`` -- the engine's compiled draws and estimates programs over
    every chunk, dispatched as :func:`poolsim._engine.simulate` does (at most ``_AHEAD`` ahead)
    and waited for; ``reduction`` -- the on-device moments program alone over the same chunks'
    results; ``transfer`` -- bringing the frame's fields of those results to host arrays
    (``_gather``); ``frame`` -- building the per-seed frame (host); then the user calls
    themselves, and ``host`` = each call minus its parts (dispatch, progress, pandas, scipy)."""
    import cProfile
    import pstats

    import jax

    from poolsim import _engine
    from poolsim import experiments as ex

    spec, P = ex.spec(name, materialize=materialize)
    chunk = _engine.chunk_size(S, P["chunk"])
    n_chunks = -(-S // chunk)
    seeds = np.arange(n_chunks * chunk, dtype=np.uint32)
    draw_fn, est_fn = _engine.compiled(spec, P["dtype"])
    moments = _engine.compiled_moments(spec)
    outside = _engine.host_medians_outside(spec)

    def programs():
        outs = []
        for i in range(n_chunks):
            d = draw_fn(seeds[i * chunk:(i + 1) * chunk])
            if outside:
                med = _engine.host_prefix_medians(np.asarray(d.samples).reshape(chunk, -1, spec.d),
                                                  spec.n, spec.Ks)
                outs.append(est_fn(d, med))
            else:
                outs.append(est_fn(d))
            if len(outs) > _engine.AHEAD:
                jax.block_until_ready(outs[-1 - _engine.AHEAD])
        return jax.block_until_ready(outs)

    def best(f):
        return min(call_times(f, iters=2, warmup=1))

    out = {"load": os.getloadavg()[0]}
    out["programs"] = best(programs)
    outs = programs()
    valid = jax.device_put(np.ones(chunk, bool))
    out["reduction"] = best(lambda: jax.block_until_ready([moments(o, valid) for o in outs]))
    fields = [o._replace(**{f: None for f in o._fields if f not in ex.FRAME_FIELDS}) for o in outs]
    out["transfer"] = best(lambda: _engine.gather(fields, S, chunk, False))
    res = _engine.gather(fields, S, chunk, False)
    P["seeds"] = np.arange(S)
    out["frame"] = best(lambda: ex.frame(name, res, P))
    outs.clear()  # free the chunks' results before the user calls
    fields.clear()
    res = None
    kw = dict(seeds=S, materialize=materialize)
    _warm(name, materialize=materialize)
    pair = interleaved({"summarize": lambda: ex.summarize(name, **kw),
                        "run": lambda: ex.run(name, **kw)}, repeat)
    for call, times in pair.items():
        out[call] = min(w for w, _ in times)
        out[call + "_cpu"] = min(c for _, c in times)
    for call in ("summarize", "run"):
        prof = cProfile.Profile()
        prof.enable()
        getattr(ex, call)(name, **kw)
        prof.disable()
        st = pstats.Stats(prof)
        # time inside the host-side helpers (cumulative), by function name
        cum = {f[2]: v[3] for f, v in st.stats.items()}
        out[f"{call}_cprofile"] = {k: cum.get(k, 0.0) for k in (
            "_simulate_local", "_gather", "frame", "combine", "block_until_ready", "_pjit_call_impl_python")}
    out["load_end"] = os.getloadavg()[0]
    return out


def split_table(rows) -> str:
    """Markdown table of :func:`split` results: one row per (experiment, seeds)."""
    lines = ["| experiment | seeds | load | programs (s) | reduction (s) | transfer (s) | frame (s) "
             "| `summarize` (s) | `run` (s) | summarize / programs | run / summarize "
             "| run / summarize, CPU time | host in summarize (s) | host in run (s) |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, S, r in rows:
        host_s = r["summarize"] - r["programs"] - r["reduction"]
        host_r = r["run"] - r["programs"] - r["transfer"] - r["frame"]
        lines.append(f"| {name} | {S:,} | {r['load']:.1f}-{r['load_end']:.1f} | {r['programs']:.3f} "
                     f"| {r['reduction']:.3f} | {r['transfer']:.3f} | {r['frame']:.3f} "
                     f"| {r['summarize']:.3f} | {r['run']:.3f} | {r['summarize'] / r['programs']:.3f} "
                     f"| {r['run'] / r['summarize']:.3f} | {r['run_cpu'] / r['summarize_cpu']:.3f} "
                     f"| {host_s:+.3f} | {host_r:+.3f} |")
    return "\n".join(lines) + "\n"


_FIRST_CALL = """
import sys, time
t0 = time.perf_counter()
from poolsim import _engine, experiments
t1 = time.perf_counter()
got = [0.0]
try:
    from poolsim import _programs
except ImportError:  # a revision without the program store (a baseline)
    _programs = None
else:
    real = _programs.Program._load_or_compile

    def timed(self, *a):  # time spent loading (or tracing and compiling) the programs
        t = time.perf_counter()
        try:
            return real(self, *a)
        finally:
            got[0] += time.perf_counter() - t

    _programs.Program._load_or_compile = timed
experiments.run(sys.argv[1], seeds=100)
t2 = time.perf_counter()
experiments.run(sys.argv[1], seeds=100)
t3 = time.perf_counter()
if _programs is None:
    print(f"{t1 - t0:.3f} {t2 - t1:.3f} {t3 - t2:.3f} - - -")
else:
    progs = _engine.compiled(experiments.spec(sys.argv[1])[0], "float32")
    print(f"{t1 - t0:.3f} {t2 - t1:.3f} {t3 - t2:.3f} {got[0]:.3f} "
          f"{sum(p.loaded for p in progs)} {sum(p.compiled for p in progs)}")
"""


def first_call(names=("domain_addition", "asymptotic"), warm: int = 1,
               baseline: str | None = None) -> str:
    """The first ``run(name, seeds=100)`` of a fresh process, with empty compile caches (a new
    temporary ``POOLSIM_CACHE_DIR``) and then in ``warm`` more fresh processes with what the first
    one stored; also the import time, a second call in the same process (nothing to load or
    compile), the time the first call spent obtaining its programs (loading them from the program
    store, or tracing, lowering and compiling them) and how many were loaded / compiled.
    ``baseline``: also the same processes with the poolsim of that source tree (e.g. a ``git
    archive`` export of another revision), interleaved with this one's, experiment by experiment."""
    import subprocess
    import tempfile

    rows = ["| experiment | poolsim | process | cache | load | import (s) | first `run` (s) | of it: "
            "programs loaded or compiled (s) | programs loaded / compiled | second `run` (s) |",
            "|---|---|---|---|---:|---:|---:|---:|---:|---:|"]
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    trees = [("this", here)] + ([("baseline", os.path.abspath(baseline))] if baseline else [])
    for name in names:
        for label, tree in trees:
            with tempfile.TemporaryDirectory() as tmp:
                env = dict(os.environ, POOLSIM_CACHE_DIR=tmp, PYTHONPATH=tree)
                env.pop("JAX_COMPILATION_CACHE_DIR", None)
                procs = [("1st", "empty (cold)")] + [
                    (f"{i + 2}{'nd' if i == 0 else 'rd' if i == 1 else 'th'}",
                     "written by the 1st (warm)") for i in range(warm)]
                for which, state in procs:
                    load = os.getloadavg()[0]
                    out = subprocess.run([sys.executable, "-c", _FIRST_CALL, name], env=env,
                                         check=True, cwd=tree, capture_output=True,
                                         text=True).stdout.split()
                    rows.append(f"| {name} | {label} | {which} | {state} | {load:.1f} | {out[0]} | "
                                f"{out[1]} | {out[3]} | {out[4]} / {out[5]} | {out[2]} |")
    return ("First call in a fresh process: `run(name, seeds=100)`, default parameters (materialised "
            "path: 100 seeds in one padded chunk of 1,024), target <= 1 s with a warm cache; 'load' "
            "is the 1-min load average when the process started.\n\n" + "\n".join(rows) + "\n\n")


def targets(rows) -> str:
    """Issue 11's targets (>= 30x materialised, >= 300x sufficient at 10,000 seeds), met or not,
    for the current engine in this run (median over the repeats; every run's ratios listed)."""
    big = [r for r in rows if r[0] == 10_000]
    if not big:
        return ""
    *_, ratios, per_run = big[0]
    mat, suf = ratios[-2], ratios[-1]
    each = "; ".join(f"{a:.1f}x / {b:.1f}x" for a, b in per_run[:, -2:])
    return (f"Issue 11 targets at 10,000 seeds (this run, median of {len(per_run)}): materialised "
            f">= 30x: {'met' if mat >= 30 else 'NOT met'} ({mat:.1f}x); sufficient statistics "
            f">= 300x: {'met' if suf >= 300 else 'NOT met'} ({suf:.1f}x). Each run, materialised / "
            f"sufficient: {each}.\n\n")


def write_section(path: str, title: str, body: str) -> None:
    """Replace (or append) the ``## title`` section of a Markdown file, atomically."""
    text = open(path).read() if os.path.exists(path) else "# Benchmark results\n"
    section = f"## {title}\n\n{body.strip()}\n"
    pattern = re.compile(rf"^## {re.escape(title)}\n.*?(?=^## |\Z)", re.S | re.M)
    text = pattern.sub(section + "\n", text) if pattern.search(text) else text.rstrip() + "\n\n" + section
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def append_table(path: str, table: str) -> None:
    """Append ``table`` to a Markdown results file, atomically (the adsim benchmarks' tables)."""
    text = open(path).read() if os.path.exists(path) else "# Benchmark results\n"
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text.rstrip("\n") + "\n\n" + table)
    os.replace(tmp, path)
    print(f"appended to {path}")


def main(argv=None) -> str:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[100, 1000, 10000])
    ap.add_argument("--ref-max-seeds", type=int, default=None,
                    help="time the reference on at most this many seeds and extrapolate linearly "
                         "(marked 'extrapolated' in the table); default: run them all")
    ap.add_argument("--n-values", type=int, nargs="+", default=[100, 1000, 10000, 100000])
    ap.add_argument("--n-seeds", type=int, default=10000, help="seeds for the n sweep")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "montecarlo.md"))
    ap.add_argument("--big", type=int, default=100_000,
                    help="seed count of the user-call ratios (run, summarize, materialised); 0 skips")
    ap.add_argument("--baseline", default=None, metavar="REV",
                    help="also time poolsim/_engine.py as of git revision REV (before/after)")
    ap.add_argument("--repeat", type=int, default=3,
                    help="measure everything this many times and report the median (shared machine)")
    ap.add_argument("--split", type=int, nargs="*", default=[100_000], metavar="S",
                    help="seed counts of the time split (programs / reduction / transfer / host)")
    ap.add_argument("--split-experiments", nargs="+",
                    default=["domain_addition", "asymptotic", "symmetric"])
    ap.add_argument("--first-call-only", type=int, default=0, metavar="WARM",
                    help="only the fresh-process first-call timings, with WARM warm processes per "
                         "experiment after the cold one (own section of the results file)")
    ap.add_argument("--first-call-baseline", default=None, metavar="DIR",
                    help="with --first-call-only: also time the poolsim of this source tree (e.g. "
                         "a `git archive` export of main) in the same run")
    ap.add_argument("--no-first-call", action="store_true",
                    help="skip the fresh-process first-call timings (cold / warm cache)")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    if args.first_call_only:
        import subprocess

        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
        body = (f"Measured {time.strftime('%Y-%m-%d %H:%M')} on {machine_info()}, commit "
                f"{commit or 'unknown'}.\nCommand: "
                f"`python benchmarks/montecarlo.py {' '.join(sys.argv[1:] if argv is None else argv)}`.\n\n"
                + first_call(warm=args.first_call_only, baseline=args.first_call_baseline))
        print(body)
        if not args.no_write:
            write_section(args.out, "First call in a fresh process (CPU)", body)
        return body
    from tqdm import tqdm

    load = [os.getloadavg()[0]]
    base = load_engine(args.baseline) if args.baseline else None
    runs = []  # per repeat: {S: (reference seeds/s, [engine seeds/s, compile+first, ...])}
    for rep in range(args.repeat):
        run = {}
        for S in tqdm(args.seeds, desc=f"seed counts (run {rep + 1}/{args.repeat})"):
            S_ref = S if args.ref_max_seeds is None else min(S, args.ref_max_seeds)
            ref = S / (time_reference(S_ref) * S / S_ref)
            eng = []
            for engine in ([base] if base else []) + [None]:
                for mat in (True, False):
                    first, warm = time_engine(S, engine, materialize=mat)
                    eng += [S / warm, first]
            run[S] = (ref, eng)
            load.append(os.getloadavg()[0])
        runs.append(run)
    # Median over the repeats, cell by cell; a ratio is the median of the per-run ratios (each
    # run's engine against the reference timed in that run).
    rows = []
    for S in args.seeds:
        refs = np.array([run[S][0] for run in runs])
        eng = np.array([run[S][1] for run in runs])  # (repeat, 2 * versions * paths)
        per_run = eng[:, ::2] / refs[:, None]
        rows.append((S, float(np.median(refs)), S > (args.ref_max_seeds or S),
                     np.median(eng, axis=0), np.median(per_run, axis=0), per_run))
    versions = ([f"before ({args.baseline})"] if base else []) + ["engine" + (" (now)" if base else "")]
    head = "| seeds | reference seeds/s |" + "".join(
        f" {v}, materialised: seeds/s (ratio) | compile+first (s) | {v}, sufficient stats: seeds/s "
        "(ratio) | compile+first (s) |" for v in versions)
    lines = [head, "|---:|---:|" + "---:|---:|---:|---:|" * len(versions)]
    for S, r, extra, eng, ratios, _ in rows:
        cells = "".join(f" {v:,.0f} ({q:,.1f}x) | {c:.2f} |"
                        for v, c, q in zip(eng[::2], eng[1::2], ratios))
        lines.append(f"| {S:,} | {r:,.1f}{' (extrapolated)' if extra else ''} |{cells}")
    prof = profile()
    split_rows = [(name, S, split(S, name, repeat=args.repeat)) for S in args.split
                  for name in args.split_experiments]
    splits = ((f"Split of the sufficient-statistics user calls (parts: best of 2 warm calls each; "
               f"`summarize` and `run`: best of {args.repeat} rounds, interleaved; "
               "'host' = the call minus its measured parts, negative where the parts, timed "
               "alone, took longer than inside the call):\n\n" + split_table(split_rows) + "\n")
              if split_rows else "")
    nrows = []
    for n in tqdm(args.n_values, desc="n sweep"):
        _, t = time_engine(args.n_seeds, materialize=False, n=n)
        nrows.append((n, t))
    base = nrows[0][1]
    lines += ["", f"Sufficient-statistics path, {args.n_seeds:,} seeds, cost vs samples per domain n:", "",
              "| n | time (s) | relative to n = %d |" % nrows[0][0], "|---:|---:|---:|"]
    lines += [f"| {n:,} | {t:.3f} | {t / base:.2f} |" for n, t in nrows]
    body = (f"Measured {time.strftime('%Y-%m-%d %H:%M')} on {machine_info()}; 1-min load average "
            f"{min(load):.1f} to {max(load):.1f} during the run (shared machine).\n"
            f"Command: `python benchmarks/montecarlo.py {' '.join(sys.argv[1:] if argv is None else argv)}`.\n"
            "Experiment `domain_addition` with the paper's parameters (K 5..30, n = 100, tau = 1.1, "
            "sigma = 0.8, d = 2), float32 engine; the reference is the NumPy loop version in "
            "`poolsim/_reference.py` (float64). Ratios are engine / reference seeds/s in this run; "
            f"every cell is the median of {args.repeat} repeats of the whole measurement.\n\n"
            + "\n".join(lines) + "\n\n" + targets(rows)
            + (user_calls(args.big, args.repeat) if args.big else "") + prof + splits
            + ("" if args.no_first_call else first_call()) + NOTE)
    print(body)
    if not args.no_write:
        write_section(args.out, "Monte-Carlo engine (CPU)", body)
    return body


if __name__ == "__main__":
    main()
