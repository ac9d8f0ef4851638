"""Host synchronisations in a training step, counted on the CPU for every trained method and gate mode.

A host read of a device tensor (``.item()``, ``bool(t)``, ``float(t)``, ``torch.nonzero``, boolean-mask
indexing) stalls the host until a GPU has drained its queue; in a launch-bound step that costs the
overlap of host and GPU. Each such read reaches the dispatcher as one of :data:`SYNC_OPS` (or an
``index`` with a boolean mask), whatever the device, so a ``TorchDispatchMode`` counts them on the CPU.
Steps are ``adsim.training.train.train_epoch``'s (forward, loss, backward, clipping, optimiser step),
the batches already built (no data loading); reads of the optimiser's own step counters (CPU tensors
on every device: ``torch.optim.Adam`` keeps ``state["step"]`` on the host) are not syncs and not
counted. The count per step is the difference between epochs of 3 and 1 steps, halved (the epoch's
end reads its means and the deferred NaN/inf check once).

Expected counts (the documented host decisions; ``adsim.training.train._epoch_steps``):
0 for every method and gate, except the exact gate with slerp (1: ``adsim.model.matching.moved_steps``,
the steps slerp replays, read once for every gate set) and the authors' recipe (2: that read and the
``gate_filter="skip_step"`` decision whether the optimiser steps), and AdaCLIP (three per image: its
hybrid semantic fusion clusters each image's patch features with scikit-learn's KMeans on the host,
``one_hot`` validates the labels (two reads) and the clusters are selected by a boolean mask; the
device-to-host copy of the features is a fourth per image on a GPU, not visible here); with the recipe field
``kmeans="torch"`` (``adsim.methods.baselines.adaclip.kmeans_torch``: the same algorithm as tensor operations,
every image a fixed number of Lloyd iterations) AdaCLIP reads nothing back either.
A D2H copy (``.cpu()``) is no dispatcher op on CPU tensors: the GPU session runs steps under
``torch.cuda.set_sync_debug_mode("error")`` (``benchmarks/gpu_sync_check.py``) for those.
"""
import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from adsim.config import recipes
from adsim.config.run import config_from_recipe
from adsim.methods import catalog
from adsim.model.head import adapter_bottlenecks, features_from_bottlenecks, make_head, text_embeddings, trunk_tokens
from adsim.config.prompts import prompt_texts
from adsim.training.train import make_optimizer, train_epoch, trainer_step

pytestmark = pytest.mark.filterwarnings("ignore::adsim.model.backbone.RandomWeightsWarning")

SYNC_OPS = {"_local_scalar_dense", "item", "nonzero", "nonzero_static", "is_nonzero", "equal", "masked_select",
            "unique", "_unique2", "unique_consecutive", "unique_dim", "repeat_interleave"}
# one normal and one anomalous image (labels j % 2, a lesion mask on every other image): the counted reads
# are per step and per gate set, not per image, except AdaCLIP's (3 per image: expected 3 B), so every case
# counts the same at B = 2 as at B = 4 (checked), at half the cost of the exact gate's per-image replay
B = 2
# (recipe, overrides, syncs per step); every registered trainer has its recipe of the same name
CASES = [("mvfa", {}, 0),
         ("clean", {"gate_mode": "batched"}, 0),
         ("clean", {}, 0),                                   # exact gate, EMA (the default recipe)
         ("paper", {}, 0),
         ("clean", {"update": "slerp"}, 1),                   # exact gate, slerp: the replayed steps
         ("clean", {"gate_mode": "batched", "update": "slerp"}, 0),
         ("authors", {}, 2),                                  # slerp's read + the skip-step filter
         ("authors", {"gate_mode": "batched"}, 1),            # the skip-step filter
         ("anomalyclip", {}, 0), ("aprilgan", {}, 0), ("bilora", {}, 0), ("mao", {}, 0),
         ("adaclip", {}, 3 * B),
         ("adaclip", {"kmeans": "torch"}, 0)]                # HSF's KMeans on the device (kmeans_torch)


class SyncCounter(TorchDispatchMode):
    """Counts host reads (:data:`SYNC_OPS`, and indexing with a boolean mask), except of ``exclude``'s tensors."""

    def __init__(self, exclude=()):
        super().__init__()
        self.exclude, self.n, self.names = {id(t) for t in exclude}, 0, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        hit = name in SYNC_OPS or (name == "index" and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] if len(args) > 1 else ()) or ()))
        if hit and not any(id(a) in self.exclude for a in args if isinstance(a, torch.Tensor)):
            self.n += 1
            self.names.append(name)
        return func(*args, **(kwargs or {}))


