"""Recipes: every method choice of the detector as data (``--recipe paper|authors|clean``).

A :class:`Recipe` is a frozen dataclass; its fields (except ``name``) are fields of
:class:`adsim.training.train.TrainConfig` of the same name, plus ``protocol_mode`` (the protocol's default
``--mode``). Command-line flags only *override* fields of the chosen recipe (:func:`override`); a run
records the full recipe (``config.json`` -> ``"recipe"``; ``protocol.json`` for a protocol run).

* ``paper``   -- Algorithm 1 of the paper read literally (Supplementary, Sec. "Overall Framework").
* ``authors`` -- what the released code (github.com/AyushRoy2001/Beyond-Pooling) does.
* ``clean``   -- this project's default: zero-shot (target never read), numerically safe.
* ``mvfa``    -- the MVFA-AD baseline (Huang et al., CVPR 2024; github.com/MediaBrain-SJTU/MVFA-AD):
  the adapter head without VACA and without matching (``method="naive"``), MVFA's prompts, input,
  losses' data, checkpoint selection and scoring.
* ``anomalyclip`` -- the AnomalyCLIP baseline (``adsim.methods.baselines.anomalyclip``) with its training settings.
* ``aprilgan`` -- the APRIL-GAN baseline (``adsim.methods.baselines.aprilgan``) with its training settings.
* ``bilora`` -- the BiLoRA baseline (``adsim.methods.baselines.bilora``): the naive head's objective, domains
  one at a time.
* ``adaclip`` -- the AdaCLIP baseline (``adsim.methods.baselines.adaclip``) with its training settings.
* ``mao`` -- Mao et al. (``adsim.methods.baselines.mao``); no training settings are public: adsim's choices.

Where a choice could not be implemented, the field still exists, the value is listed in
:data:`NOT_IMPLEMENTED` and :func:`validate` rejects it with a one-line message; the shipped recipe
then uses the closest implemented value and ``docs/recipes.md`` says so (column "recipe value").
``docs/recipes.md`` has the side-by-side table with the source of every value.
"""
from __future__ import annotations

import ast
import dataclasses
from dataclasses import dataclass
from typing import Any

from adsim.config.choices import METRICS, SCORES
from adsim.config.prompts import PROMPT_SETS
from adsim.data.domains import SPLITS

# Allowed values of every categorical field (the first one is not special).
CHOICES = {
    # anomalyclip, aprilgan, bilora, adaclip, mao: adsim.methods.baselines.<name>
    "method": ("naive", "match", "anomalyclip", "aprilgan", "bilora", "adaclip", "mao"),
    "metric": METRICS,
    "gate_unit": ("patch", "image_mean"),
    "gate_filter": ("centroids", "skip_step"),
    "gate_mode": ("sequential", "batched"),
    "gate_tau": ("adaptive", "fixed"),
    "match_branches": ("seg+det", "seg"),
    "update": ("ema", "slerp", "slerp_delta"),
    "loss_metric": ("gate", "geodesic"),
    "inter_form": ("neg_distance", "reciprocal"),
    "vaca_branches": ("seg+det", "seg"),
    "prompts": PROMPT_SETS,
    "cls_only_pixel_loss": ("none", "normals"),
    "select": ("last", "heldout", "test"),
    "scoring": SCORES,
    "protocol_mode": ("cumulative", "sequential"),
    # Dice of a pixel map: over each image ("image"), or over each image row averaged over the rows ("row": what
    # AdaCLIP's loss.py computes at its batch size 1, where trainer.py has squeezed the mask to (H, W))
    "dice_unit": ("image", "row"),
    # AdaCLIP's hybrid semantic fusion clusters with scikit-learn's KMeans on the host ("sklearn"), or with the
    # same algorithm and random stream as tensor operations on the features' device ("torch": no host read)
    "kmeans": ("sklearn", "torch"),
}
"""Allowed values of every categorical recipe field: ``field -> tuple of values``."""
ROW_DICE_METHODS = ("adaclip",)
"""Methods whose loss implements ``dice_unit="row"`` (validation refuses it for the others)."""
KMEANS_METHODS = ("adaclip",)
"""Methods that cluster (``kmeans="torch"`` is refused for the others)."""
# Values a field may name but this build cannot run yet: (field, value) -> why.
NOT_IMPLEMENTED = {
    ("update", "slerp_delta"): "the authors' Delta-weighted slerp (train_zero_da.py:64-70) is not implemented; "
                              "use 'slerp'",
    ("vaca_branches", "seg"): "VACA on the segmentation branch only (Algorithm 1: P~_det = P_det) needs a "
                              "head change that is not implemented; use 'seg+det'",
    ("renorm_after_vaca", False): "features without renormalisation after VACA would feed arccos values "
                                  "outside [-1, 1]; the head always renormalises (use True)",
}


