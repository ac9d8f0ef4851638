"""The compiled training step (``adsim.training.compiled_step``, ``train --compile``): two graphs (features +
matching, then the pixel/image losses), and the same losses, gradients and centroid / VACA state as the
eager step; the sequential gate between graphs; a method's own trainer (anomalyclip) compiled; the eager
fallback when compilation fails; the run's execution record. Inductor's real code generation (C++ on
the CPU) runs once per method in ``test_adsim_compile_inductor.py``.

Backend here: ``aot_eager`` -- dynamo's graph capture plus AOTAutograd (functionalisation of the in-place
centroid and VACA buffer updates, the traced backward), without inductor's code generation, which takes
~2 minutes of C++ compilation for this step on the 2-core CI machine (measured: 77 s forward + 41 s
backward, against ~10 s for ``aot_eager``). Inductor's kernels are compared with eager by
``benchmarks/adsim_step.py --compile`` (loss and gradient agreement in its table). A counting wrapper
around the backend proves that the compiled graph ran (dynamo falls back to eager silently when it
gives up, and an eager-vs-eager comparison could not fail).

Tolerance (float32): the captured graph runs decomposed ops (normalisation, softplus, variance, cdist's
backward, the losses) whose reductions are summed in another order; a sum of ``n`` terms then differs
by at most ~``n u`` relative (``u = 2^-24 = 6e-8``), ``n <= B N = 256`` here, i.e. ~1.5e-5, and a
gradient chains a few such reductions: rtol 1e-4 on gradients (relative to each tensor's largest
entry), 2e-5 on losses and state. Measured: <= 1e-6.
"""
import copy
import json

import pytest
import torch

from adsim.cli.main import main
from adsim.config import recipes
from adsim.config.prompts import prompt_ensemble
from adsim.config.run import config_from_recipe
from adsim.model.head import make_head, text_embeddings, trunk_tokens
from adsim.training import compiled_step
from adsim.training.train import make_optimizer

pytestmark = [pytest.mark.filterwarnings("ignore::adsim.model.backbone.RandomWeightsWarning"), pytest.mark.slow]  # slow: torch.compile traces and trainings, ~3 min


class Counting:
    """A torch.compile backend: ``aot_eager`` (or dynamo's ``eager``) that counts the graphs it compiled."""

    def __init__(self, name="aot_eager"):
        from torch._dynamo.backends.registry import lookup_backend
        self.inner, self.graphs = lookup_backend(name), 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return self.inner(gm, example_inputs)


def _cfg(recipe="clean", **over):
    cfg = config_from_recipe(recipes.get(recipe), data="", target="Brain", out="")
    return cfg._replace(gate_mode="batched", **over) if cfg.method == "match" else cfg._replace(**over)


