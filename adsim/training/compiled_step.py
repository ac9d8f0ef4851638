"""Opt-in compiled training step (``python -m adsim train --compile [MODE]``): ``torch.compile`` of
everything after the frozen trunk, forward and backward.

Boundary. The frozen trunk (blocks ``0 .. spec.adapter_layers[0]``, :func:`adsim.model.head.trunk_tokens`,
or the tokens of ``--trunk-cache``) stays eager; the compiled region is :func:`post_trunk_loss`: the
adapters with the later frozen blocks between them (:func:`adsim.model.head.adapter_bottlenecks`, under the
run's autocast), VACA and text scoring (:func:`adsim.model.head._score`), the batched matching gate with its
centroid update, ``L_intra``/``L_inter`` and Dice/Focal/BCE (:func:`adsim.training.train.objective`). AOTAutograd
compiles the backward of the same graph, so the step's many small ops (VACA's per-layer ops, the
gate, the losses: ~1,100 extra kernel launches over the naive step on a GPU, ``benchmarks/RESULTS.md``)
become a few fused kernels. The optimiser step and gradient clipping stay eager (the same for every
method).

It compiles as one graph (``tests/adsim/test_adsim_compile.py`` compiles it with ``fullgraph=True``
for the shipped recipes' settings). The one graph break of the eager code, the NaN/inf check of the
features (a host sync), is taken out of the region: the region returns the flag and the wrapper
checks it after the compiled call (:func:`adsim.model.head.check_finite`; the same one sync per step as
eager). The exact sequential gate (``gate_mode="sequential"``) calls a JAX scan through DLPack, which
``torch.compile`` cannot trace: only the batched gate compiles, and ``--compile`` with the sequential
gate is refused. In-place state updates inside the region -- the centroid bank's slot writes under
``no_grad`` and VACA's running ``Delta`` -- are buffer mutations, which AOTAutograd functionalises and
writes back to the same buffers after each call (tested: same centroids and running statistics as
eager after every step).

Modes (:data:`MODES`): ``"default"`` -- inductor's default (fused kernels); ``"reduce-overhead"`` --
inductor plus CUDA graphs (the whole compiled forward and backward replayed as two graph launches;
CUDA only). ``"auto"`` (what ``--compile`` alone means) picks ``"reduce-overhead"`` on CUDA and
``"default"`` elsewhere; ``benchmarks/gpu_adsim.py`` measures ``"reduce-overhead"``. Under CUDA graphs
the parameters and buffers are static inputs (fixed addresses, updated in place by the optimiser and
by the region's own buffer writes, which cudagraph trees allow for static inputs); every call marks a
new step (``torch.compiler.cudagraph_mark_step_begin``), and the step's outputs (loss, logged loss
parts) are read before the next call, as :func:`adsim.training.train.train_epoch` does. Shapes are static
(``dynamic=False``): a smaller last batch compiles once more.

Compilation does not change the method: same losses, gradients and centroids as eager up to float
rounding (fused kernels reassociate float32 sums; tested). It is a run setting, not a recipe field,
recorded in ``config.json`` under ``"execution"``; ``--resume`` may change it.
"""
from __future__ import annotations

import warnings

import torch

from adsim.model.head import adapter_bottlenecks, check_finite, finite
from adsim.model.head import features_from_bottlenecks as _score
from adsim.model.objective import objective

MODES = ("auto", "default", "reduce-overhead")
# torch.compile backend of the training step; the tests set "aot_eager" (graph capture and AOTAutograd
# without code generation: inductor's C++ compilation takes minutes on the 2-core CI machine).
BACKEND = "inductor"
_KEYS = ("mask", "has_mask", "label", "pixel_domain")  # the batch entries the objective reads


def resolve_mode(mode: str, device: torch.device) -> str:
    """``"auto"`` -> ``"reduce-overhead"`` on CUDA, else ``"default"``; checks ``mode``."""
    if mode not in MODES:
        raise ValueError(f"compile mode must be one of {MODES}, got {mode!r}")
    if mode == "auto":
        return "reduce-overhead" if device.type == "cuda" else "default"
    if mode == "reduce-overhead" and device.type != "cuda":
        raise ValueError(f"compile mode 'reduce-overhead' uses CUDA graphs and needs a CUDA device, "
                         f"not {device.type}; use --compile default")
    return mode


