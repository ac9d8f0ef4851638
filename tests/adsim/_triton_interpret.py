"""Child process of ``test_adsim_gate_triton.py``: runs the Triton gate kernel under Triton's interpreter.

``TRITON_INTERPRET=1 python _triton_interpret.py CASES.pt OUT.pt``. The interpreter must be chosen
before ``triton`` is first imported (Triton then builds every ``@triton.jit`` function, its own
``tl.sum`` included, as an interpreted one), so it runs here and not in the test session, where it
would change every other Triton user. For each case (a dict of ``match_sequential`` arguments and
options, the Triton kernel to use and whether to compile) it runs ``match_sequential(...,
scan_backend="triton")`` on CPU tensors with that kernel, eagerly or through ``torch.compile`` (``aot_eager``,
one graph), and records both the kernel's raw :class:`adsim.model.gate_triton.Decisions` and
the returned ``Matched``.
"""
import sys

import torch

from adsim.model import gate_triton
from adsim.model.matching import match_sequential


def main(cases_path: str, out_path: str) -> None:
    if not gate_triton.interpreted():
        raise SystemExit("set TRITON_INTERPRET=1 before starting this script")
    raw = []
    gate = gate_triton.gate_decisions
    kernel = gate_triton.DEFAULT_KERNEL

    def recorded(*args, **kw):  # match_sequential looks the function up on the module at call time
        raw.append(gate(*args, kernel=kernel, **kw))
        return raw[-1]

    gate_triton.gate_decisions = recorded
    out = []
    compiled = torch.compile(match_sequential, backend="aot_eager", fullgraph=True)
    for case in torch.load(cases_path):
        kernel = case["kernel"]
        # "compiled": through torch.compile, one graph (the kernel inside torch.ops.adsim.gate_decisions)
        fn = compiled if case.get("compiled") else match_sequential
        matched = fn(*case["args"], scan_backend="triton", **case["kw"])
        out.append({"decisions": tuple(raw.pop()), "matched": tuple(matched)})
    torch.save(out, out_path)


if __name__ == "__main__":
    main(*sys.argv[1:])
