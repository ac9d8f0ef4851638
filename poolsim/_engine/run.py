"""Running a spec for many seeds: chunks, dispatch, gathering, summaries, several processes."""
from __future__ import annotations

import contextlib
from typing import Callable

import jax
import numpy as np

from .. import _cache
from .chunks import chunk_plan
from .compiled import compiled, compiled_moments, compiled_vmapped, mesh
from .gather import Gatherer, gather
from .medians import chunk_medians, host_medians_outside
from .moments import Moments, Summary, combine
from .spec import SeedResult, Spec, accelerator_path

DISTRIBUTED_HELP = (
    "call jax.distributed.initialize(coordinator_address='HOST:PORT', num_processes=N, "
    "process_id=I) in every process before any other JAX call (HOST:PORT may instead come from "
    "the environment variable JAX_COORDINATOR_ADDRESS; on Slurm, Open MPI and TPU pods "
    "jax.distributed.initialize() detects all three); or use poolsim.experiments.init_distributed(), "
    "which checks them first")


def process_block(S: int) -> tuple[int, int]:
    """``(start, length)`` of this process's equal block of ``S`` seeds (the seed list padded to a
    multiple of ``jax.process_count()``), for :func:`simulate` with ``distributed=True``."""
    per = -(-S // jax.process_count())
    return jax.process_index() * per, per


# Batches dispatched ahead of the oldest unfinished one: the device queue never runs dry, and
# the draws of at most this many batches wait in memory (the CPU runtime would otherwise run
# every batch's independent draws program at once).
AHEAD = 2

def simulate(spec: Spec, seeds: np.ndarray, *, dtype: str = "float32", chunk: int = 1024,
             shard: bool = True, progress: Callable[[int], None] | None = None,
             distributed: bool = False, batched: bool = True,
             summary: bool = False, fields: tuple | None = None,
             memory_budget=None) -> SeedResult | Summary:
    """Run ``spec`` for every seed in ``seeds`` (int array). Seed s uses ``jax.random.key(s)``'s
    numbers (through :func:`poolsim._rng.fast_key`), so a seed's result does not depend on the
    other seeds, the sharding or the process, and -- up to float32 rounding, XLA fusing
    reductions differently for another batch shape -- not on the chunking either.
    ``batched=False`` runs the plain ``vmap`` of :func:`one_seed` instead (same results, slower;
    the tests' oracle).

    Seeds are processed in chunks (:func:`poolsim._engine.chunks.chunk_plan`): at most ``chunk``
    seeds, fewer where ``memory_budget`` (bytes or a string such as ``"4GB"``; default the
    environment variable ``POOLSIM_MEMORY_BUDGET``, else a fair share of the free memory) does not
    hold them; sizes from a short ladder of powers of two, so few compiled shapes serve every seed
    count, and the last chunk is the smallest rung that holds the seeds left. A size of which one
    seed does not fit raises :class:`poolsim._engine.chunks.MemoryBudgetError` before any work.
    With several local devices each chunk is split over them (sizes multiples of the device
    count), each device running its block alone (:func:`compiled`). Chunks are dispatched without
    waiting for their results (at most ``AHEAD`` unfinished ahead of the oldest, none where the
    budget holds only one chunk in flight); on a CPU backend each finished chunk's results are
    copied into the host arrays at once, on an accelerator they stay on the device until all are
    done and cross to the host once (:func:`gather`).

    ``fields``: names of the :class:`SeedResult` fields to bring to the host (default: all);
    the others are ``None`` in the result (:func:`poolsim.experiments.run` asks only for what its
    frame reads).

    ``summary=True``: no per-seed results leave the device; each chunk is reduced there to the
    :class:`Moments` of eps per K and strategy and of the paired differences :data:`PAIRS`, and a
    :class:`Summary` of all seeds is returned (host memory independent of the seed count).

    ``distributed=True`` (every process of a ``jax.distributed`` job calls this with the same
    arguments): each process runs its own block of seeds (:func:`process_block`) and
    ``multihost_utils.process_allgather`` gathers the blocks (or the moments), so every process,
    process 0 included, returns all seeds in order. Returns a :class:`SeedResult` of NumPy arrays
    with leading axis ``len(seeds)`` (read-only where they come straight from an accelerator), or
    a :class:`Summary`.
    """
    seeds = np.asarray(seeds, dtype=np.int64)
    S = len(seeds)
    if fields is not None:
        fields = tuple(fields)
        unknown = [f for f in fields if f not in SeedResult._fields]
        if unknown:
            raise ValueError(f"fields must be names among {SeedResult._fields}, got {unknown}")
    if distributed:
        if not jax.distributed.is_initialized():
            raise RuntimeError(f"distributed=True but jax.distributed is not initialised: "
                               f"{DISTRIBUTED_HELP}")
        start, per = process_block(S)
        padded = np.concatenate([seeds, np.full(per * jax.process_count() - S, seeds[-1])])
        local = _simulate_local(spec, padded[start:start + per], max(0, min(per, S - start)),
                                dtype=dtype, chunk=chunk, shard=shard, progress=progress,
                                batched=batched, summary=summary, fields=fields,
                                memory_budget=memory_budget)
        from jax.experimental import multihost_utils

        ctx = jax.enable_x64(True) if dtype == "float64" or summary else contextlib.nullcontext()
        with ctx:
            full = multihost_utils.process_allgather(local, tiled=True)
        if summary:
            return combine(Moments(*(np.asarray(a) for a in full)))
        return SeedResult(*(None if a is None else np.asarray(a)[:S] for a in full))
    out = _simulate_local(spec, seeds, S, dtype=dtype, chunk=chunk, shard=shard,
                          progress=progress, batched=batched, summary=summary, fields=fields,
                          memory_budget=memory_budget)
    return combine(out) if summary else out


def _simulate_local(spec: Spec, seeds: np.ndarray, n_valid: int, *, dtype: str, chunk: int,
                    shard: bool, progress, batched: bool, summary: bool,
                    fields: tuple | None = None, memory_budget=None):
    """:func:`simulate` on this process's devices; the first ``n_valid`` seeds count (the rest
    pad a distributed block). Returns a :class:`SeedResult` or, with ``summary``, the
    :class:`Moments` (NumPy, one row per chunk and device; float64)."""
    S = len(seeds)
    ndev = len(jax.local_devices()) if shard else 1
    outside = batched and host_medians_outside(spec, ndev)
    # the (nK, K_max) flags of matching are formed only where they are returned
    included = not summary and (fields is None or "included" in fields)
    plan = chunk_plan(S, spec, dtype=dtype, chunk=chunk, ndev=ndev, budget=memory_budget,
                      ahead=AHEAD, host_medians=ndev == 1 and not accelerator_path(),
                      included=included or not batched)
    _cache.enable_jax_cache()
    starts = np.concatenate([[0], np.cumsum(plan.sizes)])
    seeds = seeds.astype(np.uint32)
    seeds = np.concatenate([seeds, np.full(starts[-1] - S, seeds[-1], np.uint32)])
    place = (jax.sharding.NamedSharding(mesh(ndev), jax.sharding.PartitionSpec("seeds"))
             if ndev > 1 else None)
    ctx = jax.enable_x64(True) if dtype == "float64" else contextlib.nullcontext()
    keep = None if fields is None or summary else set(fields)
    on_device = ndev == 1 and accelerator_path()
    rows = len(plan.sizes) * ndev if summary else S
    into = Gatherer(rows) if not on_device else None
    parts, waiting = [], []

    def finish(out, k):
        jax.block_until_ready(out)
        if into is not None:  # copied to the host now; the chunk's device arrays are dropped
            into.add(out, ndev if summary else k)
        else:
            parts.append((out, ndev if summary else k))
        if progress is not None:
            progress(k)

    with ctx:
        fns: tuple[Callable, ...] = (compiled(spec, dtype, ndev, included) if batched
                                     else (compiled_vmapped(spec, dtype, ndev),))
        moments = compiled_moments(spec, ndev) if summary else None
        for i, size in enumerate(plan.sizes):
            a, b = int(starts[i]), int(starts[i + 1])
            k = min(size, S - a)  # this chunk's own seeds; the rest pad it
            out = jax.device_put(seeds[a:b], place)
            if outside:
                draw_fn, est_fn = fns
                out = draw_fn(out)
                medians = chunk_medians(np.asarray(out.samples), k, spec)
                out = est_fn(out, medians)
            else:
                for fn in fns:
                    out = fn(out)
            if moments is not None:  # summary
                valid = np.arange(a, b) < n_valid
                out = moments(out, jax.device_put(valid, place))
            elif keep is not None:
                out = out._replace(**{f: None for f in out._fields if f not in keep})
            waiting.append((out, k))
            del out
            if len(waiting) > plan.ahead:
                done, kd = waiting.pop(0)
                finish(done, kd)
        while waiting:
            done, kd = waiting.pop(0)
            finish(done, kd)
        res = into.result() if into is not None else gather(parts, True)
        if summary:
            res = Moments(*(np.asarray(a, np.float64) if a.dtype.kind == "f" else a for a in res))
    return res
