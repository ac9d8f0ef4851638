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
from the header before any pixel is decoded (PIL's ``MAX_IMAGE_PIXELS`` idea, for every format); a
larger input is refused. Non-finite voxels (NaN backgrounds of processed NIfTI maps) are set to the
window's low end, and the window text says how many there were. Every failure is an
:class:`UnreadableInput` (a ``ValueError``) whose message says why in one line.
"""
from __future__ import annotations

import functools
import struct
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
from PIL import Image

MAX_PIXELS = 2 ** 26   # PIL's own bomb limit is about 89 M pixels
"""Largest 2-D picture read (8192 x 8192 pixels); a larger one is refused as unreadable."""
MAX_VOXELS = 2 ** 28
"""Largest volume or multi-frame file read (1 GiB as float32, e.g. 512 x 512 x 1024 voxels)."""
PERCENTILES = (0.5, 99.5)
AXES = ("axial", "coronal", "sagittal")
_AXIS_CODES = {"axial": "SI", "coronal": "AP", "sagittal": "LR"}
DICOM_SUFFIXES = (".dcm", ".dicom")
NIFTI_SUFFIXES = (".nii", ".nii.gz")
EIGHT_BIT = "8-bit [0, 255]"


class UnreadableInput(ValueError):
    """A file that cannot be read as an image (the message says why, in one line)."""


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
    pixels: object
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


# what the DICOM and NIfTI libraries raise for a file that is not (all) there, in a form they do not
# know, or compressed without a decoder (pydicom: RuntimeError; missing elements: AttributeError)
_READ_ERRORS = (OSError, EOFError, ValueError, TypeError, KeyError, AttributeError, IndexError, RuntimeError,
                NotImplementedError, zlib.error, struct.error)


def _library_errors() -> tuple:
    # pydicom and nibabel are the adsim extra's optional readers: imported where a file needs them
    from nibabel.filebasedimages import ImageFileError
    from pydicom.errors import InvalidDicomError

    return (*_READ_ERRORS, InvalidDicomError, ImageFileError)


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= 300 else text[:297] + "..."


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

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pydicom's notes on odd element values; failures raise
        return pydicom.dcmread(path, stop_before_pixels=True)


def _description(ds) -> str:
    return " ".join(str(v) for v in (ds.get("Modality", ""), ds.get("SeriesDescription", "")) if str(v).strip())


def expand(path, *, axis="axial") -> list:
    """Items of one file: ``[Path]`` for a plain image, else one :class:`Source` per frame or slice (a
    one-picture DICOM/NIfTI: one ``Source`` of kind ``"image"``). A header that cannot be read leaves one
    item, refused with the reason when it is read."""
    path = Path(path)
    resolve_axis(axis)  # a bad axis is the caller's error, whatever the file
    if is_nifti(path):
        return _expand_nifti(path, axis)
    if is_dicom(path):
        try:
            ds = _dicom_header(path)
        except _library_errors():
            return [Source(path)]
        return _expand_dicom(path, ds)
    return [path]


def _expand_dicom(path: Path, ds, volume: str | None = None) -> list:
    frames = int(ds.get("NumberOfFrames", 1) or 1)
    desc = _description(ds)
    size = int(ds.get("Rows", 0) or 0) * int(ds.get("Columns", 0) or 0) * int(ds.get("SamplesPerPixel", 1) or 1)
    if frames > 1 and "Rows" in ds and size * frames <= MAX_VOXELS:
        return [Source(path, "frame", i, volume=str(path), description=desc) for i in range(frames)]
    return [Source(path, volume=volume, description=desc)]


def _expand_nifti(path: Path, axis) -> list:
    import nibabel  # optional reader, loaded for NIfTI files only

    try:
        img = nibabel.load(path)  # the header; voxels are read on first access
        shape = img.shape
        ax, name = resolve_axis(axis, img.affine)
    except _library_errors():
        return [Source(path)]
    if len(shape) == 4 and shape[3] == 1:
        shape = shape[:3]
    if len(shape) != 3 or shape[ax] == 1 or int(np.prod(shape)) > MAX_VOXELS:
        return [Source(path)]  # 2-D: one image; 4-D, others and too large: refused with the reason on reading
    return [Source(path, "slice", k, ax, name, volume=str(path)) for k in range(shape[ax])]


def expand_folder(folder, *, axis="axial") -> list:
    """Items of every regular, non-hidden file of ``folder`` (not recursive) in name order; the
    single-frame DICOM files of one series (Series Instance UID) come together, where the first of them
    is, ordered by Instance Number (then name), and form one volume named ``<folder> [series N]``."""
    folder = Path(folder)
    files = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    headers = {}
    for p in files:
        if not is_nifti(p) and is_dicom(p):
            try:
                headers[p] = _dicom_header(p)
            except _library_errors():
                headers[p] = None
    series = {}
    for p, ds in headers.items():
        if ds is not None and int(ds.get("NumberOfFrames", 1) or 1) == 1 and ds.get("SeriesInstanceUID"):
            series.setdefault(str(ds.SeriesInstanceUID), []).append(p)
    items, done = [], set()
    for p in files:
        if p in done:
            continue
        ds = headers.get(p, False)
        if ds is False:
            items += expand(p, axis=axis)
        elif ds is None:
            items.append(Source(p))
        else:
            group = series.get(str(ds.get("SeriesInstanceUID", "")), [p])
            if len(group) > 1:
                number = ds.get("SeriesNumber", "")
                volume = f"{folder} [series {number if str(number).strip() else ds.SeriesInstanceUID}]"
                order = sorted(group, key=lambda q: (_instance(headers[q]), q.name))
                items += [_expand_dicom(q, headers[q], volume)[0] for q in order]
                done.update(group)
            else:
                items += _expand_dicom(p, ds)
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
    item per frame or slice). Any failure -> :class:`UnreadableInput` with the reason."""
    if isinstance(src, Image.Image):
        return decode_pil(src)
    if not isinstance(src, Source):
        path = Path(src)
        if is_nifti(path) or is_dicom(path):
            items = expand(path)
            if len(items) != 1:
                raise UnreadableInput(f"{len(items)} pictures ({items[0].kind}s) in one file: list it with "
                                      "adsim.data.images.image_items (one item per frame or slice)")
            src = items[0]
        else:
            return _decode_file(path)
    if is_nifti(src.path):
        return _nifti(src)
    return _dicom(src)


def _decode_file(path: Path) -> Decoded:
    try:
        with warnings.catch_warnings():
            # PIL warns about a decompression bomb before it raises; either way it is refused here
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as im:
                _check_pixels(im.size[0] * im.size[1], f"{im.size[0]} x {im.size[1]}")
                im.load()
                decoded = decode_pil(im)
                # the 8-bit image outlives the open file (closing it frees the image's memory)
                return decoded._replace(pixels=im.copy()) if decoded.pixels is im else decoded
    except (Image.DecompressionBombWarning, Image.DecompressionBombError) as err:
        raise UnreadableInput(f"decompression bomb: {_one_line(err)}") from None


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
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pydicom's notes on odd element values; failures raise
        try:
            ds = _dicom_header(src.path)
        except _library_errors() as err:
            raise UnreadableInput(f"not a readable DICOM file: {_one_line(err)}") from None
        if "Rows" not in ds or "Columns" not in ds:
            sop = ds.get("SOPClassUID")
            what = getattr(sop, "name", None) or str(sop or "unknown SOP class")
            raise UnreadableInput(f"no pixel data: a DICOM {what} object, not an image")
        try:
            rows, cols = int(ds.Rows), int(ds.Columns)
            frames = int(ds.get("NumberOfFrames", 1) or 1)
            samples = int(ds.get("SamplesPerPixel", 1) or 1)
        except _library_errors() as err:
            raise UnreadableInput(f"DICOM header without a usable image size: {_one_line(err)}") from None
        _check_pixels(rows * cols, f"{rows} x {cols}")
        _check_pixels(rows * cols * frames * samples, f"{rows} x {cols} x {frames} frames x {samples} samples",
                      MAX_VOXELS, "voxels")
        if frames > 1 and src.index is None:
            raise UnreadableInput(f"{frames} frames in one file: list it with adsim.data.images.image_items "
                                  "(one item per frame)")
        stat = src.path.stat()
        try:
            return _dicom_picture(_dicom_file(str(src.path), stat.st_mtime_ns, stat.st_size), src.index)
        except UnreadableInput:
            raise
        except _library_errors() as err:
            raise UnreadableInput(_decoder_reason(ds, err)) from None


def _decoder_reason(ds, err) -> str:
    syntax = getattr(getattr(ds, "file_meta", None), "TransferSyntaxUID", None)
    text = _one_line(err)
    if syntax is not None and syntax.is_compressed and ("missing dependencies" in text or "plugin" in text
                                                        or "support" in text):
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


@functools.lru_cache(maxsize=1)
def _dicom_file(path: str, mtime_ns: int, size: int) -> tuple:
    """``(ds, stored pixels, photometric, (lo, hi, text), modality values or None)`` of the last file read:
    every frame is decoded once (the frames of one file are read in a row). Monochrome files without a
    VOI keep their modality values (float32) and the percentile window of all frames."""
    import pydicom
    from pydicom.pixels import apply_color_lut, apply_modality_lut

    ds = pydicom.dcmread(path)
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

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nibabel's notes on odd headers; failures raise
        try:
            img = nibabel.load(src.path)
            shape = tuple(int(n) for n in img.shape)
        except _library_errors() as err:
            raise UnreadableInput(f"not a readable NIfTI file: {_one_line(err)}") from None
        if len(shape) == 4 and shape[3] == 1:
            shape = shape[:3]
        if len(shape) not in (2, 3):
            raise UnreadableInput(f"{len(shape)}-D NIfTI of shape {shape} (a time series or several volumes): "
                                  "adsim scores one 3-D volume per file; pick one first, e.g. "
                                  "nibabel.funcs.four_to_three")
        _check_pixels(int(np.prod(shape)), " x ".join(map(str, shape)), MAX_VOXELS, "voxels")
        stat = src.path.stat()
        try:
            volume, (lo, hi, text) = _nifti_volume(str(src.path), stat.st_mtime_ns, stat.st_size)
        except UnreadableInput:
            raise
        except _library_errors() as err:
            raise UnreadableInput(f"NIfTI voxel data cannot be read (truncated or corrupt?): {_one_line(err)}") \
                from None
    volume = volume.reshape(shape)
    if src.kind == "slice":
        picture = np.take(volume, src.index, axis=src.axis)
    else:
        picture = volume.reshape([n for n in shape if n != 1] or [1])
        if picture.ndim != 2:
            raise UnreadableInput(f"NIfTI of shape {shape} is not one 2-D picture: list it with "
                                  "adsim.data.images.image_items (one item per slice)")
    _check_pixels(picture.size, " x ".join(map(str, picture.shape)))
    return Decoded(window_to_unit(np.ascontiguousarray(picture.T[::-1]), lo, hi), text)


@functools.lru_cache(maxsize=1)
def _nifti_volume(path: str, mtime_ns: int, size: int) -> tuple:
    # the last volume read, whole (its slices are read in a row; a .nii.gz is decompressed once)
    import nibabel

    img = nibabel.load(path)
    volume = np.asarray(img.dataobj, dtype=np.float32)
    cal_min, cal_max = float(img.header.get("cal_min", 0) or 0), float(img.header.get("cal_max", 0) or 0)
    if cal_max > cal_min:
        lo, hi, text = cal_min, cal_max, f"NIfTI cal_min/cal_max [{cal_min:.6g}, {cal_max:.6g}]"
    else:
        lo, hi, text = percentile_window(volume)
    volume, text = _finite(volume, lo, text)
    return volume, (lo, hi, text)
