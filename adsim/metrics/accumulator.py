"""The field's anomaly-detection metrics, accumulated batch by batch: image AUROC / AP / F1-max and,
with masks, pixel AUROC / AP / F1-max and AUPRO (all in percent).

:class:`Accumulator` is fed ``update(scores, labels, maps, masks)`` one batch at a time and
``compute()`` returns the metrics. Memory:

* **image level, exact**: the ``n`` image scores and labels are kept (small) and the metrics are
  ``sklearn.metrics.roc_auc_score`` / ``average_precision_score`` / ``precision_recall_curve``
  (F1-max = the largest ``2PR / (P + R)`` over its thresholds).
* **pixel level, binned, O(bins + 1) memory** whatever the number of images: three histograms over
  one grid of ``bins`` score bins -- counts of normal pixels (mask 0), counts of anomalous pixels
  (mask 1) and, for AUPRO, anomalous pixels weighted by ``1 / size of their ground-truth region``.
  A full BMAD test split (e.g. 2000 images of 240 x 240 = 115 M pixels) is never held at once.

**The grid (the score range is unknown in a stream).** Bin edges are ``k * 2**e`` (``k`` integer):
pixel ``x`` falls in bin ``floor(x / 2**e)``, an exact operation in floating point (scaling by a power of
two). The first batch sets ``e`` so that its score range spans about ``bins / 2`` bins, centred in
the window. A later batch outside the window re-centres it when everything still fits in ``bins``
bins, else doubles the bin width (``e += 1``, merging pairs of bins: ``floor(floor(x/w)/2) =
floor(x/2w)``, so no pixel changes side of any remaining edge) until it fits. Counts are never lost
or approximated; only the *resolution* is finite: the final bin width is at most about ``4 R / bins``
for a score range ``R`` (reported as ``pixel_bin_width``). Scores may be any finite reals (logits).
Accumulators of separate shards (e.g. torchrun ranks) combine with :meth:`Accumulator.merge`: both
move to the coarser of their grids by the same exact merging of bins.

**Approximation and its error bound.** Pixel metrics are computed *exactly for the binned scores*,
i.e. with the thresholds restricted to the bin edges: the binned AUROC counts every (anomalous, normal)
pixel pair in one bin as a tie (1/2); AP, F1-max and the PRO curve are evaluated at the bin edges.
``compute()["pixel_error_bounds"]`` gives, from the histograms, a rigorous bound (percentage points)
on the distance to the exact value over the raw scores (as sklearn / the MVTec code compute it):

* AUROC: ``|binned - exact| <= 1/2 sum_b p_b q_b`` (``p_b``, ``q_b``: fractions of anomalous / normal
  pixels in bin ``b``; only same-bin pairs are mis-ordered, each by at most 1/2).
* AP = ``sum_b dR_b P(edge_b)``; inside bin ``b`` every step of the exact sum (a threshold where
  recall grows, so by at least one pixel) has precision in ``[(TP_{b+1} + 1) / (TP_{b+1} + 1 + FP_b),
  TP_b / (TP_b + FP_{b+1})]`` (``TP_b``, ``FP_b``: pixel counts at or above edge ``b``), and so has
  ``P(edge_b)``: ``|binned - exact| <= sum_b dR_b (Pmax_b - Pmin_b)``.
* F1-max: binned <= exact <= ``max_b 2 TP_b / (TP_b + FP_{b+1} + N_anomalous)``; the bound is that
  maximum minus the binned value.
* AUPRO: between consecutive edges both the exact (piecewise-linear) PRO curve and the binned chord lie
  in the box ``[F_{b+1}, F_b] x [PRO_{b+1}, PRO_b]``, so the area differs by at most
  ``sum_b (min(F_b, L) - F_{b+1})^+ (PRO_b - PRO_{b+1}) / L``.

With the default ``2**16`` bins the bounds are ~1e-3 percentage points on smooth maps
(``tests/adsim/test_adsim_metrics.py`` checks binned vs exact on random data within them).

**AUPRO** (Bergmann, Batzner, Fauser, Sattlegger, Steger, "The MVTec Anomaly Detection Dataset: A
Comprehensive Real-World Dataset for Unsupervised Anomaly Detection", IJCV 129:1038-1059, 2021 -- the
journal version of the CVPR 2019 MVTec AD paper -- and its public evaluation code; the PRO measure also
in Bergmann et al., "Uninformed Students", CVPR 2020): the ground-truth regions are the 8-connected components of each image's mask (``scipy.ndimage.label``, a
3 x 3 structure as in the MVTec evaluation code); at a threshold ``t`` the per-region overlap of region
``C`` is ``|{x in C : s(x) >= t}| / |C|``, PRO(t) is its mean over all regions of all images and FPR(t)
is the fraction of all normal pixels (mask 0, of every image) with ``s >= t``. AUPRO is the area under
PRO over FPR from (0, 0) up to FPR = ``fpr_limit`` (default 0.3; linear interpolation at the limit),
divided by ``fpr_limit``. Hand-written because neither sklearn nor scipy provides it and the library
that does (anomalib) brings ~30 packages (lightning, opencv); its per-region weighting makes it a
weighted histogram, so it streams like the rest.
"""
from __future__ import annotations

