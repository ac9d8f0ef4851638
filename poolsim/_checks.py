"""Argument checks shared by every public entry point: one clear ``ValueError`` per bad input.

Value checks are skipped for JAX tracers (inside ``jit``/``vmap`` values are not known); shape
and choice checks always run.
"""
from __future__ import annotations

import math
import numbers
import sys
from typing import Any

import numpy as np


def is_tracer(x: Any) -> bool:
    """``x`` is a JAX tracer. Without JAX imported nothing is one: JAX is not imported to find out (a
    second or more on a first NumPy call)."""
    jax = sys.modules.get("jax")
    return jax is not None and isinstance(x, jax.core.Tracer)


def choice(name: str, value: Any, allowed: tuple) -> Any:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
    return value


def positive(name: str, value: Any) -> Any:
    """A finite number > 0 (a traced JAX scalar passes unchecked)."""
    if is_tracer(value):
        return value
    if isinstance(value, (str, bytes, bool)):  # float("1") and float(True) would pass otherwise
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return value


def integer(name: str, value: Any, lo: int, hi: float = math.inf) -> int:
    """An integer in ``[lo, hi]``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")
    return int(value)


def to_numpy(a: Any) -> np.ndarray:
    """A host NumPy view of a NumPy/JAX array or a torch tensor (detached, on the CPU)."""
    return np.asarray(a.detach().cpu() if hasattr(a, "detach") else a)


def finite(name: str, x: Any) -> None:
    """No NaN or inf anywhere in ``x`` (skipped for tracers)."""
    if is_tracer(x):
        return
    if not np.all(np.isfinite(to_numpy(x))):
        raise ValueError(f"{name} contains NaN or inf; all values must be finite")
