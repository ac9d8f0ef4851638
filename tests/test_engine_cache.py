"""Engine plumbing: fixed compiled shapes, the column-wise frame, and JAX's persistent compilation
cache in ``poolsim.io.cache_dir("jax")`` and the program store in ``poolsim.io.cache_dir("programs")`` (every
test uses a temporary POOLSIM_CACHE_DIR)."""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest

from poolsim import _engine, experiments

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = dict(Ks=(5, 9, 12), n=40, every=3, radius=2.5, gamma=0.5, jitter=0.2)


@pytest.mark.slow
def test_new_seed_count_does_not_recompile():
    # Two seed counts above SMALL_CHUNK share one compiled shape per program. chunk 128 (not the
    # default 1024: the same rule, an eighth of the seeds to run).
    spec, _ = experiments.spec("domain_addition", **SMALL)
    spec = spec._replace(tol=1.5e-4)  # a Spec no other test compiled: counts start at 0
    _engine.simulate(spec, np.arange(100), chunk=128)
    _engine.simulate(spec, np.arange(7, 207), chunk=128)  # 2 chunks, the last one padded
    assert [f._cache_size() for f in _engine.compiled(spec, "float32")] == [1, 1]
    _engine.simulate(spec, np.arange(5), chunk=128)  # small runs: the one other shape
    assert [f._cache_size() for f in _engine.compiled(spec, "float32")] == [2, 2]


def test_chunk_sizes_come_from_a_short_ladder():
    # Full chunks of `chunk`, then the smallest power of two (>= SMALL_CHUNK) holding the rest:
    # at most log2(1024 / 64) + 1 = 5 shapes for any seed count; 100 seeds run as 128, not 1024.
    spec, _ = experiments.spec("domain_addition", **SMALL)

    def sizes(S, chunk=1024, ndev=1):
        return _engine.chunk_plan(S, spec, chunk=chunk, ndev=ndev, budget="64GB").sizes

    assert sizes(100) == (128,) and sizes(1000) == (1024,) and sizes(5) == (_engine.SMALL_CHUNK,)
    assert sizes(1025) == (1024, 64) and sizes(3000) == (1024, 1024, 1024)
    assert sizes(5, chunk=4) == (4, 4) and sizes(100, ndev=3) == (129,)
    shapes = {c for S in range(1, 5000, 7) for c in sizes(S)}
    assert shapes == {64, 128, 256, 512, 1024}


@pytest.mark.parametrize("d", [2, 3, 9])
def test_eps_equals_numpy_norm_bitwise(rng, d):
    est = rng.normal(size=(50, 4, 3, d)).astype(np.float32)
    mu = rng.normal(size=d)
    want = np.linalg.norm(est.astype(float) - mu, axis=-1)
    np.testing.assert_array_equal(experiments.eps(est, mu), want)


@pytest.mark.slow
def test_frame_columns_equal_the_row_by_row_definition():
    df = experiments.run("domain_addition", seeds=4, **SMALL)
    res, P = experiments.simulate("domain_addition", seeds=4, **SMALL)
    assert isinstance(df.strategy.dtype, pd.CategoricalDtype)
    assert isinstance(df.experiment.dtype, pd.CategoricalDtype)
    rows = [(s, K, st, float(np.linalg.norm(res.estimates[i, k, j].astype(float))),
             int(res.n_domains[i, k, j]), bool(res.converged[i, k]) if st == "match" else True,
             int(res.n_iter[i, k]) if st == "match" else 0)
            for i, s in enumerate(range(4)) for k, K in enumerate(P["Ks"])
            for j, st in enumerate(_engine.STRATEGIES)]
    want = pd.DataFrame(rows, columns=["seed", "K", "strategy", "eps", "n_domains", "converged",
                                       "n_iter"])
    got = df[want.columns].astype({"strategy": str})
    pd.testing.assert_frame_equal(got, want.astype({"strategy": str}), check_dtype=False)
    assert (df.experiment == "domain_addition").all()


@pytest.mark.slow
def test_run_gathers_only_the_frame_fields():
    res, _ = experiments.simulate("domain_addition", seeds=3, fields=experiments.FRAME_FIELDS,
                                  **SMALL)
    assert res.included is None and res.means is None and res.xbar is None
    assert res.estimates.shape == (3, 3, 3, 2)
    with pytest.raises(ValueError, match="fields must be names"):
        experiments.simulate("domain_addition", seeds=3, fields=("nope",), **SMALL)


