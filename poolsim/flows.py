"""Normalizing-flow bridge (paper §"Using Normalizing Flow to Generalize for Arbitrary
Distributions", Thm 4): an affine-coupling (RealNVP-type) flow ``T: R^d -> R^d`` whose Lipschitz
constant on a ball is certified.

``T`` maps the latent space (``z ~ N(0, I)``) to data space: ``x = T(z)``. Layers, in the
forward (generative) order::

    [coupling, flip] x n_layers, then x = loc + scale * y (loc, scale: training mean and sd, fixed)

Coupling layer (``x = (x1, x2)``, ``x1`` the first ``d // 2`` coordinates)::

    y1 = x1,   y2 = x2 * exp(s(x1)) + t(x1),   s = s_max * tanh(raw(x1)),  (raw, t) = MLP(x1)

with a tanh MLP whose every weight matrix ``W`` is used as ``W / max(1, sigma_max(W) / w_max)``
(spectral cap, ``sigma_max`` from an exact SVD at every use, not a power-iteration estimate).

**Per-layer bound C_l.** The Jacobian is ``[[I, 0], [A, D]]`` with ``D = diag(exp(s))``,
``||D|| <= e^{s_max}`` and ``A = diag(a) J_raw + J_t``, ``a_i = x2_i e^{s_i} s_max (1 - tanh^2)``,
so with ``alpha = max_i |x2_i| e^{s_max} s_max``::

    ||A|| <= min(alpha L_raw + L_t,  sqrt(1 + alpha^2) L_net)

(``[diag(a), I] [J_raw; J_t]`` for the second form). ``L_net``, ``L_t``, ``L_raw``: Lipschitz
bounds of the conditioner's whole output, shift rows and log-scale rows -- products of the
*exact* largest singular values (``numpy.linalg.norm(W, 2)``, an SVD) of the capped weights; tanh
is 1-Lipschitz. For the block matrix, ``||J|| <= sigma_max([[1, 0], [||A||, ||D||]])`` (a 2x2
SVD): this is ``C_l``. Flips are orthogonal (``C = 1``); the standardisation has ``C = max scale``.

**Why a radius is needed.** ``||A||`` grows linearly with ``|x2|``: however the conditioner is
constrained, ``d y2 / d x1 = x2 e^s s'(x1) + t'(x1)`` is unbounded over ``R^d`` unless ``s`` is
constant. So a global ``L_T`` does not exist in general; Thm 4's ``L_T`` is only finite on a
bounded set. :meth:`Flow.lipschitz_bound` certifies ``T`` on the latent ball ``||z|| <= radius``.
The ball lies in the cube ``|z_i| <= radius``; each layer maps its input box into a box (a coupling
keeps ``x1`` and gives ``|y2_i| <= e^{s_max} |x2_i| + min(|t_i(0)| + L_t ||x1||, H_t)``, with
``H_t = ||W_out[t rows]|| sqrt(width) + ||b_out[t rows]||`` since tanh units lie in [-1, 1]; a
flip permutes the box), and ``alpha`` is taken over the current box. Boxes are convex, so ``sup
||J_l|| <= C_l`` on a box makes layer ``l`` ``C_l``-Lipschitz there, and the product of the
``C_l`` is a Lipschitz constant of ``T`` on the ball. A latent matched set ``{||z - c_z|| < tau}``
lies in the ball of radius ``||c_z|| + tau``. The bound is valid but loose (a product of
per-layer worst cases): hundreds of times the measured ratios in our runs.

**Why flowjax, and what is ours.** flowjax provides everything but three pieces: its
``Coupling`` takes any scalar transformer and exposes its ``eqx.nn.MLP`` conditioner, paramax's
``Parameterize`` puts the spectral cap on each weight, and ``Scan``/``Chain``/``Flip``/``Affine``/
``StandardNormal``/``Transformed`` assemble the flow (the parameter-free ``StandardNormal`` base;
flowjax's ``Normal(loc, scale)`` would be trained with the layers and the latent law would drift
from N(0, I)). Ours: (i) ``_TanhAffine``, the transformer with a tanh-bounded log-scale
(flowjax's ``Affine`` has an unbounded softplus scale); (ii) the assembly: as in
``flowjax.flows.coupling_flow`` the layers are a ``Scan`` (parameters stacked, one compiled
layer body) but not inverted (``coupling_flow``'s default ``invert=True`` would make ``T``'s
layers *inverse* couplings, another Jacobian), and :func:`_layers` slices out layer ``l`` for the
bound; (iii) the training loop: a fixed number of Adam steps in one ``lax.scan`` (compiled once
per configuration, ``vmap``-able over seeds for the figures) instead of
``flowjax.train.fit_to_data``'s Python loop with early stopping.

Fitting is maximum likelihood on a random ``1 - holdout`` share of the data; the rest gives the
held-out NLL that :class:`Flow` reports (the paper's KL < eps is *not* claimed -- we report what
was achieved).
"""
from __future__ import annotations

