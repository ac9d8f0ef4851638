"""poolsim: naive pooling, uniform subsampling and matching across heterogeneous domains.

Reproduces and tests "Beyond Pooling: Matching for Robust Generalization under Data Heterogeneity"
(AISTATS 2026). Public API only; the implementation lives in private modules.
"""
from . import flows as flows
from . import metadist as metadist
from . import theory as theory
from ._advise import Advice as Advice
from ._advise import advise as advise
from ._da import da_score as da_score
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
