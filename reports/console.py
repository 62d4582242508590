"""What ``kvbench run`` prints: the per-cell summary table and, for a suite with published
numbers, the published-vs-reproduced table, goodput and capacity under its SLO (``summary``);
renderers over run rows."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..harness.records.schema import OK
from ..harness.spec.capabilities import is_contiguous
from ..harness.spec.units import format_bytes
from .labels import code_note, cpu_tier_key, workload_tag

if TYPE_CHECKING:
    import pandas as pd

    from ..harness.records.slo import Slo

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
    if key == "hybrid_kv":
        return "on" if value else "off"
    if key == "cpu_offload_bytes":
        return format_bytes(value) if value else "-"
    if key == "block_size" and is_contiguous(str(row.get("policy", ""))) and value == 1:
        return "-"  # one reservation per request, in positions: no block size
    return str(value)


def _columns(members: Sequence[Mapping[str, Any]]) -> tuple[tuple[str, str], ...]:
    """COLUMNS, with the hybrid KV cache manager's setting and the CPU tier (its size and eviction
    policy) after the block size where they vary (otherwise two cells would print as the same row)."""
    extra: list[tuple[str, str]] = []
    if len({r.get("hybrid_kv") for r in members if r.get("hybrid_kv") is not None}) >= 2:
        extra.append(("hybrid_kv", "hybrid"))
    tiers = {(cpu_tier_key(r, "cpu_offload_bytes"), cpu_tier_key(r, "offload_policy")) for r in members}
    if len(tiers) >= 2:
        extra += [("cpu_offload_bytes", "cpu_tier"), ("offload_policy", "evict")]
    return (*COLUMNS[:3], *extra, *COLUMNS[3:]) if extra else COLUMNS


def render_rows(rows: Sequence[Mapping[str, Any]]) -> str:
    """Rows grouped by workload, precision and budget, one aligned table each; a note when they
    come from more than one version of kvbench's code."""
    groups: dict[tuple, list[Mapping[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r.get("model"), r.get("workload_id"), r.get("kv_dtype"), r.get("budget_bytes")), []).append(
            r
        )
    out: list[str] = []
    for (model, _wid, dtype, budget), members in groups.items():
        out.append(
            f"model {model}  workload {workload_tag(members[0])}  kv {dtype}  budget {budget:,} B "
            f"({members[0].get('budget_positions', 0):,} positions)"
        )
        columns = _columns(members)
        table = [[label for _, label in columns]]
        for r in members:
            table.append([_cell(k, r.get(k), r) for k, _ in columns])
        widths = [max(len(row[i]) for row in table) for i in range(len(columns))]
        for row in table:
            out.append(
                "  " + "  ".join(v.rjust(w) if i >= 2 else v.ljust(w) for i, (v, w) in enumerate(zip(row, widths)))
            )
        for r in members:
            if r.get("status") != OK and r.get("error"):
                out.append(f"  ! {r.get('runner')}/{r.get('policy')}: {r.get('error')}")
        out.append("")
    code = code_note(r.get("code_digest") for r in rows)
    if code:  # e.g. cells kept by --keep-stale beside fresh ones
        out += [f"note: {code}", ""]
    return "\n".join(out)


def render_reference(table: pd.DataFrame) -> str:
    """``tables.published_vs_reproduced`` as aligned text: each published number beside the
    reproduced one, their relative difference, and whether a clock was fitted to it."""
    if table.empty:
        return ""
    out = [
        "published vs reproduced (fitted: a clock was fitted to the number; predicted: it was not; "
        "diff: relative, or in points for shares)"
    ]
    rows = [["item", "published", "reproduced", "diff", "basis", "runner"]]
    for r in table.to_dict("records"):
        rep = r.get("reproduced")
        have = isinstance(rep, (int, float)) and rep == rep
        if have and str(r.get("metric", "")).endswith("_frac"):
            diff = f"{100 * (rep - r['published']):+.1f} pt"  # shares of the budget: off by points
        else:
            diff = f"{rep / r['published'] - 1:+.1%}" if have and r["published"] else "-"
        rows.append(
            [
                str(r["item"]),
                f"{r['published']:g}",
                f"{rep:.3g}" if have else f"- ({r.get('problem')})",
                diff,
                str(r.get("basis") or "predicted"),
                str(r.get("runner") or "-"),
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        out.append(
            "  " + "  ".join(v.ljust(w) if i in (0, 4, 5) else v.rjust(w) for i, (v, w) in enumerate(zip(row, widths)))
        )
    return "\n".join(out) + "\n"


def render_goodput(runs: pd.DataFrame) -> str:
    """Each ok run's goodput under its suite's SLO: requests within every bound per second of the
    run's clock, and their share; one line per run, by policy line and rate."""
    if runs.empty or "goodput_rps" not in runs or runs["goodput_rps"].isna().all():
        return ""
    ok = runs[(runs["status"] == OK) & runs["goodput_rps"].notna()]
    ok = ok.assign(_workload=ok["workload_name"].fillna("") if "workload_name" in ok else "")
    ok = ok.assign(setup=[_setup(r) for r in ok.to_dict("records")])
    model = _varies(ok)
    rows = [[*model * ["model"], "workload", "runner", "policy", "block", "rate", "goodput", "requests within the SLO"]]
    for r in ok.sort_values(["setup", "_workload", "runner", "policy", "block_size", "rate"]).to_dict("records"):
        block = "-" if is_contiguous(str(r["policy"])) and r["block_size"] == 1 else str(r["block_size"])
        rows.append(
            [
                *model * [str(r["setup"])],
                str(r["_workload"]) or "-",
                str(r["runner"]),
                str(r["policy"]),
                block,
                _rate(r["rate"]),
                f"{r['goodput_rps']:.3g}",
                f"{100 * r['slo_met_frac']:.1f}%",
            ]
        )
    out = [
        "goodput per run (req/s within every bound of the SLO, on the run's clock)",
        *_aligned(rows, right={i + model for i in (3, 4, 5, 6)}),
    ]
    return "\n".join(out) + "\n"


def _setup(row: dict) -> str:
    """A run row's model with its tensor / pipeline parallel size above 1 (``opt-66b TP 4``)."""
    label = str(row.get("model"))
    for key, short in (("tensor_parallel_size", "TP"), ("pipeline_parallel_size", "PP")):
        size = row.get(key)
        if isinstance(size, (int, float)) and size == size and size > 1:
            label += f" {short} {int(size)}"
    return label


def _rate(x: object) -> str:
    return "-" if not isinstance(x, (int, float)) or x != x else f"{x:g}"


def render_capacity(table: pd.DataFrame, ratios: pd.DataFrame, published: pd.DataFrame) -> str:
    """Capacity at the SLO per policy line, the capacity ratios, and the published ratios beside them."""
    if table.empty:
        return "capacity at the SLO: no policy was run at two or more request rates\n"
    out = []
    for slo, part in table.groupby("slo", sort=False):
        out.append(
            f"capacity at the SLO ({slo}): the highest request rate within every bound (req/s); the next "
            "rate tried was over one; binding: the bound the next rate fails by the most (all within: the "
            "one with the least slack)"
        )
        model = _varies(part)
        rows = [
            [*model * ["model"], "workload", "runner", "policy", "block", "capacity", "next", "rates", "binding"]
            + ["goodput", "status"]
        ]
        for r in part.to_dict("records"):
            block = "-" if is_contiguous(str(r["policy"])) and r["block_size"] == 1 else str(r["block_size"])
            rows.append(
                [
                    *model * [str(r.get("setup"))],
                    str(r["family_label"])[:48],
                    str(r["runner"]),
                    str(r["policy"]),
                    block,
                    _rate(r["capacity_rps"]),
                    _rate(r["next_rps"]),
                    str(r["rates"]),
                    str(r["binding"]),
                    _rate(round(r["goodput_at_capacity_rps"], 3)),
                    str(r["status"]),
                ]
            )
        out += _aligned(rows, right={i + model for i in (3, 4, 5, 6, 8)})
    if len(ratios):
        out.append("capacity ratios (= both within their sweeps; ≥ / ≤ one capacity is only a bound)")
        model = _varies(ratios)
        rows = [[*model * ["model"], "workload", "runner", "ratio", "value"]]
        for r in ratios.to_dict("records"):
            value = (
                "- (both capacities only bounds)"
                if r["kind"] == "?" or r["ratio"] != r["ratio"]
                else f"{r['kind'] if r['kind'] != '=' else ''}{r['ratio']:.2f}x"
            )
            rows.append(
                [
                    *model * [str(r.get("setup"))],
                    str(r["family_label"])[:48],
                    str(r["runner"]),
                    f"{r['policy']} ÷ {r['baseline']}",
                    value,
                ]
            )
        out += _aligned(rows, right={3 + model})
    if len(published):
        out.append("published vs reproduced capacity ratios (a range: the paper's, over its models)")
        model = _varies(published)
        rows = [["item", *model * ["model"], "published", "reproduced", "off", "basis"]]
        for r in published.to_dict("records"):
            pub = f"{r['published']:g}" + (
                f"–{r['published_max']:g}" if r["published_max"] == r["published_max"] else ""
            )
            rep = "-" if r["reproduced"] != r["reproduced"] else f"{r['reproduced']:.2f}"
            off = "-" if r["off"] != r["off"] else ("inside" if r["off"] == 0 else f"{r['off']:+.1%}")
            rows.append([str(r["item"]), *model * [str(r.get("setup"))], pub, rep, off, str(r["basis"])])
        out += _aligned(rows, right={i + model for i in (1, 2, 3)})
    return "\n".join(out) + "\n"


def _varies(frame: pd.DataFrame) -> int:
    """1 when a capacity frame holds several models (or parallel sizes), else 0: a model column's width."""
    return int("setup" in frame.columns and frame["setup"].nunique(dropna=True) > 1)


def _aligned(rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  " + "  ".join(v.rjust(w) if i in right else v.ljust(w) for i, (v, w) in enumerate(zip(row, widths)))
        for row in rows
    ]


def summary(
    out: Path, suite: str, run_ids: Sequence[str], reference: bool, slo: Slo | None, log: Callable[[str], None]
) -> tuple[str, pd.DataFrame]:
    """What ``kvbench run`` prints after a sweep, read back from disk (what is printed is what was
    recorded): the cells' table, the published-vs-reproduced table when the suite has published
    numbers, goodput and capacity under its SLO; with the runs of ``run_ids`` in that order."""
    from ..harness.records import store
    from .labels import with_keys
    from .loading import read_reference
    from .suite_tables import capacity_report, suite_runs
    from .tables import published_vs_reproduced

    runs = store.read_table(out, "runs", set(run_ids))
    order = {rid: i for i, rid in enumerate(run_ids)}
    runs = runs.assign(_order=runs["run_id"].map(order)).sort_values("_order")
    text = render_rows(runs.to_dict("records")) + "\n"
    if reference:
        published, problem = read_reference(out / "reference.parquet")
        if published is not None:
            published = published[published["suite"] == suite]
            text += render_reference(published_vs_reproduced(published, with_keys(runs))) + "\n"
        elif problem:
            log(f"published values not shown: {problem}")
    if slo is not None:
        text += render_goodput(suite_runs(out, suite, slo))
        text += render_capacity(*capacity_report(out, suite, slo)) + "\n"
    return text, runs
