"""Deep prompts in the frozen open_clip towers: learned tokens that enter the blocks of the visual tower
and learned hidden states that overwrite positions of the text tower, layer by layer. The towers' weights
stay frozen; gradients reach the prompts through them.

* :func:`run_prompted_blocks` -- the visual tower's blocks with ``P`` extra tokens per leading block
  (deep visual prompt tuning): appended after the class and patch tokens before the first block,
  replaced by the next layer's prompts before each following prompted block, and carried unchanged
  through the remaining blocks. The returned tokens never include the prompts.
* :func:`encode_text_deep` -- ``open_clip.CLIP.encode_text`` block by block, with the token embeddings
  optionally replaced and the hidden states at positions ``1 .. t`` overwritten before blocks ``1, 2, ...``;
  positions after the last end-of-text token are not computed (the causal mask keeps them out of the result).

Shapes: ``B`` images, ``T`` tokens, ``W`` visual width, ``S`` text sequences, ``D`` text width, ``E`` joint
embedding dimension.
"""
from __future__ import annotations

import torch
from torch import nn

from adsim.model.backbone import run_blocks
from poolsim import core


def run_prompted_blocks(backbone, x: torch.Tensor, prompts, *, capture=()) -> tuple:
    """``x (B, T, W)`` visual tokens (``visual._embeds``: class + patch tokens after ``ln_pre``) through every
    block of the frozen visual tower with deep prompts. ``prompts``: one tensor per leading block, each
    ``(B, P, W)`` or ``(P, W)`` (shared by the batch): before block 0 ``prompts[0]`` is appended after the
    ``T`` tokens; before block ``i`` (``1 <= i < len(prompts)``) the last ``P`` tokens are replaced by
    ``prompts[i]``; the blocks after that run on the carried prompt tokens as they are.

    Returns ``(tokens after the last block (B, T, W), [tokens after each block of capture (B, T, W)])``, the
    prompt tokens dropped. ``capture``: 0-based block indices, in increasing order. Empty ``prompts``:
    the unmodified tower (:func:`adsim.model.backbone.run_blocks`)."""
    blocks = backbone.model.visual.transformer.resblocks
    if not torch.is_tensor(x) or x.ndim != 3:
        raise ValueError(f"x must be a (B, T, W) tensor, got {tuple(x.shape) if torch.is_tensor(x) else type(x).__name__}")
    b, t, w = x.shape
    prompts = list(prompts)
    if len(prompts) > len(blocks):
        raise ValueError(f"prompts must hold at most one tensor per block ({len(blocks)}), got {len(prompts)}")
    length = None
    for i, p in enumerate(prompts):
        if not torch.is_tensor(p) or p.ndim not in (2, 3) or p.shape[-1] != w \
                or (p.ndim == 3 and p.shape[0] != b) or (length is not None and p.shape[-2] != length):
            shape = tuple(p.shape) if torch.is_tensor(p) else type(p).__name__
            raise ValueError(f"prompts[{i}] must be ({b}, P, {w}) or (P, {w}) with the same P in every layer, "
                             f"got {shape}")
        length = p.shape[-2]
    capture = tuple(capture)
    if any(not 0 <= c < len(blocks) for c in capture) or list(capture) != sorted(set(capture)):
        raise ValueError(f"capture must be increasing block indices in [0, {len(blocks)}), got {capture}")
    captured = []
    for i, block in enumerate(blocks):
        if i < len(prompts):
            p = prompts[i].to(x.dtype)
            p = p.expand(b, -1, -1) if p.ndim == 2 else p
            x = torch.cat([x if i == 0 else x[:, :t], p], dim=1)
        x = run_blocks(backbone, x, (block,))
        if i in capture:
            captured.append(x[:, :t])
    return x[:, :t], captured


def pooled_length(tokens: torch.Tensor) -> int:
    """Positions of ``tokens (S, T)`` that CLIP's end-of-text (``argmax``) pooling can see: up to the last
    end-of-text token, the highest token id (one host read; :func:`encode_text_deep`'s ``length``)."""
    return int(tokens.argmax(-1).max()) + 1


