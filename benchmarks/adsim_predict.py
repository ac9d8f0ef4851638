"""``Detector.predict`` (issue 13, "Speed and memory"): images/s on CPU and peak memory vs folder size.
Not part of the tests.

On a SIMULATED toy BMAD (``adsim.data.toy``) and a 1-epoch tiny-backbone run (random weights), for folders of
``--sizes`` images (toy PNGs copied cyclically under distinct names), each measured in a FRESH process so
that its peak resident memory (Linux ``VmHWM``) is its own:

* ``rss_load``: peak RSS after loading the run and a 4-image warm-up predict (model + allocator warm);
* ``rss_peak``: peak RSS after ``predict(folder)`` in the mode given: ``scores`` (``maps=False``),
  ``overlays`` (``maps=False, overlays=DIR``: the CLI's path, one PNG per image) or ``maps`` (every map
  kept: grows by ``n S^2 4`` bytes by design);
* images/s of that predict call (wall, after the warm-up).

Reference in the same run: the straightforward path evaluation used before ``adsim.inference.detector`` existed --
``DataLoader(ImageDataset)`` + ``adsim.model.head.features`` + ``image_scores`` under ``torch.no_grad`` on the
same images and batch size -- its images/s and the ratio detector / reference (the scores are checked
equal).

    python benchmarks/adsim_predict.py                      # sizes 64 and 512, ~1-3 minutes on 2 shared cores
    python benchmarks/adsim_predict.py --sizes 64 512 2048 --results /tmp/r.md
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

TITLE = "adsim predict (CPU, tiny backbone)"
MODES = ("scores", "overlays", "maps")


def _vm(key: str) -> float:
    """``VmHWM`` (peak) or ``VmRSS`` of this process in MiB (Linux /proc)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"{key} not in /proc/self/status (Linux only)")


def child(run: str, folder: str, mode: str, batch_size: int, threads: int, reference: bool) -> dict:
    """One measurement in this (fresh) process; returns a JSON-able dict."""
    import numpy as np
    import torch
    torch.set_num_threads(threads)
    from adsim.inference.detector import Detector
    from adsim.model.backbone import RandomWeightsWarning
    warnings.simplefilter("ignore", RandomWeightsWarning)
    det = Detector.from_run(run, device="cpu")
    files = sorted(Path(folder).iterdir())
    det.predict(files[:4], batch_size=batch_size)  # warm-up
    rss_load = _vm("VmHWM")
    out = tempfile.mkdtemp(prefix="png_", dir=Path(folder).parent)  # inside the work folder: always removed
    t = time.perf_counter()
    pred = det.predict(folder, batch_size=batch_size, maps=mode == "maps",
                       overlays=out if mode == "overlays" else None)
    seconds = time.perf_counter() - t
    res = {"n": len(pred.paths), "mode": mode, "seconds": seconds, "rss_load": rss_load, "rss_peak": _vm("VmHWM")}
    shutil.rmtree(out)
    if reference:
        from adsim.data import bmad
        from adsim.model.head import features, image_scores
        method = det.method
        loader = torch.utils.data.DataLoader(bmad.ImageDataset([bmad.Sample(p, 0, None, "") for p in files],
                                                            method.image_size, clip_norm=method.clip_norm),
                                             batch_size=batch_size)
        t = time.perf_counter()
        ref = []
        with torch.no_grad():
            for batch in loader:
                ref.append(image_scores(features(method.backbone, method.head, batch["image"]), method.scoring).numpy())
        res["ref_seconds"] = time.perf_counter() - t
        res["max_abs_diff"] = float(np.abs(np.concatenate(ref) - pred.scores).max())
    return res


