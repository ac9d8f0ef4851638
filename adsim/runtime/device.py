"""Device and autocast precision: the one place a ``--device`` / ``--precision`` string is resolved."""
from __future__ import annotations

import torch

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
"""What ``--precision`` accepts (``auto``: bf16 autocast on CUDA, fp32 elsewhere)."""


def resolve_device(device: str) -> torch.device:
    """``"auto"`` -> CUDA if available else CPU; any other torch device string as given (``cuda`` without a
    GPU -> ``ValueError``)."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available")
    try:
        return torch.device(device)
    except RuntimeError as err:
        raise ValueError(f"unknown device {device!r}: {err}") from None


def autocast_dtype(precision: str, device: torch.device):
    """``None`` for float32, else the autocast dtype: bf16 on GPU by default, fp32 on CPU."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "auto":
        return torch.bfloat16 if device.type == "cuda" else None
    if precision == "fp16" and device.type != "cuda":
        raise ValueError("precision 'fp16' needs a CUDA device (use fp32 or bf16 on CPU)")
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


def device_name(device: torch.device) -> str:
    """What a run records as its device kind: the GPU's name (``torch.cuda.get_device_name``, e.g.
    ``"NVIDIA H100 80GB HBM3"``) for a CUDA device, else the device type (``"cpu"``)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return device.type
