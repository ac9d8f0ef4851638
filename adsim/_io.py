"""Atomic writes (temp file in the same folder, then ``os.replace``) and device/precision choice."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch

PRECISIONS = ("auto", "fp32", "bf16", "fp16")


def _atomic(path, write) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        mask = os.umask(0o022)  # mkstemp creates 0600; outputs get the usual 0666 & ~umask
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def write_json(path, obj) -> Path:
    return _atomic(path, lambda fh: fh.write(json.dumps(obj, indent=2, sort_keys=True).encode()))


def read_json(path) -> dict:
    """The JSON object in ``path``; a corrupt or non-object file -> ``ValueError`` naming the file."""
    try:
        with open(path) as fh:
            obj = json.load(fh)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is corrupt (not valid JSON: {err})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{path} is corrupt (expected a JSON object, got {type(obj).__name__})")
    return obj


def save_torch(path, obj) -> Path:
    return _atomic(path, lambda fh: torch.save(obj, fh))


def load_torch(path, *, map_location=None) -> dict:
    """A checkpoint dict written by :func:`save_torch`; an unreadable file -> ``ValueError`` naming it."""
    try:
        obj = torch.load(path, map_location=map_location, weights_only=False)
    except Exception as err:  # torch raises RuntimeError, UnpicklingError, EOFError, ... for a bad file
        raise ValueError(f"checkpoint {path} is corrupt or not a torch file ({type(err).__name__}: "
                         f"{str(err).splitlines()[0] if str(err) else ''})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"checkpoint {path} is corrupt (expected a dict, got {type(obj).__name__})")
    return obj


def check_writable(folder, what: str = "--out") -> Path:
    """Prove before any work that ``folder`` can be written (a temp file in it, or -- when it does not
    exist yet -- in its nearest existing ancestor, so nothing is left behind); ``ValueError`` naming the
    option and the folder otherwise."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{what} {folder} exists and is not a folder")
    probe = folder
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise ValueError(f"{what} {folder} is not writable ({probe} is a file, not a folder)")
    try:
        fd, tmp = tempfile.mkstemp(dir=probe, prefix=".write-test.")
        os.close(fd)
        os.unlink(tmp)
    except OSError as err:
        raise ValueError(f"{what} {folder} is not writable ({err.strerror or err})") from None
    return folder


def resolve_device(device: str) -> torch.device:
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