def _folder(src: list, n: int, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for i in range(n):
        p = src[i % len(src)]
        shutil.copy(p, dst / f"img_{i:05d}{p.suffix}")
    return dst


def main(argv=None) -> str:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[64, 512], help="folder sizes (images)")
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--image-px", type=int, default=256, help="size of the toy PNGs on disk")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--results", default=str(ROOT / "benchmarks" / "RESULTS.md"),
                    help="Markdown file whose section is replaced ('' = print only)")
    ap.add_argument("--child", nargs=4, metavar=("RUN", "FOLDER", "MODE", "REFERENCE"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        run, folder, mode, reference = args.child
        print(json.dumps(child(run, folder, mode, args.batch_size, args.threads, reference == "1")))
        return ""

    import torch
    from montecarlo import machine_info, write_section

    from adsim.cli.main import main as adsim_main
    from adsim.data.toy import make_toy_bmad
    work = Path(tempfile.mkdtemp(prefix="adsim_predict_bench_"))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            toy = make_toy_bmad(work / "toy", n_per_class=4, size=args.image_px, seed=0)
            assert adsim_main(["train", "--data", str(toy), "--target", "Brain", "--train-domains", "Liver",
                               "--epochs", "1", "--backbone", "tiny", "--batch-size", "8", "--no-progress",
                               "--out", str(work / "run")]) == 0
        src = sorted(p for p in toy.rglob("img/*.png"))
        rows = []
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(args.threads)}
        for n in args.sizes:
            folder = _folder(src, n, work / f"f{n}")
            for mode in args.modes:
                ref = "1" if mode == "scores" else "0"
                cmd = [sys.executable, __file__, "--batch-size", str(args.batch_size), "--threads",
                       str(args.threads), "--child", str(work / "run"), str(folder), mode, ref]
                r = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
                rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
                print(rows[-1], flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    with open("/proc/loadavg") as fh:
        load = fh.read().split()[0]
    lines = [f"Measured {time.strftime('%Y-%m-%d')} on {machine_info()}, torch {torch.__version__}, "
             f"{args.threads} torch thread(s), batch {args.batch_size}, toy PNGs of {args.image_px} px resized "
             f"to 64 px, 1-minute load average {load} at the end (the 2-core machine is SHARED with other "
             "jobs: wall times are inflated and vary between runs). SIMULATED toy images, random weights "
             "(speed and memory only). Each row is a fresh process; RSS in MiB (Linux VmHWM).",
             f"Command: `python benchmarks/adsim_predict.py --sizes {' '.join(map(str, args.sizes))}`.", "",
             "| images | mode | images/s | reference images/s | detector / reference | peak RSS after load [MiB] "
             "| peak RSS after predict [MiB] | growth [MiB] |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ips = r["n"] / r["seconds"]
        ref = f"{r['n'] / r['ref_seconds']:.0f}" if "ref_seconds" in r else "-"
        ratio = f"{r['ref_seconds'] / r['seconds']:.2f}" if "ref_seconds" in r else "-"
        lines.append(f"| {r['n']} | {r['mode']} | {ips:.0f} | {ref} | {ratio} | {r['rss_load']:.0f} | "
                     f"{r['rss_peak']:.0f} | {r['rss_peak'] - r['rss_load']:.1f} |")
    lines.append("")
    for mode in args.modes:
        rs = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["n"])
        if len(rs) < 2:
            continue
        a, b = rs[0], rs[-1]
        kept = (b["n"] - a["n"]) * 64 * 64 * 4 / 2 ** 20 if mode == "maps" else 0.0
        lines.append(f"* `{mode}`: peak-RSS growth {a['rss_peak'] - a['rss_load']:.1f} MiB for {a['n']} images, "
                     f"{b['rss_peak'] - b['rss_load']:.1f} MiB for {b['n']} ({b['n'] / a['n']:.0f}x the images); "
                     f"the maps the caller keeps account for {kept:.1f} MiB of the difference"
                     + (" (every map is returned by design)." if mode == "maps" else " (none kept)."))
    diffs = [r["max_abs_diff"] for r in rows if "max_abs_diff" in r]
    lines += ["", f"Detector scores vs the reference path: largest |difference| {max(diffs):.2g} (same images, "
              "same batches)." if diffs else ""]
    body = "\n".join(lines)
    if args.results:
        write_section(args.results, TITLE, body)
    return body


if __name__ == "__main__":
    print(main())
