"""A suite's service-level objective, ``[slo]``, stored as Parquet beside the records.

A rate sweep answers "how much traffic fits": with an SLO — bounds on per-request
latency, each at a percentile — the report finds each policy's *capacity*, the
highest request rate at which every bound holds (``reports.capacity``), and each
run's *goodput*, the requests per second that met every bound (``harness.records.goodput``).
Reports read only Parquet, so ``kvbench run`` writes the suite's SLO to
``DIR/slo.parquet`` (one row per bound and suite: a directory may hold several
suites' runs), as it writes ``reference.parquet``.

    [slo]
    bounds = [{metric = "ttft", percentile = 99, max_s = 2.0},
              {metric = "tpot", percentile = 99, max_s = 0.2}]
    goodput_floor = 0.9   # optional: and at least 90% of requests within every bound
    refine = 4            # optional: bisection steps between the sweep's rates

or ``preset = "mlperf-llama2-70b-server"`` (``harness.records.slo_presets``) in place of
``bounds`` (an MLPerf preset's percentiles are judged by LoadGen's rule, not the runs table's
linear one: ``harness.records.percentiles``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from ..errors import KvbenchError
from .bounds import METRICS, PERCENTILES, Bound
from .schema import LATENCY_COLUMNS
from .slo_presets import PRESETS
from .store import replace_suite_rows

SLO_SCHEMA = pa.schema(
    [
        ("suite", pa.string()),
        ("metric", pa.string()),  # a latency column of the runs table (lower is better)
        ("bound", pa.float64()),  # the metric's highest acceptable value, in its unit
        ("goodput_floor", pa.float64()),  # the share of requests that must meet every bound (null: none)
        ("preset", pa.string()),  # the preset the bounds come from (null: stated in the suite)
        # How the bound's percentile is taken (harness.records.percentiles; null: linear, the runs table's).
        ("percentile_method", pa.string()),
    ]
)
KEYS = ("bounds", "preset", "goodput_floor", "refine")
BOUND_KEYS = ("metric", "percentile", "max_s")
MAX_REFINE = 12  # 2^12 narrower than a sweep step: beyond any use


@dataclasses.dataclass(frozen=True)
class Slo:
    bounds: tuple[Bound, ...]
    refine: int = 0  # bisection steps ``kvbench run`` takes between the swept rates around each capacity
    goodput_floor: float | None = None  # a run also needs this share of its requests within every bound
    preset: str | None = None

    @property
    def metrics(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(b.metric for b in self.bounds))


def column_bound(column: str, value: float) -> Bound:
    """A bound on a runs-table latency column (``normalized_latency_mean_s``)."""
    for metric, prefix in METRICS.items():
        stat = column.removeprefix(f"{prefix}_").removesuffix("_s")
        if column.startswith(f"{prefix}_") and f"{prefix}_{stat}_s" == column:
            return Bound(metric, stat, value)
    raise KvbenchError(f"not a latency column: {column!r}")  # unreachable for LATENCY_COLUMNS


def _positive(value: object, what: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise KvbenchError(f"{where}: [slo] {what} must be a number > 0, got {value!r}")
    return float(value)


def _bound(entry: object, where: str) -> Bound:
    if not isinstance(entry, Mapping):
        raise KvbenchError(f"{where}: [slo] bounds must be a list of tables {{metric, percentile, max_s}}")
    for key in entry:
        if key not in BOUND_KEYS:
            raise KvbenchError(f"{where}: unknown key {key!r} in an [slo] bound (known: {', '.join(BOUND_KEYS)})")
    metric = entry.get("metric")
    if not isinstance(metric, str) or metric not in METRICS:
        raise KvbenchError(f"{where}: [slo] bound metric must be one of {', '.join(METRICS)}, got {metric!r}")
    pct = entry.get("percentile")
    if pct == "mean":
        stat = "mean"
    elif not isinstance(pct, bool) and isinstance(pct, (int, float)) and pct in PERCENTILES:
        stat = f"p{int(pct)}"
    else:
        raise KvbenchError(
            f'{where}: [slo] bound percentile must be one of {", ".join(map(str, PERCENTILES))} or "mean", got {pct!r}'
        )
    return Bound(str(metric), stat, _positive(entry.get("max_s"), f"{metric} bound max_s (seconds)", where))


def _current_spelling(table: Mapping[str, Any]) -> str:
    """The ``bounds`` entry that says what a ``metric``/``bound`` pair meant (a generic one when
    the pair names no runs-table latency column)."""
    metric, value = table.get("metric"), table.get("bound")
    if metric in LATENCY_COLUMNS and isinstance(value, (int, float)) and not isinstance(value, bool):
        b = column_bound(str(metric), float(value))
        pct = '"mean"' if b.stat == "mean" else b.stat.removeprefix("p")
        return f'bounds = [{{metric = "{b.metric}", percentile = {pct}, max_s = {value:g}}}]'
    return 'bounds = [{metric = "normalized", percentile = "mean", max_s = 0.5}]'


def parse_slo(table: Mapping[str, Any], where: str) -> Slo:
    if "metric" in table or "bound" in table:
        raise KvbenchError(f"{where}: [slo] metric/bound: write {_current_spelling(table)}")
    for key in table:
        if key not in KEYS:
            raise KvbenchError(f"{where}: unknown key {key!r} in [slo] (known: {', '.join(KEYS)})")
    forms = [f for f in ("bounds", "preset") if f in table]
    if len(forms) != 1:
        raise KvbenchError(
            f'{where}: [slo] takes one of bounds = [...] or preset = "NAME"'
            + (f", not {' and '.join(forms)} together" if forms else "")
        )
    preset = None
    if forms == ["bounds"]:
        entries = table["bounds"]
        if not isinstance(entries, list) or not entries:
            raise KvbenchError(f"{where}: [slo] bounds must be a non-empty list of {{metric, percentile, max_s}}")
        bounds = tuple(_bound(e, where) for e in entries)
        seen = [b.column for b in bounds]
        dup = next((c for c in seen if seen.count(c) > 1), None)
        if dup:
            raise KvbenchError(f"{where}: [slo] bounds {dup} twice")
    else:
        preset = table["preset"]
        if not isinstance(preset, str) or preset not in PRESETS:
            raise KvbenchError(f"{where}: unknown [slo] preset {preset!r} (known: {', '.join(PRESETS)})")
        bounds = PRESETS[preset].bounds
    floor = table.get("goodput_floor")
    if floor is not None and (isinstance(floor, bool) or not isinstance(floor, (int, float)) or not 0 < floor <= 1):
        raise KvbenchError(
            f"{where}: [slo] goodput_floor must be a share of requests in (0, 1] (0.9: 90%), got {floor!r}"
        )
    refine = table.get("refine", 0)
    if isinstance(refine, bool) or not isinstance(refine, int) or not 0 <= refine <= MAX_REFINE:
        raise KvbenchError(
            f"{where}: [slo] refine must be an integer from 0 to {MAX_REFINE} (bisection steps), got {refine!r}"
        )
    return Slo(bounds, refine, None if floor is None else float(floor), preset)


def slo_frame(slo: Slo, suite: str) -> pd.DataFrame:
    """The suite's rows of ``slo.parquet``: one per bound."""
    return pd.DataFrame(slo_rows(slo, suite), columns=SLO_SCHEMA.names)


def slo_rows(slo: Slo, suite: str) -> list[dict[str, object]]:
    return [
        {
            "suite": suite,
            "metric": b.column,
            "bound": b.max_s,
            "goodput_floor": slo.goodput_floor,
            "preset": slo.preset,
            "percentile_method": b.method,
        }
        for b in slo.bounds
    ]


def normalize_slo(frame: pd.DataFrame) -> pd.DataFrame:
    """A ``slo.parquet`` as read, with the columns an older file lacks (no goodput floor, no preset)."""
    frame = frame.copy()
    for name in SLO_SCHEMA.names:
        if name not in frame:
            frame[name] = math.nan if name == "goodput_floor" else None
    return frame


def judged_bounds(slo: Slo) -> list[tuple[str, float]]:
    """(the column each bound is judged on, its highest value): ``Bound.judged_column``."""
    return [(b.judged_column, b.max_s) for b in slo.bounds]


def write_slo(out: Path, suite: str, slo: Slo) -> Path:
    """Replace this suite's rows in ``out/slo.parquet`` (other suites' rows stay)."""
    return replace_suite_rows(Path(out) / "slo.parquet", suite, slo_rows(slo, suite), SLO_SCHEMA, "SLO")
