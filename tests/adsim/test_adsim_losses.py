"""Losses against values computed by hand (each expected number's derivation is in the comment)."""
import math

import torch

from adsim.model import losses


def test_dice_by_hand():
    # p = [.5, .5, 0, 0], y = [1, 0, 0, 0], smoothing 1: sum p y = .5, sum p = 1, sum y = 1
    # Dice = (2 * .5 + 1) / (1 + 1 + 1) = 2/3, loss = 1/3
    p = torch.tensor([[[0.5, 0.5], [0.0, 0.0]]])
    y = torch.tensor([[[1.0, 0.0], [0.0, 0.0]]])
    assert math.isclose(float(losses.dice_loss(p, y, torch.ones(1))), 1 / 3, rel_tol=1e-6)


def test_dice_ignores_images_without_mask():
    p = torch.tensor([[[0.5, 0.5], [0.0, 0.0]], [[1.0, 1.0], [1.0, 1.0]]])
    y = torch.tensor([[[1.0, 0.0], [0.0, 0.0]], [[0.0, 0.0], [0.0, 0.0]]])
    # second image has valid = 0, so only the first image's 1/3 (above) counts
    assert math.isclose(float(losses.dice_loss(p, y, torch.tensor([1.0, 0.0]))), 1 / 3, rel_tol=1e-6)
    assert float(losses.dice_loss(p, y, torch.zeros(2))) == 0.0  # nothing valid: 0, not 0/0


def test_focal_by_hand():
    # pixel 1: z = 0, y = 1 -> p_t = 1/2, loss = (1 - 1/2)^2 * ln 2 = ln(2) / 4
    # pixel 2: z = ln 3, y = 0 -> p = 3/4, p_t = 1/4, loss = (3/4)^2 * ln 4 = 9 ln(4) / 16
    z = torch.tensor([[[0.0, math.log(3.0)]]])
    y = torch.tensor([[[1.0, 0.0]]])
    expected = (math.log(2) / 4 + 9 * math.log(4) / 16) / 2
    assert math.isclose(float(losses.focal_loss(z, y, torch.ones(1))), expected, rel_tol=1e-6)


def test_focal_is_stable_for_huge_logits():
    # z = +-200 (100 * cosine scale can reach that): exact-sigmoid formulas would give log(0)
    z = torch.tensor([[[200.0, -200.0]]], requires_grad=True)
    y = torch.tensor([[[0.0, 1.0]]])
    out = losses.focal_loss(z, y, torch.ones(1))
    out.backward()
    # -(1 - e^{-200})^2 log(e^{-200}) ~= 200 for each pixel (log-sigmoid(-200) = -200 - log1p(e^-200))
    assert math.isclose(float(out.detach()), 200.0, rel_tol=1e-6) and torch.isfinite(z.grad).all()


def test_bce_on_logits_by_hand():
    # logit 0 -> -ln(1/2) = ln 2 for either label; logit ln 3 with label 1 -> -ln(3/4)
    out = losses.bce_loss(torch.tensor([0.0, math.log(3.0)]), torch.tensor([0.0, 1.0]))
    assert math.isclose(float(out), (math.log(2) - math.log(0.75)) / 2, rel_tol=1e-6)


def test_geodesic_losses_by_hand():
    c = torch.tensor([1.0, 0.0])
    f = torch.tensor([[0.0, 1.0], [1.0, 1.0], [-1.0, 0.0]])
    # accepted: rows 0 (angle pi/2) and 1 (angle pi/4): mean of squares = (pi^2/4 + pi^2/16) / 2
    intra = losses.geodesic_intra(f, torch.tensor([1.0, 1.0, 0.0]), c)
    assert math.isclose(float(intra), (math.pi ** 2 / 4 + math.pi ** 2 / 16) / 2, rel_tol=1e-6)
    assert float(losses.geodesic_intra(f, torch.zeros(3), c)) == 0.0  # empty matched set: 0
    # L_inter = -d_G(c+, c-) = -pi/2 for orthogonal centroids; 0 until both exist
    assert math.isclose(float(losses.geodesic_inter(c, torch.tensor([0.0, 2.0]), 1.0)), -math.pi / 2, rel_tol=1e-6)
    assert float(losses.geodesic_inter(c, torch.zeros(2), 0.0)) == 0.0


def test_dice_is_per_image_then_averaged():
    # (B, H, W) = (2, 1, 4), so that a sum over the wrong axis cannot broadcast back by accident.
    # image 1: p = [1, 0, 0, 0], y = [1, 0, 0, 0]: Dice = (2 + 1) / (1 + 1 + 1) = 1, loss 0
    # image 2: p = [.5, .5, .5, .5], y = [0, 0, 0, 1]: sum p y = .5, Dice = (1 + 1) / (2 + 1 + 1)
    #          = 1/2, loss 1/2. Mean over the two valid images: 1/4. (Pooling the pixels of both
    #          images instead would give 1 - (2 * 1.5 + 1) / (3 + 2 + 1) = 1/3.)
    p = torch.tensor([[[1.0, 0.0, 0.0, 0.0]], [[0.5, 0.5, 0.5, 0.5]]])
    y = torch.tensor([[[1.0, 0.0, 0.0, 0.0]], [[0.0, 0.0, 0.0, 1.0]]])
    assert math.isclose(float(losses.dice_loss(p, y, torch.ones(2))), 0.25, rel_tol=1e-6)
    # only image 2 valid: 1/2
    assert math.isclose(float(losses.dice_loss(p, y, torch.tensor([0.0, 1.0]))), 0.5, rel_tol=1e-6)


