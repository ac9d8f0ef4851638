"""Hard stops for ``python -m adsim train``: a run killed by SIGKILL at chosen or random moments, resumed
with ``--resume`` after each kill, compared bitwise with an uninterrupted run. Used by
``test_adsim_crash.py`` (a handful of moments) and ``benchmarks/crash_soak.py`` (many).

A *moment* is ``("write", NAME, N)`` -- killed inside the N-th atomic write of the file NAME (or of the
files a pattern NAME matches) of that process (the temporary file written, not yet moved in place:
``_killed_child.py``) -- or ``("timer", S)``
-- killed S seconds after the process started (anywhere: importing, inside an epoch, between epochs,
inside a write). A timed kill that comes after the process has finished kills nothing.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("_killed_child.py")
WRITTEN = ("checkpoint_last.pt", "checkpoint_best.pt", "history.json", "config.json")


def run_child(args: list, moment=None, timeout: float = 900.0) -> tuple:
    """``(return code, seconds)`` of ``python _killed_child.py ARGS`` (one torch thread, CPU), killed at
    ``moment`` (None: runs to the end). SIGKILL gives return code -9."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("ADSIM_TEST_KILL_BEFORE_REPLACE", None)
    if moment is not None and moment[0] == "write":
        env["ADSIM_TEST_KILL_BEFORE_REPLACE"] = f"{moment[1]}:{moment[2]}"
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, str(CHILD), *args], env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    if moment is not None and moment[0] == "timer":
        try:
            proc.wait(timeout=moment[1])
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    if proc.returncode not in (0, -signal.SIGKILL):
        raise AssertionError(f"adsim {' '.join(args)} failed ({proc.returncode}):\n{err[-3000:]}")
    return proc.returncode, time.monotonic() - start


def random_moments(rng, n: int, seconds: float, writes: int) -> list:
    """``n`` moments drawn with ``rng`` (a NumPy generator): half inside an atomic write (a file of
    :data:`WRITTEN`, its ``1..writes``-th write), half timed uniformly in ``(0, seconds)``."""
    out = []
    for i in range(n):
        if i % 2 == 0:
            out.append(("write", WRITTEN[int(rng.integers(0, 3))], int(rng.integers(1, writes + 1))))
        else:
            out.append(("timer", round(float(rng.uniform(0.0, seconds)), 2)))
    return out


def kill_and_resume(args: list, out: Path, moments: list) -> list:
    """Run ``train ARGS --out OUT`` killed at each of ``moments`` in turn (every start after the first with
    ``--resume``), then ``--resume`` to the end. Returns per moment ``(moment, return code, stale
    temporary files left in OUT)``; checks after every kill that what OUT holds under a final name
    loads (a loader never sees a part of a file)."""
    from adsim.runtime.io import load_torch, read_json

    log = []
    for i, moment in enumerate(moments + [None]):
        rc, _ = run_child(["train", *args, "--out", str(out), *(["--resume"] if i else [])], moment)
        stale = sorted(p.name for p in out.glob(".*.tmp")) if out.exists() else []
        if moment is not None:
            log.append((moment, rc, stale))
        for name in WRITTEN:  # whatever has its final name is complete
            if (out / name).exists():
                (load_torch if name.endswith(".pt") else read_json)(out / name)
    return log


def differences(a: Path, b: Path) -> list:
    """What differs between the run folders ``a`` and ``b`` (empty: the same run, bitwise): the last
    checkpoint's head, optimiser and scaler state, epoch, domain, history and best; the best checkpoint's
    head; history.json."""
    from adsim.runtime.io import load_torch, read_json

    diff = []
    x, y = load_torch(a / "checkpoint_last.pt"), load_torch(b / "checkpoint_last.pt")
    for key in ("epoch", "domain", "history", "best"):
        if x.get(key) != y.get(key):
            diff.append(key)
    diff += [f"head[{k}]" for k in sorted(set(x["head"]) | set(y["head"]))
             if k not in x["head"] or k not in y["head"] or not torch.equal(x["head"][k], y["head"][k])]
    if not _same(x["optimizer"], y["optimizer"]):
        diff.append("optimizer")
    if not _same(x["scaler"], y["scaler"]):
        diff.append("scaler")
    if (a / "checkpoint_best.pt").exists() != (b / "checkpoint_best.pt").exists():
        diff.append("checkpoint_best.pt present")
    elif (a / "checkpoint_best.pt").exists():
        hx, hy = load_torch(a / "checkpoint_best.pt"), load_torch(b / "checkpoint_best.pt")
        if hx["epoch"] != hy["epoch"] or any(not torch.equal(hx["head"][k], hy["head"][k]) for k in hx["head"]):
            diff.append("checkpoint_best.pt")
    if read_json(a / "history.json") != read_json(b / "history.json"):
        diff.append("history.json")
    return diff


def _same(u, v) -> bool:
    if isinstance(u, torch.Tensor) or isinstance(v, torch.Tensor):
        return isinstance(u, torch.Tensor) and isinstance(v, torch.Tensor) and torch.equal(u, v)
    if isinstance(u, dict) and isinstance(v, dict):
        return u.keys() == v.keys() and all(_same(u[k], v[k]) for k in u)
    if isinstance(u, (list, tuple)) and isinstance(v, (list, tuple)):
        return len(u) == len(v) and all(_same(p, q) for p, q in zip(u, v))
    return u == v
