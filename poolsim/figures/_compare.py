"""Compare a figure run's tables with the committed ones: the rule that decides whether a rerun
*reproduced* a CSV (then nothing is rewritten) and the numbers ``--check`` reports.

Two CSV files are **equivalent** when they have the same columns and rows, every text cell is
equal, and every number differs by at most its tolerance::

    |new - old| <= RTOL * (largest |value| of that column in the committed file)

(NaN equals NaN, infinities must match; a column the writer rounded to ``k`` decimals, 4 <= k <= 6,
as ``phase.csv`` does with 5, also allows one unit of its last decimal: a value within float
noise of a rounding boundary may round either way). Why :data:`RTOL` = 1e-5: the engine and the
flows compute in float32 (machine epsilon 1.2e-7), and a CPU with other vector instructions (or
XLA limited to another instruction set) only sums in another order: measured between AVX-512,
SSE4.2 and the CPU the figures were committed on, every figure number differed by at most 3e-7
of its column's largest magnitude (a few float32 units in the last place). 1e-5 is ~80 such units,
far above reordering noise and far below any real change: another seed, parameter or estimator
moves a Monte-Carlo mean by a sizeable share of its 95% interval's half-width, which is 1e-3 to
1e-1 of the value here.

The same rule serves two callers: the figures CLI keeps a committed file (and redraws the figure
from the committed numbers, so that its images and summary lines come out byte for byte as
committed) when the rerun is equivalent; ``--check`` reruns into a scratch folder and reports, per
figure, the largest difference in units of the interval half-width and whether every verdict is
the same. Both compare by column name (and ``verdicts.csv`` by its key columns, figure and claim),
so a column or row present on one side only is a reported difference, not an error.
"""
from __future__ import annotations

import csv
import io
import math
from decimal import Decimal, InvalidOperation
from typing import Iterable, NamedTuple

RTOL = 1e-5
"""Tolerance of a number, as a share of the largest magnitude of its column (see the module text)."""

VERDICT_KEY = ("figure", "claim")
"""The columns that name a row of ``verdicts.csv``."""


def read(text: str) -> tuple[list[str], list[list[str]]]:
    """``(header, rows)`` of a CSV text, every cell as written."""
    rows = list(csv.reader(io.StringIO(text)))
    return (rows[0], rows[1:]) if rows else ([], [])


def _number(cell: str) -> float | None:
    """The cell as a float, or ``None`` for a text cell (an empty cell is text)."""
    if not cell or cell.strip() != cell or cell.lower() in ("true", "false"):
        return None
    try:
        return float(cell)
    except ValueError:
        return None


def _decimals(cell: str) -> int | None:
    """Decimals of a number written in plain positional form (``"0.19585"`` -> 5), else ``None``."""
    if "e" in cell.lower() or "." not in cell:
        return None
    try:
        exp = Decimal(cell).as_tuple().exponent
    except InvalidOperation:
        return None
    return -exp if isinstance(exp, int) else None


class Column(NamedTuple):
    """The tolerance of one committed column: ``scale`` (largest finite magnitude) and ``unit`` (one
    unit of the last decimal when the writer rounded the column, else 0)."""

    scale: float
    unit: float

    def tol(self) -> float:
        return max(RTOL * self.scale, self.unit)


def column(cells: Iterable[str]) -> Column:
    """The :class:`Column` of the committed ``cells``."""
    nums, places = [], []
    for c in cells:
        x = _number(c)
        if x is not None and math.isfinite(x):
            nums.append(abs(x))
            d = _decimals(c)
            if d is not None:
                places.append(d)
    k = max(places, default=None)
    # rounded by the writer: nearly every non-integer cell has exactly k (4..6) decimals, where a
    # float written in full has 15-17 significant digits
    rounded = k is not None and 4 <= k <= 6 and sum(d == k for d in places) >= 0.9 * len(places)
    return Column(max(nums, default=0.0), 1.001 * 10.0 ** -k if rounded else 0.0)  # 0.1% slack: binary


def close(new: str, old: str, col: Column) -> bool:
    """Whether cell ``new`` reproduces committed cell ``old`` (text equal, or numbers within
    ``col``'s tolerance)."""
    if new == old:
        return True
    a, b = _number(new), _number(old)
    if a is None or b is None:
        return False
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= col.tol()


class Diff(NamedTuple):
    """How a rerun's table compares with the committed one.

    ``same``: equivalent (see the module text); ``problems``: one line per difference beyond
    tolerance (a number, a text cell, a verdict, a column or row on one side only);
    ``worst_hw``: the largest ``|new - old|`` of an interval's centre or bounds in units of the
    committed interval's half-width (0.0 when nothing differs, NaN when no column has an
    interval); ``worst_rel``: the largest ``|new - old|`` of any number over its column's scale;
    ``verdicts``: ``(row name, column, committed, this run)`` for every verdict cell compared;
    ``bitwise``: every cell is the same text."""

    same: bool
    problems: list
    worst_hw: float
    worst_rel: float
    verdicts: list
    bitwise: bool


def _intervals(header: list[str]) -> list[tuple[str, str, str]]:
    """``(centre, low, high)`` column names: ``X, X_ci_low, X_ci_high`` and ``mean|value|estimate,
    ci_low, ci_high``."""
    out = [(c, f"{c}_ci_low", f"{c}_ci_high") for c in header
           if f"{c}_ci_low" in header and f"{c}_ci_high" in header]
    if "ci_low" in header and "ci_high" in header:
        centre = next((c for c in ("mean", "value", "estimate") if c in header), None)
        out.append((centre, "ci_low", "ci_high"))
    return out


