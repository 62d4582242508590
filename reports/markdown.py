"""``summary.md``: the report as GitHub-flavoured Markdown, ready to paste into a CI job summary.

A thin renderer over ``reports.tables.ReportTables``; figures are listed by
file name (a job summary cannot show local images) with why any was not drawn.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from ..harness.records.schema import OK
from . import cpu_tier, display, layout
from .contents import ReportTables
from .display import Column
from .figures import Plot
from .findings import FINDINGS_NOTE, NO_FINDINGS, Finding, findings
from .labels import group_titles


def table(columns: Sequence[Column], frame: pd.DataFrame) -> list[str]:
    head = "| " + " | ".join(h for _, h, _ in columns) + " |"
    align = "|" + "|".join("---" if kind in display.TEXT_KINDS else "---:" for _, _, kind in columns) + "|"
    body = ["| " + " | ".join(v.replace("|", "\\|") for v in row) + " |" for row in display.rows(columns, frame)]
    return [head, align, *body]


def warning(text: str) -> list[str]:
    # GitHub renders [!CAUTION] in red; elsewhere it still reads as a flagged quote.
    return ["> [!CAUTION]", f"> **Warning:** {text}", ""]


def provenance(runs: pd.DataFrame) -> str:
    def values(col: str, short: int | None = None) -> str:
        vals = sorted({str(v)[:short] if short else str(v) for v in runs[col].dropna()}) if col in runs else []
        return ", ".join(vals) or "?"

    dirty = (
        " (uncommitted changes)" if "git_dirty" in runs and runs["git_dirty"].fillna(False).astype(bool).any() else ""
    )
    # The code digest only where recorded: rows from before it was say nothing new by "?".
    code = f" · code {values('code_digest')}" if "code_digest" in runs and runs["code_digest"].notna().any() else ""
    return (
        f"git {values('git_sha', 10)}{dirty} · kvbench {values('kvbench_version')}{code} · "
        f"host {values('host')} · python {values('python_version')}"
    )


def laid_out(
    columns: Sequence[Column],
    frame: pd.DataFrame,
    keys: Sequence[str] = (),
    sets: Sequence[display.ColumnSet] = (),
    split: bool = False,
    once: Sequence[str] = (),
) -> list[str]:
    """A section's table as ``layout.layout`` fits it to the page (the same parts as index.html)."""
    lay = layout.layout(columns, frame, keys, sets, split, once)
    out = [layout.fixed_text(lay.fixed), ""] if lay.fixed else []
    for part in lay.parts:
        out += ([f"*{part.title}*", ""] if part.title else []) + table(part.columns, frame) + [""]
    return out


def findings_section(found: Sequence[Finding]) -> list[str]:
    items = [f"- **Group {f.group + 1} · {f.title}.** {' '.join(f.sentences)}" for f in found]
    return ["## Findings", "", FINDINGS_NOTE, "", *(items or [NO_FINDINGS]), ""]


def figures_section(plots: Sequence[Plot]) -> list[str]:
    if not plots:
        return []
    out = ["## Figures", "", "In `report/` next to this file (open `index.html`):", ""]
    out += [
        f"- `{p.stem}.png` — {p.title}" if p.figure is not None else f"- {p.title}: not drawn — {p.note}" for p in plots
    ]
    return [*out, ""]


def cpu_tier_section(section: cpu_tier.CpuTier, titles: dict[int, str]) -> list[str]:
    """Per comparison group with a CPU tier: its sentences (the answer), then its table."""
    out = [f"## {cpu_tier.TITLE}", "", cpu_tier.NOTE, ""]
    for g, sentences, sub in cpu_tier.groups(section):
        out += [f"### Group {g + 1}: {titles[g]}", ""]
        out += [" ".join(sentences), ""] if sentences else []
        out += laid_out(cpu_tier.columns(sub), sub, cpu_tier.KEYS, cpu_tier.SETS)
    return out


