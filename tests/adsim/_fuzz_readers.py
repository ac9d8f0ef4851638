"""Fuzzing the readers of ``adsim.data.medical``: seeds, byte mutations, and the one oracle.

The **seeds** are real files the installed packages ship (pydicom's test files in every transfer syntax
it has a decoder for, nibabel's NIfTI-1/NIfTI-2 test volumes, crops of scikit-image's pictures saved as
8-bit PNG, 16-bit PNG, JPEG and 16-bit TIFF); nothing is downloaded. A ``.nii.gz`` seed is also fuzzed
*inside* its gzip (the mutation is applied to the decompressed bytes, then recompressed), so the NIfTI
parser sees damaged headers and voxels and not only a damaged gzip stream.

The **oracle** (:func:`check`): listing a file (``expand``) and reading every item of it (``decode``)
ends either in pictures (float32 in ``[0, 1]`` of at most ``MAX_PIXELS`` pixels, or an 8-bit PIL image)
or in ``UnreadableInput`` naming the file, on one line, with no traceback text; every other exception is
a finding. Third-party log records at WARNING or above that reach the root logger are findings too.

Two drivers use it:

* the suite (``tests/adsim/test_adsim_fuzz.py``): hypothesis draws a seed and a short list of
  mutations (flip, delete, insert, truncate, overwrite with an extreme value, splice from another seed);
  its runs are derandomised (same inputs every run) and a failure shrinks to the fewest, smallest
  mutations that still fail;
* a long campaign (``python benchmarks/fuzz_readers.py --minutes 30``, docs/fuzzing.md): atheris,
  coverage-guided (libFuzzer's mutator, with the seeds as its corpus), which finds what a blind mutator
  does not -- inputs that pass one parser check to reach the next.
"""
from __future__ import annotations

import gzip
import logging
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

from adsim.data import medical

DICOM_SEEDS = (  # pydicom/data/test_files: one per transfer syntax and photometric kind it decodes
    "MR_small.dcm",             # explicit VR little endian, 16-bit, VOI window
    "MR_small_implicit.dcm",    # implicit VR
    "MR_small_bigendian.dcm",   # explicit VR big endian
    "MR_small_RLE.dcm",         # RLE lossless
    "JPEG-lossy.dcm",           # JPEG extended 12-bit: refused (Pillow decodes 8-bit JPEG only)
    "SC_rgb_jpeg_dcmtk.dcm",    # JPEG baseline, YBR colour
    "JPEG2000.dcm",             # JPEG 2000
    "MR_small_jp2klossless.dcm",  # JPEG 2000 lossless
    "image_dfl.dcm",            # deflated explicit VR
    "rtdose.dcm",               # multi-frame
    "SC_rgb_rle_2frame.dcm",    # RLE colour, 2 frames
    "SC_rgb_small_odd.dcm",     # uncompressed RGB, odd size
    "MR_small_jpeg_ls_lossless.dcm",  # JPEG-LS: refused when no decoder plugin is installed
)
NIFTI_SEEDS = ("standard.nii.gz", "resampled_anat_moved.nii", "example_nifti2.nii.gz", "anatomical.nii")


def _package_dir(module: str, *parts: str) -> Path:
    import importlib

    return Path(importlib.import_module(module).__file__).parent.joinpath(*parts)


def seeds(folder: Path) -> list:
    """The seed files: pydicom's and nibabel's test files (by path, in the installed packages) and small
    pictures made here from scikit-image's data (crops of ``camera.png`` and ``retina.jpg``) as 8-bit PNG,
    16-bit PNG, JPEG and 16-bit TIFF, written into ``folder``. Returns the paths."""
    import tifffile

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    dcm = _package_dir("pydicom", "data", "test_files")
    nii = _package_dir("nibabel", "tests", "data")
    sk = _package_dir("skimage", "data")
    out = [dcm / n for n in DICOM_SEEDS] + [nii / n for n in NIFTI_SEEDS]
    camera = np.asarray(Image.open(sk / "camera.png"))[200:232, 200:240]
    retina = np.asarray(Image.open(sk / "retina.jpg").convert("RGB"))[600:632, 600:632]
    Image.fromarray(camera).save(folder / "camera8.png")
    Image.fromarray((camera.astype(np.uint16) * 257)).save(folder / "camera16.png")
    Image.fromarray(retina).save(folder / "retina.jpg", quality=90)
    tifffile.imwrite(folder / "camera16.tif", camera.astype(np.uint16) * 257)
    out += [folder / n for n in ("camera8.png", "camera16.png", "retina.jpg", "camera16.tif")]
    return out


