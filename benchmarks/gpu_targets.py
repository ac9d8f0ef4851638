"""One table of every target the GPU session checked: ``name|measured|target|ok`` rows (written by
``benchmarks/gpu_adsim.py --targets`` and ``benchmarks/gpu_e2e.py``) as Markdown, with a count.

    python benchmarks/gpu_targets.py TARGETS.txt
"""
from __future__ import annotations

import sys


def table(lines: list[str]) -> str:
    rows = [ln.rstrip("\n").split("|") for ln in lines if ln.count("|") == 3]
    out = ["| check | measured | target | met? |", "|---|---:|---|---|"]
    out += [f"| {n} | {m} | {t} | {ok} |" for n, m, t, ok in rows]
    failed = sum(ok != "yes" for *_, ok in rows)
    out.append("")
    out.append(f"{len(rows) - failed} of {len(rows)} targets met" + (f"; {failed} NOT met" if failed else ""))
    return "\n".join(out)


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(table(f.readlines()))
