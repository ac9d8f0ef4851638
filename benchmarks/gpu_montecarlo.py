"""GPU benchmark: `domain_addition` (paper parameters) at 1e6 seeds on one accelerator.

Not a test. Times the engine after compilation on both paths (sufficient statistics and
materialised samples), prints a table and, unless ``--no-write``, replaces the section
"Monte-Carlo engine (GPU)" of ``benchmarks/RESULTS.md`` with it and the device name.
Targets (issue 22, one H100/H200, 1e6 seeds, sufficient path): <= 0.5 s after compilation
returning per-seed results, <= 0.2 s as an on-device summary (``summary=True``), first call
<= 20 s. The sufficient path is timed both ways; the materialised path per seed.

    python benchmarks/gpu_montecarlo.py [--seeds 1000000] [--chunk 131072]
                                        [--chunk-materialised 16384] [--allow-cpu] [--profile]

The materialised path gets its own, smaller chunk: its XLA prefix medians hold an
(nK, K_max n, d) running count per seed (26 x 3000 x 2 int32 = 624 kB), ~82 GB at 131,072 seeds.

Without a GPU it stops with a message, unless ``--allow-cpu`` (a smoke run; use few seeds).

``--anchor FILE`` (default ``../shared/anchors/jax_da_anchor.py``, the workplace's 40-line vmapped JAX loop of
the same experiment at the level of domain means) runs that reference in a subprocess with the same seed count,
on the same device, in the same run, and adds the engine / anchor ratio to every row. The anchor is a
reference, not project code: it is run, never imported. ``--anchor none`` skips it.
"""
from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from montecarlo import call_times, machine_info, write_section  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=1_000_000)
    ap.add_argument("--chunk", type=int, default=131_072, help="seeds per device call")
    ap.add_argument("--chunk-materialised", type=int, default=16_384,
                    help="seeds per device call on the materialised path (memory, see above)")
    ap.add_argument("--allow-cpu", action="store_true")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "RESULTS.md"))
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--anchor", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared", "anchors",
                                                     "jax_da_anchor.py"),
                    help="the reference loop to run in the same run (a file; 'none' skips it)")
    ap.add_argument("--profile", action="store_true",
                    help="also split the sufficient path's per-seed call into its programs, the on-device "
                         "concatenation and the copy to the host (all fields and the frame's)")
    args = ap.parse_args(argv)
    import jax

    from poolsim import _engine
    from poolsim import experiments as ex

    dev = jax.devices()[0]
    if dev.platform != "gpu" and not args.allow_cpu:
        print(f"no GPU visible to JAX (found {dev.platform}); install jax[cuda] on a GPU machine, "
              "or pass --allow-cpu for a smoke run", file=sys.stderr)
        return 1
    rows = []
    for mat, summary in ((False, False), (False, True), (True, False)):
        chunk = args.chunk_materialised if mat else args.chunk
        spec, P = ex.spec("domain_addition", materialize=mat, chunk=chunk)
        seeds = np.arange(args.seeds)
        t = time.perf_counter()
        _engine.simulate(spec, seeds, chunk=chunk, summary=summary)
        first = time.perf_counter() - t
        t = time.perf_counter()
        res = _engine.simulate(spec, seeds, chunk=chunk, summary=summary)
        warm = time.perf_counter() - t
        assert np.isfinite(res.mean if summary else res.estimates).all()
        target = 0.2 if summary else (0.5 if not mat else None)
        rows.append(("materialised" if mat else "sufficient statistics",
                     "summary on device" if summary else "per-seed arrays", chunk, first, warm,
                     target))
    name = getattr(dev, "device_kind", dev.platform)
    anchor = _anchor(args.anchor, args.seeds)
    lines = [f"Device: {name}. Host: {machine_info()}.",
             f"`domain_addition`, paper parameters, {args.seeds:,} seeds, float32.", "",
             "| path | returns | chunk | first call incl. compile (s) | after compilation (s) "
             "| seeds/s | target after compilation / first call <= 20 s |",
             "|---|---|---:|---:|---:|---:|---|"]

    def met(w, f, target):
        first = "yes" if f <= 20 else "NO"
        return f"<= {target} s: {'yes' if w <= target else 'NO'} / {first}" if target else "-"

    lines += [f"| {p} | {r} | {c:,} | {f:.2f} | {w:.3f} | {args.seeds / w:,.0f} | {met(w, f, t)} |"
              for p, r, c, f, w, t in rows]
    if anchor:
        a = anchor["s"]
        lines += ["", f"Anchor (`{os.path.basename(args.anchor)}`, same seeds, same device, this run): first call "
                      f"{anchor['first_call_s']:.2f} s, after compilation {a:.3f} s "
                      f"({anchor['seeds_per_s']:,.0f} seeds/s, backend {anchor['backend']}).", "",
                  "| path | returns | engine / anchor, after compilation | target |", "|---|---|---:|---|"]
        lines += [f"| {p} | {r} | {w / a:.2f} | {'<= 1' if r.startswith('summary') else '<= 2'} |"
                  for p, r, c, f, w, t in rows if p.startswith("sufficient")]
    if args.profile:
        lines += ["", *_profile(args.chunk, args.seeds)]
    body = "\n".join(lines)
    print(body)
    if not args.no_write:
        write_section(args.out, "Monte-Carlo engine (GPU)", body)
    return 0


