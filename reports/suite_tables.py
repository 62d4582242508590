"""A suite's tables read from its results directory: its runs with their goodput under its SLO,
its capacities, and the capacity report (table, ratios, published ratios beside them)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..harness.records import store
from ..harness.records.slo import Slo


def suite_runs(out: Path, suite: str, slo: Slo | None, ids: set[str] | None = None) -> pd.DataFrame:
    """Suite ``suite``'s runs in ``out`` (of ``ids``, or all) with their goodput under ``slo``."""
    from ..harness.records.goodput import with_goodput
    from ..harness.records.slo import slo_frame

    runs = store.read_table(out, "runs", ids)
    runs = runs[runs["suite"] == suite]
    if runs.empty or slo is None:
        return runs
    requests = store.read_table(out, "requests", set(runs["run_id"]))
    return with_goodput(runs, requests, slo_frame(slo, suite))


def capacities(out: Path, suite: str, slo: Slo | None, ids: set[str] | None = None) -> pd.DataFrame:
    """The suite's capacity table from the records in ``out`` (empty without an SLO or a sweep);
    with ``ids``, from those runs only."""
    from ..harness.records.slo import slo_frame
    from .capacity import capacity_table
    from .labels import with_keys

    if slo is None:
        return pd.DataFrame()
    runs = suite_runs(out, suite, slo, ids)
    if runs.empty:
        return pd.DataFrame()
    return capacity_table(with_keys(runs), slo_frame(slo, suite))


def capacity_report(out: Path, suite: str, slo: Slo | None) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The capacity table, the capacity ratios and the published ratios beside them, from ``out``."""
    from .capacity import capacity_ratios, capacity_vs_published
    from .labels import with_keys
    from .loading import read_reference

    table = capacities(out, suite, slo)
    ratios = capacity_ratios(table)
    reference, _ = read_reference(out / "reference.parquet")
    if reference is None or ratios.empty:
        return table, ratios, capacity_vs_published(ratios, None, pd.DataFrame())
    runs = store.read_table(out, "runs")  # every workload id of the suite's sweeps, for the published rows
    return table, ratios, capacity_vs_published(ratios, reference[reference["suite"] == suite], with_keys(runs))
