"""The feature-level simulator: Table 4 as a Gram matrix, reproduced similarities, masks, validation,
the text prior, and the head running on simulated tokens."""
import numpy as np
import pytest
import torch
from scipy import stats

from adsim.data import reference, sim
from adsim.data.domains import DOMAINS, MASKED
from adsim.model.head import Head, features_from_tokens


def test_table4_is_a_gram_matrix_and_projection_of_a_non_psd_one():
    # Table 4 read as mean pairwise cosines is the Gram matrix of the domain means: it must be PSD.
    g, info = sim.check_gram(reference.TABLE4)
    assert not info["psd_projected"] and min(np.linalg.eigvalsh(reference.TABLE4)) > 0.02
    np.testing.assert_array_equal(g, reference.TABLE4)
    # so is the unit-diagonal correlation matrix of the normalised centroids
    d = np.sqrt(np.diag(reference.TABLE4))
    assert min(np.linalg.eigvalsh(reference.TABLE4 / np.outer(d, d))) > 0
    # a matrix that is not PSD (three vectors cannot pairwise have these cosines) is projected
    bad = np.array([[1.0, 0.9, -0.9], [0.9, 1.0, 0.9], [-0.9, 0.9, 1.0]])
    assert min(np.linalg.eigvalsh(bad)) < 0
    fixed, info = sim.check_gram(bad)
    assert info["psd_projected"] and min(np.linalg.eigvalsh(fixed)) > -1e-12
    np.testing.assert_allclose(np.diag(fixed), np.diag(bad))


def test_simulated_similarities_reproduce_table4():
    # Without patch noise and lesions the image feature is g itself, whose mean pairwise cosines have
    # expectation exactly Table 4 (construction in adsim.data.sim). Tolerance: 4 standard errors of the mean
    # over seeds, computed from the seeds' spread (plus 1e-3 so an accidentally tiny spread cannot fail).
    p = sim.SimParams(n_train=60, n_test=60, patch_cos=1.0, anomaly_shift=0.0, n_layers=1, grid=2)
    mats = []
    for seed in range(5):
        data = sim.simulate(p, seed)
        feats = {d: sim.image_features(torch.cat([data.train[d].tokens, data.test[d].tokens])) for d in DOMAINS}
        mats.append(sim.similarity(feats)[1])
    mats = np.stack(mats)
    se = mats.std(0, ddof=1) / np.sqrt(len(mats))
    assert np.all(np.abs(mats.mean(0) - reference.table4(DOMAINS)) < 4 * se + 1e-3)


def test_simulated_splits_masks_and_lesion_shift():
    p = sim.SimParams(n_train=6, n_test=5)
    data = sim.simulate(p, 3)
    for d in DOMAINS:
        sp = data.train[d]
        assert sp.tokens.shape == (12, p.n_layers, p.grid ** 2, p.width)
        torch.testing.assert_close(sp.tokens.norm(dim=-1), torch.ones(12, p.n_layers, p.grid ** 2))
        anom = sp.labels == 1
        assert sp.has_mask[~anom].eq(1).all()
        if d in MASKED:  # every anomalous image has a non-empty lesion mask, normal ones none
            assert sp.has_mask[anom].eq(1).all() and (sp.masks[anom].sum((1, 2)) >= 1).all()
        else:  # no masks for the AC-only modalities, as in BMAD
            assert sp.has_mask[anom].eq(0).all() and sp.masks.sum() == 0
        assert sp.masks[~anom].sum() == 0
    assert data.text.shape == (2, p.embed_dim)
    assert float(data.text[0] @ data.text[1]) == pytest.approx(p.text_cos, abs=1e-5)
    # same seed -> same data; another seed -> other data
    torch.testing.assert_close(sim.simulate(p, 3).train["Brain"].tokens, data.train["Brain"].tokens)
    assert not torch.equal(sim.simulate(p, 4).train["Brain"].tokens, data.train["Brain"].tokens)


def test_lesion_patches_move_along_the_anomaly_direction():
    # the class channels (0..class_channels-1) of lesion patches gain energy; normal patches' do not
    p = sim.SimParams(n_train=20, n_test=2, anomaly_shift=0.6)
    sp = sim.simulate(p, 0).train["Brain"]
    c = p.class_channels
    energy = (sp.tokens[:, 0, :, :c] ** 2).sum(-1)  # (n, N)
    lesion = sp.masks.flatten(1).bool()
    assert energy[lesion].mean() > 2 * energy[~lesion].mean()


def _text_direction(data):
    """The token-space text direction, rebuilt from the returned text embeddings and projection."""
    d = (data.text[1] - data.text[0]).double().numpy()
    u = data.proj.T @ (d / np.linalg.norm(d))
    return u / np.linalg.norm(u)


