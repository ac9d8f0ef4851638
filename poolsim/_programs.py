"""Compiled programs stored per user: a second process loads them instead of tracing, lowering and
compiling them again.

JAX's persistent compilation cache (:func:`poolsim._cache.enable_jax_cache`) saves the compile, but
its key is a hash of the lowered program, so every process still traces and lowers each program to
find its entry (about 1 s of the engine's warm first call on a 2-core CPU). A :class:`Program` keeps
the compiled executables themselves (``jax.experimental.serialize_executable``) in
``poolsim.io.cache_dir("programs")``, one file per program and argument signature, under a key made of
everything that decides the program without tracing it:

* the caller's description of the traced function and its static arguments (``ident``; the engine
  gives its :class:`~poolsim._engine.Spec`, dtype and program name);
* the arguments' tree structure, shapes and dtypes;
* the effective JAX configuration (every flag, x64 included, except the ones that only steer logging
  and caching: :data:`IGNORED_FLAGS`);
* :func:`environment`: the store's format, Python, JAX and jaxlib versions, backend platform and its
  version, device kind, the ``XLA_FLAGS`` environment variable, the CPU (model and instruction-set
  flags: the compiled code uses them) and a hash of poolsim's own source files.

A file whose name matches but whose content does not (a different key, a checksum mismatch, an
entry that cannot be loaded) is compiled again and replaced, with one :class:`~poolsim._cache.CacheWarning`
per process; a folder that cannot be written gives one warning and the programs stay in memory. The
files are written atomically (:func:`poolsim._io.atomic_write`). Deleting the folder clears the store.

Loading an entry runs the code in it: the folder must be trusted (as JAX's own cache folder).
"""
from __future__ import annotations

import functools
import hashlib
import os
import pickle
import platform
import sys
import threading
from pathlib import Path
from typing import Any, Callable

from . import _cache, _io

STORE_KIND = "programs"
_FORMAT = "poolsim-program 1"
_MAGIC = (_FORMAT + "\n").encode()

# JAX flags that change neither the traced program nor its compiled code: logging, debugging output
# and the persistent compilation cache's own settings (toggled by :meth:`Program._compile`).
IGNORED_FLAGS = ("log", "explain_cache_misses", "compilation_cache", "persistent_cache", "dump_ir",
                 "include_debug_info_in_dumps", "include_full_tracebacks_in_locations",
                 "traceback")

_compile_lock = threading.Lock()


def store_dir() -> Path | None:
    """The folder of stored programs, ``poolsim.io.cache_dir("programs")``; ``None`` when
    ``POOLSIM_CACHE_DIR`` disables caching."""
    return _cache.cache_dir(STORE_KIND)


def _cpu_description() -> str:
    """The CPU model and its instruction-set flags (``/proc/cpuinfo`` on Linux; else what
    ``platform`` reports)."""
    try:
        with open("/proc/cpuinfo") as fh:
            lines = [line for line in fh if line.split(":")[0].strip() in
                     ("model name", "flags", "Features", "CPU implementer", "CPU part")]
        return "".join(sorted(set(lines)))
    except OSError:
        return f"{platform.machine()} {platform.processor()}"


def source_digest(root: Path | None = None) -> str:
    """sha256 of poolsim's source: every ``.py`` file below the package folder (``root``), by
    relative path and content. Any change to poolsim's code gives new keys."""
    root = Path(__file__).parent if root is None else Path(root)
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()


def environment_parts() -> dict:
    """The parts of :func:`environment`, by name: ``format``, ``python``, ``jax``, ``jaxlib``,
    ``platform``, ``platform_version``, ``device_kind``, ``xla_flags``, ``cpu``, ``poolsim_source``."""
    import jax
    import jaxlib

    from jax.extend import backend as jex_backend

    be = jex_backend.get_backend()
    return {
        "format": _FORMAT,
        "python": sys.version,
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "platform": be.platform,
        "platform_version": be.platform_version,
        "device_kind": jax.local_devices()[0].device_kind,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "cpu": _cpu_description(),
        "poolsim_source": source_digest(),
    }


