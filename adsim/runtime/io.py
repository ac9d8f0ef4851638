"""Run-folder files: JSON and torch checkpoints written atomically (``poolsim.atomic_write``), read back
with one-line errors, and the writability check every command makes before it starts work."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch

from poolsim import atomic_write


def write_json(path, obj) -> Path:
    return atomic_write(path, lambda fh: fh.write(json.dumps(obj, indent=2, sort_keys=True).encode()))


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
    return atomic_write(path, lambda fh: torch.save(obj, fh))


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
