"""The history page: ``kvbench history DIR``'s static report of the nights, as files by name.

Top to bottom: what was read and the gate's reference; the gate (the regressions tonight against
that reference); the changes found, one row each, with the commit range that holds each; skipped
nights and notes; one graph per metric (``graphs``), each night's column an image-map area naming
its night, commit and kvbench version; an index of the cells with inline SVG sparklines of a
headline set of metrics; and the nights. One HTML file and its PNGs beside it (linked: a year of
graphs inline would make the page tens of megabytes), no script, no outside resource, and no wider
than a 1280 px window: graphs are under 1200 px and tables wrap long labels instead of widening.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

import numpy as np

from ..compare import SHARES
from .changes import DRIFT, EXACT, REGRESSION, STATUS, Change, Detection, Regressed
from .graphs import Graph, draw_all, palette
from .nights import Night
from .series import History

# The sparklines of the index of cells: a column per entry, the first metric of it the cell measured.
HEADLINE: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("tokens/s", ("tokens_per_s", "wall_tokens_per_s")),
    ("mean running", ("mean_running",)),
    ("preemptions", ("preemptions",)),
    ("reservation", ("reservation_frac",)),
    ("TTFT p90 (s)", ("ttft_p90_s",)),
)
SPARK_POINTS = 120  # a sparkline's most points: more nights are averaged in as many buckets
SPARK_SIZE = (110, 22)  # px

STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1200px; padding: 0 1em; color: #222; }
h1 { font-size: 1.5em; margin-bottom: 0.3em; }
h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; table-layout: fixed; width: 100%; }
th, td { border: 1px solid #ccc; padding: 3px 6px; overflow-wrap: anywhere; vertical-align: top; text-align: left; }
th { background: #f3f3f3; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.regression td { background: #fdf1f1; } tr.improvement td { background: #f0f8f0; }
tr.skipped td { color: #666; background: #f7f7f7; }
.meta { color: #555; font-size: 0.9em; }
.gate { color: #b00020; background: #fdecee; border: 2px solid #b00020; padding: 0.5em 0.8em; }
.gate h2 { border: none; margin: 0.2em 0; color: #b00020; } .gate li { margin: 0.2em 0; }
.pass { background: #eef7ee; border: 1px solid #3a8a3a; padding: 0.5em 0.8em; }
figure { margin: 1.2em 0; } .graph { overflow-x: auto; } .graph img { border: 1px solid #eee; display: block; }
figcaption { font-size: 0.9em; color: #444; }
.sw { display: inline-block; width: 0.8em; height: 0.8em; margin-right: 0.3em; vertical-align: baseline; }
.key { font-size: 0.8em; columns: 3; column-gap: 1.5em; margin: 0.3em 0; padding: 0; list-style: none; }
.key li { break-inside: avoid; overflow-wrap: anywhere; }
td svg { display: block; } .spark small { color: #555; }
"""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def number(value: float) -> str:
    """A value for the page: 4 significant digits, thousands grouped; "—" when not a number."""
    if value is None or not math.isfinite(value):
        return "—"
    return f"{value:,.0f}" if abs(value) >= 10_000 else f"{value:.4g}"


def signed_pct(ratio: float) -> str:
    """A ratio as a signed change: 1.07 → "+7.0%"."""
    if ratio is None or not math.isfinite(ratio):
        return "—" if ratio is None or math.isnan(ratio) else ("+∞%" if ratio > 0 else "−∞%")
    return f"{(ratio - 1) * 100:+.1f}%"


def night_text(night: Night) -> str:
    """What a night's image-map area says: its night, commit and kvbench version."""
    return f"{night.name} · commit {night.commit} · kvbench {night.version or '?'}"


def commit_of(history: History) -> dict[str, str]:
    return {n.name: n.commit for n in history.nights.nights}


def header_section(history: History, detection: Detection) -> list[str]:
    """The title and one line: the nights and cells read, the gate's reference and tolerance."""
    read = history.nights.read
    skipped = len(history.nights.skipped)
    span = (
        f"{_e(read[0].name)} → {_e(read[-1].name)}, {read[0].time:%Y-%m-%d} → {read[-1].time:%Y-%m-%d}"
        if read
        else "none"
    )
    accepted = history.nights.accepted == detection.reference_night
    why = "the last night accepted" if accepted else "the first night read: none was accepted"
    return [
        "<h1>kvbench history</h1>",
        f'<p class="meta">{len(read)} night(s) read ({span}){f", {skipped} skipped" if skipped else ""}; '
        f"{len(history.cells)} cell(s) followed. The gate judges tonight ({_e(detection.latest_night)}) against "
        f"<b>{_e(detection.reference_night)}</b> ({why}) with a tolerance of {detection.tolerance * 100:g}%.</p>",
    ]


