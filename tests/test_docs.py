"""The documentation site: every public name documented, a strict build (broken references, tutorials that
raise, missing docstrings fail it), nothing fetched from other hosts, and the pages rendered by a real browser.

The build runs ``mkdocs build --strict`` as a user would (a subprocess, from the repository root), once per
session; it executes the tutorials, so it needs the ``adsim`` extra too."""
import html.parser
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / "docs" / "tools"
# the Material theme and a plugin print a banner about MkDocs' future on every build; these turn it off
QUIET = {"NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"}


def _public_api():
    pytest.importorskip("griffe", reason="the docs tools are in the test extra")
    sys.path.insert(0, str(TOOLS))
    try:
        import public_api
    finally:
        sys.path.remove(str(TOOLS))
    return public_api


def _env() -> dict:
    return {**os.environ, **QUIET, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")}


def _mkdocs(config: Path, site: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
                          cwd=config.parent, env=_env(), capture_output=True, text=True, timeout=timeout)


# ``mkdocs build --strict -f CONFIG -d SITE`` for several builds in one interpreter: the mkdocs command line
# itself (click's ``cli.main``, as ``python -m mkdocs`` calls it) once per build, each build's exit status and
# stderr recorded as the CLI reports them (a click exception's message, as click prints it). MkDocs builds
# in-process repeatedly by design (``mkdocs serve`` rebuilds in its own process); one interpreter saves each
# further build the import of MkDocs, the theme and the plugins.
_BUILDS = """
import contextlib, io, json, sys
import click
from mkdocs.__main__ import cli
results = []
for config, site in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            cli.main(["build", "--strict", "-f", config, "-d", site], prog_name="mkdocs", standalone_mode=False)
            rc = 0
        except click.ClickException as e:
            e.show()
            rc = e.exit_code
        except BaseException as e:  # noqa: BLE001 - a build that raises fails it, as in the CLI
            print(f"{type(e).__name__}: {e}", file=sys.stderr)
            rc = 1
    results.append({"rc": rc, "stderr": err.getvalue()})
print(json.dumps(results))
"""


def _mkdocs_builds(builds: list, cwd: Path, timeout: int = 900) -> list:
    """``[(returncode, stderr)]`` of ``mkdocs build --strict`` for each ``(config, site)`` of ``builds``,
    in order, in one child process (:data:`_BUILDS`)."""
    out = subprocess.run([sys.executable, "-c", _BUILDS, json.dumps([[str(c), str(s)] for c, s in builds])],
                         cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return [(r["rc"], r["stderr"]) for r in json.loads(out.stdout.strip().splitlines()[-1])]


def test_every_public_name_has_a_docstring():
    """Every name in the ``__all__`` of a public module of poolsim and adsim (adsim's lazy ``__all__`` read at
    run time), and every public module, has a docstring where it is defined."""
    pytest.importorskip("torch", reason="adsim's modules need the adsim extra")
    api = _public_api()
    collection = api.load_griffe(str(ROOT))
    names = api.public_names(collection)
    # the enumeration reaches what users call: the two packages' headline names and a lazy export's definition
    by_public = {n.public: n.canonical for n in names}
    assert by_public["poolsim.match"] == "poolsim._strategies.match"
    assert by_public["poolsim.advise"] == "poolsim._advise.advise"
    assert by_public["adsim.Detector"] == "adsim.inference.detector.Detector"
    assert by_public["adsim.config.BACKBONES"] == "adsim.config.choices.BACKBONES"
    assert {"poolsim.core", "poolsim.verdict", "adsim.methods.registry"} <= {n.public for n in names
                                                                            if n.kind == "module"}
    assert api.undocumented(collection) == []


# a dotted poolsim/adsim name in prose or code: ``poolsim.core``, ``adsim.methods.registry.register_zero_shot``
_DOTTED = re.compile(r"(?<![\w./-])((?:poolsim|adsim)(?:\.[A-Za-z_]\w*)+)")
_FILE_SUFFIXES = {"md", "py", "txt", "json", "csv", "png", "toml", "yml"}


def _documented_paths() -> dict:
    """``{dotted name: [files naming it]}`` in README.md and docs/ (file names such as ``adsim.md`` and
    mutmut's mutant names in docs/mutation.md left out: they are not Python paths)."""
    found: dict = {}
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for name in _DOTTED.findall(path.read_text()):
            if name.rsplit(".", 1)[1] not in _FILE_SUFFIXES and "__mutmut_" not in name:
                found.setdefault(name, []).append(str(path.relative_to(ROOT)))
    return found


def _resolve(name: str) -> str | None:
    """None when ``name`` resolves as Python does and every module on its path imports under that path
    (``import poolsim.core`` works, not only ``poolsim.core`` as an attribute); else what fails."""
    import importlib
    import types

    parts = name.split(".")
    obj = importlib.import_module(parts[0])
    for i in range(1, len(parts)):
        path = ".".join(parts[:i + 1])
        if hasattr(obj, parts[i]):
            obj = getattr(obj, parts[i])
        else:
            try:
                obj = importlib.import_module(path)
            except ImportError:
                return f"{path} does not exist"
        if isinstance(obj, types.ModuleType):
            try:
                imported = importlib.import_module(path)
            except ImportError as err:
                return f"import {path} fails ({err})"
            if imported is not obj:
                return f"import {path} gives {imported.__name__}, the attribute is {obj.__name__}"
    return None


def test_every_module_path_the_docs_name_imports():
    """Every poolsim.X / adsim.X the README and the docs name resolves, and each module on its path imports
    by that path: a reader's ``import poolsim.verdict`` works (an attribute alone is not enough)."""
    pytest.importorskip("torch", reason="adsim's modules need the adsim extra")
    names = _documented_paths()
    assert {"poolsim.core", "poolsim.verdict", "poolsim.cluster", "poolsim.figures"} <= set(names)
    broken = {n: f"{_resolve(n)} ({', '.join(sorted(set(names[n])))})" for n in names if _resolve(n)}
    assert broken == {}
    assert _resolve("poolsim._verdict.no_such_name") == "poolsim._verdict.no_such_name does not exist"


def test_experiment_parameters_are_in_run_docstring_and_on_its_api_page():
    """Each experiment's own parameters and the common ones, with their defaults and allowed values, are
    in ``poolsim.experiments.run``'s docstring (generated from the registry at import) and in the docstring
    the API page renders (the griffe extension reads the generated one)."""
    griffe = pytest.importorskip("griffe", reason="the docs tools are in the test extra")

    from poolsim import experiments

    _public_api()  # puts the docs tools' griffe extension in sys.modules
    loader = griffe.GriffeLoader(search_paths=[str(ROOT)], extensions=griffe.load_extensions(
        sys.modules["griffe_docstrings"].ProjectDocstrings))
    loader.load("poolsim")  # poolsim alone: what the site build loads for this page
    page = loader.modules_collection.get_member("poolsim.experiments.run").docstring.value
    for doc in (experiments.run.__doc__, page):
        assert "<!-- generated" not in doc
        for name, exp in [(None, None), *experiments.EXPERIMENTS.items()]:
            section = experiments.parameter_table(name)
            assert section in doc.replace("\n    ", "\n")  # run's own indentation aside
            defaults = experiments.COMMON if exp is None else exp.defaults
            params = experiments.COMMON_PARAMS if exp is None else exp.params
            assert set(params) == set(defaults), name  # every parameter has its range and meaning
            for key, value in defaults.items():
                assert f"| `{key}` | `{value!r}` | " in section, (name, key)
    asym = experiments.parameter_table("asymptotic")
    assert "| `p` | `0.3` | [0, 1] |" in asym and "| `gamma` | `0.5` | [0, inf) |" in asym
    with pytest.raises(ValueError, match=r"^p must be a finite number in \[0, 1\], got 1.5$"):
        experiments.resolve("asymptotic", {"p": 1.5})
    with pytest.raises(ValueError, match=r"^p must be a finite number in \[0, 1\], got -0.1$"):
        experiments.resolve("asymptotic", {"p": -0.1})


def test_undocumented_names_are_found(tmp_path):
    """The docstring check sees a missing docstring: a function, a constant and a lazy (lazy_loader) export."""
    pytest.importorskip("lazy_loader")
    api = _public_api()
    pkg = tmp_path / "adsim_probe"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""Probe."""\n__all__ = ["documented", "bare", "LIMIT", "sub"]\n'
                                     'from . import sub\n'
                                     'def documented():\n    """Has one."""\n'
                                     'def bare():\n    pass\n'
                                     'LIMIT = 3\n')
    (pkg / "sub" / "__init__.py").write_text('"""Lazy."""\nimport lazy_loader\n__getattr__, __dir__, __all__ = '
                                             'lazy_loader.attach(__name__, submod_attrs={"impl": ["hidden"]})\n')
    (pkg / "sub" / "impl.py").write_text('"""Impl."""\ndef hidden():\n    return 1\n')
    sys.path.insert(0, str(tmp_path))
    old = api.PACKAGES
    try:
        api.PACKAGES = ("adsim_probe",)
        missing = api.undocumented(api.load_griffe(str(tmp_path)))
    finally:
        api.PACKAGES = old
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m.startswith("adsim_probe")]:
            del sys.modules[name]
    assert missing == ["adsim_probe.bare (adsim_probe.bare)", "adsim_probe.LIMIT (adsim_probe.LIMIT)",
                       "adsim_probe.sub.hidden (adsim_probe.sub.impl.hidden)"]


@pytest.fixture(scope="session")
def site(tmp_path_factory):
    pytest.importorskip("mkdocs", reason="the docs builder is in the test extra")
    pytest.importorskip("torch", reason="the tutorials run adsim: the adsim extra")
    out = tmp_path_factory.mktemp("site")
    done = _mkdocs(ROOT / "mkdocs.yml", out)
    assert done.returncode == 0, done.stderr[-6000:]
    return out


@pytest.mark.slow
def test_site_builds_strict_with_every_page(site):
    api = _public_api()
    for module in api.public_modules():
        assert (site / "api" / module / "index.html").is_file(), module
    cli = (site / "cli" / "index.html").read_text()
    for command in ("python -m poolsim.figures", "python -m poolsim.audit", "python -m adsim predict",
                    "python -m adsim train", "--zero-shot", "--slice-axis"):
        assert command in cli, command
    # the tutorials ran: their printed output is on the pages
    assert "strategy: match" in (site / "tutorials" / "pool-or-match" / "index.html").read_text()
    assert "exit status: 0" in (site / "tutorials" / "reproduce-a-figure" / "index.html").read_text()
    # the DICOM series: three images and one volume row; the NIfTI volume: 25 axial slices and one volume row
    scans = html.unescape((site / "tutorials" / "own-scans" / "index.html").read_text())
    assert len(re.findall(r"IM000[123]\.dcm\s+image\s", scans)) == 3 and re.search(r"\[series 1\]\s+volume", scans)
    assert re.search(r"slice\s+25\s+volume\s+1", scans)
    assert "registered" in (site / "tutorials" / "plugins" / "index.html").read_text()
    own = html.unescape((site / "tutorials" / "own-metadist" / "index.html").read_text())
    assert "ValueError: sampler 'custom' ignores its key" in own and "ValueError: p, gamma set" in own
    assert re.search(r"two_clusters: eps\(pool\) - eps\(match\) at K = 40: .* -> matching better: \w", own)


class _Resources(html.parser.HTMLParser):
    """Every URL the browser would fetch by itself: src of any tag, href of <link>, srcset."""

    def __init__(self):
        super().__init__()
        self.urls = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for key in ("src", "srcset", "data") + (("href",) if tag == "link" else ()):
            if attrs.get(key):
                self.urls.append((tag, attrs[key]))


@pytest.mark.slow
def test_site_fetches_nothing_from_other_hosts(site):
    """No web fonts, scripts, styles or images from another host: the site works offline (links are fine)."""
    external = []
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 20
    for page in pages:
        found = _Resources()
        found.feed(page.read_text())
        external += [(page.relative_to(site), tag, url) for tag, url in found.urls
                     if url.split(":", 1)[0].lower() in ("http", "https") or url.startswith("//")]
    for css in site.rglob("*.css"):
        text = css.read_text()
        external += [(css.relative_to(site), "css", "url(http") for _ in range(text.count("url(http"))]
        external += [(css.relative_to(site), "css", "@import") for _ in range(text.count("@import"))]
    assert external == []


# Appended to a copy of a page: after load, writes what rendered into the DOM that --dump-dom prints.
_PROBE = """<script>window.addEventListener("load", () => {
  const imgs = [...document.images], header = document.querySelector(".md-header");
  const r = {images: imgs.length, loaded: imgs.filter(i => i.complete && i.naturalWidth > 0).length,
             header: header ? getComputedStyle(header).position : "",
             text: (document.querySelector("article") || document.body).innerText.length};
  const pre = document.createElement("pre"); pre.id = "render-probe"; pre.textContent = JSON.stringify(r);
  document.body.appendChild(pre);
});</script>"""


@pytest.mark.slow
@pytest.mark.parametrize("page, min_images", [("index.html", 1), ("api/poolsim/index.html", 0),
                                              ("tutorials/reproduce-a-figure/index.html", 1),
                                              ("tutorials/own-scans/index.html", 1),
                                              ("tutorials/own-metadist/index.html", 1)])
def test_pages_render_in_chromium(site, tmp_path, page, min_images):
    """Headless Chromium loads the page from disk: the theme's CSS applies (Material's sticky header), the
    article has text, and every image -- the figures -- decoded (naturalWidth > 0)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (.ci/run installs it): the rendering is not checked")
    copy = tmp_path / "site"
    shutil.copytree(site, copy)
    target = copy / page
    target.write_text(target.read_text().replace("</body>", _PROBE + "</body>"))
    flags = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1200,900",
             "--virtual-time-budget=10000"]
    dom = subprocess.run([*flags, "--dump-dom", target.as_uri()], capture_output=True, text=True, timeout=120)
    start = dom.stdout.find('<pre id="render-probe">')
    assert start >= 0, dom.stderr[-2000:]
    probe = json.loads(html.unescape(dom.stdout[start:].split(">", 1)[1].split("</pre>", 1)[0]))
    assert probe["header"] == "sticky", probe
    assert probe["text"] > 200, probe
    assert probe["images"] >= min_images and probe["loaded"] == probe["images"], probe