# -- mutations ---------------------------------------------------------------------------------------------

OPS = ("flip", "delete", "insert", "truncate", "overwrite", "splice")
EXTREMES = (b"\x00", b"\xff", b"\x7f", b"\x80", b"\x00\x00\x00\x00", b"\xff\xff\xff\xff", b"\xff\xff\xff\x7f",
            b"\x00\x00\x00\x80", b"\x01\x00\x00\x00", b"\x00\x00\x01\x00")


def mutate(data: bytes, mutations, other: bytes = b"") -> bytes:
    """``data`` after ``mutations``: a list of ``(op, position, size, value)`` with ``op`` one of
    :data:`OPS`; positions and sizes are taken modulo the current length, so any integers are valid.
    ``flip`` xors the byte with ``value`` (1..255); ``delete`` removes ``size`` bytes; ``insert`` adds
    ``size`` copies of ``value``; ``truncate`` cuts the file there; ``overwrite`` writes
    ``EXTREMES[value]`` (lengths and counts set to 0, -1, 2^31 ...); ``splice`` copies ``size`` bytes of
    ``other`` over it."""
    b = bytearray(data)
    for op, pos, size, value in mutations:
        n = len(b)
        if n == 0:
            break
        pos %= n
        if op == "flip":
            b[pos] ^= (value % 255) + 1
        elif op == "delete":
            del b[pos:pos + 1 + size % 64]
        elif op == "insert":
            b[pos:pos] = bytes([value % 256]) * (1 + size % 64)
        elif op == "truncate":
            del b[pos:]
        elif op == "overwrite":
            x = EXTREMES[value % len(EXTREMES)]
            b[pos:pos + len(x)] = x
        elif op == "splice" and other:
            start = size % len(other)
            chunk = other[start:start + 1 + value % 256]
            b[pos:pos + len(chunk)] = chunk
    return bytes(b)


def write_mutant(seed: Path, folder: Path, mutations, other: bytes = b"", inside_gzip: bool = False) -> Path:
    """The mutant of ``seed`` in ``folder`` under the seed's name (the suffix picks the reader);
    ``inside_gzip``: mutate the decompressed bytes of a ``.gz`` seed, then recompress."""
    data = seed.read_bytes()
    if inside_gzip:
        data = gzip.compress(mutate(gzip.decompress(data), mutations, other), mtime=0)
    else:
        data = mutate(data, mutations, other)
    path = Path(folder) / seed.name
    path.write_bytes(data)
    return path


# -- the oracle --------------------------------------------------------------------------------------------

class Finding(AssertionError):
    """An input on which a reader broke its contract (the message says how)."""


class Records(logging.Handler):
    """A logging handler that keeps the records at ``level`` and above (``records``)."""

    def __init__(self, level: int = logging.WARNING):
        super().__init__(level)
        self.records: list = []

    def emit(self, record):
        self.records.append(record)


def check(path: Path, *, seconds: float = 2.0) -> list:
    """List ``path`` and read every item; returns one outcome per item (``"ok"`` or the
    ``UnreadableInput`` message). Raises :class:`Finding` for any other exception, an
    ``UnreadableInput`` that does not name the file or spans several lines or carries a traceback, a
    picture outside ``[0, 1]``/above ``MAX_PIXELS``, a third-party log record at WARNING or above that
    reaches the root logger, or more than ``seconds`` for the file."""
    root = logging.getLogger()
    handler = Records()
    root.addHandler(handler)
    outcomes = []
    start = time.perf_counter()
    try:
        try:
            items = medical.expand(path)
        except Exception as err:  # noqa: BLE001 -- the finding is any exception here
            raise Finding(f"expand({path.name}) raised {type(err).__name__}: {err}") from err
        for item in items[:64] + items[-4:] if len(items) > 68 else items:
            try:
                decoded = medical.decode(item)
            except medical.UnreadableInput as err:
                text = str(err)
                if str(path) not in text or "\n" in text or "Traceback" in text:
                    raise Finding(f"UnreadableInput message not one line naming the file: {text!r}") from err
                outcomes.append(text)
                continue
            except Exception as err:  # noqa: BLE001 -- the finding is any other exception
                raise Finding(f"decode({path.name}) raised {type(err).__name__}: {err}") from err
            _check_picture(path, decoded)
            outcomes.append("ok")
    finally:
        root.removeHandler(handler)
    if handler.records:
        r = handler.records[0]
        raise Finding(f"{path.name}: log record from {r.name!r} reached the terminal: {r.getMessage()[:200]}")
    took = time.perf_counter() - start
    if took > seconds:
        raise Finding(f"{path.name}: {len(outcomes)} items took {took:.1f} s (> {seconds} s)")
    return outcomes


