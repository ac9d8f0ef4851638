"""How many seeds one program call runs: a memory budget and the bytes one seed needs.

A run's seeds go in chunks (:func:`chunk_plan`). The largest chunk is the requested ``chunk``
(default 1,024) or fewer: as many seeds as the memory budget holds, counting the chunks in flight
at once. Chunk sizes come from a short ladder -- the largest chunk, and powers of two from
:data:`SMALL_CHUNK` up to it -- so the number of compiled shapes per program stays at most
``log2(chunk / SMALL_CHUNK) + 2`` whatever the seed counts, and a run's last chunk is the
smallest rung that holds the seeds left (100 seeds run as one chunk of 128, not of 1,024).

The budget: ``memory_budget=`` (bytes, or a string such as ``"4GB"`` / ``"512MiB"``), else the
environment variable :data:`BUDGET_ENV`, else a fair share of what is free: half of the host's
available memory on a CPU backend, 3/4 of the device's free memory on an accelerator. A size
whose single seed does not fit raises :class:`MemoryBudgetError` before any work.
"""
from __future__ import annotations

import math
import os
import re
from typing import Any, NamedTuple

from .spec import Spec, groups, widths

# The smallest rung of the chunk ladder: runs of up to this many seeds take one chunk of this size.
SMALL_CHUNK = 64
# The environment variable that sets the memory budget (bytes or "4GB", "512MiB", ...).
BUDGET_ENV = "POOLSIM_MEMORY_BUDGET"
# Working memory outside the chunks, not counted per seed: the host medians' column batches
# (:data:`poolsim._engine.medians.COLUMN_ROWS` rows x ~24 bytes x 2 threads) and the runtime.
FIXED_BYTES = 256 << 20

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


class MemoryBudgetError(ValueError):
    """One seed of the requested size needs more memory than the budget (raised before any work)."""


def parse_bytes(value: Any, name: str = "memory_budget") -> int:
    """Bytes from an int/float or a string ``"<number>[unit]"`` (units: B, kB/MB/GB/TB = powers of
    1000, KiB/MiB/GiB/TiB = powers of 1024, case-insensitive). Raises ValueError naming ``name``."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a byte count or a string such as '4GB', got {value!r}")
    if isinstance(value, (int, float)):
        out = value
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", str(value))
        unit = m.group(2).lower() if m else None
        if m is None or unit not in _UNITS:
            raise ValueError(f"{name} must be a byte count or a string such as '4GB' or '512MiB', "
                             f"got {value!r}")
        out = float(m.group(1)) * _UNITS[unit]
    if not math.isfinite(out) or out <= 0:
        raise ValueError(f"{name} must be a positive number of bytes, got {value!r}")
    return int(out)


def host_available() -> int:
    """Bytes of host memory available now (``MemAvailable`` of ``/proc/meminfo``; elsewhere the
    free physical pages)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def default_budget() -> int:
    """A fair share of the free memory where the engine's arrays live: half of the host's
    available memory on a CPU backend, 3/4 of the first device's free memory on an accelerator
    (``memory_stats``; the host rule where a device does not report it)."""
    import jax

    if jax.default_backend() != "cpu":
        stats = jax.local_devices()[0].memory_stats() or {}
        if "bytes_limit" in stats:
            return int(0.75 * (stats["bytes_limit"] - stats.get("bytes_in_use", 0)))
    return host_available() // 2


def resolve_budget(memory_budget: Any = None) -> tuple[int, str]:
    """``(bytes, where it came from)``: the argument, else :data:`BUDGET_ENV`, else
    :func:`default_budget`."""
    if memory_budget is not None:
        return parse_bytes(memory_budget), "memory_budget"
    env = os.environ.get(BUDGET_ENV)
    if env:
        return parse_bytes(env, f"environment variable {BUDGET_ENV}"), BUDGET_ENV
    return default_budget(), "default: a share of the free memory"


class SeedBytes(NamedTuple):
    """Bytes one seed needs (estimated from the spec; checked against XLA's memory analysis of the
    compiled programs in the tests): ``draws`` the first program's output, ``work`` the second
    program's temporaries and results, ``results`` what crosses to the host (all fields)."""

    draws: int
    work: int
    results: int

    @property
    def total(self) -> int:
        return self.draws + self.work


