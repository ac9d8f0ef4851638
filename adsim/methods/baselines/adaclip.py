"""AdaCLIP: Cao et al., "AdaCLIP: Adapting CLIP with Hybrid Learnable Prompts for Zero-Shot Anomaly
Detection", ECCV 2024 (arXiv:2407.15795). Trained on the auxiliary domains by ``python -m adsim train --recipe
adaclip`` (or ``--method adaclip``), rebuilt from the run folder by the ``TRAINED`` registry. Reference code:
github.com/caoyunkang/AdaCLIP (commit ``e27ee32``; ``method/adaclip.py``, ``method/trainer.py``, ``train.py``,
``loss.py``). File:line references below are to that commit.

What this file computes (``B`` images, ``N = grid**2`` patches, ``L`` = 4 feature stages after the blocks
``spec.adapter_layers`` -- ViT-L: 6, 12, 18, 24 as their ``features_list``, ``train.py:46-49``; ``P`` = 5 prompt
tokens; ``J`` = 4 prompted layers; ``W`` visual width, ``D`` text width, ``E`` joint dimension):

* **Static prompts** (``PromptLayer``, ``adaclip.py:35-143``; ``--prompting_depth 4 --prompting_length 5
  --prompting_type SD --prompting_branch VL``, ``train.py:164-169``), init N(0, 0.02^2):
  visual ``(J, P, W)``: appended after the class and patch tokens before block 1, replacing the last ``P``
  tokens before blocks 2 .. J, then carried through the remaining blocks and dropped from every output
  (``forward_visual``; :func:`adsim.model.prompting.run_prompted_blocks`). Text ``(J - 1, P, D)``:
  overwrite the hidden states at positions ``1 .. P`` before blocks 2 .. J (``forward_text``: at the first
  layer the sentence enters unchanged, so their first-layer text prompt never acts and is not allocated
  here; :func:`adsim.model.prompting.encode_text_deep`). ``J`` is capped at each tower's depth.
* **Dynamic prompts** (``generate_and_set_dynamic_promtps``, ``adaclip.py:405-414``): the FROZEN tower's
  image embedding (pooled class token, ``ln_post``, projection; not normalised) through ``Linear(E, P W)``
  and ``Linear(E, P D)`` (their ``ProjectLayer`` of ``P`` separate ``Linear(E, W)`` heads = one
  ``Linear(E, P W)``, same initialisation distribution), added to every layer's static prompts of the
  visual and the text tower: each image gets its own text embeddings.
* **Text** (``TextEmbebddingLayer``, ``adaclip.py:146-230``): 7 normal and 5 abnormal state phrases x 4
  templates (recipe ``prompts="adaclip_object"``) through the prompted text tower per image, unit
  embeddings averaged and renormalised per state -> ``text (B, 2, E)``.
* **Patch features** (``patch_token_layer``, ``proj_visual_tokens``, ``adaclip.py:375-379, :477-488``): the raw
  block outputs of the PROMPTED visual tower after the ``L`` stages, class token dropped, through one
  ``Linear(W, E)`` per stage, unit -- APRIL-GAN's maps (``aprilgan.stage_features``).
  **Image feature**: the prompted tower's image embedding through ``Linear(E, E)`` (``cls_token_layer``), unit.
* **Patch log-odds** ``z_l = (<p, t_a> - <p, t_n>) / 0.01`` with the image's own text (their ``100 p @ T``).
* **Hybrid semantic fusion** (``HybridSemanticFusion``, ``adaclip.py:233-286``; ``visual_text_similarity``,
  ``:516-527``), ``hsf="code"`` (default; what their code runs): the ``5 k`` (``k = 20``) patches of highest
  layer-mean log-odds (their softmax probability of the layer-mean logits: the same order where float32
  does not saturate to ties); their ``L`` unit features concatenated, clustered by scikit-learn
  ``KMeans(k, n_init="auto")`` -- here with ``random_state=KMEANS_SEED`` so that the score is deterministic
  (theirs has no seed); each cluster's centre = mean of its members' features over all layers; ``c`` = the
  mean of the cluster centres, unit. ``hsf="paper"``: the paper's description, which their code keeps
  commented out (``adaclip.py:288-330``): KMeans over all patches of the layer-mean features, ``c`` = unit
  centroid of the cluster with the highest mean anomaly probability. Recipe field ``kmeans="torch"``
  (opt-in): the same KMeans as batched tensor operations on the device (:func:`kmeans_torch`; no host
  read). Fused image feature
  ``normalize(0.2 c + 0.8 f)``; ``hsf="off"``: ``f`` alone (their ``--use_hsf False``).
* **Image score** ``z_img = (<f_fused, t_a> - <f_fused, t_n>) / 0.01`` -- the log-odds of their
  ``softmax(100 f T)[1]`` (same ranking, never saturates).
* **Pixel map** (``adaclip.py:529-540``): per layer the two-channel logits bilinearly upsampled with
  ``align_corners=True``, mean over layers, softmax, ``(p_a + 1 - p_n) / 2``. For a two-way softmax
  ``p_n = 1 - p_a``, so their map is ``sigmoid(mean_l up(z_l))``: ``map_score="prob"``; default
  ``"logit_mean"``: ``mean_l up(z_l)`` (its log-odds; same ranking, no saturation).
* **Loss** (``trainer.py:103-141``, ``loss.py``): ``Focal(softmax image logits, label)`` +
  ``sum_l [Focal(softmax(up(logits_l)), mask) + Dice(p_a, mask) + Dice(p_n, 1 - mask)]`` on the per-layer
  upsampled (``align_corners=True``) maps, masks and labels binarised at 0.5, the image score through HSF as
  at test time. Weights ``beta_bce`` (the image focal term), ``beta_focal``, ``beta_dice`` (recipe 1, 1, 1).
  Dice per mask ROW, averaged over the rows (recipe ``dice_unit="row"``): at their batch size 1
  ``trainer.py`` squeezes the mask to ``(H, W)`` and ``loss.py``'s ``BinaryDiceLoss`` takes
  ``N = targets.size()[0]`` = ``H``; ``dice_unit="image"`` gives one Dice per image.
* **Run set-up of the recipe** (``adsim.config.recipes``): exact GELU in both towers (``quick_gelu=False``:
  their ``custom_clip.py`` builds ``CLIP(**model_cfg)`` from a config without ``quick_gelu``); training
  images replaced with probability ``aug_rate = 0.2`` by a 2 x 2 mosaic of four images of the same domain
  (``adsim.data.mosaic``; their ``dataset/base_dataset.py`` ``combine_img``).

Where this differs from their code (also in ``docs/recipes.md``, which counts them): KMeans seeded; class name -> the prompt
set's object word; Focal without their label smoothing (1e-5); the backbone's image size (they use 518 px);
the other BMAD domains as training data (they train on MVTec AD + ColonDB); Adam (the run's optimiser,
betas (0.5, 0.999), no weight decay; theirs AdamW, weight decay 0.01) and gradient clipping 1.0; checkpoint
``select="last"`` (theirs: best pixel F1 on the test data set); batches of any size, each image with its own
prompts (their code supports batch 1 only, ``train.py:177-179``; at a batch above 1 ``dice_unit="row"`` is
their per-row Dice of each image); classification-only domains contribute the image loss only; the run's
precision (bf16 autocast on a GPU, float32 on the CPU) where theirs is fp16 autocast.
"""
from __future__ import annotations

