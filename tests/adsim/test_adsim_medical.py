"""Scans as they come (``adsim.data.medical``, ``predict``'s scores.csv and report.html) on real medical
images that ship inside packages: pydicom's test files, nibabel's test volumes, scikit-image's retina
pictures. Nothing is downloaded (files are opened by path in the installed packages).

References: DICOM windowing is pydicom's own ``apply_modality_lut`` + ``apply_voi_lut``, scaled by the
output range DICOM PS3.3 C.11.2.1.2 gives a linear window (y_min, y_max from Bits Stored, Pixel
Representation, Rescale Slope/Intercept); the percentile window is ``numpy.percentile`` of those
values; NIfTI slices are nibabel's array ``np.asarray(img.dataobj)`` cut with ``np.take`` and shown as
``imshow(slice.T, origin="lower")`` does; 16-bit pictures are ``value / 65535``; a volume's score is
the maximum (or the top-k mean) of its slice scores, recomputed from the CSV's own slice rows."""
import csv
import gzip
import html.parser
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

pydicom = pytest.importorskip("pydicom")
nibabel = pytest.importorskip("nibabel")
from pydicom.pixels import apply_modality_lut, apply_voi_lut  # noqa: E402

from adsim.cli.main import main  # noqa: E402
from adsim.data import bmad, medical  # noqa: E402
from adsim.data.images import image_items  # noqa: E402
from adsim.inference.detector import Detector, UnreadableImageWarning, volume_rows  # noqa: E402
from adsim.inference.report import safe_cell  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::adsim.model.backbone.RandomWeightsWarning")

DCM = Path(pydicom.__file__).parent / "data" / "test_files"
NII = Path(nibabel.__file__).parent / "tests" / "data"
TINY = ["--backbone", "tiny", "--device", "cpu", "--no-progress"]


def _unit(values, lo, hi):
    return np.clip((np.asarray(values, dtype=np.float64) - lo) / (hi - lo), 0, 1)


def _voi_range(ds):
    """y_min, y_max of a linear VOI window (PS3.3 C.11.2.1.2, as pydicom's apply_windowing states it)."""
    bits = ds.BitsStored
    lo, hi = (0, 2 ** bits - 1) if ds.PixelRepresentation == 0 else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    if "RescaleSlope" in ds:
        lo, hi = lo * ds.RescaleSlope + ds.RescaleIntercept, hi * ds.RescaleSlope + ds.RescaleIntercept
    return float(lo), float(hi)


# -- DICOM ----------------------------------------------------------------------------------------------

def test_dicom_window_equals_pydicoms_modality_and_voi_luts(tmp_path):
    ds = pydicom.dcmread(DCM / "MR_small.dcm")
    y = apply_voi_lut(apply_modality_lut(ds.pixel_array, ds), ds)
    expected = _unit(y, *_voi_range(ds))
    got = medical.decode(DCM / "MR_small.dcm")
    assert got.window == f"DICOM window C={float(ds.WindowCenter):g} W={float(ds.WindowWidth):g}"
    np.testing.assert_allclose(got.pixels, expected, atol=1e-6)
    # MONOCHROME1 shows the lowest value white: the same file relabelled is the complement
    ds.PhotometricInterpretation = "MONOCHROME1"
    ds.save_as(tmp_path / "mono1.dcm")
    inv = medical.decode(tmp_path / "mono1.dcm")
    np.testing.assert_allclose(inv.pixels, 1.0 - expected, atol=1e-6)
    assert inv.window.endswith("MONOCHROME1 inverted")
    # a compressed copy of the same pixels (JPEG 2000 lossless) decodes to the same picture, where a
    # decoder is installed (Pillow's OpenJPEG)
    if pydicom.pixels.get_decoder(pydicom.dcmread(DCM / "MR_small_jp2klossless.dcm").file_meta.TransferSyntaxUID
                                  ).is_available:
        np.testing.assert_allclose(medical.decode(DCM / "MR_small_jp2klossless.dcm").pixels, expected, atol=1e-6)


