"""The text prompts: the project's medical ensemble and the MVFA/WinCLIP object ensemble, as plain strings."""
from __future__ import annotations

PROMPT_SETS = ("medical", "mvfa_object", "adaclip_object")
"""The prompt ensembles a recipe's ``prompts`` field may name."""

# Prompt ensemble (ours): state phrases x templates, object-agnostic so that one text embedding pair
# serves every modality and the target's name is never needed.
NORMAL_STATES = ("normal {}", "healthy {}", "{} without any abnormality", "{} with no lesion",
                 "unremarkable {}", "{} of healthy tissue")
ANOMALY_STATES = ("abnormal {}", "{} with a lesion", "{} with an anomaly", "{} showing a tumor",
                  "diseased {}", "{} with pathological findings")
TEMPLATES = ("a photo of a {}.", "a medical image of a {}.", "a scan of a {}.",
             "a close-up image of a {}.", "an image showing a {}.")
OBJECT = "medical scan"


def prompt_ensemble() -> dict:
    """``{"normal": [...], "anomaly": [...]}`` -- every prompt the text tower encodes."""
    def expand(states):
        return [t.format(s.format(OBJECT)) for s in states for t in TEMPLATES]
    return {"normal": expand(NORMAL_STATES), "anomaly": expand(ANOMALY_STATES)}


# The MVFA prompt ensemble as the authors call it (utils.py:9-30: ``encode_text_with_prompt_ensemble``
# with the object word "object", train_zero.py:85): 7 normal and 5 abnormal state phrases times the
# 35 CLIP/WinCLIP templates. The phrases are the experimental set-up being reproduced (data), listed
# here so that the "mvfa_object" prompts can be encoded by our text tower.
MVFA_NORMAL = ("{}", "flawless {}", "perfect {}", "unblemished {}", "{} without flaw", "{} without defect",
                "{} without damage")
MVFA_ABNORMAL = ("damaged {}", "broken {}", "{} with flaw", "{} with defect", "{} with damage")
MVFA_TEMPLATES = (
    "a bad photo of a {}.", "a low resolution photo of the {}.", "a bad photo of the {}.",
    "a cropped photo of the {}.", "a bright photo of a {}.", "a dark photo of the {}.", "a photo of my {}.",
    "a photo of the cool {}.", "a close-up photo of a {}.", "a black and white photo of the {}.",
    "a bright photo of the {}.", "a cropped photo of a {}.", "a jpeg corrupted photo of a {}.",
    "a blurry photo of the {}.", "a photo of the {}.", "a good photo of the {}.", "a photo of one {}.",
    "a close-up photo of the {}.", "a photo of a {}.", "a low resolution photo of a {}.",
    "a photo of a large {}.", "a blurry photo of a {}.", "a jpeg corrupted photo of the {}.",
    "a good photo of a {}.", "a photo of the small {}.", "a photo of the large {}.",
    "a black and white photo of a {}.", "a dark photo of a {}.", "a photo of a cool {}.",
    "a photo of a small {}.", "there is a {} in the scene.", "there is the {} in the scene.",
    "this is a {} in the scene.", "this is the {} in the scene.", "this is one {} in the scene.")


# AdaCLIP's ensemble (caoyunkang/AdaCLIP, method/adaclip.py:151-160, ``TextEmbebddingLayer``): the same 7 normal
# and 5 abnormal state phrases with only the first four of the templates above.
ADACLIP_TEMPLATES = MVFA_TEMPLATES[:4]


def prompt_texts(kind: str) -> dict:
    """``{"normal": [...], "anomaly": [...]}`` for the recipe's ``prompts`` field."""
    if kind == "medical":
        return prompt_ensemble()
    if kind in ("mvfa_object", "adaclip_object"):
        templates = MVFA_TEMPLATES if kind == "mvfa_object" else ADACLIP_TEMPLATES
        return {"normal": [t.format(s.format("object")) for s in MVFA_NORMAL for t in templates],
                "anomaly": [t.format(s.format("object")) for s in MVFA_ABNORMAL for t in templates]}
    raise ValueError(f"prompts must be one of {PROMPT_SETS}, got {kind!r}")
