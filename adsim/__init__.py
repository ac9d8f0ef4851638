"""adsim: zero-shot medical anomaly detection with CLIP adapters, VACA and geodesic matching.

The detector of "Beyond Pooling" (§"Matching for Anomaly Detection", Algorithm 1) on a frozen
open_clip ViT. Its centroid gates and updates are ``poolsim._core`` run on torch tensors.
CLI: ``python -m adsim {make-toy-bmad,train,eval,predict,table,protocol,sweep,figures}``; Python:
``adsim.Detector.from_run(RUN).predict(images)`` (``adsim.detector``, the one inference path).
``protocol`` runs the leave-one-out domain-addition protocol with the DA score on real images or on the SIMULATED token
features of ``adsim.sim`` (CPU); ``figures`` draws its figures and table, with the paper's numbers
(``adsim.reference``) beside them, never mixed. ``train`` runs data-parallel under torchrun
(``adsim.distributed``) and can cache the frozen trunk (``adsim.cache``). The baselines of the paper's
comparison (``adsim.baselines``: WinCLIP, AnomalyCLIP; MVFA-AD as ``--recipe mvfa``) register themselves
in ``adsim._method`` when ``adsim`` is imported. Few-shot mode (``--shots K``, ``Detector.with_shots``,
``adsim.fewshot``): a memory bank of K normal target images fused with any method; ``table`` runs the
paper's Table 1 grid (``adsim.table``).
"""
from . import baselines as baselines
from .backbone import BACKBONES as BACKBONES
from .backbone import RandomWeightsWarning as RandomWeightsWarning
from .backbone import build_backbone as build_backbone
from .cache import build_trunk_cache as build_trunk_cache
from .data import DOMAINS as DOMAINS
from .data import MASKED as MASKED
from .detector import Detector as Detector
from .detector import Prediction as Prediction
from .detector import UnreadableImageWarning as UnreadableImageWarning
from .evaluate import evaluate as evaluate
from .fewshot import FewShot as FewShot
from .head import VACA as VACA
from .head import SCORES as SCORES
from .head import Head as Head
from .head import features as features
from .head import features_from_tokens as features_from_tokens
from .head import image_scores as image_scores
from .matching import CentroidBank as CentroidBank
from .matching import match as match
from .matching import match_sequential as match_sequential
from .metrics import Accumulator as Accumulator
from .protocol import run as run_protocol
from .sim import SimParams as SimParams
from .table import run as run_table
from .sim import simulate as simulate
from .toy import make_toy_bmad as make_toy_bmad
from .train import TrainConfig as TrainConfig
from .train import train as train
