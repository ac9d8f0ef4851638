"""The compiled training step (``python -m adsim train --compile [MODE]``; on by default on CUDA):
``torch.compile`` of everything after the frozen trunk, forward and backward, with an eager fallback.

Boundary. The frozen trunk (blocks ``0 .. spec.adapter_layers[0]``, :func:`adsim.model.head.trunk_tokens`,
or the tokens of ``--trunk-cache``) stays eager. The adapter head (methods naive and match) compiles as
TWO regions, each one graph:

1. :func:`features_region`: the adapters with the later frozen blocks between them
   (:func:`adsim.model.head.adapter_bottlenecks`, under the run's autocast), VACA and text scoring
   (:func:`adsim.model.head.features_from_bottlenecks`), the matching gate with its centroid update and
   ``L_intra``/``L_inter`` (:func:`adsim.model.objective.head_terms`), and the NaN/inf flag of the logits;
2. :func:`adsim.model.objective.total_loss`: the patch logits upsampled to the masks (as two matrix
   products), Dice/Focal/BCE and the weighted sum.

The split keeps the pixel losses out of the kernels that reduce the features: in one region inductor
fused the upsampling gather, BCE, focal, Dice and the NaN check into one persistent-reduction Triton
kernel that Triton failed to compile on an H100 (``make_ttgir``); as two regions, with the upsampling a
matrix product, each reduction kernel reads one kind of tensor. A method with its own trainer
(``adsim.methods.registry.Trainer``, e.g. anomalyclip) compiles its ``forward`` (frozen towers
included) and its ``loss`` as two regions in the same way (:func:`compiled_trainer`). AOTAutograd
compiles each region's backward; the optimiser step and gradient clipping stay eager.

The NaN/inf check of the features (a host sync, a graph break in eager code) is taken out of the
region: the region returns the flag and the wrapper checks it after the call (the same one sync per step
as eager). The exact sequential gate (``gate_mode="sequential"``: a hand-launched Triton kernel or a JAX
scan) takes its decisions in one opaque operator, ``torch.ops.adsim.gate_decisions``, which the graph
records as one node: with the EMA update region 1 stays one graph (inductor calls the operator as an
external kernel; under CUDA graphs the Triton launch is captured with the rest). With slerp (a host read
of the steps to replay) or the JAX scan on a GPU (its own streams) the gate runs eagerly between compiled
graphs (:func:`adsim.runtime.outside_graphs`; :func:`adsim.model.matching.traced_gate` decides), so
region 1 is then several graphs. In-place state
updates inside a region -- the centroid bank's slot writes under ``no_grad`` and VACA's running
``Delta`` -- are buffer mutations, which AOTAutograd functionalises and writes back to the same buffers
after each call (tested: same centroids and running statistics as eager after every step).

Fallback. Compilation happens at a region's first call for a shape, and the backward is compiled then
too (``force_non_lazy_backward_lowering``), so a compiler failure surfaces in that call, before the
region's graph ran. Any exception there switches the whole step to eager for the rest of the process,
with ONE warning line (:class:`CompileFallbackWarning`; the CLI prints it as ``warning: ...``), and the
call is redone eagerly: a run never dies of a compiler bug. Where region 1 may have graph breaks (the
sequential gate), the head's buffers are saved before each call and restored before the eager redo.
``fell_back`` of the step says whether it happened; ``train`` records it in ``config.json``.

Modes (:data:`MODES`): ``"default"`` -- inductor's default (fused kernels); ``"reduce-overhead"`` --
inductor plus CUDA graphs (each compiled region's forward and backward replayed as graph launches;
CUDA only). ``"auto"`` (what ``--compile`` alone means) picks ``"reduce-overhead"`` on CUDA and
``"default"`` elsewhere. Without ``--compile`` the run takes :data:`DEFAULT` (``"cuda"``):
``"reduce-overhead"`` on a CUDA device in one process, eager on the CPU and under torchrun;
``--compile off`` is eager everywhere. Why on by default on CUDA: eagerly the matching+VACA step is
launch-bound (~1,100 more small kernels than the naive step: 1.39x the naive step on an H100 at B=16,
``benchmarks/RESULTS.md``), which the compiled regions remove; ``benchmarks/gpu_adsim.py`` measures
both modes. Under CUDA graphs the parameters and buffers are static inputs (fixed addresses, updated in
place by the optimiser and by the region's own buffer writes, which cudagraph trees allow for static
inputs); every call marks a new step (``torch.compiler.cudagraph_mark_step_begin``), and the step's
outputs (loss, logged loss parts) are read before the next call, as
:func:`adsim.training.train.train_epoch` does. Shapes are static (``dynamic=False``): a smaller last
batch compiles once more.

Compilation does not change the method: same losses, gradients and centroids as eager up to float
rounding (fused kernels reassociate float32 sums; tested with AOTAutograd and with inductor's CPU code).
It is a run setting, not a recipe field, recorded in ``config.json`` under ``"execution"``; ``--resume``
may change it.
"""
from __future__ import annotations

