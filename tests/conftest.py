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
  example database and replayed first on the next run. For looking for counterexamples, not CI.
"""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

# Statistical and cross-backend comparisons need float64 on the JAX side too.
jax.config.update("jax_enable_x64", True)

settings.register_profile("default", max_examples=100, derandomize=True, database=None,
                          deadline=None, print_blob=True)
settings.register_profile("deep", max_examples=100 * 50, derandomize=False, deadline=None,
                          print_blob=True, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture
def rng():
    return np.random.default_rng(20260101)