def regressed_item(r: Regressed, history: History, commits: dict[str, str]) -> str:
    since = f", since {_e(r.since)} (commit {_e(commits.get(r.since, '?'))})" if r.since else ""
    if r.metric == STATUS:
        now = latest_status(history).get(r.cell_id, ("not run", ""))[0]
        return f"<li><b>{_e(r.cell)}</b>: ran ok on {_e(r.reference_night)}, {_e(now)} tonight{since}</li>"
    return (
        f"<li><b>{_e(r.cell)}</b> · {_e(r.metric)}: {number(r.reference)} → {number(r.latest)} "
        f"(<b>{signed_pct(r.ratio)}</b>){since}</li>"
    )


def gate_section(history: History, detection: Detection) -> list[str]:
    """The regressions tonight against the reference night, prominent; else one line."""
    found = detection.regressed
    if not found:
        return [
            '<section id="gate">',
            f'<p class="pass">No regression tonight ({_e(detection.latest_night)}) against '
            f"{_e(detection.reference_night)} beyond {detection.tolerance * 100:g}%.</p>",
            "</section>",
        ]
    commits = commit_of(history)
    return [
        '<section id="gate" class="gate">',
        f"<h2>{len(found)} regression(s) tonight against {_e(detection.reference_night)}</h2>",
        "<ul>",
        *(regressed_item(r, history, commits) for r in found),
        "</ul>",
        "</section>",
    ]


def nights_between(history: History, first: str, last: str) -> int:
    index = history.night_index
    return index[last] - index[first] + 1 if first in index and last in index else 0


def change_text(c: Change, history: History) -> str:
    """before → after and the ratio (a share's absolute move in points too; a drift, its length)."""
    if c.kind == STATUS:
        return "stopped running ok" if c.direction == REGRESSION else "runs ok again"
    text = f"{number(c.before)} → {number(c.after)} ({signed_pct(c.ratio)}"
    if c.metric in SHARES and math.isfinite(c.after - c.before):
        text += f", {(c.after - c.before) * 100:+.2f} pp"
    text += ")"
    if c.kind == DRIFT:
        text += f" over {nights_between(history, c.first_night, c.last_night)} nights through {c.last_night}"
    return _e(text)


def noise_text(c: Change) -> str:
    if c.kind == EXACT:
        return "exact"
    return f"±{c.noise * 100:.1f}%" if c.noise is not None and math.isfinite(c.noise) else "—"


CHANGE_COLUMNS: tuple[tuple[str, int], ...] = (
    ("cell", 18),
    ("metric", 14),
    ("kind", 5),
    ("direction", 9),
    ("first night (commit)", 16),
    ("commits", 12),
    ("change", 19),
    ("noise", 7),
)


def colgroup(columns: Sequence[tuple[str, int]]) -> str:
    """Fixed column widths (percent): a long label wraps inside its column, never widens the page."""
    cols = "".join(f'<col style="width:{w}%">' for _, w in columns)
    head = "".join(f"<th>{_e(h)}</th>" for h, _ in columns)
    return f"<colgroup>{cols}</colgroup><thead><tr>{head}</tr></thead>"


def changes_section(history: History, detection: Detection) -> list[str]:
    """Every change found, in the order detection gives them."""
    parts = ['<section id="changes">', "<h2>Changes found</h2>"]
    if not detection.changes:
        return [*parts, "<p>No change found.</p>", "</section>"]
    rows = []
    for c in detection.changes:
        commits = f"{c.previous_commit}..{c.commit}" if c.previous_commit else c.commit
        rows.append(
            f'<tr class="{_e(c.direction)}"><td>{_e(c.cell)}</td>'
            f'<td><a href="#graph-{_e(c.metric)}">{_e(c.metric)}</a></td><td>{_e(c.kind)}</td>'
            f"<td>{_e(c.direction)}</td><td>{_e(c.first_night)} ({_e(c.commit)})</td><td>{_e(commits)}</td>"
            f"<td>{change_text(c, history)}</td><td>{noise_text(c)}</td></tr>"
        )
    return [
        *parts,
        f'<p class="meta">{len(detection.changes)} change(s). The commit range holds the change: the night '
        "before it ran the first commit, its first night the second. Noise is the series' night-to-night "
        "spread (σ); deterministic metrics are exact.</p>",
        f"<table>{colgroup(CHANGE_COLUMNS)}<tbody>{''.join(rows)}</tbody></table>",
        "</section>",
    ]


