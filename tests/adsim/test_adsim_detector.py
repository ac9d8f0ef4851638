"""adsim.inference.detector (the one inference path), the ``predict`` CLI and ``eval --overlays``, on the tiny backbone
(random weights) and the SIMULATED toy data.

References: the trained head's scores are recomputed without the detector, from the checkpoint's state
dict loaded into a fresh head and the model code's own ``features`` / ``image_scores`` / ``anomaly_maps``
(the path evaluation took before the detector existed); input equivalence compares the detector with
itself on the same pixels; the zero-shot path is checked against a method whose output is a closed form
of the preprocessed pixels."""
import csv
import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image
from sklearn.metrics import roc_auc_score

from adsim.cli.main import main
from adsim.config.run import TrainConfig
from adsim.data import bmad
from adsim.inference.detector import Detector, Prediction, UnreadableImageWarning
from adsim.inference.overlays import CONTOUR_RGB, overlay, overlay_names
from adsim.methods import registry
from adsim.metrics.functional import smooth
from adsim.model.head import anomaly_maps, features, image_scores, make_head, text_embeddings

pytestmark = pytest.mark.filterwarnings("ignore::adsim.model.backbone.RandomWeightsWarning")


@pytest.fixture(scope="module")
def run(toy_root, tmp_path_factory):
    """One epoch on Liver (8 images), target Brain (4 test images with masks)."""
    out = tmp_path_factory.mktemp("det") / "run"
    assert main(["train", "--data", str(toy_root), "--target", "Brain", "--train-domains", "Liver", "--epochs", "1",
                 "--backbone", "tiny", "--batch-size", "8", "--no-progress", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def det(run):
    return Detector.from_run(run, device="cpu")


@pytest.fixture
def test_paths(toy_root):
    return [s.image for s in bmad.list_split(toy_root, "Brain", "test")]


def _reference(run, backbone, paths):
    """Scores and maps without adsim.inference.detector: a fresh head + the checkpoint + the model code."""
    record = json.loads((run / "config.json").read_text())
    cfg = TrainConfig(**record["config"])
    head = make_head(cfg, backbone.spec.width, backbone.spec.embed_dim, text_embeddings(backbone, record["prompts"]))
    head.load_state_dict(torch.load(run / "checkpoint_last.pt", weights_only=False)["head"])
    head.eval()
    x = torch.stack([bmad.ImageDataset([bmad.Sample(p, 0, None, "")], 64)[0]["image"] for p in paths])
    with torch.no_grad():
        f = features(backbone, head, x)
        return image_scores(f, cfg.scoring).numpy(), anomaly_maps(f, 8, 64, cfg.scoring).numpy()


def test_predict_equals_the_model_code_and_evaluate(run, det, tiny, toy_root, test_paths):
    pred = det.predict(test_paths, batch_size=3)  # batches of 3 and 1
    ref_scores, ref_maps = _reference(run, tiny, test_paths)
    # float32, the same operations in batches of another size: agreement to float32 rounding
    np.testing.assert_allclose(pred.scores, ref_scores, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(pred.maps, ref_maps, rtol=1e-5, atol=1e-5)
    assert main(["eval", "--run", str(run), "--data", str(toy_root), "--no-progress"]) == 0
    metrics = json.loads((run / "metrics.json").read_text())
    samples = bmad.list_split(toy_root, "Brain", "test")
    labels = [s.label for s in samples]
    masks = np.stack([bmad.ImageDataset(samples, 64)[i]["mask"].numpy() > 0.5 for i in range(len(samples))])
    assert metrics["image_auc"] == pytest.approx(100 * roc_auc_score(labels, ref_scores), abs=1e-9)
    # pixel AUC is binned (adsim.metrics): within the error bound it records of sklearn's exact value
    assert metrics["pixel_auc"] == pytest.approx(
        100 * roc_auc_score(masks.ravel(), smooth(ref_maps, 4.0).ravel()),
        abs=metrics["pixel_error_bounds"]["pixel_auc"] + 1e-6)


def test_folder_paths_pil_and_tensor_give_identical_results(det, toy_root, tmp_path):
    src = sorted((toy_root / "Brain_AD" / "test" / "Ungood" / "img").iterdir())
    folder = tmp_path / "imgs"
    folder.mkdir()
    for p in src:
        shutil.copy(p, folder / p.name)
    by_folder = det.predict(folder, batch_size=2)
    by_paths = det.predict([folder / p.name for p in src], batch_size=2)
    pil = [Image.open(p).convert("RGB") for p in src]
    by_pil = det.predict(pil, batch_size=2)
    tensor = torch.stack([torch.from_numpy(np.asarray(im, dtype=np.float32) / 255).permute(2, 0, 1) for im in pil])
    by_tensor = det.predict(tensor, batch_size=2)
    assert by_folder.paths == [str(folder / p.name) for p in src]
    assert by_pil.paths == ["<PIL image 0>", "<PIL image 1>"] and by_tensor.paths[1] == "<tensor image 1>"
    for other in (by_paths, by_pil, by_tensor):
        np.testing.assert_array_equal(other.scores, by_folder.scores)
        np.testing.assert_array_equal(other.maps, by_folder.maps)


def test_output_shapes_and_mismatched_sizes(det, toy_root, tmp_path):
    a = toy_root / "Brain_AD" / "test" / "good" / "img"
    big = tmp_path / "big.png"
    with Image.open(next(a.iterdir())) as im:
        im.convert("L").resize((100, 80)).save(big)  # another size and mode: resized as in training
    pred = det.predict([a, big], batch_size=16)
    assert isinstance(pred, Prediction) and len(pred.paths) == 3 and pred.paths[-1] == str(big)
    assert pred.scores.shape == (3,) and pred.scores.dtype == np.float32
    assert pred.maps.shape == (3, 64, 64) and pred.maps.dtype == np.float32
    assert np.isfinite(pred.maps).all()
    alone = det.predict(big, maps=False)
    assert alone.maps is None and alone.scores == pytest.approx(pred.scores[-1], rel=1e-5, abs=1e-5)


def test_unreadable_files_are_skipped_with_one_warning_each_or_raise_when_strict(det, toy_root, tmp_path):
    folder = tmp_path / "mixed"
    folder.mkdir()
    shutil.copy(next((toy_root / "Brain_AD" / "test" / "good" / "img").iterdir()), folder / "a.png")
    (folder / "notes.txt").write_text("not an image")
    (folder / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40)  # a PNG signature, then garbage
    with pytest.warns(UnreadableImageWarning) as rec:
        pred = det.predict(folder)
    assert pred.paths == [str(folder / "a.png")]
    msgs = sorted(str(w.message) for w in rec)
    assert len(msgs) == 2 and str(folder / "broken.png") in msgs[0] and str(folder / "notes.txt") in msgs[1]
    assert all("\n" not in m for m in msgs)
    with pytest.raises(ValueError, match="broken.png"):
        det.predict(folder, strict=True)


@pytest.mark.parametrize("bad, match", [
    (lambda: torch.rand(2, 3, 8, 8) * 2, r"\[0, 1\]"),
    (lambda: torch.rand(2, 4, 8, 8), "float"),
    (lambda: "/no/such/folder", "no such file"),
    (lambda: 3, "images must be"),
])
def test_bad_images_argument(det, bad, match):
    with pytest.raises((ValueError, TypeError), match=match):
        det.predict(bad())


def test_bad_batch_size(det, test_paths):
    with pytest.raises(ValueError, match="batch_size"):
        det.predict(test_paths, batch_size=0)


def _altered(run, tmp_path, edit, part="config"):
    dst = tmp_path / "altered"
    shutil.copytree(run, dst)
    record = json.loads((dst / "config.json").read_text())
    edit(record[part] if part else record)
    (dst / "config.json").write_text(json.dumps(record))
    return dst


@pytest.mark.parametrize("edit, match", [
    (lambda c: c.update(new_knob=3), r"unknown to this adsim version: \['new_knob'\]"),
    (lambda c: c.pop("gate_unit"), r"missing: \['gate_unit'\]"),
    (lambda c: c.update(metric="manhattan"), "metric"),
    (lambda c: c.update(vaca=False), r"does not fit the 'match' head.*unexpected \['vaca\."),
    (lambda c: c.update(method="naive"), r"does not fit the 'naive' head.*unexpected \['centroids\."),
])
def test_run_folder_of_another_version_names_what_differs(run, tmp_path, edit, match):
    with pytest.raises(ValueError, match=match):
        Detector.from_run(_altered(run, tmp_path, edit), device="cpu")


@pytest.mark.parametrize("part, edit, match", [
    ("backbone_spec", lambda b: b.update(grid=9), r"builds tiny differently \(grid: run 9, now 8\)"),
    (None, lambda r: r.pop("prompts"), "lacks 'prompts'"),
    (None, lambda r: r.update(config=[]), "no 'config' object"),
])
def test_run_record_of_another_version_names_what_differs(run, tmp_path, part, edit, match):
    with pytest.raises(ValueError, match=match):
        Detector.from_run(_altered(run, tmp_path, edit, part), device="cpu")


class _Brightness(registry.Method):
    """Toy zero-shot method with a closed form: score = mean pixel value, map = per-pixel channel mean."""
    name, clip_norm = "brightness", False

    def __init__(self, backbone, gain=1.0):
        super().__init__()
        self.image_size, self.grid, self.gain = backbone.spec.image_size, backbone.spec.grid, gain

    def forward(self, x):
        m = self.gain * x.mean(1)
        return registry.Output(m.mean((1, 2)), m)


def test_zero_shot_builds_registered_methods_only(monkeypatch, toy_root, tmp_path, capsys):
    with pytest.raises(ValueError, match=r"unknown zero-shot method 'nope'; must be one of \("):
        Detector.zero_shot("nope", backbone="tiny")
    monkeypatch.setitem(registry.ZERO_SHOT, "brightness", _Brightness)
    det = Detector.zero_shot("brightness", backbone="tiny", device="cpu", gain=2.0)
    paths = sorted((toy_root / "Liver_AD" / "valid" / "Ungood" / "img").iterdir())
    pred = det.predict(paths)
    for p, s, m in zip(paths, pred.scores, pred.maps):
        with Image.open(p) as im:  # the training preprocessing without CLIP normalisation, by hand
            rgb = np.asarray(im.convert("RGB").resize((64, 64), Image.BICUBIC), dtype=np.float32) / 255
        np.testing.assert_allclose(m, 2.0 * rgb.mean(2), rtol=1e-6, atol=1e-6)
        assert s == pytest.approx(2.0 * rgb.mean(), rel=1e-5)
    # the CLI's --zero-shot path (default options: gain 1)
    cli = ["predict", "--backbone", "tiny", "--device", "cpu", "--no-progress", "--no-overlays", *map(str, paths)]
    assert main([*cli, "--zero-shot", "brightness", "--out", str(tmp_path / "zs")]) == 0
    rows = list(csv.DictReader((tmp_path / "zs" / "scores.csv").read_text().splitlines()))
    np.testing.assert_allclose([2.0 * float(r["score"]) for r in rows], pred.scores, rtol=1e-6)
    assert not (tmp_path / "zs" / "overlays").exists()
    capsys.readouterr()
    assert main([*cli, "--zero-shot", "nope", "--out", str(tmp_path / "zs2")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()  # one line, listing what is registered
    assert line.startswith("error: unknown zero-shot method 'nope'; must be one of (") and "'brightness'" in line


def test_cli_predict_writes_scores_and_one_overlay_per_image(run, det, toy_root, tmp_path, capsys):
    folder = tmp_path / "in"
    shutil.copytree(toy_root / "Brain_AD" / "test" / "Ungood" / "img", folder)
    (folder / "junk.jpg").write_text("no")
    out = tmp_path / "out"
    assert main(["predict", "--run", str(run), str(folder), str(toy_root / "Chest_AD" / "test" / "good" / "img"),
                 "--out", str(out), "--no-progress"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert [e for e in err if e.startswith("warning: skipped")] == [
        f"warning: skipped {folder / 'junk.jpg'}: not a readable image "
        f"(UnidentifiedImageError: cannot identify image file '{folder / 'junk.jpg'}')"]
    rows = list(csv.DictReader((out / "scores.csv").read_text().splitlines()))
    images = sorted(folder.glob("*.png")) + sorted((toy_root / "Chest_AD" / "test" / "good" / "img").iterdir())
    assert [r["path"] for r in rows] == [str(p) for p in images]
    np.testing.assert_allclose([float(r["score"]) for r in rows], det.predict(images).scores, rtol=1e-5, atol=1e-5)
    pngs = sorted(p.name for p in (out / "overlays").iterdir())
    assert pngs == sorted(overlay_names([str(p) for p in images]))
    assert (out / "scores.csv").stat().st_mode & 0o777 == (out / "overlays" / pngs[0]).stat().st_mode & 0o777
    # --strict: the unreadable file is an error; an unwritable --out fails before any work
    assert main(["predict", "--run", str(run), str(folder), "--out", str(tmp_path / "o2"), "--strict",
                 "--no-progress"]) == 2
    assert "junk.jpg" in capsys.readouterr().err
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["predict", "--run", str(run), str(folder), "--out", str(blocker / "sub")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: --out {blocker / 'sub'} is not writable ({blocker} is a file, not a folder)"]


def test_eval_overlays_writes_the_n_most_and_least_anomalous(run, toy_root, det):
    assert main(["eval", "--run", str(run), "--data", str(toy_root), "--no-progress", "--overlays", "1"]) == 0
    samples = bmad.list_split(toy_root, "Brain", "test")
    scores = det.predict([s.image for s in samples]).scores
    top, low = samples[int(np.argmax(scores))].image.stem, samples[int(np.argmin(scores))].image.stem
    assert sorted(p.name for p in (run / "overlays").iterdir()) == sorted([f"most_01_{top}.png",
                                                                          f"least_01_{low}.png"])


def test_overlay_blend_and_contour():
    """Per-image min-max normalisation: the map's maximum gets the colormap's top colour, its minimum the
    bottom colour, blended with weight alpha; the mask's boundary pixels (not its interior) are green."""
    from matplotlib import colormaps
    img = np.full((6, 6, 3), 0.5, np.float32)
    amap = np.arange(36, dtype=np.float32).reshape(6, 6) * 3.0 - 7.0
    mask = np.zeros((6, 6), bool)
    mask[1:5, 1:5] = True
    out = overlay(img, amap, mask, cmap="jet", alpha=0.4)
    jet = colormaps["jet"]
    for (r, c), v in (((0, 0), 0.0), ((5, 5), 1.0)):
        expect = 255 * (0.6 * 0.5 + 0.4 * np.asarray(jet(v)[:3]))
        # 8-bit output: within 1 level (float32 blend vs this float64 one, rounded at exactly .5 here)
        np.testing.assert_allclose(out[r, c], expect, atol=1.0)
    ring = mask.copy()
    ring[2:4, 2:4] = False
    assert (out[ring] == CONTOUR_RGB).all() and not (out[2:4, 2:4] == CONTOUR_RGB).all(axis=-1).any()
    assert overlay_names(["a/x.png", "b/x.png", "<PIL image 2>", "c/y.jpg"]) == [
        "00000_x.png", "00001_x.png", "00002_image.png", "y.png"]
    with pytest.raises(ValueError, match="amap"):
        overlay(img, np.full((6, 6), np.nan))
