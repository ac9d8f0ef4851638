"""Scans as they come: DICOM files and series, NIfTI volumes, and 16-bit PNG/TIFF, read into what the
models take (one 2-D picture per item, values in ``[0, 1]``) with the window that was used.

Listing (:func:`expand`, :func:`expand_folder`) turns a file or a folder into items: a plain image is
its ``Path``; everything that is one picture out of a DICOM or NIfTI file is a :class:`Source`
(file, frame or slice index, the volume it belongs to). Listing reads headers only and never raises for
a bad file: a file whose header cannot be read stays one item, and reading it gives the reason.
Reading (:func:`decode`) gives a :class:`Decoded`: an 8-bit image as the PIL image (the training
path, unchanged), anything deeper as float32 in ``[0, 1]``, and the window as text.

* **DICOM** (pydicom): the modality LUT (Rescale Slope/Intercept, or a Modality LUT Sequence:
  ``pydicom.pixels.apply_modality_lut``), then the file's first VOI window or VOI LUT when it has one
  (``apply_voi_lut``), scaled from its output range to ``[0, 1]``; without one, a robust window: the
  0.5th to 99.5th percentile of the modality values of the whole file (every frame), recorded with its
  bounds. MONOCHROME1 (lowest value shown white) is inverted, so that bright means the same thing in
  every input. Colour files (RGB, YBR converted by pydicom, PALETTE COLOR through its LUT) are scaled by
  their bit depth. A multi-frame file is one item per frame (one volume); single-frame files of one
  series (same Series Instance UID) in a folder are ordered by Instance Number and form one volume.
  Enhanced multi-frame objects keep their per-frame rescale and window in functional-group sequences,
  which are not read: such files get the raw stored values and the percentile window.
* **NIfTI** (nibabel, ``.nii`` / ``.nii.gz``): the voxel values with the header's ``scl_slope`` /
  ``scl_inter`` applied; the window is the header's ``cal_min`` / ``cal_max`` display range when it is
  set (``cal_max > cal_min``), else the percentile window of the whole volume. A 3-D volume is one item
  per slice along ``axis``: ``axial``, ``coronal`` or ``sagittal`` picks the voxel axis nearest the
  patient's S-I, A-P or L-R direction according to the affine (``nibabel.aff2axcodes``; the volume is
  not resampled or reoriented), or ``0``/``1``/``2`` names a voxel axis. A slice is shown as
  ``imshow(slice.T, origin="lower")`` shows it: the first remaining voxel axis left to right, the second
  bottom to top. A 2-D image (or 3-D with one slice) is one item. A 4-D file (a time series or several
  volumes) is refused with the reason -- pick one volume first (``nibabel.funcs.four_to_three``) --
  unless its 4th axis has length 1.
* **16-bit PNG/TIFF** (PIL modes ``I;16*``, and ``I`` with values in ``[0, 65535]``): divided by 65535,
  the full 16-bit range, so no value is clipped and images keep their relative brightness; other 32-bit
  integer and float images get the percentile window.

Limits: :data:`MAX_PIXELS` per 2-D picture and :data:`MAX_VOXELS` per volume or multi-frame file, checked
from the header before any pixel is decoded (PIL's ``MAX_IMAGE_PIXELS`` idea, for every format; PIL's
own decompression-bomb warning is an error here, also inside compressed DICOM), and at most
:data:`MAX_ITEMS` frames or slices per file (and no more than the file has bytes); a larger input is
refused. Non-finite voxels (NaN backgrounds of processed NIfTI maps) are set to the window's low end,
and the window text says how many there were.

Damaged files: every failure of reading a file's content, whatever the library raised, is one
:class:`UnreadableInput` (a ``ValueError``) naming the file and saying why on one line; a damaged
volume fails once (the failure is remembered for its other slices or frames). While adsim reads a
file, the log records and warnings of pydicom, nibabel and PIL are dropped (:func:`quiet_readers`):
the reason reaches the user once, in the error. ``tests/adsim/_fuzz_readers.py`` fuzzes all of this
(docs/fuzzing.md).
"""
from __future__ import annotations