import itertools
import math
import numbers

import numpy as np
from scipy.integrate import trapezoid
from scipy.ndimage import label
from sklearn.metrics import average_precision_score, precision_recall_curve, roc_auc_score

from adsim.metrics.functional import smooth

DEFAULT_BINS = 1 << 16
"""Score-histogram bins of the streaming pixel metrics (:class:`Accumulator`)."""
FPR_LIMIT = 0.3
"""False-positive rate up to which AUPRO integrates the per-region overlap."""
# 8-connectivity inside each image, none across the batch axis: one label() call per batch
_REGIONS = np.zeros((3, 3, 3), dtype=int)
_REGIONS[1] = 1


def _finite(name: str, x) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype == bool or not np.issubdtype(x.dtype, np.number):
        raise TypeError(f"{name} must be a real-valued array, got dtype {x.dtype}")
    if np.iscomplexobj(x):
        raise TypeError(f"{name} must be real-valued, got dtype {x.dtype}")
    if not np.isfinite(x).all():
        bad = "NaN" if np.isnan(x).any() else "inf"
        raise ValueError(f"{name} contains {bad} values: scores must be finite reals")
    return x


def _binary(name: str, x, shape) -> np.ndarray:
    x = np.asarray(x)
    if x.shape != shape:
        raise ValueError(f"{name} must have shape {shape}, got {x.shape}")
    if x.dtype != bool:
        if not np.issubdtype(x.dtype, np.number) or not np.isin(x, (0, 1)).all():
            raise ValueError(f"{name} must be binary (bool or 0/1), got values other than 0 and 1")
        x = x.astype(bool)
    return x


def _percent(x: float) -> float:
    return 100.0 * float(x)


def _f1max(precision: np.ndarray, recall: np.ndarray) -> float:
    denom = precision + recall
    f1 = np.divide(2 * precision * recall, denom, out=np.zeros_like(denom, dtype=float), where=denom > 0)
    return float(f1.max())


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    num, den = np.asarray(num, float), np.asarray(den, float)
    return np.divide(num, den, out=np.zeros_like(den), where=den > 0)


