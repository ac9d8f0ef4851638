"""Benchmark: how the Monte-Carlo engine's time and peak memory grow with K, n, d and the seed count.

Not a test. Each point is one call of ``poolsim.experiments.run("asymptotic", ...)`` (the user call:
engine plus the per-seed frame) measured in a fresh child process, so that its peak memory is its
own:

* ``compile_s``: the first call's time minus the warm time (the first call compiles; the
  compiled-program cache is switched off in the child, ``POOLSIM_CACHE_DIR=off``, so it really
  compiles);
* ``warm_s``: the faster of two more identical calls in the same child (compiled programs reused);
* ``peak_mb``: the child's peak resident memory after the calls (``resource.getrusage``
  ``ru_maxrss``; it includes the interpreter with JAX loaded: ``floor_mb``, a child that imports
  ``poolsim.experiments`` and runs nothing, is reported alongside).

Every child runs with the engine's memory budget ``--budget`` (default 4GB, the issue's target; set
as ``POOLSIM_MEMORY_BUDGET``), and is stopped past ``--max-rss-mb`` resident (the machine is shared).

Sweeps (one varied, the others at the base values; Ks = (K,) one K value per run):

* ``K``: both paths (sufficient statistics ``materialize=False``; samples ``materialize=True``);
* ``seeds``: sufficient statistics at K = ``--base-K``;
* ``n``: samples (the sufficient path is flat in n by construction) at K = ``--nd-K``;
* ``d``: samples at K = ``--nd-K``.

The anchor loop ``../shared/anchors/naive_bigK.py`` (NumPy, samples drawn, pooling + subsampling +
matching; a reference, not project code) runs as a subprocess in the same run at the K values of
``--anchor-Ks``; the ratios are engine seeds/s (warm) over the loop's seeds/s.

Slopes: ``np.polyfit(log10 x, log10 y, 1)`` per sweep over the points with x >= ``--fit-from`` of that
sweep (default: all but the smallest x of each sweep, where fixed per-call costs dominate); the
figure and the table say which points each fit uses.

Writes ``docs/img/engine_scaling.png`` (log-log, two panels per quantity) and
``benchmarks/results/engine_scaling.json`` (every point), and prints the Markdown section for
``benchmarks/RESULTS.md`` (machine, load, commit) unless ``--no-write`` (then prints only).

    python benchmarks/engine_scaling.py [--Ks 10,100,1000] [--Ks-samples 10,100,1000]
        [--seeds 10,100,1000] [--ns 10,100,1000] [--ds 2,16,128] [--base-seeds 100]
        [--base-K 1000] [--nd-K 100] [--anchor-Ks 10,100,1000] [--timeout 300] [--max-rss-mb 6000] [--budget 4GB] [--no-write]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
ANCHOR = ROOT.parent / "shared" / "anchors" / "naive_bigK.py"
FIG = ROOT / "docs" / "img" / "engine_scaling.png"
JSON_OUT = ROOT / "benchmarks" / "results" / "engine_scaling.json"
N_BASE, D_BASE = 150, 2  # the asymptotic experiment's n and d (paper)


def _ints(text: str) -> list[int]:
    return [int(float(v)) for v in text.split(",") if v.strip()]


# ----------------------------------------------------------------------------- child
def child(cfg: dict) -> dict:
    """One point: three identical calls, the first compiling (warm: the faster of the other two);
    prints nothing, returns the numbers."""
    from poolsim import experiments

    def peak_mb():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux

    if cfg.get("floor"):
        return {"peak_mb": peak_mb()}
    params = dict(Ks=(cfg["K"],), n=cfg["n"], d=cfg["d"], materialize=cfg["materialize"])
    times = []
    for _ in range(3):
        t = time.perf_counter()
        df = experiments.run("asymptotic", seeds=cfg["seeds"], **params)
        times.append(time.perf_counter() - t)
    assert len(df) == 3 * cfg["seeds"] and np.isfinite(df["eps"]).all()
    warm = min(times[1:])
    return {"first_s": times[0], "warm_s": warm, "compile_s": max(times[0] - warm, 0.0),
            "peak_mb": peak_mb()}


def _rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(float(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:"))
    except (OSError, StopIteration, ValueError):
        return 0.0


def run_child(cfg: dict, timeout: float, max_rss_mb: float, budget: str = "") -> dict:
    """``child(cfg)`` in a fresh process with the engine's memory budget ``budget``
    (``POOLSIM_MEMORY_BUDGET``; empty: the engine's default); stopped (and reported as failed)
    past ``timeout`` seconds or ``max_rss_mb`` of resident memory (the machine is shared)."""
    env = {**os.environ, "POOLSIM_CACHE_DIR": "off", "PYTHONPATH": str(ROOT)}
    if budget:
        env["POOLSIM_MEMORY_BUDGET"] = budget
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(cfg)]
    t0 = time.time()
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) as p:
        while p.poll() is None:
            why = (f"timeout after {timeout:.0f} s" if time.time() - t0 > timeout else
                   f"stopped at {max_rss_mb:.0f} MB resident" if _rss_mb(p.pid) > max_rss_mb else None)
            if why:
                p.kill()
                p.wait()
                return {**cfg, "error": why}
            time.sleep(0.2)
        out, err = p.communicate()
    if p.returncode != 0:
        lines = err.strip().splitlines() or ["no output"]
        key = [ln for ln in lines if any(w in ln for w in ("Check failed", "Error", "RESOURCE_EXHAUSTED"))]
        why = "aborted (SIGABRT)" if p.returncode == -6 else f"exit {p.returncode}"
        return {**cfg, "error": f"{why}: {(key or lines)[-1].strip()[:160]}"}
    return {**cfg, **json.loads(out.strip().splitlines()[-1])}


def run_anchor(K: int, timeout: float) -> dict:
    S = int(np.clip(20_000 // K, 3, 200))  # a few seconds per K on this machine
    try:
        p = subprocess.run([sys.executable, str(ANCHOR), str(S), str(K)], capture_output=True,
                           text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"K": K, "seeds": S, "error": f"timeout after {timeout:.0f} s"}
    out = p.stdout.strip()
    if p.returncode != 0 or "seeds_per_s=" not in out:
        return {"K": K, "seeds": S, "error": (p.stderr.strip().splitlines() or ["?"])[-1][:200]}
    kv = dict(tok.split("=", 1) for tok in out.split() if "=" in tok and tok.split("=")[0] in
              ("seconds", "seeds_per_s"))
    return {"K": K, "seeds": S, "seconds": float(kv["seconds"]), "seeds_per_s": float(kv["seeds_per_s"])}


# ----------------------------------------------------------------------------- fits, figure, table
def fit(points: list[dict], x: str, y: str, fit_from: float | None):
    """``(slope, xs used)`` of log10 y on log10 x over the points with x >= the threshold
    (default: every x but the smallest)."""
    ok = [p for p in points if "error" not in p and p[y] > 0]
    xs = sorted({p[x] for p in ok})
    lo = fit_from if fit_from is not None else (xs[1] if len(xs) > 2 else xs[0] if xs else 0)
    use = [p for p in ok if p[x] >= lo]
    if len(use) < 2:
        return float("nan"), []
    slope = np.polyfit(np.log10([p[x] for p in use]), np.log10([p[y] for p in use]), 1)[0]
    return float(slope), sorted(p[x] for p in use)


SWEEPS = (  # (name, x key, label, filter)
    ("K (sufficient stats)", "K", "number of domains K", lambda p: p["sweep"] == "K" and not p["materialize"]),
    ("K (samples)", "K", "number of domains K", lambda p: p["sweep"] == "K" and p["materialize"]),
    ("seeds (sufficient stats)", "seeds", "seeds", lambda p: p["sweep"] == "seeds"),
    ("n (samples)", "n", "samples per domain n", lambda p: p["sweep"] == "n"),
    ("d (samples)", "d", "dimension d", lambda p: p["sweep"] == "d"),
)


def figure(points: list[dict], anchors: list[dict], floor_mb: float, fit_from, title: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator

    fig, axes = plt.subplots(2, 4, figsize=(16, 10.5))
    groups = [("K", [SWEEPS[0], SWEEPS[1]]), ("seeds", [SWEEPS[2]]), ("n", [SWEEPS[3]]),
              ("d", [SWEEPS[4]])]
    for col, (xkey, sweeps) in enumerate(groups):
        xs_all = sorted({p[xkey] for _, _, _, sel in sweeps for p in points if sel(p)})
        for row, (ykey, ylab) in enumerate((("warm_s", "time per call, warm (s)"),
                                            ("peak_mb", "peak memory of the process (MB)"))):
            ax = axes[row, col]
            guides = []
            for name, x, xlabel, sel in sweeps:
                pts = sorted((p for p in points if sel(p) and "error" not in p), key=lambda p: p[x])
                ax.set_xlabel(xlabel)
                if not pts:
                    continue
                slope, used = fit(pts, x, ykey, fit_from)
                line, = ax.loglog([p[x] for p in pts], [p[ykey] for p in pts], "o-", ms=4,
                                  label=f"{name}: slope {slope:.2f} (fit on x = {', '.join(map(str, used)) or '-'})")
                if ykey == "warm_s":
                    comp = [p for p in pts if p["compile_s"] > 0]  # 0: within the warm call's noise
                    ax.loglog([p[x] for p in comp], [p["compile_s"] for p in comp], "x:", ms=4,
                              color=line.get_color(), alpha=0.6, label=f"{name}: compile (first call - warm)")
                    guides.append((pts[0][x], pts[0][ykey], pts[-1][x], line.get_color()))
            if xkey == "K" and ykey == "warm_s" and anchors:
                ok = [a for a in anchors if "error" not in a]
                base = [p for p in points if p["sweep"] == "K" and "error" not in p]
                S = base[0]["seeds"] if base else 0
                if ok and S:
                    ax.loglog([a["K"] for a in ok], [S / a["seeds_per_s"] for a in ok], "s--", ms=4,
                              color="0.35", label=f"NumPy loop naive_bigK.py, time for {S} seeds")
            if ykey == "peak_mb":
                ax.axhline(floor_mb, color="0.6", lw=0.8, ls="--",
                           label=f"floor: interpreter + JAX imported, {floor_mb:.0f} MB")
            lim = ax.get_ylim()
            for x0, y0, x1, color in guides:  # slope 1 through the sweep's first point
                ax.loglog([x0, x1], [y0, y0 * x1 / x0], color=color, lw=0.8, ls=(0, (1, 3)), alpha=0.8)
            ax.set_ylim(lim)
            for name, x, _, sel in sweeps:
                for p in (q for q in points if sel(q) and "error" in q):
                    ax.axvline(p[x], color="red", lw=0.8, ls="--")
                    ax.text(p[x], 0.5, f" {name.split(' ')[0]}={p[x]}: {p['error'][:36]}", color="red",
                            fontsize=6.5, rotation=90, va="center", ha="right", transform=ax.get_xaxis_transform())
            ax.xaxis.set_major_locator(FixedLocator(xs_all))
            ax.xaxis.set_major_formatter(matplotlib.ticker.FixedFormatter([f"{v:g}" for v in xs_all]))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.set_ylabel(ylab)
            ax.grid(alpha=0.3, which="both")
            ax.legend(fontsize=6.5, loc="upper center", bbox_to_anchor=(0.5, -0.13), frameon=False)
    fig.suptitle(title + "\ndotted thin lines: slope 1 (cost proportional to x) through each sweep's first point",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    return fig


def machine_info() -> str:
    """benchmarks/montecarlo.py's machine line, with the RAM."""
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from montecarlo import machine_info as base

    return f"{base()}, {mem:.0f} GiB RAM"


def commit() -> str:
    try:
        h = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                           text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        return h + (" (with uncommitted changes)" if dirty else "")
    except OSError:
        return "unknown"


def _save_figure(fig) -> None:
    FIG.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(FIG, dpi=100, metadata={"Software": None})


def table(points, anchors, floor_mb, fit_from, info, loads, elapsed, rev, budget="") -> str:
    lines = [f"Machine: {info}. Commit {rev}. Load average (1 min) before / after: "
             f"{loads[0]:.2f} / {loads[1]:.2f}; the whole run took {elapsed:.0f} s. Each point is "
             f"`experiments.run(\"asymptotic\", Ks=(K,), ...)` in a fresh child process: warm = the "
             f"faster of the 2nd and 3rd identical calls, compile = first minus warm, peak = the child's ru_maxrss "
             f"(a child that only imports poolsim.experiments: {floor_mb:.0f} MB). Engine memory budget in "
             f"each child: {budget or 'the default'} (POOLSIM_MEMORY_BUDGET).", "",
             "| sweep | K | seeds | n | d | path | compile (s) | warm (s) | seeds/s warm | peak (MB) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for p in points:
        path = "samples" if p["materialize"] else "sufficient"
        if "error" in p:
            lines.append(f"| {p['sweep']} | {p['K']} | {p['seeds']} | {p['n']} | {p['d']} | {path} | "
                         f"failed: {p['error']} | | | |")
            continue
        lines.append(f"| {p['sweep']} | {p['K']} | {p['seeds']} | {p['n']} | {p['d']} | {path} | "
                     f"{p['compile_s']:.2f} | {p['warm_s']:.3f} | {p['seeds'] / p['warm_s']:.1f} | "
                     f"{p['peak_mb']:.0f} |")
    lines += ["", "Fitted log-log slopes (`np.polyfit(log10 x, log10 y, 1)`; points used):", "",
              "| sweep | time slope | memory slope | x used in the fit |", "|---|---|---|---|"]
    for name, x, _, sel in SWEEPS:
        pts = [p for p in points if sel(p)]
        st, used = fit(pts, x, "warm_s", fit_from)
        sm, _ = fit(pts, x, "peak_mb", fit_from)
        lines.append(f"| {name} | {st:.2f} | {sm:.2f} | {', '.join(map(str, used)) or '-'} |")
    if anchors:
        lines += ["", "Against the NumPy loop `../shared/anchors/naive_bigK.py` (subprocess, same run; "
                  "samples drawn; `Ks=(K,)`), seeds/s, ratio = engine / loop:", "",
                  "| K | loop seeds (s) | loop seeds/s | engine sufficient seeds/s | ratio | "
                  "engine samples seeds/s | ratio |", "|---|---|---|---|---|---|---|"]
        for a in anchors:
            if "error" in a:
                lines.append(f"| {a['K']} | {a['seeds']} | failed: {a['error']} | | | | |")
                continue
            row = [f"{a['K']}", f"{a['seeds']} ({a['seconds']:.1f})", f"{a['seeds_per_s']:.1f}"]
            for mat in (False, True):
                e = next((p for p in points if p["sweep"] == "K" and p["K"] == a["K"]
                          and p["materialize"] == mat and "error" not in p), None)
                row += ([f"{e['seeds'] / e['warm_s']:.1f}", f"{e['seeds'] / e['warm_s'] / a['seeds_per_s']:.1f}x"]
                        if e else ["-", "-"])
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--Ks", default="10,100,1000", help="K sweep, sufficient statistics")
    ap.add_argument("--Ks-samples", default="10,100,1000", help="K sweep, samples drawn")
    ap.add_argument("--seeds", default="10,100,1000", help="seed sweep (sufficient statistics)")
    ap.add_argument("--ns", default="10,100,1000", help="n sweep (samples drawn)")
    ap.add_argument("--ds", default="2,16,128", help="d sweep (samples drawn)")
    ap.add_argument("--base-seeds", type=int, default=100)
    ap.add_argument("--base-K", type=int, default=1000, help="K of the seed sweep")
    ap.add_argument("--nd-K", type=int, default=100, help="K of the n and d sweeps")
    ap.add_argument("--anchor-Ks", default="10,100,1000")
    ap.add_argument("--fit-from", type=float, default=None,
                    help="fit slopes on x >= this (default: all but each sweep's smallest x)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per child")
    ap.add_argument("--max-rss-mb", type=float, default=6000,
                    help="stop a child past this resident memory (MB) and record the point as failed")
    ap.add_argument("--budget", default="4GB",
                    help="the engine's memory budget in each child (POOLSIM_MEMORY_BUDGET; '' = its default)")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--replot", action="store_true",
                    help="redraw the figure and reprint the table from the last run's JSON (no measuring)")
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0

    if args.replot:
        r = json.loads(JSON_OUT.read_text())
        print(table(r["points"], r["anchors"], r["floor_mb"], args.fit_from, r["machine"], r["load"],
                    r.get("elapsed", float("nan")), r["commit"], r.get("budget", "")))
        _save_figure(figure(r["points"], r["anchors"], r["floor_mb"], args.fit_from, r["title"]))
        return 0
    t0 = time.time()
    load0 = os.getloadavg()[0]
    S = args.base_seeds
    cfgs = ([dict(sweep="K", K=K, seeds=S, n=N_BASE, d=D_BASE, materialize=False) for K in _ints(args.Ks)]
            + [dict(sweep="K", K=K, seeds=S, n=N_BASE, d=D_BASE, materialize=True) for K in _ints(args.Ks_samples)]
            + [dict(sweep="seeds", K=args.base_K, seeds=s, n=N_BASE, d=D_BASE, materialize=False)
               for s in _ints(args.seeds)]
            + [dict(sweep="n", K=args.nd_K, seeds=S, n=n, d=D_BASE, materialize=True) for n in _ints(args.ns)]
            + [dict(sweep="d", K=args.nd_K, seeds=S, n=N_BASE, d=d, materialize=True) for d in _ints(args.ds)])
    floor = run_child({"floor": True}, args.timeout, args.max_rss_mb)
    floor_mb = floor.get("peak_mb", float("nan"))
    points = []
    for cfg in cfgs:
        p = run_child(cfg, args.timeout, args.max_rss_mb, args.budget)
        points.append(p)
        msg = p.get("error") or f"compile {p['compile_s']:.2f} s, warm {p['warm_s']:.3f} s, peak {p['peak_mb']:.0f} MB"
        print(f"{cfg['sweep']:>5} K={cfg['K']} S={cfg['seeds']} n={cfg['n']} d={cfg['d']} "
              f"{'samples' if cfg['materialize'] else 'sufficient'}: {msg}", flush=True)
    anchors = []
    for K in _ints(args.anchor_Ks):
        a = run_anchor(K, args.timeout)
        anchors.append(a)
        rate = a.get("error") or f"{a['seeds_per_s']:.1f} seeds/s"
        print(f"anchor K={K}: {rate}", flush=True)
    loads = (load0, os.getloadavg()[0])
    elapsed = time.time() - t0
    info = machine_info()
    text = table(points, anchors, floor_mb, args.fit_from, info, loads, elapsed, commit(), args.budget)
    print(text)
    if not args.no_write:
        title = (f"poolsim engine scaling: experiments.run('asymptotic'), {S} seeds unless varied, "
                 f"memory budget {args.budget or 'default'}; "
                 f"{info.split(',')[0]}, load {loads[0]:.1f}/{loads[1]:.1f}, commit {commit()}")
        _save_figure(figure(points, anchors, floor_mb, args.fit_from, title))
        JSON_OUT.parent.mkdir(parents=True, exist_ok=True)
        JSON_OUT.write_text(json.dumps({"machine": info, "commit": commit(), "load": loads,
                                        "elapsed": elapsed, "title": title, "floor_mb": floor_mb,
                                        "budget": args.budget,
                                        "points": points, "anchors": anchors}, indent=1))
        print(f"wrote {FIG} and {JSON_OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