import warnings
from typing import Protocol, cast

import torch

from adsim.model.head import adapter_bottlenecks, check_finite, features_from_bottlenecks, finite
from adsim.model.objective import head_terms, total_loss
from adsim.runtime import compile_cache

MODES = ("auto", "default", "reduce-overhead")
# what ``train(compile_mode=...)`` and ``--compile`` accept: a mode, "cuda" (reduce-overhead on a CUDA device in
# one process, else eager) or "off" (eager, the default: compiling one ViT-L step costs 37-57 s on an H200 and
# pays back after ~1,900-2,200 steps, several epochs of a BMAD training set at B = 16; docs/compile.md)
CHOICES = (*MODES, "cuda", "off")
DEFAULT = "off"
# torch.compile backend of the training step; the AOTAutograd tests set "aot_eager" (graph capture and
# AOTAutograd without code generation), the inductor tests keep it
BACKEND = "inductor"
_KEYS = ("mask", "has_mask", "label", "pixel_domain", "domain")  # the batch entries the objective reads


class CompileFallbackWarning(UserWarning):
    """``torch.compile`` failed: the step runs eagerly from then on (one warning per step object)."""


def resolve_mode(mode: str | None, device: torch.device, *, world_size: int = 1) -> str | None:
    """The mode the step compiles with, or ``None`` for eager: ``None``/``"off"`` -> eager; ``"cuda"``
    -> ``"reduce-overhead"`` on a CUDA device in one process, else eager; ``"auto"`` ->
    ``"reduce-overhead"`` on CUDA, else ``"default"``; checks ``mode``."""
    if mode is None or mode == "off":
        return None
    if mode not in CHOICES:
        raise ValueError(f"compile mode must be one of {CHOICES}, got {mode!r}")
    if mode == "cuda":
        return "reduce-overhead" if device.type == "cuda" and world_size == 1 else None
    if mode == "auto":
        return "reduce-overhead" if device.type == "cuda" else "default"
    if mode == "reduce-overhead" and device.type != "cuda":
        raise ValueError(f"compile mode 'reduce-overhead' uses CUDA graphs and needs a CUDA device, "
                         f"not {device.type}; use --compile default")
    return mode


def check_compatible(cfg, *, world_size: int = 1) -> None:
    """``ValueError`` naming the setting when ``cfg`` cannot train with an explicitly asked compiled step
    (every method and gate compiles; the data-parallel step does not)."""
    if world_size > 1:
        raise ValueError(f"--compile is one-process only (world size {world_size}); drop it under torchrun")


def features_region(cfg, head, backbone, tokens, batch, grid: int, amp=None) -> tuple:
    """Region 1 of the head's step: trunk tokens ``(B, 1 + N, W)`` -> ``(*head_terms, finite)``.

    The adapters and the later frozen blocks under autocast ``amp`` (``None``: float32), then
    :func:`adsim.model.head.features_from_bottlenecks` without its NaN check, then
    :func:`adsim.model.objective.head_terms` (matching and centroid update); ``finite`` is
    :func:`adsim.model.head.finite`."""
    with torch.autocast(tokens.device.type, dtype=amp or torch.float32, enabled=amp is not None):
        mids = adapter_bottlenecks(backbone, head, tokens)
    feats = features_from_bottlenecks(head, *mids, check=False)
    return (*head_terms(cfg, head, feats, batch, grid), finite(feats))


