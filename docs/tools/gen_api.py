"""Generate the site's API reference (one page per public module) and copy the figures it shows.

Run by the ``gen-files`` plugin on every ``mkdocs build``; the pages exist only in the build. Which modules
and names are public is decided in ``public_api.py``; every public name links to the page of the module
that defines it, where mkdocstrings renders its docstring.
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

import mkdocs_gen_files

sys.path.insert(0, str(Path(__file__).parent))
import public_api  # noqa: E402  (the folder above is not a package)

ROOT = Path(__file__).resolve().parents[2]


def _summary(module) -> str:
    doc = (module.__doc__ or "").strip()
    return doc.split("\n\n")[0].replace("\n", " ") if doc else ""


def _first_line(collection, path: str) -> str:
    doc = collection.get_member(path).docstring
    text = doc.value.strip().split("\n\n")[0].replace("\n", " ") if doc else ""
    return text.replace("|", "\\|")


def main() -> None:
    collection = public_api.load_griffe(str(ROOT))
    modules = public_api.public_modules()
    names = public_api.public_names(collection)
    by_module: dict[str, list] = {}
    for n in names:
        if n.kind != "module":
            by_module.setdefault(n.public.rsplit(".", 1)[0], []).append(n)
    nav = mkdocs_gen_files.Nav()
    for public, real in modules.items():
        page = f"{public}.md"
        nav[tuple(public.split("."))] = page
        static_all = bool(collection.get_member(real).exports)  # adsim: [] (its __all__ is built at run time)
        with mkdocs_gen_files.open(f"api/{page}", "w") as fh:
            if by_module.get(public) and not static_all:
                # __all__ is built at run time (lazy_loader): the module docstring, then a table of its
                # exports linking to where each is defined and documented.
                fh.write(f"# {public}\n\n::: {real}\n    options:\n      members: false\n"
                         f"      show_root_heading: false\n\n")
                fh.write("| name | defined in | summary |\n|---|---|---|\n")
                for n in by_module[public]:
                    short = n.public.rsplit(".", 1)[1]
                    where = n.canonical.rsplit(".", 1)[0]
                    fh.write(f"| [`{short}`][{n.canonical}] | `{where}` | {_first_line(collection, n.canonical)} |\n")
            else:
                # a package's own page lists its names in __all__'s order (the science first), not
                # classes before functions
                order = ("      group_by_category: false\n      members_order: __all__\n"
                         if public in public_api.PACKAGES else "")
                fh.write(f"# {public}\n\n::: {public}\n    options:\n      show_root_heading: false\n{order}")
            children = [m for m in modules if m.rsplit(".", 1)[0] == public and m != public]
            if children:
                fh.write("\n## Modules\n\n")
                for child in children:
                    line = _summary(importlib.import_module(modules[child]))
                    fh.write(f"- [`{child}`]({child}.md): {line}\n")
        mkdocs_gen_files.set_edit_path(f"api/{page}", None)
    with mkdocs_gen_files.open("api/SUMMARY.md", "w") as fh:
        fh.writelines(nav.build_literate_nav())
    # the committed figures the pages show (figures/ lives outside docs/)
    for png in sorted((ROOT / "figures").glob("*.png")) + [ROOT / "figures" / "adsim" / "overlays_toy.png"]:
        with mkdocs_gen_files.open(f"figures/{png.relative_to(ROOT / 'figures')}", "wb") as fh:
            fh.write(png.read_bytes())


main()