def encode_text_deep(backbone, tokens: torch.Tensor, *, embeds: torch.Tensor | None = None, deep=(),
                     length: int | None = None) -> torch.Tensor:
    """Unit text embeddings ``(S, E)`` of ``tokens (S, T)`` through the frozen text tower, computed as
    ``open_clip.CLIP.encode_text`` does (token embedding, positional embedding, the blocks with the causal
    mask, ``ln_final``, end-of-text pooling, text projection), with two insertions:

    * ``embeds (S, T, D)``: used instead of the tower's token embeddings of ``tokens``;
    * ``deep``: before block ``i`` (``1 <= i <= len(deep)``) the hidden states at positions ``1 .. t`` are
      overwritten by ``deep[i - 1]``, ``(S, t, D)`` or ``(t, D)`` (shared by the sequences).

    Differentiable in ``embeds`` and ``deep``. With the causal mask and end-of-text pooling of CLIP the
    sequences are cut after the last end-of-text token (the same embeddings, fewer positions computed):
    ``length`` = :func:`pooled_length` of ``tokens``, computed once by a caller whose tokens do not change
    (``None``: read from ``tokens`` here, a host sync per call)."""
    model = backbone.model
    blocks = model.transformer.resblocks
    deep = list(deep)
    if len(deep) >= len(blocks):
        raise ValueError(f"deep must hold at most {len(blocks) - 1} tensors (one per block after the first), "
                         f"got {len(deep)}")
    cast = model.transformer.get_cast_dtype()
    x = model.token_embedding(tokens).to(cast) if embeds is None else embeds.to(cast)
    if x.ndim != 3 or tuple(x.shape[:2]) != tuple(tokens.shape):
        raise ValueError(f"embeds must be (S, T, D) = {tuple(tokens.shape)} + (D,), got {tuple(x.shape)}")
    for i, d in enumerate(deep):
        if not torch.is_tensor(d) or d.ndim not in (2, 3) or d.shape[-1] != x.shape[-1] \
                or (d.ndim == 3 and d.shape[0] != x.shape[0]) or not 1 <= d.shape[-2] < x.shape[1]:
            shape = tuple(d.shape) if torch.is_tensor(d) else type(d).__name__
            raise ValueError(f"deep[{i}] must be ({x.shape[0]}, t, {x.shape[-1]}) or (t, {x.shape[-1]}), "
                             f"1 <= t < {x.shape[1]}, got {shape}")
    mask, n = model.attn_mask, x.shape[1]
    if mask is not None and model.text_pool_type == "argmax":
        # causal attention: a position attends only to itself and earlier ones, so the positions after the
        # last end-of-text token (the pooled one) cannot change any pooled output; they are not computed
        n = max(pooled_length(tokens) if length is None else length, 1 + max((d.shape[-2] for d in deep), default=0))
        tokens, x, mask = tokens[:, :n], x[:, :n], mask[:n, :n]
    x = x + model.positional_embedding[:n].to(cast)
    batch_first = getattr(model.transformer, "batch_first", True)
    for i, block in enumerate(blocks):
        if 1 <= i <= len(deep):
            d = deep[i - 1].to(cast)
            d = d.expand(x.shape[0], -1, -1) if d.ndim == 2 else d
            x = torch.cat([x[:, :1], d, x[:, 1 + d.shape[1]:]], dim=1)
        x = block(x, attn_mask=mask) if batch_first else block(x.transpose(0, 1), attn_mask=mask).transpose(0, 1)
    x = model.ln_final(x)
    from open_clip.transformer import text_global_pool  # the backbone loaded open_clip already

    x = text_global_pool(x, tokens, model.text_pool_type, eos_token_id=getattr(model, "text_eos_id", None))
    if isinstance(model.text_projection, nn.Linear):
        x = model.text_projection(x)
    elif model.text_projection is not None:
        x = x @ model.text_projection
    return core.normalize(x.float())