@functools.lru_cache(maxsize=1)
def environment() -> str:
    """What every key of this process shares (:func:`environment_parts`: store format, Python,
    JAX, jaxlib, backend and device kind, ``XLA_FLAGS``, CPU and poolsim's source), as one
    string. Computed once per process."""
    return "\n".join(f"{k}={v}" for k, v in environment_parts().items())


def jax_flags() -> tuple:
    """The JAX configuration in effect now (thread-local settings such as ``jax.enable_x64``
    included), less :data:`IGNORED_FLAGS`."""
    import jax

    cfg = jax.config
    return tuple((name, repr(getattr(cfg, name) if hasattr(cfg, name) else cfg.values[name]))
                 for name in sorted(cfg.values) if not any(s in name for s in IGNORED_FLAGS))


def _config_key():
    """A cheap key of the JAX configuration for this process's in-memory executables: the context
    ``jax.jit`` itself keys its compiled programs by (``jax._src.config.trace_context``: every
    setting that changes tracing, thread-local ones included; ~0.1 us, where reading the whole
    configuration, :func:`jax_flags`, costs ~0.7 ms a call). The store's key on disk stays the full
    :func:`jax_flags`. Where a JAX version lacks that function, :func:`jax_flags` itself."""
    return _TRACE_CONTEXT[0]()


def _find_trace_context() -> list:
    try:
        from jax._src.config import trace_context
    except ImportError:  # pragma: no cover - present in every JAX this package supports
        return []
    return [trace_context]


_TRACE_CONTEXT: list = []


def _signature(args: tuple) -> tuple:
    import jax
    import numpy as np

    leaves, tree = jax.tree.flatten(args)
    return (str(tree),) + tuple((tuple(np.shape(a)), str(getattr(a, "dtype", None) or np.asarray(a).dtype),
                                 bool(getattr(a, "weak_type", False))) for a in leaves)


