"""``write_report(out)``: ``out/report/index.html`` (one self-contained page: figures are
embedded as data URIs, so it opens from disk or as a CI artifact), ``summary.md`` and the
figures as PNG files beside them."""

from __future__ import annotations

import base64
import html
import io
import re
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from ..harness.records.schema import OK
from . import cpu_tier, display, layout, markdown
from .contents import ReportTables, report_tables
from .display import Column
from .figures import Plot, all_plots
from .findings import FINDINGS_NOTE, NO_FINDINGS, Finding, findings
from .labels import group_titles
from .loading import load
from .report_files import write_folder

FIGURE_DPI = 110
RATIO = re.compile(r"\d[\d,.]*×")  # a ratio in a finding, set in bold so the eye finds the answers
# Any other kind is a number.
CELL_CLASS = {"text": "text", "onoff": "text", "id": "text", "workload": "text", "note": "note"}

STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1400px; padding: 0 1em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; }
th, td { border: 1px solid #ccc; padding: 3px 7px; } th { background: #f3f3f3; }
td { white-space: nowrap; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.note { white-space: normal; min-width: 16em; } td.long { white-space: normal; min-width: 12em; }
caption { text-align: left; font-weight: 600; padding: 0.3em 0; }
.finding { margin: 0.45em 0; line-height: 1.4; } .fixed { color: #444; font-size: 0.9em; margin: 0.3em 0; }
.warning { color: #b00020; background: #fdecee; border: 2px solid #b00020; padding: 0.5em 0.8em; font-weight: 600; }
.skipped { color: #555; background: #f5f5f5; border: 1px dashed #aaa; padding: 0.5em 0.8em; }
.error { color: #b00020; font-size: 0.85em; }
figure { margin: 1.2em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: 0.9em; color: #444; max-width: 1100px; }
.meta { color: #555; font-size: 0.9em; }
"""
# Lets a headless browser (and a reader's devtools) confirm every figure loaded, where the findings
# begin, and that nothing is wider than the window: the facts land on <body data-…> for --dump-dom.
SCRIPT = """
window.addEventListener("load", function () {
  var body = document.body, data = body.dataset;
  var imgs = Array.prototype.slice.call(document.images);
  var ok = imgs.every(function (i) { return i.complete && i.naturalWidth > 0; });
  data.imagesLoaded = ok ? "true" : "false";
  data.imageCount = String(imgs.length);
  var findings = document.getElementById("findings");
  data.findingsTop = findings ? String(Math.round(findings.getBoundingClientRect().top + window.scrollY)) : "none";
  var right = body.getBoundingClientRect().right - parseFloat(getComputedStyle(body).paddingRight);
  var widest = 0, over = 0;
  Array.prototype.forEach.call(document.querySelectorAll("table"), function (t) {
    var box = t.getBoundingClientRect();
    widest = Math.max(widest, Math.ceil(box.width));
    if (box.right > right + 0.5) { over += 1; }
  });
  data.widestTable = String(widest);
  data.tablesOverflowing = String(over);
  var left = body.getBoundingClientRect().left + parseFloat(getComputedStyle(body).paddingLeft);
  data.contentWidth = String(Math.floor(right - left));
  data.scrollWidth = String(document.documentElement.scrollWidth);
  data.viewportWidth = String(window.innerWidth);
});
"""


def _e(text: object) -> str:
    return html.escape(str(text))


def table(columns: Sequence[Column], frame: pd.DataFrame, caption: str = "") -> str:
    head = "".join(f"<th>{_e(h)}</th>" for _, h, _ in columns)
    body = []
    for row in display.rows(columns, frame):
        tds = "".join(
            f'<td class="{CELL_CLASS.get(kind, "num")}{" long" if layout.is_long(kind, v) else ""}">{_e(v)}</td>'
            for v, (_, _, kind) in zip(row, columns)
        )
        body.append(f"<tr>{tds}</tr>")
    cap = f"<caption>{_e(caption)}</caption>" if caption else ""
    return f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def laid_out(
    columns: Sequence[Column],
    frame: pd.DataFrame,
    keys: Sequence[str] = (),
    sets: Sequence[display.ColumnSet] = (),
    split: bool = False,
    once: Sequence[str] = (),
) -> list[str]:
    """A section's table as ``layout.layout`` fits it to the page: what every row shares, then its parts."""
    lay = layout.layout(columns, frame, keys, sets, split, once)
    fixed = [f'<p class="fixed">{_e(layout.fixed_text(lay.fixed))}</p>'] if lay.fixed else []
    return fixed + [table(p.columns, frame, p.title) for p in lay.parts]


def png_bytes(plot: Plot) -> bytes:
    buf = io.BytesIO()
    assert plot.figure is not None
    plot.figure.savefig(buf, format="png", dpi=FIGURE_DPI)
    return buf.getvalue()


def bold_ratios(text: str) -> str:
    """``text`` escaped, its ratios in bold."""
    return RATIO.sub(lambda m: f"<strong>{m.group(0)}</strong>", _e(text))


def findings_section(found: Sequence[Finding]) -> list[str]:
    """The report's first section: each group's sentences under its title, linked to its tables."""
    items = [
        f'<p class="finding"><b><a href="#group-{f.group + 1}">Group {f.group + 1}</a> · {_e(f.title)}.</b> '
        f"{bold_ratios(' '.join(f.sentences))}</p>"
        for f in found
    ] or [f"<p>{_e(NO_FINDINGS)}</p>"]
    return [
        '<section id="findings">',
        "<h2>Findings</h2>",
        f'<p class="meta">{_e(FINDINGS_NOTE)}</p>',
        *items,
        "</section>",
    ]


def figures_section(plots: Sequence[Plot], pngs: dict[str, bytes]) -> list[str]:
    parts = ['<section id="figures">', "<h2>Figures</h2>"]
    for i, p in enumerate(plots, 1):
        if p.stem in pngs:
            data = base64.b64encode(pngs[p.stem]).decode("ascii")
            parts.append(
                f'<figure id="{_e(p.stem)}"><img src="data:image/png;base64,{data}" alt="{_e(p.title)}">'
                f"<figcaption><b>Figure {i}. {_e(p.title)}.</b> {_e(p.note)} "
                f'(<a href="{_e(p.stem)}.png">{_e(p.stem)}.png</a>)</figcaption></figure>'
            )
        else:
            parts.append(
                f'<p class="skipped" id="{_e(p.stem)}">Figure {i}. {_e(p.title)}: not drawn — {_e(p.note)}.</p>'
            )
    return [*parts, "</section>"]


def cpu_tier_section(section: cpu_tier.CpuTier, titles: dict[int, str]) -> list[str]:
    """Per comparison group with a CPU tier: its sentences (the answer), then its table."""
    parts = [f'<h2 id="cpu-tier">{_e(cpu_tier.TITLE)}</h2>', f"<p>{_e(cpu_tier.NOTE)}</p>"]
    for g, sentences, sub in cpu_tier.groups(section):
        parts.append(f'<h3><a href="#group-{g + 1}">Group {g + 1}</a>: {_e(titles[g])}</h3>')
        parts += [f'<p class="finding">{_e(" ".join(sentences))}</p>'] if sentences else []
        parts += laid_out(cpu_tier.columns(sub), sub, cpu_tier.KEYS, cpu_tier.SETS)
    return parts


def render(runs: pd.DataFrame, tables: ReportTables, plots: Sequence[Plot], pngs: dict[str, bytes]) -> str:
    """The page: title, warnings, findings, figures, then the tables (layout.layout fits each to the page)."""
    cells, runners = tables.cells, set(runs["runner"])
    suites = ", ".join(sorted({str(s) for s in runs["suite"].dropna()})) or "?"
    parts = [
        f"<h1>kvbench report: {_e(suites)}</h1>",
        f'<p class="meta">{len(runs)} run(s) of {len(cells)} cell(s) in '
        f"{cells['group'].nunique() if len(cells) else 0} "
        f"comparison group(s); runners: {_e(', '.join(sorted(runners)))}. {_e(markdown.provenance(runs))}.</p>",
    ]
    parts += [f'<p class="warning">⚠ Warning: {_e(w)}</p>' for w in tables.warnings]
    parts += findings_section(findings(tables))
    parts += figures_section(plots, pngs)
    base = tables.baseline
    parts.append(
        f"<p>{_e(display.GROUPS_NOTE)} "
        + (
            f"Ratios (×) are to <b>{_e(base)}</b> of the same runner in the same group."
            if base
            else _e(display.NO_BASELINE)
        )
        + "</p>"
    )
    titles = group_titles(cells)
    for g, sub in cells.groupby("group", sort=True):
        parts.append(f'<h2 id="group-{g + 1}">Group {g + 1}: {_e(titles[int(g)])}</h2>')
        parts.append(f'<p class="meta">{_e(sub["group_label"].iloc[0])}</p>')
        columns = display.cell_columns(sub, runners)
        parts += laid_out(columns, sub, display.CELL_TABLE_KEYS, display.cell_sets(columns), True)
        parts += [
            f'<p class="error">{_e(display.failure(r))}</p>'
            for r in sub.to_dict("records")
            if r["status"] != OK and r["error"]
        ]
    if len(tables.geomean) and cells["group"].nunique() > 1:
        parts.append(f"<h2>Across all groups: geometric mean of the ratios to {_e(base)}</h2>")
        parts += laid_out(
            display.visible(display.GEOMEAN_COLUMNS, tables.geomean, runners), tables.geomean, display.GEOMEAN_KEYS
        )
        parts.append(
            "<p>The geometric mean, not the arithmetic mean: 2× in one group and 0.5× in another average "
            "to 1×. <i>groups</i> counts the groups where the ratio exists.</p>"
        )
    if len(tables.decomposition):
        d = tables.decomposition
        parts.append("<h2>Decomposition: naive = allocation × runtime</h2>")
        parts.append(f"<p>{_e(display.DECOMP_NOTE)}</p>")
        parts.append(f"<p>{_e(tables.decomposition_gap)}</p>")
        parts += laid_out(
            display.decomp_columns(d, runners), d, display.DECOMP_KEYS, display.DECOMP_SETS, once=display.DECOMP_ONCE
        )
    if len(tables.prediction):
        parts.append("<h2>Predicted vs measured</h2>")
        parts.append(f"<p>{_e(display.PREDICTION_NOTE)}</p>")
        parts += laid_out(
            display.PREDICTION_COLUMNS, tables.prediction, display.PREDICTION_KEYS, display.PREDICTION_SETS
        )
        if tables.drift is not None:
            parts.append(f"<p>{_e(display.DRIFT_NOTE)}</p>")
            parts += laid_out(display.DRIFT_ROUND_COLUMNS, tables.drift.rounds)
            parts += laid_out(display.DRIFT_WORKLOAD_COLUMNS, tables.drift.workloads)
    if tables.reference is not None:
        parts.append("<h2>Published vs reproduced</h2>")
        parts += laid_out(display.REFERENCE_COLUMNS, tables.reference, display.REFERENCE_KEYS)
    if len(tables.capacity):
        parts.append("<h2>Capacity at the SLO</h2>")
        parts.append(f"<p>{_e(display.capacity_note(tables.capacity))}</p>")
        for frame, spec in (
            (tables.capacity, display.CAPACITY_COLUMNS),
            (tables.capacity_ratios, display.CAPACITY_RATIO_COLUMNS),
            (tables.capacity_published, display.CAPACITY_PUBLISHED_COLUMNS),
        ):
            if len(frame):
                parts += laid_out(display.with_setup(spec, frame), frame, display.CAPACITY_KEYS)
        if len(tables.goodput):
            parts.append("<h3>Goodput per run</h3>")
            parts.append(f"<p>{_e(display.GOODPUT_NOTE)}</p>")
            parts += laid_out(display.GOODPUT_COLUMNS, tables.goodput, display.CAPACITY_KEYS)
    if len(tables.prefix_reuse):
        parts.append("<h2>Prefix reuse against KV budget</h2>")
        parts.append(f"<p>{_e(display.PREFIX_REUSE_NOTE)}</p>")
        parts += laid_out(
            display.PREFIX_REUSE_COLUMNS, tables.prefix_reuse, display.PREFIX_REUSE_KEYS, display.PREFIX_REUSE_SETS
        )
    if len(tables.cpu_tier):
        parts += cpu_tier_section(tables.cpu_tier, titles)
    if len(tables.hybrid):
        parts.append("<h2>Hybrid KV cache manager</h2>")
        parts.append(f"<p>{_e(display.HYBRID_NOTE)}</p>")
        parts += laid_out(display.HYBRID_COLUMNS, tables.hybrid, display.HYBRID_KEYS, display.HYBRID_SETS)
    if len(tables.serve_check):
        parts.append("<h2>Server: steps against /metrics</h2>")
        parts.append(f"<p>{_e(display.SERVE_CHECK_NOTE)}</p>")
        parts += laid_out(
            display.visible(display.SERVE_CHECK_COLUMNS, tables.serve_check, runners),
            tables.serve_check,
            display.SERVE_CHECK_KEYS,
            display.SERVE_CHECK_SETS,
        )
        parts.append(
            "<ul>" + "".join(f"<li><b>{_e(n)}</b>: {_e(t)}</li>" for n, t in display.SERVE_CHECK_DEFINITIONS) + "</ul>"
        )
    if len(tables.clocks):
        parts.append("<h2>Clocks</h2>")
        parts.append(f"<p>{_e(display.CLOCKS_NOTE)}</p>")
        parts += laid_out(display.CLOCK_COLUMNS, tables.clocks, display.CLOCK_KEYS)
    parts.append(
        "<h2>Column definitions</h2><ul>"
        + "".join(f"<li><b>{_e(n)}</b>: {_e(t)}</li>" for n, t in display.GLOSSARY)
        + "</ul>"
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>kvbench report: {_e(suites)}</title><style>{STYLE}</style><script>{SCRIPT}</script></head>"
        f"<body>\n" + "\n".join(parts) + "\n</body></html>\n"
    )


def write_report(out: Path) -> Path:
    """Write ``out/report/`` (index.html, summary.md, one PNG per drawn figure); return index.html's path.

    The report is drawn into a temporary folder beside it and swapped in whole, so a full
    disk or an interrupt leaves the previous report (or none), never a truncated figure or a
    page from one run beside figures from another. A refused write is a ``StorageError``
    naming the file."""
    out = Path(out)
    records = load(out)
    tables = report_tables(
        records.runs,
        records.reference,
        records.reference_problem,
        records.steps,
        records.slo,
        records.metrics,
        records.kv_groups,
        records.requests,
    )
    plots = all_plots(
        tables.cells,
        records.runs,
        records.steps,
        records.requests,
        tables.decomposition,
        records.slo,
        tables.cpu_tier.table,
    )
    pngs = {p.stem: png_bytes(p) for p in plots if p.figure is not None}
    files = {f"{name}.png": data for name, data in pngs.items()}
    files["summary.md"] = markdown.render(records.runs, tables, plots).encode("utf-8")
    files["index.html"] = render(records.runs, tables, plots, pngs).encode("utf-8")
    dest = out / "report"
    # A new folder under a random name (store.clean_stale_temps knows the prefix), swapped in whole.
    write_folder(dest, files, ".report.tmp-")
    return dest / "index.html"