import functools
import math
from typing import Any, ClassVar, NamedTuple

import numpy as np

from . import _checks
from ._strategies import as_key

__all__ = ["Flow", "FlowConfig", "LayerBounds", "fit_flow", "fit_flows"]


class FlowConfig(NamedTuple):
    """Architecture and optimiser settings (hashable: one compilation per distinct config)."""

    d: int
    n_layers: int = 4
    width: int = 16
    depth: int = 1
    s_max: float = 0.5
    weight_norm: float = 1.5
    steps: int = 400
    learning_rate: float = 1e-2
    batch_size: int = 256


class LayerBounds(NamedTuple):
    """``C: (L,)`` per-layer Jacobian operator-norm bounds; ``box: (L+1, d)`` coordinate-wise
    bounds ``|x_i| <= box[l, i]`` on layer l's inputs (``box[0] = radius``; ``box[L]`` bounds
    ``T``'s outputs); ``kind: (L,)`` layer names."""

    C: np.ndarray
    box: np.ndarray
    kind: tuple


@functools.cache
def _tanh_affine():
    """The transformer class (defined lazily so ``import poolsim`` does not import flowjax)."""
    import equinox as eqx
    import jax.numpy as jnp
    from flowjax.bijections import AbstractBijection

    class _TanhAffine(AbstractBijection):  # type: ignore[misc]  # fields: see their comment
        """Scalar ``y = x exp(s_max tanh(raw)) + loc``; identity at ``loc = raw = 0``."""

        # equinox builds __init__(loc, raw, s_max): shape and cond_shape are constants that fill flowjax's
        # abstract attributes, which mypy's dataclass model reads as fields with defaults before fields without
        shape: tuple = ()
        cond_shape: ClassVar[None] = None  # type: ignore[misc]
        loc: Any  # type: ignore[misc]
        raw: Any  # type: ignore[misc]
        s_max: float = eqx.field(static=True)  # type: ignore[misc]

        def __init__(self, s_max: float):
            self.loc = jnp.zeros(())
            self.raw = jnp.zeros(())
            self.s_max = s_max

        def transform_and_log_det(self, x, condition=None):
            ls = self.s_max * jnp.tanh(self.raw)
            return x * jnp.exp(ls) + self.loc, ls

        def inverse_and_log_det(self, y, condition=None):
            ls = self.s_max * jnp.tanh(self.raw)
            return (y - self.loc) * jnp.exp(-ls), -ls

    return _TanhAffine


def _spectral_cap(w, w_max):
    """``w / max(1, sigma_max(w) / w_max)`` with the exact largest singular value (SVD).
    ``w: (..., out, in)`` -- stacked layers are capped one by one."""
    import jax.numpy as jnp

    sigma = jnp.linalg.svd(w, compute_uv=False)[..., :1, None]
    return w / jnp.maximum(1.0, sigma / w_max)