@pytest.mark.slow
def test_strict_build_fails_on_a_broken_reference_or_a_raising_tutorial(tmp_path):
    """The plugins as configured turn both into build failures (a small site with the same plugins)."""
    pytest.importorskip("mkdocs", reason="the docs builder is in the test extra")
    import yaml

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    config["plugins"] = [p for p in config["plugins"] if not (isinstance(p, dict) and {"gen-files", "literate-nav"}
                                                              & set(p))]
    config["nav"] = ["index.md"]
    config.pop("exclude_docs", None)
    handler = config["plugins"][-1]["mkdocstrings"]["handlers"]["python"]
    handler["paths"] = [str(ROOT)]
    handler["options"]["extensions"] = [f"{TOOLS / 'griffe_docstrings.py'}:ProjectDocstrings"]
    pages = {"good": "See [`poolsim.da_score`][poolsim.da_score].\n\n::: poolsim.da_score\n",
             "broken": "See [`poolsim.nothing`][poolsim.nothing].\n\n::: poolsim.da_score\n",
             "raises": "```python exec=\"on\"\nraise ValueError('a tutorial that fails')\n```\n"}
    builds = []
    for name, text in pages.items():  # one site folder per page, all built by one child process
        (tmp_path / name / "docs").mkdir(parents=True)
        (tmp_path / name / "docs" / "index.md").write_text(text)
        (tmp_path / name / "mkdocs.yml").write_text(yaml.safe_dump({**config, "docs_dir": "docs"}))
        builds.append((tmp_path / name / "mkdocs.yml", tmp_path / f"site_{name}"))
    results = dict(zip(pages, _mkdocs_builds(builds, tmp_path, timeout=300)))
    assert results["good"][0] == 0, results["good"][1][-3000:]
    assert results["broken"][0] != 0 and "poolsim.nothing" in results["broken"][1], results["broken"][1][-3000:]
    assert results["raises"][0] != 0 and "a tutorial that fails" in results["raises"][1], results["raises"][1][-3000:]