def test_dicom_without_window_gets_the_percentile_window_of_its_modality_values():
    ds = pydicom.dcmread(DCM / "CT_small.dcm")  # CT: Rescale Slope/Intercept, no window
    assert "WindowCenter" not in ds and "RescaleIntercept" in ds
    hu = apply_modality_lut(ds.pixel_array, ds)
    lo, hi = np.percentile(hu, [0.5, 99.5])
    got = medical.decode(DCM / "CT_small.dcm")
    np.testing.assert_allclose(got.pixels, _unit(hu, lo, hi), atol=1e-6)
    assert got.window == f"percentile 0.5-99.5 [{lo:.6g}, {hi:.6g}]"


def test_multiframe_dicom_is_one_item_per_frame_with_one_window_for_the_file():
    ds = pydicom.dcmread(DCM / "rtdose.dcm")
    frames = apply_modality_lut(ds.pixel_array, ds)  # (15, 10, 10)
    lo, hi = np.percentile(frames, [0.5, 99.5])
    items = image_items(DCM / "rtdose.dcm")
    assert [src.index for _, src in items] == list(range(ds.NumberOfFrames))
    assert items[3][0] == f"{DCM / 'rtdose.dcm'} [frame 3]"
    for k in (0, 7, 14):
        np.testing.assert_allclose(medical.decode(items[k][1]).pixels, _unit(frames[k], lo, hi), atol=1e-6)


def test_a_folder_of_one_series_is_ordered_by_instance_number(tmp_path):
    ds = pydicom.dcmread(DCM / "MR_small.dcm")
    for name, number in (("a.dcm", 3), ("b.dcm", 1), ("IM0007", 2)):  # IM0007: no suffix, found by its preamble
        ds.InstanceNumber = number
        ds.save_as(tmp_path / name)
    (tmp_path / "z.png").write_bytes(b"x")  # not DICOM: listed by name after the series
    items = image_items(tmp_path)
    assert [Path(n).name for n, _ in items] == ["b.dcm", "IM0007", "a.dcm", "z.png"]
    assert {src.volume for _, src in items[:3]} == {f"{tmp_path} [series {ds.SeriesNumber}]"}