def _batches(spec, n, b=4, seed=1):
    gen = torch.Generator().manual_seed(seed)
    s = spec.image_size
    out = []
    for i in range(n):
        masks = torch.zeros(b, s, s)
        masks[1::2, s // 4: s // 2 + 4 * i, s // 4: s // 2] = 1.0  # every other image: a lesion
        out.append({"image": torch.randn(b, 3, s, s, generator=gen), "mask": masks,
                    "has_mask": torch.tensor([1.0] * (b - 1) + [0.0]),  # one image without a mask
                    "label": torch.tensor([float(j % 2) for j in range(b)]), "pixel_domain": torch.ones(b),
                    "domain": torch.arange(b) % 2})
    return out


def _grads(head):
    return {n: p.grad.clone() for n, p in head.named_parameters() if p.grad is not None}


def _twin_heads(tiny, cfg):
    """Two identical training-mode heads of ``cfg``: one for the eager step, one for the compiled step."""
    spec = tiny.spec
    eager = make_head(cfg, spec.width, spec.embed_dim, text_embeddings(tiny, prompt_ensemble())).train()
    return eager, copy.deepcopy(eager)


def test_compiled_step_matches_eager_for_three_steps(tiny):
    """3 training steps (Adam between them) from the same start: every loss part, every gradient and,
    after each optimiser step, every parameter and buffer (centroids, init flags, VACA running Delta and
    count) of the compiled step equal the eager step's. Then NaN features raise as in eager."""
    spec = tiny.spec
    cfg = _cfg()
    torch.manual_seed(0)
    eager, comp = _twin_heads(tiny, cfg)
    backend = Counting()
    step = compiled_step.compiled_loss(cfg, comp, tiny, spec.grid, backend=backend, fullgraph=True)
    opts = make_optimizer(cfg, eager), make_optimizer(cfg, comp)
    for k, batch in enumerate(_batches(spec, 3)):
        tokens = trunk_tokens(tiny, batch["image"])
        loss_e, parts_e, ok = compiled_step.post_trunk_loss(cfg, eager, tiny, tokens, batch, spec.grid)
        loss_c, parts_c = step(cfg, comp, tokens, batch)
        assert bool(ok)
        for o in opts:
            o.zero_grad(set_to_none=True)
        loss_e.backward()
        loss_c.backward()
        assert parts_c.keys() == parts_e.keys()
        for name in parts_e:
            torch.testing.assert_close(parts_c[name], parts_e[name], rtol=2e-5, atol=1e-6, msg=f"step {k} {name}")
        ge, gc = _grads(eager), _grads(comp)
        assert ge.keys() == gc.keys() and len(ge) > 0
        for name in ge:
            torch.testing.assert_close(gc[name], ge[name], rtol=1e-4, atol=1e-4 * float(ge[name].abs().max()),
                                       msg=f"step {k} grad {name}")
        for o in opts:
            o.step()
        se, sc = eager.state_dict(), comp.state_dict()
        for name in se:
            torch.testing.assert_close(sc[name], se[name], rtol=2e-5, atol=2e-5, msg=f"step {k} state {name}")
    assert float(comp.centroids.init_pos.min()) == 1.0 and float(comp.centroids.init_neg.min()) == 1.0
    assert int(comp.vaca[0].n_tracked) == 3  # the running statistic was written back at every step
    assert backend.graphs == 2  # two regions, each one graph (AOTAutograd derives its backward), compiled once
    bad = trunk_tokens(tiny, _batches(spec, 1)[0]["image"])
    bad[0, 1, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN or inf"):
        step(cfg, comp, bad, _batches(spec, 1)[0])
    assert backend.graphs == 2  # same shapes: no recompilation


@pytest.mark.parametrize("recipe", ["paper", "authors", "mvfa"])
def test_recipes_compile_to_two_graphs(tiny, recipe):
    """The other recipes' code paths (per-image gate with skipped steps, slerp, reciprocal losses,
    seg-only matching, no VACA/centroids) capture as one graph per region (``fullgraph=True`` raises on a break);
    dynamo's ``eager`` backend (capture only: the semantics are the test above's) gives eager's loss."""
    spec = tiny.spec
    cfg = _cfg(recipe)
    torch.manual_seed(0)
    head = make_head(cfg, spec.width, spec.embed_dim, text_embeddings(tiny, prompt_ensemble())).train()
    ref = copy.deepcopy(head)
    batch = _batches(spec, 1)[0]
    tokens = trunk_tokens(tiny, batch["image"])
    backend = Counting("eager")
    loss_c, _ = compiled_step.compiled_loss(cfg, head, tiny, spec.grid, backend=backend, fullgraph=True)(cfg, head, tokens, batch)
    loss_e, _, _ = compiled_step.post_trunk_loss(cfg, ref, tiny, tokens, batch, spec.grid)
    assert backend.graphs == 2
    torch.testing.assert_close(loss_c, loss_e, rtol=2e-5, atol=1e-6)



def _assert_same_grads(loss_c, loss_e, module_c, module_e, *, allow_unused=False, msg=None):
    """The gradients of ``loss_c`` w.r.t. ``module_c``'s parameters equal those of ``loss_e`` w.r.t.
    ``module_e``'s (rtol 1e-4, atol 1e-4 of the largest eager entry); with ``allow_unused`` a parameter may
    get no gradient, but then in both."""
    ge = torch.autograd.grad(loss_e, list(module_e.parameters()), allow_unused=allow_unused)
    gc = torch.autograd.grad(loss_c, list(module_c.parameters()), allow_unused=allow_unused)
    for a, b in zip(ge, gc):
        assert (a is None) == (b is None), msg
        if a is not None:
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4 * float(a.abs().max()), msg=msg)

@pytest.mark.parametrize("update", ["ema", "slerp"])
def test_sequential_gate_compiles_as_eager(tiny, update):
    """The exact sequential gate (JAX scan on the CPU) under torch.compile. EMA: its decisions are one opaque
    operator (``torch.ops.adsim.gate_decisions``), so each region is one graph (``fullgraph=True`` raises on
    any break). Slerp: the gate runs eagerly between the graphs of region 1 (its host read of the steps to
    replay). Either way a step gives eager's loss, gradients and centroids (dynamo traces the frames around
    the gate: ~15 s on the 2-core CI machine, so one step)."""
    spec = tiny.spec
    cfg = _cfg()._replace(gate_mode="sequential", update=update)
    torch.manual_seed(0)
    eager, comp = _twin_heads(tiny, cfg)
    backend = Counting()
    step = compiled_step.compiled_loss(cfg, comp, tiny, spec.grid, backend=backend, fullgraph=update == "ema")
    for k, batch in enumerate(_batches(spec, 1, b=2)):
        tokens = trunk_tokens(tiny, batch["image"])
        loss_e, parts_e, _ = compiled_step.post_trunk_loss(cfg, eager, tiny, tokens, batch, spec.grid)
        loss_c, parts_c = step(cfg, comp, tokens, batch)
        torch.testing.assert_close(loss_c, loss_e, rtol=2e-5, atol=1e-6, msg=f"step {k}")
        _assert_same_grads(loss_c, loss_e, comp, eager, allow_unused=True, msg=f"step {k}")
        for name, t in eager.state_dict().items():
            torch.testing.assert_close(comp.state_dict()[name], t, rtol=2e-5, atol=2e-5, msg=f"step {k} {name}")
        assert float(parts_c["intra"]) > 0  # the gate accepted features: the centroids moved
    if update == "ema":
        assert backend.graphs == 2  # the two regions, the gate inside the first
    else:
        assert backend.graphs > 2  # region 1 broke around the gate
    assert not step.regions.fell_back


@pytest.mark.parametrize("name", ["anomalyclip", "mao"])
def test_a_trainer_compiles_and_matches_eager(tiny, name):
    """A method's own trainer (anomalyclip: frozen towers + learned prompts, glocal loss; mao: frozen visual
    tower + per-domain prototypes, a loss that indexes each sample's domain) as two compiled regions: same
    loss and gradients as eager, one graph each."""
    from adsim.methods import catalog

    spec = tiny.spec
    cfg = _cfg(name)
    trainer = catalog.trainer(name)
    torch.manual_seed(0)
    module = trainer.build(cfg, tiny)
    backend = Counting()
    forward, loss_fn, regions = compiled_step.compiled_trainer(cfg, trainer, module, tiny, backend=backend,
                                                               fullgraph=True)
    batch = _batches(spec, 1, b=2)[0]
    loss_e, parts_e = trainer.loss(cfg, module, trainer.forward(module, tiny, batch["image"]), batch)
    loss_c, parts_c = loss_fn(cfg, module, forward(batch["image"]), batch)
    assert backend.graphs == 2 and not regions.fell_back
    torch.testing.assert_close(loss_c, loss_e, rtol=2e-5, atol=1e-6)
    _assert_same_grads(loss_c, loss_e, module, module)


class Failing:
    """A torch.compile backend whose code generation fails, as inductor's did on an H100."""

    def __init__(self):
        self.calls = 0

    def __call__(self, gm, example_inputs):
        self.calls += 1
        raise RuntimeError("PassManager::run failed (injected)\nsecond line of the compiler's message")


def test_compile_failure_falls_back_to_eager_with_one_warning(tiny):
    """A failing backend: the first call warns ONCE (CompileFallbackWarning, the error's first line), redoes
    the step eagerly (same loss, centroids and VACA state as a pure eager step: nothing ran twice) and
    never compiles again."""
    spec = tiny.spec
    cfg = _cfg()
    torch.manual_seed(0)
    eager, comp = _twin_heads(tiny, cfg)
    backend = Failing()
    step = compiled_step.compiled_loss(cfg, comp, tiny, spec.grid, backend=backend)
    for k, batch in enumerate(_batches(spec, 2, b=2)):
        tokens = trunk_tokens(tiny, batch["image"])
        loss_e, _, _ = compiled_step.post_trunk_loss(cfg, eager, tiny, tokens, batch, spec.grid)
        if k == 0:
            with pytest.warns(compiled_step.CompileFallbackWarning) as rec:
                loss_c, _ = step(cfg, comp, tokens, batch)
            assert len(rec) == 1
            message = str(rec[0].message)
            assert "PassManager::run failed (injected)" in message and "\n" not in message
        else:
            loss_c, _ = step(cfg, comp, tokens, batch)  # no warning (filterwarnings = error)
        torch.testing.assert_close(loss_c, loss_e, rtol=0, atol=0)
        for name, t in eager.state_dict().items():
            torch.testing.assert_close(comp.state_dict()[name], t, rtol=0, atol=0, msg=f"step {k} {name}")
    assert step.regions.fell_back and backend.calls == 1


def test_compatibility_and_modes():
    cfg = _cfg()
    with pytest.raises(ValueError, match="one-process"):
        compiled_step.check_compatible(cfg, world_size=2)
    compiled_step.check_compatible(cfg._replace(gate_mode="sequential"))  # every gate and method compiles
    compiled_step.check_compatible(_cfg("mvfa"))  # the naive head: no gate at all
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert compiled_step.resolve_mode("auto", cpu) == "default" and compiled_step.resolve_mode("auto", cuda) == "reduce-overhead"
    assert compiled_step.resolve_mode("reduce-overhead", cuda) == "reduce-overhead"
    # the default: compiled with CUDA graphs on a CUDA device in one process, else eager
    assert compiled_step.DEFAULT == "off"  # docs/compile.md: compiling pays back after several epochs
    assert compiled_step.resolve_mode("cuda", cuda) == "reduce-overhead"
    assert compiled_step.resolve_mode("cuda", cpu) is None and compiled_step.resolve_mode("cuda", cuda, world_size=2) is None
    assert compiled_step.resolve_mode("off", cuda) is None and compiled_step.resolve_mode(None, cuda) is None
    from adsim.config import choices
    assert choices.MODES == compiled_step.MODES and choices.COMPILE_CHOICES == compiled_step.CHOICES
    assert choices.DEFAULT_COMPILE == compiled_step.DEFAULT
    with pytest.raises(ValueError, match="needs a CUDA device"):
        compiled_step.resolve_mode("reduce-overhead", cpu)
    with pytest.raises(ValueError, match="compile mode must be one of"):
        compiled_step.resolve_mode("max-autotune", cpu)


def _execution(run):
    return json.loads((run / "config.json").read_text())["execution"]


def test_cli_compile_trains_like_eager_and_is_recorded(toy_root, tmp_path, monkeypatch, capsys):
    """``train --compile`` (auto -> default on CPU; also from ``--trunk-cache``'s tokens) runs the compiled
    step, records the resolved mode, world size and device in config.json ("execution"), and ends with
    the eager run's head and logged losses (tolerance as above); without the flag the CPU run is eager;
    ``--resume`` may switch it off. A setting the compiled step lacks is a one-line error before any work."""
    backend = Counting()
    monkeypatch.setattr(compiled_step, "BACKEND", backend)
    common = ["train", "--data", str(toy_root), "--target", "Liver", "--train-domains", "Brain", "Histopathology",
              "--gate-mode", "batched", "--backbone", "tiny", "--batch-size", "8", "--no-progress"]
    plain, comp, cached = tmp_path / "plain", tmp_path / "comp", tmp_path / "cached"
    assert main([*common, "--out", str(plain), "--epochs", "1"]) == 0
    assert backend.graphs == 0  # the default on the CPU: eager
    assert main([*common, "--out", str(comp), "--epochs", "1", "--compile"]) == 0
    assert backend.graphs >= 1  # the compiled step ran
    assert main([*common, "--out", str(cached), "--epochs", "1", "--compile", "default", "--trunk-cache"]) == 0
    cpu = {"world_size": 1, "device": "cpu", "device_name": "cpu"}
    assert _execution(plain) == {**cpu, "compile": None, "trunk_cache": False}
    assert _execution(comp) == {**cpu, "compile": "default", "trunk_cache": False}
    assert _execution(cached) == {**cpu, "compile": "default", "trunk_cache": True}
    a = torch.load(plain / "checkpoint_last.pt", weights_only=False)
    for run in (comp, cached):
        b = torch.load(run / "checkpoint_last.pt", weights_only=False)
        for k in a["head"]:
            torch.testing.assert_close(b["head"][k], a["head"][k], rtol=2e-5, atol=2e-5, msg=f"{run.name} {k}")
        (ha,), (hb,) = a["history"], b["history"]
        assert ha.keys() == hb.keys() and ha["steps"] == hb["steps"] == 2
        for k in ha:
            assert hb[k] == pytest.approx(ha[k], rel=2e-5, abs=1e-6), f"{run.name} {k}"
    # a run setting, not part of the method: resuming with --compile off is allowed and recorded
    assert main([*common, "--out", str(comp), "--epochs", "2", "--resume", "--compile", "off"]) == 0
    assert _execution(comp)["compile"] is None
    capsys.readouterr()
    argv = [*common, "--out", str(tmp_path / "bad"), "--epochs", "1", "--compile", "reduce-overhead"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "needs a CUDA device" in err[0]
    assert not (tmp_path / "bad").exists()  # refused before any work


def test_cli_compile_failure_is_one_warning_line_and_recorded(toy_root, tmp_path, monkeypatch, capsys):
    """A compiler that fails (injected backend): ``train --compile`` prints ONE ``warning:`` line (no
    traceback), trains eagerly to the eager run's result and records ``compile_failed`` in config.json."""
    monkeypatch.setattr(compiled_step, "BACKEND", Failing())
    common = ["train", "--data", str(toy_root), "--target", "Liver", "--train-domains", "Brain",
              "--backbone", "tiny", "--batch-size", "8", "--no-progress", "--epochs", "1", "--recipe", "mvfa"]
    plain, comp = tmp_path / "plain", tmp_path / "comp"
    assert main([*common, "--out", str(plain)]) == 0
    capsys.readouterr()
    assert main([*common, "--out", str(comp), "--compile"]) == 0
    err = capsys.readouterr().err
    # (the CLI's random-weights notice is printed once per process, by whichever run comes first)
    warned = [ln for ln in err.splitlines() if ln.lower().startswith("warning:") and "select='test'" not in ln
              and "has RANDOM weights" not in ln]
    assert len(warned) == 1 and warned[0].startswith("warning: torch.compile failed") and "injected" in warned[0], err
    assert "Traceback" not in err
    assert _execution(comp)["compile_failed"] is True and _execution(comp)["compile"] == "default"
    a, b = (torch.load(r / "checkpoint_last.pt", weights_only=False)["head"] for r in (plain, comp))
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=0, msg=k)


def test_execution_record_names_world_size_and_device():
    from adsim.runtime.distributed import World
    from adsim.training.train import execution_record

    rec = execution_record(World(1, 4, 1), torch.device("cpu"), compile_mode=None, trunk_cache=True)
    assert rec == {"world_size": 4, "device": "cpu", "device_name": "cpu", "compile": None, "trunk_cache": True}
    if torch.cuda.is_available():
        gpu = execution_record(World(0, 1, 0), torch.device("cuda", 0), compile_mode="reduce-overhead", trunk_cache=False)
        assert gpu["device_name"] == torch.cuda.get_device_name(0) and gpu["device"] == "cuda"