def render(runs: pd.DataFrame, tables: ReportTables, plots: Sequence[Plot] = ()) -> str:
    """summary.md, led as index.html is: title, warnings, findings, figures, then the tables."""
    cells = tables.cells
    runners = set(runs["runner"])
    suites = ", ".join(sorted({str(s) for s in runs["suite"].dropna()})) or "?"
    n_groups = cells["group"].nunique() if len(cells) else 0
    out = [
        f"# kvbench report: {suites}",
        "",
        f"{len(runs)} run(s) of {len(cells)} cell(s) in {n_groups} comparison group(s); "
        f"runners: {', '.join(sorted(runners))}. {provenance(runs)}.",
        "",
    ]
    for w in tables.warnings:
        out += warning(w)
    out += findings_section(findings(tables))
    out += figures_section(plots)
    base = tables.baseline
    out += [
        display.GROUPS_NOTE
        + " "
        + (f"Ratios (×) are to **{base}** of the same runner in the same group." if base else display.NO_BASELINE),
        "",
    ]
    titles = group_titles(cells)
    for g, sub in cells.groupby("group", sort=True):
        out += [f"## Group {g + 1}: {titles[int(g)]}", "", str(sub["group_label"].iloc[0]), ""]
        columns = display.cell_columns(sub, runners)
        out += laid_out(columns, sub, display.CELL_TABLE_KEYS, display.cell_sets(columns), True)
        errors = [f"- {display.failure(r)}" for r in sub.to_dict("records") if r["status"] != OK and r["error"]]
        out += errors + [""] if errors else []
    if len(tables.geomean) and n_groups > 1:
        out += [f"## Across all {n_groups} groups: geometric mean of the ratios to {base}", ""]
        out += laid_out(
            display.visible(display.GEOMEAN_COLUMNS, tables.geomean, runners), tables.geomean, display.GEOMEAN_KEYS
        )
        out += [
            "The geometric mean, not the arithmetic mean: 2× in one group and 0.5× in another average to 1×. "
            "`groups` counts the groups where the ratio exists.",
            "",
        ]
    decomp = tables.decomposition
    if len(decomp):
        out += ["## Decomposition: naive = allocation × runtime", "", display.DECOMP_NOTE, ""]
        out += [tables.decomposition_gap, ""]
        out += laid_out(
            display.decomp_columns(decomp, runners),
            decomp,
            display.DECOMP_KEYS,
            display.DECOMP_SETS,
            once=display.DECOMP_ONCE,
        )
    if len(tables.prediction):
        out += ["## Predicted vs measured", "", display.PREDICTION_NOTE, ""]
        out += laid_out(display.PREDICTION_COLUMNS, tables.prediction, display.PREDICTION_KEYS, display.PREDICTION_SETS)
        if tables.drift is not None:
            out += [display.DRIFT_NOTE, ""]
            out += laid_out(display.DRIFT_ROUND_COLUMNS, tables.drift.rounds)
            out += laid_out(display.DRIFT_WORKLOAD_COLUMNS, tables.drift.workloads)
    if tables.reference is not None:
        out += ["## Published vs reproduced", ""]
        out += laid_out(display.REFERENCE_COLUMNS, tables.reference, display.REFERENCE_KEYS)
    if len(tables.capacity):
        out += ["## Capacity at the SLO", "", display.capacity_note(tables.capacity), ""]
        for frame, spec in (
            (tables.capacity, display.CAPACITY_COLUMNS),
            (tables.capacity_ratios, display.CAPACITY_RATIO_COLUMNS),
            (tables.capacity_published, display.CAPACITY_PUBLISHED_COLUMNS),
        ):
            if len(frame):
                out += laid_out(display.with_setup(spec, frame), frame, display.CAPACITY_KEYS)
        if len(tables.goodput):
            out += ["### Goodput per run", "", display.GOODPUT_NOTE, ""]
            out += laid_out(display.GOODPUT_COLUMNS, tables.goodput, display.CAPACITY_KEYS)
    if len(tables.prefix_reuse):
        out += ["## Prefix reuse against KV budget", "", display.PREFIX_REUSE_NOTE, ""]
        out += laid_out(
            display.PREFIX_REUSE_COLUMNS, tables.prefix_reuse, display.PREFIX_REUSE_KEYS, display.PREFIX_REUSE_SETS
        )
    if len(tables.cpu_tier):
        out += cpu_tier_section(tables.cpu_tier, titles)
    if len(tables.hybrid):
        out += ["## Hybrid KV cache manager", "", display.HYBRID_NOTE, ""]
        out += laid_out(display.HYBRID_COLUMNS, tables.hybrid, display.HYBRID_KEYS, display.HYBRID_SETS)
    if len(tables.serve_check):
        out += ["## Server: steps against /metrics", "", display.SERVE_CHECK_NOTE, ""]
        out += laid_out(
            display.visible(display.SERVE_CHECK_COLUMNS, tables.serve_check, runners),
            tables.serve_check,
            display.SERVE_CHECK_KEYS,
            display.SERVE_CHECK_SETS,
        )
        out += [*(f"- **{name}**: {text}" for name, text in display.SERVE_CHECK_DEFINITIONS), ""]
    if len(tables.clocks):
        out += ["## Clocks", "", display.CLOCKS_NOTE, ""]
        out += laid_out(display.CLOCK_COLUMNS, tables.clocks, display.CLOCK_KEYS)
    out += ["<details><summary>Column definitions</summary>", ""]
    out += [f"- **{name}**: {text}" for name, text in display.GLOSSARY]
    out += ["", "</details>", ""]
    return "\n".join(out)
