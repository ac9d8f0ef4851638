"""poolsim: naive pooling, uniform subsampling and matching across heterogeneous domains.

Reproduces and tests "Beyond Pooling: Matching for Robust Generalization under Data Heterogeneity"
(AISTATS 2026). Public API only; the implementation lives in private modules. ``poolsim.core`` is the
array-API matching core (distances, gate, centroid updates) that ``adsim`` runs on torch tensors, and
``poolsim.verdict`` the one verdict rule.
"""
from . import _cluster as cluster
from . import _core as core
from . import _verdict as verdict
from . import flows as flows
from . import metadist as metadist
from . import theory as theory
from ._advise import Advice as Advice
from ._advise import advise as advise
from ._da import da_score as da_score
from ._cache import cache_dir as cache_dir
from ._io import FolderBusyError as FolderBusyError
from ._io import atomic_write as atomic_write
from ._io import atomic_write_text as atomic_write_text
from ._io import folder_lock as folder_lock
from ._multimodal import MultiMatched as MultiMatched
from ._multimodal import match_multimodal as match_multimodal
from ._strategies import Matched as Matched
from ._strategies import Pooled as Pooled
from ._strategies import Subsampled as Subsampled
from ._strategies import match as match
from ._strategies import naive_pool as naive_pool
from ._strategies import subsample as subsample
from ._verdict import Verdict as Verdict
from ._verdict import decide as decide_claim

__version__ = "0.1.0"
__all__ = [
    "Advice", "FolderBusyError", "Matched", "MultiMatched", "Pooled", "Subsampled", "Verdict", "advise",
    "atomic_write", "atomic_write_text", "cache_dir", "cluster", "core", "da_score", "decide_claim", "flows",
    "folder_lock", "match",
    "match_multimodal", "metadist", "naive_pool", "subsample", "theory", "verdict",
]