import contextlib
import functools
import logging
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, cast

import numpy as np
from PIL import Image

if TYPE_CHECKING:
    # nibabel.load declares the base class FileBasedImage; a .nii / .nii.gz file loads as a Nifti1Image
    # (Nifti2Image is one), and anything else fails where it is used, inside _reading
    from nibabel.nifti1 import Nifti1Image

MAX_PIXELS = 2 ** 26   # PIL's own bomb limit is about 89 M pixels
"""Largest 2-D picture read (8192 x 8192 pixels); a larger one is refused as unreadable."""
MAX_VOXELS = 2 ** 28
"""Largest volume or multi-frame file read (1 GiB as float32, e.g. 512 x 512 x 1024 voxels)."""
MAX_ITEMS = 2 ** 16
"""Most frames or slices read from one file; a file claiming more is refused as unreadable."""
PERCENTILES = (0.5, 99.5)
AXES = ("axial", "coronal", "sagittal")
_AXIS_CODES = {"axial": "SI", "coronal": "AP", "sagittal": "LR"}
DICOM_SUFFIXES = (".dcm", ".dicom")
NIFTI_SUFFIXES = (".nii", ".nii.gz")
EIGHT_BIT = "8-bit [0, 255]"


class UnreadableInput(ValueError):
    """A file that cannot be read as an image. ``reason``: why, in one line of plain words; ``path``: the
    file (None for an in-memory image). The message is ``"<path>: <reason>"``."""

    def __init__(self, reason: str, path=None):
        self.reason = _one_line(reason)
        self.path = None if path is None else str(path)
        super().__init__(self.reason if self.path is None else f"{self.path}: {self.reason}")

    def __reduce__(self):  # pickled with its fields (DataLoader workers send exceptions between processes)
        return (type(self), (self.reason, self.path))

    def naming(self, path) -> "UnreadableInput":
        """This error naming ``path`` (itself if it names a file already)."""
        return self if self.path is not None or path is None else UnreadableInput(self.reason, path)


@dataclass(frozen=True)
class Source:
    """One picture out of a DICOM or NIfTI file. ``kind``: ``"frame"`` (DICOM multi-frame), ``"slice"``
    (NIfTI), ``"image"`` (a one-picture DICOM or NIfTI file); ``index``: the frame or slice (0-based), None
    for ``"image"``; ``axis``: voxel axis of a NIfTI slice; ``axis_name``: e.g. ``"axial"``; ``volume``: the
    name of the volume it belongs to (the file, or a folder's series), None for a lone picture;
    ``description``: DICOM Modality and Series Description, as the file has them."""
    path: Path
    kind: str = "image"
    index: int | None = None
    axis: int | None = None
    axis_name: str | None = None
    volume: str | None = None
    description: str = ""

    def __fspath__(self) -> str:
        return str(self.path)

    @property
    def name(self) -> str:
        if self.kind == "frame":
            return f"{self.path} [frame {self.index}]"
        if self.kind == "slice":
            return f"{self.path} [{self.axis_name} slice {self.index}]"
        return str(self.path)

    @property
    def stem(self) -> str:
        """A file-name stem for this picture's overlay: ``<file stem>_frame0003`` / ``_axial0012``."""
        stem = _stem(self.path)
        if self.kind == "frame":
            return f"{stem}_frame{self.index:04d}"
        if self.kind == "slice":
            return f"{stem}_{self.axis_name}{self.index:04d}"
        return stem


class Decoded(NamedTuple):
    """``pixels``: a PIL image (8-bit) or float32 ``(H, W)`` / ``(H, W, 3)`` in ``[0, 1]``;
    ``window``: how stored values became these pixels (e.g. ``DICOM window C=600 W=1600``)."""
    pixels: Image.Image | np.ndarray
    window: str


