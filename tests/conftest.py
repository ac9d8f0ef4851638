"""Strict test set-up: warnings are errors (pyproject), fixed seeds, float64 for JAX.

Every test that needs randomness takes ``rng`` (a fixed-seed NumPy generator) or uses a literal
JAX key; nothing depends on global random state.
"""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

# Statistical and cross-backend comparisons need float64 on the JAX side too.
jax.config.update("jax_enable_x64", True)


@pytest.fixture
def rng():
    return np.random.default_rng(20260101)
