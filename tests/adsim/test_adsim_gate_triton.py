"""The fused Triton kernel of the exact sequential gate (``adsim.model.gate_triton``, issue 12 item 2)
against the two references of Algorithm 1: the literal loop (``match(..., mode="sequential")``, the
oracle) and the JAX scan it replaces on CUDA (``matching._scan_decisions``).

On the CPU the kernel runs under Triton's interpreter, in ONE child process for all cases
(``_triton_interpret.py``: the interpreter has to be switched on before triton is imported, which
must not happen in this session). Compared: identical 0/1 decisions, the EMA normalisers ``r`` within
1e-6 of the scan's, the kernel's own final centroids within 1e-6 of the loop's, and the ``Matched`` of
``match_sequential(scan_backend="triton")`` like the loop's (centroids within 1e-5, as for the JAX
path). Every metric x {adaptive, fixed radius} x {EMA, slerp}, slots with both / one / no centroid
initialised, clustered data so that the gate accepts and rejects; plus a ViT-L width (d = 768 in a
1024-lane tile) and edge features (antipodal, identical, zero, near-antipodal). The same for the
second kernel, ``kernel="dots"`` (EMA only; cases named ``...-dots``): every metric x gate at both
widths and the edge features, its ``r`` within 1e-6 *relative* of the scan's. Compile checks build the
kernels for an H100/H200 (sm_90) with Triton's real compiler, which needs no GPU (the dots kernel:
no spills at 1, 2 and 4 warps).
"""
from functools import partial

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

from adsim.model import gate_triton as _gate_triton  # noqa: E402
from adsim.model.matching import _compiled_scan, match, match_sequential  # noqa: E402
from poolsim import _core  # noqa: E402

pytestmark = pytest.mark.slow  # Triton's interpreter in a child process, ~2 min

# small: the interpreter runs each tile operation through NumPy, one sample after the other (its cost grows
# with S * N). N = 12 samples per slot still give both labels, unlabelled samples and, in every non-edge case,
# accepted and rejected ones (asserted below); the kernels loop over the samples one by one (no tail block).
S, N, D = 3, 12, 24
TAU = {"l2": 1.3, "cosine": 0.7, "geodesic": 1.4}  # fixed radii inside the data's distance range


def _unit(a):
    return torch.nn.functional.normalize(torch.as_tensor(a, dtype=torch.float32), dim=-1)


def _inputs(seed, n=N, d=D):
    """Unit features around two random directions (20% on the other label's side), 40% anomalous
    labels, 10% without a label; slot 0 has both centroids, slot 1 only the normal one, slot 2 none."""
    rng = np.random.default_rng(seed)
    centre = _unit(rng.standard_normal((2, d)))
    y = (rng.random(n) < 0.4).astype(np.float32)
    side = np.where(rng.random(n) < 0.2, 1 - y, y).astype(int)
    f = _unit(centre[side][None] + 0.9 * torch.as_tensor(rng.standard_normal((S, n, d)), dtype=torch.float32))
    valid = torch.as_tensor((rng.random(n) >= 0.1).astype(np.float32))
    c = _unit(rng.standard_normal((2, S, d)))
    ip, in_ = torch.tensor([1.0, 1.0, 0.0]), torch.tensor([1.0, 0.0, 0.0])
    return [f, torch.as_tensor(y), valid, c[0] * ip[:, None], c[1] * in_[:, None], ip, in_]


NEAR = _unit([-1.0, 0.01] + [0.0] * (D - 2))  # 0.01 rad from -e_0


def _edge_inputs():
    """The branches of the updates, with exactly representable unit vectors (basis vectors ``e_k``, so
    that renormalising changes nothing and ``e - e = 0`` exactly): slots 0 and 1 start with the normal
    centroid ``e_0``, slot 2 with none. Normal features: ``-e_0`` (antipodal: EMA 0/0 at alpha = 0.5,
    slerp's antipodal fallback), ``e_0`` (identical: slerp's small-angle branch), ``0`` (a zero feature,
    angle pi/2 to everything), ``NEAR`` (0.01 rad from antipodal: the EMA's ``r ~ 0.005`` cancels to
    ~1e-4 relative when summed from dot products, the case the dots kernel corrects one step later);
    slot 2 sees ``e_1`` then ``-e_1`` instead of the first two."""
    f, y, valid, c_pos, c_neg, ip, in_ = _inputs(7, n=12)
    e = torch.eye(D)
    c_pos[:2] = e[0]
    f[:, 0], f[:, 1], f[:, 2], f[:, 3] = -e[0], e[0], 0.0, NEAR
    f[2, 0], f[2, 1] = e[1], -e[1]
    y[:4], valid[:4] = 0.0, 1.0
    return [f, y, valid, c_pos, c_neg, ip, in_]


