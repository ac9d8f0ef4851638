"""Few-shot mode (adsim.methods.fewshot): the memory bank, its distances, the fusion, shot selection and exclusion."""
import json
import shutil

import numpy as np
import pytest
import torch
from scipy.spatial.distance import cdist

from adsim.cli.main import main
from adsim.config.prompts import prompt_ensemble
from adsim.data import bmad
from adsim.methods.fewshot import FewShot, exclude_shots, load_images, nn_distance, select_shots, support_shots
from adsim.methods.registry import HeadMethod, Method, Output
from adsim.model.head import Head, text_embeddings

pytestmark = pytest.mark.filterwarnings("ignore::adsim.model.backbone.RandomWeightsWarning")


@pytest.fixture(scope="module")
def method(tiny):
    torch.manual_seed(0)
    head = Head(tiny.spec.width, tiny.spec.embed_dim, text_embeddings(tiny, prompt_ensemble()))
    return HeadMethod(tiny, head, scoring="logit_max").eval()


@pytest.fixture(scope="module")
def images(toy_root, method):
    """Brain valid normals (2) as shots, Brain test images (4) to score."""
    shots = [s for s in bmad.list_split(toy_root, "Brain", "valid") if s.label == 0]
    return load_images(shots, method), load_images(bmad.list_split(toy_root, "Brain", "test"), method)


def test_bank_holds_the_wrapped_methods_patches(method, images):
    shots, _ = images
    fs = FewShot(method, shots, batch_size=1)  # bank built one image at a time
    with torch.no_grad():
        ref = method(shots).patches  # all at once
    assert fs.k == 2 and len(fs.bank) == len(ref) == 4
    for b, p in zip(fs.bank, ref):
        assert b.shape == (2 * method.grid ** 2, p.shape[-1])
        torch.testing.assert_close(b, p.reshape(-1, p.shape[-1]), atol=1e-6, rtol=1e-5)
    assert fs.info["bank_bytes"] == 2 * sum(p.shape[1] * p.shape[2] for p in ref) * 4  # k N E L float32


def test_a_shot_image_has_zero_few_shot_distance_everywhere(method, images):
    shots, test = images
    fs = FewShot(method, shots)
    with torch.no_grad():
        _, few = fs.parts(shots)
        _, few_test = fs.parts(test)
    assert few.shape == (2, method.image_size, method.image_size)
    assert float(few.abs().max()) < 1e-5  # 1 - cos(p, p) = 0 up to float32 rounding
    assert float(few_test.min()) > 1e-4  # images that are not in the bank are at a positive distance


def test_nn_distance_and_leave_one_out_match_scipy(method, images):
    shots, test = images
    fs = FewShot(method, shots)
    with torch.no_grad():
        pt = method(test).patches
    n = method.grid ** 2
    for p, b in zip(pt, fs.bank):  # independent reference: scipy's cosine distance, minimum over the bank
        ref = cdist(p.reshape(-1, p.shape[-1]).double().numpy(), b.double().numpy(), "cosine").min(1)
        np.testing.assert_allclose(nn_distance(p, b).reshape(-1).numpy(), ref, atol=1e-5)
    # leave-one-out statistics: shot i against the other shot only (k = 2), layer mean, upsampled
    loo = []
    for i in range(2):
        other = slice((1 - i) * n, (2 - i) * n)
        d = np.mean([cdist(b[i * n:(i + 1) * n].double().numpy(), b[other].double().numpy(), "cosine").min(1)
                     for b in fs.bank], axis=0)
        up = torch.nn.functional.interpolate(torch.tensor(d).reshape(1, 1, method.grid, method.grid),
                                             size=method.image_size, mode="bilinear", align_corners=False)
        loo.append(up.numpy().ravel())
    loo = np.concatenate(loo)
    assert fs.info["mu_f"] == pytest.approx(loo.mean(), abs=1e-5)
    assert fs.info["sd_f"] == pytest.approx(loo.std(ddof=1), rel=1e-4)