# -- NIfTI ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("axis, voxel_axis", [("axial", 2), ("coronal", 1), ("sagittal", 0), ("1", 1)])
def test_nifti_volume_is_one_item_per_slice_equal_to_nibabels_array(axis, voxel_axis):
    img = nibabel.load(NII / "anatomical.nii")
    assert nibabel.aff2axcodes(img.affine) == ("L", "A", "S")  # so axial slices are along voxel axis 2
    vol = np.asarray(img.dataobj, dtype=np.float64)
    lo, hi = np.percentile(vol, [0.5, 99.5])  # cal_min = cal_max = 0 in this header: no display range
    items = image_items(NII / "anatomical.nii", axis=axis)
    assert len(items) == vol.shape[voxel_axis]
    for k in (0, vol.shape[voxel_axis] // 2):
        src = items[k][1]
        assert (src.kind, src.index, src.axis) == ("slice", k, voxel_axis)
        expected = _unit(np.take(vol, k, axis=voxel_axis).T[::-1], lo, hi)
        np.testing.assert_allclose(medical.decode(src).pixels, expected, atol=1e-6)


def test_a_nifti_slice_without_its_index_or_axis_is_refused():
    for index, axis in ((None, 2), (3, None)):
        with pytest.raises(medical.UnreadableInput, match="index and axis"):
            medical.decode(medical.Source(NII / "anatomical.nii", "slice", index, axis, "axial"))


def test_nifti_display_range_is_the_window_when_set(tmp_path):
    img = nibabel.load(NII / "anatomical.nii")
    vol = np.asarray(img.dataobj, dtype=np.float32)
    img.header["cal_min"], img.header["cal_max"] = 1000.0, 9000.0
    nibabel.save(nibabel.Nifti1Image(vol, img.affine, img.header), tmp_path / "cal.nii.gz")
    vol = np.asarray(nibabel.load(tmp_path / "cal.nii.gz").dataobj, dtype=np.float64)  # as stored (int16, scaled)
    src = image_items(tmp_path / "cal.nii.gz")[10][1]
    got = medical.decode(src)
    assert got.window == "NIfTI cal_min/cal_max [1000, 9000]"
    np.testing.assert_allclose(got.pixels, _unit(vol[:, :, 10].T[::-1], 1000, 9000), atol=1e-6)


# -- 16-bit ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["png", "tiff"])
def test_16bit_grey_is_read_without_clipping_to_8_bits(tmp_path, fmt):
    a = (np.arange(48 * 40).reshape(48, 40) * 27 + 500).astype(np.uint16)  # 500 .. 52313: far above 255
    path = tmp_path / f"deep.{fmt}"
    Image.fromarray(a).save(path)
    got = medical.decode(path)
    assert got.window == "16-bit full range [0, 65535]"
    np.testing.assert_array_equal(got.pixels, (a / 65535.0).astype(np.float32))
    x = bmad.read_image(path, 32, clip_norm=False)
    # PIL's own convert("RGB") would clip every value above 255: a white picture; here the ramp survives
    assert float(x.min()) < 0.05 and float(x.max()) > 0.75 and torch.all(x[0] == x[1])


# -- bad input -------------------------------------------------------------------------------------------

def _png_header_only(path, width, height):
    """A PNG whose IHDR declares ``width x height`` (valid CRCs), with one tiny IDAT chunk: PIL opens it
    and learns the size without decoding a pixel."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 64))
                     + chunk(b"IEND", b""))


@pytest.fixture(scope="module")
def bad_folder(tmp_path_factory):
    """Every kind of bad input next to three good ones; ``{file name: words its reason must contain}``."""
    d = tmp_path_factory.mktemp("bad")
    shutil.copy(DCM / "MR_small.dcm", d / "good_mr.dcm")
    shutil.copy(DCM / "rtplan.dcm", d / "plan.dcm")
    shutil.copy(DCM / "MR_truncated.dcm", d / "truncated.dcm")
    shutil.copy(NII / "example4d.nii.gz", d / "fmri.nii.gz")
    shutil.copy(NII / "standard.nii.gz", d / "good_small.nii.gz")
    raw = gzip.decompress((NII / "example4d.nii.gz").read_bytes())
    (d / "cut.nii.gz").write_bytes(gzip.compress(raw[:400] + b"\x00" * 10)[:-200])  # a gzip cut short
    header = nibabel.Nifti1Header()
    header.set_data_shape((4096, 4096, 4096))
    header.set_data_dtype(np.uint8)
    (d / "huge.nii").write_bytes(header.binaryblock + b"\x00" * 4)  # 2^36 voxels declared, 4 bytes there
    _png_header_only(d / "bomb.png", 9000, 9000)                   # 81 M pixels: above MAX_PIXELS
    _png_header_only(d / "zbomb.png", 30000, 30000)                # above PIL's own bomb limit
    (d / "notes.txt").write_text("not an image")
    Image.fromarray(np.full((16, 16), 128, np.uint8)).save(d / "good.png")
    reasons = {"plan.dcm": "no pixel data", "truncated.dcm": "cannot be decoded", "fmri.nii.gz": "4-D NIfTI",
               "cut.nii.gz": "", "huge.nii": "MAX_VOXELS", "bomb.png": "MAX_PIXELS", "zbomb.png": "decompression bomb",
               "notes.txt": "cannot identify image file"}
    jpeg_ls = pydicom.dcmread(DCM / "MR_small_jpeg_ls_lossless.dcm").file_meta.TransferSyntaxUID
    if not pydicom.pixels.get_decoder(jpeg_ls).is_available:  # a decoder plugin installed: nothing to refuse
        shutil.copy(DCM / "MR_small_jpeg_ls_lossless.dcm", d / "jpegls.dcm")
        reasons["jpegls.dcm"] = "no installed decoder"
    return d, reasons


@pytest.mark.slow
def test_bad_inputs_cost_one_warning_line_each_and_never_the_batch(bad_folder, tmp_path, capsys):
    d, reasons = bad_folder
    out = tmp_path / "out"
    assert main(["predict", "--zero-shot", "winclip", *TINY, str(d), "--out", str(out)]) == 0
    warned = [e for e in capsys.readouterr().err.splitlines() if e.startswith("warning: skipped")]
    assert len(warned) == len(reasons)
    for name, words in reasons.items():
        (line,) = [w for w in warned if w.startswith(f"warning: skipped {d / name}:")]
        assert words in line and "Traceback" not in line
    rows = list(csv.DictReader((out / "scores.csv").read_text().splitlines()))
    scored = {Path(r["path"]).name for r in rows if r["kind"] != "volume"}
    assert scored == {"good_mr.dcm", "good_small.nii.gz", "good.png"}
    assert all(np.isfinite(float(r["score"])) for r in rows)
    assert main(["predict", "--zero-shot", "winclip", *TINY, str(d), "--strict", "--out", str(tmp_path / "o2")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("error: cannot read ")


def test_readers_refuse_with_an_unreadable_input_error(bad_folder):
    d, reasons = bad_folder
    for name in ("plan.dcm", "fmri.nii.gz", "huge.nii", "bomb.png", "zbomb.png"):
        items = image_items(d / name)
        with pytest.raises(medical.UnreadableInput, match=reasons[name]):
            medical.decode(items[0][1])


# -- predict on real pictures, scores.csv, report.html ------------------------------------------------------

class _Items(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.items, self.images, self.scripts, self.text = 0, 0, 0, []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.items += tag == "figure" and attrs.get("class") == "item"
        self.images += tag == "img" and attrs.get("src", "").startswith("data:image/png;base64,")
        self.scripts += tag == "script" or any(k.startswith("on") for k in attrs)

    def handle_data(self, data):
        self.text.append(data)


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    """predict --zero-shot winclip (tiny backbone) on pydicom's CT and MR, the 15-frame RT dose, nibabel's
    25-slice anatomical volume, and a file and a DICOM tag that carry markup."""
    d = tmp_path_factory.mktemp("real")
    for name in ("CT_small.dcm", "rtdose.dcm"):
        shutil.copy(DCM / name, d / name)
    shutil.copy(NII / "anatomical.nii", d / "anatomical.nii")
    ds = pydicom.dcmread(DCM / "MR_small.dcm")
    ds.SeriesDescription = "<script>alert('tag')</script>"
    ds.save_as(d / "MR_small.dcm")
    Image.fromarray(np.full((20, 20), 99, np.uint8)).save(d / "x<script>alert(1)<b>.png")
    out = d / "out"
    assert main(["predict", "--zero-shot", "winclip", *TINY, str(d), "--out", str(out)]) == 0
    return d, out


def test_predict_on_real_scans_gives_finite_scores_an_overlay_each_and_volume_rows(real_run):
    d, out = real_run
    rows = list(csv.DictReader((out / "scores.csv").read_text().splitlines()))
    assert list(rows[0]) == ["path", "kind", "index", "axis", "score", "window"]
    pictures = [r for r in rows if r["kind"] != "volume"]
    assert len(pictures) == 1 + 1 + 15 + 25 + 1  # CT, MR, RT dose frames, axial slices, the PNG
    assert all(np.isfinite(float(r["score"])) for r in rows)
    assert len(list((out / "overlays").glob("*.png"))) == len(pictures)
    slices = [r for r in rows if r["path"] == str(d / "anatomical.nii")]
    assert [r["kind"] for r in slices] == ["slice"] * 25 + ["volume"]  # the volume row follows its slices
    assert [r["index"] for r in slices[:25]] == [str(k) for k in range(25)] and slices[-1]["index"] == ""
    assert slices[0]["axis"] == "axial (voxel axis 2)"
    assert float(slices[-1]["score"]) == max(float(r["score"]) for r in slices[:25])
    png = [r for r in rows if r["path"].endswith(".png")]
    assert png[0]["kind"] == "image" and png[0]["index"] == "" and png[0]["window"] == "8-bit [0, 255]"
    frames = [r for r in rows if r["path"] == str(d / "rtdose.dcm")]
    assert [r["kind"] for r in frames] == ["frame"] * 15 + ["volume"]


@pytest.mark.slow
def test_report_is_self_contained_escaped_and_counts_every_picture(real_run):
    d, out = real_run
    text = (out / "report.html").read_text()
    parser = _Items()
    parser.feed(text)
    assert parser.items == 43 and parser.images == 43 and parser.scripts == 0
    assert "<script" not in text.lower() and "http://" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "")
    body = "".join(parser.text)
    assert str(d / "x<script>alert(1)<b>.png") in body            # the file name, as text
    assert "<script>alert('tag')</script>" in body                # the DICOM tag, as text
    for setting in ("winclip", "tiny", "random (no --checkpoint)", "0 (zero-shot)", "max of the slice scores"):
        assert setting in body
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (.ci/run installs it): the rendering is not checked")
    flags = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1000,800"]
    dom = subprocess.run([*flags, "--dump-dom", (out / "report.html").as_uri()], capture_output=True, text=True,
                         timeout=120)
    rendered = _Items()
    rendered.feed(dom.stdout)
    assert rendered.items == 43, dom.stderr[-2000:]
    shot = out / "shot.png"
    subprocess.run([*flags, f"--screenshot={shot}", (out / "report.html").as_uri()], capture_output=True,
                   timeout=120)
    with Image.open(shot) as im:
        pixels = np.asarray(im.convert("RGB"))
    assert pixels.shape == (800, 1000, 3)
    bar = np.all(pixels == (0x3B, 0x6E, 0xA5), axis=-1)  # the histogram's bars, drawn in BAR_COLOUR
    assert bar.sum() > 500


@pytest.mark.parametrize("name", ["=HYPERLINK(1).png", "+1.png", "@a.png", "-x.png", "a,b \"c\".png"])
def test_csv_cells_from_file_names_are_quoted_and_guarded(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    Image.fromarray(np.full((16, 16), 7, np.uint8)).save(tmp_path / name)
    assert main(["predict", "--zero-shot", "winclip", *TINY, "--no-overlays", "--out", "o", "--", name]) == 0
    (row,) = list(csv.DictReader((tmp_path / "o" / "scores.csv").read_text().splitlines()))
    assert row["path"] == ("'" + name if name[0] in "=+@-" else name)
    assert safe_cell(None) == "" and safe_cell("/a=b") == "/a=b"


def test_volume_score_is_the_max_or_the_topk_mean_of_its_slice_scores():
    records = [{"volume": "v", "window": "w", "axis": "a", "description": ""} for _ in range(4)]
    records.insert(2, {"volume": None, "window": "w", "axis": None, "description": ""})
    scores = np.array([0.1, 0.9, 5.0, 0.4, 0.7], np.float32)
    (row,) = volume_rows(records, scores)
    assert row["score"] == pytest.approx(0.9) and row["n"] == 4 and row["last"] == 4
    (row,) = volume_rows(records, scores, topk=2)
    assert row["score"] == pytest.approx((0.9 + 0.7) / 2) and row["rule"] == "mean of the 2 highest slice scores"
    with pytest.raises(ValueError, match="top-k"):
        volume_rows(records, scores, topk=0)


# -- scikit-image's retina pictures, zero-shot and trained ------------------------------------------------

@pytest.mark.slow
def test_retina_pictures_through_zero_shot_winclip_and_a_trained_toy_run(toy_root, tmp_path):
    data = pytest.importorskip("skimage.data")
    pics = {"retina": data.retina(), "microaneurysms": data.microaneurysms()}  # bundled with scikit-image
    for name, a in pics.items():
        Image.fromarray(a).save(tmp_path / f"{name}.png")
    paths = [tmp_path / "retina.png", tmp_path / "microaneurysms.png"]
    zs = Detector.zero_shot("winclip", backbone="tiny", device="cpu").predict(paths, overlays=tmp_path / "zs")
    run = tmp_path / "run"
    assert main(["train", "--data", str(toy_root), "--target", "Retina_RESC", "--train-domains", "Liver",
                 "--epochs", "1", "--backbone", "tiny", "--batch-size", "8", "--no-progress", "--out", str(run)]) == 0
    tr = Detector.from_run(run, device="cpu").predict([Image.fromarray(a) for a in pics.values()],
                                                      overlays=tmp_path / "tr")
    for pred, folder in ((zs, "zs"), (tr, "tr")):
        assert pred.scores.shape == (2,) and np.isfinite(pred.scores).all() and np.isfinite(pred.maps).all()
        assert len(list((tmp_path / folder).glob("*.png"))) == 2
    assert [r["window"] for r in zs.records] == ["8-bit [0, 255]"] * 2


@pytest.mark.slow
def test_shots_from_a_volume_leave_its_other_slices_scored(toy_root, tmp_path):
    run = tmp_path / "run"
    assert main(["train", "--data", str(toy_root), "--target", "Brain", "--train-domains", "Liver", "--epochs", "1",
                 "--backbone", "tiny", "--batch-size", "8", "--no-progress", "--out", str(run)]) == 0
    out = tmp_path / "pred"
    volume = str(NII / "standard.nii.gz")  # 7 axial slices of 4 x 5 voxels
    assert main(["predict", "--run", str(run), volume, "--shots", "2", "--normals", volume, "--no-progress",
                 "--device", "cpu", "--out", str(out)]) == 0
    rows = list(csv.DictReader((out / "scores.csv").read_text().splitlines()))
    assert len([r for r in rows if r["kind"] == "slice"]) == 5 and rows[-1]["kind"] == "volume"


# -- BMAD layout with DICOM and 16-bit files ----------------------------------------------------------------

def test_bmad_split_reads_dicom_and_16bit_files(toy_root, tmp_path):
    root = tmp_path / "bmad"
    shutil.copytree(toy_root / "Chest_AD", root / "Chest_AD")
    shutil.copy(DCM / "CT_small.dcm", root / "Chest_AD" / "test" / "good" / "img" / "ct.dcm")
    Image.fromarray(np.full((30, 30), 40000, np.uint16)).save(root / "Chest_AD" / "test" / "Ungood" / "img" / "d.png")
    samples = bmad.list_split(root, "Chest", "test")
    names = {s.image.name for s in samples}
    assert {"ct.dcm", "d.png"} <= names
    ds = bmad.ImageDataset(samples, 32, clip_norm=False)
    images = {samples[i].image.name: ds[i]["image"] for i in range(len(samples))}
    np.testing.assert_allclose(images["d.png"].numpy(), 40000 / 65535, atol=1e-6)  # a constant stays constant
    assert float(images["ct.dcm"].std()) > 0.1


# -- every method from every command ------------------------------------------------------------------------

def test_help_lists_the_zero_shot_methods_and_eval_zero_shot_matches_predict(toy_root, tmp_path, capsys):
    from adsim.config.choices import ZERO_SHOT_METHODS

    for command in ("predict", "eval"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        assert all(m in capsys.readouterr().out for m in ZERO_SHOT_METHODS)
    out = tmp_path / "zs"
    assert main(["eval", "--zero-shot", "winclip", "--data", str(toy_root), "--target", "Chest", "--out", str(out),
                 *TINY]) == 0
    import json

    from sklearn.metrics import roc_auc_score
    metrics = json.loads((out / "metrics.json").read_text())
    samples = bmad.list_split(toy_root, "Chest", "test")
    scores = Detector.zero_shot("winclip", backbone="tiny", device="cpu").predict([s.image for s in samples]).scores
    assert metrics["image_auc"] == pytest.approx(100 * roc_auc_score([s.label for s in samples], scores), abs=1e-6)
    assert metrics["method"] == "winclip" and metrics["zero_shot"] is True and metrics["pretrained"] is False
    capsys.readouterr()
    assert main(["eval", "--zero-shot", "winclip", "--data", str(toy_root), "--out", str(out), *TINY]) == 2
    assert "needs --target" in capsys.readouterr().err


def test_python_api_warns_one_line_per_bad_file(bad_folder):
    """The detector's warning names the file and the reason on one line (Python API, not only the CLI)."""
    d, reasons = bad_folder
    det = Detector.zero_shot("winclip", backbone="tiny", device="cpu")
    with pytest.warns(UnreadableImageWarning) as rec:
        pred = det.predict(d, maps=False)
    assert len(rec) == len(reasons) and all("\n" not in str(w.message) for w in rec)
    assert len(pred.paths) == 1 + 7 + 1
