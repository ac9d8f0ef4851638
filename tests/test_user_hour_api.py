"""A new user's hour with the Python API, as a test (issue 51, items 2 and 3): the things a user tries with only
the README, the docs and the docstrings -- bring a meta-distribution of their own, override a parameter beside
it, jit and differentiate ``match`` -- each giving a right answer or a one-line error, never a silent wrong one.

Expected values: the chi-squared law of a sample variance (seeds that shared their domain means), finite
differences (the matched mean is linear in the data while the matched set is fixed), and the docs' own table of
transformations, run cell by cell."""
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import poolsim
from poolsim import experiments, metadist

ROOT = Path(__file__).resolve().parents[1]
HOW = "write it with JAX random functions of the key it is given, e.g. lambda key, K: jax.random.t(key, 2.0, (K, 2))"


def _domains(seed=0, K=8, N=6, d=2):
    """K domains of N samples; every third domain shifted by 3 along e1 (matching has a real choice)."""
    rng = np.random.default_rng(seed)
    mu = 0.3 * rng.normal(size=(K, d))
    mu[::3, 0] += 3.0
    return mu[:, None, :] + 0.5 * rng.normal(size=(K, N, d))


def test_a_numpy_sampler_is_refused_in_one_line_saying_how_to_write_it():
    """The sampler a NumPy user writes first ignores its key: refused when wrapped, not run silently."""
    with pytest.raises(ValueError) as err:
        metadist.from_callable(lambda key, K: 0.5 * np.random.default_rng().standard_t(2, size=(K, 2)), d=2)
    msg = str(err.value)
    assert "\n" not in msg and "ignores its key" in msg and msg.endswith(HOW), msg


@pytest.mark.slow
def test_a_jax_sampler_gives_every_seed_its_own_domain_means():
    """The same Student-t law written with JAX: every seed draws its own domain means, and pooling's estimate
    varies across seeds by more than the within-domain noise alone could make it (with shared means its sample
    variance s^2 over S seeds has (S - 1) s^2 / v ~ chi2(S - 1), v = sigma^2 / (K n); the bound is that law's
    1 - 1e-9 quantile)."""
    heavy = metadist.from_callable(lambda key, K: 0.5 * jax.random.t(key, 2.0, (K, 2)), d=2, name="student_t")
    S, K, n, sigma = 30, 10, 20, 0.8
    res, _ = experiments.simulate("asymptotic", seeds=S, metadist=heavy, Ks=(K,), n=n, sigma=sigma,
                                  fields=("means", "estimates"))
    means = res.means.reshape(S, -1)
    assert len({m.tobytes() for m in means}) == S  # no two seeds share their domain means
    pooled = res.estimates[:, 0, 0, 0].astype(float)  # (seed, K, strategy "pool", coordinate 0)
    ratio = (S - 1) * pooled.var(ddof=1) / (sigma**2 / (K * n))
    assert ratio > stats.chi2.ppf(1 - 1e-9, S - 1), ratio


def test_law_parameters_beside_metadist_are_an_error():
    """``p=0.9, gamma=3.0`` beside ``metadist=`` would change nothing: a one-line error naming them."""
    mine = metadist.from_callable(lambda key, K: jax.random.normal(key, (K, 2)), d=2)
    with pytest.raises(ValueError) as err:
        experiments.run("asymptotic", seeds=5, metadist=mine, p=0.9, gamma=3.0)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("p, gamma set the 'asymptotic' experiment's own meta-distribution"), msg


def test_jit_keeps_the_documented_checks():
    """The issue's two calls: a NaN in X and a traced tau = 0 raise when the compiled program runs (the message
    of the eager ValueError inside JAX's run-time error); good input gives the eager numbers."""
    X = _domains()
    bad = X.copy()
    bad[2, 1, 0] = np.nan
    f = jax.jit(lambda x: poolsim.match(x, 1.0).mean)
    np.testing.assert_allclose(f(X), poolsim.match(X, 1.0).mean, rtol=1e-12)
    with pytest.raises((RuntimeError, ValueError), match="X contains NaN or inf; all values must be finite"):
        jax.block_until_ready(f(bad))
    with pytest.raises((RuntimeError, ValueError), match="tau must be a finite number in \\(0, inf\\)"):
        jax.block_until_ready(jax.jit(lambda t: poolsim.match(jnp.asarray(X), t).mean)(0.0))


