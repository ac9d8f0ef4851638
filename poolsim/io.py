"""File-system plumbing shared by poolsim's and adsim's commands: one writer per output folder,
atomic file writes and the per-user cache folder.

* :class:`folder_lock` / :class:`FolderBusyError`: an exclusive lock on an output folder (a second
  writer is refused, naming the holder, or waits);
* :func:`atomic_write` / :func:`atomic_write_text`: a temporary file beside the target, then
  ``os.replace``: a reader never sees a half-written file;
* :func:`cache_dir`: ``<root>/<kind>``, the folder of one compiler's cache (``POOLSIM_CACHE_DIR``
  moves or disables it).

These names were importable from ``poolsim`` itself until 0.1; that still works for one release,
with a ``DeprecationWarning``.
"""
from ._cache import cache_dir as cache_dir
from ._io import FolderBusyError as FolderBusyError
from ._io import atomic_write as atomic_write
from ._io import atomic_write_text as atomic_write_text
from ._io import folder_lock as folder_lock

__all__ = ["FolderBusyError", "atomic_write", "atomic_write_text", "cache_dir", "folder_lock"]