def _check_picture(path: Path, decoded) -> None:
    """A decoded picture is within the limits and in ``[0, 1]``, and ``predict``'s preprocessing of it
    ends in a finite ``(3, S, S)`` tensor or one of ``bmad.UNREADABLE`` (a warning line in ``predict``)."""
    from adsim.data import bmad

    px = decoded.pixels
    if isinstance(px, Image.Image):
        if px.size[0] * px.size[1] > medical.MAX_PIXELS:
            raise Finding(f"{path.name}: a {px.size} picture above MAX_PIXELS")
    else:
        a = np.asarray(px)
        if (a.dtype != np.float32 or not (a.ndim == 2 or (a.ndim == 3 and a.shape[2] == 3)) or a.size == 0
                or a.shape[0] * a.shape[1] > medical.MAX_PIXELS):
            raise Finding(f"{path.name}: decoded to {a.dtype} {a.shape}, not float32 (H, W[, 3]) within MAX_PIXELS")
        if not (np.all(np.isfinite(a)) and a.min() >= 0.0 and a.max() <= 1.0):
            raise Finding(f"{path.name}: pixels outside [0, 1] or not finite")
    try:
        x = (bmad.preprocess(px, 16) if isinstance(px, Image.Image) else bmad.preprocess_array(px, 16))
    except bmad.UNREADABLE:
        return
    except Exception as err:  # noqa: BLE001 -- the finding is any other exception
        raise Finding(f"preprocessing {path.name} raised {type(err).__name__}: {err}") from err
    if tuple(x.shape) != (3, 16, 16) or not bool(x.isfinite().all()):
        raise Finding(f"{path.name}: preprocessed to {tuple(x.shape)} with non-finite values")


# -- the long campaign (atheris): benchmarks/fuzz_readers.py -----------------------------------------------

def campaign(minutes: float, seconds: float, crashes: Path, stats_file: Path, atheris) -> None:
    """Run atheris (already set up to instrument the readers) for ``minutes`` on the seeds; inputs that
    break the contract are written to ``crashes``. One fuzz input is a byte naming the seed (hence the
    reader: the file keeps the seed's name) and the file's bytes. Counts and timings go to ``stats_file``
    (JSON) every 500 inputs and at a finding: libFuzzer ends the process itself when time is up."""
    import json
    import tempfile

    from adsim.data import bmad  # noqa: F401 -- torch loads before the clock of the first input starts

    work = Path(tempfile.mkdtemp(prefix="adsim-fuzz-"))
    paths = seeds(work / "seeds")
    corpus = work / "corpus"
    corpus.mkdir()
    for i, p in enumerate(paths):
        (corpus / f"{i:02d}_{p.name}").write_bytes(bytes([i]) + p.read_bytes())
    target = work / "target"
    target.mkdir()
    crashes = Path(crashes)
    crashes.mkdir(parents=True, exist_ok=True)
    stats = {"inputs": 0, "read": 0, "refused": 0, "findings": 0, "slowest_s": 0.0, "start": time.time(),
             "per_reader": {}}

    def one(data: bytes) -> None:
        if not data:
            return
        seed = paths[data[0] % len(paths)]
        path = target / seed.name
        path.write_bytes(data[1:])
        stats["inputs"] += 1
        reader = "".join(seed.suffixes[-2:]) if seed.name.endswith(".nii.gz") else seed.suffix
        stats["per_reader"][reader] = stats["per_reader"].get(reader, 0) + 1
        t = time.perf_counter()
        try:
            outcomes = check(path, seconds=seconds)
        except Finding:
            stats["findings"] += 1
            (crashes / f"{stats['inputs']:08d}_{seed.name}").write_bytes(data[1:])
            dump()
            raise
        finally:
            stats["slowest_s"] = max(stats["slowest_s"], time.perf_counter() - t)
        stats["read" if outcomes and all(o == "ok" for o in outcomes) else "refused"] += 1
        if stats["inputs"] % 500 == 0:
            dump()

    def dump() -> None:
        Path(stats_file).write_text(json.dumps({**stats, "seconds": time.time() - stats["start"]}, indent=1))

    atheris.Setup([sys.argv[0], str(corpus), f"-max_total_time={int(minutes * 60)}", "-rss_limit_mb=6144",
                   f"-timeout={max(10, int(seconds * 5))}", f"-artifact_prefix={crashes}/", "-print_final_stats=1"], one)
    atheris.Fuzz()
