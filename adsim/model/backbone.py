"""Frozen CLIP backbone through open_clip's own API, plus the tiny test configuration.

``build_backbone(name, ...)`` returns a :class:`Backbone` (the open_clip model, its tokenizer and a
:class:`BackboneSpec` describing the patch grid and the adapter positions). Weights come from a
*local* file only (``checkpoint=PATH``, read by :func:`read_checkpoint`: an open_clip / PyTorch state
dict, a ``.safetensors`` file, or an OpenAI TorchScript archive such as ``ViT-L-14-336px.pt`` as OpenAI
distributes it; open_clip's ``resize_pos_embed`` adapts the position embeddings when the image size
differs from the checkpoint's); with ``checkpoint=None`` the weights are random and a loud
:class:`RandomWeightsWarning` says that any AUC computed with them is meaningless. Nothing here
downloads anything.

``adsim-tiny`` (4 blocks, width 64, 8 px patches, 64 px images; ``model_configs/adsim-tiny.json``) is
registered with ``open_clip.add_model_config`` so that the tests run the real open_clip code on CPU.
"""
from __future__ import annotations

import contextlib
import logging
import os
import warnings
import zipfile
from pathlib import Path
from typing import NamedTuple

import torch

from adsim.config.choices import BACKBONES, TINY

_CONFIG_DIR = Path(__file__).with_name("model_configs")
# The largest patch grid accepted: attention memory grows with the fourth power of the side, and 64 x 64
# patches (896 px for ViT-L-14) is already ~13x the 238 px default of ViT-L-14-336 in tokens.
MAX_GRID = 64


class RandomWeightsWarning(UserWarning):
    """The backbone has random weights: detection AUCs computed with it are meaningless."""


class BackboneSpec(NamedTuple):
    """A backbone's geometry: input ``image_size`` and ``patch_size`` (pixels), ``grid`` patches per side,
    transformer ``width``, joint image-text ``embed_dim``, ``layers`` blocks, the blocks after which
    adapters sit, and whether pretrained weights were loaded."""
    name: str
    image_size: int
    patch_size: int
    grid: int              # patches per side; N = grid ** 2 tokens per image
    width: int             # transformer width (adapter input)
    embed_dim: int         # joint image-text space (adapter bottleneck, text embeddings)
    layers: int
    adapter_layers: tuple  # 0-based block indices after which adapters sit
    pretrained: bool


class Backbone(NamedTuple):
    """A frozen open_clip model in eval mode, its tokenizer and its :class:`BackboneSpec`."""
    model: torch.nn.Module  # open_clip CLIP, frozen, eval mode
    tokenizer: object
    spec: BackboneSpec


