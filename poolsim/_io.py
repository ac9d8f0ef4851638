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
    flushed, fsynced and moved over ``path``. Parent folders are created. Returns ``path``.

    On failure the temporary file is removed and ``path`` is as it was (absent, or the previous file).
    An ``OSError`` of the write (a full disk, a read-only folder) names ``path``, not the temporary file
    (``err.filename``), so that the error says which output could not be written."""
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, file_mode())
        os.replace(tmp, path)
    except BaseException as err:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(err, OSError) and err.filename in (None, tmp) and err.errno is not None:
            raise OSError(err.errno, err.strerror or str(err), str(path)) from None
        raise
    return path


def atomic_write_text(path, text: str) -> Path:
    """:func:`atomic_write` of ``text`` encoded as UTF-8."""
    return atomic_write(path, lambda fh: fh.write(text.encode("utf-8")))


class FolderBusyError(RuntimeError):
    """Another live process holds the folder's lock (see :func:`folder_lock`). ``holder`` is the text that
    process wrote into the lock file: ``"pid PID on HOST"`` (empty if it had not written it yet)."""

    def __init__(self, folder, holder: str):
        self.folder = Path(folder)
        self.holder = holder
        who = holder or "another process"
        super().__init__(f"{self.folder} is in use by {who}; wait for it to finish or pass --wait")


LOCK_NAME = ".lock"


class folder_lock:
    """Exclusive lock on an output folder: one writer at a time, held for the ``with`` block.

    ``with folder_lock(out): ...`` creates ``out`` if needed and takes an exclusive ``fcntl.flock`` on
    ``out/.lock``; the file then holds ``"pid PID on HOST"``. A second process gets :class:`FolderBusyError`
    naming that holder, or with ``wait=True`` blocks until the holder is done. The kernel drops the lock when
    its holder exits or dies (even by SIGKILL), so a stale lock file from a dead process never blocks. The
    lock is per open file description: taking it twice in one process also refuses, by design.

    A folder the lock created and that holds nothing but the lock file when it is released is removed again,
    so a command refused before it wrote anything leaves no empty output folder behind. A waiter that then
    holds a lock on the removed file notices (the path no longer names its file) and takes the lock anew.

    Written on ``fcntl`` rather than the ``filelock`` package because ``filelock`` opens the lock file with
    ``O_TRUNC`` on every attempt, which would erase the holder's PID and host before the refusal could name
    them. Where ``fcntl`` does not exist (Windows), ``msvcrt.locking`` on the file's first byte is used.
    Not reliable on network file systems without lock support (as any ``flock``).
    """

    def __init__(self, folder, *, wait: bool = False):
        self.folder = Path(folder)
        self.wait = bool(wait)
        self._fd = None
        self._created = False

    def __enter__(self) -> "folder_lock":
        import socket

        while True:
            self._created = not self.folder.exists()
            self.folder.mkdir(parents=True, exist_ok=True)
            path = self.folder / LOCK_NAME
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                _lock_fd(fd, self.wait)
            except BlockingIOError:
                holder = os.pread(fd, 256, 0).decode("utf-8", "replace").strip()
                os.close(fd)
                raise FolderBusyError(self.folder, holder) from None
            except BaseException:
                os.close(fd)
                raise
            try:  # the file locked is still the one at the path (a releasing creator may have removed it)
                if os.stat(path).st_ino == os.fstat(fd).st_ino:
                    break
            except FileNotFoundError:
                pass
            os.close(fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def release(self) -> None:
        """Drop the lock (idempotent). The lock file stays, emptied, unless the lock created the folder and
        nothing else was written there: then both go."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                os.ftruncate(fd, 0)
                if self._created and os.listdir(self.folder) == [LOCK_NAME]:
                    os.unlink(self.folder / LOCK_NAME)
                    try:
                        self.folder.rmdir()
                    except OSError:  # something appeared meanwhile: it stays
                        pass
            finally:
                os.close(fd)  # closing the descriptor releases the flock


def _lock_fd(fd: int, wait: bool) -> None:
    try:
        import fcntl
    except ImportError:  # Windows
        import msvcrt

        mode = msvcrt.LK_LOCK if wait else msvcrt.LK_NBLCK
        while True:
            try:
                msvcrt.locking(fd, mode, 1)
                return
            except OSError as err:
                if not wait:
                    raise BlockingIOError(str(err)) from None
    fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