def _stem(path: Path) -> str:
    name = Path(path).name
    for suffix in (".nii.gz", *NIFTI_SUFFIXES, *DICOM_SUFFIXES):
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return Path(name).stem


def is_nifti(path) -> bool:
    return str(path).lower().endswith(NIFTI_SUFFIXES)


def is_dicom(path) -> bool:
    """A ``.dcm``/``.dicom`` file, or any file with the DICOM preamble's ``DICM`` at byte 128 (series
    exported without suffixes)."""
    path = Path(path)
    if path.suffix.lower() in DICOM_SUFFIXES:
        return True
    try:
        with open(path, "rb") as fh:
            fh.seek(128)
            return fh.read(4) == b"DICM"
    except OSError:
        return False


def _one_line(err) -> str:
    """``err`` (an exception or a text) on one line of at most 300 characters, without the traceback text
    some libraries put into their messages (pydicom's ``With tag ... got exception: ... Traceback``)."""
    text = str(err).split("Traceback (most recent call last)")[0]
    text = " ".join(text.split()) or type(err).__name__
    return text if len(text) <= 300 else text[:297] + "..."


# the libraries whose log records about a damaged file are dropped while adsim reads it: the reason
# reaches the user once, in the UnreadableInput
QUIET_LOGGERS = ("pydicom", "nibabel", "PIL")


class _DropAll(logging.Filter):
    def filter(self, record) -> bool:
        return False


@contextlib.contextmanager
def quiet_readers():
    """While reading: the third-party readers' warnings and log records (:data:`QUIET_LOGGERS` and their
    children) are dropped, PIL's decompression-bomb warning is an error. Restored on exit; other
    loggers and the process's warning filters are left alone."""
    drop = _DropAll()
    manager = logging.Logger.manager
    names = [n for n in list(manager.loggerDict) if n.split(".")[0] in QUIET_LOGGERS]
    loggers = {logging.getLogger(n) for n in (*QUIET_LOGGERS, *names)}
    for lg in loggers:
        lg.addFilter(drop)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the libraries' notes on odd element values; failures raise
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            yield
    finally:
        for lg in loggers:
            lg.removeFilter(drop)


@contextlib.contextmanager
def _reading(path, what):
    """Any failure while reading ``path`` -> one :class:`UnreadableInput` naming it: ``what`` (e.g. "not
    a readable DICOM file") and the library's message, or ``what(exception)`` when it is callable.

    Every exception is caught here, not a list of types: the file's bytes go through pydicom, nibabel,
    PIL and their C decoders, whose exceptions for malformed input are no closed, documented set
    (fuzzing them raised OSError, TypeError, NotImplementedError, OverflowError, SyntaxError, nibabel's
    HeaderDataError and pydicom's BytesLengthException, among others). Whatever goes wrong while
    reading a file is a property of that file."""
    try:
        with quiet_readers():
            yield
    except UnreadableInput as err:
        raise err.naming(path) from None
    except (Image.DecompressionBombWarning, Image.DecompressionBombError) as err:
        raise UnreadableInput(f"decompression bomb: {_one_line(err)}", path) from None
    except MemoryError:
        raise UnreadableInput("reading it needs more memory than is available", path) from None
    except Exception as err:  # noqa: BLE001 -- see the docstring
        raise UnreadableInput(what(err) if callable(what) else f"{what}: {_one_line(err)}", path) from None


# -- listing ---------------------------------------------------------------------------------------------