CASES = {f"{metric}-{'adaptive' if tau is None else 'fixed'}-{update}":
         (_inputs(1), dict(metric=metric, tau=None if tau is None else TAU[metric], update=update,
                           alpha=0.5 if update == "ema" else 0.3))  # 0.3: where slerp differs from the EMA
         for metric in _core.METRICS for tau in (None, True) for update in ("ema", "slerp")}
CASES["vit-width-geodesic-ema"] = (_inputs(2, n=12, d=768), dict(metric="geodesic", tau=None, update="ema",
                                                                  alpha=0.5))
for _update in ("ema", "slerp"):
    CASES[f"edge-geodesic-{_update}"] = (_edge_inputs(), dict(metric="geodesic", tau=None, update=_update,
                                                              alpha=0.5))
# the dots kernel (EMA only; "-dots" in the name): every metric x gate, the ViT-L width, the edge features
for metric in _core.METRICS:
    for tau in (None, TAU[metric]):
        gate = "adaptive" if tau is None else "fixed"
        CASES[f"{metric}-{gate}-ema-dots"] = (_inputs(1), dict(metric=metric, tau=tau, update="ema", alpha=0.5))
        CASES[f"vit-width-{metric}-{gate}-ema-dots"] = (_inputs(2, n=8, d=768), dict(metric=metric, tau=tau,
                                                                                     update="ema", alpha=0.5))
    CASES[f"edge-{metric}-ema-dots"] = (_edge_inputs(), dict(metric=metric, tau=None, update="ema", alpha=0.5))
# the default kernel ("auto"), as match_sequential runs it: dots for the EMA, chords for slerp
for _update in ("ema", "slerp"):
    CASES[f"geodesic-adaptive-{_update}-auto"] = CASES[f"geodesic-adaptive-{_update}"]
# the EMA's default kernel through torch.compile (the compiled training step's path): one graph
CASES["compiled-geodesic-adaptive-ema-auto"] = CASES["geodesic-adaptive-ema"]


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory, triton_interpreter):
    """``{case: {"decisions": Decisions, "matched": Matched}}`` from one interpreter child process."""
    out = triton_interpreter([{"args": args, "kw": kw, "kernel": _kernel(name), "compiled": name.startswith("compiled-")}
                              for name, (args, kw) in CASES.items()],
                             tmp_path_factory.mktemp("triton"))
    return {name: {"decisions": _gate_triton.Decisions(*o["decisions"]), "matched": o["matched"]}
            for name, o in zip(CASES, out)}


def _kernel(name):
    """Each case names its kernel: ``-dots`` cases the dots kernel, the others the chords kernel (which
    the default, ``"auto"``, still runs for slerp); ``-auto`` cases the default, as ``match_sequential``
    calls it."""
    return name.rsplit("-", 1)[1] if name.endswith(("-dots", "-auto")) else "chords"


def _loop(f, y, valid, c_pos, c_neg, ip, in_, **kw):
    per = [match(f[s], y, valid, c_pos[s], c_neg[s], ip[s], in_[s], mode="sequential", **kw)
           for s in range(f.shape[0])]
    return [torch.stack(t) for t in zip(*per)]


def _jax_scan(f, y, valid, c_pos, c_neg, ip, in_, *, metric, tau, update, alpha):
    is_pos, is_neg = (1.0 - y) * valid, y * valid
    args = [t.numpy() for t in (_core.normalize(f), is_pos, is_neg, c_pos, c_neg, ip, in_)]
    return [torch.tensor(np.asarray(a)) for a in _compiled_scan(metric, alpha, 1, tau, update)(*args)]


