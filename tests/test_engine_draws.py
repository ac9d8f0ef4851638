"""The engine draws only the subsampling numbers it reads (``poolsim._rng.prefix_draw``): the
kept values are JAX's own draws bit for bit, and the engine's per-seed results equal those from
drawing every entry (the previous draws program, ``prefix=False``)."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from poolsim import _engine, _rng, experiments

SMALL = dict(Ks=(5, 9, 12), n=40, every=3, radius=2.5, gamma=0.5, jitter=0.2)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("sampler", ["normal", "uniform", "randint"])
def test_prefix_draw_equals_the_full_draw_where_kept(dtype, sampler):
    # Oracle: the same sampler on the same key for the whole (rows, width, inner) array (JAX's
    # own numbers through fast_key, themselves tested against jax.random.key in test_engine).
    draw = {"normal": functools.partial(jax.random.normal, dtype=dtype),
            "uniform": functools.partial(jax.random.uniform, dtype=dtype),
            "randint": functools.partial(jax.random.randint, minval=0, maxval=37)}[sampler]
    lengths, width, inner = (0, 3, 7, 7), 7, (2,)
    seeds = jnp.asarray([0, 1, 12345, 2**32 - 1], dtype=jnp.uint32)
    with jax.enable_x64(dtype == "float64"):
        def both(s):
            key = jax.random.split(_rng.fast_key(s), 3)[1]  # a split key, as the engine's
            part = _rng.prefix_draw(draw, key, lengths, width, inner)
            assert part.shape == (sum(lengths),) + inner
            return (_rng.expand_prefix(part, lengths, width),
                    draw(key, (len(lengths), width) + inner))

        got, full = (np.asarray(a) for a in jax.jit(jax.vmap(both))(seeds))
    keep = np.broadcast_to((np.arange(width)[None, :] < np.asarray(lengths)[:, None])[None, :, :, None],
                           full.shape)
    assert got.dtype == full.dtype and got.shape == full.shape
    np.testing.assert_array_equal(got[keep], full[keep])
    assert not got[~keep].any()
    with pytest.raises(ValueError, match="lengths must lie in"):
        _rng.prefix_draw(draw, _rng.fast_key(0), (8,), width)


@pytest.mark.slow
@pytest.mark.parametrize("name, params", [
    ("domain_addition", dict(materialize=False)), ("domain_addition", dict(materialize=True)),
    ("domain_addition", dict(materialize=False, init="mean", **SMALL)),
    ("asymptotic", dict(materialize=False)), ("symmetric", dict(materialize=True))])
def test_engine_results_equal_those_from_every_draw(name, params):
    # Every field of the engine's per-seed results, bit for bit, against the estimates program fed
    # the draws of every (K, domain) entry. 300 seeds, one padded chunk (of 512: the chunk ladder).
    spec, P = experiments.spec(name, **params)
    got = _engine.simulate(spec, np.arange(300))
    (size,) = _engine.chunk_plan(300, spec).sizes
    seeds = jnp.asarray(np.r_[np.arange(300), np.full(size - 300, 299)], jnp.uint32)
    draws = jax.jit(functools.partial(_engine.draw_batch, spec, jnp.float32, prefix=False))(seeds)
    est = jax.jit(functools.partial(_engine.estimate_batch, spec, jnp.float32))
    if _engine.host_medians_outside(spec):
        smp = np.asarray(draws.samples).reshape(len(seeds), -1, spec.d)
        want = est(draws, _engine.host_prefix_medians(smp, spec.n, spec.Ks))
    else:
        want = est(draws)
    for f in _engine.SeedResult._fields:
        np.testing.assert_array_equal(getattr(got, f), np.asarray(getattr(want, f))[:300], err_msg=f)