def resolve_axis(axis, affine=None) -> tuple:
    """``(voxel axis, name)`` of ``axis`` (one of :data:`AXES`, or 0/1/2) for a volume with ``affine``."""
    if isinstance(axis, str) and axis.strip().isdigit():
        axis = int(axis)
    if isinstance(axis, (int, np.integer)) and not isinstance(axis, bool):
        if not 0 <= int(axis) <= 2:
            raise ValueError(f"slice axis must be one of {AXES} or 0, 1, 2; got {axis!r}")
        return int(axis), f"axis{int(axis)}"
    if axis not in AXES:
        raise ValueError(f"slice axis must be one of {AXES} or 0, 1, 2; got {axis!r}")
    fallback = {"sagittal": 0, "coronal": 1, "axial": 2}[axis]
    if affine is None:
        return fallback, axis
    from nibabel.orientations import aff2axcodes  # nibabel: optional reader, loaded with the file

    codes = aff2axcodes(affine)
    hits = [i for i, c in enumerate(codes) if c is not None and c in _AXIS_CODES[axis]]
    return (hits[0] if hits else fallback), axis


def _dicom_header(path: Path):
    import pydicom  # optional reader, loaded for DICOM files only

    return pydicom.dcmread(path, stop_before_pixels=True)


class _Header(NamedTuple):
    """What listing needs of a DICOM header, as plain values (pydicom converts element values lazily, so
    a damaged element fails where it is first used: here, inside :func:`_reading`)."""
    frames: int
    pixels: int  # Rows x Columns x SamplesPerPixel; 0 without Rows/Columns
    description: str
    series: str
    number: str
    instance: float


def _summary(path: Path) -> _Header | None:
    """The header of the DICOM file ``path``, or None when it cannot be read."""
    try:
        with _reading(path, "not a readable DICOM header"):
            ds = _dicom_header(path)
            pixels = (int(ds.get("Rows", 0) or 0) * int(ds.get("Columns", 0) or 0)
                      * int(ds.get("SamplesPerPixel", 1) or 1)) if "Rows" in ds and "Columns" in ds else 0
            return _Header(int(ds.get("NumberOfFrames", 1) or 1), pixels, _description(ds),
                           str(ds.get("SeriesInstanceUID", "") or ""), str(ds.get("SeriesNumber", "") or "").strip(),
                           _instance(ds))
    except UnreadableInput:
        return None


def _description(ds) -> str:
    return " ".join(str(v) for v in (ds.get("Modality", ""), ds.get("SeriesDescription", "")) if str(v).strip())


def expand(path, *, axis="axial") -> list:
    """Items of one file: ``[Path]`` for a plain image, else one :class:`Source` per frame or slice (a
    one-picture DICOM/NIfTI: one ``Source`` of kind ``"image"``). A header that cannot be read leaves one
    item, refused with the reason when it is read; so does a file of more than :data:`MAX_ITEMS` frames
    or slices."""
    path = Path(path)
    resolve_axis(axis)  # a bad axis is the caller's error, whatever the file
    if is_nifti(path):
        return _expand_nifti(path, axis)
    if is_dicom(path):
        header = _summary(path)
        return [Source(path)] if header is None else _expand_dicom(path, header)
    return [path]


def _frame_limit(path: Path) -> int:
    """At most :data:`MAX_ITEMS` pictures per file, and no more than its bytes (each frame or slice is
    stored in at least one byte)."""
    try:
        return min(MAX_ITEMS, path.stat().st_size)
    except OSError:
        return 1


def _expand_dicom(path: Path, h: _Header, volume: str | None = None) -> list:
    if 1 < h.frames <= _frame_limit(path) and h.pixels and h.pixels * h.frames <= MAX_VOXELS:
        return [Source(path, "frame", i, volume=str(path), description=h.description) for i in range(h.frames)]
    return [Source(path, volume=volume, description=h.description)]


def _expand_nifti(path: Path, axis) -> list:
    import nibabel  # optional reader, loaded for NIfTI files only

    try:
        with _reading(path, "not a readable NIfTI header"):
            img = cast("Nifti1Image", nibabel.load(path))  # the header; voxels are read on first access
            shape = tuple(int(n) for n in img.shape)
            ax, name = resolve_axis(axis, img.affine)
    except UnreadableInput:
        return [Source(path)]
    if len(shape) == 4 and shape[3] == 1:
        shape = shape[:3]
    if (len(shape) != 3 or shape[ax] == 1 or int(np.prod(shape)) > MAX_VOXELS
            or shape[ax] > _frame_limit(path)):
        return [Source(path)]  # 2-D: one image; 4-D, others and too large: refused with the reason on reading
    return [Source(path, "slice", k, ax, name, volume=str(path)) for k in range(shape[ax])]


