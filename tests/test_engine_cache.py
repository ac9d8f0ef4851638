"""Engine plumbing: fixed compiled shapes, the column-wise frame, and JAX's persistent compilation
cache in ``poolsim.cache_dir("jax")`` (every test uses a temporary POOLSIM_CACHE_DIR)."""
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
    # Two seed counts above SMALL_CHUNK share one compiled shape per program; default chunk 1024.
    spec, _ = experiments.spec("domain_addition", **SMALL)
    spec = spec._replace(tol=1.5e-4)  # a Spec no other test compiled: counts start at 0
    _engine.simulate(spec, np.arange(100), chunk=1024)
    _engine.simulate(spec, np.arange(7, 1307), chunk=1024)  # 2 chunks, the last one padded
    assert [f._cache_size() for f in _engine._compiled(spec, "float32")] == [1, 1]
    _engine.simulate(spec, np.arange(5), chunk=1024)  # small runs: the one other shape
    assert [f._cache_size() for f in _engine._compiled(spec, "float32")] == [2, 2]


def test_chunk_size_is_one_of_two_shapes():
    assert {_engine.chunk_size(S, 1024) for S in (65, 1000, 1025, 10**5)} == {1024}
    assert {_engine.chunk_size(S, 1024) for S in (1, 2, 64)} == {_engine.SMALL_CHUNK}
    assert _engine.chunk_size(5, 4) == 4 and _engine.chunk_size(100, 1024, ndev=3) == 1026


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


_CHILD = textwrap.dedent("""
    import json, os, sys, warnings
    import jax
    hits = []
    jax.monitoring.register_event_listener(
        lambda event, **kw: hits.append(1) if event == "/jax/compilation_cache/cache_hits" else None)
    if os.environ.get("FAKE_JAXLIB"):  # what a jaxlib upgrade changes in JAX's cache key
        import jax._src.cache_key as ck
        ck.jaxlib_version_str = os.environ["FAKE_JAXLIB"]
    from poolsim import _cache, experiments
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for mat in (False, True):
            experiments.run("domain_addition", seeds=int(sys.argv[1]), chunk=128,
                            materialize=mat, Ks=(5, 9, 12), n=40)
    print(json.dumps({"hits": len(hits), "dir": str(_cache.enable_jax_cache()),
                      "warnings": [f"{w.category.__name__}: {w.message}" for w in seen]}))
""")


def _child(cache, seeds=100, **env):
    e = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, POOLSIM_CACHE_DIR=str(cache), **env)
    if "JAX_ENABLE_X64" not in env:
        e.pop("JAX_ENABLE_X64", None)
    out = subprocess.run([sys.executable, "-c", _CHILD, str(seeds)], capture_output=True,
                         text=True, env=e, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _programs(cache):
    """Engine program files in the cache folder (JAX names entries after the jitted function)."""
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
def test_second_process_is_served_from_the_cache(first_process):
    cache, first = _restored(first_process)
    assert first["dir"] == str(cache / "jax") and first["warnings"] == []
    files = _programs(cache)
    # 2 paths x (draws, estimates): every engine program written, the materialised one too
    assert len([f for f in files if f.startswith("jit__draw_batch")]) == 2, files
    assert len([f for f in files if f.startswith("jit__batch")]) == 2, files
    second = _child(cache, seeds=300)  # another seed count: the same programs
    assert second["hits"] >= 4 and _programs(cache) == files


@pytest.mark.slow
@pytest.mark.parametrize("change", ["shape", "x64", "xla_flags", "jaxlib"])
def test_cache_key_changes_give_a_recompile(first_process, change):
    # JAX keys entries by the program (shapes, dtypes), jaxlib version, backend and its version,
    # XLA flags, compile options and devices; each change here must miss and write new entries.
    cache, _ = _restored(first_process)
    before = set(_programs(cache))
    env = {"x64": {"JAX_ENABLE_X64": "1"},
           "xla_flags": {"XLA_FLAGS": "--xla_backend_optimization_level=1"},
           "jaxlib": {"FAKE_JAXLIB": "0.0.0+poolsim.test"}}.get(change, {})
    got = _child(cache, seeds=20 if change == "shape" else 100, **env)  # 20: SMALL_CHUNK shape
    new = set(_programs(cache)) - before
    assert len([f for f in new if f.startswith("jit__batch")]) == 2, (change, sorted(new))
    assert got["hits"] == 0 or change == "shape", got  # only the shape change keeps other hits


@pytest.mark.slow
def test_unwritable_cache_folder_warns_once_and_runs(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    got = _child(blocker / "cache")  # a folder below a file: cannot be created, even as root
    assert got["dir"] == "None"
    assert len(got["warnings"]) == 1 and got["warnings"][0].startswith("CacheWarning"), got