def test_bce_accepts_integer_and_bool_labels():
    # the labels are cast to the logits' dtype: int64 and bool labels give the float result
    z = torch.tensor([0.0, math.log(3.0)])
    expected = (math.log(2) - math.log(0.75)) / 2  # as in test_bce_on_logits_by_hand
    for labels in (torch.tensor([0, 1]), torch.tensor([False, True])):
        assert math.isclose(float(losses.bce_loss(z, labels)), expected, rel_tol=1e-6)


def test_focal_half_lesion_pixel_counts_as_anomalous():
    # Decision (docstring of focal_loss): a soft target counts as anomalous iff >= 0.5 -- at least
    # half lesion, the rule adsim.training.train uses for patch labels. z = ln 3, target 0.5: p_t = p = 3/4,
    # loss = (1/4)^2 ln(4/3); as "normal" it would be (3/4)^2 ln 4.
    z = torch.tensor([[[math.log(3.0)]]])
    got = float(losses.focal_loss(z, torch.tensor([[[0.5]]]), torch.ones(1)))
    assert math.isclose(got, math.log(4 / 3) / 16, rel_tol=1e-6)
    assert float(losses.focal_loss(z, torch.tensor([[[0.49]]]), torch.ones(1))) > 0.5  # (3/4)^2 ln 4 = 0.78


def test_geodesic_intra_batched_and_single_member():
    # slot axis S = 2 as CentroidBank uses it: f (2, 3, 2), accepted (2, 3), c (2, 2)
    c = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    f = torch.tensor([[[0.0, 1.0], [1.0, 1.0], [-1.0, 0.0]],
                      [[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]]])
    acc = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    out = losses.geodesic_intra(f, acc, c)
    # slot 0: (pi^2/4 + pi^2/16) / 2 as above; slot 1: one member at angle pi/2 -> (pi/2)^2 / 1
    expected = [(math.pi ** 2 / 4 + math.pi ** 2 / 16) / 2, math.pi ** 2 / 4]
    assert out.shape == (2,)
    for g, e in zip(out.tolist(), expected):
        assert math.isclose(g, e, rel_tol=1e-6)


def test_focal_is_per_image_mean_then_masked():
    # image 1: the two pixels of test_focal_by_hand, mean (ln 2 / 4 + 9 ln 4 / 16) / 2;
    # image 2: one pixel z = 0, y = 0 repeated -> ln(2) / 4; only image 1 valid -> image 1's value
    z = torch.tensor([[[0.0, math.log(3.0)]], [[0.0, 0.0]]])
    y = torch.tensor([[[1.0, 0.0]], [[0.0, 0.0]]])
    first = (math.log(2) / 4 + 9 * math.log(4) / 16) / 2
    assert math.isclose(float(losses.focal_loss(z, y, torch.tensor([1.0, 0.0]))), first, rel_tol=1e-6)
    both = (first + math.log(2) / 4) / 2
    assert math.isclose(float(losses.focal_loss(z, y, torch.ones(2))), both, rel_tol=1e-6)


def _geodesic(u, v):
    """Angle between two vectors in float64, by the chord formula ``2 atan2(|u' - v'|, |u' + v'|)``."""
    u, v = u.double() / u.double().norm(), v.double() / v.double().norm()
    return 2.0 * math.atan2(float((u - v).norm()), float((u + v).norm()))


def test_cross_averages_over_each_layers_own_features():
    """``cross`` with two layers of three features: per layer ``1 / (mean over its accepted j of
    d_G(f_j, c_other) + 1e-6)``, computed feature by feature (float64 angles); the result has one value
    per layer, so a sum over the wrong axis (layers instead of features) cannot match."""
    g = torch.Generator().manual_seed(3)
    f, c = torch.randn(2, 3, 4, generator=g), torch.randn(2, 4, generator=g)
    acc = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]])
    got = losses.cross(f, acc, c, torch.ones(2))
    for layer in range(2):
        ds = [_geodesic(f[layer, j], c[layer]) for j in range(3) if acc[layer, j]]
        assert math.isclose(float(got[layer]), 1.0 / (sum(ds) / len(ds) + losses.EPS_RECIPROCAL), rel_tol=1e-5)


def test_reciprocal_inter_is_one_over_the_centroid_distance_without_gradient():
    """The authors' ``inter_form="reciprocal"``: ``1 / (d_G(c+, c-) + 1e-6)`` on detached centroids (times
    ``both_initialised``), from the float64 angle of each pair."""
    g = torch.Generator().manual_seed(4)
    cp, cn = torch.randn(3, 5, generator=g, requires_grad=True), torch.randn(3, 5, generator=g)
    both = torch.tensor([1.0, 1.0, 0.0])
    got = losses.inter(cp, cn, both, form="reciprocal")
    for k in range(3):
        expected = float(both[k]) / (_geodesic(cp[k].detach(), cn[k]) + losses.EPS_RECIPROCAL)
        assert math.isclose(float(got[k]), expected, rel_tol=1e-5)
    assert not got.requires_grad  # the authors read centroid.data: a value, no gradient


def test_intra_default_metric_is_the_geodesic():
    """Called without ``metric``, ``intra`` is the paper's squared geodesic (``d_G``, power 2), computed here
    as the mean of float64 angles squared over the accepted features."""
    g = torch.Generator().manual_seed(5)
    f, c = torch.randn(4, 6, generator=g), torch.randn(6, generator=g)
    acc = torch.tensor([1.0, 0.0, 1.0, 1.0])
    expected = sum(_geodesic(f[j], c) ** 2 for j in (0, 2, 3)) / 3
    assert math.isclose(float(losses.intra(f, acc, c)), expected, rel_tol=1e-5)