def post_trunk_loss(cfg, head, backbone, tokens, batch, grid: int, amp=None, loss_fn=None) -> tuple:
    """The whole post-trunk step eagerly, ``(loss, parts, finite)``: :func:`features_region` and
    :func:`adsim.model.objective.total_loss` (= :func:`adsim.model.objective.objective`), or with
    ``loss_fn(cfg, head, feats, batch) -> (loss, parts)`` that loss on the features instead."""
    if loss_fn is None:
        seg_logits, image_logits, var, intra, inter, keep, ok = features_region(cfg, head, backbone, tokens, batch,
                                                                                 grid, amp)
        return (*total_loss(cfg, seg_logits, image_logits, var, intra, inter, keep, batch, grid), ok)
    with torch.autocast(tokens.device.type, dtype=amp or torch.float32, enabled=amp is not None):
        mids = adapter_bottlenecks(backbone, head, tokens)
    feats = features_from_bottlenecks(head, *mids, check=False)
    return (*loss_fn(cfg, head, feats, batch), finite(feats))


def _first_line(err: BaseException) -> str:
    """``"Type: first line"`` of the innermost cause of ``err`` (dynamo wraps a backend's error in
    ``BackendCompilerFailed``), at most 300 characters."""
    seen = {id(err)}
    while True:
        inner = getattr(err, "inner_exception", None) or err.__cause__
        if inner is None or id(inner) in seen:
            break
        seen.add(id(inner))
        err = inner
    first = next((ln.strip() for ln in str(err).splitlines() if ln.strip()), "")
    return f"{type(err).__name__}: {first}"[:300]


class _LossStep(Protocol):
    """What :func:`compiled_loss` returns: ``step(cfg, head, tokens, batch) -> (loss, parts)`` with its
    compiled regions as ``step.regions``."""

    regions: _Regions

    def __call__(self, cfg, head, tokens, batch) -> tuple: ...


class _Regions:
    """Compiled callables with one eager fallback shared by all of them (:class:`CompileFallbackWarning`)."""

    def __init__(self, mode: str, backend, fullgraph: bool, restore=None):
        if mode not in MODES[1:]:
            raise ValueError(f"compile mode must be one of {MODES[1:]} here (resolve 'auto' first), got {mode!r}")
        backend = backend or BACKEND
        if mode != "default" and backend != "inductor":
            raise ValueError(f"compile mode {mode!r} needs the inductor backend, got backend {backend!r}")
        self.mode, self.backend, self.fullgraph = mode, backend, fullgraph
        self.graphs = mode == "reduce-overhead"
        self.fell_back = False
        self.restore = restore  # module whose buffers are restored before an eager redo (graph breaks)

    def compile(self, fn):
        compile_cache.configure()  # generated code cached per user: a second process loads it
        # a code object of its own: dynamo keeps compiled graphs, and counts recompilations against its
        # limit (8), per code object, so the regions built for other configs in this process do not count
        def region(*args):
            return fn(*args)
        region.__code__ = region.__code__.replace()
        return torch.compile(region, backend=self.backend, mode=None if self.mode == "default" else self.mode,
                             fullgraph=self.fullgraph, dynamic=False)

    def call(self, compiled, eager, *args):
        """``compiled(*args)``, or ``eager(*args)`` once anything compiled has failed (then: one warning)."""
        if self.fell_back:
            return eager(*args)
        saved = None if self.restore is None else [b.detach().clone() for b in self.restore.buffers()]
        try:
            with warnings.catch_warnings(), torch._functorch.config.patch(force_non_lazy_backward_lowering=True):
                # poolsim.core.namespace -> array_api_compat's lru_cache'd type -> namespace lookup: dynamo
                # warns that it traces through the cache; the lookup is a pure function of the type
                warnings.filterwarnings("ignore", message="Dynamo detected a call to a `functools.lru_cache`",
                                        category=UserWarning)
                # dynamo reads ``.grad`` of every tensor input while tracing, and region 2's inputs are
                # region 1's outputs (non-leaf tensors, whose ``.grad`` torch warns about)
                warnings.filterwarnings("ignore", message="The .grad attribute of a Tensor that is not a leaf",
                                        category=UserWarning)
                return compiled(*args)
        except Exception as err:  # noqa: BLE001 - any compiler failure: the step goes on eagerly
            self.fell_back = True
            warnings.warn(f"torch.compile failed ({_first_line(err)}); the training step "
                          "runs eagerly from here on (same results, more kernel launches)",
                          CompileFallbackWarning, stacklevel=3)
        if saved is not None:
            with torch.no_grad():
                for b, s in zip(self.restore.buffers(), saved):
                    b.copy_(s)
        return eager(*args)

    def mark_step(self):
        if self.graphs and not self.fell_back:
            torch.compiler.cudagraph_mark_step_begin()


