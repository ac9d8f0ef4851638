"""adsim: zero-shot medical anomaly detection with CLIP adapters, VACA and geodesic matching.

The detector of "Beyond Pooling" (§"Matching for Anomaly Detection", Algorithm 1) on a frozen open_clip
ViT; its centroid gates and updates are ``poolsim``'s matching core run on torch tensors. Subpackages,
each importing only those before it (``docs/architecture.md``; an import-linter contract checks it):
``runtime`` → ``metrics`` → ``data`` → ``config`` → ``model`` → ``methods`` → ``inference`` →
``evaluation`` → ``training`` → ``experiments`` → ``cli`` (``python -m adsim``).

Python: ``adsim.Detector.from_run(RUN).predict(images)``. The names below load on first use (PEP 562),
so ``import adsim`` is cheap and ``python -m adsim --help`` answers without loading torch.
"""
import importlib

from adsim import _legacy

_SUBPACKAGES = ("cli", "config", "data", "evaluation", "experiments", "inference", "methods", "metrics", "model",
                "runtime", "training")
# public name -> (module, attribute)
_EXPORTS = {
    "BACKBONES": ("adsim.config.choices", "BACKBONES"),
    "SCORES": ("adsim.config.choices", "SCORES"),
    "TrainConfig": ("adsim.config.run", "TrainConfig"),
    "DOMAINS": ("adsim.data.domains", "DOMAINS"),
    "MASKED": ("adsim.data.domains", "MASKED"),
    "SimParams": ("adsim.data.sim", "SimParams"),
    "simulate": ("adsim.data.sim", "simulate"),
    "make_toy_bmad": ("adsim.data.toy", "make_toy_bmad"),
    "RandomWeightsWarning": ("adsim.model.backbone", "RandomWeightsWarning"),
    "build_backbone": ("adsim.model.backbone", "build_backbone"),
    "VACA": ("adsim.model.head", "VACA"),
    "Head": ("adsim.model.head", "Head"),
    "features": ("adsim.model.head", "features"),
    "features_from_tokens": ("adsim.model.head", "features_from_tokens"),
    "image_scores": ("adsim.model.head", "image_scores"),
    "CentroidBank": ("adsim.model.matching", "CentroidBank"),
    "match": ("adsim.model.matching", "match"),
    "match_sequential": ("adsim.model.matching", "match_sequential"),
    "FewShot": ("adsim.methods.fewshot", "FewShot"),
    "Detector": ("adsim.inference.detector", "Detector"),
    "Prediction": ("adsim.inference.detector", "Prediction"),
    "UnreadableImageWarning": ("adsim.inference.detector", "UnreadableImageWarning"),
    "Accumulator": ("adsim.metrics.accumulator", "Accumulator"),
    "evaluate": ("adsim.evaluation.evaluate", "evaluate"),
    "build_trunk_cache": ("adsim.training.cache", "build_trunk_cache"),
    "train": ("adsim.training.train", "train"),
    "run_protocol": ("adsim.experiments.protocol", "run"),
    "run_table": ("adsim.experiments.table", "run"),
}
# The API reference lists these in this order: the detector and the experiments first, then the model's
# parts, data and settings; the subpackages last.
_ORDER = (
    "Detector", "Prediction", "train", "evaluate", "run_protocol", "run_table",
    "Head", "VACA", "features", "features_from_tokens", "image_scores", "match", "match_sequential", "CentroidBank",
    "FewShot", "build_backbone", "simulate", "SimParams", "make_toy_bmad", "Accumulator", "DOMAINS", "MASKED",
    "TrainConfig", "BACKBONES", "SCORES", "build_trunk_cache", "RandomWeightsWarning", "UnreadableImageWarning",
    *_SUBPACKAGES,
)
__all__ = list(_ORDER)  # built at run time: the API page lists the lazy names in a table, in this order
assert sorted(__all__) == sorted((*_SUBPACKAGES, *_EXPORTS))


def __getattr__(name):
    if name in _SUBPACKAGES:
        value = importlib.import_module(f"adsim.{name}")
    elif name in _EXPORTS:
        module, attr = _EXPORTS[name]
        value = getattr(importlib.import_module(module), attr)
    else:
        raise AttributeError(f"module 'adsim' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return list(__all__)


_legacy.install()