def notes_section(history: History) -> list[str]:
    """Skipped nights and the history's notes, a line each; nothing when there are none."""
    skipped = history.nights.skipped
    if not skipped and not history.notes:
        return []
    lines = [f"<li>Skipped night <b>{_e(n.name)}</b>: {_e(n.skipped)}</li>" for n in skipped]
    lines += [f"<li>{_e(note)}</li>" for note in history.notes]
    return ['<section id="notes">', "<h2>Notes</h2>", "<ul>", *lines, "</ul>", "</section>"]


def color_key(cells: Sequence[int], labels: dict[int, str], colors: dict[int, str]) -> str:
    items = "".join(
        f'<li><span class="sw" style="background:{colors[c]}"></span>{_e(labels.get(c, c))}</li>' for c in cells
    )
    return f'<ul class="key">{items}</ul>'


def graph_figure(g: Graph, nights: Sequence[Night], labels: dict[int, str], colors: dict[int, str]) -> str:
    """A graph's <figure>: the PNG beside the page (a year of graphs inline would make the page tens of
    megabytes), its image map (a rect per night column) and caption."""
    areas = "".join(
        f'<area shape="rect" coords="{x0},{y0},{x1},{y1}" href="#night-{_e(n.name)}" '
        f'title="{_e(night_text(n))}" alt="{_e(n.name)}">'
        for (x0, y0, x1, y1), n in zip(g.columns, nights)
    )
    notes = [
        f"{len(g.cells)} cell(s), each as its value ÷ its own median over the nights (1: its usual level).",
        "× at the foot: a night the cell ran but not ok.",
        "Dashed vertical: a change found at its first night (red a regression, green an improvement); "
        "shaded: a drift; thin dashed: the fitted level.",
        "Point at a night's column for its night, commit and kvbench version.",
    ]
    if g.offset:
        names = ", ".join(labels.get(c, str(c)) for c in g.offset)
        notes.append(f"Median 0, drawn as 1 + value ÷ the largest value: {names}.")
    key = "" if g.legend else ' Colours: <a href="#colours">the key above the graphs</a>.'
    return (
        f'<figure id="graph-{_e(g.metric)}"><div class="graph"><img src="{_e(g.metric)}.png" '
        f'width="{g.width}" height="{g.height}" alt="{_e(g.title)}" usemap="#map-{_e(g.metric)}"></div>'
        f'<map name="map-{_e(g.metric)}">{areas}</map>'
        f"<figcaption><b>{_e(g.title)}</b>. {_e(' '.join(notes))}{key}</figcaption></figure>"
    )


def graphs_section(
    graphs: Sequence[Graph], history: History, labels: dict[int, str], colors: dict[int, str]
) -> list[str]:
    parts = ['<section id="graphs">', "<h2>Metrics across the nights</h2>"]
    if not graphs:
        return [*parts, "<p>No metric has a value on any night.</p>", "</section>"]
    nights = history.nights.read
    unnamed = sorted({c for g in graphs if not g.legend for c in g.cells})
    if unnamed:  # once for every graph too crowded for a legend: each cell keeps its colour throughout
        parts.append(f'<div id="colours">{color_key(unnamed, labels, colors)}</div>')
    return [*parts, *(graph_figure(g, nights, labels, colors) for g in graphs), "</section>"]


def sparkline(x: np.ndarray, y: np.ndarray, n: int, title: str) -> str:
    """An inline SVG polyline of ``y`` over night indexes ``x`` (of ``n`` nights), scaled to its own
    range, averaged into at most ``SPARK_POINTS`` buckets."""
    if len(x) > SPARK_POINTS:
        starts = np.linspace(0, len(x), SPARK_POINTS + 1).astype(int)[:-1]
        counts = np.diff(np.append(starts, len(x)))
        x, y = np.add.reduceat(x, starts) / counts, np.add.reduceat(y, starts) / counts
    w, h = SPARK_SIZE
    low, high = float(np.min(y)), float(np.max(y))
    px = 1 + x / max(n - 1, 1) * (w - 2)
    py = h / 2 + 0 * y if high <= low else (h - 2) - (y - low) / (high - low) * (h - 4)
    points = " ".join(f"{a:.1f},{b:.1f}" for a, b in zip(px, py))
    return (
        f'<svg width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img"><title>{_e(title)}</title>'
        f'<polyline fill="none" stroke="#335" stroke-width="1" points="{points}"/></svg>'
    )


