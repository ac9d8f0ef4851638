"""The six BMAD domains, their canonical names, and which have pixel masks (plain Python, no torch)."""
from __future__ import annotations

DOMAINS = ("Brain", "Liver", "Retina_RESC", "Retina_OCT2017", "Chest", "Histopathology")
"""The six BMAD domains, by their folder stems (``DIR/<domain>_AD/``)."""
MASKED = ("Brain", "Liver", "Retina_RESC")
"""The domains with pixel masks, where pixel-level AUC (task ``AS``) is evaluated."""
SPLITS = ("valid", "test")
"""The evaluation splits of a BMAD domain folder."""
ALIASES = {"brainmri": "Brain", "liverct": "Liver", "resc": "Retina_RESC",
           "oct17": "Retina_OCT2017", "oct2017": "Retina_OCT2017", "chestxray": "Chest",
           "his": "Histopathology"}
"""Other spellings of the domains (lower case, no separators) -> canonical name (:func:`canonical_domain`)."""
TASKS = ("AC", "AS")
"""``AC``: image-level anomaly AUC (every domain); ``AS``: pixel-level AUC (the :data:`MASKED` domains)."""


def canonical_domain(name: str) -> str:
    """``"Brain"``, ``"BrainMRI"``, ``"RESC"``, ``"OCT17"``, ``"HIS"`` ... -> the folder stem."""
    if name in DOMAINS:
        return name
    key = name.lower().replace("_ad", "").replace("-", "").replace("_", "")
    for d in DOMAINS:
        if key == d.lower().replace("_", ""):
            return d
    if key in ALIASES:
        return ALIASES[key]
    raise ValueError(f"unknown domain/target {name!r}; must be one of {DOMAINS} "
                     f"(aliases: {sorted(ALIASES)})")

# written by ``make-toy-bmad`` at the data root; ``adsim.data.bmad.simulated`` reads it (here, below bmad's
# torch and open_clip imports, so that writing toy data loads neither)
SIMULATED_MARKER = "SIMULATED_TOY_DATA.txt"
"""File name that marks a data root as SIMULATED toy data (``adsim.data.bmad.simulated``)."""
