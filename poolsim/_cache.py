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
