"""Monte-Carlo engine: compile count, determinism, sharding, agreement with the NumPy reference."""
import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest

from poolsim import _engine, _reference, experiments, metadist

pytestmark = pytest.mark.slow  # the engine at paper sizes, ~6 min in all

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A small domain-addition set-up shared by several tests (few K values keep compiles short).
SMALL = dict(Ks=(5, 9, 12), n=40, every=3, radius=2.5, gamma=0.5, jitter=0.2)
# Seeds per program call of the tests that run the engine on SMALL: one shape, so the tests share
# each spec's compiled programs (a spec's programs are compiled once per process and chunk shape).
CHUNK = 16


def _k_sigma(a, b, k=4.0):
    """Tolerance for a difference of two independent sample means: k combined standard errors."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    return k * np.sqrt(a.var(ddof=1) / a.size + b.var(ddof=1) / b.size)


def test_traced_once_per_experiment():
    # Count Python traces through the meta-distribution sampler: it runs only while tracing.
    spec, P = experiments.spec("domain_addition", **SMALL)
    calls = []

    def counting(key, _inner=spec.sample_means):
        calls.append(1)
        return _inner(key)

    spec = spec._replace(sample_means=counting)
    _engine.simulate(spec, np.arange(11), chunk=4)  # 3 chunks (last one padded), 3 K values
    _engine.simulate(spec, np.arange(20, 25), chunk=4)  # a second call reuses the compiled code
    assert len(calls) == 1
    assert [f._cache_size() for f in _engine.compiled(spec, "float32")] == [1, 1]  # 2 programs


def test_same_seeds_identical_frames_and_seed_independence():
    a = experiments.run("domain_addition", seeds=6, chunk=CHUNK, **SMALL)
    b = experiments.run("domain_addition", seeds=6, chunk=CHUNK, **SMALL)
    pd.testing.assert_frame_equal(a, b)
    # A seed's result does not depend on the other seeds in the batch (here seeds 0-5 and their
    # padding, there seeds 3, 4 and theirs) -- up to float rounding: the matching loop's compacted
    # stages gather other seeds, and XLA fuses reductions differently per batch shape (seen: 1 ulp
    # in float32).
    sub = experiments.run("domain_addition", seeds=[3, 4], chunk=CHUNK, **SMALL)
    pd.testing.assert_frame_equal(a[a.seed.isin([3, 4])].reset_index(drop=True), sub,
                                  check_exact=False, rtol=1e-5, atol=1e-6)
    assert list(a.columns[:8]) == ["experiment", "strategy", "seed", "K", "eps", "n_domains",
                                   "converged", "n_iter"]
    assert set(a.strategy) == {"pool", "subsample", "match"}
    assert np.isfinite(a.eps).all() and len(a) == 6 * 3 * 3


def test_sharded_run_equals_unsharded_at_paper_defaults():
    # 4 forced CPU devices, domain_addition with the paper's parameters (materialised samples,
    # 26 K values) and 200 seeds in chunks of 128 (2 chunks, the last padded; the comparisons are
    # seed by seed, so more seeds only cost run time): each device runs
    # its own matching loops, so nothing waits on another device (the auto-partitioned program
    # aborted here in a cross-device all-reduce). Compared with one device in the same process.
    code = textwrap.dedent("""
        import json, jax, numpy as np
        from poolsim import experiments
        assert len(jax.devices()) == 4, jax.devices()
        kw = dict(seeds=200, chunk=128)
        a, _ = experiments.simulate("domain_addition", **kw)
        b, _ = experiments.simulate("domain_addition", shard=False, **kw)
        sa = experiments.summarize("domain_addition", **kw)
        out = {f: [bool(np.array_equal(getattr(a, f), getattr(b, f))),
                   float(np.max(np.abs(getattr(a, f).astype(float) - getattr(b, f))))]
               for f in a._fields}
        P = dict(seeds=np.arange(200), Ks=tuple(range(5, 31)), mu_star=0.0)
        df = experiments.frame("domain_addition", b, P)
        g = df.groupby(["K", "strategy"], sort=False).eps
        want = sa[sa.quantity.isin(["pool", "subsample", "match"])]
        out["summary_n"] = int(sa.n_seeds.iloc[0])
        out["summary_mean"] = float(np.max(np.abs(want["mean"].values - g.mean().values)))
        out["summary_var"] = float(np.max(np.abs(want["var"].values - g.var().values)))
        print(json.dumps(out))
    """)
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
               JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    # Discrete outputs and inclusions identical; domain means, sample means and estimates equal up
    # to float32 rounding (each device's program has another batch shape, and XLA fuses
    # element-wise and reduction code per shape: differences of 1 ulp, <= 2.4e-7 here, seen).
    for f in ("n_domains", "converged", "n_iter", "included"):
        assert got[f][0], f
    for f in ("estimates", "means", "xbar"):
        assert got[f][1] <= 1e-6, (f, got[f])
    # The 4-device on-device summary against the one-device frame: 200 seeds; mean and variance
    # of eps (values ~0.1-2, float32 in the child: x64 is off there) to float32 rounding.
    assert got["summary_n"] == 200
    assert got["summary_mean"] <= 1e-5 and got["summary_var"] <= 1e-5


def test_engine_equals_reference_on_shared_draws():
    # Same samples in, same estimates out: pooling and matching (sample-median init, L2, tol 1e-4)
    # computed by the NumPy loop reference from the engine's own draws.
    import jax

    kw = dict(SMALL, tau=1.1, sigma=0.8, d=2, m_frac=0.5, n_sub=10, tol=1e-4, max_iter=100)
    spec, P = experiments.spec("domain_addition", dtype="float64", **SMALL)
    res = _engine.simulate(spec, np.arange(4), dtype="float64")
    for s in range(4):
        with jax.enable_x64(True):
            _, samples, _, _ = _engine.draw(spec, np.float64, jax.random.key(s))
        ref = _reference.ref_domain_addition(np.random.default_rng(s), samples=np.asarray(samples),
                                             **{k: v for k, v in kw.items()})
        np.testing.assert_allclose(res.estimates[s, :, 0], ref["pool"], rtol=0, atol=1e-12)
        np.testing.assert_allclose(res.estimates[s, :, 2], ref["match"], rtol=0, atol=1e-12)


def test_engine_agrees_with_reference_in_distribution():
    # Independent draws (JAX vs NumPy generators), same law: mean eps at each K per strategy
    # must agree within 4 combined standard errors.
    kw = dict(SMALL, tau=1.1, sigma=0.8, d=2, m_frac=0.5, n_sub=10, tol=1e-4, max_iter=100)
    S_ref, S_eng = 150, 2000
    df = experiments.run("domain_addition", seeds=S_eng, chunk=CHUNK, **SMALL)
    rng = np.random.default_rng(7)
    ref = {k: [] for k in ("pool", "subsample", "match")}
    for _ in range(S_ref):
        out = _reference.ref_domain_addition(rng, **kw)
        for k in ref:
            ref[k].append(np.linalg.norm(out[k], axis=1))
    for strat, rows in ref.items():
        rows = np.array(rows)  # (S_ref, nK)
        for j, K in enumerate(SMALL["Ks"]):
            eng = df[(df.strategy == strat) & (df.K == K)].eps.values
            assert abs(eng.mean() - rows[:, j].mean()) < _k_sigma(eng, rows[:, j]), (strat, K)


def test_sufficient_statistics_match_materialised_law():
    # Pooling and subsampling estimates have the same law on both paths (exact sufficient
    # statistics, see _engine docstring): compare mean and variance of eps at every K. Matching's
    # init and metric do not enter pooling and subsampling: each path runs with those of a case
    # of test_batched_engine_equals_vmapped_one_seed, whose compiled programs it shares.
    a = experiments.run("domain_addition", seeds=3000, chunk=CHUNK, materialize=True,
                        init="target", **SMALL)
    b = experiments.run("domain_addition", seeds=np.arange(10_000, 13_000), chunk=CHUNK,
                        materialize=False, init="mean", metric="geodesic", **SMALL)
    for strat in ("pool", "subsample"):
        for K in SMALL["Ks"]:
            x = a[(a.strategy == strat) & (a.K == K)].eps.values
            y = b[(b.strategy == strat) & (b.K == K)].eps.values
            assert abs(x.mean() - y.mean()) < _k_sigma(x, y), (strat, K)
            assert abs(np.mean(x**2) - np.mean(y**2)) < _k_sigma(x**2, y**2), (strat, K)


def test_sufficient_path_cost_does_not_depend_on_n():
    # Same seeds, same keys: with sufficient statistics the sampled arrays have no n axis.
    spec_small, _ = experiments.spec("domain_addition", materialize=False, n=100, **{
        k: v for k, v in SMALL.items() if k != "n"})
    spec_big = spec_small._replace(n=100_000)
    import jax

    means, samples, xbar, _ = _engine.draw(spec_big, np.float32, jax.random.key(0))
    assert samples is None and xbar.shape == (12, 2)
    res = _engine.simulate(spec_big, np.arange(3))
    assert np.isfinite(res.estimates).all()


@pytest.mark.parametrize("name, params, match", [
    ("nope", {}, "name must be one of"),
    ("asymptotic", {"seeds": 0}, "seeds"),
    ("asymptotic", {"Ks": (5, 5, 10)}, "Ks must be strictly increasing"),
    ("asymptotic", {"tau": 0.0}, "tau"),
    ("asymptotic", {"tau": float("nan")}, "tau"),
    ("asymptotic", {"metric": "manhattan"}, "metric"),
    ("asymptotic", {"bogus": 1}, "unknown parameter"),
    ("asymptotic", {"m_frac": 1.5}, "m_frac"),
    ("asymptotic", {"metadist": metadist.from_callable(lambda key, K: jax.random.normal(key, (K, 3)), d=2)},
     "returned shape"),
    ("asymptotic", {"metadist": metadist.symmetric_gaussian(1.0, d=2), "p": 0.9, "gamma": 3.0},
     r"^p, gamma set the 'asymptotic' experiment's own meta-distribution, which metadist= replaces"),
])
def test_bad_input(name, params, match):
    params = dict(params)
    seeds = params.pop("seeds", 2)
    with pytest.raises(ValueError, match=match):
        experiments.run(name, seeds=seeds, **params)


@pytest.mark.parametrize("name", list(experiments.EXPERIMENTS))
def test_metadist_beside_the_parameters_it_replaces_is_an_error(name):
    """Every parameter the experiment's own meta-distribution reads (its ``law_params``, checked against what
    ``make_metadist`` reads) is an error beside ``metadist=``, which would ignore it; the others are fine,
    and eps is then measured from the metadist's own mu_star."""
    exp = experiments.EXPERIMENTS[name]
    read = set()

    class Recording(dict):
        def __getitem__(self, key):
            read.add(key)
            return super().__getitem__(key)

    exp.make_metadist(Recording({**experiments.COMMON, **exp.defaults}))
    assert set(exp.law_params) == read - {"d"}
    mine = metadist.from_callable(lambda key, K: 3.0 + jax.random.normal(key, (K, 2)), d=2, mu_star=[3.0, -1.0])
    for param in exp.law_params:
        value = exp.defaults.get(param, experiments.COMMON.get(param))
        with pytest.raises(ValueError, match=rf"^{param} set the '{name}' experiment's own meta-distribution"):
            experiments.resolve(name, {"metadist": mine, param: value})
    P, dist = experiments.resolve(name, {"metadist": mine, "tau": 0.7, "n": 12})
    assert dist is mine and P["tau"] == 0.7
    np.testing.assert_array_equal(P["mu_star"], [3.0, -1.0])