class Program:
    """A jitted function whose compiled executables are kept per argument signature, in memory and
    in the per-user store (:func:`store_dir`).

    ``fn``: the ``jax.jit``-ted function; ``name``: a short label (the file name's prefix);
    ``ident``: a string that, with the arguments' signature and :func:`environment`, decides the
    program ``fn`` traces to -- ``None`` when nothing can promise that (e.g. a user-supplied
    callable inside ``fn``): then every call goes to ``fn`` itself (JAX's own caches). Also
    ``None`` behaviour, per call, with caching disabled (``POOLSIM_CACHE_DIR=off``) or in a
    multi-process JAX job.

    Calling it runs the program; the first call per signature and JAX configuration loads the
    stored executable, or traces, lowers and compiles ``fn`` and stores the result.
    """

    def __init__(self, fn: Callable, name: str, ident: str | None):
        self.fn, self.name, self.ident = fn, name, ident
        self._exes: dict = {}
        self.loaded = self.compiled = 0  # how many executables came from the store / were compiled

    def __call__(self, *args):
        if not _TRACE_CONTEXT:
            _TRACE_CONTEXT[:] = _find_trace_context() or [jax_flags]
        folder = None if self.ident is None else store_dir()
        if folder is None or _multi_process():
            return self.fn(*args)
        sig = _signature(args)
        mem = (sig, _config_key())
        exe = self._exes.get(mem)
        if exe is None:
            exe = self._exes[mem] = self._load_or_compile(folder, (sig, jax_flags()), args)
        return exe(*args)

    def _cache_size(self) -> int:
        """Compiled variants held by this process (stored ones and ``fn``'s own)."""
        return len(self._exes) + self.fn._cache_size()

    def key(self, sig: tuple) -> str:
        """The full store key of this program for the signature ``sig``."""
        return "\n".join([self.name, str(self.ident), repr(sig[0]), repr(sig[1]), environment()])

    def _load_or_compile(self, folder: Path, sig: tuple, args: tuple):
        key = self.key(sig)
        path = folder / f"{self.name}-{hashlib.sha256(key.encode()).hexdigest()[:40]}.bin"
        if path.exists():
            try:
                exe = _load(path, key)
                self.loaded += 1
                return exe
            except Exception as exc:  # any unreadable entry: compile again and replace it
                _cache.warn_once("read", f"poolsim: the stored program {path} cannot be used "
                                 f"({type(exc).__name__}: {exc}); compiling it again", stacklevel=3)
        exe, fresh = self._compile(args)
        self.compiled += 1
        if not fresh:  # served by JAX's cache after all: cannot be stored (see _compile)
            return exe
        try:
            payload = _dumps(exe)
        except Exception as exc:
            _cache.warn_once("serialize", f"poolsim: the compiled program {self.name} cannot be "
                             f"stored ({type(exc).__name__}: {exc}); it is kept for this process "
                             "only", stacklevel=3)
            return exe
        blob = pickle.dumps((key, payload), protocol=pickle.HIGHEST_PROTOCOL)
        try:
            _io.atomic_write(path, lambda fh: fh.write(
                _MAGIC + hashlib.sha256(blob).hexdigest().encode() + b"\n" + blob))
        except OSError as exc:
            _cache.warn_once("write", f"poolsim: the program store {folder} cannot be written "
                             f"({exc.strerror or exc}); compiled programs are kept for this process "
                             f"only. Set {_cache.ENV_VAR} to a writable folder, or to 'off'.",
                             stacklevel=3)
        return exe

    def _compile(self, args: tuple):
        """Trace, lower and compile ``fn`` for ``args``: ``(executable, fresh)``, ``fresh`` false
        when JAX's persistent cache served it. Only a fresh executable may be stored: XLA's CPU
        executables loaded from a serialized form cannot be serialized again (the copy loads but
        fails when run: "Function ... not found", measured with jax 0.10). So for this compile
        JAX's cache key includes the program's source locations (a key that poolsim's other
        compiles do not use, so the lookup misses) and nothing is written there (the store holds
        it); a hit all the same (someone keeps that key: JAX's cache-hit event) is reported as
        not fresh."""
        import jax

        lowered = self.fn.trace(*args).lower()
        with _compile_lock:
            _watch_hits()
            cfg = jax.config
            saved = (cfg.jax_compilation_cache_include_metadata_in_key,
                     cfg.jax_persistent_cache_min_compile_time_secs)
            cfg.update("jax_compilation_cache_include_metadata_in_key", True)
            cfg.update("jax_persistent_cache_min_compile_time_secs", float("inf"))
            hits = _hits[0]
            try:
                exe = lowered.compile()
            finally:
                cfg.update("jax_compilation_cache_include_metadata_in_key", saved[0])
                cfg.update("jax_persistent_cache_min_compile_time_secs", saved[1])
            return exe, _hits[0] == hits


_hits = [0]  # JAX persistent-cache hits in this process, once :func:`_watch_hits` ran
_watching: list = []


def _watch_hits() -> None:
    """Count JAX's persistent-cache hits (``jax.monitoring`` event), from the first call on."""
    if _watching:
        return
    import jax

    def listener(event: str, **_):
        if event == "/jax/compilation_cache/cache_hits":
            _hits[0] += 1

    jax.monitoring.register_event_listener(listener)
    _watching.append(listener)


@functools.lru_cache(maxsize=1)
def _multi_process() -> bool:
    """Whether this process is one of a multi-process JAX job. Asked once: the process count is
    fixed once a backend runs (``jax.distributed.initialize`` must come first), and
    ``jax.process_count()`` costs ~0.4 ms, on every program call otherwise."""
    import jax

    return jax.process_count() > 1


def _dumps(exe) -> bytes:
    from jax.experimental import serialize_executable

    return pickle.dumps(serialize_executable.serialize(exe), protocol=pickle.HIGHEST_PROTOCOL)


def _load(path: Path, key: str) -> Any:
    """The executable stored at ``path`` under ``key``; raises on any mismatch or damage."""
    from jax.experimental import serialize_executable

    data = path.read_bytes()
    if not data.startswith(_MAGIC):
        raise ValueError("not a poolsim program file")
    digest, _, blob = data[len(_MAGIC):].partition(b"\n")
    if hashlib.sha256(blob).hexdigest().encode() != digest:
        raise ValueError("checksum mismatch (damaged file)")
    stored_key, payload = pickle.loads(blob)
    if stored_key != key:
        raise ValueError("stored for another key")
    return serialize_executable.deserialize_and_load(*pickle.loads(payload))