def _anchor(path: str, seeds: int) -> dict | None:
    """The anchor's result dict (it prints one Python literal), run in a fresh interpreter; None if skipped."""
    if path == "none":
        return None
    if not os.path.isfile(path):
        print(f"anchor {path} not found: no ratio (pass --anchor FILE or --anchor none)", file=sys.stderr)
        return None
    p = subprocess.run([sys.executable, path, str(seeds)], capture_output=True, text=True, check=True)
    return ast.literal_eval(p.stdout.strip().splitlines()[-1])


def _profile(chunk: int, seeds: int) -> list[str]:
    """Markdown lines: the sufficient path's per-seed call split into its parts (best of 3 after one call
    that compiles and warms up): one chunk's draws and estimates programs; then all ``seeds`` as the
    engine's accelerator path runs them -- every chunk's programs (dispatched back to back, waited for
    at the end), the on-device concatenation of the chunks, and the copy to the host of fresh arrays
    (an array already copied once keeps its host copy, so each repetition computes anew), for all
    fields and for the frame's fields only (``experiments.FRAME_FIELDS``), with bytes and GB/s."""
    import jax
    import jax.numpy as jnp

    from poolsim import _engine
    from poolsim import experiments as ex

    spec, _ = ex.spec("domain_addition", materialize=False, chunk=chunk)
    draw_fn, est_fn = _engine.compiled(spec, "float32")
    keys = jnp.arange(chunk, dtype=jnp.uint32)  # the draws program takes the seeds
    n_chunks = -(-seeds // chunk)
    chunk_keys = [jnp.arange(i * chunk, (i + 1) * chunk, dtype=jnp.uint32) for i in range(n_chunks)]

    def best(f):  # after one call that compiles / warms up
        return min(call_times(f, iters=3, warmup=1))

    draws = jax.block_until_ready(draw_fn(keys))
    out = jax.block_until_ready(est_fn(draws))
    t_draw = best(lambda: jax.block_until_ready(draw_fn(keys)))
    t_est = best(lambda: jax.block_until_ready(est_fn(draws)))
    it = np.asarray(out.n_iter)

    def programs():
        return jax.block_until_ready([est_fn(draw_fn(k)) for k in chunk_keys])

    def cut(outs, fields):  # the first `seeds` rows of every chunk, concatenated on the device
        k_last = seeds - (n_chunks - 1) * chunk
        parts = [{f: getattr(o, f)[:k_last] if i == n_chunks - 1 else getattr(o, f) for f in fields}
                 for i, o in enumerate(outs)]
        return jax.block_until_ready({f: jnp.concatenate([p[f] for p in parts]) for f in fields})

    def copy(whole):
        for a in whole.values():
            a.copy_to_host_async()
        return {f: np.asarray(a) for f, a in whole.items()}

    every = [f for f in out._fields if getattr(out, f) is not None]
    t_prog = best(programs)
    outs = programs()
    t_cat = best(lambda: cut(outs, every))
    rows = []
    for label, fields in (("all fields", every), ("the frame's fields", list(ex.FRAME_FIELDS))):
        times, nbytes = [], 0
        for _ in range(3):
            whole = cut(outs, fields)  # fresh device arrays: no host copy cached
            t = time.perf_counter()
            host = copy(whole)
            times.append(time.perf_counter() - t)
            nbytes = sum(a.nbytes for a in host.values())
        t_copy = min(times)
        rows.append(f"{label} ({', '.join(fields)}): {nbytes / 1e9:.2f} GB in {t_copy:.3f} s "
                    f"({nbytes / 1e9 / t_copy:.1f} GB/s)")
    return [f"Profile, sufficient statistics, best of 3 after compilation. One chunk of {chunk:,} seeds: draws "
            f"{1e3 * t_draw:.1f} ms, estimates {1e3 * t_est:.1f} ms; matching iterations per seed and K: mean "
            f"{it.mean():.2f}, max {it.max()}. All {seeds:,} seeds ({n_chunks} chunks): programs "
            f"{t_prog:.3f} s, on-device concatenation {t_cat:.3f} s, copy to the host: " + "; ".join(rows) + "."]


if __name__ == "__main__":
    sys.exit(main())
