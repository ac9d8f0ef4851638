"""Writes ``tests/adsim/data/bilora_per_domain_state.pt``: a BiLoRA head state in the per-domain layout
(one parameter ``cores.<t>`` per domain, ``support_rows``/``support_cols (t, r)``), written by the
``bilora.py`` of commit b755121 (the last one with that layout), with the scores that code computed.

    git show b755121:adsim/methods/baselines/bilora.py > /tmp/bilora_b755121.py
    python tests/adsim/_bilora_legacy.py /tmp/bilora_b755121.py

The head is ``test_adsim_bilora.naive_head(seed=4)`` (width 32, embed 16, 2 layers) with three domains
started (seed 9), every core filled from a seeded generator; ``x (3, 2, 4, 32)`` tokens and the head's
``image_logits (3,)`` and first seg-adapter output on them are stored beside the state."""
import importlib.util
import sys
from pathlib import Path

import torch

HERE = Path(__file__).parent
FIXTURE = HERE / "data" / "bilora_per_domain_state.pt"
DOMAINS, SEED = 3, 9


def main(path: str) -> None:
    spec = importlib.util.spec_from_file_location("bilora_legacy", path)
    legacy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(legacy)
    sys.path.insert(0, str(HERE))
    from test_adsim_bilora import naive_head

    from adsim.model.head import features_from_tokens

    head = naive_head(seed=4)
    legacy.attach(head)
    gen = torch.Generator().manual_seed(5)
    for t in range(DOMAINS):
        for p in legacy.add_domain(head, t, seed=SEED):
            p.data.copy_(torch.randn(p.shape, generator=gen))
    x = torch.randn(3, 2, 4, 32, generator=gen)
    with torch.no_grad():
        feats = features_from_tokens(head, x)
    state = head.state_dict()
    assert any(".cores.2" in k for k in state), "not the per-domain layout"
    torch.save({"state": state, "x": x, "image_logits": feats.image_logits, "seg0": feats.seg[0],
                "domains": DOMAINS, "seed": SEED}, FIXTURE)
    print(f"wrote {FIXTURE} ({FIXTURE.stat().st_size} bytes)")


if __name__ == "__main__":
    main(sys.argv[1])
