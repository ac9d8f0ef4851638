"""The engine's compiled programs per (spec, dtype, devices), stored across processes."""
from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from .. import _programs, _rng
from .draws import draw_batch
from .estimates import estimate_batch, one_seed
from .moments import moments
from .spec import Spec, accelerator_path

def mesh(ndev: int):
    return jax.sharding.Mesh(np.array(jax.local_devices()[:ndev]), ("seeds",))

def compiled(spec: Spec, dtype_name: str, ndev: int = 1,
             included: bool = True) -> tuple[Callable, Callable]:
    """The engine's two programs per (spec, dtype, devices), :func:`draw_batch` and
    :func:`estimate_batch` (``est(draw(seeds))``, or ``est(draws, medians)`` where
    :func:`host_medians_outside`): the compile-count test checks each traces once. Each is a
    :class:`poolsim._programs.Program` around the ``jax.jit`` of the function: on one device, for
    a spec with a storable sampler (:func:`store_ident`), its compiled executables are kept in
    the per-user program store, so another process loads them instead of tracing and compiling.

    On ``ndev > 1`` local devices each program is a ``shard_map`` over the seed axis: every device
    runs the whole computation on its own block of seeds (its own matching loops, its own trip
    counts), so the programs contain no cross-device collective -- seeds are independent. The
    materialised path's sample medians then use the pure-XLA :func:`prefix_medians` (see
    :func:`grouped_medians`).

    ``included=False``: the estimates program returns ``included=None`` and never forms the
    ``(S, nK, K_max)`` flags (a run that does not read them: :func:`poolsim.experiments.run`'s frame,
    summaries); a program of its own."""
    accel = accelerator_path()
    est = estimate_batch if included else estimate_batch_no_flags
    return (_program(draw_batch, "draws", spec, dtype_name, ndev, accel, True),
            _program(est, "estimates", spec, dtype_name, ndev, accel, included))


def estimate_batch_no_flags(spec: Spec, dtype, draws, medians=None):
    """:func:`estimate_batch` with ``included=None`` (its flags are then not formed)."""
    return estimate_batch(spec, dtype, draws, medians)._replace(included=None)


@functools.lru_cache(maxsize=192)  # 64 set-ups x (draws, estimates, estimates without flags)
def _program(f: Callable, name: str, spec: Spec, dtype_name: str, ndev: int, accel: bool,
             included: bool) -> Callable:
    """One engine program (one per argument set: the draws program serves both ``included``)."""
    ident = store_ident(spec, dtype_name, ndev, accel, included)
    return _programs.Program(jax.jit(per_device(functools.partial(f, spec, jnp.dtype(dtype_name)), ndev)),
                             name, ident)


def store_ident(spec: Spec, dtype_name: str | None, ndev: int, accel: bool = False,
                included: bool = True) -> str | None:
    """What decides the engine's programs for ``spec`` apart from the argument shapes and the
    environment (:mod:`poolsim._programs`): the spec with its sampler's ``store_key``, the dtype,
    the device count and, where it is the accelerator path (:func:`accelerator_path`), that. ``None``
    (the programs are not stored across processes) when the sampler has no ``store_key`` string -- nothing then says two processes' samplers trace alike -- or
    on several devices."""
    key = getattr(spec.sample_means, "store_key", None)
    if not isinstance(key, str) or ndev != 1:
        return None
    fields = (key,) + tuple(spec)[1:]  # the spec, its sampler (field 0) replaced by the sampler's store_key
    return repr((fields, dtype_name, ndev) + (("accelerator",) if accel else ())
                + (() if included else ("without included",)))


def compiled_vmapped(spec: Spec, dtype_name: str, ndev: int = 1):
    """The plain ``vmap`` of :func:`one_seed` (seeds in, as :func:`draw_batch`): the batched
    engine's oracle in the tests."""
    return _vmapped_cached(spec, dtype_name, ndev, accelerator_path())


@functools.lru_cache(maxsize=8)
def _vmapped_cached(spec: Spec, dtype_name: str, ndev: int, accel: bool):
    one = functools.partial(one_seed, spec, jnp.dtype(dtype_name), host_medians=ndev == 1)
    return jax.jit(per_device(jax.vmap(lambda s: one(_rng.fast_key(s))), ndev))


@functools.lru_cache(maxsize=64)
def compiled_moments(spec: Spec, ndev: int = 1):
    return _programs.Program(jax.jit(per_device(functools.partial(moments, spec), ndev)),
                             "moments", store_ident(spec, None, ndev))


def per_device(f: Callable, ndev: int) -> Callable:
    """``f`` itself on one device; else ``f`` on each device's block of the leading (seed) axis of
    every argument and result (``shard_map``; nothing is communicated between devices)."""
    if ndev == 1:
        return f
    spec = jax.sharding.PartitionSpec("seeds")
    return jax.shard_map(f, mesh=mesh(ndev), in_specs=spec, out_specs=spec, check_vma=False)
