"""Module paths of the flat layout (``adsim.train``, ``adsim.head``, ...), kept importable for one release.

Importing one gives a module that forwards every attribute to the module(s) that now hold its names and
emits one ``DeprecationWarning`` naming the new path. Nothing is imported until such a path is used.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings

# old module -> modules now holding its names (searched in order)
MOVED = {
    "adsim._io": ("adsim.runtime.io", "adsim.runtime.device"),
    "adsim.distributed": ("adsim.runtime.distributed",),
    "adsim.toy": ("adsim.data.toy",),
    "adsim.sim": ("adsim.data.sim",),
    "adsim.reference": ("adsim.data.reference",),
    "adsim.recipes": ("adsim.config.recipes", "adsim.config.prompts"),
    "adsim.backbone": ("adsim.model.backbone", "adsim.config.choices"),
    "adsim.head": ("adsim.model.head", "adsim.config.choices", "adsim.config.prompts"),
    "adsim.matching": ("adsim.model.matching",),
    "adsim.losses": ("adsim.model.losses",),
    "adsim._method": ("adsim.methods.registry", "adsim.methods.catalog"),
    "adsim.fewshot": ("adsim.methods.fewshot",),
    "adsim.baselines": ("adsim.methods.baselines",),
    "adsim.detector": ("adsim.inference.detector", "adsim.data.images"),
    "adsim.overlays": ("adsim.inference.overlays",),
    "adsim.evaluate": ("adsim.evaluation.evaluate", "adsim.inference.scoring", "adsim.metrics.functional",
                       "adsim.training.train"),
    "adsim.train": ("adsim.training.train", "adsim.config.run", "adsim.model.head", "adsim.model.objective"),
    "adsim.cache": ("adsim.training.cache",),
    "adsim.protocol": ("adsim.experiments.protocol",),
    "adsim.sweep": ("adsim.experiments.sweep",),
    "adsim.table": ("adsim.experiments.table",),
    "adsim.figures": ("adsim.experiments.figures",),
    "adsim.sources": ("adsim.experiments.sources",),
}


class _Forward(types.ModuleType):
    def __getattr__(self, name):
        for target in MOVED[self.__name__]:
            module = importlib.import_module(target)
            if hasattr(module, name):
                return getattr(module, name)
        raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        return _Forward(spec.name)

    def exec_module(self, module):
        warnings.warn(f"{module.__name__} moved to {MOVED[module.__name__][0]}; the old path goes away in the next "
                      f"release", DeprecationWarning, stacklevel=2)


def install() -> None:
    """Put the forwarding finder on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
