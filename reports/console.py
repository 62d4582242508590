"""What ``kvbench run`` prints: the per-cell summary table and, for a suite with published
numbers, the published-vs-reproduced table; renderers over run rows."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

from ..harness.capabilities import is_contiguous
from .records import code_note

if TYPE_CHECKING:
    import pandas as pd

COLUMNS: tuple[tuple[str, str], ...] = (
    ("runner", "runner"),
    ("policy", "policy"),
    ("block_size", "block"),
    ("token_states_frac", "states%"),
    ("reservation_frac", "reserv%"),
    ("internal_frag_frac", "intern%"),
    ("external_frag_frac", "extern%"),
    ("peak_running", "peak_run"),
    ("mean_running", "mean_run"),
    ("preemptions", "preempt"),
    ("steps", "steps"),
    ("status", "status"),
)


def _cell(key: str, value: Any, row: Mapping[str, Any]) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    if key.endswith("_frac"):
        return f"{100 * value:.1f}"
    if key == "mean_running":
        return f"{value:.1f}"
    if key == "block_size" and is_contiguous(str(row.get("policy", ""))):
        return "-"  # one reservation per request: no block size
    return str(value)


def render_rows(rows: Sequence[Mapping[str, Any]]) -> str:
    """Rows grouped by workload, precision and budget, one aligned table each; a note when they
    come from more than one version of kvbench's code."""
    groups: dict[tuple, list[Mapping[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r.get("model"), r.get("workload_id"), r.get("kv_dtype"), r.get("budget_bytes")), []).append(r)
    out: list[str] = []
    for (model, wid, dtype, budget), members in groups.items():
        out.append(f"model {model}  workload {wid}  kv {dtype}  budget {budget:,} B "
                   f"({members[0].get('budget_positions', 0):,} positions)")
        table = [[label for _, label in COLUMNS]]
        for r in members:
            table.append([_cell(k, r.get(k), r) for k, _ in COLUMNS])
        widths = [max(len(row[i]) for row in table) for i in range(len(COLUMNS))]
        for row in table:
            out.append("  " + "  ".join(v.rjust(w) if i >= 2 else v.ljust(w) for i, (v, w) in enumerate(zip(row, widths))))
        for r in members:
            if r.get("status") != "ok" and r.get("error"):
                out.append(f"  ! {r.get('runner')}/{r.get('policy')}: {r.get('error')}")
        out.append("")
    code = code_note(r.get("code_digest") for r in rows)
    if code:  # e.g. cells kept by --keep-stale beside fresh ones
        out += [f"note: {code}", ""]
    return "\n".join(out)


def render_reference(table: "pd.DataFrame") -> str:
    """``tables.published_vs_reproduced`` as aligned text: each published number beside the
    reproduced one, their relative difference, and whether a clock was fitted to it."""
    if table.empty:
        return ""
    out = ["published vs reproduced (fitted: a clock was fitted to the number; predicted: it was not)"]
    rows = [["item", "published", "reproduced", "diff", "basis", "runner"]]
    for r in table.to_dict("records"):
        rep = r.get("reproduced")
        have = isinstance(rep, (int, float)) and rep == rep
        diff = f"{rep / r['published'] - 1:+.1%}" if have and r["published"] else "-"
        rows.append([str(r["item"]), f"{r['published']:g}", f"{rep:.3g}" if have else f"- ({r.get('problem')})",
                     diff, str(r.get("basis") or "predicted"), str(r.get("runner") or "-")])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        out.append("  " + "  ".join(v.ljust(w) if i in (0, 4, 5) else v.rjust(w)
                                    for i, (v, w) in enumerate(zip(row, widths))))
    return "\n".join(out) + "\n"
