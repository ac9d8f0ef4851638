"""Each trained method's compiled step through inductor's real code generation (C++ kernels on the CPU),
once: the lowering and code generation that ``train --compile`` uses on a GPU (where inductor emits
Triton instead), which the ``aot_eager`` tests of ``test_adsim_compile.py`` do not run.

Cheap by construction: the tiny backbone at 32 px (a 4 x 4 patch grid), batch 2, one step per method,
C++ compiled at ``-O0`` (``aot_inductor.debug_compile``: the generated code is the same, gcc spends
less time on it), in-process compilation (``compile_threads=1``) and no compile cache, so the cost is
the same on every run. Measured on the 2-core CI machine: see ``benchmarks/RESULTS.md`` (compile tests).
Compared with eager: loss and gradients (rtol 1e-4, as for ``aot_eager``: fused kernels reassociate
float32 sums), the centroids after the step, and no fallback.
"""
import copy

import pytest
import torch

from adsim.config import recipes
from adsim.config.prompts import prompt_ensemble
from adsim.config.run import config_from_recipe
from adsim.model.backbone import RandomWeightsWarning, build_backbone
from adsim.model.head import make_head, text_embeddings, trunk_tokens
from adsim.training import compiled_step

pytestmark = [pytest.mark.filterwarnings("ignore::adsim.model.backbone.RandomWeightsWarning"), pytest.mark.slow]

SIZE, B = 32, 2
INDUCTOR = {"aot_inductor.debug_compile": True, "compile_threads": 1, "fx_graph_cache": False, "cpp.simdlen": 0}


@pytest.fixture(scope="module", autouse=True)
def _fresh_cache(tmp_path_factory):
    """Inductor's code cache in a fresh folder for this module: every run compiles (an honest, repeatable
    cost; kernels that two tests share compile once)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path_factory.mktemp("inductor")))
        yield


@pytest.fixture(scope="module")
def small():
    with pytest.warns(RandomWeightsWarning):
        return build_backbone("tiny", image_size=SIZE, seed=0)


def _batch(seed=0):
    gen = torch.Generator().manual_seed(seed)
    masks = torch.zeros(B, SIZE, SIZE)
    masks[1, 8:20, 8:20] = 1.0
    return {"image": torch.randn(B, 3, SIZE, SIZE, generator=gen), "mask": masks, "has_mask": torch.ones(B),
            "label": torch.tensor([0.0, 1.0]), "pixel_domain": torch.ones(B)}


def _close_grads(loss_c, loss_e, module_c, module_e):
    ge = torch.autograd.grad(loss_e, list(module_e.parameters()), allow_unused=True)
    gc = torch.autograd.grad(loss_c, list(module_c.parameters()), allow_unused=True)
    assert sum(g is not None for g in ge) > 0
    for (name, _), a, b in zip(module_e.named_parameters(), ge, gc):
        assert (a is None) == (b is None), name
        if a is not None:
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4 * float(a.abs().max()) + 1e-7, msg=name)


@pytest.mark.parametrize("method", ["naive", "match", "match-exact"])
def test_head_step_through_inductor(small, method):
    """naive (no gate, no VACA: the step whose fused loss kernel failed in Triton on an H100), match
    (batched gate, VACA) and match-exact (the clean recipe's exact sequential gate, EMA: its decisions an
    opaque operator that inductor calls as an external kernel): the two compiled regions, one graph each,
    through inductor equal eager."""
    spec = small.spec
    cfg = config_from_recipe(recipes.get("clean"), data="", target="Brain", out="")
    assert cfg.gate_mode == "sequential" and cfg.update == "ema"
    cfg = {"naive": cfg._replace(method="naive", vaca=False), "match": cfg._replace(gate_mode="batched"),
           "match-exact": cfg}[method]
    torch.manual_seed(0)
    eager = make_head(cfg, spec.width, spec.embed_dim, text_embeddings(small, prompt_ensemble())).train()
    comp = copy.deepcopy(eager)
    batch = _batch()
    tokens = trunk_tokens(small, batch["image"])
    with torch._inductor.config.patch(INDUCTOR):
        step = compiled_step.compiled_loss(cfg, comp, small, spec.grid, backend="inductor", fullgraph=True)
        loss_c, parts_c = step(cfg, comp, tokens, batch)
    assert not step.regions.fell_back
    loss_e, parts_e, _ = compiled_step.post_trunk_loss(cfg, eager, small, tokens, batch, spec.grid)
    torch.testing.assert_close(loss_c, loss_e, rtol=1e-5, atol=1e-6)
    for k in parts_e:
        torch.testing.assert_close(parts_c[k], parts_e[k], rtol=1e-5, atol=1e-6, msg=k)
    _close_grads(loss_c, loss_e, comp, eager)
    for name, t in eager.state_dict().items():  # centroids and VACA statistics written back
        torch.testing.assert_close(comp.state_dict()[name], t, rtol=1e-5, atol=1e-5, msg=name)


def test_anomalyclip_step_through_inductor(small):
    """anomalyclip's trainer (frozen visual and text towers with DPAM, learned prompts; glocal loss):
    its forward and loss regions through inductor equal eager."""
    from adsim.methods import catalog

    cfg = config_from_recipe(recipes.get("anomalyclip"), data="", target="Brain", out="")
    trainer = catalog.trainer("anomalyclip")
    torch.manual_seed(0)
    module = trainer.build(cfg, small)
    batch = _batch()
    with torch._inductor.config.patch(INDUCTOR):
        forward, loss_fn, regions = compiled_step.compiled_trainer(cfg, trainer, module, small, backend="inductor",
                                                                   fullgraph=True)
        loss_c, _ = loss_fn(cfg, module, forward(batch["image"]), batch)
    assert not regions.fell_back
    loss_e, _ = trainer.loss(cfg, module, trainer.forward(module, small, batch["image"]), batch)
    torch.testing.assert_close(loss_c, loss_e, rtol=1e-5, atol=1e-6)
    _close_grads(loss_c, loss_e, module, module)