@pytest.mark.parametrize("name", list(CASES))
def test_kernel_equals_the_literal_loop_and_the_jax_scan(interpreted, name):
    args, kw = CASES[name]
    got = interpreted[name]["decisions"]
    loop = _loop(*args, **kw)
    scan = _jax_scan(*args, **kw)
    for k, (mine, oracle, jax_acc) in enumerate(((got.acc_pos, loop[2], scan[0]), (got.acc_neg, loop[3], scan[1]))):
        assert torch.equal(mine, oracle), f"decisions {('pos', 'neg')[k]} differ from the literal loop"
        assert torch.equal(mine, jax_acc), f"decisions {('pos', 'neg')[k]} differ from the JAX scan"
    dots = _gate_triton.resolve_kernel(_kernel(name), kw["update"]) == "dots"
    tol = dict(rtol=1e-6, atol=0) if dots else dict(rtol=0, atol=1e-6)  # dots: relative
    torch.testing.assert_close(got.r_pos, scan[2], **tol)
    torch.testing.assert_close(got.r_neg, scan[3], **tol)
    torch.testing.assert_close(got.c_pos, loop[0], rtol=0, atol=1e-6)  # the kernel's in-register centroids
    torch.testing.assert_close(got.c_neg, loop[1], rtol=0, atol=1e-6)
    labelled = args[2] > 0
    accepted = torch.stack([got.acc_pos, got.acc_neg]).amax(0)[:, labelled]
    if not name.startswith("edge"):  # the comparison is not vacuous: the gate accepts and rejects
        assert 0 < accepted.sum() < accepted.numel(), name


@pytest.mark.parametrize("name", ["geodesic-adaptive-ema", "l2-fixed-slerp", "edge-geodesic-slerp",
                                  "l2-fixed-ema-dots", "vit-width-geodesic-adaptive-ema-dots", "edge-cosine-ema-dots"])