def _stack(config: FlowConfig, key):
    """The trainable part of ``T`` (wrapped): ``Scan`` of ``n_layers x Chain([coupling, flip])``.

    The ``Scan`` stacks the layers' parameters (one compiled layer body); :func:`_layers` slices
    them back out. Nothing in it depends on the data, so its static part is cached per config.
    """
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import paramax
    from flowjax.bijections import Chain, Coupling, Flip, Scan

    tanh_affine, d = _tanh_affine(), config.d

    def layer(k):
        c = Coupling(k, transformer=tanh_affine(config.s_max), untransformed_dim=d // 2, dim=d,
                     nn_width=config.width, nn_depth=config.depth, nn_activation=jnp.tanh)
        c = eqx.tree_at(lambda c: [lin.weight for lin in c.conditioner.layers], c,
                        replace_fn=lambda w: paramax.Parameterize(_spectral_cap, w,
                                                                  config.weight_norm))
        return Chain([c, Flip((d,))])

    return Scan(eqx.filter_vmap(layer)(jax.random.split(key, config.n_layers)))


def _partition(tree):
    import equinox as eqx

    return eqx.partition(tree, eqx.is_inexact_array)


@functools.lru_cache(maxsize=None)
def _static(config: FlowConfig):
    """Static (non-array) part of :func:`_stack`, from an abstract evaluation (no arrays are
    computed); built outside any trace, then reused."""
    import equinox as eqx
    import jax

    # compile-time evaluation keeps key-independent constants concrete (flowjax's transformer
    # constructor closes over the ravelled initial transformer parameters)
    with jax.ensure_compile_time_eval():
        return _partition(eqx.filter_eval_shape(_stack, config, jax.random.key(0)))[1]


def _model(params, loc, scale, config):
    """``T_# N(0, I)`` with ``T = Chain([stack(params), x = loc + scale * y])``, unwrapped.

    The base is flowjax's parameter-free ``StandardNormal`` (its ``Normal(loc, scale)`` would
    be trained along with the layers and the latent law would drift from N(0, I)); the
    standardisation is fixed, so neither is part of ``params``.
    """
    import equinox as eqx
    import jax.numpy as jnp
    import paramax
    from flowjax.bijections import Chain
    from flowjax.distributions import StandardNormal, Transformed

    # flowjax's Affine(loc, scale) stores softplus^-1(scale) behind paramax's inv_softplus, whose
    # eqx.error_if (scale < 0) becomes a host callback in every compiled fit and apply, and JAX's
    # persistent cache refuses programs with host callbacks. The scale here is a standard deviation
    # of data with no constant coordinate (_check_data), so the check cannot fire: the same
    # parameter is set on a template (flowjax's documented way to change Affine's scale), with
    # inv_softplus's formula written out -- the same operations, so the same numbers.
    raw = jnp.log(-jnp.expm1(-scale)) + scale
    affine = eqx.tree_at(lambda a: (a.loc, a.scale.args[0]), _affine_template(config.d), (loc, raw))
    chain = Chain([eqx.combine(params, _static(config)), affine])
    return paramax.unwrap(Transformed(StandardNormal((config.d,)), chain))


@functools.lru_cache(maxsize=None)
def _affine_template(d: int):
    """``flowjax.bijections.Affine`` of dimension ``d`` (loc 0, scale 1), built outside any trace
    (its constructor's check then runs once, eagerly, not as a callback in a compiled program);
    the callers build it before they trace."""
    import jax.numpy as jnp
    from flowjax.bijections import Affine

    return Affine(jnp.zeros(d), jnp.ones(d))


def _layers(model, n_layers: int) -> list:
    """The unwrapped model's layers in forward order: coupling, flip, ..., standardise (their
    arrays as NumPy arrays: slicing the stack on the host is free)."""
    import equinox as eqx
    import jax

    host = jax.tree.map(lambda leaf: np.asarray(leaf) if eqx.is_array(leaf) else leaf, model)
    stack, standardise = host.bijection.bijections
    out = []
    for i in range(n_layers):
        pair = jax.tree.map(lambda leaf: leaf[i] if isinstance(leaf, np.ndarray) else leaf,
                            stack.bijection)
        out += list(pair.bijections)
    return out + [standardise]