def expand_folder(folder, *, axis="axial") -> list:
    """Items of every regular, non-hidden file of ``folder`` (not recursive) in name order; the
    single-frame DICOM files of one series (Series Instance UID) come together, where the first of them
    is, ordered by Instance Number (then name), and form one volume named ``<folder> [series N]``."""
    folder = Path(folder)
    files = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    headers = {p: _summary(p) for p in files if not is_nifti(p) and is_dicom(p)}
    series: dict[str, list[Path]] = {}
    for p, h in headers.items():
        if h is not None and h.frames == 1 and h.series:
            series.setdefault(h.series, []).append(p)
    read = {p: h for p, h in headers.items() if h is not None}  # a series' files are all here
    items: list[Path | Source] = []
    done: set[Path] = set()
    for p in files:
        if p in done:
            continue
        if p not in headers:  # not a DICOM file
            items += expand(p, axis=axis)
        elif (h := headers[p]) is None:
            items.append(Source(p))
        else:
            group = series.get(h.series, [p]) if h.series else [p]
            if len(group) > 1:
                volume = f"{folder} [series {h.number or h.series}]"
                order = sorted(group, key=lambda q: (read[q].instance, q.name))
                items += [_expand_dicom(q, read[q], volume)[0] for q in order]
                done.update(group)
            else:
                items += _expand_dicom(p, h)
    return items


def _instance(ds) -> float:
    try:
        return float(ds.get("InstanceNumber"))
    except (TypeError, ValueError):
        return float("inf")


# -- reading ---------------------------------------------------------------------------------------------

def decode(src) -> Decoded:
    """The picture of ``src`` (a path, a :class:`Source` or an open PIL image) and its window. A DICOM
    multi-frame file or a 3-D NIfTI given as a plain path is refused (list it with :func:`expand`: one
    item per frame or slice). Any failure -> one :class:`UnreadableInput` naming the file and the reason;
    no other exception comes out of a file's content."""
    if isinstance(src, Image.Image):
        with _reading(None, "not a readable image"):
            return decode_pil(src)
    if not isinstance(src, Source):
        path = Path(src)
        if is_nifti(path) or is_dicom(path):
            items = expand(path)
            if len(items) != 1:
                raise UnreadableInput(f"{len(items)} pictures ({items[0].kind}s) in one file: list it with "
                                      "adsim.data.images.image_items (one item per frame or slice)", path)
            src = items[0]
        else:
            return _decode_file(path)
    if is_nifti(src.path):
        return _nifti(src)
    return _dicom(src)


def _decode_file(path: Path) -> Decoded:
    # PIL warns about a decompression bomb before it raises; either way it is refused (_reading). The
    # reason is PIL's error as it names itself, e.g. "UnidentifiedImageError: cannot identify image file"
    with _reading(path, lambda err: f"{type(err).__name__}: {_one_line(err)}"), Image.open(path) as im:
        _check_pixels(im.size[0] * im.size[1], f"{im.size[0]} x {im.size[1]}")
        im.load()
        decoded = decode_pil(im)
        # the 8-bit image outlives the open file (closing it frees the image's memory)
        return decoded._replace(pixels=im.copy()) if decoded.pixels is im else decoded


def _remember_failure(read):
    """``read(path, mtime_ns, size)`` keeping its last outcome, result or :class:`UnreadableInput`
    (``functools.lru_cache`` of one): the frames or slices of one file are read in a row, and a damaged
    file is read once, not once per frame or slice."""
    @functools.lru_cache(maxsize=1)
    def outcome(*key):
        try:
            return read(*key), None
        except UnreadableInput as err:
            return None, err

    @functools.wraps(read)
    def cached(*key):
        value, err = outcome(*key)
        if err is not None:
            raise UnreadableInput(err.reason, err.path)
        return value

    cached.cache_clear = outcome.cache_clear
    return cached