def test_match_sequential_with_the_kernel_equals_the_literal_loop(interpreted, name):
    args, kw = CASES[name]
    got = interpreted[name]["matched"]
    loop = _loop(*args, **kw)
    for k in (2, 3, 4, 5):  # decisions and init flags: identical
        assert torch.equal(got[k], loop[k])
    torch.testing.assert_close(got[0], loop[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(got[1], loop[1], rtol=0, atol=1e-5)


def test_compiled_match_sequential_runs_the_kernel_in_its_graph(interpreted):
    """``torch.compile(match_sequential, fullgraph=True)`` with the Triton kernel (the compiled training step's
    exact gate on a GPU): the child compiled it as one graph (fullgraph raises on a break), the kernel ran
    (its raw decisions were recorded) and the result is the eager call's."""
    eager, comp = interpreted["geodesic-adaptive-ema-auto"], interpreted["compiled-geodesic-adaptive-ema-auto"]
    for a, b in zip(eager["decisions"], comp["decisions"]):
        assert torch.equal(a, b)
    for k in (2, 3, 4, 5):  # decisions and init flags: identical
        assert torch.equal(comp["matched"][k], eager["matched"][k])
    for k in (0, 1):  # the centroids: the same ops, traced (aot_eager runs them eagerly)
        torch.testing.assert_close(comp["matched"][k], eager["matched"][k], rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", ["edge-geodesic-ema"] + [f"edge-{m}-ema-dots" for m in _core.METRICS])
def test_edge_features_take_the_special_branches(interpreted, name):
    """Hand-derived from Algorithm 1 (EMA, alpha = 0.5, r = ||c/2 + f/2||), the same for every metric
    (each orders unit vectors by their angle). Slot 0 (both centroids): rejects -e_0 (angle pi; the
    random anomaly centroid is closer), accepts e_0 (r = ||e_0|| = 1). Slot 1 (anomaly centroid
    uninitialised, so infinitely far): accepts -e_0 with r = 0 (0/0, centroid unchanged), the zero
    feature with r = ||e_0 / 2|| = 0.5 and NEAR with r = ||e_0 + NEAR|| / 2 (float64 from NEAR's float32
    entries; relative 1e-6). Slot 2 (nothing): e_1 initialises the normal centroid (r = ||e_1 / 2|| =
    0.5), then -e_1 is accepted with r = 0."""
    d = interpreted[name]["decisions"]
    assert d.acc_pos[0, :2].tolist() == [0.0, 1.0] and d.r_pos[0, 1] == 1.0
    assert d.acc_pos[1, [0, 2, 3]].tolist() == [1.0, 1.0, 1.0] and d.r_pos[1, [0, 2]].tolist() == [0.0, 0.5]
    near = 0.5 * float(torch.linalg.vector_norm(torch.eye(D, dtype=torch.float64)[0] + NEAR.double()))
    assert abs(float(d.r_pos[1, 3]) - near) <= 1e-6 * near, (float(d.r_pos[1, 3]), near)
    assert d.acc_pos[2, :2].tolist() == [1.0, 1.0] and d.r_pos[2, :2].tolist() == [0.5, 0.0]
    # at alpha = 0.5 slerp moves to the renormalised midpoint (the EMA's point) and its antipodal
    # fallback is the EMA: the same decisions through its small-angle and antipodal branches
    assert torch.equal(interpreted["edge-geodesic-slerp"]["decisions"].acc_pos[:, :3], d.acc_pos[:, :3])


def test_bad_scan_backend_and_cpu_without_interpreter():
    args = _inputs(0)
    with pytest.raises(ValueError, match=r"scan_backend must be one of \('auto', 'jax', 'triton'\)"):
        match_sequential(*args, scan_backend="cuda")
    if _gate_triton.interpreted():
        pytest.skip("this session runs Triton's interpreter")
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        match_sequential(*args, scan_backend="triton")
    with pytest.raises(ValueError, match=r"feature width d in \[1, 1024\]"):
        _gate_triton.gate_decisions(torch.zeros(1, 2, 1025), torch.ones(2), torch.zeros(2), torch.zeros(1, 1025),
                                    torch.zeros(1, 1025), torch.zeros(1), torch.zeros(1), metric="l2", alpha=0.5)


def test_bank_passes_its_scan_backend_on():
    from adsim.model.matching import CentroidBank

    with pytest.raises(ValueError, match="scan_backend must be one of"):
        CentroidBank(2, D, mode="sequential", scan_backend="cuda")
    f, y, valid, *_ = _inputs(0)
    assert CentroidBank(S, D, mode="sequential", scan_backend="jax").step(0, f, y, valid).acc_pos.shape == (S, N)
    if not _gate_triton.interpreted():  # the kernel was asked for: CPU tensors without the interpreter refuse
        with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
            CentroidBank(S, D, mode="sequential", scan_backend="triton").step(0, f, y, valid)


def test_auto_takes_the_jax_scan_for_cpu_tensors():
    from adsim.model.matching import _use_triton

    f = torch.zeros(1, 4, 8)
    assert not _use_triton(f, "auto", "auto") and not _use_triton(f, "jax", "auto")
    assert _use_triton(f, "triton", "auto")


def test_kernel_compiles_for_sm90_without_a_gpu():
    """Triton's real compiler (front end, passes, ptxas) on the ViT-L shape: catches what the
    interpreter accepts but the compiler does not (e.g. a tile shape or op it cannot lower)."""
    if _gate_triton.interpreted():
        pytest.skip("this session runs Triton's interpreter (the kernel is not a compilable JIT function)")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = {k: "*fp32" for k in ("f_ptr", "lab_ptr", "c_ptr", "init_ptr", "acc_ptr", "r_ptr", "c_out_ptr")}
    sig.update(n="i32", d="i32", alpha="fp32", beta="fp32", tau="fp32", tau_sin="fp32", tau_cos="fp32")
    for const in (dict(METRIC=2, FIXED_TAU=False, SLERP=True, BLOCK_D=1024),
                  dict(METRIC=0, FIXED_TAU=True, SLERP=False, BLOCK_D=1024)):
        src = ASTSource(fn=_gate_triton._gate_kernel, signature={**sig, **{k: "constexpr" for k in const}},
                        constexprs=const)
        try:
            k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4,
                                                                                   enable_fp_fusion=False))
        except RuntimeError as e:  # pragma: no cover - a triton without its bundled CUDA tools
            if "ptxas" in str(e):
                pytest.skip(f"no ptxas: {e}")
            raise
        assert "cubin" in k.asm and "div.rn.f32" in k.asm["ptx"]  # IEEE division, as torch and JAX


@pytest.mark.parametrize("num_warps", [1, 2, 4])
def test_dots_kernel_fits_its_warps_without_spills(num_warps, monkeypatch, capsys):
    """The dots kernel for sm_90 at the ViT-L shape (d = 768 in a 1024-lane tile; arguments divisible
    by 16, as Triton specialises a real launch), geodesic adaptive gate: ptxas (Triton's own call, its
    log printed) reports no spills at 1, 2 and 4 warps (1 warp: ~140 registers of the 255 a thread
    may use)."""
    if _gate_triton.interpreted():
        pytest.skip("this session runs Triton's interpreter (the kernel is not a compilable JIT function)")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    knobs = getattr(triton, "knobs", None)
    if knobs is None:  # pragma: no cover - triton < 3.4
        pytest.skip("needs triton.knobs (triton >= 3.4) to read ptxas' log")
    monkeypatch.setattr(knobs.nvidia, "dump_ptxas_log", True)
    monkeypatch.setattr(knobs.compilation, "always_compile", True)  # a cached binary prints no log
    fn = _gate_triton._dots_kernel
    sig = {k: "*fp32" for k in ("f_ptr", "lab_ptr", "c_ptr", "init_ptr", "acc_ptr", "r_ptr", "c_out_ptr")}
    sig.update(n="i32", d="i32", alpha="fp32", beta="fp32", tau_key="fp32")
    const = dict(METRIC=2, FIXED_TAU=False, BLOCK_D=1024, STAGES=_gate_triton.DOTS_STAGES)
    attrs = {(fn.arg_names.index(k),): [["tt.divisibility", 16]]
             for k, v in sig.items() if v == "*fp32" or k in ("n", "d")}
    src = ASTSource(fn=fn, signature={**sig, **{k: "constexpr" for k in const}}, constexprs=const, attrs=attrs)
    try:
        triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=num_warps))
    except RuntimeError as e:  # pragma: no cover - a triton without its bundled CUDA tools
        if "ptxas" in str(e):
            pytest.skip(f"no ptxas: {e}")
        raise
    log = capsys.readouterr().out
    assert "Used " in log and " registers" in log, log
    assert "0 bytes spill stores, 0 bytes spill loads" in log, log