def _fit_impl(key, x, *, config: FlowConfig, n_test: int):
    import jax
    import jax.numpy as jnp
    import optax

    k_split, k_init, k_steps = jax.random.split(key, 3)
    perm = jax.random.permutation(k_split, x.shape[0])
    x_test, x_train = x[perm[:n_test]], x[perm[n_test:]]
    loc, scale = jnp.mean(x_train, axis=0), jnp.std(x_train, axis=0)
    params = _partition(_stack(config, k_init))[0]
    opt = optax.adam(config.learning_rate)
    batch = min(config.batch_size, x_train.shape[0])

    def nll(p, xb):
        return -jnp.mean(_model(p, loc, scale, config).log_prob(xb))

    def body(carry, k):
        p, state = carry
        xb = x_train[jax.random.randint(k, (batch,), 0, x_train.shape[0])]
        loss, g = jax.value_and_grad(nll)(p, xb)
        upd, state = opt.update(g, state, p)
        return (optax.apply_updates(p, upd), state), loss

    (params, _), losses = jax.lax.scan(body, (params, opt.init(params)),
                                       jax.random.split(k_steps, config.steps))
    test = nll(params, x_test) if n_test > 0 else jnp.nan
    return params, loc, scale, losses, nll(params, x_train), test, perm[:n_test]


# These models are tiny, so XLA compile time matters. Applying a fitted flow is cheap: backend
# optimisation level 0 (compiles ~3x faster). Fitting runs 400 steps, vmapped over seeds in the
# figures: level 1, set explicitly so that it also overrides a global XLA_FLAGS level 0 (the figures
# CLI sets one). Measured (40 seeds x 1000 points, 2 CPU cores): level 0 compiles in 3.6 s and runs
# in 8.3 s, level 1 in 5.0 s and 2.3 s, levels 2 and 3 compile longer for the same run time.
_FAST_COMPILE = {"xla_backend_optimization_level": 0}
_FIT_COMPILE = {"xla_backend_optimization_level": 1}


@functools.lru_cache(maxsize=None)
def _fitter(config: FlowConfig, n_test: int, batched: bool):
    import jax

    from . import _cache

    _cache.enable_jax_cache()  # the fit has no host callback, so JAX's persistent cache keeps it
    _static(config)  # build the cached templates outside the trace
    _affine_template(config.d)
    f = functools.partial(_fit_impl, config=config, n_test=n_test)
    return jax.jit(jax.vmap(f) if batched else f, compiler_options=_FIT_COMPILE)


# The fitting code's libraries: their versions are part of a stored fit's key.
_FIT_PACKAGES = ("equinox", "flowjax", "optax", "paramax", "numpy")


def _stored_fit(config: FlowConfig, n_test: int, batched: bool, keys, x, data: np.ndarray):
    """``_fitter(config, n_test, batched)(keys, x)``, or its output stored by an earlier process
    for the same inputs (:mod:`poolsim._fit_store`: keyed by ``data``'s bytes, the keys' bits, the
    configuration, the code and the machine). ``x`` is ``data`` on the device."""
    import jax

    from . import _fit_store

    fitter = _fitter(config, n_test, batched)
    if _fit_store.store_dir() is None:
        return fitter(keys, x)
    name = "flow-fit"
    digest = _fit_store.key(
        name, {"config": repr(config), "n_test": n_test, "batched": batched,
               "key_impl": str(keys.dtype)},
        (np.asarray(jax.random.key_data(keys)), data), _FIT_PACKAGES)
    out = _fit_store.load(name, digest, fitter.eval_shape(keys, x))
    if out is None:
        out = fitter(keys, x)
        _fit_store.save(name, digest, out)
    return out


@functools.lru_cache(maxsize=None)
def _applier(config: FlowConfig, what: str):
    import jax

    from . import _cache

    _cache.enable_jax_cache()
    _static(config)
    _affine_template(config.d)

    def apply(params, loc, scale, x):
        dist = _model(params, loc, scale, config)
        if what == "log_prob":
            return dist.log_prob(x)
        fn = dist.bijection.transform if what == "forward" else dist.bijection.inverse
        return jax.vmap(fn)(x)

    return jax.jit(apply, compiler_options=_FAST_COMPILE)