@dataclass(frozen=True)
class Recipe:
    """Every method choice of one recipe. See ``docs/recipes.md`` for where each value comes from."""
    name: str
    # matching (Algorithm 1, step 3)
    method: str = "match"
    metric: str = "geodesic"            # gate metric M
    gate_unit: str = "patch"            # per patch token, or per image mean token (per class)
    gate_filter: str = "centroids"      # failing features: only no centroid update / skip the sample's step
    # Algorithm 1's feature loop (exact), or batch-start centroids (one vectorised step per batch)
    gate_mode: str = "sequential"
    gate_tau: str = "adaptive"          # tau = min(d+, d-), or a fixed radius ``tau``
    tau: float = 1.0                    # fixed radius (metric units) when gate_tau == "fixed"
    match_branches: str = "seg+det"     # which features are matched: seg patches (+ det image means)
    update: str = "ema"                 # centroid update: EMA renormalised, slerp (not an EMA)
    alpha: float = 0.5
    loss_metric: str = "gate"           # distance in L_intra/L_inter: the gate's metric or always d_G
    intra_power: int = 2                # L_intra = mean d^p over the matched set
    inter_form: str = "neg_distance"    # L_inter = -d(c+, c-) / reciprocal 1/(d + 1e-6) terms
    # VACA (step 2)
    vaca: bool = True
    vaca_branches: str = "seg+det"
    renorm_after_vaca: bool = True
    gamma: float = 1.0
    # text, input, adapters
    prompts: str = "medical"
    clip_norm: bool = True
    adapter_bias: bool = True
    # the CLIP towers' MLP activation: QuickGELU (the OpenAI weights' own) or exact GELU (what a reference that
    # builds ``CLIP(**model_cfg)`` from a config without ``quick_gelu`` runs)
    quick_gelu: bool = True
    # training images replaced, with this probability, by a 2 x 2 mosaic of four images of the same domain
    # (adsim.data.mosaic; the ``aug_rate`` of APRIL-GAN's and AdaCLIP's data sets); 0: never
    aug_rate: float = 0.0
    # data and optimisation
    train_splits: tuple = ("valid", "test")
    batch_size: int = 16
    epochs: int = 10
    lr: float = 1e-4
    beta_dice: float = 1.0
    beta_focal: float = 1.0
    beta_bce: float = 1.0
    dice_unit: str = "image"            # Dice per image, or per image row (AdaCLIP's batch-1 computation)
    kmeans: str = "sklearn"             # AdaCLIP's KMeans: scikit-learn on the host, or "torch" on the device
    lambda_intra: float = 1.0
    lambda_inter: float = 0.1
    lambda_var: float = 0.1
    cls_only_pixel_loss: str = "none"   # classification-only domains: no pixel loss / normals as all-zero masks
    select: str = "last"
    # evaluation
    scoring: str = "logit_max"
    smooth_sigma: float = 4.0           # Gaussian sigma (pixels) of the pixel maps before the pixel AUC
    # protocol
    protocol_mode: str = "cumulative"