@pytest.mark.slow
def test_eps_of_a_user_metadist_is_measured_from_its_mu_star():
    """run's eps with metadist= is ||estimate - metadist.mu_star|| (the engine's target), recomputed here."""
    mine = metadist.from_callable(lambda key, K: jnp.array([3.0, -1.0]) + 0.3 * jax.random.normal(key, (K, 2)),
                                  d=2, mu_star=[3.0, -1.0])
    df = experiments.run("symmetric", seeds=3, Ks=(6,), n=8, metadist=mine)
    est = df[["est_0", "est_1"]].to_numpy()
    np.testing.assert_allclose(df.eps, np.linalg.norm(est - [3.0, -1.0], axis=1), rtol=1e-12)
    assert df.eps.max() < 2.0  # from mu_star, not from the origin (at ~3.2)


def test_prefix_medians_equal_core_median(rng):
    # The engine's one-sort prefix medians against the core's masked median for every prefix
    # (odd and even counts; ties between groups included by rounding). Both jitted, as the
    # engine runs them (one compile each instead of one per operation).
    import jax
    import jax.numpy as jnp
    from poolsim import _core

    x = np.round(rng.normal(size=(37, 3)), 1)
    group = np.sort(rng.integers(0, 6, size=37))
    Ks = np.arange(1, 7)
    got = np.asarray(jax.jit(_engine.prefix_medians)(jnp.asarray(x), jnp.asarray(group),
                                                      jnp.asarray(Ks)))
    core_median = jax.jit(_core.weighted_median)
    for j, K in enumerate(Ks):
        if np.any(group < K):
            want = np.median(x[group < K], axis=0)  # independent: NumPy's own median
            np.testing.assert_allclose(got[j], want, atol=1e-12)
            np.testing.assert_allclose(
                got[j], np.asarray(core_median(jnp.asarray(x), jnp.asarray(group < K))),
                atol=1e-12)