import functools

import numpy as np
import torch
from torch import nn

from adsim.config.prompts import prompt_texts
from adsim.methods.baselines.aprilgan import stage_features
from adsim.methods.baselines.common import check_images, image_embedding, layer_targets, load_checked, positive_int
from adsim.methods.registry import Method, Output, Trainer, register_trained, register_trainer
from adsim.model import losses
from adsim.model.backbone import run_blocks, upsample_patches
from adsim.model.prompting import encode_text_deep, pooled_length, run_prompted_blocks
from adsim.runtime.eager import outside_graphs
from poolsim import core

LENGTH, DEPTH = 5, 4       # --prompting_length 5, --prompting_depth 4 (train.py:164-165)
INIT_STD = 0.02            # nn.init.normal_(std=0.02) of the static prompts (adaclip.py:54-55)
TEMPERATURE = 0.01         # their 100.0 * features @ text (adaclip.py:513, :525)
K_CLUSTERS = 20            # --k_clusters 20 (train.py:173); 5 k top patches (adaclip.py:238)
TOP_PER_CLUSTER = 5
HSF_ALPHA = 0.2            # alpha * clustered + (1 - alpha) * image feature (adaclip.py:517-520)
KMEANS_SEED = 0            # fixed random_state: the image score is a deterministic function of the image
HSF_MODES = ("code", "paper", "off")
KMEANS_BACKENDS = ("sklearn", "torch")  # HSF's clustering: scikit-learn on the host, or kmeans_torch on the device
MAP_SCORES = ("logit_mean", "prob")


