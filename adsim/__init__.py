"""adsim: zero-shot medical anomaly detection with CLIP adapters, VACA and geodesic matching.

The detector of "Beyond Pooling" (§"Matching for Anomaly Detection", Algorithm 1) on a frozen
open_clip ViT. Its centroid gates and updates are ``poolsim._core`` run on torch tensors.
CLI: ``python -m adsim {make-toy-bmad,train,eval}``.
"""
from .backbone import BACKBONES as BACKBONES
from .backbone import RandomWeightsWarning as RandomWeightsWarning
from .backbone import build_backbone as build_backbone
from .data import DOMAINS as DOMAINS
from .data import MASKED as MASKED
from .evaluate import evaluate as evaluate
from .head import VACA as VACA
from .head import Head as Head
from .head import features as features
from .matching import CentroidBank as CentroidBank
from .matching import match as match
from .toy import make_toy_bmad as make_toy_bmad
from .train import TrainConfig as TrainConfig
from .train import train as train
