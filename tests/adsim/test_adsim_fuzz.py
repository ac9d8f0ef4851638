"""Damaged files against the readers (``adsim.data.medical``) and ``predict``: every input ends as a
picture or one ``UnreadableInput`` naming the file, on one line; nothing else escapes, no library log
record reaches the terminal, one damaged volume is one warning line.

The seeds are the files pydicom, nibabel and scikit-image ship (``_fuzz_readers.seeds``); the
regression files (``data/fuzz_regressions``, provenance in its README) are the inputs fuzzing found
that broke the readers before they were fixed. The fuzz test (marked ``fuzz`` and ``slow``: deselect
with ``-m "not fuzz"``) is hypothesis-driven byte mutation, derandomised by the suite's profile (the
same inputs every run; a failure shrinks to the fewest, smallest mutations). Long coverage-guided
campaigns: docs/fuzzing.md."""
import csv
import logging
import pickle
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("pydicom")
pytest.importorskip("nibabel")
pytest.importorskip("skimage")
pytest.importorskip("tifffile")

import _fuzz_readers as fuzz  # noqa: E402

from adsim.cli.main import main  # noqa: E402
from adsim.data import medical  # noqa: E402
from poolsim.testing import examples  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::adsim.model.backbone.RandomWeightsWarning")

REGRESSIONS = Path(__file__).parent / "data" / "fuzz_regressions"
FILES = sorted(p for p in REGRESSIONS.iterdir() if p.name != "README.md")
# seeds refused on purpose: 12-bit JPEG (Pillow decodes 8-bit JPEG only), JPEG-LS without a decoder
# plugin, and a 4-D NIfTI
REFUSED_SEEDS = {"JPEG-lossy.dcm": "12-bit", "MR_small_jpeg_ls_lossless.dcm": "no installed decoder",
                 "example_nifti2.nii.gz": "4-D NIfTI"}


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    return fuzz.seeds(tmp_path_factory.mktemp("seeds"))


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("mutants")


def test_seeds_are_read_except_the_ones_refused_on_purpose(seeds):
    for path in seeds:
        outcomes = fuzz.check(path, seconds=30.0)
        if path.name in REFUSED_SEEDS:
            if path.name == "MR_small_jpeg_ls_lossless.dcm" and outcomes == ["ok"]:
                continue  # a JPEG-LS decoder plugin is installed here
            (reason,) = outcomes
            assert REFUSED_SEEDS[path.name] in reason
        else:
            assert outcomes and all(o == "ok" for o in outcomes), (path.name, outcomes)


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_regression_file_ends_in_pictures_or_one_unreadable_input(path, tmp_path):
    copy = tmp_path / path.name  # the name keeps the seed's suffix, which picks the reader
    shutil.copy(path, copy)
    outcomes = fuzz.check(copy, seconds=30.0)  # raises fuzz.Finding on a broken contract
    assert outcomes


def test_unreadable_input_names_the_file_and_survives_pickling(tmp_path):
    path = tmp_path / "damaged.dcm"
    shutil.copy(REGRESSIONS / "decode-BytesLengthException_MR_small.dcm", path)
    with pytest.raises(medical.UnreadableInput) as err:
        medical.decode(medical.expand(path)[0])
    e = err.value
    assert isinstance(e, ValueError) and e.path == str(path) and str(e) == f"{path}: {e.reason}"
    back = pickle.loads(pickle.dumps(e))  # DataLoader workers send errors between processes
    assert (type(back), back.path, back.reason, str(back)) == (type(e), e.path, e.reason, str(e))


@pytest.mark.parametrize("name", ["log-pydicom_MR_small_bigendian.dcm", "log-nibabel.global_standard.nii.gz"])
def test_library_log_records_are_dropped_while_reading_only(name, tmp_path):
    """The file made pydicom/nibabel log at WARNING or above (to the user's terminal, via the root
    logger or nibabel's own handler); while adsim reads it nothing is logged, and afterwards the
    libraries' loggers work as before (nothing was silenced for the rest of the process)."""
    path = tmp_path / name
    shutil.copy(REGRESSIONS / name, path)
    library = logging.getLogger(name.split("_")[0].removeprefix("log-"))
    capture = fuzz.Records(logging.DEBUG)
    root = logging.getLogger()
    root.addHandler(capture)
    try:
        for item in medical.expand(path):
            try:
                medical.decode(item)
            except medical.UnreadableInput:
                pass
        assert [r for r in capture.records if r.levelno >= logging.WARNING] == []
        library.warning("after the read")
        assert [r.getMessage() for r in capture.records] == ["after the read"]
    finally:
        root.removeHandler(capture)


@pytest.mark.fuzz
@pytest.mark.slow
@settings(max_examples=examples(1000), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(which=st.integers(0, 10 ** 6),
       mutations=st.lists(st.tuples(st.sampled_from(fuzz.OPS), st.integers(0, 2 ** 20), st.integers(0, 2 ** 10),
                                    st.integers(0, 255)), min_size=1, max_size=4),
       inside_gzip=st.booleans())
def test_fuzzed_files_end_in_pictures_or_one_unreadable_input(seeds, scratch, which, mutations, inside_gzip):
    """About 60 s: byte mutations of every seed (flip, delete, insert, truncate, overwrite with an
    extreme value, splice from MR_small.dcm); a ``.gz`` seed is also mutated inside its gzip stream.
    The time limit per file is generous (a hang or a bomb, not a benchmark: docs/fuzzing.md has the
    campaign's timings)."""
    seed = seeds[which % len(seeds)]
    path = fuzz.write_mutant(seed, scratch, mutations, other=seeds[0].read_bytes(),
                             inside_gzip=inside_gzip and seed.name.endswith(".gz"))
    assert fuzz.check(path, seconds=20.0)


def test_predict_scores_the_good_files_and_warns_once_per_damaged_one(seeds, tmp_path, capsys):
    """A folder of the regression files and three good seeds: ``predict`` exits 0, scores every
    picture of the readable files, and prints exactly one ``warning: skipped FILE`` line per file that
    cannot be read (the truncated 25-slice volume included), with no traceback and no library log."""
    folder = tmp_path / "scans"
    folder.mkdir()
    for p in FILES + [s for s in seeds if s.name in ("MR_small.dcm", "camera8.png", "standard.nii.gz")]:
        shutil.copy(p, folder / p.name)
    expected = {p: fuzz.check(p, seconds=30.0) for p in sorted(folder.iterdir())}
    damaged = {p for p, outcomes in expected.items() if any(o != "ok" for o in outcomes)}
    good = set(expected) - damaged
    assert folder / "truncated-volume_anatomical.nii" in damaged and len(good) >= 3
    assert len(medical.expand(folder / "truncated-volume_anatomical.nii")) == 25
    out = tmp_path / "out"
    capsys.readouterr()
    assert main(["predict", "--zero-shot", "winclip", "--backbone", "tiny", "--device", "cpu", "--no-progress",
                 str(folder), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "ERROR" not in err
    warned = [line for line in err.splitlines() if line.startswith("warning: skipped ")]
    for p in damaged:
        (line,) = [w for w in warned if w.startswith(f"warning: skipped {p}: ")]
        assert "not a readable image" in line
    assert len(warned) == len(damaged)
    rows = list(csv.DictReader((out / "scores.csv").read_text().splitlines()))
    scored = {Path(r["path"]) for r in rows if r["kind"] != "volume"}
    assert scored == good