def test_equal_parameters_reuse_the_compiled_engine():
    a, _ = experiments.spec("domain_addition", **SMALL)
    b, _ = experiments.spec("domain_addition", **SMALL)
    c, _ = experiments.spec("domain_addition", **dict(SMALL, radius=3.0))
    assert a == b and hash(a) == hash(b)
    # seeds per program call change the programs' argument shapes only: the same spec
    d, _ = experiments.spec("domain_addition", chunk=CHUNK, **SMALL)
    assert a == d and hash(a) == hash(d) and _engine.store_ident(a, "float32", 1) == \
        _engine.store_ident(d, "float32", 1)
    assert a != c  # another meta-distribution parameter -> another compiled function


@pytest.mark.parametrize("n, draws", [(1, 3), (3, 3), (4, 5), (7, 4)])
def test_collision_law_equals_exhaustive_enumeration(n, draws):
    # Independent oracle: enumerate all n**draws index sequences and tabulate sum_i c_i^2.
    import itertools
    from collections import Counter

    tally = Counter(sum(c * c for c in Counter(seq).values())
                    for seq in itertools.product(range(n), repeat=draws))
    values, prob = _engine.collision_law(n, draws)
    want = {q: cnt / n**draws for q, cnt in tally.items()}
    assert dict(zip(values.astype(int).tolist(), prob.tolist())) == pytest.approx(want, abs=1e-12)


