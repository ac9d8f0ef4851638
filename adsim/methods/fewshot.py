"""Few-shot mode: a memory bank of the patch features of ``k`` normal images of the TARGET, fused with
any zero-shot method whose :class:`~adsim.methods.registry.Output` has ``patches`` (MVFA-AD's k-shot setting).

What MVFA-AD does (Huang et al., "Adapting Visual-Language Models for Generalizable Anomaly Detection in
Medical Images", CVPR 2024, its few-shot setting; released code ``MediaBrain-SJTU/MVFA-AD`` at c232e38,
``test_few.py`` (``main``, ``test``) and ``dataset/medical_few.py`` (``get_few_normal``), read for facts
only; the Beyond-Pooling fork has no few-shot code):

* ``k in {2, 4, 8, 16}`` normal images drawn from the target's ``valid/good/img`` (``get_few_normal``;
  fixed lists per k in ``dataset/fewshot_seed``); only the ``test`` split is scored, so the shots are
  never scored. We draw from the same split by default (``split="valid"``) with an explicit seed and,
  whatever the split, drop the shots from the scored list (:func:`exclude_shots`, by path and content).
* Bank: per adapter layer, the adapted patch features of the augmented shots (``utils.augment``). A
  test patch's few-shot score per layer is ``min_j (1 - cos(p, bank_j))``, bilinearly upsampled to the
  image (``align_corners=True``), summed over layers; seg-adapter features for the masked domains,
  det-adapter features for the others.
* Fusion: masked domains -- the zero-shot map (layer sum of probabilities) and the few-shot map are each
  min-max normalised over the WHOLE test set and averaged (0.5 / 0.5); the image score is the max of
  that fused map. Other domains -- the image scores (zero-shot: layer sum of the patch-mean
  probability; few-shot: mean of the few-shot map) are min-max normalised over the test set and
  averaged (0.5 / 0.5).
* MVFA also fine-tunes its adapters on the augmented shots plus k *anomalous* valid images
  (``train_few.py``). We do neither augmentation nor fine-tuning: this is the memory bank alone,
  training-free on top of any method, on the features the method exposes as ``Output.patches`` (the
  head's seg features for every domain).

What we do differently, and why:

* Layer MEAN of the distances instead of the sum (a constant factor; same ranking); bilinear upsampling
  with ``align_corners=False``, as our zero-shot maps.
* Fusion without test-set statistics. Min-max over the test set makes one image's score depend on every
  other test image (transductive; a single outlier rescales all). Our zero-shot maps are logits, the
  few-shot map is a cosine distance in [0, 2]: we put the few-shot map into the zero-shot map's units
  with the spread each has on NORMAL images of the target, measured on the bank itself:

  - ``(mu_0, sd_0)``: mean and standard deviation of the zero-shot map's pixels over the k shots;
  - ``(mu_f, sd_f)``: the same for the few-shot map of each shot against the bank WITHOUT that shot
    (leave-one-out; with ``k = 1`` there is no other shot, so each patch is compared with the other
    patches of its own image, which under-estimates the normal distance -- recorded in ``info``);
  - ``w = sd_0 / sd_f`` (zero-shot units per unit of cosine distance);
  - fused map ``= m_0 + w (m_f - mu_f)``, i.e. ``mu_0 + sd_0 (z_0 + z_f)`` with ``z`` each map
    standardised on the normal statistics: one normal standard deviation of either counts the same;
  - fused image score ``= s_0 + w (max_pixels m_f - mu_f)``: the zero-shot image score (a logit of the
    same scale as the map) plus the few-shot map's peak in the same units.

  Every number here depends on the image and the k shots only. ``sd_0`` or ``sd_f`` at float32 rounding level
  (e.g. identical shots) raise ``ValueError``: the fusion weight would be 0 or infinite.

Memory: the bank holds ``k N E L`` float32 (``N`` patches, ``E`` feature size, ``L`` layers); a bank
larger than the device's free memory raises ``ValueError`` as soon as the first batch of shots gives
``N``, ``E`` and ``L`` (before the rest is computed). Test-time
similarities are computed in chunks of images so that no ``(B, N, k N)`` block exceeds ~256 MiB.
"""
from __future__ import annotations

import copy
import hashlib
import os
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn

from adsim.data import bmad
from adsim.data.domains import SPLITS, canonical_domain
from adsim.data.images import image_items
from adsim.data.medical import Source
from adsim.methods.registry import Method, Output
from adsim.model.backbone import upsample_patches

SHOTS = (2, 4, 8, 16)  # MVFA-AD's settings (any k >= 1 is accepted)
SUPPORT_SPLITS = SPLITS
_CHUNK_BYTES = 256 * 2 ** 20
_TINY = 1e-6  # a spread below this is float32 rounding of a constant (1 - cos(p, p) is ~1e-7, not 0)


