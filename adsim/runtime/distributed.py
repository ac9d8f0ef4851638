"""Data-parallel training and evaluation under ``torchrun`` (torch.distributed + DDP; nothing home-made).

``torchrun --nproc-per-node N -m adsim train ... --batch-size B`` trains on ``N`` processes (one per GPU;
gloo on CPU). ``B`` is the GLOBAL batch: every rank takes ``B / N`` images per step (a world size that
does not divide ``B`` is refused), so a run's configuration -- and its result -- does not depend on
``N``. What each piece does, and why the result equals a one-process run with batch ``B``:

* Sampling: ``DistributedSampler(shuffle=True, seed=seed * 100_003, drop_last=True)`` and
  ``set_epoch(epoch)``; with one process this is the very permutation the one-process trainer has
  always used. Rank ``r`` takes positions ``r, r + N, ...`` of the permutation, so the union of the
  ranks' step-``t`` batches is exactly the one-process step-``t`` batch (the last, shorter batch too).
  If ``N`` does not divide the number of images, the last ``n mod N`` (< N) images of each epoch's
  permutation are skipped (DistributedSampler's ``drop_last``; a one-process run has no skipped image).
* Per-rank part of the step: frozen trunk + adapters up to the adapter bottlenecks (``L x (b, N_tok, E)``
  per task), inside the ``DistributedDataParallel`` module, so DDP all-reduces (averages) the gradients.
* Everything that needs the whole batch -- VACA's batch statistic ``Delta`` and running mean, the
  batched or sequential matching gate and the centroid update, the masked means of Dice/Focal and the
  means of ``L_intra`` over the matched sets -- runs on the bottlenecks ALL-GATHERED over the ranks
  (``torch.distributed.nn.functional.all_gather``, differentiable) and put back into the one-process
  order. Every rank therefore computes the identical global loss ``G`` and identical centroids and VACA
  statistics (no broadcast needed; ``check_in_sync`` verifies it once per epoch). Gradients: the
  all-gather's backward sums the ``N`` identical ``dG/d(bottleneck)`` of its slice, and DDP divides by
  ``N``, so every parameter receives exactly ``dG/dtheta`` -- the one-process gradient.
  (The alternative, all-reducing per-step matched sums and counts, is less traffic but only works for
  the batched gate, and every masked mean of the losses would need its own global denominator.)
  Cost: per step each rank sends ``2 L b N_tok E`` floats (ViT-L-14-336, b = 16: 8 x 16 x 289 x 768 x 4 B
  = 114 MB) and recomputes the cheap post-bottleneck part for the global batch.
* Checkpoints, ``config.json`` and ``history.json`` are written by rank 0 only (atomically, as before);
  every rank reads ``checkpoint_last.pt`` on ``--resume`` (the run folder must be shared by the ranks).
* Evaluation (``score``): each rank scores ``samples[rank::N]``; the results are all-gathered
  (``all_gather_object``) and put back in order, so AUCs are computed on all images.
* A dead or stalled peer: collectives time out after ``timeout_s`` (``--dist-timeout``) and the CLI
  prints one line naming the rank instead of hanging; torchrun then stops the other ranks.
"""
from __future__ import annotations

import datetime
import os
from typing import NamedTuple

import numpy as np
import torch
import torch.distributed as dist

from adsim.runtime.device import resolve_device

DEFAULT_TIMEOUT_S = 600.0


class DistributedError(RuntimeError):
    """A collective failed: a peer died, stalled beyond the timeout, or the ranks diverged."""


class World(NamedTuple):
    rank: int
    size: int
    local_rank: int


def world() -> World:
    """The current process group (``World(0, 1, 0)`` without one)."""
    if dist.is_available() and dist.is_initialized():
        return World(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0)))
    return World(0, 1, 0)


def is_main() -> bool:
    return world().rank == 0


def setup(device: str = "auto", timeout_s: float = DEFAULT_TIMEOUT_S) -> World:
    """Initialise the process group from torchrun's environment (``WORLD_SIZE`` > 1) if not done yet:
    NCCL when the device is CUDA, gloo otherwise. Without torchrun: nothing, ``World(0, 1, 0)``."""
    if not timeout_s > 0:
        raise ValueError(f"dist timeout must be > 0 seconds, got {timeout_s!r}")
    cuda = resolve_device(device).type == "cuda"  # ValueError for cuda without CUDA, before any collective
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size > 1 and not dist.is_initialized():
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=timeout_s))
    return world()


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def local_device(device: torch.device, w: World) -> torch.device:
    """One GPU per rank: ``cuda`` -> ``cuda:LOCAL_RANK`` under torchrun."""
    if w.size > 1 and device.type == "cuda":
        return torch.device("cuda", w.local_rank)
    return device


def local_batch_size(batch_size: int, w: World) -> int:
    """``batch_size`` is the global batch; each rank takes ``batch_size / world size``."""
    if batch_size % w.size:
        raise ValueError(f"batch_size (the global batch) must be divisible by the torchrun world size "
                         f"{w.size}, got {batch_size}; use a multiple of {w.size} or fewer processes")
    return batch_size // w.size


def sampler(dataset, seed: int, epoch: int, w: World) -> torch.utils.data.DistributedSampler:
    """This rank's share of the epoch-``epoch`` permutation (see the module docstring)."""
    s: torch.utils.data.DistributedSampler[int] = torch.utils.data.DistributedSampler(
        dataset, num_replicas=w.size, rank=w.rank, shuffle=True, seed=seed, drop_last=True)
    s.set_epoch(epoch)
    return s