def test_grad_through_match_agrees_with_finite_differences():
    """jax.grad (reverse mode) of the matched mean equals central finite differences on float64 NumPy (step
    1e-6; no domain mean is within 1e-6 of the radius, so the matched set does not change)."""
    X = _domains(1)
    res = poolsim.match(X, 1.0)
    assert 0 < float(res.included.sum()) < X.shape[0]

    def f(x):
        return poolsim.match(x, 1.0).mean[0]

    g = np.asarray(jax.jit(jax.grad(f))(jnp.asarray(X)))
    h, fd = 1e-6, np.zeros_like(X)
    for idx in np.ndindex(X.shape):
        e = np.zeros_like(X)
        e[idx] = h
        fd[idx] = (f(X + e) - f(X - e)) / (2 * h)
    np.testing.assert_allclose(g, fd, atol=1e-8)
    assert np.count_nonzero(g) == res.included.sum() * X.shape[1]  # one nonzero per matched sample


def _table():
    """The docs' transformation table: ``{first cell: {column: "yes" | "no"}}``."""
    text = (ROOT / "docs" / "concepts.md").read_text()
    lines = text[text.index("| function | `jax.jit`"):].split("\n\n")[0].splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = dict(zip(header[1:], cells[1:]))
    return rows


@pytest.mark.slow
def test_the_transformation_table_in_the_docs_is_true():
    """Every cell of docs/concepts.md's table: "yes" runs (finite output), "no" raises. The last row is checked on
    da_score and advise (theory and experiments are NumPy on the host, as they are)."""
    torch = pytest.importorskip("torch")
    from poolsim import core

    X = _domains(2)
    init = np.array([[0.0, 0.0], [3.0, 0.0]])

    def iterate(x):
        lib = torch if torch.is_tensor(x) else jnp
        m = x.mean(axis=1) if lib is jnp else x.mean(dim=1)
        return core.iterate_match(m, lib.ones(m.shape[0], dtype=m.dtype), m[1], 1.0, "l2", tol=1e-4,
                                  max_iter=100)[0]

    functions = {
        "naive_pool": [lambda x: poolsim.naive_pool(x).mean],
        "subsample": [lambda x: poolsim.subsample(1, x, 3, 4).mean],
        "match": [lambda x: poolsim.match(x, 1.0).mean],
        "match_multimodal": [lambda x: poolsim.match_multimodal(x, [1.0, 1.0], init=init).centroids],
        "poolsim.core": [iterate],
        "da_score": [lambda x: poolsim.da_score(x[0, :5, 0]), lambda x: poolsim.advise(x, seeds=30).estimate],
    }
    transforms = {
        "`jax.jit`": lambda f: jax.jit(f)(jnp.asarray(X)),
        "`jax.vmap`": lambda f: jax.vmap(f)(jnp.stack([jnp.asarray(X)] * 2)),
        "`jax.grad` (reverse)": lambda f: jax.grad(lambda x: jnp.sum(f(x)))(jnp.asarray(X)),
        "`jax.jacfwd` (forward)": lambda f: jax.jacfwd(f)(jnp.asarray(X)),
        "torch autograd": lambda f: _torch_grad(torch, f, X),
    }
    table = _table()
    assert len(table) == len(functions)
    for row, cells in table.items():
        name = re.search(r"`([\w.]+)`", row).group(1)
        assert set(cells) == set(transforms), cells
        for column, claim in cells.items():
            assert claim in ("yes", "no"), (row, column, claim)
            for fn in functions[name]:
                if claim == "yes":
                    out = np.asarray(transforms[column](fn))
                    assert np.all(np.isfinite(out)), (name, column)
                else:
                    with pytest.raises(Exception):  # noqa: B017 - any error: the table says only that it fails
                        transforms[column](fn)


def _torch_grad(torch, f, X):
    """The gradient torch autograd gives of ``sum(f(X))``."""
    x = torch.tensor(X, requires_grad=True)
    torch.sum(f(x)).backward()
    return x.grad.numpy()