@functools.lru_cache(maxsize=None)
def _model_compiled(config: FlowConfig):
    """:func:`_model` as one compiled call (unwrapping applies the spectral cap, an SVD per weight:
    eagerly that is dozens of dispatches per call, and the figures bound one flow per seed)."""
    import equinox as eqx

    _static(config)
    _affine_template(config.d)
    return eqx.filter_jit(functools.partial(_model, config=config))


def _coupling_norms(layer):
    """Norm bounds of one coupling's tanh-MLP conditioner ``x1 -> (t, raw)``.

    Returns ``(L_net, L_t, L_raw, H_t, rows_t)``: Lipschitz bounds of the whole output, of its shift rows
    and of its log-scale rows (products of exact largest singular values; tanh is 1-Lipschitz),
    a bound on ``||t(x1)||`` for every ``x1`` (hidden units lie in [-1, 1]^width), and the slice of
    output rows that are shifts. Which output
    rows are shifts is read off flowjax's transformer constructor (parameters per transformed
    coordinate, ravelled in ``_TanhAffine`` field order), probed rather than assumed.
    """
    import jax.numpy as jnp

    make = layer.transformer_constructor  # params -> transformer, offset by its initial params
    t_col = 0 if float(make(jnp.array([1.0, 0.0])).loc - make(jnp.zeros(2)).loc) == 1.0 else 1
    *inner, last = layer.conditioner.layers
    hidden = [float(np.linalg.norm(np.asarray(lin.weight), 2)) for lin in inner]
    W, b = np.asarray(last.weight), np.asarray(last.bias)
    rows_t, rows_s = slice(t_col, None, 2), slice(1 - t_col, None, 2)
    pre = float(np.prod(hidden))
    sig = lambda m: float(np.linalg.norm(m, 2))  # noqa: E731
    # the constructor's offset (the transformer's initial parameters) is zero for _TanhAffine,
    # so t(x1) is exactly the shift rows of the MLP output
    H_t = sig(W[rows_t]) * math.sqrt(last.in_features) + float(np.linalg.norm(b[rows_t]))
    return pre * sig(W), pre * sig(W[rows_t]), pre * sig(W[rows_s]), H_t, rows_t


def _mlp_numpy(mlp, x: np.ndarray) -> np.ndarray:
    """The conditioner ``mlp(x)`` in NumPy on a host copy of the layer (as built by :func:`_stack`:
    tanh hidden activations, identity output, biases). Written out because calling the equinox MLP
    eagerly is ~20 JAX dispatches, a third of a :meth:`Flow.layer_bounds` call."""
    *inner, last = mlp.layers
    for lin in inner:
        x = np.tanh(np.asarray(lin.weight) @ x + np.asarray(lin.bias))
    return np.asarray(last.weight) @ x + np.asarray(last.bias)


def _sigma2(a, b, c):
    """Largest singular value of [[a, 0], [b, c]]."""
    return float(np.linalg.norm(np.array([[a, 0.0], [b, c]]), 2))