def _batches(spec, n, seed=1):
    gen = torch.Generator().manual_seed(seed)
    s = spec.image_size
    out = []
    for i in range(n):
        masks = torch.zeros(B, s, s)
        masks[1::2, s // 4: s // 2 + 4 * i, s // 4: s // 2] = 1.0
        out.append({"image": torch.randn(B, 3, s, s, generator=gen), "mask": masks, "has_mask": torch.ones(B),
                    "label": torch.tensor([float(j % 2) for j in range(B)]), "pixel_domain": torch.ones(B),
                    "domain": torch.arange(B) % 2})
    return out


def _setup(tiny, recipe, over):
    cfg = config_from_recipe(recipes.get(recipe), data="", target="Brain", out="")._replace(**over)
    trainer = catalog.trainer(cfg.method)
    torch.manual_seed(0)
    if trainer is None:
        module = make_head(cfg, tiny.spec.width, tiny.spec.embed_dim,
                           text_embeddings(tiny, prompt_texts(cfg.prompts))).train()
        forward = lambda x: features_from_bottlenecks(  # noqa: E731 - train()'s one-process eager forward
            module, *adapter_bottlenecks(tiny, module, trunk_tokens(tiny, x)))
        loss_fn = None
    else:
        module = trainer.build(cfg, tiny)
        if trainer.schedule == "sequential":
            trainer.start_domain(cfg, module, 0)
        forward, loss_fn, _ = trainer_step(cfg, trainer, module, tiny, None)
    return cfg, module, forward, loss_fn


def _count(tiny, recipe, over, n_steps):
    cfg, module, forward, loss_fn = _setup(tiny, recipe, over)
    opt = make_optimizer(cfg, module)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    batches = _batches(tiny.spec, n_steps)
    train_epoch(cfg, module, opt, scaler, batches[:1], forward, tiny.spec.grid, torch.device("cpu"), None,
                loss_fn=loss_fn)  # warm-up: compiles the JAX scan, creates the optimiser state
    steps = [s["step"] for s in opt.state.values() if "step" in s]
    with SyncCounter(exclude=steps) as counter:
        train_epoch(cfg, module, opt, scaler, batches, forward, tiny.spec.grid, torch.device("cpu"), None,
                    loss_fn=loss_fn)
    return counter.n, counter.names


def _case_id(recipe, over, _expected=None) -> str:
    return f"{recipe}-{'-'.join(over.values()) or 'recipe'}"


# slow (3-30 s of CPU each under the counting mode): the exact gate with slerp replays every step, the
# authors' recipe adds the skip-step filter to it, the device KMeans runs 300 Lloyd iterations per image;
# and, for the quick tier's budget (~1 s each), cases whose gate and update another quick case counts
# (paper-recipe and authors-batched: clean's exact and batched gates; clean-batched-slerp), aprilgan and
# adaclip with scikit-learn's KMeans
SLOW_CASES = {"clean-slerp", "authors-recipe", "adaclip-torch", "paper-recipe", "authors-batched",
              "clean-batched-slerp", "aprilgan-recipe", "adaclip-recipe"}


@pytest.mark.parametrize("recipe,over,expected",
                         [pytest.param(*c, marks=pytest.mark.slow) if _case_id(*c) in SLOW_CASES else c for c in CASES],
                         ids=[_case_id(*c) for c in CASES])
def test_host_syncs_per_training_step(tiny, recipe, over, expected):
    n3, names3 = _count(tiny, recipe, over, 3)
    n1, names1 = _count(tiny, recipe, over, 1)
    assert (n3 - n1) % 2 == 0, (names1, names3)
    assert (n3 - n1) // 2 == expected, (names1, names3)


def test_every_trainer_is_counted():
    """A newly registered trainer needs its row in CASES."""
    from adsim.methods.registry import TRAINERS

    catalog.trainer("anomalyclip")  # loads the built-in methods
    assert set(TRAINERS) <= {r for r, _, _ in CASES}


def test_counter_sees_a_sync(tiny):
    """The counter is not blind: ``.item()``, ``bool()`` and boolean-mask indexing are counted."""
    x = torch.randn(5)
    with SyncCounter() as c:
        x.sum().item()
        bool(x[0] > 0)
        _ = x[x > 0]
        copy.deepcopy(x)  # no read
    assert c.n == 3
