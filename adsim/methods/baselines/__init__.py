"""The methods the paper compares against, each one file registering itself in ``adsim.methods.registry``:

* ``winclip`` (:mod:`.winclip`) -- WinCLIP, training-free (``ZERO_SHOT``).
* ``anomalyclip`` (:mod:`.anomalyclip`) -- AnomalyCLIP, learned object-agnostic prompts, trained by
  ``python -m adsim train --recipe anomalyclip`` (``TRAINERS`` + ``TRAINED``).
* MVFA-AD is not a file here: it is the adapter head under ``--recipe mvfa`` (``adsim.config.recipes``).

``docs/recipes.md`` lists what each one simplifies and where the published code differs.
"""
__all__ = ["AnomalyCLIP", "PromptLearner", "WinCLIP", "anomalyclip", "winclip"]

from adsim.methods.baselines import anomalyclip, winclip
from adsim.methods.baselines.anomalyclip import AnomalyCLIP, PromptLearner
from adsim.methods.baselines.winclip import WinCLIP