class HybridPrompts(nn.Module):
    """The trainable state of AdaCLIP: ``visual_static (J, P, W)``, ``text_static (J_text - 1, P, D)``, the
    dynamic-prompt generators ``dyn_visual: Linear(E, P W)`` and ``dyn_text: Linear(E, P D)``, the per-stage
    patch maps ``fc[l]: Linear(W, E)`` and ``cls: Linear(E, E)``. ``tokens (S, T)`` the tokenised prompt
    sentences (normal first, ``n_normal`` of them) is a buffer that is not saved (rebuilt from the run's
    prompts). ``kmeans``: the clustering of hybrid semantic fusion (:data:`KMEANS_BACKENDS`; the recipe field
    of the same name), a setting, not saved state."""

    tokens: torch.Tensor
    """``(S, T)`` the tokenised prompt sentences, normal first: a buffer that is not saved."""

    def __init__(self, backbone, texts: dict, *, length: int = LENGTH, depth: int = DEPTH, seed: int = 0,
                 kmeans: str = "sklearn"):
        super().__init__()
        for name, v in (("length", length), ("depth", depth)):
            positive_int(name, v)
        if kmeans not in KMEANS_BACKENDS:
            raise ValueError(f"kmeans must be one of {KMEANS_BACKENDS}, got {kmeans!r}")
        self.kmeans = kmeans
        if not isinstance(texts, dict) or not texts.get("normal") or not texts.get("anomaly"):
            raise ValueError(f"texts must be a dict with non-empty 'normal' and 'anomaly' sentence lists, got "
                             f"{sorted(texts) if isinstance(texts, dict) else type(texts).__name__}")
        spec, model = backbone.spec, backbone.model
        tokens = backbone.tokenizer(list(texts["normal"]) + list(texts["anomaly"]))
        if tokens.shape[1] <= length:
            raise ValueError(f"length must be below the text context ({tokens.shape[1]}), got {length}")
        width_text = model.token_embedding.weight.shape[1]
        v_depth = min(depth, len(model.visual.transformer.resblocks))
        t_depth = min(depth, len(model.transformer.resblocks))
        e, w = spec.embed_dim, spec.width
        with torch.random.fork_rng(devices=[]):  # the initialisation depends on ``seed`` only
            torch.manual_seed(seed)
            self.visual_static = nn.Parameter(INIT_STD * torch.randn(v_depth, length, w))
            self.text_static = nn.Parameter(INIT_STD * torch.randn(t_depth - 1, length, width_text))
            self.dyn_visual = nn.Linear(e, length * w)
            self.dyn_text = nn.Linear(e, length * width_text)
            self.fc = nn.ModuleList([nn.Linear(w, e) for _ in spec.adapter_layers])
            self.cls = nn.Linear(e, e)
        self.register_buffer("tokens", tokens.to(model.token_embedding.weight.device), persistent=False)
        self.length, self.n_normal = length, len(texts["normal"])
        self.pooled = pooled_length(tokens)  # encode_text_deep's cut, read once on the host


def frozen_embedding(backbone, images: torch.Tensor) -> torch.Tensor:
    """``(B, E)`` image embedding of the unprompted frozen visual tower (not normalised), without gradient:
    the input of the dynamic-prompt generators (their ``self.visual.forward``, ``adaclip.py:406-408``)."""
    visual = backbone.model.visual
    with torch.no_grad():
        return image_embedding(visual, run_blocks(backbone, visual._embeds(images), visual.transformer.resblocks))


def dynamic_prompts(prompts: HybridPrompts, embedding: torch.Tensor) -> tuple:
    """``embedding (B, E)`` -> ``(visual (B, P, W), text (B, P, D))`` image-conditioned prompts."""
    b, p = embedding.shape[0], prompts.length
    x = embedding.to(prompts.dyn_visual.weight.dtype)
    return prompts.dyn_visual(x).view(b, p, -1), prompts.dyn_text(x).view(b, p, -1)


