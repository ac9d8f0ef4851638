"""What ``predict --out DIR`` leaves to look at: ``DIR/scores.csv`` and ``DIR/report.html``.

``scores.csv`` has one row per scored picture and one per volume, each saying where its score came
from: ``path`` (the file; a volume's file or ``<folder> [series N]``), ``kind`` (``image``, ``frame``,
``slice`` or ``volume``), ``index`` (frame/slice, empty for a 2-D image and a volume), ``axis`` (a
NIfTI slice's axis), ``score``, ``window`` (how stored values became pixels,
``adsim.data.medical``). A volume's row follows its last picture. Cells are written by the ``csv``
module (quoted where a comma, quote or newline needs it); a text cell that starts with ``=``, ``+``,
``-``, ``@``, a tab or a carriage return gets a leading ``'`` so that a spreadsheet shows it as text
instead of running it as a formula (OWASP's CSV-injection guard; the CSV's paths are then not
byte-exact for such names, which no real file name needs).

``report.html`` is one self-contained file (no script, no external resource; opens from disk): the
run's settings, a histogram of the scores (inline SVG), the volumes, and every picture sorted by score
with its overlay embedded as a PNG data URI (the first :data:`MAX_EMBEDDED` by rank; the rest are
listed). Every string that comes from a file name, a DICOM tag or the settings is HTML-escaped.
"""
from __future__ import annotations

import base64
import csv
import html
import io
import math
from pathlib import Path

import numpy as np

from poolsim.io import atomic_write_text

COLUMNS = ("path", "kind", "index", "axis", "score", "window")
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
MAX_EMBEDDED = 500  # overlays embedded in report.html (a few tens of kB each)
BAR_COLOUR = "#3b6ea5"


def safe_cell(value) -> str:
    """A CSV text cell: ``''`` for None; a leading ``'`` before a spreadsheet formula start."""
    if value is None:
        return ""
    text = str(value)
    return "'" + text if text.startswith(FORMULA_START) else text


def csv_rows(pred) -> list:
    """``scores.csv``'s rows (dicts of :data:`COLUMNS`, not yet guarded) of an
    ``adsim.inference.Prediction``: each picture, and each volume's row after its last picture."""
    after: dict[int, list[dict]] = {}
    for v in pred.volumes or []:
        after.setdefault(v["last"], []).append(v)
    rows = []
    for i, (r, s) in enumerate(zip(pred.records, pred.scores)):
        rows.append({**{k: r[k] for k in ("path", "kind", "index", "axis", "window")}, "score": float(s)})
        rows += [{k: v[k] for k in COLUMNS} for v in after.get(i, [])]
    return rows


def write_scores_csv(path, pred) -> Path:
    """``scores.csv`` (:data:`COLUMNS`) of ``pred``, written atomically."""
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(COLUMNS)
    for row in csv_rows(pred):
        writer.writerow([repr(row["score"]) if k == "score" else safe_cell(row[k]) for k in COLUMNS])
    return atomic_write_text(path, text.getvalue())


def _e(value) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def histogram_svg(scores, *, width: int = 560, height: int = 180, bins: int | None = None) -> str:
    """An inline SVG histogram of ``scores`` (counts per equal-width bin; ``bins``: default
    ``clip(ceil(sqrt(n)), 5, 30)``), with the score range and the largest count on the axes."""
    s = np.asarray(scores, dtype=np.float64)
    n = len(s)
    bins = bins or int(min(30, max(5, math.ceil(math.sqrt(max(n, 1))))))
    lo, hi = (float(s.min()), float(s.max())) if n else (0.0, 1.0)
    if not hi > lo:
        lo, hi = lo - 0.5, hi + 0.5
    counts, edges = np.histogram(s, bins=bins, range=(lo, hi))
    top = max(int(counts.max()) if n else 1, 1)
    pad, plot_h = 30, height - 50
    bar_w = (width - 2 * pad) / bins
    bars = "".join(
        f'<rect class="bar" x="{pad + j * bar_w:.2f}" y="{10 + plot_h * (1 - c / top):.2f}" '
        f'width="{max(bar_w - 1, 1):.2f}" height="{plot_h * c / top:.2f}" fill="{BAR_COLOUR}">'
        f"<title>{edges[j]:.4g} to {edges[j + 1]:.4g}: {c}</title></rect>" for j, c in enumerate(counts))
    axis = (f'<line x1="{pad}" y1="{10 + plot_h}" x2="{width - pad}" y2="{10 + plot_h}" stroke="#333"/>'
            f'<text x="{pad}" y="{height - 18}" font-size="12">{lo:.4g}</text>'
            f'<text x="{width - pad}" y="{height - 18}" font-size="12" text-anchor="end">{hi:.4g}</text>'
            f'<text x="{width / 2}" y="{height - 4}" font-size="12" text-anchor="middle">score ({n} pictures, '
            f'{bins} bins)</text><text x="2" y="20" font-size="12">{top}</text>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
            f'aria-label="histogram of the scores">{bars}{axis}</svg>')


