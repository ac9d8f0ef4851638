"""Where ``torch.compile``'s compiled programs are kept between processes: compile once per machine.

:func:`configure` points torch inductor's on-disk caches at ``poolsim.io.cache_dir("torch-inductor")``
(``~/.cache/poolsim/torch-inductor`` on Linux; ``POOLSIM_CACHE_DIR`` moves the root, ``POOLSIM_CACHE_DIR=off``
disables caching) before adsim compiles anything:

* ``TORCHINDUCTOR_CACHE_DIR`` -- inductor's FX-graph cache (generated code per graph; key: the graph, its
  inputs' metadata, the configuration and the torch version) and the AOT-autograd cache (the joint
  forward/backward graphs) live under it;
* ``TRITON_CACHE_DIR`` -- Triton's compiled GPU kernels, in ``<cache>/triton``;
* inductor's FX-graph cache and the AOT-autograd cache on, the remote (Redis) caches off.

A variable the user has set is left alone (``TORCHINDUCTOR_CACHE_DIR`` equal to torch's default,
``/tmp/torchinductor_<user>``, which importing inductor sets, counts as unset). With caching disabled both caches are switched off for the process. A
second process that compiles the same step loads the generated code instead of generating it
(``tests/adsim/test_adsim_compile_cache.py`` checks torch's cache-hit counters); dynamo still traces the
Python code in every process, and CUDA graphs are recorded anew (both fast next to code generation).
Clearing the cache: delete the folder (``docs/compile.md``).
"""
from __future__ import annotations

import os
from pathlib import Path

from poolsim.io import cache_dir

KIND = "torch-inductor"
_SWITCHES = {  # environment variable -> (config module, attribute, value when caching is on)
    "TORCHINDUCTOR_FX_GRAPH_CACHE": ("torch._inductor.config", "fx_graph_cache", True),
    "TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE": ("torch._inductor.config", "fx_graph_remote_cache", False),
    "TORCHINDUCTOR_AUTOGRAD_CACHE": ("torch._functorch.config", "enable_autograd_cache", True),
}


def configure() -> Path | None:
    """Set up the caches as the module docstring says; returns inductor's cache folder, or ``None`` when
    ``POOLSIM_CACHE_DIR`` disables caching. Idempotent: call it before every compilation."""
    import importlib

    root = cache_dir(KIND)
    for var, (module, attr, on) in _SWITCHES.items():
        if var in os.environ:  # the user's choice
            continue
        setattr(importlib.import_module(module), attr, on if root is not None else False)
    if root is None:
        return None
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    # importing inductor sets the variable to its default (/tmp/torchinductor_<user>, cleared on reboot):
    # that value is torch's, not the user's
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR", default_cache_dir()) == default_cache_dir():
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(root)
    os.environ.setdefault("TRITON_CACHE_DIR", str(Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]) / "triton"))
    return Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