# A child process runs domain_addition at small parameters and reports what it traced (engine
# programs, counted by wrapping the traced functions: they run only while JAX traces them), JAX
# cache hits and warnings. SOLO=1: the sufficient-statistics path only (2 programs), for the tests
# that only need to see a recompile; otherwise both paths and a run with a user-supplied
# meta-distribution (not stored: JAX's own persistent cache serves it).
_CHILD = textwrap.dedent("""
    import functools, json, os, sys, warnings
    import jax
    hits = []
    jax.monitoring.register_event_listener(
        lambda event, **kw: hits.append(1) if event == "/jax/compilation_cache/cache_hits" else None)
    from poolsim import _cache, _engine, _programs, experiments, metadist
    if os.environ.get("FAKE_ENV"):  # one machine property as another machine would report it
        part, value = os.environ["FAKE_ENV"].split("=", 1)
        real = _programs.environment_parts
        _programs.environment_parts = lambda: {**real(), part: value}
    traces = {}

    def counting(f):
        def wrapper(*a, **k):
            traces[f.__name__] = traces.get(f.__name__, 0) + 1
            return f(*a, **k)
        return functools.wraps(f)(wrapper)

    import importlib
    programs = importlib.import_module("poolsim._engine.compiled")  # where the programs are built
    programs.draw_batch, programs.estimate_batch = counting(_engine.draw_batch), counting(_engine.estimate_batch)
    kw = dict(seeds=int(sys.argv[1]), chunk=128, Ks=(5, 9, 12), n=40,
              dtype=os.environ.get("DTYPE", "float32"))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for mat in (False,) if os.environ.get("SOLO") else (False, True):
            experiments.run("domain_addition", materialize=mat, **kw)
        if not os.environ.get("SOLO"):
            experiments.run("domain_addition", materialize=False, **kw,
                            metadist=metadist.outlier_schedule(3, 2.5, d=2))
    print(json.dumps({"hits": len(hits), "traces": traces, "dir": str(_cache.enable_jax_cache()),
                      "warnings": [f"{w.category.__name__}: {w.message}" for w in seen]}))
""")


# The children compile at XLA's backend optimisation level 0 (~40% less CPU for the engine's programs
# than the default level, measured): what the tests check -- traces, stored files, cache hits,
# warnings -- does not depend on how fast the compiled code runs. (The key still holds XLA_FLAGS:
# the "xla_flags" case below changes the level.)
XLA_FLAGS = f"{os.environ.get('XLA_FLAGS', '')} --xla_backend_optimization_level=0".strip()