class Flow(NamedTuple):
    """A fitted flow. ``T = forward`` maps latent ``z`` to data ``x``.

    ``params``: trainable arrays; ``loc, scale: (d,)`` the fixed standardisation;
    ``train_nll`` / ``heldout_nll``: mean negative log-likelihood (nats per point) on the
    training / held-out split (NaN without a held-out split); ``losses: (steps,)`` minibatch
    training NLL; ``heldout``: row indices of ``x`` kept out of training.
    """

    params: Any
    loc: Any
    scale: Any
    config: FlowConfig
    losses: np.ndarray
    train_nll: float
    heldout_nll: float
    n_train: int
    heldout: np.ndarray

    @property
    def d(self) -> int:
        return self.config.d

    def _rows(self, name: str, x: Any):
        import jax.numpy as jnp

        x = jnp.asarray(x, dtype=jnp.asarray(self.loc).dtype)
        if x.ndim not in (1, 2) or x.shape[-1] != self.d:
            raise ValueError(f"{name} must have shape (d,) or (n, d) with d = {self.d} (the flow's "
                             f"dimension), got {tuple(x.shape)}")
        _checks.finite(name, x)
        return x

    def _apply(self, what: str, name: str, x: Any):
        x = self._rows(name, x)
        out = _applier(self.config, what)(self.params, self.loc, self.scale, x.reshape(-1, self.d))
        return out.reshape(x.shape if what != "log_prob" else x.shape[:-1])

    def forward(self, z):
        """``x = T(z)``; ``z: (d,)`` or ``(n, d)``."""
        return self._apply("forward", "z", z)

    def inverse(self, x):
        """``z = T^{-1}(x)``; ``x: (d,)`` or ``(n, d)``."""
        return self._apply("inverse", "x", x)

    def log_prob(self, x):
        """``log q(x)`` of the flow's density ``q = T_# N(0, I)``; ``x: (d,)`` or ``(n, d)``."""
        return self._apply("log_prob", "x", x)

    def model(self):
        """The unwrapped flowjax ``Transformed`` distribution (``.bijection[l]`` is layer l)."""
        return _model_compiled(self.config)(self.params, self.loc, self.scale)

    def layer_bounds(self, radius: float) -> LayerBounds:
        """Per-layer bounds ``C_l`` on ``||J_l||_op`` over the latent ball ``||z|| <= radius``
        (see the module docstring for the derivation)."""
        from flowjax.bijections import Affine, Coupling, Flip

        _checks.positive("radius", radius)
        bound = np.full(self.d, float(radius))  # |x_i| <= bound_i: the ball lies in this cube
        Cs, boxes, kinds = [], [bound], []
        delta, s_max = math.exp(self.config.s_max), self.config.s_max
        for layer in _layers(self.model(), self.config.n_layers):
            if isinstance(layer, Coupling):
                d1 = layer.untransformed_dim
                L, L_t, L_s, H_t, t_rows = _coupling_norms(layer)
                x1, alpha = np.linalg.norm(bound[:d1]), bound[d1:].max() * delta * s_max
                a = min(L * math.sqrt(1.0 + alpha ** 2), alpha * L_s + L_t)  # >= ||A||
                C = _sigma2(1.0, a, delta)
                t0 = np.abs(_mlp_numpy(layer.conditioner, np.zeros(d1))[t_rows])  # |t_i(0)|
                shift = np.minimum(t0 + L_t * x1, H_t)  # >= |t_i(x1)| (each <= ||t||)
                bound = np.concatenate([bound[:d1], delta * bound[d1:] + shift])
                kinds.append("coupling")
            elif isinstance(layer, Flip):
                C, bound = 1.0, bound[::-1]
                kinds.append("flip")
            elif isinstance(layer, Affine):
                s = np.abs(np.asarray(layer.scale))
                C, bound = float(s.max()), s * bound + np.abs(np.asarray(layer.loc))
                kinds.append("standardise")
            else:  # pragma: no cover - _model only makes the three kinds above
                raise TypeError(f"no Jacobian bound for layer {type(layer).__name__}")
            Cs.append(C)
            boxes.append(bound)
        return LayerBounds(np.array(Cs), np.array(boxes), tuple(kinds))

    def lipschitz_bound(self, radius: float) -> float:
        """Certified ``L_T = prod_l C_l``: ``||T(z1) - T(z2)|| <= L_T ||z1 - z2||`` for all
        ``||z1||, ||z2|| <= radius``. A radius is required: see the module docstring."""
        return float(np.prod(self.layer_bounds(radius).C))


def _config(d: int, kw: dict) -> FlowConfig:
    cfg = FlowConfig(d=d, **kw)
    for name in ("n_layers", "width", "depth", "steps", "batch_size"):
        _checks.integer(name, getattr(cfg, name), 1)
    for name in ("s_max", "weight_norm", "learning_rate"):
        _checks.positive(name, getattr(cfg, name))
    return cfg._replace(s_max=float(cfg.s_max), weight_norm=float(cfg.weight_norm),
                        learning_rate=float(cfg.learning_rate))


