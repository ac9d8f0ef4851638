"""Checks on output folders made before a command starts work (standard library only: the CLI runs them
before it loads torch)."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


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