class _DropNoPretrainedNotice(logging.Filter):
    """Drops open_clip's "No pretrained weights loaded for model ..." record (any other passes)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("No pretrained weights loaded for model")


@contextlib.contextmanager
def _open_clip_quietly():
    """Around open_clip's model and tokenizer factories: its notice dropped, the caller's logging kept.

    ``open_clip.create_model(pretrained=None)`` logs "No pretrained weights loaded ... initialized
    randomly" with ``logging.warning`` on the root logger -- also when a checkpoint is loaded right after,
    and where weights are random :class:`RandomWeightsWarning` already says so. A filter on the emitting
    (root) logger drops that one record for the duration of the call. open_clip's module-level
    ``logging.info``/``logging.warning`` calls also install a stderr handler on a root logger that has
    none (``logging.basicConfig``); that handler is removed again so that the caller's logging set-up is
    as it was.
    """
    root, drop = logging.getLogger(), _DropNoPretrainedNotice()
    handlers = list(root.handlers)
    root.addFilter(drop)
    try:
        yield
    finally:
        root.removeFilter(drop)
        if not handlers:
            for handler in [h for h in root.handlers if h not in handlers]:
                root.removeHandler(handler)


def _register_tiny() -> None:
    import open_clip  # on first use: it loads torchvision and timm (seconds), which only a backbone needs

    if TINY not in open_clip.list_models():
        open_clip.add_model_config(_CONFIG_DIR / f"{TINY}.json")


def adapter_layers(depth: int) -> tuple:
    """Blocks after which adapters sit: the ends of the four quarters of the stack.

    ViT-L (24 blocks) -> (5, 11, 17, 23), i.e. blocks 6, 12, 18, 24 as in the reference set-up;
    12 blocks -> (2, 5, 8, 11); the 4-block tiny model -> (0, 1, 2, 3).
    """
    if depth < 4:
        raise ValueError(f"backbone depth must be >= 4 blocks for four adapter layers, got {depth}")
    return tuple(round(depth * k / 4) - 1 for k in range(1, 5))


def build_backbone(name: str = "ViT-L-14-336", *, image_size: int | None = None,
                   checkpoint: str | None = None, quick_gelu: bool = True, seed: int = 0,
                   device: str | torch.device = "cpu") -> Backbone:
    """Create the frozen open_clip model.

    ``quick_gelu``: the MLP activation of both towers, set either way (passed to open_clip as a model keyword,
    which overrides the model config's ``quick_gelu``, e.g. ``adsim-tiny``'s ``true``; open_clip's
    ``force_quick_gelu`` can only turn it on). ``True`` (default): QuickGELU, the activation
    the OpenAI weights were trained with; ``False``: exact ``nn.GELU``, what a reference that builds
    ``CLIP(**model_cfg)`` from open_clip's ``ViT-L-14-336`` config runs (the recipe field ``quick_gelu``).
    ``seed`` fixes the random initialisation (so a run with random weights is rebuilt identically at
    evaluation time). Raises ``ValueError`` for an unknown name, an image size that is not a positive
    multiple of the patch size (or above :data:`MAX_GRID` patches per side), a missing checkpoint file or a checkpoint of another architecture.
    """
    if name not in BACKBONES:
        raise ValueError(f"backbone must be one of {tuple(BACKBONES)}, got {name!r}")
    _register_tiny()
    import open_clip

    cfg_name, default_size = BACKBONES[name]
    size = default_size if image_size is None else image_size
    patch = open_clip.get_model_config(cfg_name)["vision_cfg"]["patch_size"]
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0 or size % patch \
            or size > MAX_GRID * patch:
        raise ValueError(f"image_size must be a positive multiple of the patch size {patch} of {name} and at "
                         f"most {MAX_GRID * patch} ({MAX_GRID} patches per side), got {size!r}")
    if checkpoint is not None and not os.path.isfile(checkpoint):
        # checked here so that open_clip never treats the string as a tag to download
        raise ValueError(f"checkpoint file not found: {checkpoint!r}")
    if checkpoint is None:
        warnings.warn(f"backbone {name} has RANDOM weights (no --checkpoint): results are meaningless "
                      "for anomaly-detection AUC; use them only for tests and timing",
                      RandomWeightsWarning, stacklevel=2)
    state = None if checkpoint is None else read_checkpoint(checkpoint)
    torch.manual_seed(seed)
    if not isinstance(quick_gelu, bool):
        raise ValueError(f"quick_gelu must be True or False, got {quick_gelu!r}")
    with _open_clip_quietly():
        model = open_clip.create_model(cfg_name, pretrained=None, force_image_size=size, device="cpu",
                                       quick_gelu=quick_gelu)  # a model kwarg: overrides the config both ways
    if state is not None:
        _load_state(model, state, checkpoint, name)
    model = model.to(device)
    model.eval().requires_grad_(False)
    visual = model.visual
    if not all(hasattr(visual, a) for a in ("transformer", "conv1", "_embeds")):
        raise ValueError(f"backbone {name} is not a plain open_clip VisionTransformer")
    depth = len(visual.transformer.resblocks)
    spec = BackboneSpec(name=name, image_size=size, patch_size=patch, grid=size // patch,
                        width=visual.conv1.out_channels, embed_dim=visual.output_dim, layers=depth,
                        adapter_layers=adapter_layers(depth), pretrained=checkpoint is not None)
    with _open_clip_quietly():
        tokenizer = open_clip.get_tokenizer(cfg_name)
    return Backbone(model, tokenizer, spec)


EXPECTED = ("an open_clip / PyTorch state dict (torch.save of model.state_dict(), optionally under "
            "'state_dict'), a .safetensors file, or an OpenAI TorchScript archive such as ViT-L-14-336px.pt")
_OPENAI_EXTRA = ("input_resolution", "context_length", "vocab_size")  # non-weight entries of OpenAI's archives


def describe_file(path) -> str:
    """A short description of what a file holds, from its first bytes (for error messages)."""
    path = Path(path)
    size = path.stat().st_size
    if size == 0:
        return "an empty file"
    with open(path, "rb") as fh:
        head = fh.read(64)
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as z:
                names = z.namelist()
        except (zipfile.BadZipFile, OSError):
            return f"a damaged zip archive ({size} bytes)"
        if any("/code/" in n for n in names):
            return f"a TorchScript archive ({size} bytes)"
        if any(n.endswith("data.pkl") for n in names):
            return f"a PyTorch zip checkpoint ({size} bytes)"
        return f"a zip archive that is not a PyTorch file ({len(names)} entries, e.g. {names[:3]})"
    if head[:2] == b"PK":
        return f"a truncated or damaged zip archive ({size} bytes; PyTorch checkpoints are zip archives)"
    if head[:1] == b"\x80":
        return f"a Python pickle ({size} bytes; legacy torch.save format)"
    if head[:6] == b"\x93NUMPY":
        return f"a NumPy .npy array ({size} bytes)"
    if head[:2] == b"\x1f\x8b":
        return f"a gzip file ({size} bytes)"
    if len(head) > 8 and head[8:9] == b"{":
        return f"a safetensors file ({size} bytes)"
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return f"an unrecognised binary file ({size} bytes, starts with {head[:8]!r})"
    return f"a text file ({size} bytes, starts with {text[:30]!r})"


def read_checkpoint(path) -> dict:
    """The weights in ``path`` as an open_clip-layout state dict (``{name: tensor}``, floats as float32:
    OpenAI's archives are fp16, which CPU interpolation of position embeddings does not support).

    Accepts an open_clip / PyTorch state dict (a ``module.`` prefix from DataParallel is stripped, a
    ``{"state_dict": ...}`` wrapper is unwrapped), a ``.safetensors`` file, and OpenAI's TorchScript
    archives (``torch.jit.load(map_location="cpu").state_dict()``; OpenAI's keys *are* open_clip's
    ``CLIP`` keys, plus ``input_resolution``/``context_length``/``vocab_size``, which are dropped, as
    open_clip's own ``load_state_dict`` does). Anything else raises ``ValueError`` naming the file, what
    it is, and what was expected.
    """
    path = str(path)
    what = describe_file(path)
    try:
        if what.startswith("a TorchScript archive"):
            with warnings.catch_warnings():  # torch deprecates TorchScript; OpenAI's files are TorchScript
                warnings.simplefilter("ignore", FutureWarning)
                obj = torch.jit.load(path, map_location="cpu").state_dict()
        elif what.startswith("a safetensors file"):
            from safetensors.torch import load_file

            obj = load_file(path, device="cpu")
        else:
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 -- torch raises many types for unreadable files
        raise ValueError(f"checkpoint {path} cannot be read: it is {what}, expected {EXPECTED} "
                         f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})") from err
    if isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict) or not obj or not all(torch.is_tensor(v) for v in obj.values()):
        kind = (f"a dict with keys {list(obj)[:5]}" if isinstance(obj, dict) else type(obj).__name__)
        raise ValueError(f"checkpoint {path} is {what} holding {kind}, not a state dict of tensors; "
                         f"expected {EXPECTED}")
    state = {k[7:] if k.startswith("module.") else k: v.float() if v.is_floating_point() else v
             for k, v in obj.items()}
    for key in _OPENAI_EXTRA:
        state.pop(key, None)
    return state


def _load_state(model: torch.nn.Module, state: dict, path, name: str) -> None:
    """Strict load of ``state`` into the open_clip ``model`` (position embeddings resized to its grid)."""
    import open_clip

    state = dict(state)
    open_clip.model.resize_pos_embed(state, model)
    if "logit_scale" in state and state["logit_scale"].ndim != model.logit_scale.ndim:
        state["logit_scale"] = state["logit_scale"].reshape(model.logit_scale.shape)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as err:  # missing/unexpected keys, shape mismatch
        lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()][:4]
        raise ValueError(f"checkpoint {path} does not fit backbone {name}: {' '.join(lines)[:600]}") from err


def fingerprint(model: torch.nn.Module) -> float:
    """A weight checksum (sum of all parameters in float64) to verify that evaluation rebuilds the
    very backbone the run was trained with."""
    with torch.no_grad():
        return float(sum(p.detach().double().sum() for p in model.parameters()))


def frozen_tokens(backbone: Backbone, images: torch.Tensor) -> list:
    """Patch tokens ``(B, N, width)`` after each adapter block of the *unadapted* backbone (no grad).

    Used for the frozen-forward benchmark; training runs the interleaved forward in ``head.py``.
    """
    with torch.no_grad():
        out = backbone.model.visual.forward_intermediates(
            images, indices=list(backbone.spec.adapter_layers), stop_early=True,
            intermediates_only=True, output_fmt="NLC")
    return out["image_intermediates"]


@torch.no_grad()
def encode_prompts(backbone: Backbone, prompts: list, device=None) -> torch.Tensor:
    """Unit-norm text embeddings ``(len(prompts), embed_dim)`` from the CLIP text tower."""
    device = device or next(backbone.model.parameters()).device
    tokens = backbone.tokenizer(prompts).to(device)
    return torch.nn.functional.normalize(backbone.model.encode_text(tokens).float(), dim=-1)


def run_blocks(backbone: Backbone, x: torch.Tensor, blocks) -> torch.Tensor:
    """``x: (B, T, W)`` tokens through the frozen transformer ``blocks`` in order (batch-first or not,
    as the open_clip model was built)."""
    batch_first = getattr(backbone.model.visual.transformer, "batch_first", True)
    for blk in blocks:
        x = blk(x) if batch_first else blk(x.transpose(0, 1)).transpose(0, 1)
    return x


def bilinear_weights(grid: int, size: int, *, align_corners: bool = False, device=None,
                     dtype=torch.float32) -> torch.Tensor:
    """``(size, grid)``: row ``i`` holds the weights of bilinear interpolation (one axis) at output pixel
    ``i``, ``max(0, 1 - |s_i - j|)`` at the source coordinate ``s_i`` -- ``(i + 1/2) grid / size - 1/2``
    (``align_corners=False``) or ``i (grid - 1) / (size - 1)`` -- clamped to ``[0, grid - 1]``, as
    ``torch.nn.functional.interpolate`` computes it (two neighbours, ``1 - l`` and ``l``)."""
    i = torch.arange(size, device=device, dtype=torch.float64)
    if align_corners:
        src = i * ((grid - 1) / max(size - 1, 1))
    else:
        src = (i + 0.5) * (grid / size) - 0.5
    src = src.clamp(0.0, grid - 1)
    j = torch.arange(grid, device=device, dtype=torch.float64)
    return (1.0 - (src[:, None] - j[None, :]).abs()).clamp(min=0.0).to(dtype)


def upsample_patches(values: torch.Tensor, grid: int, size: int, *, align_corners: bool = False,
                     matmul: bool = False) -> torch.Tensor:
    """``values: (..., N)`` on the ``grid x grid`` patch grid (``N = grid**2``) -> ``(..., size, size)``,
    bilinear: the one map from patch values to pixels that every method's maps and losses use.

    ``matmul=True``: the same map as two matrix products ``W V W^T`` (:func:`bilinear_weights`; equal to
    float rounding), which the training losses use: its backward is two matrix products where
    ``interpolate``'s scatter-adds, and under ``torch.compile`` it lowers to matrix multiplications
    instead of an index gather fused into the loss's reduction kernel."""
    lead = values.shape[:-1]
    if matmul:
        w = bilinear_weights(grid, size, align_corners=align_corners, device=values.device, dtype=values.dtype)
        up = torch.matmul(torch.matmul(w, values.reshape(-1, grid, grid)), w.t())
        return up.reshape(*lead, size, size)
    up = torch.nn.functional.interpolate(values.reshape(-1, 1, grid, grid), size=(size, size), mode="bilinear",
                                         align_corners=align_corners)
    return up.reshape(*lead, size, size)