@pytest.mark.slow
@pytest.mark.parametrize("shared, kappa", [(0.5, 2.0), (0.3, 5.0)])
def test_text_prior_alignment_statistics(shared, kappa):
    # cos(v_k, u) = sqrt(a_k) with a_k ~ Beta(kappa m, kappa (1 - m)) i.i.d. over modalities and seeds.
    # Expected values: E sqrt(a) from scipy.stats.beta.expect (numerical quadrature, independent of the
    # closed form B(a + 1/2, b) / B(a, b) in expected_text_cos) and E a = m (the Beta mean). Tolerance:
    # 4 Monte-Carlo standard errors computed from the draws. The a_k pass a KS test against the Beta.
    p = sim.SimParams(n_train=1, n_test=1, grid=2, n_layers=1, shared=shared, align_concentration=kappa)
    alpha, beta = kappa * shared, kappa * (1 - shared)
    assert sim.alignment_prior(p) == pytest.approx((alpha, beta))
    quad = stats.beta(alpha, beta).expect(np.sqrt)
    assert sim.expected_text_cos(p) == pytest.approx(quad, rel=1e-8)
    cos, recorded = [], []
    for seed in range(100):  # 600 draws of a_k
        data = sim.simulate(p, seed)
        cos.append(data.anomaly @ np.pad(_text_direction(data)[:p.class_channels], (0, p.width - p.class_channels)))
        recorded.append([data.info["zero_shot"][d]["alignment"] for d in DOMAINS])
    cos, recorded = np.concatenate(cos), np.concatenate(recorded)
    # the geometry realises the drawn a_k (up to the float32 rounding of the stored text embeddings)
    np.testing.assert_allclose(cos ** 2, recorded, atol=1e-6)
    se = cos.std(ddof=1) / np.sqrt(len(cos))
    assert abs(cos.mean() - quad) < 4 * se
    se2 = (cos ** 2).std(ddof=1) / np.sqrt(len(cos))
    assert abs((cos ** 2).mean() - shared) < 4 * se2
    assert stats.kstest(recorded, stats.beta(alpha, beta).cdf).pvalue > 1e-3


def test_text_prior_point_mass_and_zero_shot_auc():
    # kappa = inf (or shared in {0, 1}): every modality has a_k = shared exactly (the fixed-fraction
    # simulator). shared = 0: lesions move orthogonally to the text direction, so the zero-shot AUC is
    # chance: |AUC - 50| < 4 Hanley-McNeil standard errors at AUC 0.5, 100 sqrt((2n + 1) / (12 n^2)).
    # shared = 1: the lesion shift lies along the text direction and zero-shot AUC is far above chance.
    n = 400
    se = 100 * np.sqrt((2 * n + 1) / (12 * n * n))
    for shared, kappa in ((0.5, float("inf")), (0.0, 2.0), (1.0, 2.0)):
        p = sim.SimParams(n_train=1, n_test=n, grid=4, n_layers=2, shared=shared, align_concentration=kappa)
        data = sim.simulate(p, 1)
        u = _text_direction(data)
        np.testing.assert_allclose(data.anomaly @ u, np.sqrt(shared), atol=1e-6)  # float32 text
        assert sim.alignment_prior(p) is None and sim.expected_text_cos(p) == pytest.approx(np.sqrt(shared))
        auc = np.array([data.info["zero_shot"][d]["image_auc"] for d in DOMAINS])
        if shared == 0.0:
            assert np.all(np.abs(auc - 50) < 4 * se)
        if shared == 1.0:
            assert np.all(auc > 50 + 10 * se)
    # the zero-shot score is the frozen text-space score <proj x, d> up to the positive factor |Q^T d|
    tok = data.test["Brain"].tokens.double().numpy()
    d = (data.text[1] - data.text[0]).double().numpy()
    frozen = ((tok @ data.proj.T) @ (d / np.linalg.norm(d))).max(axis=2).mean(axis=1)
    ratio = frozen / sim.zero_shot_scores(tok, u)
    np.testing.assert_allclose(ratio, ratio[0], rtol=1e-9)  # same u: float64 throughout
    assert ratio[0] > 0


@pytest.mark.parametrize("kw, msg", [({"shared": 1.5}, "shared"), ({"n_train": 0}, "n_train"),
                                     ({"align_concentration": 0.0}, "align_concentration"),
                                     ({"align_concentration": float("nan")}, "align_concentration"),
                                     ({"text_cos": 1.0}, "text_cos"),
                                     ({"embed_dim": 7}, "embed_dim"),
                                     ({"class_channels": 4}, "class_channels"),
                                     ({"lesion_radius": (2, 1)}, "lesion_radius"),
                                     ({"width": 10, "class_channels": 8}, "modality channels")])
def test_simulator_bad_parameters(kw, msg):
    with pytest.raises(ValueError, match=msg):
        sim.simulate(sim.SimParams(**kw), 0)


def test_head_on_simulated_tokens_shapes_and_gradients():
    p = sim.SimParams(n_train=2, n_test=2)
    data = sim.simulate(p, 0)
    torch.manual_seed(0)
    head = Head(p.width, p.embed_dim, data.text, n_layers=p.n_layers)
    f = features_from_tokens(head, data.train["Liver"].tokens)
    assert f.image_logits.shape == (p.n_layers, 4) and f.seg[0].shape == (4, p.grid ** 2, p.embed_dim)
    (f.image_logits.sum() + f.var).backward()
    assert all(a.down.weight.grad is not None for a in head.det_adapters)
    with pytest.raises(ValueError, match="tokens must have shape"):
        features_from_tokens(head, data.train["Liver"].tokens[:, :2])