def _child(cache, seeds=100, root=ROOT, **env):
    e = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=root, POOLSIM_CACHE_DIR=str(cache),
             XLA_FLAGS=XLA_FLAGS)
    e.update(env)
    if "JAX_ENABLE_X64" not in env:
        e.pop("JAX_ENABLE_X64", None)
    out = subprocess.run([sys.executable, "-c", _CHILD, str(seeds)], capture_output=True,
                         text=True, env=e, cwd=root, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _stored(cache):
    """Program files in the store, ``poolsim.io.cache_dir("programs")``."""
    return sorted(p.name for p in (cache / "programs").iterdir())


def _jax_entries(cache):
    """Engine program files in JAX's cache folder (JAX names entries after the jitted function)."""
    return sorted(p.name for p in (cache / "jax").iterdir() if "batch" in p.name)


@pytest.fixture(scope="module")
def first_process(tmp_path_factory):
    """``(cache folder, child result, snapshot)`` of one process that compiled everything into an empty
    cache; each test below restores the folder from the snapshot, at the same path (JAX's key holds
    XLA options derived from the cache folder's path, so a copy elsewhere would miss): one cold compile
    for the file instead of one per test."""
    root = tmp_path_factory.mktemp("jax_cache")
    cache, snapshot = root / "cache", root / "snapshot"
    result = _child(cache)
    shutil.copytree(cache, snapshot)
    return cache, result, snapshot


def _restored(first_process):
    cache, result, snapshot = first_process
    shutil.rmtree(cache)
    shutil.copytree(snapshot, cache)
    return cache, result


@pytest.mark.slow
def test_second_process_is_served_from_the_store(first_process):
    cache, first = _restored(first_process)
    assert first["dir"] == str(cache / "jax") and first["warnings"] == []
    # 2 paths x (draws, estimates) stored, each traced once; the user meta-distribution's pair
    # traced too (not stored) and compiled into JAX's cache instead
    assert first["traces"] == {"draw_batch": 3, "estimate_batch": 3}, first
    files = _stored(cache)
    assert [f.split("-")[0] for f in files] == ["draws"] * 2 + ["estimates"] * 2, files
    assert len(_jax_entries(cache)) == 2, _jax_entries(cache)
    second = _child(cache, seeds=256)  # another seed count, chunks of the same rung: same programs
    # the stored programs are not traced again; the user meta-distribution's pair is traced and
    # served by JAX's cache (its sampler is a new object: nothing says it traces alike)
    assert second["traces"] == {"draw_batch": 1, "estimate_batch": 1}, second
    assert second["hits"] >= 2 and second["warnings"] == []
    assert _stored(cache) == files and len(_jax_entries(cache)) == 2


@pytest.mark.slow
@pytest.mark.parametrize("change", ["shape", "dtype", "x64", "xla_flags", "source", "machine"])
def test_key_changes_give_a_recompile(first_process, change, tmp_path):
    # Each change must miss the store: both programs traced again and stored anew.
    cache, _ = _restored(first_process)
    before = set(_stored(cache))
    root = ROOT
    if change == "source":  # poolsim's code edited: a copy of the package with one more line
        root = str(tmp_path / "src")
        shutil.copytree(os.path.join(ROOT, "poolsim"), os.path.join(root, "poolsim"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        with open(os.path.join(root, "poolsim", "_engine", "__init__.py"), "a") as fh:
            fh.write("# edited\n")
    env = {"dtype": {"DTYPE": "float64"}, "x64": {"JAX_ENABLE_X64": "1"},
           "xla_flags": {"XLA_FLAGS": XLA_FLAGS.replace("level=0", "level=1")},
           "machine": {"FAKE_ENV": "device_kind=another accelerator"}}.get(change, {})
    got = _child(cache, seeds=20 if change == "shape" else 100, root=root, SOLO="1", **env)
    assert got["traces"] == {"draw_batch": 1, "estimate_batch": 1}, (change, got)
    new = set(_stored(cache)) - before
    assert sorted(f.split("-")[0] for f in new) == ["draws", "estimates"], (change, sorted(new))


def test_every_environment_part_is_in_the_key(monkeypatch):
    # What the key is made of, part by part: changing any one gives another key.
    import jax
    import jaxlib

    from poolsim import _programs

    parts = _programs.environment_parts()
    assert set(parts) == {"format", "python", "jax", "jaxlib", "platform", "platform_version",
                          "device_kind", "xla_flags", "cpu", "poolsim_source"}
    assert parts["xla_flags"] == os.environ.get("XLA_FLAGS", "")
    assert parts["jax"] == jax.__version__ and parts["jaxlib"] == jaxlib.__version__
    assert parts["device_kind"] == jax.local_devices()[0].device_kind
    assert parts["platform"] == jax.default_backend()
    assert parts["poolsim_source"] == _programs.source_digest()
    prog = _programs.Program(None, "draws", "spec")
    sig = ((("tree", (1024,), "uint32", False)), (("jax_enable_x64", "False"),))
    keys = set()
    for name in list(parts) + [None]:
        changed = dict(parts) if name is None else {**parts, name: str(parts[name]) + "+"}
        monkeypatch.setattr(_programs, "environment_parts", lambda c=changed: c)
        _programs.environment.cache_clear()
        keys.add(prog.key(sig))
    _programs.environment.cache_clear()
    assert len(keys) == len(parts) + 1
    other = [prog.key((sig[0], (("jax_enable_x64", "True"),))),
             _programs.Program(None, "draws", "spec2").key(sig),
             _programs.Program(None, "estimates", "spec").key(sig)]
    assert len(keys | set(other)) == len(keys) + 3


@pytest.mark.slow
def test_damaged_entry_warns_once_and_is_compiled_again(first_process):
    cache, _ = _restored(first_process)
    files = _stored(cache)
    draws = [f for f in files if f.startswith("draws")]
    for name in draws:  # one byte flipped inside the payload of both draws programs
        path = cache / "programs" / name
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    got = _child(cache)
    assert len(got["warnings"]) == 1 and "cannot be used" in got["warnings"][0], got
    assert got["warnings"][0].startswith("CacheWarning") and "checksum" in got["warnings"][0]
    # both damaged programs compiled again (the user meta-distribution's pair as always)
    assert got["traces"] == {"draw_batch": 3, "estimate_batch": 1}, got
    from poolsim import _programs

    for name in draws:  # replaced by sound entries
        data = (cache / "programs" / name).read_bytes()
        digest, _, blob = data[len(_programs._MAGIC):].partition(b"\n")
        assert hashlib.sha256(blob).hexdigest().encode() == digest


@pytest.mark.slow
def test_unwritable_cache_folder_warns_once_and_runs(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    got = _child(blocker / "cache", SOLO="1")  # a folder below a file: cannot be created, even as root
    assert got["dir"] == "None"
    assert len(got["warnings"]) == 1 and got["warnings"][0].startswith("CacheWarning"), got


def test_program_store_on_off_and_loaded(monkeypatch, tmp_path):
    # A Program on a tiny function: stored on the first call, loaded by a fresh Program (as a
    # second process would), bypassed with POOLSIM_CACHE_DIR=off or without an ident.
    import jax

    from poolsim import _programs

    def make(ident="double"):
        return _programs.Program(jax.jit(lambda x: 2 * x), "double", ident)

    x = np.arange(5, dtype=np.float32)
    monkeypatch.setenv("POOLSIM_CACHE_DIR", str(tmp_path))
    first = make()
    np.testing.assert_array_equal(first(x), 2 * x)
    assert (first.compiled, first.loaded, first.fn._cache_size()) == (1, 0, 0)
    assert len(list((tmp_path / "programs").iterdir())) == 1
    second = make()
    np.testing.assert_array_equal(second(x), 2 * x)
    assert (second.compiled, second.loaded) == (0, 1)
    second(x + 1)  # same signature: the executable in memory
    assert (second.compiled, second.loaded, second._cache_size()) == (0, 1, 1)
    second(np.arange(6, dtype=np.float32))  # another shape: another program
    assert (second.compiled, second._cache_size()) == (1, 2)
    assert len(list((tmp_path / "programs").iterdir())) == 2
    unkeyed = make(None)  # nothing promises the program: JAX's jit alone
    unkeyed(x)
    assert (unkeyed.compiled, unkeyed.loaded, unkeyed.fn._cache_size()) == (0, 0, 1)
    monkeypatch.setenv("POOLSIM_CACHE_DIR", "off")
    assert _programs.store_dir() is None
    off = make()
    np.testing.assert_array_equal(off(x), 2 * x)
    assert (off.compiled, off.loaded, off.fn._cache_size()) == (0, 0, 1)
    assert len(list((tmp_path / "programs").iterdir())) == 2


def test_executable_from_jax_cache_is_not_stored(monkeypatch, tmp_path):
    # An executable that JAX's persistent cache served cannot be serialized again (its copy fails
    # when run), so it must not reach the store. The store's compile uses a key no poolsim compile
    # writes; should JAX report a hit all the same (its cache-hit event, as JAX records it in
    # compile_or_get_cached), the program runs but is not stored.
    import jax

    from poolsim import _programs

    real = jax.stages.Lowered.compile

    def served_from_cache(self, *a, **k):
        jax.monitoring.record_event("/jax/compilation_cache/cache_hits")
        return real(self, *a, **k)

    monkeypatch.setattr(jax.stages.Lowered, "compile", served_from_cache)
    monkeypatch.setenv("POOLSIM_CACHE_DIR", str(tmp_path))
    x = np.arange(7, dtype=np.float32)
    prog = _programs.Program(jax.jit(lambda v: 3 * v + 0.5), "triple", "triple")
    np.testing.assert_array_equal(prog(x), 3 * x + 0.5)
    assert prog.compiled == 1 and not (tmp_path / "programs").exists()
    monkeypatch.setattr(jax.stages.Lowered, "compile", real)
    again = _programs.Program(jax.jit(lambda v: 3 * v + 0.5), "triple", "triple")
    np.testing.assert_array_equal(again(x), 3 * x + 0.5)  # a fresh compile is stored
    assert again.compiled == 1 and len(list((tmp_path / "programs").iterdir())) == 1


def test_chunk_medians_of_own_rows_equal_the_whole_chunk(rng):
    # The padded rows of a chunk repeat its last seed: their medians are copied, not computed.
    spec, _ = experiments.spec("domain_addition", **SMALL)
    samples = rng.normal(size=(6, spec.K_max, spec.n, spec.d)).astype(np.float32)
    samples[4:] = samples[3]  # 4 own seeds, 2 padding rows
    want = _engine.host_prefix_medians(samples.reshape(6, -1, spec.d), spec.n, spec.Ks)
    np.testing.assert_array_equal(_engine.chunk_medians(samples, 4, spec), want)
    np.testing.assert_array_equal(_engine.chunk_medians(samples, 6, spec), want)