def test_collision_law_large_n_mean():
    # E[sum c_i^2] = draws + draws (draws - 1) / n (closed form: Var c_i + (E c_i)^2 summed).
    for n, draws in [(100, 10), (100_000, 10), (50, 20)]:
        values, prob = _engine.collision_law(n, draws)
        assert float(values @ prob) == pytest.approx(draws + draws * (draws - 1) / n, rel=1e-10)


@pytest.mark.parametrize("select", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n, block, batch, threads", [(7, 4, 256, 1), (10, 64, 5, 2), (3, 5, 1, 3)])
def test_host_prefix_medians_equal_numpy_median(rng, dtype, n, block, batch, threads, select):
    # The CPU engine's NumPy prefix medians (sort + block counts) against NumPy's own median of
    # each prefix of K n rows; rounded values make ties inside and across groups; Ks include 1,
    # odd and even counts, and the last group. Blocks smaller than, equal to and larger than n;
    # the 12 columns in one batch, in batches of 5 (last one short) or of 1, over 1 to 3 threads.
    # float32 goes through the packed value-and-group sort keys: negative values, zeros of both
    # signs and huge magnitudes are mixed in to exercise the order-preserving bit map. ``select``: the
    # same with one selection per prefix (np.partition; chosen by size for few prefixes).
    import jax
    import jax.numpy as jnp

    G = 9
    x = np.round(rng.normal(size=(2, 3, G * n, 2)), 1).astype(dtype)
    special = np.array([-0.0, 0.0, -3e38, 3e38, -1e-30, 1e-30], dtype=dtype)
    x.flat[rng.choice(x.size, 40, replace=False)] = rng.choice(special, 40)
    Ks = (1, 2, 4, 5, 9)
    got = _engine.host_prefix_medians(x, n, Ks, block=block, batch=batch, threads=threads, select=select)
    assert got.shape == (2, 3, len(Ks), 2) and got.dtype == dtype
    for j, K in enumerate(Ks):
        np.testing.assert_array_equal(got[:, :, j], np.median(x[:, :, :K * n], axis=2).astype(dtype))
    # ... and the pure-XLA version used on accelerators picks the same order statistics (jitted,
    # as the engine runs it: one compile instead of one per operation).
    xla = jax.jit(_engine.prefix_medians)(jnp.asarray(x[0, 0]), jnp.repeat(jnp.arange(G), n),
                                          jnp.asarray(Ks))
    np.testing.assert_array_equal(np.asarray(xla), got[0, 0])


@pytest.mark.parametrize("materialize, params", [
    (True, {}), (True, {"init": "target"}), (False, {"init": "mean", "metric": "geodesic"}),
    (False, {"metric": "cosine", "tau": 0.3})])  # both paths, every init and metric
def test_batched_engine_equals_vmapped_one_seed(materialize, params):
    # The seed-batched scan (the engine) against vmap of the per-seed function (the previous
    # engine, kept as the oracle): same draws, same iteration, so discrete outputs are identical
    # and estimates equal up to float32 rounding (XLA may fuse a reduction differently per
    # program: 1 ulp seen in the pooled mean). 37 seeds, chunk 16: padded last chunk.
    spec, P = experiments.spec("domain_addition", materialize=materialize, **SMALL, **params)
    seeds = np.arange(37)
    a = _engine.simulate(spec, seeds, chunk=CHUNK)
    b = _engine.simulate(spec, seeds, chunk=CHUNK, batched=False)
    for f in ("n_domains", "converged", "n_iter", "included", "means", "xbar"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f), err_msg=f)
    np.testing.assert_allclose(a.estimates, b.estimates, rtol=0, atol=1e-6)
    assert (a.n_iter > 1).any()  # the loop ran past its first iteration somewhere


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_fused_threefry_keys_draw_exactly_jax_numbers(dtype):
    # poolsim._rng re-implements only the bits generator of JAX's Threefry-2x32 (for speed); the
    # oracle is JAX's own generator on the standard key of the same seed: every draw the engine
    # makes (split, normal, uniform, randint, bits), vmapped over seeds as in the engine.
    import jax
    import jax.numpy as jnp
    from poolsim import _rng

    def draws(key):
        a, b, c = jax.random.split(key, 3)
        return (jax.random.normal(a, (4, 7, 3), dtype), jax.random.uniform(b, (5,), dtype),
                jax.random.randint(c, (6, 11), 0, 100), jax.random.bits(key, (9,)),
                jax.random.normal(jax.random.fold_in(key, 3), (2,), dtype))

    seeds = jnp.asarray([0, 1, 12345, 2**32 - 1], dtype=jnp.uint32)
    with jax.enable_x64(dtype == "float64"):
        fast = jax.jit(jax.vmap(lambda s: draws(_rng.fast_key(s))))(seeds)
        want = jax.vmap(lambda s: draws(jax.random.key(s)))(seeds)
    for f, w in zip(fast, want):
        assert f.dtype == w.dtype
        np.testing.assert_array_equal(np.asarray(f), np.asarray(w))