def prompted_visual(backbone, prompts: HybridPrompts, images: torch.Tensor, dyn_visual: torch.Tensor) -> tuple:
    """``images (B, 3, S, S)`` through the visual tower with static + dynamic prompts -> ``(image embedding
    (B, E) not normalised, [L x (B, N, W)] raw patch tokens after the stages)``."""
    visual = backbone.model.visual
    layer_prompts = [s + dyn_visual for s in prompts.visual_static]  # (B, P, W) per prompted block
    x, caps = run_prompted_blocks(backbone, visual._embeds(images), layer_prompts,
                                  capture=backbone.spec.adapter_layers)
    return image_embedding(visual, x), [c[:, 1:] for c in caps]


def text_features(backbone, prompts: HybridPrompts, dyn_text: torch.Tensor) -> torch.Tensor:
    """``dyn_text (B, P, D)`` -> ``(B, 2, E)`` unit text embeddings (normal, anomalous) per image: every prompt
    sentence through the text tower with that image's prompts, unit embeddings averaged and renormalised."""
    b, (s, _) = dyn_text.shape[0], prompts.tokens.shape
    deep = [(layer + dyn_text)[:, None].expand(-1, s, -1, -1).reshape(b * s, *layer.shape)
            for layer in prompts.text_static]
    emb = encode_text_deep(backbone, prompts.tokens.repeat(b, 1), deep=deep, length=prompts.pooled).view(b, s, -1)
    n = prompts.n_normal
    return torch.stack([core.normalize(emb[:, :n].mean(1)), core.normalize(emb[:, n:].mean(1))], dim=1)


