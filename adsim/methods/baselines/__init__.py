"""The methods the paper compares against, each one file registering itself in ``adsim.methods.registry``:

* ``winclip`` (:mod:`.winclip`) -- WinCLIP, training-free (``ZERO_SHOT``).
* ``anomalyclip`` (:mod:`.anomalyclip`) -- AnomalyCLIP, learned object-agnostic prompts, trained by
  ``python -m adsim train --recipe anomalyclip`` (``TRAINERS`` + ``TRAINED``).
* ``bilora`` (:mod:`.bilora`) -- BiLoRA, the continual-learning baseline of the domain-addition protocol
  (``python -m adsim protocol``, method ``bilora``): per-domain bilinear frequency-domain updates of the
  adapter head; also trained by ``python -m adsim train --recipe bilora`` (``TRAINERS`` with the
  ``"sequential"`` schedule: the training domains one at a time, + ``TRAINED``).
* ``aprilgan`` (:mod:`.aprilgan`) -- APRIL-GAN, per-stage linear maps of the patch tokens into the text space,
  trained by ``python -m adsim train --recipe aprilgan`` (``TRAINERS`` + ``TRAINED``).
* ``adaclip`` (:mod:`.adaclip`) -- AdaCLIP, static and image-conditioned (dynamic) prompts in both towers and
  hybrid semantic fusion, trained by ``python -m adsim train --recipe adaclip`` (``TRAINERS`` + ``TRAINED``).
* ``mao`` (:mod:`.mao`) -- Mao et al. (CVPR 2025) as far as its abstract and framework figure define it: per-source-
  domain normal/abnormal visual prototypes, harmonized over the domains for an unseen one, trained by
  ``python -m adsim train --recipe mao`` (``TRAINERS`` + ``TRAINED``); the rest is adsim's choice (docs/recipes.md).
* MVFA-AD is not a file here: it is the adapter head under ``--recipe mvfa`` (``adsim.config.recipes``).

``docs/recipes.md`` lists what each one simplifies and where the published code differs.
"""
__all__ = ["APRILGAN", "AdaCLIP", "AnomalyCLIP", "HybridPrompts", "LinearMaps", "Mao", "PromptLearner", "Prototypes",
           "WinCLIP", "adaclip", "anomalyclip", "aprilgan", "bilora", "mao", "winclip"]

from adsim.methods.baselines import adaclip, anomalyclip, aprilgan, bilora, mao, winclip
from adsim.methods.baselines.adaclip import AdaCLIP, HybridPrompts
from adsim.methods.baselines.anomalyclip import AnomalyCLIP, PromptLearner
from adsim.methods.baselines.aprilgan import APRILGAN, LinearMaps
from adsim.methods.baselines.mao import Mao, Prototypes
from adsim.methods.baselines.winclip import WinCLIP