def _check_data(x: Any, batched: bool, holdout: float):
    arr = np.asarray(x)
    want = 3 if batched else 2
    if arr.ndim != want or arr.shape[-1] < 2:
        shape = "(S, n, d)" if batched else "(n, d)"
        raise ValueError(f"x must have shape {shape} with d >= 2 (a coupling layer splits the "
                         f"coordinates), got {arr.shape}")
    if not np.issubdtype(arr.dtype, np.floating):
        arr = arr.astype(float)
    _checks.finite("x", arr)
    h = float(_checks.number("holdout", holdout, 0.0, 1.0, hi_open=True))
    n = arr.shape[-2]
    n_test = int(round(h * n))
    if n - n_test < 2:
        raise ValueError(f"x has n = {n} rows; need at least 2 training rows after holdout={h}")
    if np.any(np.std(arr, axis=-2) == 0):
        raise ValueError("x has a constant coordinate (zero standard deviation); a flow density "
                         "needs every coordinate to vary")
    return arr, n_test


def _flow(out, config, n, n_test) -> Flow:
    params, loc, scale, losses, train, test, heldout = out
    return Flow(params, loc, scale, config, np.asarray(losses), float(train),
                float(test) if n_test else math.nan, n - n_test, np.asarray(heldout))


def fit_flow(key: Any, x: Any, *, holdout: float = 0.2, **config: Any) -> Flow:
    """Fit the flow to ``x: (n, d)`` (``d >= 2``) by maximum likelihood.

    ``key``: int seed or JAX key (data split, initialisation, minibatches). ``holdout``: share of
    rows kept out of training for :attr:`Flow.heldout_nll`. ``config``: :class:`FlowConfig` fields
    (``n_layers=4, width=16, depth=1, s_max=0.5, weight_norm=1.5, steps=400,
    learning_rate=1e-2, batch_size=256``).
    """
    arr, n_test = _check_data(x, False, holdout)
    cfg = _config(arr.shape[-1], config)
    import jax.numpy as jnp

    out = _stored_fit(cfg, n_test, False, as_key(key), jnp.asarray(arr), arr)
    return _flow(out, cfg, arr.shape[0], n_test)


def fit_flows(keys: Any, x: Any, *, holdout: float = 0.2, **config: Any) -> tuple[Flow, ...]:
    """:func:`fit_flow` for ``S`` data sets at once (one ``vmap``-ed compiled fit).

    ``keys``: ``S`` int seeds or a batch of JAX keys; ``x: (S, n, d)`` -> ``S`` :class:`Flow` s.
    Fits (of :func:`fit_flow` too) are kept in ``poolsim.io.cache_dir("fits")``: the same inputs in
    a later process load the same arrays instead of fitting (``POOLSIM_CACHE_DIR=off`` disables it).
    """
    import jax
    import jax.numpy as jnp

    arr, n_test = _check_data(x, True, holdout)
    cfg = _config(arr.shape[-1], config)
    if isinstance(keys, jax.Array) and jax.dtypes.issubdtype(keys.dtype, jax.dtypes.prng_key):
        ks = keys
    else:
        seeds = np.asarray(keys)
        if seeds.ndim != 1 or not np.issubdtype(seeds.dtype, np.integer):
            raise ValueError(f"keys must be a 1-D array of int seeds or of JAX keys, got {keys!r}")
        ks = jax.vmap(jax.random.key)(jnp.asarray(seeds))
    if ks.shape != (arr.shape[0],):
        raise ValueError(f"keys must hold one key per data set (S = {arr.shape[0]}), got {len(ks)}")
    # one transfer to the host, then NumPy slices (slicing S device arrays leaf by leaf would be
    # one dispatch per leaf and seed)
    out = jax.device_get(_stored_fit(cfg, n_test, True, ks, jnp.asarray(arr), arr))
    return tuple(_flow(jax.tree.map(lambda a: a[i], out), cfg, arr.shape[1], n_test)
                 for i in range(arr.shape[0]))
