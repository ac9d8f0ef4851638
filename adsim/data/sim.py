"""Feature-level simulator of the six BMAD modalities: frozen-backbone token features on the unit sphere.

SIMULATED data. It replaces images + frozen CLIP so that the whole domain-addition protocol runs on a
CPU; the adsim head (adapters, VACA, matching, losses, text scoring) trains on it unchanged through
``adsim.model.head.features_from_tokens``. Channels ``0 .. class_channels-1`` are the *class channels*
(where anomalies live), the rest the *modality channels*. For a seed the generator draws:

1. **Modality means** ``m_k`` in the modality channels with Gram matrix ``G`` = Table 4 of the paper
   read as mean pairwise cosines (``G_kl = E<f_k, f_l>``, ``G_kk = ||m_k||^2``; see
   ``adsim.data.reference``), optionally shrunk towards its diagonal, ``G(s) = s G + (1 - s) diag(G)``
   (``offdiag_scale`` s <= 1 widens every modality gap and keeps G positive semi-definite). ``G`` must be
   PSD to be a Gram matrix: :func:`check_gram` tests it and, if not, projects it onto the PSD cone
   (eigenvalues clipped at 1e-6, diagonal restored by a congruence) and records ``psd_projected``.
   Paper Table 4 is positive definite, so no projection happens by default.
2. **Image features** ``g = m_k + sqrt(1 - ||m_k||^2) z`` with ``z`` a unit vector orthogonal to ``m_k``
   and isotropic otherwise: ``||g|| = 1``, ``E[g] = m_k``, so mean pairwise cosines reproduce ``G``
   exactly in expectation (diagonal = intra-modality spread, off-diagonal = centroid similarities).
3. **Patch tokens** per layer ``l`` and patch ``n``: ``normalize(patch_cos * g + sqrt(1 - patch_cos^2) xi)``
   with ``xi`` unit and orthogonal to ``g`` (independent draws per layer: the layers see the same image
   and lesion through different patch-level noise).
4. **Text prior** (the zero-shot transfer is drawn, never set per modality). Text embeddings
   ``(t_normal, t_anomaly)``: ``t_normal`` uniform on the unit sphere of dimension ``embed_dim``,
   ``t_anomaly = text_cos t_normal + sqrt(1 - text_cos^2) e`` with ``e`` uniform among unit vectors
   orthogonal to ``t_normal`` (CLIP's normal/abnormal prompt embeddings are highly similar);
   ``d = normalize(t_anomaly - t_normal)`` is the text anomaly direction. The frozen backbone's
   projection into the joint space, ``proj = [Q 0]`` (``(E, W)``, ``Q`` a Haar-random ``E x C``
   isometry on the class channels, as CLIP's ``visual.proj``), pulls it back to the token-space text
   direction ``u = normalize(Q^T d)`` (uniform on the class-channel sphere). Modality ``k``'s anomaly
   direction is ``v_k = sqrt(a_k) u + sqrt(1 - a_k) w_k`` with ``w_k`` a unit vector orthogonal to
   ``u`` and the *text alignment* ``a_k ~ Beta(kappa m, kappa (1 - m))`` drawn independently per
   modality and seed from a meta-distribution with mean ``m = shared`` and concentration
   ``kappa = align_concentration`` (``m`` in {0, 1} or ``kappa = inf``: the point mass at ``m``, the
   old fixed-fraction simulator). So ``cos(v_k, u) = sqrt(a_k)``, ``E cos(v_k, u) =
   B(alpha + 1/2, beta) / B(alpha, beta)`` (:func:`expected_text_cos`), and the zero-shot score of a
   patch ``x``, ``<proj x, d> = |Q^T d| <x, u>``, separates modality ``k``'s lesions by a shift of
   ``anomaly_shift sqrt(a_k)`` before any training (``info["zero_shot"]`` records ``a_k`` and the
   measured zero-shot image AUC per modality). ``u`` is shared by all modalities, so ``a_k`` is also
   the part of the anomaly direction that transfers across modalities: ``cos(v_k, v_l) =
   sqrt(a_k a_l) + sqrt((1 - a_k)(1 - a_l)) <w_k, w_l>``. With ``couple_anomalies`` the ``w_k`` have
   the same correlation as the modality centroids (modalities that look alike have alike lesions);
   otherwise they are independent.
5. **Anomalies**: an anomalous image has a blob lesion on the ``grid x grid`` patch grid (radius uniform
   in ``lesion_radius`` patches, at least one patch); its lesion patches become
   ``normalize(f + anomaly_shift * v_k)``. Masks (the lesion blob) are given for Brain, Liver and
   Retina_RESC only, as in BMAD.

Defaults were fixed once, before any comparison of methods and never on a target: the sizes for speed;
``anomaly_shift = 0.45`` because with it the *naive* method's AUC on its own *training* modalities lands in
the range of the paper's real AUCs (image AUC 73-90, pixel AUC 93-96 at 3-4 passes), while 0.6 saturated
(96-100) and 0.3 left image AUC near chance; ``couple_anomalies`` and ``shared = 0.5`` as the neutral
middle of "partly shared, partly modality specific"; ``align_concentration = 2`` makes the default prior
``Beta(1, 1)``, the uniform distribution of ``a_k`` on [0, 1] (no preferred alignment; chosen with the
prior's form, before any run, not tuned on any result). ``text_cos = 0.8`` only scales the logits
(``|t_anomaly - t_normal| = sqrt(2 - 2 text_cos)``), not which patches they rank first. The sweep
(``adsim.experiments.sweep``) shows how the conclusions move with ``shared``, ``align_concentration``,
``anomaly_shift`` and ``offdiag_scale``.

Shapes: ``tokens (n, L, N, W)`` float32 with ``N = grid^2``, ``W = width``; ``masks (n, grid, grid)``.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from scipy import special

from adsim.data.domains import DOMAINS, MASKED
from adsim.data.reference import table4
from adsim.data.simparams import SWEEP, SimParams  # noqa: F401  (SWEEP: part of this module's API)
from adsim.metrics.functional import auc_percent


class Split(NamedTuple):
    tokens: torch.Tensor    # (n, L, N, W) float32, unit rows
    labels: torch.Tensor    # (n,) 0 normal / 1 anomalous
    masks: torch.Tensor     # (n, grid, grid) 0/1 lesion mask (zeros where unknown)
    has_mask: torch.Tensor  # (n,) 1 where the pixel mask is known (normal images, masked domains)
    pixel_domain: torch.Tensor  # (n,) 1 where the domain has pixel masks (BMAD: Brain, Liver, Retina_RESC)


class SimData(NamedTuple):
    train: dict             # domain -> Split
    test: dict              # domain -> Split
    text: torch.Tensor      # (2, E) unit rows (normal, anomaly)
    gram: np.ndarray        # (6, 6) the Gram matrix the means were built from (DOMAINS order)
    info: dict              # PSD check (eigenvalues, projected flag); "prior"; "zero_shot" per domain
    proj: np.ndarray        # (E, W) the frozen projection of tokens into the text space
    anomaly: np.ndarray     # (6, W) unit anomaly directions v_k (DOMAINS order)


def validate(params: SimParams) -> SimParams:
    p = params
    for name in ("width", "embed_dim", "class_channels", "grid", "n_layers", "n_train", "n_test"):
        v = getattr(p, name)
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"simulator parameter {name} must be an integer >= 1, got {v!r}")
    if p.width - p.class_channels < len(DOMAINS):
        raise ValueError(f"width - class_channels must be >= {len(DOMAINS)} modality channels, "
                         f"got {p.width} - {p.class_channels}")
    if p.class_channels > p.embed_dim:
        raise ValueError(f"class_channels must be <= embed_dim (the text projection is an isometry on them), "
                         f"got {p.class_channels} > {p.embed_dim}")
    if p.couple_anomalies and p.class_channels < len(DOMAINS) + 1:
        raise ValueError(f"class_channels must be >= {len(DOMAINS) + 1} with couple_anomalies, "
                         f"got {p.class_channels}")
    for name, lo, hi in (("patch_cos", 0.0, 1.0), ("shared", 0.0, 1.0), ("offdiag_scale", 0.0, 1.0),
                         ("text_cos", -1.0, 1.0)):  # text_cos = 1 is refused below (no text direction)
        v = getattr(p, name)
        if not (isinstance(v, (int, float)) and lo <= v <= hi):
            raise ValueError(f"simulator parameter {name} must be in [{lo}, {hi}], got {v!r}")
    if p.text_cos == 1:
        raise ValueError("simulator parameter text_cos must be < 1 (t_anomaly = t_normal has no direction)")
    k = p.align_concentration
    if not (isinstance(k, (int, float)) and not np.isnan(k) and k > 0):
        raise ValueError(f"simulator parameter align_concentration must be > 0 (inf allowed), got {k!r}")
    if not (isinstance(p.anomaly_shift, (int, float)) and p.anomaly_shift >= 0):
        raise ValueError(f"simulator parameter anomaly_shift must be >= 0, got {p.anomaly_shift!r}")
    r = tuple(p.lesion_radius)
    if len(r) != 2 or not 0 < r[0] <= r[1]:
        raise ValueError(f"lesion_radius must be (lo, hi) with 0 < lo <= hi, got {p.lesion_radius!r}")
    return p._replace(lesion_radius=r, couple_anomalies=bool(p.couple_anomalies))


def check_gram(g: np.ndarray, eps: float = 1e-6) -> tuple:
    """``(G_psd, info)``: ``G`` unchanged if positive semi-definite, else its projection onto the PSD cone
    (eigenvalues clipped at ``eps``) rescaled by a congruence to keep the diagonal."""
    g = 0.5 * (np.asarray(g, dtype=float) + np.asarray(g, dtype=float).T)
    eig = np.linalg.eigvalsh(g)
    info = {"eigenvalues": eig.tolist(), "psd_projected": False}
    if eig.min() >= 0:
        return g, info
    w, v = np.linalg.eigh(g)
    fixed = (v * np.maximum(w, eps)) @ v.T
    d = np.sqrt(np.diag(g) / np.diag(fixed))
    info["psd_projected"] = True
    return fixed * np.outer(d, d), info


def _unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _orth_unit(rng, base):
    """Unit vectors shaped like ``base``, each isotropic in the complement of its unit row of ``base``."""
    z = rng.standard_normal(base.shape)
    z = z - np.sum(z * base, axis=-1, keepdims=True) * base
    return _unit(z)


def alignment_prior(p: SimParams) -> tuple[float, float] | None:
    """``(alpha, beta)`` of the text-alignment prior ``a_k ~ Beta(alpha, beta)``, or ``None`` for the
    point mass at ``shared`` (``shared`` in {0, 1} or ``align_concentration = inf``)."""
    m, k = float(p.shared), float(p.align_concentration)
    if m in (0.0, 1.0) or np.isinf(k):
        return None
    return k * m, k * (1.0 - m)


def expected_text_cos(p: SimParams) -> float:
    """Closed form of ``E cos(v_k, u) = E sqrt(a_k)``: ``B(alpha + 1/2, beta) / B(alpha, beta)`` for
    ``a_k ~ Beta(alpha, beta)``, ``sqrt(shared)`` for the point mass."""
    ab = alignment_prior(p)
    if ab is None:
        return float(np.sqrt(p.shared))
    return float(np.exp(special.betaln(ab[0] + 0.5, ab[1]) - special.betaln(*ab)))


def _text(p: SimParams, rng) -> tuple:
    """Text embeddings ``(2, E)``, frozen projection ``proj (E, W)`` and the token-space text direction
    ``u (C,)`` (unit, class channels) -- step 4 of the module docstring."""
    t_n = _unit(rng.standard_normal(p.embed_dim))
    t_a = p.text_cos * t_n + np.sqrt(1 - p.text_cos ** 2) * _orth_unit(rng, t_n)
    q, _ = np.linalg.qr(rng.standard_normal((p.embed_dim, p.class_channels)))  # Haar E x C isometry
    proj = np.zeros((p.embed_dim, p.width))
    proj[:, :p.class_channels] = q
    return np.stack([t_n, t_a]), proj, _unit(q.T @ _unit(t_a - t_n))


def _alignments(p: SimParams, rng) -> np.ndarray:
    """``(6,)`` text alignments ``a_k`` drawn from the prior (:func:`alignment_prior`)."""
    ab = alignment_prior(p)
    return np.full(len(DOMAINS), float(p.shared)) if ab is None else rng.beta(*ab, size=len(DOMAINS))


def _directions(p: SimParams, gram: np.ndarray, u: np.ndarray, align: np.ndarray, rng) -> tuple:
    """Modality means ``(6, W)`` and unit anomaly directions ``(6, W)``: ``v_k = sqrt(a_k) u +
    sqrt(1 - a_k) w_k`` with ``w_k`` unit, orthogonal to the text direction ``u`` (class channels)."""
    k, c = len(DOMAINS), p.class_channels
    basis, _ = np.linalg.qr(rng.standard_normal((p.width - c, p.width - c)))
    means = np.zeros((k, p.width))
    means[:, c:] = np.linalg.cholesky(gram + 1e-12 * np.eye(k)) @ basis[:, :k].T
    # orthonormal basis of the class channels whose first vector is u (QR of [u, Gaussian columns])
    cb, _ = np.linalg.qr(np.column_stack([u, rng.standard_normal((c, c - 1))]))
    cb[:, 0] = u
    if p.couple_anomalies:
        d = np.sqrt(np.diag(gram))
        corr = gram / np.outer(d, d)
        spec = np.linalg.cholesky(corr + 1e-12 * np.eye(k)) @ cb[:, 1:k + 1].T
    else:
        spec = _orth_unit(rng, np.broadcast_to(u, (k, c)))
    anomaly = np.zeros((k, p.width))
    anomaly[:, :c] = np.sqrt(align)[:, None] * u + np.sqrt(1 - align)[:, None] * spec
    return means, anomaly


def zero_shot_scores(tokens, u: np.ndarray) -> np.ndarray:
    """``(n,)`` zero-shot image score before any training: layer mean of the max over patches of
    ``<x, u>`` (proportional to ``<proj x, d>``, the frozen text-space score; the analogue of the
    head's ``logit_max``). ``tokens: (n, L, N, W)``, ``u: (W,)``."""
    return (np.asarray(tokens, dtype=float) @ u).max(axis=2).mean(axis=1)


def _blobs(p: SimParams, n: int, rng) -> np.ndarray:
    yy, xx = np.mgrid[0:p.grid, 0:p.grid] + 0.5
    centre = rng.uniform(0, p.grid, (n, 2))
    radius = rng.uniform(*p.lesion_radius, n)
    d = np.hypot(yy - centre[:, 0, None, None], xx - centre[:, 1, None, None])
    masks = d <= radius[:, None, None]
    nearest = d.reshape(n, -1).argmin(1)  # at least one lesion patch
    masks.reshape(n, -1)[np.arange(n), nearest] = True
    return masks


def _split(p: SimParams, mean, anomaly, n_per_class: int, masked: bool, rng) -> Split:
    n, n_patch = 2 * n_per_class, p.grid ** 2
    a = float(np.linalg.norm(mean))  # mean is float64 (_directions): the same value as a Python float
    g = mean + np.sqrt(max(1.0 - a ** 2, 0.0)) * _orth_unit(rng, np.broadcast_to(mean / a, (n, p.width)))
    labels = np.repeat([0, 1], n_per_class)
    masks = _blobs(p, n, rng) * labels[:, None, None].astype(bool)
    gb = np.broadcast_to(g[:, None, None, :], (n, p.n_layers, n_patch, p.width))
    xi = _orth_unit(rng, gb)
    tokens = p.patch_cos * gb + np.sqrt(1 - p.patch_cos ** 2) * xi
    lesion = masks.reshape(n, 1, n_patch, 1)
    tokens = _unit(tokens + p.anomaly_shift * lesion * anomaly)
    has_mask = np.where(labels == 0, 1.0, 1.0 if masked else 0.0)
    shown = masks if masked else np.zeros_like(masks)
    return Split(torch.from_numpy(tokens.astype(np.float32)), torch.from_numpy(labels.astype(np.float32)),
                 torch.from_numpy(shown.astype(np.float32)), torch.from_numpy(has_mask.astype(np.float32)),
                 torch.full((n,), float(masked)))


def simulate(params: SimParams = SimParams(), seed: int = 0) -> SimData:
    """Draw the six simulated modalities (train and test splits) and the text embeddings for ``seed``."""
    p = validate(params)
    base = table4(DOMAINS)
    gram, info = check_gram(p.offdiag_scale * base + (1 - p.offdiag_scale) * np.diag(np.diag(base)))
    rng = np.random.default_rng([seed, 20260])
    text, proj, u_c = _text(p, rng)
    align = _alignments(p, rng)
    means, anomaly = _directions(p, gram, u_c, align, rng)
    train, test = {}, {}
    for k, d in enumerate(DOMAINS):
        train[d] = _split(p, means[k], anomaly[k], p.n_train, d in MASKED, rng)
        test[d] = _split(p, means[k], anomaly[k], p.n_test, d in MASKED, rng)
    u = np.zeros(p.width)
    u[:p.class_channels] = u_c
    ab = alignment_prior(p)
    info["prior"] = {"shared_mean": float(p.shared), "concentration": float(p.align_concentration),
                     "beta": None if ab is None else [float(ab[0]), float(ab[1])],
                     "expected_text_cos": expected_text_cos(p)}
    info["zero_shot"] = {d: {"alignment": float(align[k]), "text_cos": float(anomaly[k] @ u),
                             "image_auc": auc_percent(test[d].labels.numpy(), zero_shot_scores(test[d].tokens, u))}
                         for k, d in enumerate(DOMAINS)}
    return SimData(train, test, torch.from_numpy(text.astype(np.float32)), gram, info, proj, anomaly)


def image_features(tokens) -> np.ndarray:
    """``(n, W)`` unit image features: the normalised mean of the *last layer's* patch tokens."""
    t = np.asarray(tokens[:, -1], dtype=float)
    return _unit(t.mean(axis=1))


def similarity(feats: dict) -> tuple:
    """Table-4-style similarity from unit image features ``{domain: (n, d)}``: ``(names, S)`` with
    ``S_AB`` = mean cosine over pairs (a in A, b in B), self-pairs excluded on the diagonal."""
    names = tuple(feats)
    sums = {d: np.asarray(f, dtype=float).sum(0) for d, f in feats.items()}
    counts = {d: len(f) for d, f in feats.items()}
    s = np.empty((len(names), len(names)))
    for i, a in enumerate(names):
        for j, b in enumerate(names):
            if i == j:  # ||sum||^2 = n + sum over ordered pairs i != j of cos
                n = counts[a]
                s[i, j] = (sums[a] @ sums[a] - n) / (n * (n - 1))
            else:
                s[i, j] = sums[a] @ sums[b] / (counts[a] * counts[b])
    return names, s