FIELDS = tuple(f.name for f in dataclasses.fields(Recipe))
"""Every field of :class:`Recipe`, in declaration order (what ``--set FIELD=VALUE`` may name)."""

RECIPES = {
    # Algorithm 1 read literally. Loss weights: the paper gives none ("selected via extensive
    # experimentation per modality"), so every beta/lambda is 1.
    "paper": Recipe(
        name="paper", gate_unit="patch", gate_filter="centroids", gate_mode="sequential", gate_tau="adaptive",
        match_branches="seg", update="ema", loss_metric="geodesic", intra_power=2, inter_form="neg_distance",
        cls_only_pixel_loss="normals",
        vaca_branches="seg+det",  # literal: "seg" (not implemented)
        renorm_after_vaca=True,    # literal: False (not implemented)
        lambda_intra=1.0, lambda_inter=1.0, lambda_var=1.0, protocol_mode="sequential"),
    # The released code (train_zero.py, train_zero_da.py, CLIP/adapter.py, dataset/medical_zero.py,
    # parse_options.py): lambda = ratio * weight = 0.036 * (0.5 intra, 1.5 inter); exact GELU (at 240 px their
    # CLIP/clip.py create_model builds CLIP(**model_cfg) from a config without quick_gelu).
    "authors": Recipe(
        name="authors", gate_unit="image_mean", gate_filter="skip_step", gate_mode="sequential",
        gate_tau="adaptive", match_branches="seg+det",
        update="slerp",  # literal: Delta-weighted slerp in the domain-addition steps (not implemented)
        loss_metric="geodesic", intra_power=1, inter_form="reciprocal", prompts="mvfa_object", clip_norm=False,
        adapter_bias=False, quick_gelu=False, train_splits=("test",), batch_size=1, epochs=10, lr=1e-4,
        lambda_intra=0.036 * 0.5, lambda_inter=0.036 * 1.5, lambda_var=1.0, cls_only_pixel_loss="none",
        select="test", scoring="authors_prob_mean",
        smooth_sigma=0.0, protocol_mode="sequential"),
    # This project's default: zero-shot, the metric enters the losses, exact sequential gate.
    "clean": Recipe(name="clean"),
    # MVFA-AD's zero-shot training and test (MediaBrain-SJTU/MVFA-AD, train_zero.py, dataset/medical_zero.py,
    # CLIP/adapter.py): adapters only (no VACA, no centroids), Resize + ToTensor input, bias-free adapters,
    # the training domains' test splits one image per step, 50 epochs at lr 1e-4, selection on the
    # target's test set, image score = layer sum of the patch-mean probability, pixel map = layer sum of
    # probabilities, no smoothing, exact GELU (CLIP/clip.py create_model at 240 px: no quick_gelu in the config).
    # Literal prompts: the domain's name (prompt.py REAL_NAME) -- not
    # implemented (one text pair per run); the object word "object" is the Beyond-Pooling fork's.
    "mvfa": Recipe(
        name="mvfa", method="naive", vaca=False, prompts="mvfa_object", clip_norm=False, adapter_bias=False,
        quick_gelu=False, train_splits=("test",), batch_size=1, epochs=50, lr=1e-4, beta_dice=1.0, beta_focal=1.0, beta_bce=1.0,
        lambda_intra=0.0, lambda_inter=0.0, lambda_var=0.0, cls_only_pixel_loss="none", select="test",
        scoring="authors_prob_mean", smooth_sigma=0.0, protocol_mode="cumulative"),
    # AnomalyCLIP (Zhou et al., ICLR 2024; zqhang/AnomalyCLIP): learned object-agnostic prompts, everything
    # else frozen; its training settings (train.py:124-136: 15 epochs, lr 1e-3, batch 8), its local-loss
    # weight lam = 4 on Focal and Dice (train.py:50, :102) and its map smoothing (test.py:111, sigma 4).
    "anomalyclip": Recipe(
        name="anomalyclip", method="anomalyclip", vaca=False, clip_norm=True, batch_size=8, epochs=15, lr=1e-3,
        beta_dice=4.0, beta_focal=4.0, beta_bce=1.0, lambda_intra=0.0, lambda_inter=0.0, lambda_var=0.0,
        cls_only_pixel_loss="none", select="last", smooth_sigma=4.0, protocol_mode="cumulative"),
    # APRIL-GAN (Chen et al., arXiv:2305.17382; ByChelsea/VAND-APRIL-GAN): per-stage linear maps, CLIP frozen;
    # its training settings (train.sh: lr 1e-3 (train.py default), batch 8, 15 epochs -- the VisA-trained run
    # whose checkpoint is tested on MVTec AD; the MVTec-trained one runs 3), Focal + Dice weight 1, no image
    # loss (beta_bce 0), its prompt ensemble (prompt_ensemble.py = MVFA's phrases and templates), CLIP
    # normalisation (open_clip's preprocess), no map smoothing (test.py has none), exact GELU (their open_clip
    # factory builds the model from a config without quick_gelu at 518 px), the 2 x 2 mosaic with aug_rate 0.2
    # (train.sh, dataset.py).
    "aprilgan": Recipe(
        name="aprilgan", method="aprilgan", vaca=False, prompts="mvfa_object", clip_norm=True, quick_gelu=False,
        aug_rate=0.2, batch_size=8,
        epochs=15, lr=1e-3, beta_dice=1.0, beta_focal=1.0, beta_bce=0.0, lambda_intra=0.0, lambda_inter=0.0,
        lambda_var=0.0, cls_only_pixel_loss="none", select="last", smooth_sigma=0.0, protocol_mode="cumulative"),
    # BiLoRA (Zhu et al., CVPR 2025; no public code): the clean recipe's naive head (no matching, no VACA:
    # the protocol method "bilora"), one frequency-domain update per training domain, the domains one at a
    # time (its Trainer's "sequential" schedule). epochs = clean's 10 PER DOMAIN, so the run takes as many
    # steps as clean's 10 pooled epochs; lr 1e-4 = clean's and the protocol's (adsim.cli.protocol); the
    # matching/VACA weights are 0 (those terms do not exist in the naive head).
    "bilora": Recipe(
        name="bilora", method="bilora", vaca=False, lambda_intra=0.0, lambda_inter=0.0, lambda_var=0.0),
    # AdaCLIP (Cao et al., ECCV 2024; caoyunkang/AdaCLIP): hybrid static + dynamic prompts in both towers, HSF;
    # its training settings (train.py:155-157: 5 epochs, lr 0.01, batch 1), loss weights 1 (trainer.py:123-135:
    # image focal + per-layer focal + two dice terms, unweighted), its prompt ensemble (adaclip.py:151-160),
    # CLIP normalisation (open_clip's preprocess) and its map smoothing (trainer.py:194, sigma 4 at 518 px); exact
    # GELU (custom_clip.py builds CLIP(**model_cfg) from a config without quick_gelu); the 2 x 2 mosaic with
    # aug_rate 0.2 of its default training sets (dataset/base_dataset.py combine_img); Dice per mask row, as
    # loss.py computes it at batch 1 on the (H, W) mask trainer.py squeezes (N = targets.size()[0] = H).
    "adaclip": Recipe(
        name="adaclip", method="adaclip", vaca=False, prompts="adaclip_object", clip_norm=True, quick_gelu=False,
        aug_rate=0.2, batch_size=1, epochs=5, lr=0.01, dice_unit="row", beta_dice=1.0, beta_focal=1.0, beta_bce=1.0, lambda_intra=0.0, lambda_inter=0.0,
        lambda_var=0.0, cls_only_pixel_loss="none", select="last", smooth_sigma=4.0, protocol_mode="cumulative"),
    # Mao et al. (CVPR 2025; github.com/Kerio99/CMAD has no code): no training setting is public, so every value
    # is adsim's choice: APRIL-GAN's optimisation (batch 8, 15 epochs, lr 1e-3), BCE + Focal + Dice weight 1,
    # lambda_intra = weight of the pull of each global prototype toward its domain's images of its class, CLIP
    # normalisation, no smoothing; prompts are not used (the model has no text encoder).
    "mao": Recipe(
        name="mao", method="mao", vaca=False, clip_norm=True, batch_size=8, epochs=15, lr=1e-3, beta_dice=1.0,
        beta_focal=1.0, beta_bce=1.0, lambda_intra=1.0, lambda_inter=0.0, lambda_var=0.0, cls_only_pixel_loss="none",
        select="last", smooth_sigma=0.0, protocol_mode="cumulative"),
}
"""The named recipes, ``paper`` / ``authors`` / ``clean`` and the baselines' (``--recipe NAME``; docs/recipes.md)."""