@pytest.mark.parametrize("R", [1, 7, 30, 32])
def test_few_prefix_medians_equal_numpy_median(rng, R):
    # The rank/popcount prefix medians of the domain means (sufficient path) against NumPy's own
    # median of every prefix (independent) and against the sort-based prefix_medians (the same
    # order statistics, so bit-identical); ties and signed zeros included by rounding. Both
    # jitted, as the engine runs them (one compile each instead of one per operation).
    import jax
    import jax.numpy as jnp

    x = np.round(rng.normal(size=(5, R, 2)), 1).astype(np.float32)
    x[0, :, 0] = 0.0
    x[0, ::2, 0] = -0.0
    Ks = np.arange(1, R + 1)
    got = np.asarray(jax.jit(_engine.few_prefix_medians, static_argnums=1)(jnp.asarray(x), tuple(Ks)))
    sort = np.asarray(jax.jit(jax.vmap(_engine.prefix_medians, in_axes=(0, None, None)))(
        jnp.asarray(x), jnp.arange(R), jnp.asarray(Ks)))  # seed by seed
    for s in range(x.shape[0]):
        for j, K in enumerate(Ks):
            np.testing.assert_array_equal(got[s, j], np.median(x[s, :K], axis=0))
        np.testing.assert_array_equal(got[s], sort[s])
    with pytest.raises(ValueError, match="at most 32 rows"):
        _engine.few_prefix_medians(jnp.zeros((1, 33, 2)), (5,))


