"""poolsim: naive pooling, uniform subsampling and matching across heterogeneous domains.

Reproduces and tests "Beyond Pooling: Matching for Robust Generalization under Data Heterogeneity"
(AISTATS 2026). Public API only; the implementation lives in private modules. ``poolsim.core`` is the
array-API matching core (distances, gate, centroid updates) that ``adsim`` runs on torch tensors,
``poolsim.verdict`` the one verdict rule, and ``poolsim.io`` the file-system plumbing (folder locks,
atomic writes, the cache folder).
"""
# In the order the API reference shows them (members_order: source): the science first.
from ._strategies import naive_pool as naive_pool
from ._strategies import subsample as subsample
from ._strategies import match as match
from ._multimodal import match_multimodal as match_multimodal
from ._strategies import Pooled as Pooled
from ._strategies import Subsampled as Subsampled
from ._strategies import Matched as Matched
from ._multimodal import MultiMatched as MultiMatched
from ._advise import advise as advise
from ._advise import Advice as Advice
from ._advise import WorldResult as WorldResult
from ._da import da_score as da_score
from ._verdict import decide as decide_claim
from ._verdict import Verdict as Verdict
from . import verdict as verdict
from . import metadist as metadist
from . import theory as theory
from . import flows as flows
from . import core as core
from . import cluster as cluster
from . import io as io

__version__ = "0.1.0"
__all__ = [
    # the strategies and what they return
    "naive_pool", "subsample", "match", "match_multimodal", "Pooled", "Subsampled", "Matched", "MultiMatched",
    # choosing a strategy, scoring data, deciding claims
    "advise", "Advice", "WorldResult", "da_score", "decide_claim", "Verdict", "verdict",
    # meta-distributions, theory, the normalizing-flow bridge, the array-API core
    "metadist", "theory", "flows", "core",
    # running grids on a scheduler; file-system plumbing (locks, atomic writes, cache folder)
    "cluster", "io",
]

# Names that moved to poolsim.io: importable from here for one more release, with a warning.
_MOVED = {"FolderBusyError": "io", "folder_lock": "io", "atomic_write": "io", "atomic_write_text": "io",
          "cache_dir": "io"}


def __getattr__(name: str):
    if name in _MOVED:
        import warnings

        warnings.warn(f"poolsim.{name} moved to poolsim.{_MOVED[name]}.{name}; the old name goes in the "
                      f"next release", DeprecationWarning, stacklevel=2)
        return getattr(io, name)
    raise AttributeError(f"module 'poolsim' has no attribute {name!r}")
