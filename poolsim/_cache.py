"""The per-user cache folder for compiled programs (JAX's persistent compilation cache, torch inductor's).

``cache_dir(kind)`` is ``<root>/<kind>``, where ``<root>`` is

* ``$POOLSIM_CACHE_DIR`` when that is set to a path (moves the cache),
* none at all when it is ``0``, ``off``, ``false``, ``no`` or ``none`` (case-insensitive): caching is disabled and
  ``cache_dir`` returns ``None``,
* otherwise the platform's user cache folder for ``poolsim`` from ``platformdirs`` (``~/.cache/poolsim`` on Linux,
  ``~/Library/Caches/poolsim`` on macOS, ``%LOCALAPPDATA%\\poolsim\\Cache`` on Windows).

Deleting the folder clears every cache; nothing else is stored there.
"""
from __future__ import annotations

import os
import tempfile
import threading
import warnings
from pathlib import Path

ENV_VAR = "POOLSIM_CACHE_DIR"
_OFF = {"0", "off", "false", "no", "none"}


def cache_root() -> Path | None:
    """The cache root as configured now (see the module docstring), or ``None`` when caching is disabled."""
    value = os.environ.get(ENV_VAR)
    if value is not None and value.strip().lower() in _OFF:
        return None
    if value:
        return Path(value).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("poolsim", appauthor=False))


def cache_dir(kind: str) -> Path | None:
    """``<cache root>/<kind>`` (not created here), or ``None`` when caching is disabled by ``POOLSIM_CACHE_DIR``.

    ``kind`` names one compiler's cache, e.g. ``"jax"`` or ``"torch-inductor"``: a non-empty folder name.
    """
    if not isinstance(kind, str) or not kind or os.sep in kind or kind in {".", ".."}:
        raise ValueError(f"kind must be a non-empty folder name, got {kind!r}")
    root = cache_root()
    return None if root is None else root / kind


# JAX programs that took at least this long to compile are written to the persistent cache. Low
# enough for every engine program (the smallest, the on-device reduction, compiles in ~0.1 s),
# high enough that the single-operation programs of eager JAX code (a few ms each) are not.
JAX_MIN_COMPILE_SECONDS = 0.05

_jax_lock = threading.Lock()
_jax_state: dict = {}


class CacheWarning(UserWarning):
    """A compilation cache folder or entry cannot be used; the run goes on without it."""


_warned: set = set()
_warned_lock = threading.Lock()


def warn_once(kind: str, message: str, stacklevel: int = 3) -> None:
    """One :class:`CacheWarning` per ``kind`` per process (``"write"``: a cache folder cannot be
    written, ``"read"``: a stored entry cannot be loaded); later problems of the same kind are
    silent, and the run goes on. ``stacklevel`` counts from the caller of this function, as
    ``warnings.warn``'s does from its caller."""
    with _warned_lock:
        if kind in _warned:
            return
        _warned.add(kind)
    warnings.warn(message, CacheWarning, stacklevel=stacklevel + 1)


def enable_jax_cache() -> Path | None:
    """Turn on JAX's persistent compilation cache in ``cache_dir("jax")``, once per process.

    Called by the Monte-Carlo engine and the decision map before their first compile (not at
    ``import poolsim``: JAX is imported only when needed). Returns the folder in use, or ``None``
    when caching is off (``POOLSIM_CACHE_DIR=off``) or the folder cannot be written. Where the
    user already chose a folder (``jax.config.update("jax_compilation_cache_dir", ...)`` or the
    environment variable ``JAX_COMPILATION_CACHE_DIR``), that choice is kept.

    A folder that cannot be created or written gives one :class:`CacheWarning` for the process
    and the run goes on without a persistent cache. Entries are keyed by JAX itself (the program,
    jaxlib version, backend and its version, XLA flags, compile options, device kinds and
    topology), so a cached program is only served to a process that would compile the same one.
    """
    with _jax_lock:
        if "dir" in _jax_state:
            return _jax_state["dir"]
        _jax_state["dir"] = path = _setup_jax_cache()
        return path


def _setup_jax_cache() -> Path | None:
    import jax

    chosen = jax.config.jax_compilation_cache_dir
    if chosen:
        return Path(chosen)
    path = cache_dir("jax")
    if path is None:
        return None
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".probe-") as probe:
            probe.write(b"poolsim")
            probe.flush()
    except OSError as exc:
        warn_once("write", f"poolsim: the compilation cache folder {path} cannot be written "
                  f"({exc.strerror or exc}); programs are compiled without a persistent cache. "
                  f"Set {ENV_VAR} to a writable folder, or to 'off'.", stacklevel=3)
        return None
    jax.config.update("jax_persistent_cache_min_compile_time_secs", JAX_MIN_COMPILE_SECONDS)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    jax.config.update("jax_compilation_cache_dir", str(path))
    return path
