"""End to end, what a user runs, on the machine at hand (the GPU session's last section; also a CPU
smoke run): toy data, ``train`` in the default mode (eager) and compiled (``--compile default``, or the
mode of ``--compile``) for each trained method, ``eval``, ``predict``, and a Monte-Carlo engine run on all
local devices. Not a test.

Each command runs as ``python -m adsim ...`` in a subprocess with its own timeout (``--timeout``; a
compiled ``train`` gets ``--compile-timeout``, sized for its compilation); its wall time, exit code and,
for ``train``, the run's ``config.json`` "execution" record (compile mode, whether it fell back to eager,
world size, device) are checked. Prints one line per check and appends them to ``--targets`` as
``name|measured|target|ok`` rows (``benchmarks/gpu_targets.py`` prints the table). ``--methods`` picks
rows of :data:`METHODS` by label prefix.

    python benchmarks/gpu_e2e.py --out /tmp/e2e --targets /tmp/targets.txt [--backbone tiny]
        [--n-per-class 16] [--size 256] [--seeds 100000] [--compile default] [--compile-timeout 150]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# (label, train arguments): every trained method and gate
METHODS = (("naive", ["--recipe", "mvfa"]),
           ("match, batched gate", ["--recipe", "clean", "--gate-mode", "batched"]),
           ("match, exact sequential gate", ["--recipe", "clean", "--gate-mode", "sequential"]),
           ("anomalyclip", ["--recipe", "anomalyclip"]),
           ("bilora", ["--recipe", "bilora"]))
DEFAULT_RECIPE = "match, exact sequential gate"  # the clean recipe as it ships: eval and predict use its run


def _run(args: list, timeout: float, env=None) -> tuple[int, float, str]:
    t0 = time.perf_counter()
    try:
        p = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
        rc, text = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        rc, text = 124, f"timed out after {timeout:.0f} s; {(e.stderr or b'')[-2000:]!r}"
    return rc, time.perf_counter() - t0, text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--targets", required=True, help="file to append name|measured|target|ok rows to")
    ap.add_argument("--backbone", default="tiny")
    ap.add_argument("--image-size", type=int, default=None)
    ap.add_argument("--n-per-class", type=int, default=16)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--seeds", type=int, default=100_000, help="Monte-Carlo seeds of the engine run")
    ap.add_argument("--timeout", type=float, default=150, help="seconds per command")
    ap.add_argument("--compile", default="default", dest="compile_mode",
                    help="compile mode of the second train configuration ('off': eager only)")
    ap.add_argument("--compile-timeout", type=float, default=None,
                    help="seconds per compiled train command (default: --timeout)")
    ap.add_argument("--methods", nargs="*", default=None, help="labels (prefixes) of METHODS to train")
    ap.add_argument("--skip-engine", action="store_true", help="no Monte-Carlo engine run")
    ap.add_argument("--toy-target", type=float, default=10.0, help="seconds allowed for make-toy-bmad")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    py = [sys.executable, "-m", "adsim"]
    rows = []

    def check(name, measured, target, ok, log=""):
        rows.append(f"{name}|{measured}|{target}|{'yes' if ok else 'NO'}")
        with open(args.targets, "a") as f:  # row by row: a section cut by its timeout keeps its rows
            f.write(rows[-1] + "\n")
        print(f"e2e: {name}: {measured} (target {target}) {'ok' if ok else 'FAILED'}", flush=True)
        if not ok and log:
            print(log[-3000:], flush=True)

    data = out / "data"
    rc, t, log = _run([*py, "make-toy-bmad", str(data), "--n-per-class", str(args.n_per_class),
                       "--size", str(args.size)], args.timeout)
    n_img = len(list(data.rglob("*.png"))) if data.exists() else 0
    check(f"make-toy-bmad, {n_img} PNGs at {args.size} px (CLI wall, imports included)", f"{t:.1f} s",
          f"<= {args.toy_target:g} s", rc == 0 and t <= args.toy_target, log)
    common = ["--data", str(data), "--target", "Liver", "--backbone", args.backbone, "--epochs", str(args.epochs),
              "--batch-size", "16", "--no-progress"]
    if args.image_size:
        common += ["--image-size", str(args.image_size)]
    first_run = None
    modes = [("default mode (eager)", [], args.timeout)]
    if args.compile_mode != "off":
        modes.append((f"--compile {args.compile_mode}", ["--compile", args.compile_mode],
                      args.compile_timeout or args.timeout))
    methods = [(label, extra) for label, extra in METHODS
               if args.methods is None or any(label.startswith(m) for m in args.methods)]
    for label, extra in methods:
        for mode, flag, budget in modes:
            run = out / f"{label.split(',')[0].replace(' ', '_')}_{extra[-1]}_{'compiled' if flag else 'eager'}"
            rc, t, log = _run([*py, "train", *common, *extra, *flag, "--out", str(run)], budget)
            ex = {}
            if (run / "config.json").is_file():
                ex = json.loads((run / "config.json").read_text()).get("execution", {})
            fell = bool(ex.get("compile_failed"))
            what = f"compile={ex.get('compile')}{', FELL BACK to eager' if fell else ''}, world {ex.get('world_size')}, " \
                   f"{ex.get('device_name')}"
            check(f"train {label}, {mode}", f"{t:.1f} s ({what})", f"exit 0 within {budget:.0f} s, no fallback",
                  rc == 0 and not fell, log)
            if rc == 0 and not flag and (first_run is None or label == DEFAULT_RECIPE):
                first_run = run
    if first_run is not None:
        rc, t, log = _run([*py, "eval", "--run", str(first_run), "--data", str(data), "--no-progress"], args.timeout)
        check(f"eval {first_run.name}", f"{t:.1f} s", "exit 0, metrics.json",
              rc == 0 and (first_run / "metrics.json").is_file(), log)
        images = [str(data / "Liver_AD" / "test" / c / "img") for c in ("good", "Ungood")]
        rc, t, log = _run([*py, "predict", *images, "--run", str(first_run), "--out", str(out / "predict")],
                          args.timeout)
        check("predict (Liver test images)", f"{t:.1f} s", "exit 0, scores.csv",
              rc == 0 and (out / "predict" / "scores.csv").is_file(), log)
    if args.skip_engine:
        return 0 if all(r.endswith("|yes") for r in rows) else 1
    code = ("import time, jax, poolsim.experiments as e; t = time.perf_counter(); "
            f"df = e.run('domain_addition', seeds={args.seeds}); "
            "print(f'{len(jax.local_devices())} local devices ({jax.devices()[0].platform}), "
            "{len(df)} rows, {time.perf_counter() - t:.1f} s')")
    rc, t, log = _run([sys.executable, "-c", code], args.timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})
    check(f"engine: domain_addition, {args.seeds} seeds on all local devices",
          (log.strip().splitlines() or ["?"])[-1] if rc == 0 else f"exit {rc}", "exit 0", rc == 0, log)
    return 0 if all(r.endswith("|yes") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