def compiled_loss(cfg, head, backbone, grid: int, amp=None, *, mode: str = "default", backend=None,
                  fullgraph: bool = False, loss_fn=None):
    """``step(cfg, head, tokens, batch) -> (loss, parts)``: the head's post-trunk step compiled for this
    ``head`` and ``backbone`` as the two regions of the module docstring (the ``loss_fn`` argument of
    :func:`adsim.training.train.train_epoch`, with ``forward`` = the frozen trunk); with ``loss_fn(cfg,
    head, feats, batch)`` one region, the features and that loss. ``mode`` as :func:`resolve_mode` has
    resolved it; ``backend``: default :data:`BACKEND` (``"inductor"``), or e.g. ``"aot_eager"`` or a
    backend callable; ``fullgraph=True`` raises on any graph break (tests; not where the sequential
    gate runs between graphs: slerp, or the JAX scan on a GPU). Raises ``ValueError`` on NaN/inf features, as the eager step
    does. ``step.fell_back``: whether compilation failed and the step runs eagerly."""
    sequential = getattr(head, "centroids", None) is not None and head.centroids.mode == "sequential"
    regions = _Regions(mode, backend, fullgraph, restore=head if sequential else None)
    if loss_fn is None:
        def first(tokens, batch):
            return features_region(cfg, head, backbone, tokens, batch, grid, amp)

        def second(terms, batch):
            return total_loss(cfg, *terms, batch, grid)
        first_c, second_c = regions.compile(first), regions.compile(second)
    else:
        def first(tokens, batch):
            return post_trunk_loss(cfg, head, backbone, tokens, batch, grid, amp, loss_fn)
        first_c = regions.compile(first)

    def step(cfg_, head_, tokens, batch):
        if cfg_ is not cfg or head_ is not head:
            raise ValueError("compiled_loss: a compiled step serves the config and head it was built for")
        regions.mark_step()
        batch = {k: batch[k] for k in _KEYS if k in batch}
        if loss_fn is None:
            *terms, ok = regions.call(first_c, first, tokens, batch)
            loss, parts = regions.call(second_c, second, tuple(terms), batch)
        else:
            loss, parts, ok = regions.call(first_c, first, tokens, batch)
        check_finite(ok)
        return loss, parts
    compiled = cast(_LossStep, step)  # a function takes attributes: the step carries its regions
    compiled.regions = regions
    return compiled


def compiled_trainer(cfg, trainer, module, backbone, *, mode: str = "default", backend=None,
                     fullgraph: bool = False) -> tuple:
    """``(forward(images) -> out, loss_fn(cfg, module, out, batch) -> (loss, parts), regions)``: a
    method's :class:`adsim.methods.registry.Trainer` compiled as two regions (its ``forward``, run under
    the caller's autocast, and its ``loss``) with the shared eager fallback of :func:`compiled_loss`."""
    regions = _Regions(mode, backend, fullgraph)

    def forward_eager(images):
        return trainer.forward(module, backbone, images)

    def loss_eager(batch, out):
        return trainer.loss(cfg, module, out, batch)
    forward_c, loss_c = regions.compile(forward_eager), regions.compile(loss_eager)

    def forward(images):
        regions.mark_step()
        return regions.call(forward_c, forward_eager, images)

    def loss_fn(cfg_, module_, out, batch):
        if cfg_ is not cfg or module_ is not module:
            raise ValueError("compiled_trainer: a compiled step serves the config and module it was built for")
        return regions.call(loss_c, loss_eager, {k: batch[k] for k in _KEYS if k in batch}, out)
    return forward, loss_fn, regions