def _verdict_columns(header: list[str], rows: list[list[str]]) -> list[str]:
    """Columns whose committed cells are all verdicts (``holds``, ``does not hold``, ...)."""
    from .._verdict import OUTCOMES

    cols = []
    for j, name in enumerate(header):
        cells = {r[j] for r in rows if j < len(r) and r[j]}
        if cells and cells <= set(OUTCOMES):
            cols.append(name)
    return cols


def compare(new_text: str, old_text: str, key: tuple[str, ...] | None = None,
            label: str = "") -> Diff:
    """Compare a rerun's CSV text with the committed one. Rows are matched by the ``key`` columns
    (``None``: by position); only columns present on both sides are compared cell by cell."""
    (hn, rn), (ho, ro) = read(new_text), read(old_text)
    problems = []
    only_new, only_old = [c for c in hn if c not in ho], [c for c in ho if c not in hn]
    for c in only_new:
        problems.append(f"{label}column {c!r} is new (not in the committed file)")
    for c in only_old:
        problems.append(f"{label}column {c!r} of the committed file is missing")
    common = [c for c in ho if c in hn]
    jn, jo = {c: i for i, c in enumerate(hn)}, {c: i for i, c in enumerate(ho)}

    def name(row, i):
        return " / ".join(row[jo[k]] for k in key) if key else f"row {i + 1}"

    if key and all(k in jo and k in jn for k in key):
        old_by = {tuple(r[jo[k]] for k in key): r for r in ro}
        new_by = {tuple(r[jn[k]] for k in key): r for r in rn}
        pairs = [(new_by[k], old_by[k], " / ".join(k)) for k in old_by if k in new_by]
        problems += [f"{label}row {' / '.join(k)!r} is new" for k in new_by if k not in old_by]
        problems += [f"{label}row {' / '.join(k)!r} of the committed file is missing"
                     for k in old_by if k not in new_by]
    else:
        if len(rn) != len(ro):
            problems.append(f"{label}{len(rn)} rows, the committed file has {len(ro)}")
        pairs = [(a, b, name(b, i)) for i, (a, b) in enumerate(zip(rn, ro))]
    cols = {c: column(r[jo[c]] for r in ro) for c in common}
    verdict_cols = set(_verdict_columns(ho, ro)) & set(common)
    spans = [t for t in _intervals(ho) if all(c in common for c in t if c is not None)]
    worst_hw = 0.0 if spans else math.nan
    worst_rel, verdicts, bitwise = 0.0, [], not problems and len(rn) == len(ro)
    for new, old, row in pairs:
        for c in common:
            a, b = new[jn[c]], old[jo[c]]
            if a != b:
                bitwise = False
            if c in verdict_cols:
                verdicts.append((row, c, b, a))
                if a != b:
                    problems.append(f"{label}{row}: {c} is {a!r}, committed {b!r}")
                continue
            if not close(a, b, cols[c]):
                problems.append(f"{label}{row}: {c} = {a}, committed {b} (tolerance "
                                f"{cols[c].tol():.2g})")
            x, y = _number(a), _number(b)
            if x is not None and y is not None and math.isfinite(x) and math.isfinite(y) and x != y:
                worst_rel = max(worst_rel, abs(x - y) / (cols[c].scale or 1.0))
        for centre, lo, hi in spans:
            low, high = _number(old[jo[lo]]), _number(old[jo[hi]])
            if low is None or high is None or not high > low:
                continue
            half = (high - low) / 2
            for c in (centre, lo, hi):
                if c is None:
                    continue
                x, y = _number(new[jn[c]]), _number(old[jo[c]])
                if x is not None and y is not None and math.isfinite(x) and math.isfinite(y):
                    worst_hw = max(worst_hw, abs(x - y) / half)
    return Diff(not problems, problems, worst_hw, worst_rel, verdicts, bitwise)


def _parse(cell: str) -> float:
    x = _number(cell)
    return math.nan if x is None else x


def snap_frame(df, old_text: str):
    """``df`` with every float column replaced by the committed file's numbers (``old_text``,
    equivalent to ``df.to_csv(index=False)`` by :func:`compare`), attributes kept: plotting and
    summarising it gives what the committed numbers give."""
    import numpy as np

    header, rows = read(old_text)
    where = {c: i for i, c in enumerate(header)}
    out = df.copy()
    for c in df.columns:
        if df[c].dtype.kind == "f" and c in where:
            out[c] = np.array([_parse(r[where[c]]) for r in rows], dtype=df[c].dtype)
    out.attrs = df.attrs
    return out


def snap_rows(rows: list[dict], old_text: str, key: tuple[str, ...] = VERDICT_KEY) -> list[dict]:
    """Verdict rows (dicts) with their float fields replaced by the committed ``verdicts.csv``
    row of the same key (rows without one are returned as they are)."""
    header, old = read(old_text)
    if not all(k in header for k in key):
        return rows
    where = {c: i for i, c in enumerate(header)}
    by_key = {tuple(r[where[k]] for k in key): r for r in old}
    out = []
    for row in rows:
        o = by_key.get(tuple(str(row[k]) for k in key))
        if o is None:
            out.append(row)
            continue
        out.append({c: (_parse(o[where[c]]) if isinstance(v, float) and c in where else v)
                    for c, v in row.items()})
    return out


def rows_where(text: str, col: str, value: str, columns: Iterable[str] | None = None) -> str:
    """The CSV ``text`` with only its rows whose ``col`` is ``value`` (header kept), and only the
    ``columns`` among them that it has (``None``: all)."""
    header, rows = read(text)
    if col not in header:
        return text
    j = header.index(col)
    keep = [i for i, c in enumerate(header) if columns is None or c in set(columns)]
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(
        [[header[i] for i in keep]] + [[r[i] for i in keep] for r in rows if r[j] == value])
    return buf.getvalue()
