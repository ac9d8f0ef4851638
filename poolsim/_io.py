"""Atomic file writes: a temporary file in the destination's folder, then ``os.replace``.

A reader never sees a half-written file, and a crash leaves either the old file or the new one.
Used by ``poolsim.figures``, ``poolsim.audit`` and ``adsim`` (run folders, CSVs, reports).
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable


def file_mode() -> int:
    """The mode a plain ``open(path, "w")`` would give a new file: ``0o666 & ~umask``.

    ``tempfile.mkstemp`` creates files with 0600; outputs get this mode before they are moved in place.
    """
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def atomic_write(path, write: Callable) -> Path:
    """Write ``path`` atomically: ``write(fh)`` fills a binary temporary file beside it, which is
    flushed, fsynced and moved over ``path``. Parent folders are created. Returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, file_mode())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path, text: str) -> Path:
    """:func:`atomic_write` of ``text`` encoded as UTF-8."""
    return atomic_write(path, lambda fh: fh.write(text.encode("utf-8")))
