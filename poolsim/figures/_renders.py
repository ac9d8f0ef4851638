"""Rendered images kept per user: a figure whose inputs did not change is copied, not drawn again.

Drawing and saving the seven default figures as PNG and PDF is ~12 s of CPU, a third of a figure run
whose simulations and compiled programs come from the caches. An image is a function of what
``plot`` is given and of the code that draws it, so it is stored in ``poolsim.io.cache_dir("figures")``
under the sha256 of: the figure's name and format, the frame ``plot`` receives (pickled, with its
attributes: parameters and verdict rows), poolsim's source (:func:`poolsim._programs.source_digest`,
which covers every ``plot``), the matplotlib and FreeType versions and matplotlib's settings
(``rcParams``, which a user's matplotlibrc may change). Any change to one of them is another key: the
figure is drawn again. ``POOLSIM_CACHE_DIR=off`` disables the store (then every figure is drawn). Files
are written atomically; an entry that cannot be read or written is skipped (drawn again / not kept).
"""
from __future__ import annotations

import functools
import hashlib
import pickle
from pathlib import Path

from .. import _cache, _io, _programs

KIND = "figures"


@functools.lru_cache(maxsize=1)
def _environment() -> bytes:
    import matplotlib
    from matplotlib import ft2font

    rc = sorted((k, repr(v)) for k, v in matplotlib.rcParams.items())
    return repr((_programs.source_digest(), matplotlib.__version__,
                 getattr(ft2font, "__freetype_version__", ""), rc)).encode()


def key(name: str, fmt: str, df) -> str | None:
    """The store key of figure ``name`` drawn as ``fmt`` from ``df``; ``None`` when ``df`` cannot be
    pickled (then it is always drawn)."""
    try:
        data = pickle.dumps((df, dict(df.attrs)), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        return None
    h = hashlib.sha256(_environment())
    for part in (name.encode(), fmt.encode(), data):
        h.update(len(part).to_bytes(8, "little") + part)
    return h.hexdigest()


def _path(k: str, fmt: str) -> Path | None:
    folder = _cache.cache_dir(KIND)
    return None if folder is None else folder / f"{k}.{fmt}"


def covered(mod) -> bool:
    """Whether figure module ``mod``'s drawing code is poolsim's own (in the source digest of the
    key): a module of ``poolsim.figures`` whose ``plot`` it defines. Other figures are always drawn."""
    name = getattr(mod, "__name__", "")
    plot = getattr(mod, "plot", None)
    return name.startswith(__package__ + ".") and getattr(plot, "__module__", None) == name


def load(mod, name: str, formats, df, dest: Path) -> bool:
    """Copy every format of figure ``name`` (module ``mod``) for ``df`` from the store to
    ``dest/NAME.FMT``; ``True`` when all were there (else nothing is copied)."""
    if not covered(mod):
        return False
    found = {}
    for fmt in formats:
        k = key(name, fmt, df)
        path = None if k is None else _path(k, fmt)
        try:
            found[fmt] = path.read_bytes() if path is not None else None
        except OSError:
            found[fmt] = None
        if found[fmt] is None:
            return False
    for fmt, data in found.items():
        (dest / f"{name}.{fmt}").write_bytes(data)
    return True


def store(mod, name: str, formats, df, dest: Path) -> None:
    """Keep the images ``dest/NAME.FMT`` just drawn from ``df`` in the store."""
    if not covered(mod):
        return
    for fmt in formats:
        k = key(name, fmt, df)
        path = None if k is None else _path(k, fmt)
        if path is None:
            continue
        data = (dest / f"{name}.{fmt}").read_bytes()
        try:
            _io.atomic_write(path, lambda fh: fh.write(data))
        except OSError:
            pass  # a read-only cache folder: the figure is drawn again next time