def _name(item) -> str:
    """The name of a candidate shot: a ``Sample``'s path, an ``(name, source)`` item's name, a path."""
    if isinstance(item, bmad.Sample):
        return str(item.image)
    return str(item[0]) if isinstance(item, tuple) else str(item)


def select_shots(candidates: list, k, *, seed: int = 0, where: str = "the support split") -> list:
    """``k`` of ``candidates`` (sorted by path first, so the draw depends on the files, not the listing
    order) drawn without replacement with ``numpy.random.default_rng(seed)``. ``k`` must be an integer in
    ``[1, len(candidates)]``, else ``ValueError`` naming ``--shots`` and the allowed range."""
    n = len(candidates)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= n:
        raise ValueError(f"--shots must be an integer in [1, {n}] ({n} normal images in {where}; "
                         f"MVFA-AD uses {SHOTS}), got {k!r}")
    ordered = sorted(candidates, key=_name)
    pick = np.random.default_rng(seed).choice(n, size=int(k), replace=False)
    return [ordered[i] for i in sorted(pick)]


def support_shots(data, target: str, k, *, seed: int = 0, split: str = "valid") -> list:
    """The ``k`` normal :class:`adsim.data.Sample` of ``target``'s ``split`` (MVFA-AD: ``valid``)."""
    if split not in SUPPORT_SPLITS:
        raise ValueError(f"shot split must be one of {SUPPORT_SPLITS}, got {split!r}")
    normals = [s for s in bmad.list_split(data, target, split) if s.label == 0]
    return select_shots(normals, k, seed=seed, where=f"{canonical_domain(target)} {split}/good")


def _digest(path) -> str:
    with open(path, "rb") as fh:
        return hashlib.sha1(fh.read()).hexdigest()


def exclude_shots(samples: list, shots: list) -> list:
    """``samples`` (``Sample`` s, paths or ``adsim.data.medical.Source`` s) without the shot images (same
    kinds; PIL images are ignored): same file (resolved path) or same content (SHA-1 of the bytes, so a
    copy of a shot elsewhere in the data set is not scored either). A DICOM frame or NIfTI slice is the
    same picture when file, axis and index agree (the volume's other slices are still scored)."""
    pictures = {_picture(s) for s in shots if isinstance(s, Source)}
    paths = {Path(getattr(s, "image", s)).resolve() for s in shots if not isinstance(s, (Image.Image, Source))}
    digests = {_digest(p) for p in paths}
    sizes = {p.stat().st_size for p in paths}
    kept: list = []  # the items of samples, as given
    for s in samples:
        if isinstance(s, Image.Image):
            kept.append(s)
            continue
        if isinstance(s, Source):
            if _picture(s) not in pictures:
                kept.append(s)
            continue
        p = Path(getattr(s, "image", s)).resolve()
        if p in paths or (p.stat().st_size in sizes and _digest(p) in digests):
            continue
        kept.append(s)
    return kept


def _picture(s: Source) -> tuple:
    return Path(s.path).resolve(), s.kind, s.axis, s.index


def load_images(items: list, method: Method) -> torch.Tensor:
    """``(n, 3, S, S)``: ``items`` (``Sample`` s, paths, PIL images or ``(name, path | PIL image)``)
    preprocessed as the method expects (``adsim.data.preprocess``: its size, CLIP normalisation).
    A file that is not a readable image -> ``ValueError`` naming it (a shot cannot be skipped)."""
    out = []
    for it in items:
        src = it.image if isinstance(it, bmad.Sample) else it[1] if isinstance(it, tuple) else it
        try:
            out.append(bmad.read_image(src, method.image_size, clip_norm=method.clip_norm))
        except bmad.UNREADABLE as err:
            raise ValueError(f"shot image {src} is not a readable image ({type(err).__name__}: {err})") from None
    return torch.stack(out)


def attach(detector, normal_images, k: int, *, seed: int = 0, batch_size: int = 16):
    """``detector`` in few-shot mode (``adsim.inference.detector.Detector.with_shots``): ``k`` of ``normal_images``
    (a folder, paths, PIL images or ``adsim.data.Sample`` s -- normal images of the target) drawn with
    ``seed`` (:func:`select_shots`) into a :class:`FewShot` bank on the detector's device and precision.
    Returns a new detector; its ``info`` adds the bank's record (``shots``, ``shot_seed``, ``shot_files``,
    fusion statistics). The caller keeps the shots out of what it scores (:func:`exclude_shots`)."""


    if isinstance(normal_images, (list, tuple)) and normal_images and all(
            isinstance(s, bmad.Sample) for s in normal_images):
        items = [(str(s.image), s.image) for s in normal_images]
    else:
        items = image_items(normal_images)
    chosen = select_shots(items, k, seed=seed, where="the given normal images")
    images = load_images(chosen, detector.method)
    fs = FewShot(detector.method, images, names=[Path(n).name for n, _ in chosen],
                 paths=[src for _, src in chosen], seed=seed, batch_size=batch_size, amp=detector.amp)
    new = copy.copy(detector)
    new.method, new.info = fs, {**detector.info, **fs.info}
    return new