def gather_batch(t: torch.Tensor) -> torch.Tensor:
    """``(b, ...)`` on every rank -> ``(N b, ...)`` in the one-process order (rank ``r``'s item ``j``
    is global item ``N j + r``). Differentiable: the backward sums the ranks' gradients of the slice."""
    w = world()
    if w.size == 1:
        return t
    return one_process_order(_AllGather.apply(t.contiguous(), w.size, w.rank), w.size)


def one_process_order(t: torch.Tensor, size: int) -> torch.Tensor:
    """Rank-major ``(size * b, ...)`` (rank 0's ``b`` items, then rank 1's, ...) -> the order of the
    one-process batch, where rank ``r``'s item ``j`` sits at position ``size * j + r``."""
    return t.unflatten(0, (size, -1)).transpose(0, 1).flatten(0, 1)


# all_gather_into_tensor was renamed all_gather_single (the old name warns in recent torch)
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class _AllGather(torch.autograd.Function):
    """``all_gather_single`` with the gradient of the matching reduce-scatter (sum over ranks).

    Written out because torch's autograd all-gathers are deprecated (``torch.distributed.nn``) or
    need ``reduce_scatter``, which gloo lacks; the backward is an ``all_reduce`` followed by taking this
    rank's slice, which is the reduce-scatter's result."""

    @staticmethod
    def forward(ctx, t, size, rank):
        ctx.size, ctx.rank, ctx.n = size, rank, t.shape[0]
        out = t.new_empty((size * t.shape[0], *t.shape[1:]))
        _all_gather_single(out, t)
        return out

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad)
        return grad[ctx.rank * ctx.n:(ctx.rank + 1) * ctx.n], None, None


def gather_dict(batch: dict) -> dict:
    """:func:`gather_batch` on every tensor of a batch dict (labels, masks, ...; no gradients)."""
    if world().size == 1:
        return batch
    return {k: gather_batch(v) for k, v in batch.items()}


class _PerRank(torch.nn.Module):
    """What DDP wraps: the head (its parameters) with the per-rank part of the step as ``forward``."""

    def __init__(self, head, per_rank):
        super().__init__()
        self.head = head
        self._per_rank = per_rank  # a plain callable: the frozen backbone is not a submodule here

    def forward(self, x):
        return self._per_rank(self.head, x)


def data_parallel(head, per_rank, score, device: torch.device):
    """``forward(x) -> Features`` of the GLOBAL batch for :func:`adsim.training.train.train_epoch`.

    ``per_rank(head, x) -> (seg_mid, det_mid)`` is the per-rank part (bottlenecks, ``L x (b, N, E)``),
    ``score(head, seg_mid, det_mid) -> Features`` the rest. With one process: ``score(head,
    *per_rank(head, x))``, no wrapper at all."""
    if world().size == 1:
        return lambda x: score(head, *per_rank(head, x))
    ids = [device.index] if device.type == "cuda" else None
    # buffers (centroids, VACA statistics) are identical by construction: no per-step broadcast;
    # static_graph: the last adapters' up-projections feed no later block, so they never get a gradient
    ddp = torch.nn.parallel.DistributedDataParallel(_PerRank(head, per_rank), device_ids=ids,
                                                    forward_sync_buffers=False, static_graph=True)

    def forward(x):
        seg_mid, det_mid = ddp(x)
        return score(head, [gather_batch(t) for t in seg_mid], [gather_batch(t) for t in det_mid])
    return forward


def check_in_sync(module: torch.nn.Module, rtol: float = 1e-6) -> None:
    """Raise :class:`DistributedError` if parameters or buffers (centroids, VACA statistics) differ
    between ranks: one small all-gather of per-tensor float64 sums."""
    w = world()
    if w.size == 1:
        return
    state = [t for t in module.state_dict().values() if t.is_floating_point()]
    fp = torch.stack([t.detach().double().sum() for t in state] + [t.detach().double().abs().sum() for t in state])
    fp = fp.to(state[0].device) if state else fp
    all_fp = [torch.empty_like(fp) for _ in range(w.size)]
    dist.all_gather(all_fp, fp)
    ref = all_fp[0]
    for r, other in enumerate(all_fp):
        if not torch.allclose(other, ref, rtol=rtol, atol=rtol):
            raise DistributedError(f"rank {r}'s head state differs from rank 0's: the ranks diverged")


def barrier() -> None:
    if world().size > 1:
        dist.barrier()


def shard(items: list) -> list:
    """This rank's share ``items[rank::size]`` (evaluation; no padding, no duplicates)."""
    w = world()
    return list(items)[w.rank::w.size]


def gather_objects(obj) -> list:
    """Every rank's ``obj`` (picklable), in rank order, on every rank (``[obj]`` with one process)."""
    w = world()
    if w.size == 1:
        return [obj]
    parts = [None] * w.size
    dist.all_gather_object(parts, obj)
    return parts


def gather_arrays(out: dict | None, n: int) -> dict:
    """Inverse of :func:`shard`: ``out`` is this rank's dict of NumPy arrays (first axis = item; a value
    may be ``None``), or ``None`` for an empty share (fewer items than ranks). Every rank gets the arrays
    of all ``n`` items in the original order. No item at all (``n = 0``, one process) -> ``ValueError``."""
    if world().size == 1:
        if out is None:  # one process holds every item: its share is empty only when there is none
            raise ValueError(f"gather_arrays: no items to gather (n = {n}), at least one is needed")
        return out
    parts = gather_objects(out)
    w = world()
    ref = parts[0]  # rank 0's share is never empty when n >= 1
    full: dict[str, np.ndarray | None] = {}
    for key, first in ref.items():
        if first is None:
            full[key] = None
            continue
        arr = np.empty((n, *first.shape[1:]), dtype=first.dtype)
        for r, p in enumerate(parts):
            if p is not None:
                arr[r::w.size] = p[key]
        full[key] = arr
    return full
