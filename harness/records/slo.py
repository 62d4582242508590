"""A suite's service-level objective, ``[slo]``, stored as Parquet beside the records.

A rate sweep answers "how much traffic fits": with an SLO — a runs-table latency
metric and a bound on it — the report finds each policy's *capacity*, the
highest request rate whose metric stays within the bound (``reports.capacity``).
Reports read only Parquet, so ``kvbench run`` writes the suite's SLO to
``DIR/slo.parquet`` (one row per suite: a directory may hold several suites'
runs), as it writes ``reference.parquet``.

    [slo]
    metric = "normalized_latency_mean_s"   # any latency column of the runs table
    bound = 0.5                            # in the metric's unit: seconds (per output token)
    refine = 4                             # optional: bisection steps between the sweep's rates
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa

from ..errors import KvbenchError
from .schema import LATENCY_COLUMNS
from .store import replace_suite_rows

SLO_SCHEMA = pa.schema(
    [
        ("suite", pa.string()),
        ("metric", pa.string()),  # a latency column of the runs table (lower is better)
        ("bound", pa.float64()),  # the metric's highest acceptable value, in its unit
    ]
)
KEYS = ("metric", "bound", "refine")
MAX_REFINE = 12  # 2^12 narrower than a sweep step: beyond any use


@dataclasses.dataclass(frozen=True)
class Slo:
    metric: str
    bound: float
    refine: int = 0  # bisection steps ``kvbench run`` takes between the swept rates around each capacity


def parse_slo(table: Mapping[str, Any], where: str) -> Slo:
    for key in table:
        if key not in KEYS:
            raise KvbenchError(f"{where}: unknown key {key!r} in [slo] (known: {', '.join(KEYS)})")
    metric = table.get("metric")
    if metric not in LATENCY_COLUMNS:
        raise KvbenchError(
            f"{where}: [slo] metric must be a latency column of the runs table "
            f"({', '.join(LATENCY_COLUMNS)}), got {metric!r}"
        )
    bound = table.get("bound")
    if isinstance(bound, bool) or not isinstance(bound, (int, float)) or not 0 < bound < math.inf:
        raise KvbenchError(f"{where}: [slo] bound must be a number > 0 (in {metric}'s unit), got {bound!r}")
    refine = table.get("refine", 0)
    if isinstance(refine, bool) or not isinstance(refine, int) or not 0 <= refine <= MAX_REFINE:
        raise KvbenchError(
            f"{where}: [slo] refine must be an integer from 0 to {MAX_REFINE} (bisection steps), got {refine!r}"
        )
    return Slo(str(metric), float(bound), refine)


def write_slo(out: Path, suite: str, slo: Slo) -> Path:
    """Replace this suite's row in ``out/slo.parquet`` (other suites' rows stay)."""
    rows = [{"suite": suite, "metric": slo.metric, "bound": slo.bound}]
    return replace_suite_rows(Path(out) / "slo.parquet", suite, rows, SLO_SCHEMA, "SLO")