def per_image_log_odds(features: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
    """``features (B, ..., E)`` unit, ``text (B, 2, E)`` -> ``(B, ...)``: ``(<f, t_a> - <f, t_n>) / 0.01`` with
    each image's own text."""
    diff = (text[:, 1] - text[:, 0]).float()
    return torch.einsum("b...e,be->b...", features.float(), diff) / TEMPERATURE


def _kmeans_labels(data: torch.Tensor, k: int) -> torch.Tensor:
    """Cluster labels ``(n,)`` of the rows of ``data (n, d)`` by scikit-learn's KMeans (``k`` clusters,
    ``n_init="auto"``, ``random_state=KMEANS_SEED``), on the CPU in float32, without gradient."""
    from sklearn.cluster import KMeans  # imported on first use: loading the method registry stays light
    from threadpoolctl import threadpool_limits

    x = data.detach().float().cpu().numpy()
    # one BLAS/OpenMP thread: a few hundred rows, where threads cost more than they save (k-means++'s distance
    # products on 100 x 3072 rows: ~40 ms in one thread, 200-700 ms with two busy cores' threads)
    with threadpool_limits(limits=1):
        labels = KMeans(n_clusters=k, n_init="auto", random_state=KMEANS_SEED).fit_predict(x)
    return torch.from_numpy(np.asarray(labels, dtype=np.int64)).to(data.device)


@functools.lru_cache(maxsize=16)
def _kmeans_draws(n: int, k: int, seed: int) -> tuple:
    """``(first, uniforms (k - 1, trials))``: the random numbers scikit-learn's k-means++ draws from
    ``RandomState(seed)`` for ``n`` unit-weight samples and ``k`` clusters -- the first centre's index
    (``choice(n, p=w / w.sum())``) and, per further centre, ``uniform(size=2 + int(log k))`` -- drawn by
    numpy's RandomState in the same calls and order, so they are the same numbers. They do not depend on
    the data: computed once per ``(n, k, seed)`` on the host."""
    rs = np.random.RandomState(seed)
    w = np.ones(n, dtype=np.float32)
    first = int(rs.choice(n, p=w / w.sum()))
    trials = 2 + int(np.log(k))
    uniforms = np.stack([rs.uniform(size=trials) for _ in range(k - 1)]) if k > 1 else np.zeros((0, trials))
    return first, uniforms


@functools.lru_cache(maxsize=16)
def _kmeans_draws_on(device: torch.device, n: int, k: int, seed: int) -> tuple:
    """:func:`_kmeans_draws` with the uniforms as a float64 tensor on ``device``, copied once (a copy from
    pageable host memory waits for the device: not in every step)."""
    first, uniforms = _kmeans_draws(n, k, seed)
    return first, torch.as_tensor(uniforms, dtype=torch.float64, device=device)


def _sq_distances(a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``(B, m, n)`` squared distances of ``a (B, m, d)`` to ``x (B, n, d)``, computed in float64 as
    ``|a|^2 - 2 a.x + |x|^2``, clipped at 0 and rounded to float32 (scikit-learn's float32 path)."""
    a64, x64 = a.double(), x.double()
    d = -2 * (a64 @ x64.transpose(1, 2)) + (a64 * a64).sum(-1)[..., None] + (x64 * x64).sum(-1)[:, None]
    return d.clamp(min=0).float()


def kmeans_torch(data: torch.Tensor, k: int, *, seed: int = KMEANS_SEED, max_iter: int = 300,
                 tol: float = 1e-4) -> torch.Tensor:
    """Cluster labels ``(B, n)`` of the rows of each ``data[b] (n, d)``: scikit-learn's ``KMeans(k,
    n_init="auto", random_state=seed)`` (k-means++ seeding with 2 + int(log k) local trials, Lloyd
    iterations, its convergence rule) as batched tensor operations on ``data``'s device, without a host
    read: every image runs ``max_iter`` iterations, frozen once converged (labels unchanged, or a total
    squared centre shift <= ``tol`` x the mean per-feature variance), then the final assignment.

    Written here rather than taken from a library: the point is scikit-learn's algorithm and random
    stream (:func:`_kmeans_draws`) without its host round trip. Same labels as scikit-learn where no
    float32 rounding decides a choice: the data are centred, distances of the seeding are float64
    rounded to float32 as scikit-learn's, Lloyd's distances and means float32 (in other summation
    orders); an empty cluster takes the point farthest from its centre, several empty clusters the
    farthest points in descending order (scikit-learn's ``argpartition`` order may differ there)."""
    # max_iter unrolled iterations would make a graph of thousands of nodes: it runs between compiled graphs
    return outside_graphs(_kmeans_torch, data, k, seed=seed, max_iter=max_iter, tol=tol)


def _kmeans_torch(data: torch.Tensor, k: int, *, seed: int, max_iter: int, tol: float) -> torch.Tensor:
    """:func:`kmeans_torch`'s body (eager)."""
    if data.ndim != 3:
        raise ValueError(f"data must have shape (B, n, d), got {tuple(data.shape)}")
    b, n, _ = data.shape
    if not 1 <= k <= n:
        raise ValueError(f"k must be in [1, {n}] (the number of rows), got {k!r}")
    x = data.detach().float()
    tol_abs = x.var(1, unbiased=False).mean(-1) * tol  # (B,)
    x = x - x.mean(1, keepdim=True)
    rows = torch.arange(b, device=x.device)
    first, uniforms = _kmeans_draws_on(x.device, n, k, seed)
    index = [torch.full((b,), first, dtype=torch.int64, device=x.device)]
    closest = _sq_distances(x[:, first:first + 1], x)[:, 0]  # (B, n)
    # potentials summed in float64 and rounded once: scikit-learn's float32 sums (BLAS, another order) give
    # the correctly rounded value in all but rare cases, and candidates with equal potentials stay tied
    pot = closest.double().sum(-1).float()
    for c in range(1, k):
        rand = uniforms[c - 1][None] * pot[:, None].double()  # (B, trials)
        cand = torch.searchsorted(closest.cumsum(-1).double(), rand).clamp(max=n - 1)
        dist = torch.minimum(closest[:, None], _sq_distances(x[rows[:, None], cand], x))  # (B, trials, n)
        pots = dist.double().sum(-1).float()  # (B, trials)
        best = pots.argmin(-1)  # the candidate that lowers the potential most (the first on ties)
        closest, pot = dist[rows, best], pots[rows, best]
        index.append(cand[rows, best])
    centers = x[rows[:, None], torch.stack(index, 1)]  # (B, k, d)

    def distances(centers):
        # scikit-learn's Lloyd distances, |c|^2 - 2 x.c (B, n, k): |x|^2 does not change the argmin
        return (centers * centers).sum(-1)[:, None] - 2 * x @ centers.transpose(1, 2)

    xsq = (x * x).sum(-1)  # (B, n)
    slots, points = torch.arange(k, device=x.device), torch.arange(n, device=x.device)
    labels_old = torch.full((b, n), -1, dtype=torch.int64, device=x.device)
    done = torch.zeros(b, dtype=torch.bool, device=x.device)
    for _ in range(max_iter):
        dist = distances(centers)
        labels = dist.argmin(-1)
        member = labels[..., None] == slots  # (B, n, k); one_hot would read the labels' range
        empty = ~member.any(1)  # (B, k)
        # an empty cluster takes the point farthest from its own centre (several: in descending order of
        # distance), which leaves its cluster
        far = (dist.gather(-1, labels[..., None])[..., 0] + xsq).argsort(-1, descending=True)
        pick = far.gather(1, (empty.cumsum(-1) - 1).clamp(min=0))  # (B, k): the point for each empty slot
        moved = ((pick[..., None] == points) & empty[..., None]).transpose(1, 2)  # (B, n, k)
        weights = ((member & ~moved.any(-1, keepdim=True)) | moved).to(x.dtype)  # (B, n, k)
        sums, weight = weights.transpose(1, 2) @ x, weights.sum(1)  # (B, k, d), (B, k)
        new = sums * torch.where(weight > 0, 1.0 / weight.clamp(min=1e-30), 1.0)[..., None]
        shift = ((new - centers) ** 2).sum((1, 2))
        strict = (labels == labels_old).all(-1)
        centers = torch.where(done[:, None, None], centers, new)
        labels_old = torch.where(done[:, None], labels_old, labels)
        done = done | strict | (shift <= tol_abs)
    return distances(centers).argmin(-1)


def hsf_feature(feats, z_mean: torch.Tensor, *, mode: str = "code", k_clusters: int = K_CLUSTERS,
                kmeans: str = "sklearn") -> torch.Tensor:
    """The clustered feature ``c (B, E)`` (unit) of hybrid semantic fusion (module docstring) from the ``L``
    unit patch features ``feats [L x (B, N, E)]`` and the layer-mean patch log-odds ``z_mean (B, N)``;
    differentiable in ``feats`` (the cluster assignment is not). ``kmeans`` (one of :data:`KMEANS_BACKENDS`):
    scikit-learn per image on the host (:func:`_kmeans_labels`), or :func:`kmeans_torch` for the whole batch
    on the features' device (no host read)."""
    if mode not in ("code", "paper"):
        raise ValueError(f"mode must be 'code' or 'paper', got {mode!r}")
    if kmeans not in KMEANS_BACKENDS:
        raise ValueError(f"kmeans must be one of {KMEANS_BACKENDS}, got {kmeans!r}")
    stack = torch.stack(list(feats)).float()  # (L, B, N, E)
    if kmeans == "torch":
        return _hsf_batched(stack, z_mean, mode, k_clusters)
    n_layers, b, n, _ = stack.shape
    out = []
    for i in range(b):
        if mode == "code":
            top = torch.topk(z_mean[i], min(n, TOP_PER_CLUSTER * k_clusters)).indices
            sel = stack[:, i, top]  # (L, k_top, E)
            k = min(k_clusters, sel.shape[1])
            labels = _kmeans_labels(sel.transpose(0, 1).reshape(sel.shape[1], -1), k)
            member = nn.functional.one_hot(labels, k).T.to(sel.dtype)  # (k, k_top)
            counts = member.sum(1)
            centres = (member @ sel.sum(0)) / (n_layers * counts.clamp(min=1.0))[:, None]
            out.append(centres[counts > 0].mean(0))
        else:
            avg = stack[:, i].mean(0)  # (N, E)
            k = min(k_clusters, n)
            labels = _kmeans_labels(avg, k)
            member = nn.functional.one_hot(labels, k).T.to(avg.dtype)
            counts = member.sum(1)
            prob = torch.sigmoid(z_mean[i].float())
            score = torch.where(counts > 0, (member @ prob) / counts.clamp(min=1.0), torch.full_like(counts, -1.0))
            out.append(avg[labels == int(torch.argmax(score))].mean(0))
    return core.normalize(torch.stack(out))


def _hsf_batched(stack: torch.Tensor, z_mean: torch.Tensor, mode: str, k_clusters: int) -> torch.Tensor:
    """:func:`hsf_feature` of every image at once with :func:`kmeans_torch`: ``stack (L, B, N, E)``,
    ``z_mean (B, N)`` -> ``(B, E)`` unit; masks and weighted sums where the per-image path indexes."""
    n_layers, b, n, e = stack.shape
    if mode == "code":
        top = torch.topk(z_mean, min(n, TOP_PER_CLUSTER * k_clusters), dim=-1).indices  # (B, k_top)
        sel = stack.gather(2, top[None, :, :, None].expand(n_layers, b, top.shape[1], e))  # (L, B, k_top, E)
        k = min(k_clusters, top.shape[1])
        labels = kmeans_torch(sel.permute(1, 2, 0, 3).reshape(b, top.shape[1], n_layers * e), k)
        member = (labels[..., None] == torch.arange(k, device=labels.device)).to(sel.dtype)  # (B, k_top, k)
        counts = member.sum(1)  # (B, k)
        centres = (member.transpose(1, 2) @ sel.sum(0)) / (n_layers * counts.clamp(min=1.0))[..., None]
        used = (counts > 0).to(sel.dtype)
        c = (centres * used[..., None]).sum(1) / used.sum(1, keepdim=True)  # mean of the non-empty centres
    else:
        avg = stack.mean(0)  # (B, N, E)
        k = min(k_clusters, n)
        labels = kmeans_torch(avg, k)
        member = (labels[..., None] == torch.arange(k, device=labels.device)).to(avg.dtype)  # (B, N, k)
        counts = member.sum(1)
        prob = torch.sigmoid(z_mean.float())
        score = torch.where(counts > 0, (member.transpose(1, 2) @ prob[..., None])[..., 0] / counts.clamp(min=1.0),
                            torch.full_like(counts, -1.0))
        chosen = (labels == score.argmax(-1, keepdim=True)).to(avg.dtype)  # (B, N)
        c = (chosen[..., None] * avg).sum(1) / chosen.sum(1, keepdim=True)
    return core.normalize(c)


def adaclip_forward(prompts: HybridPrompts, backbone, images: torch.Tensor, *, hsf: str = "code",
                    kmeans: str | None = None) -> dict:
    """``{"z_img": (B,), "z_maps": (L, B, N), "feats": [L x (B, N, E)] unit, "text": (B, 2, E)}`` (module
    docstring); differentiable in every parameter of ``prompts``. ``kmeans``: HSF's clustering
    (:func:`hsf_feature`), default ``prompts.kmeans`` (the run's recipe field)."""
    if hsf not in HSF_MODES:
        raise ValueError(f"hsf must be one of {HSF_MODES}, got {hsf!r}")
    check_images(images, backbone.spec)
    dyn_v, dyn_t = dynamic_prompts(prompts, frozen_embedding(backbone, images))
    img, tokens = prompted_visual(backbone, prompts, images, dyn_v)
    text = text_features(backbone, prompts, dyn_t)
    feats = stage_features(prompts, tokens)
    z_maps = torch.stack([per_image_log_odds(p, text) for p in feats])  # (L, B, N)
    f = core.normalize(prompts.cls(img.to(prompts.cls.weight.dtype)).float())
    if hsf != "off":
        c = hsf_feature(feats, z_maps.mean(0), mode=hsf, kmeans=kmeans or prompts.kmeans)
        f = core.normalize(HSF_ALPHA * c + (1.0 - HSF_ALPHA) * f)
    return {"z_img": per_image_log_odds(f, text), "z_maps": z_maps, "feats": feats, "text": text}


def _forward(prompts: HybridPrompts, backbone, images: torch.Tensor) -> dict:
    return adaclip_forward(prompts, backbone, images)


def adaclip_loss(cfg, prompts, out: dict, batch: dict) -> tuple:
    """``beta_bce Focal(z_img, label) + sum_l (beta_focal Focal_l + beta_dice (Dice_l(p_a, mask) + Dice_l(p_n,
    1 - mask)))`` on the per-layer upsampled (``align_corners=True``) patch log-odds (module docstring); Dice
    per image row (``cfg.dice_unit="row"``, the recipe's: their batch-1 computation) or per image;
    returns ``(loss, {name: detached value})``."""
    labels = (batch["label"].float() > 0.5).float()
    z, masks_l, valid_l = layer_targets(cfg, out["z_maps"], batch)  # (L * B, S, S), (L * B, S, S), (L * B,)
    n_layers = out["z_maps"].shape[0]
    # sigmoid(z) is the anomalous channel of the upsampled two-way softmax; the normal one is 1 - sigmoid(z)
    parts = {"image": losses.focal_loss(out["z_img"][:, None, None], labels[:, None, None], torch.ones_like(labels)),
             "focal": n_layers * losses.focal_loss(z, masks_l, valid_l),
             "dice": n_layers * losses.two_way_dice_loss(torch.sigmoid(z), masks_l, valid_l, unit=cfg.dice_unit)}
    loss = cfg.beta_bce * parts["image"] + cfg.beta_focal * parts["focal"] + cfg.beta_dice * parts["dice"]
    return loss, {k: v.detach().float() for k, v in parts.items()}


def build_prompts(cfg, backbone) -> HybridPrompts:
    """The trainable module of a run: AdaCLIP's prompts and projections, the text of ``cfg.prompts``, seeded
    by ``cfg.seed``, clustering with ``cfg.kmeans``."""
    return HybridPrompts(backbone, prompt_texts(cfg.prompts), seed=cfg.seed, kmeans=cfg.kmeans)


class AdaCLIP(Method):
    """Inference with trained hybrid prompts (module docstring); ``hsf`` one of :data:`HSF_MODES`,
    ``map_score`` one of :data:`MAP_SCORES`."""

    def __init__(self, backbone, prompts: HybridPrompts, *, clip_norm: bool = True, hsf: str = "code",
                 map_score: str = "logit_mean"):
        super().__init__()
        if hsf not in HSF_MODES:
            raise ValueError(f"hsf must be one of {HSF_MODES}, got {hsf!r}")
        if map_score not in MAP_SCORES:
            raise ValueError(f"map_score must be one of {MAP_SCORES}, got {map_score!r}")
        self.backbone, self.prompts, self.hsf, self.map_score = backbone, prompts, hsf, map_score
        self.name, self.clip_norm = "adaclip", clip_norm
        self.image_size, self.grid = backbone.spec.image_size, backbone.spec.grid

    def forward(self, images: torch.Tensor) -> Output:
        """``images (B, 3, S, S)`` -> :class:`Output`: ``scores`` = ``z_img``, ``maps`` per ``map_score``,
        ``patches`` = the L stages' unit features."""
        out = adaclip_forward(self.prompts, self.backbone, images, hsf=self.hsf)
        z = upsample_patches(out["z_maps"], self.grid, self.image_size, align_corners=True).mean(0)  # (B, S, S)
        maps = z if self.map_score == "logit_mean" else torch.sigmoid(z)
        return Output(out["z_img"].float(), maps.float(), tuple(out["feats"]))


def load(cfg, backbone, record, state: dict) -> AdaCLIP:
    """Rebuild the method of an ``adaclip`` run: the run's prompt sentences and the checkpoint's prompts and
    projections (``visual_static (J, P, W)`` gives ``J`` and ``P``); a state of another method or shape ->
    ``ValueError``."""
    vs = state.get("visual_static") if isinstance(state, dict) else None
    if not torch.is_tensor(vs) or vs.ndim != 3 or "dyn_text.weight" not in state:
        keys = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"checkpoint state is not an adaclip state (need 'visual_static' (J, P, W), 'text_static', "
                         f"'dyn_visual.*', 'dyn_text.*', 'fc.<stage>.*', 'cls.*'); keys: {keys}")
    device = next(backbone.model.parameters()).device
    prompts = HybridPrompts(backbone, record["prompts"], length=int(vs.shape[1]), depth=int(vs.shape[0]),
                            seed=cfg.seed, kmeans=cfg.kmeans)
    load_checked(prompts, state, "adaclip prompts of this backbone")
    return AdaCLIP(backbone, prompts.to(device), clip_norm=cfg.clip_norm).eval()


def _method(cfg, backbone, prompts: HybridPrompts) -> AdaCLIP:
    return AdaCLIP(backbone, prompts, clip_norm=cfg.clip_norm)


register_trainer("adaclip", Trainer(build=build_prompts, forward=_forward, loss=adaclip_loss, method=_method))
register_trained("adaclip", load)