def _device(module: nn.Module) -> torch.device:
    for t in (*module.parameters(), *module.buffers()):
        return t.device
    return torch.device("cpu")


def free_bytes(device: torch.device) -> int:
    """Free memory of ``device`` in bytes (CUDA: ``torch.cuda.mem_get_info``; CPU: available RAM)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):  # no sysconf (e.g. Windows): no check
        return 2 ** 62


def _batches(images, batch_size: int):
    if isinstance(images, torch.Tensor):
        if images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"shot images must have shape (k, 3, S, S), got {tuple(images.shape)}")
        yield from images.split(batch_size)
    else:
        for b in images:
            yield b["image"] if isinstance(b, dict) else b


def nn_distance(patches: torch.Tensor, bank: torch.Tensor, *, exclude=None) -> torch.Tensor:
    """``(B, N)``: ``1 - max_j <patches[b, n], bank[j]>`` (unit features ``patches (B, N, E)``,
    ``bank (M, E)``), in chunks of images. ``exclude (B, N, M)`` bool: bank rows a patch may not match
    (leave-one-out)."""
    b, n, _ = patches.shape
    m = bank.shape[0]
    step = max(1, _CHUNK_BYTES // max(1, n * m * 4))
    out = []
    # float32 even under autocast: 1 - cos of near neighbours is ~1e-2, below bf16's resolution near 1
    with torch.autocast(patches.device.type, enabled=False):
        for i in range(0, b, step):
            sim = patches[i:i + step].float() @ bank.float().T  # (c, N, M)
            if exclude is not None:
                sim = sim.masked_fill(exclude[i:i + step], float("-inf"))
            out.append(1.0 - sim.amax(dim=-1))
    return torch.cat(out)


def _upsample(d: torch.Tensor, grid: int, size: int) -> torch.Tensor:
    """``(B, N)`` distances -> ``(B, size, size)`` in float32, outside autocast."""
    with torch.autocast(d.device.type, enabled=False):
        return upsample_patches(d.float(), grid, size)


class FewShot(Method):
    """``method`` + a memory bank of the patch features of ``images`` (k normal target images).

    ``images``: ``(k, 3, S, S)`` preprocessed as ``method`` expects (:func:`load_images`), or an iterable
    of such batches. ``names``: the shots' file names (recorded in :attr:`info`); ``paths``: their files
    (kept in :attr:`paths` for :func:`exclude_shots`). ``max_bytes``: the
    memory the bank may use (default: the device's free memory). ``amp``: autocast dtype of the bank's
    forward pass (use the one the test images will be scored with). ``forward`` returns the fused scores
    and maps (see the module docstring) and the wrapped method's ``patches``; :meth:`parts` returns the
    zero-shot output and the few-shot map separately."""

    def __init__(self, method: Method, images, *, names=(), paths=(), seed: int | None = None,
                 batch_size: int = 16, max_bytes: int | None = None, amp: torch.dtype | None = None):
        super().__init__()
        self.method = method.eval()
        self.name, self.image_size, self.grid = f"{method.name}+fewshot", method.image_size, method.grid
        self.clip_norm = method.clip_norm
        device = _device(method)
        feats: list[list[torch.Tensor]] | None = None
        zero_maps, n_images = [], 0
        cast = torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None)
        with torch.inference_mode(), cast:
            for x in _batches(images, batch_size):
                out = method(x.to(device))
                if not out.patches:
                    raise ValueError(f"method {method.name!r} returns no patch features: few-shot needs "
                                     "Output.patches")
                if feats is None:  # first batch: the bank's size is known; check it fits
                    k = images.shape[0] if isinstance(images, torch.Tensor) else len(names) or x.shape[0]
                    self._check_memory(k, out.patches, device, max_bytes)
                    feats = [[] for _ in out.patches]
                for layer, p in enumerate(out.patches):
                    feats[layer].append(p.float())
                zero_maps.append(out.maps.float())
                n_images += x.shape[0]
            if feats is None:
                raise ValueError("--shots: no shot images given")
            per_image = [torch.cat(f) for f in feats]  # L x (k, N, E)
            zero = torch.cat(zero_maps)
            mu_f, sd_f = self._loo_stats(per_image)
        self.k, self.paths = n_images, list(paths)  # paths: the shot files (callers exclude them from scoring)
        # clones outside inference mode: ordinary tensors that autograd may see later
        for layer, f in enumerate(per_image):
            self.register_buffer(f"bank_{layer}", f.reshape(-1, f.shape[-1]).clone())
        self.n_layers = len(per_image)
        mu_0, sd_0 = float(zero.mean()), float(zero.std())
        if not sd_0 > _TINY * max(1.0, abs(mu_0)):
            raise ValueError("the zero-shot maps of the shot images are constant: the fusion weight is undefined")
        if not sd_f > _TINY:
            raise ValueError("the shot images' leave-one-out few-shot distances are all equal (identical "
                             "shots?): the fusion weight is undefined; use other shots or another --shot-seed")
        self.mu_f, self.weight = mu_f, sd_0 / sd_f
        self.info = {"shots": self.k, "shot_seed": seed, "shot_files": [str(s) for s in names],
                     "bank_bytes": int(sum(f.numel() for f in per_image) * 4),
                     "fusion": "map = zero + w (few - mu_f), score = zero + w (max few - mu_f), w = sd_0 / sd_f",
                     "mu_0": mu_0, "sd_0": sd_0, "mu_f": mu_f, "sd_f": sd_f, "weight": self.weight,
                     "normal_stats": "leave-one-out over the shots" if self.k > 1
                     else "k=1: each patch vs the other patches of the same shot (under-estimates)"}

    def _check_memory(self, k: int, patches: tuple, device, max_bytes) -> None:
        need = k * sum(p.shape[1] * p.shape[2] for p in patches) * 4
        have = free_bytes(device) if max_bytes is None else int(max_bytes)
        if need > have:
            n, e = patches[0].shape[1:]
            raise ValueError(f"--shots {k}: the memory bank needs {need / 2 ** 30:.2f} GiB (k*N*E*L = "
                             f"{k}*{n}*{e}*{len(patches)} float32) but {device} has {have / 2 ** 30:.2f} GiB "
                             "free; use fewer shots or a device with more memory")

    def _loo_stats(self, per_image: list) -> tuple:
        """Mean and std of the shots' few-shot maps against the bank without the shot itself."""
        k, n = per_image[0].shape[:2]
        bank = [f.reshape(-1, f.shape[-1]) for f in per_image]
        owner = torch.arange(k, device=bank[0].device).repeat_interleave(n)  # (k N,) image of each row
        per_shot = []
        for i in range(k):
            if k > 1:
                exclude = (owner == i).expand(1, n, -1)
            else:  # no other shot: every patch but the patch itself
                exclude = torch.eye(n, dtype=torch.bool, device=owner.device)[None]
            d = torch.stack([nn_distance(f[i:i + 1], b, exclude=exclude) for f, b in zip(per_image, bank)])
            per_shot.append(_upsample(d.mean(0), self.grid, self.image_size))
        maps = torch.cat(per_shot)
        return float(maps.mean()), float(maps.std())

    @property
    def bank(self) -> list:
        """Per layer ``(k N, E)``: the shots' patch features, shot after shot."""
        return [getattr(self, f"bank_{layer}") for layer in range(self.n_layers)]

    def parts(self, images: torch.Tensor) -> tuple:
        """``(zero-shot Output, few-shot map (B, S, S))`` -- the few-shot map in cosine distance."""
        out = self.method(images)
        if len(out.patches) != self.n_layers:
            raise ValueError(f"method returned {len(out.patches)} patch layers, the bank has {self.n_layers}")
        d = torch.stack([nn_distance(p, b) for p, b in zip(out.patches, self.bank)])  # (L, B, N)
        return out, _upsample(d.mean(0), self.grid, self.image_size)

    def forward(self, images: torch.Tensor) -> Output:
        out, few = self.parts(images)
        with torch.autocast(images.device.type, enabled=False):
            extra = self.weight * (few - self.mu_f)
            score = out.scores.float() + self.weight * (few.flatten(1).amax(dim=1) - self.mu_f)
            return Output(score, out.maps.float() + extra, out.patches)


def for_target(detector, data, target: str, k: int, *, seed: int = 0, batch_size: int = 16) -> tuple:
    """Few-shot evaluation on ``target`` of the BMAD folder ``data``: ``(detector with k shots drawn from
    the target's valid normals, the target's test samples WITHOUT the shots, record)``; the record
    (``shots``, ``shot_seed``, ``shot_split``, ``shot_files``, ``fusion``) goes into metrics.json."""
    chosen = support_shots(data, target, k, seed=seed)
    detector = detector.with_shots(chosen, k, seed=seed, batch_size=batch_size)
    samples = exclude_shots(bmad.list_split(data, target, "test"), chosen)
    info = detector.info
    record = {"shots": info["shots"], "shot_seed": seed, "shot_split": "valid", "shot_files": info["shot_files"],
              "fusion": {key: info[key] for key in ("fusion", "mu_0", "sd_0", "mu_f", "sd_f", "weight",
                                                    "normal_stats")}}
    return detector, samples, record
