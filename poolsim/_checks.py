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
from typing import Any, NamedTuple

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


def _bound(x: float) -> str:
    return "inf" if x == math.inf else "-inf" if x == -math.inf else "pi" if x == math.pi else f"{x:g}"


class Range(NamedTuple):
    """The values a numeric argument may take: ``[lo, hi]``, an end left out with ``lo_open`` /
    ``hi_open`` (an infinite end is always open), integers only with ``integer``. ``str()`` is the
    interval as every range error writes it: ``[0, 1]``, ``(0, inf)``, ``[1, inf)``."""

    lo: float = -math.inf
    hi: float = math.inf
    lo_open: bool = False
    hi_open: bool = False
    integer: bool = False

    def __str__(self) -> str:
        left = "(" if self.lo_open or self.lo == -math.inf else "["
        right = ")" if self.hi_open or self.hi == math.inf else "]"
        return f"{left}{_bound(self.lo)}, {_bound(self.hi)}{right}"

    def error(self, name: str, value: Any) -> ValueError:
        """The one wording of a range error: ``NAME must be a finite number in [0, 1], got 1.5`` (``an
        integer in [1, inf)`` for integer ranges)."""
        kind = "an integer" if self.integer else "a finite number"
        return ValueError(f"{name} must be {kind} in {self}, got {value!r}")

    def check(self, name: str, value: Any) -> Any:
        """``value`` if it lies in the range (a traced JAX scalar passes unchecked), else :meth:`error`."""
        if is_tracer(value):
            return value
        if self.integer:
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise self.error(name, value)
            v = float(value)
        else:
            if isinstance(value, (str, bytes, bool)):  # float("1") and float(True) would pass otherwise
                raise self.error(name, value)
            try:
                v = float(value)
            except (TypeError, ValueError):
                raise self.error(name, value) from None
            if not math.isfinite(v):
                raise self.error(name, value)
        if v < self.lo or v > self.hi or (self.lo_open and v == self.lo) or (self.hi_open and v == self.hi):
            raise self.error(name, value)
        return value


POSITIVE = Range(0.0, math.inf, lo_open=True)
"""``(0, inf)``."""
NONNEGATIVE = Range(0.0, math.inf)
"""``[0, inf)``."""
UNIT = Range(0.0, 1.0)
"""``[0, 1]``."""


def number(name: str, value: Any, lo: float = -math.inf, hi: float = math.inf, *, lo_open: bool = False,
           hi_open: bool = False) -> Any:
    """A finite number in the interval from ``lo`` to ``hi`` (:class:`Range`; a tracer passes unchecked)."""
    return Range(lo, hi, lo_open, hi_open).check(name, value)


def positive(name: str, value: Any) -> Any:
    """A finite number > 0 (:data:`POSITIVE`); a traced JAX scalar comes back with that check made at run
    time (:func:`guard`)."""
    if is_tracer(value):
        import jax.numpy as jnp

        return guard(value, ~(jnp.isfinite(value) & (value > 0)), f"{name} must be a finite number in {POSITIVE}")
    return POSITIVE.check(name, value)


def integer(name: str, value: Any, lo: int, hi: float = math.inf) -> int:
    """An integer in ``[lo, hi]``."""
    return int(Range(lo, hi, integer=True).check(name, value))


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
