"""The methods the paper compares against, each one file registering itself in ``adsim._method``:

* ``winclip`` (:mod:`.winclip`) -- WinCLIP, training-free (``ZERO_SHOT``).
* ``anomalyclip`` (:mod:`.anomalyclip`) -- AnomalyCLIP, learned object-agnostic prompts, trained by
  ``python -m adsim train --recipe anomalyclip`` (``TRAINERS`` + ``TRAINED``).
* MVFA-AD is not a file here: it is the adapter head under ``--recipe mvfa`` (``adsim.recipes``).

``docs/recipes.md`` lists what each one simplifies and where the published code differs.
"""
from . import anomalyclip as anomalyclip
from . import winclip as winclip
from .anomalyclip import AnomalyCLIP as AnomalyCLIP
from .anomalyclip import PromptLearner as PromptLearner
from .winclip import WinCLIP as WinCLIP
