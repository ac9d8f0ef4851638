"""Argument checks shared by every public entry point: one clear ``ValueError`` per bad input.

Shape and choice checks always run. Value checks need the values: on a JAX tracer (inside ``jit``,
``vmap``, ``grad``) they become run-time checks instead (:func:`guard`): the checked value is returned
carrying an ``equinox.error_if``, and a bad value raises when the compiled program runs, with the same
message inside JAX's run-time error. Callers use the value returned, so that the check is part of the
computation.
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


def guard(x: Any, bad: Any, message: str) -> Any:
    """Traced ``x`` with a run-time check: the program raises ``message`` when it runs with ``bad`` true.

    ``equinox.error_if``: under ``jax.jit`` the error is a ``jax.errors.JaxRuntimeError`` (a
    ``RuntimeError``; under ``equinox.filter_jit`` an ``EquinoxRuntimeError``) whose text contains
    ``message``. Gradients pass through ``x`` unchanged. The environment variable ``EQX_ON_ERROR``
    (equinox's) can turn the error into NaN or a breakpoint instead."""
    import equinox as eqx

    return eqx.error_if(x, bad, message)


def choice(name: str, value: Any, allowed: tuple) -> Any:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
    return value


def positive(name: str, value: Any) -> Any:
    """A finite number > 0; a traced JAX scalar comes back with that check made at run time (:func:`guard`)."""
    if is_tracer(value):
        import jax.numpy as jnp

        return guard(value, ~(jnp.isfinite(value) & (value > 0)), f"{name} must be a finite number > 0")
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


def finite(name: str, x: Any) -> Any:
    """``x``, with no NaN or inf anywhere in it; a traced ``x`` comes back with that check made at run
    time (:func:`guard`)."""
    message = f"{name} contains NaN or inf; all values must be finite"
    if is_tracer(x):
        import jax.numpy as jnp

        return guard(x, ~jnp.all(jnp.isfinite(x)), message)
    if not np.all(np.isfinite(to_numpy(x))):
        raise ValueError(message)
    return x
