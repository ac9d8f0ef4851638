"""Code that runs eagerly between ``torch.compile``'s graphs, without importing ``torch._dynamo`` for it.

``torch.compiler.disable`` imports ``torch._dynamo`` (with sympy and, through its trace rules,
scikit-learn and SciPy): ~2 s of CPU on a 2-core machine, paid by every process that merely *defines* a
disabled function at import time, although most adsim commands never compile (a process that builds a
CLIP backbone loads it anyway: torchvision imports it). :func:`outside_graphs` asks for the boundary only
while dynamo traces, when ``torch._dynamo`` is loaded anyway.
"""
from __future__ import annotations

from typing import Any, Callable, TypeVar

import torch

T = TypeVar("T")


def outside_graphs(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)``; under ``torch.compile`` the call runs eagerly between compiled graphs
    (one graph break, as if ``fn`` were decorated with ``torch.compiler.disable``), for code that
    dynamo must not trace (a hand-launched kernel, a JAX call, a loop that would unroll into a huge
    graph). Outside a compilation it is a plain call and imports nothing."""
    if torch.compiler.is_compiling():
        return torch.compiler.disable(fn)(*args, **kwargs)
    return fn(*args, **kwargs)
