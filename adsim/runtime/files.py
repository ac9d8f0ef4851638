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


def os_error_line(err: OSError) -> str:
    """One line for an ``OSError``: why, and which file (e.g. ``No space left on device:
    RUN/checkpoint_last.pt``)."""
    why = err.strerror or str(err) or type(err).__name__
    return f"{why}: {err.filename}" if err.filename else why


def remove_stale_temporaries(folder) -> list:
    """Remove the temporary files ``poolsim.io.atomic_write`` leaves in ``folder`` when its process is killed
    mid-write (``.<name>.<random>.tmp``); returns their paths. Call it only while holding the folder's
    lock (``poolsim.io.folder_lock``): another writer's temporary file would be removed under it."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    gone = []
    for p in folder.iterdir():
        if p.name.startswith(".") and p.name.endswith(".tmp") and p.is_file():
            try:
                p.unlink()
                gone.append(p)
            except OSError:
                continue  # not ours to remove (permissions): it does no harm
    return gone