def _check_pixels(n: int, what: str, limit: int = MAX_PIXELS, unit: str = "pixels") -> None:
    if n > limit:
        raise UnreadableInput(f"{what} = {n} {unit}, above the limit of {limit} "
                              f"(adsim.data.medical.MAX_{unit.upper()})")


def window_to_unit(values: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """``(values - lo) / (hi - lo)`` clipped to ``[0, 1]`` in float32 (all zero when ``hi <= lo``)."""
    if not hi > lo:
        return np.zeros(values.shape, dtype=np.float32)
    return np.clip((np.asarray(values, dtype=np.float64) - lo) / (hi - lo), 0.0, 1.0).astype(np.float32)


def percentile_window(values: np.ndarray) -> tuple:
    """``(lo, hi, text)``: the :data:`PERCENTILES` of the finite ``values``."""
    finite = np.asarray(values)[np.isfinite(values)]
    if finite.size == 0:
        raise UnreadableInput("no finite pixel value")
    lo, hi = (float(v) for v in np.percentile(finite, PERCENTILES))
    return lo, hi, f"percentile {PERCENTILES[0]:g}-{PERCENTILES[1]:g} [{lo:.6g}, {hi:.6g}]"


def decode_pil(im: Image.Image) -> Decoded:
    """An 8-bit image as it is; 16-bit grey scaled by 65535; other deep modes by the percentile window."""
    _check_pixels(im.size[0] * im.size[1], f"{im.size[0]} x {im.size[1]}")
    if im.mode.startswith("I;16") or im.mode in ("I", "F"):
        a = np.asarray(im)
        if a.dtype.kind in "ui" and (a.size == 0 or (a.min() >= 0 and a.max() <= 65535)):
            return Decoded(window_to_unit(a, 0.0, 65535.0), "16-bit full range [0, 65535]")
        lo, hi, text = percentile_window(a)
        return Decoded(window_to_unit(a, lo, hi), text)
    return Decoded(im, EIGHT_BIT)


def _finite(values: np.ndarray, lo: float, text: str) -> tuple:
    bad = ~np.isfinite(values)
    if bad.any():
        values = np.where(bad, lo, values)
        text += f"; {int(bad.sum())} non-finite values set to {lo:.6g}"
    return values, text


# -- DICOM -----------------------------------------------------------------------------------------------

def _dicom(src: Source) -> Decoded:
    with _reading(src.path, "not a readable DICOM file"):
        ds = _dicom_header(src.path)
        if "Rows" not in ds or "Columns" not in ds:
            sop = ds.get("SOPClassUID")
            what = getattr(sop, "name", None) or str(sop or "unknown SOP class")
            raise UnreadableInput(f"no pixel data: a DICOM {what} object, not an image")
        try:
            rows, cols = int(ds.Rows), int(ds.Columns)
            frames = int(ds.get("NumberOfFrames", 1) or 1)
            samples = int(ds.get("SamplesPerPixel", 1) or 1)
        except Exception as err:  # noqa: BLE001 -- any damaged value: the reason names the header
            raise UnreadableInput(f"DICOM header without a usable image size: {_one_line(err)}") from None
        _check_pixels(rows * cols, f"{rows} x {cols}")
        _check_pixels(rows * cols * frames * samples, f"{rows} x {cols} x {frames} frames x {samples} samples",
                      MAX_VOXELS, "voxels")
        if frames > 1 and src.index is None:
            raise UnreadableInput(f"{frames} frames in one file: list it with adsim.data.images.image_items "
                                  "(one item per frame)")
        stat = src.path.stat()
    file = _dicom_file(str(src.path), stat.st_mtime_ns, stat.st_size)
    with _reading(src.path, "DICOM pixel data cannot be decoded"):
        return _dicom_picture(file, src.index)


def _decoder_reason(ds, err) -> str:
    """Why pixel data did not decode: no installed decoder for its transfer syntax, or damaged data."""
    text = _one_line(err)
    try:
        from pydicom.pixels import get_decoder

        syntax = ds.file_meta.TransferSyntaxUID
        missing = syntax.is_compressed and not get_decoder(syntax).is_available
    except Exception:  # noqa: BLE001 -- no usable transfer syntax: the data's own error says enough
        missing = False
    if missing:
        return (f"compressed as {syntax.name} and no installed decoder reads it (pydicom: {text}); "
                "pip install pylibjpeg pylibjpeg-libjpeg pylibjpeg-openjpeg, or gdcm")
    return f"DICOM pixel data cannot be decoded: {text}"


def has_voi(ds) -> bool:
    """Whether ``ds`` has a VOI LUT Sequence or a Window Center and Width."""
    return "VOILUTSequence" in ds or ("WindowCenter" in ds and "WindowWidth" in ds)


def dicom_window(ds, dtype) -> tuple:
    """``(lo, hi, text)`` of the file's first VOI window or VOI LUT: the output range of
    ``apply_voi_lut(apply_modality_lut(x))`` over the stored range of ``dtype`` (BitsStored bits;
    for a linear window, the range PS3.3 C.11.2.1.2 maps the window onto)."""
    from pydicom.pixels import apply_modality_lut, apply_voi_lut

    dtype = np.dtype(dtype)
    bits = int(ds.get("BitsStored", 8 * dtype.itemsize))
    if dtype.kind == "u":
        ends = np.array([0, 2 ** bits - 1], dtype=dtype)
    elif dtype.kind == "i":
        ends = np.array([-(2 ** (bits - 1)), 2 ** (bits - 1) - 1], dtype=dtype)
    else:
        raise UnreadableInput(f"a VOI window on float pixel data ({dtype}) is not supported")
    y = apply_voi_lut(apply_modality_lut(ends, ds), ds)
    lo, hi = float(np.min(y)), float(np.max(y))
    if "VOILUTSequence" in ds:
        return lo, hi, "DICOM VOI LUT"

    def first(v):
        return float(v[0] if isinstance(v, (list, tuple)) or type(v).__name__ == "MultiValue" else v)

    function = str(ds.get("VOILUTFunction", "LINEAR")).strip() or "LINEAR"
    return lo, hi, f"DICOM window C={first(ds.WindowCenter):g} W={first(ds.WindowWidth):g}" + (
        "" if function == "LINEAR" else f" {function}")


@_remember_failure
def _dicom_file(path: str, mtime_ns: int, size: int) -> tuple:
    """``(ds, stored pixels, photometric, (lo, hi, text), modality values or None)`` of the last file read:
    every frame is decoded once (the frames of one file are read in a row). Monochrome files without a
    VOI keep their modality values (float32) and the percentile window of all frames."""
    import pydicom

    with _reading(path, "not a readable DICOM file"):
        ds = pydicom.dcmread(path)
    with _reading(path, lambda err: _decoder_reason(ds, err)):
        return _dicom_pixels(ds)


def _dicom_pixels(ds) -> tuple:
    from pydicom.pixels import apply_color_lut, apply_modality_lut

    stored = ds.pixel_array
    photometric = str(ds.get("PhotometricInterpretation", "MONOCHROME2")).strip()
    if photometric not in ("MONOCHROME1", "MONOCHROME2"):
        if photometric == "PALETTE COLOR":
            stored = apply_color_lut(stored, ds)
            depth = 16 if stored.dtype.itemsize > 1 else 8
        else:
            depth = int(ds.get("BitsStored", 8 * stored.dtype.itemsize))
        if stored.shape[-1] != 3:
            raise UnreadableInput(f"{photometric} pixel data of shape {stored.shape}, not (..., rows, columns, 3)")
        top = float(2 ** depth - 1)
        return ds, stored, photometric, (0.0, top, f"{photometric} {depth}-bit [0, {top:g}]"), None
    if has_voi(ds):
        return ds, stored, photometric, dicom_window(ds, stored.dtype), None
    values = np.asarray(apply_modality_lut(stored, ds), dtype=np.float32)
    lo, hi, text = percentile_window(values)
    values, text = _finite(values, lo, text)
    return ds, stored, photometric, (lo, hi, text), values


def _dicom_picture(file: tuple, index) -> Decoded:
    from pydicom.pixels import apply_modality_lut, apply_voi_lut

    ds, stored, photometric, (lo, hi, text), values = file
    pick = (lambda a: a) if index is None else (lambda a: a[index])
    if photometric not in ("MONOCHROME1", "MONOCHROME2"):
        return Decoded(window_to_unit(pick(stored), lo, hi), text)
    if values is not None:
        out = window_to_unit(pick(values), lo, hi)
    else:  # the standard's order: stored values -> modality LUT -> VOI
        out = window_to_unit(apply_voi_lut(apply_modality_lut(pick(stored), ds), ds), lo, hi)
    if photometric == "MONOCHROME1":
        out = 1.0 - out
        text += "; MONOCHROME1 inverted"
    return Decoded(out, text)


# -- NIfTI -----------------------------------------------------------------------------------------------

def _nifti(src: Source) -> Decoded:
    import nibabel

    with _reading(src.path, "not a readable NIfTI file"):
        img = cast("Nifti1Image", nibabel.load(src.path))
        shape = tuple(int(n) for n in img.shape)
        if len(shape) == 4 and shape[3] == 1:
            shape = shape[:3]
        if len(shape) not in (2, 3):
            raise UnreadableInput(f"{len(shape)}-D NIfTI of shape {shape} (a time series or several volumes): "
                                  "adsim scores one 3-D volume per file; pick one first, e.g. "
                                  "nibabel.funcs.four_to_three")
        _check_pixels(int(np.prod(shape)), " x ".join(map(str, shape)), MAX_VOXELS, "voxels")
        stat = src.path.stat()
    volume, (lo, hi, text) = _nifti_volume(str(src.path), stat.st_mtime_ns, stat.st_size)
    with _reading(src.path, "NIfTI voxel data do not fit its header"):
        volume = volume.reshape(shape)
        if src.kind == "slice":
            if src.index is None or src.axis is None:
                raise UnreadableInput(f"a slice Source needs its index and axis, got index={src.index!r}, "
                                      f"axis={src.axis!r}")
            picture = np.take(volume, src.index, axis=src.axis)
        else:
            picture = volume.reshape([n for n in shape if n != 1] or [1])
            if picture.ndim != 2:
                raise UnreadableInput(f"NIfTI of shape {shape} is not one 2-D picture: list it with "
                                      "adsim.data.images.image_items (one item per slice)")
        _check_pixels(picture.size, " x ".join(map(str, picture.shape)))
        return Decoded(window_to_unit(np.ascontiguousarray(picture.T[::-1]), lo, hi), text)


@_remember_failure
def _nifti_volume(path: str, mtime_ns: int, size: int) -> tuple:
    # the last volume read, whole (its slices are read in a row; a .nii.gz is decompressed once)
    import nibabel

    with _reading(path, "NIfTI voxel data cannot be read (truncated or corrupt?)"):
        img = cast("Nifti1Image", nibabel.load(path))
        volume = np.asarray(img.dataobj, dtype=np.float32)
        cal_min, cal_max = float(img.header.get("cal_min", 0) or 0), float(img.header.get("cal_max", 0) or 0)
        if math.isfinite(cal_min) and math.isfinite(cal_max) and cal_max > cal_min:
            lo, hi, text = cal_min, cal_max, f"NIfTI cal_min/cal_max [{cal_min:.6g}, {cal_max:.6g}]"
        else:
            lo, hi, text = percentile_window(volume)
        volume, text = _finite(volume, lo, text)
        return volume, (lo, hi, text)
