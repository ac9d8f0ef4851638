"""Strict test set-up: warnings are errors (pyproject), fixed seeds, float64 for JAX, and
deterministic hypothesis runs.

Every test that needs randomness takes ``rng`` (a fixed-seed NumPy generator) or uses a literal
JAX key; nothing depends on global random state.

Hypothesis profiles (choose with the environment variable ``HYPOTHESIS_PROFILE``):

* ``default`` -- what ``python -m pytest -q`` and ``.ci/run`` use: ``derandomize=True`` (the
  examples are a fixed function of each test, so every run draws the same ones) and no example
  database (``database=None``: nothing read from or written to ``.hypothesis/``), so two runs of
  the suite run the same tests with the same outcomes. ``max_examples = 100`` (hypothesis' own
  default; tests that set a smaller budget keep it, see :func:`poolsim.testing.examples`).
* ``deep`` -- ``HYPOTHESIS_PROFILE=deep python -m pytest -q tests/test_theory_properties.py
  tests/test_multimodal.py``: 50x the examples of every test (``max_examples = 5000`` and every
  ``examples(n)`` budget times 50), fresh random examples on each run, failures saved to the local
  example database and replayed first on the next run. For looking for counterexamples, not CI. It is
  :data:`poolsim.testing.DEEP`, the profile users get from ``poolsim.testing`` too.

Parallel runs (pytest-xdist, ``-n auto --dist loadfile`` from pyproject's ``addopts``): each worker is a
process of its own, set up here before JAX, NumPy or torch start their thread pools:

* threads: the cores shared out among the workers (``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``,
  ``MKL_NUM_THREADS``, XLA's Eigen pool via ``XLA_FLAGS``; torch follows ``OMP_NUM_THREADS`` and
  ``tests/adsim/conftest.py`` sets one torch thread), so two workers on two cores do not each start two;
* caches a test run writes: ``POOLSIM_CACHE_DIR`` (poolsim's compiled programs), ``TORCHINDUCTOR_CACHE_DIR``
  and ``TRITON_CACHE_DIR`` point to a fresh folder per worker, removed at exit, unless the environment
  already sets them (tests that need their own folder, such as ``test_adsim_compile_inductor.py``, set it
  themselves). Not moved: matplotlib's font cache (written under a lock file, atomically, once per
  machine) and hypothesis' example database (``default`` profile: none; ``deep``: hypothesis'
  directory database, which is safe for concurrent writers);
* files: every test writes under its own ``tmp_path`` (per worker ``basetemp``); subprocesses pick free
  ports (``torchrun --standalone``, ``socket.bind(("localhost", 0))``).

The quick tier (``-m "not slow"``) runs every parametrised test at every value of each of its parameters,
not at every combination: :func:`pytest_collection_modifyitems` marks a case ``slow`` when the cases
before it already cover each of its (parameter, value) pairs (a greedy covering in collection order, the
same on every worker). The full suite runs every combination.

Bytecode: the suite writes it (pytest's assertion-rewritten test modules, the packages' modules) to the
git-ignored ``__pycache__`` folders even where ``PYTHONDONTWRITEBYTECODE`` is set, as some CI images and
this project's workplace do: without it every worker compiles and rewrites all test modules again on every
run, ~7 s of CPU per worker on the 2-core machine (``benchmarks/results/tests.md``). Child processes the
tests start keep the environment's setting.

``python -m pytest -n 0`` runs everything in one process (as the mutation runs do).
"""
import atexit
import os
import shutil
import sys
import tempfile

sys.dont_write_bytecode = False

os.environ.setdefault("JAX_PLATFORMS", "cpu")


def _isolate_worker(worker: str, workers: int) -> None:
    threads = str(max(1, (os.cpu_count() or 1) // max(1, workers)))
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, threads)
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_cpu_multi_thread_eigen" not in flags and threads == "1":
        os.environ["XLA_FLAGS"] = f"{flags} --xla_cpu_multi_thread_eigen=false".strip()
    from threadpoolctl import threadpool_limits

    threadpool_limits(int(threads))  # BLAS pools of libraries a plugin may have loaded before this file
    caches = tempfile.mkdtemp(prefix=f"pytest-caches-{worker}-")
    atexit.register(shutil.rmtree, caches, ignore_errors=True)
    for var, sub in (("POOLSIM_CACHE_DIR", "poolsim"), ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
                     ("TRITON_CACHE_DIR", "triton")):
        os.environ.setdefault(var, os.path.join(caches, sub))


if os.environ.get("PYTEST_XDIST_WORKER"):  # set by pytest-xdist in each worker process
    _isolate_worker(os.environ["PYTEST_XDIST_WORKER"], int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from quick_tier import quick_tier_cases  # noqa: E402  (tests/quick_tier.py)


def pytest_configure(config):
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        return  # pytest-xdist's controller runs no test: JAX and hypothesis are set up in each worker
    import jax
    from hypothesis import settings

    # Statistical and cross-backend comparisons need float64 on the JAX side too.
    jax.config.update("jax_enable_x64", True)
    import poolsim.testing  # registers the users' "deep" profile

    settings.register_profile("default", max_examples=100, derandomize=True, database=None,
                              deadline=None, print_blob=True)
    poolsim.testing.load_profile()  # HYPOTHESIS_PROFILE, else "default"


@pytest.fixture
def rng():
    return np.random.default_rng(20260101)


@pytest.hookimpl(tryfirst=True)  # before pytest's own hook deselects by ``-m``
def pytest_collection_modifyitems(config, items):
    for item in quick_tier_cases(items):
        item.add_marker(pytest.mark.slow)
