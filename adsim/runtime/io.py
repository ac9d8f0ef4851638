"""Run-folder files: JSON and torch checkpoints written atomically (``poolsim.io.atomic_write``), read back
with one-line errors, and the writability check every command makes before it starts work.

Checkpoints are read with torch's weights-only unpickler: tensors, numbers, strings, ``None`` and plain
containers, nothing else -- a checkpoint whose unpickling would call any other Python object (the way a
pickle runs code) is refused before anything in it runs (:class:`UnsafeCheckpointError`). Checkpoints
are written so that they satisfy it (:func:`plain`). Run folders of earlier versions that hold NumPy
scalars or arrays are converted by :func:`convert_checkpoint` (``python -m adsim convert-run RUN``),
which allows NumPy's array and scalar constructors and nothing else.
"""
from __future__ import annotations

import importlib
import io
import json
import pickle
import re
from pathlib import Path

import numpy as np
import torch

from poolsim.io import atomic_write


def write_json(path, obj) -> Path:
    """Write ``obj`` as indented, key-sorted JSON to ``path`` atomically; returns the path."""
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


def cell_done(path) -> bool:
    """Whether ``path`` is a finished grid cell (``table`` / ``protocol``): a JSON object with its ``key``.
    Cell files are written atomically, so anything else there (a truncated copy, a stray file) counts as
    missing and is computed again."""
    path = Path(path)
    try:
        return path.is_file() and "key" in read_json(path)
    except ValueError:
        return False


class UnsafeCheckpointError(ValueError):
    """A checkpoint holds Python objects besides tensors, numbers, strings and plain containers."""


# What torch's weights-only unpickler must additionally allow to read NumPy scalars and arrays, which
# earlier adsim versions could leave in a checkpoint's history; :func:`convert_checkpoint` only.
NUMPY_GLOBALS = ("numpy.ndarray", "numpy.dtype", "numpy._core.multiarray._reconstruct",
                 "numpy._core.multiarray.scalar", "numpy.core.multiarray._reconstruct",
                 "numpy.core.multiarray.scalar")


def plain(obj, where: str = "checkpoint"):
    """``obj`` with NumPy scalars as Python numbers and NumPy arrays as tensors; ``TypeError`` naming
    the entry for anything that is not a tensor, number, string, ``None`` or a dict/list/tuple of them."""
    if isinstance(obj, np.generic):  # before float: np.float64 is a float subclass
        return obj.item()
    if isinstance(obj, (torch.Tensor, str, bool, int, float, type(None))):
        return obj
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(obj))
    if isinstance(obj, dict):
        return {k: plain(v, f"{where}[{k!r}]") for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(plain(v, f"{where}[{i}]") for i, v in enumerate(obj))
    raise TypeError(f"{where} is a {type(obj).__module__}.{type(obj).__qualname__}: a checkpoint holds only "
                    f"tensors, numbers, strings, None and dicts/lists/tuples of them")


def save_torch(path, obj) -> Path:
    """Write ``obj`` (made :func:`plain`) with ``torch.save``, atomically. The file is serialised in memory
    first: torch's zip writer turns a failed write into an unrelated ``RuntimeError`` ("unexpected
    pos"), while a plain write of the bytes gives the ``OSError`` that says why (a full disk: ENOSPC)."""
    obj = plain(obj, str(path))
    buf = io.BytesIO()
    torch.save(obj, buf)
    return atomic_write(path, lambda fh: fh.write(buf.getbuffer()))


# how torch's refusal names the object it would have had to build
_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")
_CLASS = re.compile(r"but got <class '([\w.]+)'>")


def _unsafe_globals(path) -> list:
    try:
        return list(torch.serialization.get_unsafe_globals_in_checkpoint(path))
    except Exception:  # noqa: BLE001 -- not a zip checkpoint: the load itself reports what is wrong
        return []


def _read(path, map_location, allowed=()):
    try:
        with torch.serialization.safe_globals(list(allowed)):  # nothing beyond torch's own list by default
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        text = str(err)
        named = _GLOBAL.findall(text) + _CLASS.findall(text)
        found = _unsafe_globals(path) or named
        if "Weights only load failed" not in text or not found:  # not refused for an object: damaged
            detail = text.split("WeightsUnpickler error:")[-1].strip().splitlines()
            raise ValueError(f"checkpoint {path} is corrupt or not a torch file (UnpicklingError: "
                             f"{detail[0] if detail else ''})") from None
        raise UnsafeCheckpointError(
            f"checkpoint {path} holds {', '.join(found)} besides tensors, numbers, strings and plain "
            f"containers: refused, nothing in it was run (a run folder of an earlier adsim version that you "
            f"trust: python -m adsim convert-run RUN)") from None
    except Exception as err:  # torch raises RuntimeError, EOFError, ... for a bad file
        raise ValueError(f"checkpoint {path} is corrupt or not a torch file ({type(err).__name__}: "
                         f"{str(err).splitlines()[0] if str(err) else ''})") from None


def load_torch(path, *, map_location=None) -> dict:
    """A checkpoint dict written by :func:`save_torch`, read with torch's weights-only unpickler.
    An unreadable file -> ``ValueError`` naming it; one holding any other Python object ->
    :class:`UnsafeCheckpointError` naming what it holds (nothing in it is run)."""
    obj = _read(path, map_location)
    if not isinstance(obj, dict):
        raise ValueError(f"checkpoint {path} is corrupt (expected a dict, got {type(obj).__name__})")
    return obj


def convert_checkpoint(path) -> str:
    """Rewrite ``path`` in place (atomically) so that :func:`load_torch` reads it: NumPy scalars and
    arrays become Python numbers and tensors. Only NumPy's constructors are allowed while reading, so a
    checkpoint holding anything else is refused (:class:`UnsafeCheckpointError`) and left as it is.
    Returns what was done, in words."""
    try:
        load_torch(path)
        return f"{path}: already plain, unchanged"
    except UnsafeCheckpointError:
        pass
    found = _unsafe_globals(path)
    other = [g for g in found if g not in NUMPY_GLOBALS and not g.startswith("numpy.dtypes.")]
    if other:
        raise UnsafeCheckpointError(f"checkpoint {path} holds {', '.join(other)}: not a NumPy value, not "
                                    f"converted -- do not load this file")
    allowed = []
    for name in found:
        module, _, attr = name.rpartition(".")
        try:
            allowed.append(getattr(importlib.import_module(module), attr))
        except (ImportError, AttributeError):
            continue  # the other spelling of NumPy's private module path
    # the dtype classes of NumPy's numeric scalars, which the unpickler builds after the constructors
    allowed += [type(np.dtype(code)) for code in "?bhilqBHILQefdgFDG"]
    obj = _read(path, "cpu", allowed)
    save_torch(path, obj)
    return f"{path}: converted ({', '.join(found)} -> plain numbers and tensors)"
