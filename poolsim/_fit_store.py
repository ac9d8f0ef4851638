"""Stored results of deterministic fits (the normalizing-flow fits of :mod:`poolsim.flows`).

A fit is a pure function of its inputs: the data's bytes, the random keys, the hyperparameters, the
code (poolsim's source, JAX/jaxlib and the fitting libraries' versions), the JAX configuration
(``jax_enable_x64``, default dtypes, ...), ``XLA_FLAGS`` and the CPU (its instruction-set flags
change float32 reduction order). The store keeps a fit's output arrays in
``poolsim.io.cache_dir("fits")`` under a sha256 of all of that, written atomically, as
``equinox.tree_serialise_leaves`` writes them; a later process with the same key loads the
arrays instead of fitting again and gets the same bytes. ``POOLSIM_CACHE_DIR=off`` disables it.
An unreadable entry is refitted and replaced (one :class:`poolsim.io.CacheWarning`).
"""
from __future__ import annotations

import hashlib
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from . import _cache, _io, _programs

STORE_KIND = "fits"
_FORMAT = "poolsim-fit 1"


def store_dir() -> Path | None:
    """``poolsim.io.cache_dir("fits")``; ``None`` when ``POOLSIM_CACHE_DIR`` disables caching."""
    return _cache.cache_dir(STORE_KIND)


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "absent"


def key(name: str, parts: dict, arrays: tuple, packages: tuple = ()) -> str:
    """The store key (hex sha256) of the fit ``name``: the process's
    :func:`poolsim._programs.environment` (Python, JAX, jaxlib, backend, ``XLA_FLAGS``, CPU flags,
    poolsim's source), the JAX configuration (:func:`poolsim._programs.jax_flags`), the versions of
    ``packages``, ``parts`` (hyperparameters, by name) and each of ``arrays`` (dtype, shape, bytes)."""
    h = hashlib.sha256()
    for text in (_FORMAT, name, _programs.environment(), repr(_programs.jax_flags()),
                 repr([(p, _version(p)) for p in packages]), repr(sorted(parts.items()))):
        h.update(text.encode() + b"\0")
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape}".encode() + b"\0")
        h.update(a.tobytes())
    return h.hexdigest()


def _path(name: str, digest: str) -> Path | None:
    folder = store_dir()
    return None if folder is None else folder / f"{name}-{digest[:40]}.eqx"


def load(name: str, digest: str, like: Any) -> Any | None:
    """The tree stored under ``digest`` (leaves shaped as ``like``'s), or ``None`` if there is none
    (or the store is off, or the entry cannot be read: then it is fitted and written again)."""
    import equinox as eqx

    path = _path(name, digest)
    if path is None or not path.exists():
        return None
    try:
        with open(path, "rb") as fh:
            if fh.readline() != (_FORMAT + " " + digest + "\n").encode():
                raise ValueError("stored for another key")
            return eqx.tree_deserialise_leaves(fh, like)
    except Exception as exc:  # any damaged entry: fit again and replace it
        _cache.warn_once("fit-read", f"poolsim: the stored fit {path} cannot be used "
                         f"({type(exc).__name__}: {exc}); fitting again", stacklevel=3)
        return None


def save(name: str, digest: str, tree: Any) -> None:
    """Store ``tree`` under ``digest`` (atomically); an unwritable folder warns once."""
    import equinox as eqx

    path = _path(name, digest)
    if path is None:
        return

    def write(fh):
        fh.write((_FORMAT + " " + digest + "\n").encode())
        eqx.tree_serialise_leaves(fh, tree)

    try:
        _io.atomic_write(path, write)
    except OSError as exc:
        _cache.warn_once("fit-write", f"poolsim: the fit store {path.parent} cannot be written "
                         f"({exc.strerror or exc}); fits are not kept. Set {_cache.ENV_VAR} to a "
                         "writable folder, or to 'off'.", stacklevel=3)