def test_default_kernel_is_dots_for_the_ema_and_chords_for_slerp():
    """``match_sequential`` calls the kernel without ``kernel=``: the default ``"auto"`` resolves to the
    faster dots kernel for the EMA and to chords, the only one with slerp, for slerp."""
    assert _gate_triton.DEFAULT_KERNEL == "auto"
    assert _gate_triton.resolve_kernel(_gate_triton.DEFAULT_KERNEL, "ema") == "dots"
    assert _gate_triton.resolve_kernel(_gate_triton.DEFAULT_KERNEL, "slerp") == "chords"
    assert _gate_triton.resolve_kernel("chords", "ema") == "chords"


def test_kernel_choice_is_checked():
    args = _inputs(0)
    f, y, valid, c_pos, c_neg, ip, in_ = args
    gate_args = (f, (1 - y) * valid, y * valid, c_pos, c_neg, ip, in_)
    with pytest.raises(ValueError, match=r"kernel must be one of \('auto', 'chords', 'dots'\), got 'fast'"):
        _gate_triton.gate_decisions(*gate_args, metric="l2", alpha=0.5, kernel="fast")
    with pytest.raises(ValueError, match="kernel='dots' implements the EMA update only"):
        _gate_triton.gate_decisions(*gate_args, metric="l2", alpha=0.5, update="slerp", kernel="dots")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the kernel compiled, not interpreted)")
@pytest.mark.parametrize("name", list(CASES))
def test_compiled_kernel_on_cuda_equals_the_literal_loop(name, monkeypatch):
    args, kw = CASES[name]
    x = [a.cuda() for a in args]
    x[0].requires_grad_(True)
    gate = partial(_gate_triton.gate_decisions, kernel=_kernel(name))
    monkeypatch.setattr(_gate_triton, "gate_decisions", gate)  # the case's kernel inside match_sequential
    got = match_sequential(*x, **kw)  # scan_backend="auto": the kernel on CUDA tensors
    raw = gate(_core.normalize(x[0].detach()), (1 - x[1]) * x[2], x[1] * x[2], *x[3:], **kw)
    loop = _loop(*args, **kw)
    assert torch.equal(got.acc_pos.cpu(), loop[2]) and torch.equal(got.acc_neg.cpu(), loop[3])
    torch.testing.assert_close(got.c_pos.cpu(), loop[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(raw.c_pos.cpu(), loop[0], rtol=0, atol=1e-5)
    (g,) = torch.autograd.grad(got.c_pos.sum() + got.c_neg.sum(), x[0])
    assert torch.isfinite(g).all()