@pytest.mark.parametrize("case", ["all_converge_in_stage_one", "compacted", "fallback"])
def test_staged_batched_match_equals_per_seed_loop(rng, case):
    # The staged matching loop (trips on the whole batch, then only the still-iterating seeds,
    # compacted) against vmap of the core's per-seed while_loop (the oracle): identical
    # iteration counts, flags and inclusions, identical centroids.
    import jax
    import jax.numpy as jnp
    from poolsim import _core

    spec, _ = experiments.spec("domain_addition", materialize=False, **SMALL)
    S, K_max = 64, spec.K_max
    x = rng.normal(size=(S, K_max, spec.d)).astype(np.float32)
    mass = np.where(np.arange(K_max) < 9, 40.0, 0.0).astype(np.float32)
    c0 = (x[:, :9].mean(axis=1) + rng.normal(size=(S, spec.d))).astype(np.float32)
    stages = ((2, 2), (1, 4))
    if case == "all_converge_in_stage_one":  # every domain within tau: 2 iterations each
        spec, stages = spec._replace(tau=1e6), ((3, 2), (1, 4))
    elif case == "fallback":  # tol 0: no seed converges, they run to max_iter in the fallback
        spec = spec._replace(tol=0.0, max_iter=6)
    c, inc, t, conv = jax.jit(lambda a, b, c: _engine.batched_match(a, b, c, spec, stages))(
        x, mass, c0)
    oracle = jax.jit(jax.vmap(lambda p, c: _core.iterate_match(
        p, jnp.asarray(mass), c, spec.tau, spec.metric, tol=spec.tol, max_iter=spec.max_iter)))
    wc, winc, wt, wconv, _ = oracle(x, c0)
    wt = np.asarray(wt)
    for got, want in ((c, wc), (inc, winc), (t, wt), (conv, wconv)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    if case == "all_converge_in_stage_one":
        assert (wt == 2).all()
    elif case == "fallback":
        # (seeds whose first match is empty stop at once) too many left for the compacted batch
        assert (wt == spec.max_iter).sum() > S // 2 and not np.asarray(wconv).any()
    else:  # both compactions really ran: few enough seeds left after 2 and after 3 trips
        assert 0 < (wt > 2).sum() <= S // 2 and 0 < (wt > 3).sum() <= S // 4, wt


@pytest.mark.parametrize("materialize", [True, False])
def test_summary_equals_the_per_seed_frame(materialize):
    # The on-device summary against the same statistics computed from run()'s per-seed frame
    # (the frame's eps, pandas mean/var, ci95 for the strategies, decide_claim for the paired
    # differences). 45 seeds (>= MIN_SEEDS, so the differences get intervals) in chunks of 16:
    # 3 chunks, the last one padded with 3 copies of seed 44 that must not count. x64 is on in the
    # tests, so eps is formed in float64 on both sides: equal up to summation order. Each path with
    # the parameters of a test_batched_engine_equals_vmapped_one_seed case (sharing its compiled
    # programs).
    from poolsim import _verdict, decide_claim

    params = {} if materialize else {"metric": "cosine", "tau": 0.3}
    kw = dict(seeds=45, chunk=CHUNK, materialize=materialize, **SMALL, **params)
    df = experiments.run("domain_addition", **kw)
    summ = experiments.summarize("domain_addition", **kw)
    assert list(summ.columns) == ["experiment", "K", "quantity", "n_seeds", "mean", "var",
                                  "ci_low", "ci_high"]
    assert len(summ) == len(SMALL["Ks"]) * 6 and (summ.n_seeds == 45).all()
    for K in SMALL["Ks"]:
        e = {s: df[(df.K == K) & (df.strategy == s)].eps.values for s in _engine.STRATEGIES}
        for s in _engine.STRATEGIES:
            row = summ[(summ.K == K) & (summ.quantity == s)].iloc[0]
            m, lo, hi = experiments.ci95(e[s])
            np.testing.assert_allclose([row["mean"], row["var"], row.ci_low, row.ci_high],
                                       [m, e[s].var(ddof=1), lo, hi], rtol=1e-10, atol=1e-12)
        for a, b in _engine.PAIRS:
            row = summ[(summ.K == K) & (summ.quantity == f"{a} - {b}")].iloc[0]
            v = decide_claim(e[a], e[b])
            np.testing.assert_allclose([row["mean"], row["var"], row.ci_low, row.ci_high],
                                       [v.estimate, np.var(e[a] - e[b], ddof=1), v.ci_low,
                                        v.ci_high], rtol=1e-10, atol=1e-12)
            assert v.n_seeds >= _verdict.MIN_SEEDS


def test_summary_under_min_seeds_has_no_difference_interval():
    # decide_claim's rule: fewer than MIN_SEEDS paired seeds -> no interval (NaN), never a
    # zero-width one; the strategies' own rows keep ci95's interval.
    summ = experiments.summarize("domain_addition", seeds=5, chunk=CHUNK, **SMALL)
    paired = summ.quantity.str.contains(" - ")
    assert summ[paired].ci_low.isna().all() and summ[paired].ci_high.isna().all()
    own = summ[~paired]
    assert own.ci_low.notna().all() and (own.ci_low < own["mean"]).all()


def test_moments_combine_equals_numpy_on_uneven_batches(rng):
    # Chan et al.'s merge of per-batch (n, mean, M2) against NumPy's mean/var of all values at once;
    # batches of 1, 7 and 40 values and an empty one (n = 0, ignored).
    x = rng.normal(3.0, 2.0, size=(48, 2, 6))
    parts = [x[:1], x[1:8], x[8:], x[:0]]
    mom = _engine.Moments(np.array([len(p) for p in parts]),
                          np.stack([p.mean(0) if len(p) else np.zeros((2, 6)) for p in parts]),
                          np.stack([((p - p.mean(0)) ** 2).sum(0) if len(p) else np.zeros((2, 6))
                                    for p in parts]))
    got = _engine.combine(mom)
    assert got.n_seeds == 48
    np.testing.assert_allclose(got.mean, x.mean(0), rtol=1e-13)
    np.testing.assert_allclose(got.var, x.var(0, ddof=1), rtol=1e-12)
    with pytest.raises(ValueError, match="no seeds"):
        _engine.combine(_engine.Moments(np.zeros(1, int), np.zeros((1, 2, 6)), np.zeros((1, 2, 6))))


@pytest.mark.parametrize("on_device", [True, False])
def test_gather_both_ways_equals_numpy_concatenation(rng, on_device):
    # The final gather of per-chunk device results, both ways (concatenated on the device, used on
    # a single accelerator; copied into preallocated host arrays, used on CPU and several
    # devices), against np.concatenate of the chunks cut to S rows: 3 chunks of 4, S = 10.
    import jax.numpy as jnp

    chunks = [(rng.normal(size=(4, 3)).astype(np.float32), rng.integers(0, 9, size=(4,)) > 4)
              for _ in range(3)]
    parts = [(tuple(jnp.asarray(a) for a in c), k) for c, k in zip(chunks, (4, 4, 2))]
    got = _engine.gather(parts, on_device)
    for j in range(2):
        want = np.concatenate([c[j] for c in chunks])[:10]
        assert got[j].dtype == want.dtype
        np.testing.assert_array_equal(got[j], want)


def test_progress_reports_every_seed_once():
    seen = []
    experiments.run("domain_addition", seeds=37, chunk=CHUNK, progress=seen.append, **SMALL)
    assert seen == [16, 16, 5]  # chunks in order; the padded last chunk counts its 5 real seeds