def check_compatible(cfg, *, trainer=None, world_size: int = 1) -> None:
    """``ValueError`` naming the setting when ``cfg`` cannot train with the compiled step."""
    if trainer is not None:
        raise ValueError(f"--compile covers the adapter head (method naive or match), not method {cfg.method!r}")
    if cfg.method == "match" and cfg.gate_mode != "batched":
        raise ValueError(f"--compile needs gate_mode='batched' (got {cfg.gate_mode!r}): the exact sequential "
                         "gate calls a JAX scan that torch.compile cannot trace; pass --gate-mode batched "
                         "or drop --compile")
    if world_size > 1:
        raise ValueError(f"--compile is one-process only (world size {world_size}); drop it under torchrun")


def post_trunk_loss(cfg, head, backbone, tokens, batch, grid: int, amp=None, loss_fn=None) -> tuple:
    """The compiled region: trunk tokens ``(B, 1 + N, W)`` -> ``(loss, parts, finite)``.

    Adapters and the later frozen blocks under autocast ``amp`` (``None``: float32), then
    :func:`adsim.model.head._score` without its NaN check and ``loss_fn(cfg, head, feats, batch) -> (loss,
    parts)`` (default :func:`adsim.training.train.objective`); ``finite`` is :func:`adsim.model.head.finite`."""

    with torch.autocast(tokens.device.type, dtype=amp or torch.float32, enabled=amp is not None):
        mids = adapter_bottlenecks(backbone, head, tokens)
    feats = _score(head, *mids, check=False)
    if loss_fn is None:
        loss, parts = objective(cfg, head, feats, batch, grid)
    else:
        loss, parts = loss_fn(cfg, head, feats, batch)
    return loss, parts, finite(feats)


def compiled_loss(cfg, head, backbone, grid: int, amp=None, *, mode: str = "default", backend: str | None = None,
                  fullgraph: bool = False, loss_fn=None):
    """``step(cfg, head, tokens, batch) -> (loss, parts)``: :func:`post_trunk_loss` compiled once for
    this ``head`` and ``backbone`` (the ``loss_fn`` argument of :func:`adsim.training.train.train_epoch`, with
    ``forward`` = the frozen trunk). ``mode`` as :func:`resolve_mode` has resolved it; ``backend``:
    default :data:`BACKEND` (``"inductor"``), or e.g. ``"aot_eager"`` (graph capture and AOTAutograd
    without code generation) or a backend callable; ``fullgraph=True`` raises on any graph break
    (tests). Raises ``ValueError`` on NaN/inf features, as the eager step does."""
    if mode not in MODES[1:]:
        raise ValueError(f"compile mode must be one of {MODES[1:]} here (resolve 'auto' first), got {mode!r}")
    backend = backend or BACKEND
    if mode != "default" and backend != "inductor":
        raise ValueError(f"compile mode {mode!r} needs the inductor backend, got backend {backend!r}")

    def region(tokens, batch):
        return post_trunk_loss(cfg, head, backbone, tokens, batch, grid, amp, loss_fn)

    # a code object of its own: dynamo keeps compiled graphs, and counts recompilations against its
    # limit (8), per code object, so the steps built for other configs in this process do not count
    region.__code__ = region.__code__.replace()
    compiled = torch.compile(region, backend=backend, mode=None if mode == "default" else mode,
                             fullgraph=fullgraph, dynamic=False)
    graphs = mode == "reduce-overhead"

    def step(cfg_, head_, tokens, batch):
        if cfg_ is not cfg or head_ is not head:
            raise ValueError("compiled_loss: a compiled step serves the config and head it was built for")
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        with warnings.catch_warnings():
            # poolsim.core.namespace -> array_api_compat's lru_cache'd type -> namespace lookup: dynamo
            # warns that it traces through the cache; the lookup is a pure function of the type
            warnings.filterwarnings("ignore", message="Dynamo detected a call to a `functools.lru_cache`",
                                    category=UserWarning)
            loss, parts, ok = compiled(tokens, {k: batch[k] for k in _KEYS if k in batch})
        check_finite(ok)
        return loss, parts
    return step