def test_fusion_formula(method, images):
    shots, test = images
    fs = FewShot(method, shots)
    with torch.no_grad():
        zero, few = fs.parts(test)
        fused = fs(test)
        zmaps = method(shots).maps
    w = float(zmaps.std()) / fs.info["sd_f"]  # the documented weight sd_0 / sd_f
    assert fs.weight == pytest.approx(w, rel=1e-5)
    torch.testing.assert_close(fused.maps, zero.maps + w * (few - fs.info["mu_f"]), atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(fused.scores, zero.scores + w * (few.flatten(1).amax(1) - fs.info["mu_f"]),
                               atol=1e-4, rtol=1e-5)
    assert all(torch.equal(a, b) for a, b in zip(fused.patches, zero.patches))


class _Pixels(Method):
    """Stub: patches are unit-normalised 8x8 pixel patches; the zero-shot score is CONSTANT (carries no
    information) and the map is tiny seeded noise, so any ranking must come from the few-shot bank."""
    name, image_size, grid, clip_norm = "pixels", 64, 8, False

    def __init__(self):
        super().__init__()
        self.register_buffer("noise", 1e-3 * torch.randn(64, 64, generator=torch.Generator().manual_seed(0)))

    def forward(self, x):
        p = x.unfold(2, 8, 8).unfold(3, 8, 8).permute(0, 2, 3, 1, 4, 5).reshape(x.shape[0], 64, -1) + 0.1
        return Output(torch.zeros(x.shape[0]), self.noise.expand(x.shape[0], 64, 64),
                      (torch.nn.functional.normalize(p, dim=-1),))


def test_fused_score_ranks_by_the_few_shot_evidence(toy_root):
    m = _Pixels()
    normals = [s for s in bmad.list_split(toy_root, "Liver", "valid") if s.label == 0]
    test = bmad.list_split(toy_root, "Liver", "test")
    fs = FewShot(m, load_images(normals, m))
    x = load_images(test, m)
    with torch.no_grad():
        out = fs(x)
        _, few = fs.parts(x)
    peak = few.flatten(1).amax(1)
    assert torch.isfinite(out.scores).all() and len(set(out.scores.tolist())) == len(test)  # no ties
    # zero-shot part constant: the fused score orders the images exactly as the few-shot peak does
    assert torch.equal(torch.argsort(out.scores), torch.argsort(peak))


def test_select_shots_validates_k_and_is_seeded(toy_root):
    normals = [s for s in bmad.list_split(toy_root, "Chest", "valid") if s.label == 0]
    for bad in (0, 3, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match=r"--shots must be an integer in \[1, 2\]"):
            select_shots(normals, bad)
    assert select_shots(normals, 2, seed=0) == sorted(normals, key=lambda s: str(s.image))
    picks = {select_shots(normals, 1, seed=s)[0].image.name for s in range(20)}
    assert picks == {s.image.name for s in normals}  # the seed chooses; both images are reachable
    assert select_shots(normals, 1, seed=3) == select_shots(list(reversed(normals)), 1, seed=3)  # order-free
    with pytest.raises(ValueError, match="shot split must be one of"):
        support_shots(toy_root, "Chest", 1, split="train")


def test_shots_are_never_scored(toy_root, tmp_path):
    root = tmp_path / "bmad"
    shutil.copytree(toy_root / "Brain_AD", root / "Brain_AD")
    test = bmad.list_split(root, "Brain", "test")
    shots = support_shots(root, "Brain", 2, seed=0, split="test")  # shots drawn from the scored split
    kept = exclude_shots(test, shots)
    assert len(kept) == len(test) - 2 and not {s.image for s in shots} & {s.image for s in kept}
    # a byte-identical copy of a shot under another name is not scored either
    anomalous = next(s for s in test if s.label == 1)
    shutil.copy(shots[0].image, anomalous.image)
    assert anomalous.image not in {s.image for s in exclude_shots(test, shots)}
    # valid-split shots (the default, as MVFA-AD) leave the test list whole
    assert exclude_shots(bmad.list_split(toy_root, "Brain", "test"), support_shots(toy_root, "Brain", 2)) \
        == bmad.list_split(toy_root, "Brain", "test")


def test_bank_too_large_and_degenerate_shots(method, images):
    shots, _ = images
    with pytest.raises(ValueError, match=r"--shots 2: the memory bank needs .* GiB \(k\*N\*E\*L"):
        FewShot(method, shots, max_bytes=1000)
    with pytest.raises(ValueError, match="identical shots"):
        FewShot(method, shots[:1].repeat(2, 1, 1, 1))
    with pytest.raises(ValueError, match="no patch features"):
        class NoPatches(_Pixels):
            def forward(self, x):
                return super().forward(x)._replace(patches=())
        FewShot(NoPatches(), torch.zeros(2, 3, 64, 64))


def test_one_shot_uses_within_image_statistics(method, images):
    shots, _ = images
    fs = FewShot(method, shots[:1])
    assert fs.k == 1 and "k=1" in fs.info["normal_stats"] and fs.info["sd_f"] > 0


@pytest.mark.slow
def test_eval_cli_few_shot_records_the_shots_and_never_scores_them(toy_root, tmp_path, capsys):
    root = tmp_path / "bmad"
    shutil.copytree(toy_root, root)
    shots = support_shots(root, "Brain", 2, seed=3)
    # a byte-identical copy of a shot inside the test split: must not be scored
    normal_test = next(s for s in bmad.list_split(root, "Brain", "test") if s.label == 0)
    shutil.copy(shots[1].image, normal_test.image)
    run = tmp_path / "run"
    tiny = ["--backbone", "tiny", "--batch-size", "8", "--no-progress"]
    assert main(["train", "--data", str(root), "--target", "Brain", "--out", str(run), "--epochs", "1", *tiny]) == 0
    assert main(["eval", "--run", str(run), "--data", str(root), "--shots", "2", "--shot-seed", "3",
                 "--no-progress"]) == 0
    m = json.loads((run / "metrics.json").read_text())
    assert (m["shots"], m["shot_seed"], m["shot_split"]) == (2, 3, "valid")
    assert m["shot_files"] == [s.image.name for s in shots]
    assert m["n_images"] == 3  # 4 test images minus the copy of a shot
    assert m["fusion"]["weight"] > 0 and 0 <= m["image_auc"] <= 100 and 0 <= m["pixel_auc"] <= 100
    capsys.readouterr()
    assert main(["eval", "--run", str(run), "--data", str(root), "--shots", "3", "--no-progress"]) == 2
    assert "--shots must be an integer in [1, 2]" in capsys.readouterr().err
    # predict: the shots drawn from --normals are not scored even when the images to score include them
    good = root / "Brain_AD" / "valid" / "good" / "img"
    bad = root / "Brain_AD" / "test" / "Ungood" / "img"
    out = tmp_path / "pred"
    assert main(["predict", str(good), str(bad), "--run", str(run), "--out", str(out), "--shots", "2",
                 "--normals", str(good), "--no-overlays", "--no-progress"]) == 0
    scored = (out / "scores.csv").read_text().splitlines()[1:]
    assert sorted(line.split(",")[0] for line in scored) == sorted(str(p) for p in bad.iterdir())
    assert json.loads((out / "shots.json").read_text())["shot_files"] == sorted(p.name for p in good.iterdir())
    assert main(["predict", str(bad), "--run", str(run), "--out", str(out), "--shots", "2"]) == 2
    assert "--shots K and --normals IMAGES go together" in capsys.readouterr().err


def test_detector_with_shots_from_a_folder(method, toy_root):
    from adsim.inference.detector import Detector
    det = Detector(method, device="cpu")
    normals = toy_root / "Liver_AD" / "valid" / "good" / "img"
    few = det.with_shots(normals, 2, seed=0)
    assert det.method is method and few.method.method is method  # the zero-shot detector is unchanged
    assert few.info["shots"] == 2 and few.info["shot_files"] == sorted(p.name for p in normals.iterdir())
    pred = few.predict(toy_root / "Liver_AD" / "test" / "Ungood" / "img")
    assert pred.scores.shape == (2,) and pred.maps.shape == (2, 64, 64)
    x = load_images(sorted((toy_root / "Liver_AD" / "test" / "Ungood" / "img").iterdir()), method)
    with torch.no_grad():
        ref = FewShot(method, load_images(sorted(normals.iterdir()), method))(x)
    np.testing.assert_allclose(pred.scores, ref.scores.numpy(), rtol=1e-5, atol=1e-4)  # same as FewShot itself
    with pytest.raises(ValueError, match=r"--shots must be an integer in \[1, 2\]"):
        det.with_shots(normals, 5)


def test_distances_stay_float32_under_autocast_and_chunking(method, images, monkeypatch):
    shots, test = images
    fs = FewShot(method, shots)
    with torch.no_grad():
        _, ref = fs.parts(test)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, cast = fs.parts(test)
        monkeypatch.setattr("adsim.methods.fewshot._CHUNK_BYTES", 1)  # one image per chunk
        _, chunked = fs.parts(test)
    assert cast.dtype == torch.float32
    # the method's own features may move under bf16 autocast, the distance arithmetic may not: compare with
    # the patches of the same (autocast) forward
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        pt = method(test).patches
    with torch.no_grad():  # outside autocast: float32 reference
        d = torch.stack([nn_distance(p.float(), b) for p, b in zip(pt, fs.bank)])
        up = torch.nn.functional.interpolate(d.mean(0).reshape(-1, 1, method.grid, method.grid),
                                             size=method.image_size, mode="bilinear")[:, 0]
    torch.testing.assert_close(cast, up, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(chunked, ref, atol=0, rtol=0)