def names() -> tuple:
    return tuple(RECIPES)


def get(name: str) -> Recipe:
    """The shipped recipe ``name``; one-line ``ValueError`` listing the recipes otherwise."""
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; must be one of {names()}")
    return RECIPES[name]


def validate(r: Recipe) -> Recipe:
    """Every field checked (one-line ``ValueError`` naming the field and the allowed values)."""
    for field, allowed in CHOICES.items():
        v = getattr(r, field)
        if v not in allowed:
            raise ValueError(f"recipe field {field} must be one of {allowed}, got {v!r}")
    for field in ("vaca", "renorm_after_vaca", "clip_norm", "adapter_bias", "quick_gelu"):
        if not isinstance(getattr(r, field), bool):
            raise ValueError(f"recipe field {field} must be True or False, got {getattr(r, field)!r}")
    for (field, value), why in NOT_IMPLEMENTED.items():
        if getattr(r, field) == value and type(getattr(r, field)) is type(value):
            raise ValueError(f"recipe field {field}={value!r} is not implemented: {why}")
    if r.intra_power not in (1, 2):
        raise ValueError(f"recipe field intra_power must be one of (1, 2), got {r.intra_power!r}")
    for field in ("batch_size", "epochs"):
        v = getattr(r, field)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"recipe field {field} must be an integer >= 1, got {v!r}")
    for field in ("tau", "lr", "beta_dice", "beta_focal", "beta_bce", "lambda_intra", "lambda_inter",
                  "lambda_var", "gamma", "smooth_sigma"):
        v = getattr(r, field)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not v >= 0 or v != v or v == float("inf"):
            raise ValueError(f"recipe field {field} must be a finite number >= 0, got {v!r}")
    if not isinstance(r.aug_rate, (int, float)) or isinstance(r.aug_rate, bool) or not 0.0 <= r.aug_rate <= 1.0:
        raise ValueError(f"recipe field aug_rate must be a number in [0, 1], got {r.aug_rate!r}")
    if r.dice_unit == "row" and r.method not in ROW_DICE_METHODS:
        raise ValueError(f"recipe field dice_unit='row' (AdaCLIP's per-row Dice) is implemented for methods "
                         f"{ROW_DICE_METHODS} only, got method {r.method!r}; use dice_unit='image'")
    if r.kmeans != "sklearn" and r.method not in KMEANS_METHODS:
        raise ValueError(f"recipe field kmeans={r.kmeans!r} selects AdaCLIP's clustering, used by methods "
                         f"{KMEANS_METHODS} only, got method {r.method!r}; use kmeans='sklearn'")
    if not r.lr > 0 or not r.tau > 0:
        raise ValueError(f"recipe fields lr and tau must be > 0, got {r.lr!r}, {r.tau!r}")
    if not 0.0 < r.alpha < 1.0:
        raise ValueError(f"recipe field alpha must be in (0, 1), got {r.alpha!r}")
    if (not isinstance(r.train_splits, (list, tuple)) or not r.train_splits
            or any(s not in SPLITS for s in r.train_splits)):
        raise ValueError(f"recipe field train_splits must be a non-empty sequence drawn from {SPLITS}, "
                         f"got {r.train_splits!r}")
    return dataclasses.replace(r, train_splits=tuple(r.train_splits))


