"""A griffe extension for this project's docstrings, used by the site build and the docstring test.

* The docstrings are Markdown-like prose that name other objects with Sphinx roles
  (``:func:`advise```, ``:data:`MIN_SEEDS```); mkdocstrings renders Markdown, where a role would show
  as literal text, so each role becomes inline code.
* ``X = namedtuple(...)`` followed by ``X.__doc__ = "..."`` documents ``X`` at run time, which static
  analysis does not see; such a docstring is read from the imported module.
* A docstring with a line ``<!-- generated at import -->`` is completed at import (e.g.
  ``poolsim.experiments.run``: its parameter tables, generated from the registry); such a docstring is
  read from the imported object too.
Written here rather than taken from a package: no published griffe extension does either (griffe's own
``dynamic`` inspection would import every module for every object).
"""
from __future__ import annotations

import importlib
import inspect
import re

import griffe

_ROLE = re.compile(r":(?:class|func|data|mod|meth|attr|obj|exc):`~?([^`]+)`")
GENERATED = "<!-- generated at import -->"


def _imported(obj: griffe.Object):
    """The imported object ``obj`` (a module or a module's member) stands for."""
    if obj.is_module:
        return importlib.import_module(obj.path)
    return getattr(importlib.import_module(obj.parent.path), obj.name)


def _plain(text: str) -> str:
    return _ROLE.sub(r"`\1`", text)


class ProjectDocstrings(griffe.Extension):
    """Roles to inline code; run-time ``__doc__`` of attributes that hold a documented class."""

    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:  # noqa: D102 - griffe hook
        if obj.docstring is None and obj.is_attribute and obj.parent is not None and obj.parent.is_module:
            try:
                value = getattr(importlib.import_module(obj.parent.path), obj.name)
            except (ImportError, AttributeError):
                value = None
            doc = getattr(value, "__doc__", None) if isinstance(value, type) else None
            if doc and not doc.startswith(f"{obj.name}("):  # not namedtuple's generated "X(a, b)"
                obj.docstring = griffe.Docstring(doc, parent=obj)
        if obj.docstring is not None and GENERATED in obj.docstring.value:
            obj.docstring.value = inspect.cleandoc(_imported(obj).__doc__)
        if obj.docstring is not None:
            obj.docstring.value = _plain(obj.docstring.value)
