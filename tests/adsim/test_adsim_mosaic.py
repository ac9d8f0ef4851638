"""The 2 x 2 mosaic augmentation (adsim.data.mosaic, recipe field aug_rate) of APRIL-GAN's and AdaCLIP's training
data (VAND-APRIL-GAN dataset.py, AdaCLIP dataset/base_dataset.py combine_img): four images of the item's group
in the four quadrants, resized; the masks mosaicked the same way; applied with probability aug_rate from a
seeded generator per (seed, phase, epoch, item); and the train loop drawing a new epoch's mosaics."""
import importlib
import math

import pytest
import torch

from adsim.config import recipes
from adsim.config.run import config_from_recipe
from adsim.data import mosaic

train_module = importlib.import_module("adsim.training.train")  # the module (the package exports its train())

pytestmark = pytest.mark.filterwarnings("ignore::adsim.model.backbone.RandomWeightsWarning")
F = torch.nn.functional
S = 64


class Flat(torch.utils.data.Dataset):
    """Item ``i``: a flat image of value ``i / 100`` in every channel, a mask with the left half lesion for odd
    ``i`` (none for even), ``label = i % 2``, ``has_mask = 0`` for ``i`` divisible by 5 (an anomaly without mask)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        mask = torch.zeros(S, S)
        if i % 2:
            mask[:, : S // 2] = 1.0
        return {"image": torch.full((3, S, S), i / 100.0), "mask": mask, "label": torch.tensor(float(i % 2)),
                "has_mask": torch.tensor(0.0 if i % 5 == 0 else 1.0), "index": torch.tensor(i)}


def test_quadrants_are_the_four_sources_resized_and_the_masks_follow():
    groups = ["a"] * 6 + ["b"] * 6
    data = mosaic.Mosaic(Flat(12), groups, 1.0, seed=3)
    for i in (1, 7):
        picks = data.sources(i)
        assert len(set(picks)) == 4 and all(groups[j] == groups[i] for j in picks)  # 4 distinct, same group
        item = data[i]
        h = S // 2
        for q, (top, left) in enumerate([(0, 0), (0, h), (h, 0), (h, h)]):
            src = picks[q]
            # a flat source stays flat when resized: the quadrant holds exactly its value
            torch.testing.assert_close(item["image"][:, top:top + h, left:left + h], torch.full((3, h, h), src / 100.0))
            # its mask, halved: the left half of the quadrant is lesion for an odd source, nothing for an even one
            want = torch.zeros(h, h)
            if src % 2:
                want[:, : h // 2] = 1.0
            assert torch.equal(item["mask"][top:top + h, left:left + h], want)
        # kept from the replaced item, as their data sets keep it: label and index; has_mask only if all four have one
        assert float(item["label"]) == i % 2 and int(item["index"]) == i
        assert float(item["has_mask"]) == float(all(j % 5 for j in picks))


def test_a_structured_source_is_resized_into_its_quadrant():
    gen = torch.Generator().manual_seed(0)
    images = [torch.rand(3, S, S, generator=gen) for _ in range(4)]
    masks = [(torch.rand(S, S, generator=gen) > 0.7).float() for _ in range(4)]
    image, mask = mosaic.compose(images, masks)
    h = S // 2
    for q, (top, left) in enumerate([(0, 0), (0, h), (h, 0), (h, h)]):
        # antialiased bilinear (torch's interpolate, the resize the module documents)
        want = F.interpolate(images[q][None], size=(h, h), mode="bilinear", antialias=True, align_corners=False)[0]
        torch.testing.assert_close(image[:, top:top + h, left:left + h], want)
        # the mask through the same resize, binarised at 0.5
        want_mask = F.interpolate(masks[q][None, None], size=(h, h), mode="bilinear", antialias=True,
                                  align_corners=False)[0, 0] > 0.5
        assert torch.equal(mask[top:top + h, left:left + h], want_mask.float())
    # an odd size: the second row and column take the extra pixel
    assert mosaic.quadrants(7) == [(0, 0, 3, 3), (0, 3, 3, 4), (3, 0, 4, 3), (3, 3, 4, 4)]
    with pytest.raises(ValueError, match="a mosaic takes 4 images"):
        mosaic.compose(images[:3], masks[:3])


def test_the_rate_is_a_seeded_probability():
    n, rate = 4000, 0.2
    data = mosaic.Mosaic(Flat(n), ["g"] * n, rate, seed=0)
    hits = sum(data.sources(i) is not None for i in range(n))
    se = math.sqrt(rate * (1 - rate) / n)  # binomial standard error of the fraction
    assert abs(hits / n - rate) < 4 * se, hits / n
    # the same (seed, phase, epoch, item) draws the same, in any order; another epoch or seed draws anew
    first = [data.sources(i) for i in range(200)]
    assert [data.sources(i) for i in reversed(range(200))] == first[::-1]
    data.set_epoch(1)
    assert [data.sources(i) for i in range(200)] != first
    data.set_epoch(0)
    assert [data.sources(i) for i in range(200)] == first
    assert [mosaic.Mosaic(Flat(n), ["g"] * n, rate, seed=1).sources(i) for i in range(200)] != first
    data.set_epoch(0, phase=2)
    assert [data.sources(i) for i in range(200)] != first
    # rate 0: never; rate 1: always, except in a group of fewer than four items
    assert all(mosaic.Mosaic(Flat(20), ["g"] * 20, 0.0).sources(i) is None for i in range(20))
    always = mosaic.Mosaic(Flat(7), ["g"] * 4 + ["h"] * 3, 1.0)
    assert [always.sources(i) is not None for i in range(7)] == [True] * 4 + [False] * 3
    assert torch.equal(always[5]["image"], Flat(7)[5]["image"])


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="rate must be a number in"):
        mosaic.Mosaic(Flat(4), ["g"] * 4, 1.5)
    with pytest.raises(ValueError, match="groups must name one group per item"):
        mosaic.Mosaic(Flat(4), ["g"] * 3, 0.2)
    with pytest.raises(ValueError, match="epoch must be an integer >= 0"):
        mosaic.Mosaic(Flat(4), ["g"] * 4, 0.2).set_epoch(-1)
    with pytest.raises(ValueError, match="recipe field aug_rate must be a number in"):
        recipes.override(recipes.get("aprilgan"), aug_rate=-0.1)


def test_the_reference_recipes_turn_it_on():
    assert recipes.get("aprilgan").aug_rate == 0.2 and recipes.get("adaclip").aug_rate == 0.2
    assert all(recipes.get(n).aug_rate == 0.0 for n in recipes.names() if n not in ("aprilgan", "adaclip"))


@pytest.mark.slow
def test_the_train_loop_draws_each_epochs_mosaics(toy_root, tmp_path, monkeypatch):
    seen = []

    class Spy(mosaic.Mosaic):
        def set_epoch(self, epoch, phase=0):
            super().set_epoch(epoch, phase)
            seen.append(("epoch", epoch, phase))

        def __getitem__(self, i):
            item = super().__getitem__(i)
            seen.append(("item", self.epoch, self.sources(i) is not None))
            return item

    monkeypatch.setattr(train_module, "Mosaic", Spy)
    recipe = recipes.override(recipes.get("aprilgan"), epochs=2, batch_size=4, aug_rate=0.5)
    cfg = config_from_recipe(recipe, data=str(toy_root), target="Brain", out=str(tmp_path / "run"), backbone="tiny",
                             device="cpu", train_domains=("Liver", "Retina_RESC"))
    train_module.train(cfg, progress=False, compile_mode=None)
    assert [s for s in seen if s[0] == "epoch"] == [("epoch", 0, 0), ("epoch", 1, 0)]
    items = [s for s in seen if s[0] == "item"]
    assert len(items) == 2 * 16 and {s[1] for s in items} == {0, 1}  # 8 toy images per domain, every epoch
    assert any(s[2] for s in items) and not all(s[2] for s in items)  # some items mosaicked, some not
    with pytest.raises(ValueError, match="--trunk-cache .* mosaic"):
        train_module.train(cfg._replace(out=str(tmp_path / "cached"), method="naive", dice_unit="image"),
                           trunk_cache=True, progress=False, compile_mode=None)