def override(r: Recipe, **changes) -> Recipe:
    """``r`` with ``changes`` (``None`` values ignored: a flag that was not given); unknown field names
    -> one-line ``ValueError`` listing the fields. The result is validated."""
    changes = {k: v for k, v in changes.items() if v is not None}
    bad = sorted(set(changes) - set(FIELDS) | ({"name"} & set(changes)))
    if bad:
        raise ValueError(f"unknown recipe field {bad[0]!r}; fields: {tuple(f for f in FIELDS if f != 'name')}")
    return validate(dataclasses.replace(r, **changes))


def from_dict(d: dict) -> Recipe:
    """A recipe from its recorded form (``as_dict``); unknown or missing fields are refused."""
    if not isinstance(d, dict):
        raise ValueError(f"a recipe record must be a JSON object, got {type(d).__name__}")
    unknown = sorted(set(d) - set(FIELDS))
    if unknown:
        raise ValueError(f"unknown recipe field {unknown[0]!r}; fields: {FIELDS}")
    # a JSON record's values (any type): validate() refuses a value its field does not allow
    vals: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
    return validate(Recipe(**{"name": "custom", **vals}))


def as_dict(r: Recipe) -> dict:
    """JSON-ready record of every field (tuples as lists)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(r).items()}


MAX_SET_CHARS = 200  # the longest --set value: a recipe field is a number, a word or a short tuple of them


def _scalar(v) -> bool:
    return v is None or isinstance(v, (bool, int, float, str))


def parse_sets(pairs) -> dict:
    """``["lambda_intra=0.5", "gate_unit=patch"]`` (``--set``) -> ``{field: value}``; values parsed as
    Python literals (``ast.literal_eval``, which evaluates no code) where possible, else kept as strings.
    A value is at most :data:`MAX_SET_CHARS` characters and must be a number, a string, ``True``/``False``/
    ``None`` or a flat tuple/list of those; anything else -> ``ValueError`` naming the field."""
    out = {}
    for pair in pairs or []:
        name, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"--set expects FIELD=VALUE, got {pair!r}")
        if name not in FIELDS or name == "name":
            raise ValueError(f"unknown recipe field {name!r}; fields: {tuple(f for f in FIELDS if f != 'name')}")
        if len(value) > MAX_SET_CHARS:
            raise ValueError(f"--set {name}: value longer than {MAX_SET_CHARS} characters")
        try:
            parsed = ast.literal_eval(value)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            parsed = value
        if isinstance(parsed, list):
            parsed = tuple(parsed)
        if not (_scalar(parsed) or (isinstance(parsed, tuple) and all(_scalar(v) for v in parsed))):
            raise ValueError(f"--set {name}: a value must be a number, a string, True/False/None or a flat "
                             f"tuple of those, got {type(parsed).__name__}")
        out[name] = parsed
    return out


def metric_equivalence(r: Recipe) -> str | None:
    """Why the gate metrics l2 / cosine / geodesic take *the same decisions and the same losses* under
    ``r`` (so the protocol computes one result for the three), or ``None`` where they can differ.

    On unit vectors ``l2 = sqrt(2 - 2 cos)``, ``cosine = 1 - cos`` and ``geodesic = arccos(cos)`` are
    strictly increasing functions of ``cos``: the adaptive gate ``d_own < d_other`` is the same test
    for all three. If, in addition, the losses do not use the gate metric (``loss_metric='geodesic'``)
    the whole training run is identical. A fixed ``tau`` (one radius for three different scales) or
    the metric inside ``L_intra``/``L_inter`` breaks the equivalence."""
    if r.method != "match":
        return None
    if r.gate_tau == "adaptive" and r.loss_metric == "geodesic":
        return ("adaptive gate on unit features + geodesic losses: l2, cosine and geodesic are increasing "
                "functions of <f, c>, so every gate decision and every loss is the same")
    return None
