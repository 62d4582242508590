"""Published reference values from a suite's ``[[reference]]`` tables, stored as Parquet.

Reports read only Parquet, so ``kvbench run`` writes a suite's reference
values to ``DIR/reference.parquet``; the report puts each beside the value
reproduced from the records. A reference names a runs-table ``metric`` for a
``policy`` (and optionally a block size and a named workload), or a ratio of
that metric to the same metric under ``baseline_policy``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from ..errors import KvbenchError
from .schema import RUNS
from .store import replace_suite_rows

REFERENCE = pa.schema(
    [
        ("suite", pa.string()),
        ("item", pa.string()),
        ("workload", pa.string()),  # the suite's workload name ("default" for a single [workload])
        ("workload_id", pa.string()),
        ("policy", pa.string()),
        ("block_size", pa.int64()),
        ("metric", pa.string()),
        ("baseline_policy", pa.string()),  # set: the published value is metric(policy) / metric(baseline)
        ("published", pa.float64()),
        ("source", pa.string()),
        ("note", pa.string()),
        # "fitted": the number a clock was fitted to (it reproduces by construction); "predicted": not
        # used in any fit. Written since the roofline's fitted scale; older files lack the column.
        ("basis", pa.string()),
        # A range (a paper's "1.7–2.7×" over several models): published is its low end, this its high end.
        ("published_max", pa.float64()),
    ]
)
KEYS = {
    "item",
    "workload",
    "policy",
    "block_size",
    "metric",
    "baseline_policy",
    "published",
    "source",
    "note",
    "basis",
    "published_max",
}
# Metrics of a whole rate sweep rather than of one run: the report computes them
# (``reports.capacity``) and sets them beside the published value there.
SWEEP_METRICS: tuple[str, ...] = ("capacity_rps",)
BASES = ("predicted", "fitted")

# Metrics a reference row may name besides the runs columns: a run read the way a paper
# counts it. The vLLM paper's Figure 2 counts a buddy allocator's rounding (2^k − reservation)
# as external fragmentation; kvbench records it inside internal_frag_frac (allocated, never
# filled) and apart as rounding_frac. Name → (the runs column, the sign rounding_frac enters
# with); equal to the recorded column wherever nothing was rounded. Reports compute them
# (``reports.records.paper_split``).
PAPER_SPLIT: dict[str, tuple[str, float]] = {
    "internal_frag_no_rounding_frac": ("internal_frag_frac", -1.0),
    "external_frag_with_rounding_frac": ("external_frag_frac", +1.0),
}
REQUIRED = ("item", "policy", "metric", "published", "source")


def parse_references(entries: Sequence[Mapping[str, Any]], where: str) -> list[dict[str, Any]]:
    rows = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            raise KvbenchError(f"{where}: [[reference]] #{i + 1} must be a table")
        for key in entry:
            if key not in KEYS:
                raise KvbenchError(
                    f"{where}: unknown key {key!r} in [[reference]] #{i + 1} (known: {', '.join(sorted(KEYS))})"
                )
        for key in REQUIRED:
            if key not in entry:
                raise KvbenchError(f"{where}: [[reference]] #{i + 1} is missing {key!r}")
        if (
            entry["metric"] not in RUNS.names
            and entry["metric"] not in PAPER_SPLIT
            and entry["metric"] not in SWEEP_METRICS
        ):
            raise KvbenchError(f"{where}: [[reference]] #{i + 1}: metric {entry['metric']!r} is not a runs column")
        if entry["metric"] in SWEEP_METRICS and not entry.get("baseline_policy"):
            raise KvbenchError(
                f"{where}: [[reference]] #{i + 1}: {entry['metric']} is compared as a ratio: give baseline_policy"
            )
        high = entry.get("published_max")
        if high is not None and (
            isinstance(high, bool)
            or not isinstance(high, (int, float))
            or not isinstance(entry["published"], (int, float))
            or high < entry["published"]
        ):
            raise KvbenchError(
                f"{where}: [[reference]] #{i + 1}: published_max must be a number ≥ published "
                f"(a published range), got {high!r}"
            )
        if isinstance(entry["published"], bool) or not isinstance(entry["published"], (int, float)):
            raise KvbenchError(f"{where}: [[reference]] #{i + 1}: published must be a number")
        basis = entry.get("basis", BASES[0])
        if basis not in BASES:
            raise KvbenchError(
                f"{where}: [[reference]] #{i + 1}: basis must be {' or '.join(map(repr, BASES))} "
                f"(fitted: a clock was fitted to this number), got {basis!r}"
            )
        rows.append({**{k: entry.get(k) for k in KEYS}, "basis": basis})
    return rows


def write_references(out: Path, suite: str, rows: list[dict[str, Any]], workload_ids: Mapping[str, str]) -> Path:
    """Replace this suite's rows in ``out/reference.parquet`` (other suites' rows stay)."""
    first = next(iter(workload_ids), None)  # a suite with one [workload]: rows need not name it
    named = [(r, r.get("workload") or first) for r in rows]
    rows = [
        dict(r, suite=suite, workload=name, workload_id=workload_ids.get(name) if name else None) for r, name in named
    ]
    return replace_suite_rows(Path(out) / "reference.parquet", suite, rows, REFERENCE, "reference")