def _png_uri(path: Path) -> str | None:
    try:
        data = path.read_bytes()
    except OSError:
        return None
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


_STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; margin-bottom: 1em; }
td, th { border: 1px solid #ccc; padding: 2px 8px; text-align: left; font-size: 13px; vertical-align: top; }
.grid { display: flex; flex-wrap: wrap; gap: 10px; }
figure.item { margin: 0; width: 220px; border: 1px solid #ccc; padding: 4px; font-size: 12px; }
figure.item img { width: 212px; image-rendering: pixelated; }
figcaption { overflow-wrap: anywhere; }
.score { font-weight: bold; }
.warn { color: #a33; }
"""


def write_report(path, pred, settings: dict, *, overlays=None, skipped=(), title: str = "adsim predict") -> Path:
    """``report.html`` of ``pred`` (an ``adsim.inference.Prediction`` with ``records``), written
    atomically. ``settings``: what produced it (name -> value; shown as given, escaped); ``overlays``: the
    folder of the overlay PNGs named in the records (None: no images); ``skipped``: ``(name, reason)`` of
    the inputs that could not be read."""
    order = np.argsort(-np.asarray(pred.scores, dtype=np.float64), kind="stable")
    rows = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in settings.items())
    parts = [f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{_e(title)} report</title>"
             f"<style>{_STYLE}</style></head><body>",
             f"<h1>{_e(title)}: {len(pred.paths)} pictures scored</h1>",
             f"<table class=\"settings\">{rows}</table>",
             "<h2>Scores</h2><p>Higher = more anomalous.</p>", histogram_svg(pred.scores)]
    if skipped:
        parts.append(f"<h2 class=\"warn\">Skipped ({len(skipped)})</h2><ul class=\"skipped\">"
                     + "".join(f"<li>{_e(n)}: {_e(r)}</li>" for n, r in skipped) + "</ul>")
    if pred.volumes:
        vrows = "".join(f"<tr class=\"volume\"><td>{_e(v['path'])}</td><td>{_e(v['description'])}</td>"
                        f"<td>{v['n']}</td><td class=\"score\">{v['score']:.6g}</td><td>{_e(v['rule'])}</td>"
                        f"<td>{_e(v['window'])}</td></tr>" for v in sorted(pred.volumes, key=lambda v: -v["score"]))
        parts.append("<h2>Volumes</h2><table><tr><th>volume</th><th>description</th><th>pictures</th>"
                     f"<th>score</th><th>rule</th><th>window</th></tr>{vrows}</table>")
    embedded = min(len(order), MAX_EMBEDDED) if overlays is not None else 0
    note = ("" if overlays is None else f" Overlays of the {embedded} highest-scoring embedded."
            if embedded < len(order) else " Heatmap: the pixel map, min-max normalised per picture.")
    parts.append(f"<h2>Pictures by score</h2><p>{len(order)} pictures.{_e(note)}</p><div class=\"grid\">")
    for rank, i in enumerate(order, 1):
        r = pred.records[i]
        img = ""
        if overlays is not None and rank <= MAX_EMBEDDED and r.get("overlay"):
            uri = _png_uri(Path(overlays) / r["overlay"])
            img = f"<img alt=\"overlay of {_e(pred.paths[i])}\" src=\"{uri}\">" if uri else ""
        where = f"{r['kind']} {r['index']}" + (f", {r['axis']}" if r["axis"] else "") if r["index"] is not None else ""
        parts.append(f"<figure class=\"item\" data-rank=\"{rank}\">{img}<figcaption><span class=\"score\">#{rank} "
                     f"score {float(pred.scores[i]):.6g}</span><br>{_e(r['path'])}"
                     + (f"<br>{_e(where)}" if where else "") + (f"<br>{_e(r['description'])}" if r["description"]
                                                                else "")
                     + f"<br>window: {_e(r['window'])}</figcaption></figure>")
    parts.append("</div></body></html>\n")
    return atomic_write_text(path, "".join(parts))
