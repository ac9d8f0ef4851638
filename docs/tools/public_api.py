"""What the API reference documents: every public module and every public name of poolsim and adsim.

Shared by the site's page generator (``docs/tools/gen_api.py``) and the test that every public name has a
docstring (``tests/test_docs.py``), so the two cannot disagree.

* A *public module* is a package root, or a module whose dotted path has no component starting with ``_``,
  or a module named in a public module's ``__all__`` (``poolsim.core`` is ``poolsim._core``).
* A *public name* is an entry of a public module's ``__all__`` (read at run time: adsim's packages build
  it with ``lazy_loader``, which static analysis cannot read). Its *canonical path* is where it is defined,
  e.g. ``adsim.Detector`` -> ``adsim.inference.detector.Detector``; the docstring checked is the one there.
"""
from __future__ import annotations

import importlib
import pkgutil
import types
from typing import NamedTuple

import griffe

from griffe_docstrings import ProjectDocstrings

PACKAGES = ("poolsim", "adsim")


class Name(NamedTuple):
    """One public name: ``public`` as users write it, ``canonical`` where it is defined (a griffe path)."""
    public: str
    canonical: str
    kind: str  # "module", "class", "function" or "attribute"


def load_griffe(search_path: str = ".") -> griffe.ModulesCollection:
    """Both packages, statically (no import), as one griffe collection."""
    loader = griffe.GriffeLoader(search_paths=[search_path], extensions=griffe.load_extensions(ProjectDocstrings))
    for package in PACKAGES:
        loader.load(package)
    return loader.modules_collection


def _walk(package: str) -> list[str]:
    root = importlib.import_module(package)
    found = [package]
    for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}."):
        if not any(part.startswith("_") for part in info.name.split(".")[1:]):
            found.append(info.name)
    return found


def public_modules() -> dict[str, str]:
    """``{public dotted name: module's real dotted name}`` of both packages, sorted."""
    modules = {name: name for package in PACKAGES for name in _walk(package)}
    queue = list(modules)
    while queue:
        name = queue.pop()
        module = importlib.import_module(modules[name])
        for entry in getattr(module, "__all__", ()):
            value = getattr(module, entry)
            if isinstance(value, types.ModuleType) and f"{name}.{entry}" not in modules:
                modules[f"{name}.{entry}"] = value.__name__
                queue.append(f"{name}.{entry}")
    return dict(sorted(modules.items()))


def _defining_path(collection, package_real: str, entry: str, value) -> str | None:
    """Where ``value`` (exported as ``entry`` by module ``package_real``) is defined, as a griffe path."""
    if isinstance(value, (type, types.FunctionType)):
        path = f"{value.__module__}.{value.__qualname__}"
        try:
            collection.get_member(path)
            return path
        except KeyError:
            pass
    try:  # a static re-export griffe can follow (``from ._x import y as y``, a literal ``__all__``)
        obj = collection.get_member(f"{package_real}.{entry}")
        return obj.final_target.path if obj.is_alias else obj.path
    except (KeyError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        pass
    # a lazy export: the module below the package that defines ``entry`` as this very object
    for real in [package_real, *_walk(package_real.split(".")[0])]:
        if real.startswith(package_real + ".") or real == package_real:
            try:
                member = collection.get_member(real).members.get(entry)
            except KeyError:
                continue
            if member is not None and not member.is_alias:
                if getattr(importlib.import_module(real), entry, None) is value:
                    return member.path
    return None


def public_names(collection=None) -> list[Name]:
    """Every public name of both packages (see the module docstring), modules included."""
    collection = collection or load_griffe()
    names = []
    for public, real in public_modules().items():
        names.append(Name(public, real, "module"))
        module = importlib.import_module(real)
        for entry in getattr(module, "__all__", ()):
            value = getattr(module, entry)
            if isinstance(value, types.ModuleType):
                continue  # listed as a public module of its own
            canonical = _defining_path(collection, real, entry, value)
            if canonical is None:
                names.append(Name(f"{public}.{entry}", "", "unknown"))
                continue
            kind = collection.get_member(canonical).kind.value
            names.append(Name(f"{public}.{entry}", canonical, kind))
    return names


def undocumented(collection=None) -> list[str]:
    """Public names (see :func:`public_names`) whose definition has no docstring."""
    collection = collection or load_griffe()
    return [f"{n.public} ({n.canonical or 'definition not found by static analysis'})"
            for n in public_names(collection)
            if not n.canonical or not (collection.get_member(n.canonical).docstring or griffe.Docstring("")).value.strip()]
