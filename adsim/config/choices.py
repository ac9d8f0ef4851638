"""Named choices shared by the CLI, the recipes and the code that implements them (plain Python, no torch).

Each tuple is the one definition of its choice; the modules that implement a choice import it from here,
so ``python -m adsim ... --help`` can list them without loading torch or open_clip.
"""
from __future__ import annotations

TINY = "adsim-tiny"
# name -> (open_clip config name, default image size). ViT-L-14-336 runs at 238 px: the 17 x 17 patch
# grid of the authors' "240 px" set-up (their conv silently drops the last 2 pixel rows/columns; we
# refuse image sizes that are not a multiple of the patch size instead).
BACKBONES = {
    "tiny": (TINY, 64),
    "ViT-B-16": ("ViT-B-16", 224),
    "ViT-L-14": ("ViT-L-14", 224),
    "ViT-L-14-336": ("ViT-L-14-336", 238),
}
"""``--backbone`` names -> ``(open_clip config name, default image size in pixels)``."""
TEST_BACKBONE = "tiny"
"""The small backbone of the tests: random weights by design, so it needs no ``--random-weights``."""


def require_weights(backbone: str, checkpoint, random_weights: bool, *, cli: bool = False) -> None:
    """Refuse a backbone that would get random weights unless that is asked for: ``ValueError`` when
    ``checkpoint`` is ``None`` for a known backbone other than :data:`TEST_BACKBONE` and ``random_weights``
    is false, and when both a checkpoint and ``random_weights`` are given. One line naming the way out,
    in the CLI's words (``--checkpoint``, ``--random-weights``) with ``cli=True``, else the Python API's
    (``checkpoint=``, ``random_weights=True``). An unknown ``backbone`` is left to the builder's own check."""
    ckpt, rand, tiny = (("--checkpoint", "--random-weights", f"--backbone {TEST_BACKBONE}") if cli else
                        ("checkpoint=", "random_weights=True", f"backbone={TEST_BACKBONE!r}"))
    if checkpoint is not None and random_weights:
        raise ValueError(f"{ckpt.rstrip('=')} loads weights and {rand} asks for random ones: give one of them")
    if checkpoint is None and not random_weights and backbone in BACKBONES and backbone != TEST_BACKBONE:
        raise ValueError(f"backbone {backbone} without {ckpt.rstrip('=')} would have RANDOM weights and meaningless "
                         f"scores: give {ckpt}{' ' if cli else ''}PATH (local weights, e.g. ViT-L-14-336px.pt), "
                         f"or {rand} for a test or timing run ({tiny} is the small random test backbone)")
# image score / pixel map of the adapter head (adsim.model.head explains each)
SCORES = ("logit_max", "logit_mean", "authors_prob_mean")
"""How the adapter head turns patch logits into an image score (``--score``; ``adsim.model.head.image_scores``)."""
DEFAULT_SCORE = "logit_max"
"""The image score used when a recipe does not name one."""
# torch.compile modes of the training step (adsim.training.compiled_step; a test checks they agree)
MODES = ("auto", "default", "reduce-overhead")
"""``torch.compile`` modes of the compiled training step."""
# what --compile accepts: a mode, "cuda" (reduce-overhead on a CUDA device in one process, else eager) or
# "off" (eager, the default: compiling pays back only after several epochs, docs/compile.md)
COMPILE_CHOICES = (*MODES, "cuda", "off")
"""What ``--compile`` accepts: a :data:`MODES` entry, ``"cuda"`` or ``"off"``."""
DEFAULT_COMPILE = "off"
"""``--compile``'s default: eager (compiling pays back only after several epochs; ``docs/compile.md``)."""
# the matching core's metrics (poolsim's METRICS; a test checks they agree)
METRICS = ("l2", "cosine", "geodesic")
"""Distances of the matching gate (``poolsim.core.METRICS``)."""
# the built-in training-free methods (adsim.methods.baselines registers them; a test checks they agree)
ZERO_SHOT_METHODS = ("winclip",)
"""Built-in training-free methods (``predict --zero-shot NAME``); plugins add more at run time."""