def seed_bytes(spec: Spec, dtype_name: str = "float32", host_medians: bool = True,
               included: bool = True) -> SeedBytes:
    """:class:`SeedBytes` of ``spec`` in ``dtype_name``, counting every array the programs hold
    per seed (the draws, the draw program's noise, the subsampling draws put in place for each
    group of K steps, the rank comparisons or sorts, the medians' sorts, matching's state, the
    outputs). ``host_medians``: the sample medians are computed on the host (CPU, one device);
    else by XLA's :func:`poolsim._engine.medians.prefix_medians` over every sample. ``included``:
    the programs return matching's ``(nK, K_max)`` domain flags (else they are not formed)."""
    b = 8 if dtype_name == "float64" else 4
    K, n, d, nK = spec.K_max, spec.n, spec.d, len(spec.Ks)
    sK, sW, mat = sum(spec.Ks), sum(widths(spec)), spec.materialize
    samples = K * n * d * b if mat else 0
    draws = 2 * K * d * b + samples + sW * b + (sK * spec.n_sub * 4 if mat else sK * (d + 1) * b)
    draw_tmp = samples  # the noise beside the samples
    work = 0
    for g in groups(spec):
        rows, W = g.stop - g.start, g.W
        cells = rows * W
        sub = cells * (2 * b + (spec.n_sub * (4 + d * b) if mat else (2 * d + 1) * b))
        rank = cells * W if W <= 128 else 3 * cells * (b + 4)
        med = 0
        if spec.init == "median":
            if not mat:
                med = cells * d * 9 + W * d * (8 + b)
            elif not host_medians:
                med = cells * n * d * 9 + W * n * d * (8 + b)
        match = W * (3 * d + 6) * b
        work += sub + rank + med + match
    results = nK * (3 * d * b + 3 * 4 + 1 + 4) + (nK * K if included else 0) + 2 * K * d * b
    if mat and spec.init == "median" and host_medians:
        results += nK * d * b  # the medians handed to the second program
    return SeedBytes(draws, max(draw_tmp, work) + results, results)


class Plan(NamedTuple):
    """How :func:`poolsim._engine.simulate` runs ``S`` seeds: ``sizes`` the chunks in order (the
    last may be padded), ``ahead`` chunks dispatched before the oldest is waited on, ``budget``
    and ``per_seed`` (:class:`SeedBytes`) behind them."""

    sizes: tuple
    ahead: int
    budget: int
    per_seed: SeedBytes


def _round_to(c: int, ndev: int) -> int:
    return -(-c // ndev) * ndev


def rung(k: int, cap: int, ndev: int = 1) -> int:
    """The ladder's chunk for ``k`` seeds under the largest chunk ``cap``: the smallest power of
    two ``>= k`` (at least :data:`SMALL_CHUNK`), or ``cap`` if that is not smaller; a multiple of
    ``ndev``."""
    p = max(SMALL_CHUNK, 1 << max(0, k - 1).bit_length())
    return _round_to(min(p, cap), ndev)


def chunk_plan(S: int, spec: Spec, *, dtype: str = "float32", chunk: int = 1024, ndev: int = 1,
               budget: Any = None, ahead: int = 2, host_medians: bool = True,
               included: bool = True) -> Plan:
    """The chunks for ``S`` seeds of ``spec`` (:class:`Plan`). The largest chunk is ``chunk``
    rounded up to a multiple of ``ndev``, or fewer seeds where the budget (:func:`resolve_budget`,
    less :data:`FIXED_BYTES`; per device) does not hold ``ahead + 1`` chunks in flight -- then one
    chunk in flight (``ahead = 0``) of as many seeds as fit, a power of two. Full chunks, then
    the :func:`rung` for the rest. Raises :class:`MemoryBudgetError` (one line: the parameters,
    the bytes one seed needs and the budget) when one seed does not fit."""
    total, source = resolve_budget(budget)
    per = seed_bytes(spec, dtype, host_medians, included)
    avail = total - FIXED_BYTES
    if per.total > avail:
        raise MemoryBudgetError(
            f"one seed needs {per.total / 1e9:.3g} GB (K_max={spec.K_max}, {len(spec.Ks)} K values, "
            f"n={spec.n}, d={spec.d}, materialize={spec.materialize}, dtype={dtype}) but the memory "
            f"budget is {total / 1e9:.3g} GB ({source}, of which {FIXED_BYTES / 1e9:.2g} GB is kept "
            f"for fixed overhead): lower K, n or d, use materialize=False, or raise the budget "
            f"(memory_budget= or {BUDGET_ENV})")
    cap = _round_to(chunk, ndev)
    fits = avail // per.total * ndev  # seeds of one chunk in flight, over the devices
    if (ahead + 1) * rung(min(S, cap), cap, ndev) > fits:
        ahead = 0
        if cap > fits:
            cap = max(ndev, (1 << (fits.bit_length() - 1)) // ndev * ndev)
    sizes = [cap] * (S // cap)
    if S % cap:
        sizes.append(rung(S % cap, cap, ndev))
    return Plan(tuple(sizes), ahead, total, per)
