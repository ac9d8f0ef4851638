"""The MVFA-layout BMAD loader and the toy data set."""
import shutil

import pytest
import torch

from adsim.data import bmad
from adsim.data.domains import SPLITS, canonical_domain


def test_toy_layout_loads(toy_root):
    s = bmad.list_split(toy_root, "Brain", "test")
    assert [x.label for x in s] == [0, 0, 1, 1]
    assert all(x.mask is not None for x in s if x.label == 1)  # Brain has masks
    chest = bmad.list_split(toy_root, "ChestXray", "valid")  # alias; AC-only domain: no masks
    assert {x.domain for x in chest} == {"Chest"} and all(x.mask is None for x in chest)
    item = bmad.ImageDataset(s, 64)[3]
    assert item["image"].shape == (3, 64, 64) and item["mask"].shape == (64, 64)
    assert item["label"] == 1 and item["has_mask"] == 1 and 0 < item["mask"].mean() < 0.5
    assert set(torch.unique(item["mask"]).tolist()) == {0.0, 1.0}
    # an anomalous image without a pixel mask: the patch labels are unknown
    assert bmad.ImageDataset(chest, 64)[3]["has_mask"] == 0


@pytest.mark.parametrize("name, expected", [("RESC", "Retina_RESC"), ("OCT17", "Retina_OCT2017"),
                                            ("HIS", "Histopathology"), ("Liver_AD", "Liver"),
                                            ("brainmri", "Brain")])
def test_aliases(name, expected):
    assert canonical_domain(name) == expected


def test_unknown_domain():
    with pytest.raises(ValueError, match="unknown domain"):
        canonical_domain("Knee")


def _copy(toy_root, tmp_path):
    dst = tmp_path / "bmad"
    shutil.copytree(toy_root, dst)
    return dst


def test_missing_folder(toy_root, tmp_path):
    root = _copy(toy_root, tmp_path)
    shutil.rmtree(root / "Liver_AD" / "valid" / "good")
    with pytest.raises(ValueError, match="missing folder .*good"):
        bmad.list_split(root, "Liver", "valid")
    with pytest.raises(ValueError, match="missing folder"):
        bmad.list_split(tmp_path / "nowhere", "Liver", "valid")


def test_empty_split(toy_root, tmp_path):
    root = _copy(toy_root, tmp_path)
    for cls in ("good", "Ungood"):
        for p in (root / "Chest_AD" / "test" / cls / "img").iterdir():
            p.unlink()
    with pytest.raises(ValueError, match="empty split"):
        bmad.list_split(root, "Chest", "test")


def test_missing_mask(toy_root, tmp_path):
    root = _copy(toy_root, tmp_path)
    mask = sorted((root / "Retina_RESC_AD" / "test" / "Ungood" / "anomaly_mask").iterdir())[0]
    mask.unlink()
    with pytest.raises(ValueError, match="has no mask"):
        bmad.list_split(root, "RESC", "test")


def test_one_class_split(toy_root):
    normal_only = [s for s in bmad.list_split(toy_root, "Brain", "test") if s.label == 0]
    with pytest.raises(ValueError, match="only normal"):
        bmad.require_both_classes(normal_only, "Brain test")


def test_holdout_is_stratified_and_deterministic(toy_root):
    samples = [s for d in ("Liver", "Chest") for sp in SPLITS for s in bmad.list_split(toy_root, d, sp)]
    train, held = bmad.holdout(samples, 0.5, seed=0)
    # 2 domains x 2 splits x 2 classes x 2 images = 16; each (domain, class) group of 4 gives 2 held out
    assert len(held) == 8 and len(train) == 8
    assert {(s.domain, s.label) for s in held} == {("Liver", 0), ("Liver", 1), ("Chest", 0), ("Chest", 1)}
    assert bmad.holdout(samples, 0.5, seed=0) == (train, held)
    with pytest.raises(ValueError, match="fraction"):
        bmad.holdout(samples, 1.0, seed=0)


def test_toy_data_is_marked_simulated(toy_root, tmp_path):
    """make-toy-bmad leaves a marker that eval and the table runner read; a folder without it is not
    called simulated."""
    assert bmad.simulated(toy_root) and "SIMULATED" in (toy_root / bmad.SIMULATED_MARKER).read_text()
    assert not bmad.simulated(tmp_path)
