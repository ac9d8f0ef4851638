"""``python -m poolsim.figures --check``: the report comparing a fresh run with the committed results.

One markdown table per figure: its CSV (every plotted number) and each of its claims of
``verdicts.csv``, with the largest difference in units of the 95% interval's half-width, the
largest difference as a share of the column's scale, the verdicts (committed -> this run) and
whether the row reproduces (:mod:`poolsim.figures._compare`: numbers within tolerance, verdicts
equal). Every difference beyond that is one line naming the figure and the claim or row.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import NamedTuple

from . import _compare


class Report(NamedTuple):
    """``text``: the tables (markdown); ``problems``: one line per difference beyond tolerance."""

    text: str
    problems: list


def _read(path: Path) -> str | None:
    return path.read_text(encoding="utf-8") if path.is_file() else None


def _fmt(x: float) -> str:
    return "-" if math.isnan(x) else "0" if x == 0 else f"{x:.2g}"


def _verdicts(pairs: list) -> str:
    if not pairs:
        return "-"
    return "; ".join(("" if col == "verdict" else f"{col}: ")
                     + (f"{old} = {new}" if old == new else f"**{old} -> {new}**")
                     for _, col, old, new in pairs)


def _row(what: str, d: _compare.Diff) -> str:
    result = "reproduced" if d.same else "**differs**"
    if d.same and d.bitwise:
        result += " (bit for bit)"
    return (f"| {what.replace('|', '/')} | {_fmt(d.worst_hw)} | {_fmt(d.worst_rel)} | "
            f"{_verdicts(d.verdicts)} | {result} |")


def report(names, run: Path, committed: Path) -> Report:
    """Compare the figures ``names`` made into ``run`` with the files in ``committed``."""
    problems, lines = [], [
        f"Comparison of this run with the results in {committed} (tolerance: "
        f"{_compare.RTOL:g} of each column's largest magnitude; half-width: of the committed "
        f"95% interval).", ""]
    new_v, old_v = _read(run / "verdicts.csv"), _read(committed / "verdicts.csv")
    for name in names:
        lines += [f"## {name}", "",
                  "| compared | largest difference (half-widths) | largest difference (share of "
                  "column scale) | verdicts (committed = this run) | result |",
                  "|---|---|---|---|---|"]
        new_csv, old_csv = _read(run / f"{name}.csv"), _read(committed / f"{name}.csv")
        if old_csv is None:
            lines.append(f"| {name}.csv | - | - | - | **no committed file** |")
            problems.append(f"{name}: no committed {name}.csv in {committed}")
        elif new_csv is not None:
            d = _compare.compare(new_csv, old_csv, label=f"{name}.csv: ")
            lines.append(_row(f"{name}.csv (every plotted number)", d))
            problems += [f"{name}: {p}" for p in d.problems]
        if new_v is not None and old_v is not None:
            mine = _compare.rows_where(new_v, "figure", name)
            theirs = _compare.rows_where(old_v, "figure", name)
            whole = _compare.compare(mine, theirs, _compare.VERDICT_KEY)
            header, rows = _compare.read(theirs)
            j = header.index("claim") if "claim" in header else None
            for claim in dict.fromkeys(r[j] for r in rows) if j is not None else ():
                d = _compare.compare(_compare.rows_where(mine, "claim", claim),
                                     _compare.rows_where(theirs, "claim", claim),
                                     _compare.VERDICT_KEY)
                lines.append(_row(f"claim: {claim}", d))
            problems += [f"{name}: verdicts.csv: {p}" for p in whole.problems]
        lines.append("")
    return Report("\n".join(lines), problems)