def latest_status(history: History) -> dict[int, tuple[str, str]]:
    """cell id → (status, error) on the latest read night, for the cells that ran it."""
    names = history.night_names
    status = history.status
    if not names or not len(status):
        return {}
    tonight = status[status["night"] == names[-1]]
    return {int(c): (str(s), str(e or "")) for c, s, e in zip(tonight["cell_id"], tonight["status"], tonight["error"])}


def cells_section(history: History, labels: dict[int, str], colors: dict[int, str]) -> list[str]:
    """The index of cells: colour, label, nights run, status tonight and the headline sparklines."""
    n = len(history.night_names)
    points = history.points
    wanted = {m for _, ms in HEADLINE for m in ms}
    headline = points[points["metric"].isin(wanted)].sort_values(["cell_id", "metric", "night_index"])
    series = {
        (int(c), str(m)): (sub["night_index"].to_numpy(float), sub["value"].to_numpy(float))
        for (c, m), sub in headline.groupby(["cell_id", "metric"], sort=False)
    }
    shown = [(head, ms) for head, ms in HEADLINE if any((c, m) in series for c in labels for m in ms)]
    status = latest_status(history)
    rows = []
    for r in history.cells.to_dict("records"):
        c = int(r["cell_id"])
        state, error = status.get(c, ("not run", ""))
        tds = [
            f'<td><span class="sw" style="background:{colors.get(c, "#333")}"></span>{_e(r["cell"])}</td>',
            f'<td class="num">{_e(r["nights"])}</td>',
            f'<td title="{_e(error)}">{_e(state)}</td>',
        ]
        for _, ms in shown:
            m = next((m for m in ms if (c, m) in series), None)
            if m is None:
                tds.append("<td></td>")
                continue
            x, y = series[(c, m)]
            title = f"{m}: {number(y[0])} → {number(y[-1])} (range {number(y.min())} – {number(y.max())})"
            tds.append(
                f'<td class="spark">{sparkline(x, y, n, title)}<small>{_e(m)} {number(float(y[-1]))}</small></td>'
            )
        rows.append(f"<tr>{''.join(tds)}</tr>")
    widths = [("cell", 26), ("nights", 6), ("tonight", 9)]
    each = (100 - sum(w for _, w in widths)) // max(len(shown), 1)
    columns = widths + [(head, each) for head, _ in shown]
    return [
        '<section id="cells">',
        "<h2>Cells</h2>",
        '<p class="meta">Each cell\'s colour on the graphs, the nights it ran, its status tonight, and its '
        "headline metrics over the nights (each sparkline on its own scale; its last value beside it).</p>",
        f"<table>{colgroup(columns)}<tbody>{''.join(rows)}</tbody></table>",
        "</section>",
    ]


def nights_section(history: History) -> list[str]:
    """Every night found, read or skipped: its commit, kvbench version, runs read and why skipped."""
    rows = [
        f'<tr id="night-{_e(n.name)}" class="{"skipped" if n.skipped else "read"}"><td>{_e(n.name)}</td>'
        f'<td>{_e(n.commit)}</td><td>{_e(n.version or "—")}</td><td class="num">{n.runs}</td>'
        f"<td>{_e(n.skipped or '')}</td></tr>"
        for n in history.nights.nights
    ]
    columns = [("night", 24), ("commit", 12), ("kvbench", 10), ("runs read", 8), ("skipped", 46)]
    return [
        '<section id="nights">',
        "<h2>Nights</h2>",
        f"<table>{colgroup(columns)}<tbody>{''.join(rows)}</tbody></table>",
        "</section>",
    ]


def render(history: History, detection: Detection) -> dict[str, bytes]:
    """The page's files by name: ``index.html`` and ``<metric>.png`` for each metric with a point.
    Pure: draws in memory and writes nothing."""
    labels = {int(c): str(label) for c, label in zip(history.cells["cell_id"], history.cells["cell"])}
    colors = palette(list(labels))
    graphs = draw_all(history, detection, labels, colors)
    parts = [
        *header_section(history, detection),
        *gate_section(history, detection),
        *changes_section(history, detection),
        *notes_section(history),
        *graphs_section(graphs, history, labels, colors),
        *cells_section(history, labels, colors),
        *nights_section(history),
    ]
    page = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>kvbench history</title><style>{STYLE}</style></head>\n<body>\n"
        + "\n".join(parts)
        + "\n</body></html>\n"
    )
    files = {f"{g.metric}.png": g.png for g in graphs}
    files["index.html"] = page.encode("utf-8")
    return files