def area_to(x: np.ndarray, y: np.ndarray, limit: float) -> float:
    """Area under the piecewise-linear curve through ``(x, y)`` (``x`` non-decreasing) from ``x[0]``
    to ``limit``, interpolating linearly at ``limit`` (as the MVTec AD evaluation's ``trapezoid``)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    k = int(np.searchsorted(x, limit, side="right"))  # x[:k] <= limit < x[k:]
    area = float(trapezoid(y[:k], x[:k])) if k > 1 else 0.0
    if 0 < k < len(x) and x[k] > x[k - 1]:
        y_lim = y[k - 1] + (y[k] - y[k - 1]) * (limit - x[k - 1]) / (x[k] - x[k - 1])
        area += 0.5 * (y[k - 1] + y_lim) * (limit - x[k - 1])
    return area


class _Histograms:
    """Three histograms on the adaptive power-of-two grid described in the module docstring.
    ``neg``/``pos``: counts of normal / anomalous pixels per bin (int64, ``(bins,)``); ``pro``: sum of
    ``1 / region size`` over the anomalous pixels of each bin (float64). Bin ``i`` holds the scores
    in ``[(k0 + i) 2**e, (k0 + i + 1) 2**e)``."""

    def __init__(self, bins: int):
        self.bins = bins
        self.e: int | None = None
        self.k0 = 0
        self.lo = self.hi = 0  # occupied key range (Python ints, exact)
        self.neg = np.zeros(bins, np.int64)
        self.pos = np.zeros(bins, np.int64)
        self.pro = np.zeros(bins, np.float64)

    def _exponent(self) -> int:
        """The grid's ``e`` (set by the first data)."""
        if self.e is None:
            raise ValueError("no scores were added: the histograms have no grid yet")
        return self.e

    def _key(self, x: float, e: int) -> int:
        return math.floor(math.ldexp(x, -e))

    def _fit(self, xmin: float, xmax: float) -> None:
        """Make the window cover ``[xmin, xmax]`` and everything seen so far."""
        B = self.bins
        if self.e is None:  # first data: the batch's range spans ~bins/2 bins
            mag = max(abs(xmin), abs(xmax))
            e = math.frexp(mag)[1] - 40 if mag > 0 else -200  # keys stay < 2**41 in magnitude
            if xmax > xmin:
                e = max(e, math.ceil(math.log2((xmax - xmin) / (B // 2))))
            self.e = max(e, -200)
            self.lo, self.hi = self._key(xmin, self.e), self._key(xmax, self.e)
            self.k0 = self.lo - (B - (self.hi - self.lo + 1)) // 2
            return
        self._cover(self.e, min(self.lo, self._key(xmin, self.e)), max(self.hi, self._key(xmax, self.e)))

    def _cover(self, e: int, lo: int, hi: int) -> None:
        """Re-grid to cover the keys ``[lo, hi]`` at exponent ``e >= self.e`` (and what is held), doubling
        the bin width as needed; the histograms move with the grid."""
        B = self.bins
        d = 0  # doublings of the bin width; Python's >> on ints is floor division by 2**d
        while (hi >> d) - (lo >> d) + 1 > B or max(abs(lo >> d), abs(hi >> d)) >= 1 << 62:
            d += 1
        e, lo, hi = e + d, lo >> d, hi >> d
        if e == self.e and self.k0 <= lo and hi < self.k0 + B:
            self.lo, self.hi = lo, hi
            return
        k0 = lo - (B - (hi - lo + 1)) // 2
        self.neg, self.pos, self.pro = self._moved(e, k0)
        self.e, self.k0, self.lo, self.hi = e, k0, lo, hi

    def _moved(self, e: int, k0: int) -> tuple:
        """``(neg, pos, pro)`` re-binned onto the grid ``(e >= self.e, k0)`` (which must cover them)."""
        B, d = self.bins, e - self._exponent()
        old = np.flatnonzero((self.neg > 0) | (self.pos > 0))
        idx = ((old + np.int64(self.k0)) >> d) - np.int64(k0)
        neg, pos, pro = (np.zeros(B, np.int64), np.zeros(B, np.int64), np.zeros(B, np.float64))
        np.add.at(neg, idx, self.neg[old])
        np.add.at(pos, idx, self.pos[old])
        np.add.at(pro, idx, self.pro[old])
        return neg, pos, pro

    def absorb(self, other: _Histograms) -> None:
        """Add ``other``'s histograms (same ``bins``) to these, on the coarser of the two grids."""
        if other.e is None:
            return
        if self.e is None:
            self.e, self.k0, self.lo, self.hi = other.e, other.k0, other.lo, other.hi
            self.neg, self.pos, self.pro = other.neg.copy(), other.pos.copy(), other.pro.copy()
            return
        e = max(self.e, other.e)
        lo = min(self.lo >> (e - self.e), other.lo >> (e - other.e))
        hi = max(self.hi >> (e - self.e), other.hi >> (e - other.e))
        self._cover(e, lo, hi)
        neg, pos, pro = other._moved(self.e, self.k0)
        self.neg += neg
        self.pos += pos
        self.pro += pro

    def _index(self, x: np.ndarray) -> np.ndarray:
        return (np.floor(np.ldexp(x.astype(np.float64), -self._exponent())) - self.k0).astype(np.int64)

    def add(self, normal: np.ndarray, anomalous: np.ndarray, weights: np.ndarray) -> None:
        both = [v for v in (normal, anomalous) if v.size]
        if not both:
            return
        self._fit(float(min(v.min() for v in both)), float(max(v.max() for v in both)))
        B = self.bins
        if normal.size:
            self.neg += np.bincount(self._index(normal), minlength=B)
        if anomalous.size:
            i = self._index(anomalous)
            self.pos += np.bincount(i, minlength=B)
            self.pro += np.bincount(i, weights=weights, minlength=B)

    @property
    def width(self) -> float:
        return math.ldexp(1.0, self._exponent())


class Accumulator:
    """Streaming image (and pixel) anomaly-detection metrics, in percent; see the module docstring.

    ``Accumulator(pixel, bins=2**16, fpr_limit=0.3)``; ``update(scores (B,), labels (B,), maps (B, H, W),
    masks (B, H, W) bool)`` per batch (maps and masks only, and always, when ``pixel``); ``merge(other)``
    adds another accumulator's images (a shard); ``compute()``
    -> dict with ``image_auroc``, ``image_ap``, ``image_f1max``, ``n_images``, ``n_anomalous`` and, when
    ``pixel``, ``pixel_auroc``, ``pixel_ap``, ``pixel_f1max``, ``aupro``, ``aupro_fpr_limit``,
    ``n_regions``, ``pixel_bins``, ``pixel_bin_width`` and ``pixel_error_bounds`` (a dict of bounds in
    percentage points on the distance of each pixel metric to its exact value). Higher scores = more
    anomalous."""

    pixel: bool
    """Whether pixel maps and masks are accumulated (and pixel metrics computed)."""
    bins: int
    """Bins of each pixel histogram."""
    fpr_limit: float
    """The false-positive-rate limit of ``aupro``."""

    def __init__(self, pixel: bool, bins: int = DEFAULT_BINS, fpr_limit: float = FPR_LIMIT):
        if not isinstance(pixel, (bool, np.bool_)):
            raise TypeError(f"pixel must be True or False, got {pixel!r}")
        if isinstance(bins, bool) or not isinstance(bins, numbers.Integral) or not 16 <= bins <= 1 << 24:
            raise ValueError(f"bins must be an integer in [16, 2**24], got {bins!r}")
        if (isinstance(fpr_limit, bool) or not isinstance(fpr_limit, numbers.Real)
                or not math.isfinite(fpr_limit) or not 0 < fpr_limit <= 1):
            raise ValueError(f"fpr_limit must be a number with 0 < fpr_limit <= 1, got {fpr_limit!r}")
        self.pixel, self.bins, self.fpr_limit = bool(pixel), int(bins), float(fpr_limit)
        self._scores: list[np.ndarray] = []
        self._labels: list[np.ndarray] = []
        self._hist: _Histograms | None = _Histograms(self.bins) if self.pixel else None
        self._regions: int = 0  # anomalous regions of the masks so far

    def _histograms(self) -> _Histograms:
        """The pixel histograms (held with ``pixel=True`` only)."""
        if self._hist is None:
            raise ValueError("an Accumulator(pixel=False) holds no pixel histograms")
        return self._hist

    def update(self, scores, labels, maps=None, masks=None) -> Accumulator:
        """Add one batch: ``scores (B,)`` and ``labels (B,)`` (0 normal, 1 anomalous); with ``pixel``,
        ``maps (B, H, W)`` (real scores) and ``masks (B, H, W)`` (bool or 0/1 ground truth)."""
        scores = _finite("scores", scores)
        if scores.ndim != 1:
            raise ValueError(f"scores must have shape (B,), got {scores.shape}")
        labels = _binary("labels", labels, scores.shape)
        if not self.pixel:
            if maps is not None or masks is not None:
                raise ValueError("maps/masks given to an Accumulator(pixel=False); use pixel=True")
        else:
            if maps is None or masks is None:
                raise ValueError("Accumulator(pixel=True) needs maps (B, H, W) and masks (B, H, W)")
            maps = _finite("maps", maps)
            if maps.ndim != 3 or maps.shape[0] != scores.shape[0]:
                raise ValueError(f"maps must have shape (B, H, W) with B = {scores.shape[0]}, got {maps.shape}")
            masks = _binary("masks", masks, maps.shape)
            regions, n = label(masks, structure=_REGIONS)
            sizes = np.bincount(regions.ravel())
            anomalous = regions > 0
            self._histograms().add(maps[~masks], maps[anomalous], 1.0 / sizes[regions[anomalous]])
            self._regions += int(n)
        self._scores.append(scores.astype(np.float64))
        self._labels.append(labels)
        return self

    @property
    def scores(self) -> np.ndarray:
        """``(n,)`` every image score added so far, in order."""
        return np.concatenate(self._scores) if self._scores else np.zeros(0)

    def merge(self, other: Accumulator) -> Accumulator:
        """Add everything ``other`` holds (e.g. another process's shard; same ``pixel``, ``bins`` and
        ``fpr_limit``) to this accumulator, in place; ``other``'s images come after this one's. The
        histograms move to the coarser grid of the two (bins merged exactly, as in the module docstring),
        so the result is what feeding all batches to one accumulator would give up to that grid."""
        if not isinstance(other, Accumulator):
            raise TypeError(f"other must be an Accumulator, got {type(other).__name__}")
        if (other.pixel, other.bins, other.fpr_limit) != (self.pixel, self.bins, self.fpr_limit):
            raise ValueError(f"cannot merge Accumulator(pixel={other.pixel}, bins={other.bins}, fpr_limit="
                             f"{other.fpr_limit}) into Accumulator(pixel={self.pixel}, bins={self.bins}, "
                             f"fpr_limit={self.fpr_limit})")
        self._scores += other._scores
        self._labels += other._labels
        if self.pixel:
            self._histograms().absorb(other._histograms())
            self._regions += other._regions
        return self

    def compute(self) -> dict:
        """The metrics of everything added so far (see the class docstring). ValueError when a metric
        is undefined (one class only)."""
        labels = np.concatenate(self._labels) if self._labels else np.zeros(0, bool)
        scores = self.scores
        n_anom = int(labels.sum())
        if n_anom == 0 or n_anom == len(labels):
            raise ValueError(f"image metrics undefined: the labels contain one class only ({len(labels) - n_anom} "
                             f"normal, {n_anom} anomalous images)")
        precision, recall, _ = precision_recall_curve(labels, scores)
        out = {"image_auroc": _percent(roc_auc_score(labels, scores)),
               "image_ap": _percent(average_precision_score(labels, scores)),
               "image_f1max": _percent(_f1max(precision, recall)),
               "n_images": len(labels), "n_anomalous": n_anom}
        if self.pixel:
            out.update(self._pixel_metrics())
        return out

    def _pixel_metrics(self) -> dict:
        h = self._histograms()
        n_neg, n_pos = int(h.neg.sum()), int(h.pos.sum())
        if n_pos == 0 or n_neg == 0:
            raise ValueError(f"pixel metrics undefined: the masks contain {'no anomalous' if n_pos == 0 else 'only'}"
                             f" anomalous pixels ({n_neg} normal, {n_pos} anomalous pixels)")
        used = np.flatnonzero((h.neg > 0) | (h.pos > 0))  # ascending bins = ascending scores
        neg, pos, pro = h.neg[used], h.pos[used], h.pro[used]
        # sklearn on the binned scores: one weighted sample per (bin, class)
        keep = np.concatenate([neg, pos]) > 0
        y = np.repeat([0, 1], len(used))[keep]
        s = np.concatenate([used, used])[keep]
        w = np.concatenate([neg, pos]).astype(float)[keep]
        auroc = roc_auc_score(y, s, sample_weight=w)
        ap = average_precision_score(y, s, sample_weight=w)
        precision, recall, _ = precision_recall_curve(y, s, sample_weight=w)
        f1max = _f1max(precision, recall)
        # counts at or above each edge, from the top bin down: index j = edge of used[::-1][j-1]; j=0: none
        tp = np.concatenate([[0], np.cumsum(pos[::-1])])
        fp = np.concatenate([[0], np.cumsum(neg[::-1])])
        prov = np.concatenate([[0.0], np.cumsum(pro[::-1])]) / self._regions
        fpr = fp / n_neg
        aupro = area_to(fpr, np.minimum(prov, 1.0), self.fpr_limit) / self.fpr_limit
        # error bounds (module docstring); bin j (1..m, top down) lies between edges j-1 (above) and j
        ta, tb, fa, fb = tp[:-1], tp[1:], fp[:-1], fp[1:]  # a: above the bin, b: at its lower edge
        dr = (tb - ta) / n_pos
        p_max, p_min = _ratio(tb, tb + fa), _ratio(ta + 1, ta + 1 + fb)  # a step in the bin adds >= 1 TP
        f1_upper = float((_ratio(2 * tb, tb + fa + n_pos)).max())
        width = np.clip(np.minimum(fpr[1:], self.fpr_limit) - fpr[:-1], 0.0, None)
        bounds = {"pixel_auroc": _percent(0.5 * np.sum((pos / n_pos) * (neg / n_neg))),
                  "pixel_ap": _percent(np.sum(dr * (p_max - p_min))),
                  "pixel_f1max": _percent(max(f1_upper - f1max, 0.0)),
                  "aupro": _percent(np.sum(width * np.diff(prov)) / self.fpr_limit)}
        return {"pixel_auroc": _percent(auroc), "pixel_ap": _percent(ap), "pixel_f1max": _percent(f1max),
                "aupro": _percent(aupro), "aupro_fpr_limit": self.fpr_limit, "n_regions": self._regions,
                "pixel_bins": self.bins, "pixel_bin_width": h.width, "pixel_error_bounds": bounds}


def _chunks(out: dict, chunk: int):
    for i in range(0, len(out["scores"]), chunk):
        yield {k: (None if v is None else v[i:i + chunk]) for k, v in out.items()
               if k in ("scores", "labels", "maps", "masks")}


def summarize(out, smooth_sigma: float = 0.0, *, bins: int = DEFAULT_BINS, fpr_limit: float = FPR_LIMIT,
              chunk: int = 16) -> dict:
    """The metrics.json entries of a scoring result: ``image_auc`` (exact, sklearn), ``image_ap``,
    ``image_f1max`` and, when there are maps, ``pixel_auc`` (binned, within
    ``pixel_error_bounds["pixel_auc"]`` of the exact value), ``pixel_ap``, ``pixel_f1max``, ``aupro``,
    ``aupro_fpr_limit``, ``smooth_sigma``, ``n_regions``, ``pixel_bin_width`` and the bounds.

    ``out``: ``adsim.evaluation.evaluate.score``'s dict (``scores (n,)``, ``labels (n,)``, ``maps (n, S, S)`` or
    None, ``masks``), read ``chunk`` images at a time, or an iterable of such dicts, one per batch (a
    stream: nothing but the current batch is held). The maps are Gaussian-smoothed
    (``adsim.evaluation.evaluate.smooth``) batch by batch, so no smoothed copy of all maps is made."""
    batches = iter(_chunks(out, chunk) if isinstance(out, dict) else out)
    first = next(batches, None)
    if first is None:
        raise ValueError("summarize: no batches (no images were scored)")
    acc = accumulate(itertools.chain([first], batches), smooth_sigma, pixel=first.get("maps") is not None,
                     bins=bins, fpr_limit=fpr_limit)
    return entries(acc.compute(), smooth_sigma)


def accumulate(batches, smooth_sigma: float = 0.0, *, pixel: bool, bins: int = DEFAULT_BINS,
               fpr_limit: float = FPR_LIMIT) -> Accumulator:
    """An :class:`Accumulator` fed a stream of batch dicts (``scores``, ``labels``, ``maps``, ``masks``),
    each batch's maps Gaussian-smoothed (``adsim.evaluation.evaluate.smooth``) as it arrives, so nothing but the
    current batch is held. An empty stream gives an empty accumulator (a rank without images)."""

    acc = Accumulator(pixel, bins=bins, fpr_limit=fpr_limit)
    for batch in batches:
        maps = batch.get("maps")
        if acc.pixel and maps is not None:
            maps = smooth(maps, smooth_sigma)
        acc.update(batch["scores"], batch["labels"], maps, batch.get("masks"))
    return acc


def entries(m: dict, smooth_sigma: float = 0.0) -> dict:
    """:meth:`Accumulator.compute`'s dict ``m`` under metrics.json's names (``image_auc``, ``pixel_auc``)."""
    res = {"image_auc": m["image_auroc"], "image_ap": m["image_ap"], "image_f1max": m["image_f1max"]}
    if "pixel_auroc" in m:
        bounds = {("pixel_auc" if k == "pixel_auroc" else k): v for k, v in m["pixel_error_bounds"].items()}
        res.update({"pixel_auc": m["pixel_auroc"], "pixel_ap": m["pixel_ap"], "pixel_f1max": m["pixel_f1max"],
                    "aupro": m["aupro"], "aupro_fpr_limit": m["aupro_fpr_limit"], "smooth_sigma": smooth_sigma,
                    "n_regions": m["n_regions"], "pixel_bin_width": m["pixel_bin_width"],
                    "pixel_error_bounds": bounds})
    return res
