"""A results directory as the reports see it (``load``): the three tables (and a served engine's
scrapes and KV cache groups where runs wrote them), the optional published reference and the
suites' SLO, the runs with their goodput and report keys (``labels.with_keys``)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pandas as pd

from ..harness.errors import KvbenchError
from .labels import with_keys

REFERENCE_COLUMNS: tuple[str, ...] = ("suite", "item", "policy", "block_size", "metric", "published", "source", "note")


@dataclasses.dataclass(frozen=True)
class Records:
    runs: pd.DataFrame
    steps: pd.DataFrame
    requests: pd.DataFrame
    reference: pd.DataFrame | None = None
    reference_problem: str | None = None  # why out/reference.parquet could not be used
    slo: pd.DataFrame | None = None  # out/slo.parquet: the suites' latency bounds for capacity
    metrics: pd.DataFrame | None = None  # a served engine's /metrics scrapes (serve runs); None: no metrics/
    kv_groups: pd.DataFrame | None = None  # KV cache groups per step (models not all full attention); None: none


def load(out: Path) -> Records:
    """Read a results directory; a missing or empty one is a one-line error."""
    from ..harness.records.goodput import slo_met, suite_bounds, with_goodput
    from ..harness.records.slo import normalize_slo
    from ..harness.records.store import check_complete, read_table

    out = Path(out)
    if not out.is_dir():
        raise KvbenchError(f"{out}: no such results directory")
    check_complete(out)  # a run that lost a partition is named, never read as whole
    runs = read_table(out, "runs")
    if runs.empty:
        raise KvbenchError(f"{out}: holds no runs (runs/ is empty); run `kvbench run --out {out}` first")
    steps = read_table(out, "steps", set(runs["run_id"])) if (out / "steps").is_dir() else pd.DataFrame()
    requests = read_table(out, "requests", set(runs["run_id"])) if (out / "requests").is_dir() else pd.DataFrame()
    # Only serve runs write metrics/: a directory without it reads as before.
    metrics = read_table(out, "metrics", set(runs["run_id"])) if (out / "metrics").is_dir() else None
    groups = read_table(out, "kv_groups", set(runs["run_id"])) if (out / "kv_groups").is_dir() else None
    reference, problem = read_reference(out / "reference.parquet")
    slo_path = out / "slo.parquet"
    try:
        slo = normalize_slo(pd.read_parquet(slo_path)) if slo_path.is_file() else None
        suite_bounds(slo)  # rows it cannot read as bounds: not readable
    except Exception as exc:  # a bad SLO file must not cost the rest of the report
        slo, problem = None, (problem or f"{slo_path}: not readable ({type(exc).__name__})")
    # Goodput is judged from the requests under the SLO on disk now, so it follows the SLO.
    runs = (
        with_goodput(runs, requests, slo) if len(requests) else runs.assign(goodput_rps=math.nan, slo_met_frac=math.nan)
    )
    if len(requests):
        requests = requests.assign(slo_met=slo_met(requests, runs, slo))
    return Records(with_keys(runs), steps, requests, reference, problem, slo, metrics, groups)


def read_reference(path: Path) -> tuple[pd.DataFrame | None, str | None]:
    """The published numbers to set beside reproduced ones, or why they cannot be used."""
    if not path.is_file():
        return None, None
    try:
        ref = pd.read_parquet(path)
    except Exception as exc:  # a bad reference file must not cost the rest of the report
        return None, f"{path}: not readable ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
    missing = [c for c in REFERENCE_COLUMNS if c not in ref.columns]
    if missing:
        return None, f"{path}: missing column(s) {', '.join(missing)} (needs {', '.join(REFERENCE_COLUMNS)})"
    if "basis" not in ref.columns:  # written before fitted clocks: nothing in it was fitted
        ref["basis"] = "predicted"
    return ref, None
