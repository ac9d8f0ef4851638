"""adsim.metrics: the streaming Accumulator against hand-computed cases, exact sklearn values and a slow
exact AUPRO reference written here (sort-based, one threshold at a time, NumPy)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from scipy.ndimage import gaussian_filter, label
from sklearn.metrics import average_precision_score, precision_recall_curve, roc_auc_score

from adsim.metrics.accumulator import Accumulator, area_to, summarize
from adsim.metrics.functional import auc_percent, smooth
from poolsim.testing import examples, finite_floats

PIXEL_KEYS = ("pixel_auroc", "pixel_ap", "pixel_f1max", "aupro")


# ---------------------------------------------------------------- exact references (the oracles)
def f1max_reference(labels, scores) -> float:
    """Largest F1 over every distinct threshold, by brute force (one threshold at a time)."""
    labels, scores = np.asarray(labels, bool).ravel(), np.asarray(scores).ravel()
    best = 0.0
    for t in np.unique(scores):
        pred = scores >= t
        tp = np.sum(pred & labels)
        best = max(best, 2 * tp / (pred.sum() + labels.sum()))
    return 100.0 * best


def aupro_reference(maps, masks, fpr_limit=0.3) -> float:
    """Exact AUPRO (Bergmann et al., IJCV 2021): regions = 8-connected components of each image's mask;
    at every distinct score t (descending), FPR = fraction of normal pixels >= t and PRO = mean over
    regions of the fraction of the region's pixels >= t; curve from (0, 0), trapezoids up to fpr_limit
    with linear interpolation there, divided by fpr_limit. Per region the sorted scores give the
    overlap at t by binary search."""
    maps, masks = np.asarray(maps, float), np.asarray(masks, bool)
    regions = []
    for m, k in zip(maps, masks):
        lab, n = label(k, structure=np.ones((3, 3)))
        regions += [np.sort(m[lab == r]) for r in range(1, n + 1)]
    normal = np.sort(maps[~masks])
    fpr, pro = [0.0], [0.0]
    for t in np.unique(maps)[::-1]:
        fpr.append((len(normal) - np.searchsorted(normal, t, side="left")) / len(normal))
        pro.append(np.mean([(len(r) - np.searchsorted(r, t, side="left")) / len(r) for r in regions]))
    area = 0.0
    for i in range(1, len(fpr)):
        x0, x1, y0, y1 = fpr[i - 1], fpr[i], pro[i - 1], pro[i]
        if x0 >= fpr_limit:
            break
        if x1 > fpr_limit:  # cut the segment at the limit
            y1 = y0 + (y1 - y0) * (fpr_limit - x0) / (x1 - x0)
            x1 = fpr_limit
        area += 0.5 * (y0 + y1) * (x1 - x0)
    return 100.0 * area / fpr_limit


def exact_pixel(maps, masks, fpr_limit=0.3) -> dict:
    y, s = np.asarray(masks).ravel(), np.asarray(maps).ravel()
    return {"pixel_auroc": 100 * roc_auc_score(y, s), "pixel_ap": 100 * average_precision_score(y, s),
            "pixel_f1max": f1max_reference(y, s), "aupro": aupro_reference(maps, masks, fpr_limit)}


def random_split(rng, n=8, size=24, shift=0.0):
    """Smooth random maps with masks of several blobs (regions) in about half the images."""
    noise = np.stack([gaussian_filter(rng.normal(size=(size, size)), 1.5) for _ in range(n)])
    labels = np.arange(n) % 2
    blobs = np.stack([gaussian_filter(rng.normal(size=(size, size)), 2.0) for _ in range(n)])
    masks = (blobs > 0.25) & (labels[:, None, None] == 1)
    maps = (noise * 4 + 0.6 * masks + shift).astype(np.float32)
    scores = maps.max(axis=(1, 2)) + rng.normal(scale=0.5, size=n)
    return scores, labels, maps, masks


def feed(acc, scores, labels, maps, masks, sizes, *, compute=True):
    """Feed the images in batches of ``sizes``; return ``acc.compute()`` (or ``acc``)."""
    start = 0
    for b in sizes:
        acc.update(scores[start:start + b], labels[start:start + b], maps[start:start + b], masks[start:start + b])
        start += b
    assert start == len(scores)
    return acc.compute() if compute else acc


def assert_within_bounds(got, want):
    for k in PIXEL_KEYS:
        assert abs(got[k] - want[k]) <= got["pixel_error_bounds"][k] + 1e-9, (k, got[k], want[k])


# ---------------------------------------------------------------- hand-computed cases
def test_image_metrics_hand_case():
    # scores 3, 2, 1, 0 with labels 1, 0, 1, 0. AUROC: of the 4 (anomalous, normal) pairs (3,2), (3,0),
    # (1,2), (1,0) three are ordered -> 75 %. Thresholds 3, 2, 1, 0 give (P, R) = (1, 1/2), (1/2, 1/2),
    # (2/3, 1), (1/2, 1): AP = 1/2 * 1 + 1/2 * 2/3 = 5/6; F1 = 2/3, 1/2, 4/5, 2/3 -> F1-max 4/5.
    m = Accumulator(pixel=False).update([3.0, 2.0], [1, 0]).update([1.0, 0.0], [1, 0]).compute()
    assert m["image_auroc"] == pytest.approx(75.0)
    assert m["image_ap"] == pytest.approx(100 * 5 / 6)
    assert m["image_f1max"] == pytest.approx(80.0)
    assert (m["n_images"], m["n_anomalous"]) == (4, 2) and "aupro" not in m


def hand_aupro_case():
    # image 1: region A = the top-left 2x2 block (4 px) with scores 9, 9, 5, 1; one normal pixel at 7.
    # image 2: region B = two pixels of the bottom row with scores 8, 3; normal pixels at 6 and 4.
    # image 3: normal, all zeros. Every other pixel scores 0. Normal pixels: 12 + 14 + 16 = 42.
    m1 = np.array([[9, 9, 0, 0], [5, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 7]], float)
    k1 = np.array([[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]], bool)
    m2 = np.array([[6, 0, 0, 4], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 8, 3]], float)
    k2 = np.array([[0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 1, 1]], bool)
    return np.stack([m1, m2, np.zeros((4, 4))]), np.stack([k1, k2, np.zeros((4, 4), bool)])


def test_aupro_hand_case():
    # Thresholds (descending) -> (FPR, PRO = mean of the overlaps of A and B):
    #   9: (0, (2/4 + 0)/2 = .25)   8: (0, (2/4 + 1/2)/2 = .5)   7: (1/42, .5)   6: (2/42, .5)
    #   5: (2/42, (3/4 + 1/2)/2 = .625)   4: (3/42, .625)   3: (3/42, (3/4 + 1)/2 = .875)
    #   1: (3/42, 1)   0: (1, 1).
    # Area up to FPR 0.3: .5 * 1/42 + .5 * 1/42 + .625 * 1/42 + 1 * (0.3 - 3/42) = 0.3 - 1.375/42,
    # so AUPRO = 1 - 1.375 / (42 * 0.3) = 89.087 %; up to FPR 1: (1.625 - 3)/42 + 1 = 96.726 %.
    maps, masks = hand_aupro_case()
    m = Accumulator(pixel=True).update([2.0, 1.0, 0.0], [1, 1, 0], maps, masks).compute()
    assert m["aupro"] == pytest.approx(100 * (1 - 1.375 / 12.6), abs=1e-9)
    assert m["n_regions"] == 2 and m["aupro_fpr_limit"] == 0.3
    m1 = Accumulator(pixel=True, fpr_limit=1.0).update([2.0, 1.0, 0.0], [1, 1, 0], maps, masks).compute()
    assert m1["aupro"] == pytest.approx(100 * (1 - 1.375 / 42), abs=1e-9)
    # the slow reference agrees with the hand arithmetic
    assert aupro_reference(maps, masks) == pytest.approx(100 * (1 - 1.375 / 12.6), abs=1e-9)
    # integer scores, bins much finer than 1: every bin holds one distinct value, binned = exact
    ref = exact_pixel(maps, masks)
    for k in PIXEL_KEYS:
        assert m[k] == pytest.approx(ref[k], abs=1e-9)


def test_regions_are_8_connected_per_image():
    # a diagonal pair is one region (8-connectivity, as the MVTec code); the same pixels in two images
    # are two regions, not one: 1 + 2 = 3 regions
    masks = np.zeros((3, 4, 4), bool)
    masks[0, 0, 0] = masks[0, 1, 1] = True
    masks[1, 2, 2] = masks[2, 2, 2] = True
    maps = np.arange(48, dtype=float).reshape(3, 4, 4)
    m = Accumulator(pixel=True).update([0.0, 1.0, 2.0], [1, 1, 0], maps, masks).compute()
    assert m["n_regions"] == 3
    assert m["aupro"] == pytest.approx(aupro_reference(maps, masks), abs=1e-9)


def test_area_to_interpolates_at_the_limit():
    # y = x on [0, 1]: area to 0.3 is 0.3^2 / 2; a limit on a vertex and beyond the last point
    assert area_to([0, 1], [0, 1], 0.3) == pytest.approx(0.045)
    assert area_to([0, 0.5, 1], [0, 1, 1], 0.5) == pytest.approx(0.25)
    assert area_to([0, 0, 0.2], [0, 1, 1], 0.3) == pytest.approx(0.2)


# ---------------------------------------------------------------- binned vs exact within the bound
def test_binned_pixel_metrics_within_bound_of_exact(rng):
    scores, labels, maps, masks = random_split(rng, n=8, size=24)
    m = feed(Accumulator(pixel=True), scores, labels, maps, masks, [3, 1, 4])
    assert m["n_regions"] >= 4  # several regions, in several images
    assert_within_bounds(m, exact_pixel(maps, masks))
    # the default grid makes the bound small enough to ignore at the precision papers report (0.1 pp)
    assert max(m["pixel_error_bounds"].values()) < 0.01
    assert m["image_auroc"] == roc_auc_score(labels, scores) * 100  # image level: exact sklearn


def test_coarse_bins_bound_holds_and_is_not_vacuous(rng):
    # 32 bins: the binned values really differ from the exact ones, and the bound still covers them
    scores, labels, maps, masks = random_split(rng, n=8, size=24)
    m = feed(Accumulator(pixel=True, bins=32), scores, labels, maps, masks, [2, 2, 2, 2])
    ref = exact_pixel(maps, masks)
    assert_within_bounds(m, ref)
    assert max(abs(m[k] - ref[k]) for k in PIXEL_KEYS) > 1e-3
    assert all(m["pixel_error_bounds"][k] < 25 for k in PIXEL_KEYS)


def test_ap_bound_covers_a_bin_ordered_against_the_binned_value():
    # 16 bins and a first range of [0.1, 7.5]: width 1 (e = ceil(log2(7.4 / 8)) = 0), bin k = [k, k + 1).
    # 1000 normal pixels at 7.5 (bin 7), then in bin 5 ten normal pixels at 5.9 ABOVE ten anomalous ones
    # at 5.1..5.5, 200 normal pixels at 0.1. Exact AP = (1/10) sum_k k / (k + 1010) = 0.54 %; binned
    # (one step at the bin's edge) = 10/1020 = 0.98 %: the binned value is 0.44 pp too high, which the
    # bound (10/1010 - 1/1011) * 1 = 0.89 pp must cover (a bound of Pmax - P(edge) = 0.01 pp would not).
    maps = np.concatenate([np.full(1000, 7.5), np.full(10, 5.9), np.linspace(5.1, 5.5, 10), np.full(200, 0.1)])
    masks = np.zeros(maps.size, bool)
    masks[1010:1020] = True
    m = Accumulator(pixel=True, bins=16).update([1.0, 0.0], [1, 0], maps.reshape(2, 1, -1),
                                                 masks.reshape(2, 1, -1)).compute()
    assert m["pixel_bin_width"] == 1.0
    exact = 100 * np.mean([k / (k + 1010) for k in range(1, 11)])
    assert exact == pytest.approx(exact_pixel(maps.reshape(1, 1, -1), masks.reshape(1, 1, -1))["pixel_ap"])
    assert m["pixel_ap"] == pytest.approx(100 * 10 / 1020)
    assert abs(m["pixel_ap"] - exact) <= m["pixel_error_bounds"]["pixel_ap"]
    assert m["pixel_error_bounds"]["pixel_ap"] == pytest.approx(100 * (10 / 1010 - 1 / 1011))


@pytest.mark.parametrize("fpr_limit", [0.05, 0.3, 1.0])
def test_grid_adapts_to_batches_far_apart(rng, fpr_limit):
    # the first batch spans ~[-3, 3]; later ones are shifted by +-1000 and scaled: the window re-centres
    # and doubles its bin width; the result stays within its bound of the exact values
    scores, labels, maps, masks = random_split(rng, n=6, size=20)
    maps = maps * np.array([1, 1, 50, 1, 0.01, 1], np.float32)[:, None, None]
    maps += np.array([0, 0, 1000, 0, -1000, 3], np.float32)[:, None, None]
    m = feed(Accumulator(pixel=True, bins=256, fpr_limit=fpr_limit), scores, labels, maps, masks, [2, 1, 1, 2])
    assert_within_bounds(m, exact_pixel(maps, masks, fpr_limit))
    assert m["pixel_bin_width"] >= (maps.max() - maps.min()) / 256


def test_batch_order_and_split_do_not_matter_beyond_the_bound(rng):
    scores, labels, maps, masks = random_split(rng, n=8, size=16, shift=-5.0)
    a = feed(Accumulator(pixel=True, bins=64), scores, labels, maps, masks, [8])
    perm = np.array([7, 3, 0, 5, 1, 6, 2, 4])
    b = feed(Accumulator(pixel=True, bins=64), scores[perm], labels[perm], maps[perm], masks[perm], [1, 3, 4])
    ref = exact_pixel(maps, masks)
    assert_within_bounds(a, ref)
    assert_within_bounds(b, ref)
    assert a["image_auroc"] == b["image_auroc"] and a["image_ap"] == pytest.approx(b["image_ap"])


def test_constant_first_batch_then_spread(rng):
    # a zero-width first range (all scores equal) must not break the grid
    scores, labels, maps, masks = random_split(rng, n=4, size=16)
    maps[0] = 2.0
    m = feed(Accumulator(pixel=True), scores, labels, maps, masks, [1, 3])
    assert_within_bounds(m, exact_pixel(maps, masks))


def test_merge_of_shards_on_different_grids(rng):
    # two "processes": shard a spans ~[-3, 3], shard b is scaled x40 and shifted by 500, so their grids
    # differ (exponent and window); the merge re-bins onto the coarser grid and stays within its bound
    scores, labels, maps, masks = random_split(rng, n=8, size=20)
    maps[4:] = maps[4:] * 40 + 500
    a = feed(Accumulator(pixel=True, bins=512), scores[:4], labels[:4], maps[:4], masks[:4], [2, 2])
    shard_a = Accumulator(pixel=True, bins=512).update(scores[:4], labels[:4], maps[:4], masks[:4])
    shard_b = Accumulator(pixel=True, bins=512).update(scores[4:], labels[4:], maps[4:], masks[4:])
    assert shard_a._hist.e < shard_b._hist.e
    m = shard_a.merge(shard_b).compute()
    assert_within_bounds(m, exact_pixel(maps, masks))
    assert m["n_regions"] == a["n_regions"] + shard_b.compute()["n_regions"]
    assert m["image_auroc"] == 100 * roc_auc_score(labels, scores)  # images in shard order a, b
    # merged the other way round: the same grid (the coarser one) and the same histograms
    m2 = Accumulator(pixel=True, bins=512).update(scores[4:], labels[4:], maps[4:], masks[4:]).merge(
        Accumulator(pixel=True, bins=512).update(scores[:4], labels[:4], maps[:4], masks[:4])).compute()
    for k in (*PIXEL_KEYS, "pixel_bin_width"):
        assert m2[k] == pytest.approx(m[k], abs=1e-12)
    # into an empty accumulator: a copy
    empty = Accumulator(pixel=True, bins=512).merge(shard_b)
    assert empty.compute() == shard_b.compute()


def test_merge_validates():
    with pytest.raises(ValueError, match="cannot merge"):
        Accumulator(pixel=True).merge(Accumulator(pixel=True, bins=64))
    with pytest.raises(ValueError, match="cannot merge"):
        Accumulator(pixel=True).merge(Accumulator(pixel=True, fpr_limit=0.1))
    with pytest.raises(TypeError, match="Accumulator"):
        Accumulator(pixel=False).merge({"scores": []})


# ---------------------------------------------------------------- summarize (the evaluate wiring)
def test_summarize_matches_accumulator_and_keeps_exact_image_auc(rng):
    scores, labels, maps, masks = random_split(rng, n=6, size=20)
    out = {"scores": scores, "labels": labels, "maps": maps, "masks": masks}
    res = summarize(out, smooth_sigma=1.0, chunk=4)
    assert res["image_auc"] == auc_percent(labels, scores)  # unchanged key, exact sklearn value
    smoothed = smooth(maps, 1.0)
    assert abs(res["pixel_auc"] - auc_percent(masks, smoothed)) <= res["pixel_error_bounds"]["pixel_auc"] + 1e-9
    assert abs(res["aupro"] - aupro_reference(smoothed, masks)) <= res["pixel_error_bounds"]["aupro"] + 1e-9
    # the same as a stream of batch dicts (what a streaming scoring loop passes)
    stream = summarize(({"scores": scores[i:i + 2], "labels": labels[i:i + 2], "maps": maps[i:i + 2],
                         "masks": masks[i:i + 2]} for i in range(0, 6, 2)), smooth_sigma=1.0)
    assert stream == summarize(out, smooth_sigma=1.0, chunk=2)  # same batches, same grid: identical
    with pytest.raises(ValueError, match="no batches"):
        summarize(iter([]))
    no_maps = summarize({"scores": scores, "labels": labels, "maps": None, "masks": None})
    assert set(no_maps) == {"image_auc", "image_ap", "image_f1max"}
    p, r, _ = precision_recall_curve(labels, scores)
    assert no_maps["image_f1max"] == pytest.approx(f1max_reference(labels, scores))
    assert no_maps["image_f1max"] == pytest.approx(100 * np.max(2 * p * r / np.maximum(p + r, 1e-300)))


# ---------------------------------------------------------------- bad input
def test_one_class_only_is_a_clear_error(rng):
    with pytest.raises(ValueError, match="image metrics undefined.*one class"):
        Accumulator(pixel=False).update([0.1, 0.2], [0, 0]).compute()
    with pytest.raises(ValueError, match="one class"):
        Accumulator(pixel=False).compute()
    maps = rng.normal(size=(2, 4, 4))
    with pytest.raises(ValueError, match="pixel metrics undefined.*no anomalous"):
        Accumulator(pixel=True).update([0.0, 1.0], [0, 1], maps, np.zeros((2, 4, 4), bool)).compute()
    with pytest.raises(ValueError, match="pixel metrics undefined.*only anomalous"):
        Accumulator(pixel=True).update([0.0, 1.0], [0, 1], maps, np.ones((2, 4, 4), bool)).compute()


def test_non_finite_input_names_the_argument(rng):
    maps, masks = rng.normal(size=(2, 4, 4)), np.zeros((2, 4, 4), bool)
    masks[1, 0, 0] = True
    with pytest.raises(ValueError, match="scores contains NaN"):
        Accumulator(pixel=False).update([np.nan, 1.0], [0, 1])
    bad = maps.copy()
    bad[0, 1, 1] = np.nan
    with pytest.raises(ValueError, match="maps contains NaN"):
        Accumulator(pixel=True).update([0.0, 1.0], [0, 1], bad, masks)
    bad[0, 1, 1] = np.inf
    with pytest.raises(ValueError, match="maps contains inf"):
        Accumulator(pixel=True).update([0.0, 1.0], [0, 1], bad, masks)


@pytest.mark.parametrize("fpr_limit", [0.0, -0.1, 1.5, float("nan"), float("inf"), "0.3", True])
def test_fpr_limit_validated(fpr_limit):
    with pytest.raises(ValueError, match="fpr_limit"):
        Accumulator(pixel=True, fpr_limit=fpr_limit)


@pytest.mark.parametrize("bins", [0, 15, 2.5, 1 << 25, True])
def test_bins_validated(bins):
    with pytest.raises(ValueError, match="bins"):
        Accumulator(pixel=True, bins=bins)


def test_shapes_and_labels_validated(rng):
    maps, masks = rng.normal(size=(2, 4, 4)), np.zeros((2, 4, 4), bool)
    with pytest.raises(ValueError, match="labels must be binary"):
        Accumulator(pixel=False).update([0.0, 1.0], [0, 2])
    with pytest.raises(ValueError, match=r"labels must have shape \(2,\)"):
        Accumulator(pixel=False).update([0.0, 1.0], [0, 1, 1])
    with pytest.raises(ValueError, match="needs maps"):
        Accumulator(pixel=True).update([0.0, 1.0], [0, 1])
    with pytest.raises(ValueError, match="pixel=False"):
        Accumulator(pixel=False).update([0.0, 1.0], [0, 1], maps, masks)
    with pytest.raises(ValueError, match=r"masks must have shape \(2, 4, 4\)"):
        Accumulator(pixel=True).update([0.0, 1.0], [0, 1], maps, masks[:, :3])
    with pytest.raises(ValueError, match="maps must have shape"):
        Accumulator(pixel=True).update([0.0, 1.0], [0, 1], maps[0], masks[0])
    with pytest.raises(TypeError, match="scores must be a real-valued array"):
        Accumulator(pixel=False).update(np.array([True, False]), [0, 1])


# ---------------------------------------------------------------- independent reference (optional)
@pytest.mark.parametrize("fpr_limit", [0.1, 0.3])
def test_aupro_matches_anomalib(rng, fpr_limit):
    """anomalib's AUPRO (MVTec-style global sort, 8-connected regions by OpenCV, float32) as an
    independent reference. anomalib is NOT a dependency (it brings lightning, opencv, kornia, ...):
    this runs where it happens to be installed and skips elsewhere."""
    pytest.importorskip("anomalib")
    torch = pytest.importorskip("torch")
    from types import SimpleNamespace

    from anomalib.metrics import AUPRO

    scores, labels, maps, masks = random_split(rng, n=8, size=24)
    ref = AUPRO(fpr_limit=fpr_limit, fields=["anomaly_map", "gt_mask"])
    ref.update(SimpleNamespace(anomaly_map=torch.from_numpy(maps), gt_mask=torch.from_numpy(masks.astype(np.int64))))
    want = 100 * float(ref.compute())
    m = feed(Accumulator(pixel=True, fpr_limit=fpr_limit), scores, labels, maps, masks, [5, 3])
    # bound of the binning + float32 round-off of anomalib's cumulative sums over 4608 pixels
    assert abs(m["aupro"] - want) <= m["pixel_error_bounds"]["aupro"] + 1e-3
    assert abs(aupro_reference(maps, masks, fpr_limit) - want) <= 1e-3


# ---------------------------------------------------------------- property: any data, any split
@st.composite
def pixel_cases(draw):
    n, h, w = draw(st.integers(2, 4)), draw(st.integers(2, 5)), draw(st.integers(2, 5))
    values = st.one_of(st.integers(-3, 3).map(float), finite_floats(-1e3, 1e3))  # ties and spread
    maps = draw(hnp.arrays(np.float64, (n, h, w), elements=values)) * 2.0 ** draw(st.integers(-30, 30))
    masks = draw(hnp.arrays(np.bool_, (n, h, w)))
    masks[0] = False  # one normal image, one with an anomalous pixel
    masks[1, 0, 0] = True
    cuts = sorted(draw(st.sets(st.integers(1, n - 1), max_size=n - 1)))
    sizes = np.diff([0, *cuts, n]).tolist()
    return (maps, masks, sizes, draw(st.sampled_from([16, 64, 1 << 16])), draw(st.sampled_from([0.05, 0.3, 1.0])),
            draw(st.booleans()))


@pytest.mark.slow
@settings(max_examples=examples(60), deadline=None)
@given(pixel_cases())
def test_binned_within_bound_of_exact_on_any_data(case):
    maps, masks, sizes, bins, fpr_limit, shard = case
    labels = masks.any(axis=(1, 2)).astype(int)
    acc = Accumulator(pixel=True, bins=bins, fpr_limit=fpr_limit)
    if shard:  # the first batch in one accumulator, the rest in another, merged
        b = sizes[0]
        acc.update(labels[:b].astype(float), labels[:b], maps[:b], masks[:b])
        rest = Accumulator(pixel=True, bins=bins, fpr_limit=fpr_limit)
        if len(sizes) > 1:
            feed(rest, labels[b:].astype(float), labels[b:], maps[b:], masks[b:], sizes[1:], compute=False)
        m = acc.merge(rest).compute()
    else:
        m = feed(acc, labels.astype(float), labels, maps, masks, sizes)
    want = exact_pixel(maps, masks, fpr_limit)
    for k in PIXEL_KEYS:  # + float round-off of the two summation orders
        assert abs(m[k] - want[k]) <= m["pixel_error_bounds"][k] + 1e-7 * (1 + abs(want[k])), (k, m[k], want[k])
