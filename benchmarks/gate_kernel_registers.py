"""Registers and spills of the two Triton gate kernels (``adsim.model.gate_triton``) for an H100/H200 (sm_90),
from Triton's real compiler and ptxas; no GPU needed. Not part of the tests (which check the dots kernel
for spills at 1, 2 and 4 warps).

Compiled at ViT-L's width (``d = 768`` in a 1024-lane tile) with the integer arguments and pointers
specialised as divisible by 16, as Triton does for a real launch at that shape; every metric x gate
of the dots kernel (EMA), the chords kernel's l2 and geodesic adaptive gates with the EMA and slerp.

    python benchmarks/gate_kernel_registers.py            # prints one Markdown table
"""
from __future__ import annotations

import contextlib
import io
import re
import sys
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adsim.model import gate_triton as _gate_triton  # noqa: E402

WARPS = (1, 2, 4, 8)
POINTERS = ("f_ptr", "lab_ptr", "c_ptr", "init_ptr", "acc_ptr", "r_ptr", "c_out_ptr")


def ptxas_usage(fn, signature: dict, constexprs: dict, num_warps: int, fusion: bool) -> tuple[int, int]:
    """``(registers per thread, bytes of spill stores)`` from ptxas' log of one fresh compilation."""
    attrs = {(fn.arg_names.index(k),): [["tt.divisibility", 16]]
             for k, v in signature.items() if v == "*fp32" or k in ("n", "d")}
    src = ASTSource(fn=fn, signature={**signature, **{k: "constexpr" for k in constexprs}}, constexprs=constexprs,
                    attrs=attrs)
    log = io.StringIO()
    with contextlib.redirect_stdout(log):  # Triton prints ptxas' log with dump_ptxas_log
        triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=num_warps,
                                                                          enable_fp_fusion=fusion))
    text = log.getvalue()
    return (int(re.search(r"Used (\d+) registers", text).group(1)),
            int(re.search(r"(\d+) bytes spill stores", text).group(1)))


def main() -> int:
    triton.knobs.nvidia.dump_ptxas_log = True
    triton.knobs.compilation.always_compile = True  # a cached binary prints no log
    base = {k: "*fp32" for k in POINTERS} | dict(n="i32", d="i32", alpha="fp32", beta="fp32")
    variants = [(f"dots, {m}, {'fixed' if fixed else 'adaptive'}, EMA", _gate_triton._dots_kernel,
                 base | dict(tau_key="fp32"),
                 dict(METRIC=i, FIXED_TAU=fixed, BLOCK_D=1024, STAGES=_gate_triton.DOTS_STAGES), True)
                for m, i in _gate_triton.METRIC_IDS.items() for fixed in (False, True)]
    variants += [(f"chords, {m}, adaptive, {'slerp' if slerp else 'EMA'}", _gate_triton._gate_kernel,
                  base | dict(tau="fp32", tau_sin="fp32", tau_cos="fp32"),
                  dict(METRIC=_gate_triton.METRIC_IDS[m], FIXED_TAU=False, SLERP=slerp, BLOCK_D=1024), False)
                 for m in ("l2", "geodesic") for slerp in (False, True)]
    print(f"sm_90, d = 768 (1024-lane tile), triton {triton.__version__}: registers per thread / bytes spilled\n")
    print("| kernel, metric, gate, update | " + " | ".join(f"{w} warp{'s' * (w > 1)}" for w in WARPS) + " |")
    print("|---|" + "---:|" * len(WARPS))
    for label, fn, sig, const, fusion in variants:
        cells = [ptxas_usage(fn, sig, const, w, fusion) for w in WARPS]
        print(f"| {label} | " + " | ".join(f"{r} / {s}" for r, s in cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
