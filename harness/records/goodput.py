"""Which requests met a suite's SLO, each run's goodput, and whether a run is within the SLO.

Pure functions over the records as read (``store.read_table``) and ``slo.parquet`` (one row
per bound: the runs column it reads and its highest value; ``harness.records.slo``).

- A request meets the SLO (``slo_met``) when it finished and each of its own values is
  within every bound's value, whatever percentile the bound is read at (as ``vllm bench
  serve --goodput`` judges a request): TTFT, TPOT (0 for a one-token request, as vLLM
  counts it), end-to-end and normalized latency; a bound on itl is read on the run's
  ``itl_*`` column only (the requests table keeps no per-token times). Null for the runs
  of a suite without an SLO, or whose bounds are all on itl.
- ``goodput_rps``: the requests that met it per second of the run's clock (``sim_time_s``,
  the run's duration, as vLLM divides by the benchmark's duration); ``slo_met_frac``: their
  share of the run's requests.
- A run is within the SLO when each bound's runs-table value is at most the bound and, with
  a goodput floor, ``slo_met_frac`` is at least the floor (``within_slo``). A bound whose
  percentile is taken by another method than the runs table's linear one (an MLPerf preset:
  LoadGen's) is judged on ``column@method`` (``bounds.judged_column``), which ``with_goodput``
  computes from the requests by that method (``percentiles``), pooling each metric's values as
  ``harness.sim.latency`` pools them for the runs table.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from .bounds import judged_column, split_judged
from .percentiles import percentile

# The runs columns' prefixes with a per-request value in the requests table.
PER_REQUEST: tuple[str, ...] = ("ttft", "tpot", "latency", "normalized_latency")
FLOOR = "slo_met_frac"  # the column a goodput floor reads

Bounds = Sequence[tuple[str, float]]  # (runs column, highest value)


def request_values(requests: pd.DataFrame) -> pd.DataFrame:
    """Each request's TTFT, TPOT, latency and normalized latency (NaN where it did not finish)."""
    done = (requests["status"] == "finished").to_numpy()
    arrival = pd.to_numeric(requests["arrival_s"], errors="coerce").to_numpy(dtype=np.float64)
    first = pd.to_numeric(requests["first_token_s"], errors="coerce").to_numpy(dtype=np.float64)
    finish = pd.to_numeric(requests["finished_s"], errors="coerce").to_numpy(dtype=np.float64)
    generated = pd.to_numeric(requests["output_len"], errors="coerce").to_numpy(dtype=np.float64)
    latency = finish - arrival
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(generated > 1, (finish - first) / (generated - 1), 0.0)
        normalized = latency / generated
    values = pd.DataFrame(
        {"ttft": first - arrival, "tpot": tpot, "latency": latency, "normalized_latency": normalized},
        index=requests.index,
    )
    values[~done] = math.nan
    return values


def prefix(column: str) -> str:
    """The metric a runs latency column summarises (``ttft_p99_s`` and ``ttft_p99_s@mlperf`` → ``ttft``)."""
    return split_judged(column)[0].rsplit("_", 2)[0]


def pooled_values(requests: pd.DataFrame, metric: str) -> np.ndarray:
    """One run's values of ``metric`` (a runs-column prefix) as the runs table summarises them
    (``harness.sim.latency``): over requests that finished with a token; TPOT over those with
    more than one; ITL every gap between successive entries of ``token_times_s``."""
    done = requests[(requests["status"] == "finished") & (pd.to_numeric(requests["output_len"]) > 0)]
    if metric == "itl":
        gaps = [np.diff(np.asarray(t, dtype=np.float64)) for t in done["token_times_s"] if t is not None]
        return np.concatenate(gaps) if gaps else np.array([])
    values = request_values(done)
    if metric == "tpot":
        return values["tpot"][pd.to_numeric(done["output_len"]) > 1].to_numpy(dtype=np.float64)
    return values[metric].to_numpy(dtype=np.float64)


def judged_values(requests: pd.DataFrame, column: str) -> float:
    """A judged column's value for one run's requests (``ttft_p99_s@mlperf``); NaN without values."""
    base, method = split_judged(column)
    stat = base.rsplit("_", 2)[1]
    values = pooled_values(requests, prefix(base))
    return percentile(values, float(stat[1:]), method) if len(values) else math.nan


def request_met(requests: pd.DataFrame, bounds: Bounds) -> pd.Series:
    """Per request: True when it finished within every bound on a metric it has a value of (a
    bound on itl is a percentile bound on the run only, as vLLM's goodput takes none); None when no
    bound is on such a metric."""
    judged = [(prefix(col), bound) for col, bound in bounds if prefix(col) in PER_REQUEST]
    if not judged:
        return pd.Series([None] * len(requests), index=requests.index, dtype=object)
    values = request_values(requests)
    met = pd.Series(requests["status"].to_numpy() == "finished", index=requests.index)
    for metric, bound in judged:
        met &= values[metric] <= bound  # NaN compares False
    return met.astype(object)


def suite_bounds(slo: pd.DataFrame | None) -> dict[str, tuple[list[tuple[str, float]], float | None]]:
    """Each suite's bounds and goodput floor, from ``slo.parquet``'s rows."""
    out: dict[str, tuple[list[tuple[str, float]], float | None]] = {}
    if slo is None or slo.empty:
        return out
    for suite, rows in slo.groupby("suite", sort=False):
        floors = [float(f) for f in rows.get("goodput_floor", []) if f is not None and f == f]
        methods = rows["percentile_method"] if "percentile_method" in rows else [None] * len(rows)
        out[str(suite)] = (
            [
                (judged_column(str(m), method if isinstance(method, str) else None), float(b))
                for m, b, method in zip(rows["metric"], rows["bound"], methods)
            ],
            floors[0] if floors else None,
        )
    return out


def slo_met(requests: pd.DataFrame, runs: pd.DataFrame, slo: pd.DataFrame | None) -> pd.Series:
    """``request_met`` of every request under its run's suite's SLO (None: no SLO)."""
    met = pd.Series([None] * len(requests), index=requests.index, dtype=object)
    if requests.empty or runs.empty:
        return met
    suite_of = requests["run_id"].map(dict(zip(runs["run_id"], runs["suite"])))
    for suite, (bounds, _) in suite_bounds(slo).items():
        mine = suite_of == suite
        if mine.any():
            met[mine] = request_met(requests[mine], bounds)
    return met


def with_judged(runs: pd.DataFrame, requests: pd.DataFrame, slo: pd.DataFrame | None) -> pd.DataFrame:
    """``runs`` with every judged column the SLOs read that the runs table does not hold
    (``ttft_p99_s@mlperf``), each run's from its own requests (NaN for other suites' runs)."""
    suites: dict[str, set[str]] = {}  # judged column → the suites whose SLO reads it
    for suite, (bounds, _) in suite_bounds(slo).items():
        for column, _bound in bounds:
            if column not in runs:
                suites.setdefault(column, set()).add(suite)
    if suites:
        by_run = {str(rid): group for rid, group in requests.groupby("run_id", sort=False)}
        for column, readers in suites.items():
            runs[column] = [
                judged_values(by_run[rid], column) if s in readers and rid in by_run else math.nan
                for s, rid in zip(runs["suite"], runs["run_id"].astype(str))
            ]
    return runs


def with_goodput(runs: pd.DataFrame, requests: pd.DataFrame, slo: pd.DataFrame | None) -> pd.DataFrame:
    """``runs`` with ``goodput_rps`` and ``slo_met_frac`` (NaN where the suite has no SLO, the run
    has no requests or its metric has no per-request value), and the judged columns the SLOs read
    (``with_judged``)."""
    runs = runs.copy()
    runs["goodput_rps"] = math.nan
    runs["slo_met_frac"] = math.nan
    if runs.empty or requests.empty:
        return runs
    runs = with_judged(runs, requests, slo)
    met = slo_met(requests, runs, slo)
    judged = requests.assign(_met=met)[met.notna()]
    if judged.empty:
        return runs
    per_run = judged.groupby("run_id")["_met"].agg(good="sum", n="size")
    good = runs["run_id"].map(per_run["good"]).astype(float)
    n = runs["run_id"].map(per_run["n"]).astype(float)
    duration = pd.to_numeric(runs["sim_time_s"], errors="coerce")
    runs["slo_met_frac"] = good / n
    runs["goodput_rps"] = (good / duration).where(duration > 0)
    return runs


def pressure(values: Mapping[str, float], bounds: Bounds, floor: float | None) -> dict[str, float]:
    """How hard each bound presses on a run (or a rate's medians): value ÷ bound, and for a goodput
    floor, floor ÷ ``slo_met_frac``; above 1 is over it, NaN values count as infinitely over."""
    out = {}
    for col, bound in bounds:
        v = values.get(col, math.nan)
        out[col] = math.inf if v is None or v != v else float(v) / bound
    if floor is not None:
        frac = values.get(FLOOR, math.nan)
        out[FLOOR] = math.inf if frac is None or frac != frac or frac <= 0 else floor / float(frac)
    return out


def within_slo(values: Mapping[str, float], bounds: Bounds, floor: float | None) -> bool:
    """Every bound holds (value ≤ bound) and, with a floor, ``slo_met_frac`` ≥ floor; a missing
    value (nothing finished) is over."""
    for col, bound in bounds:
        v = values.get(col, math.nan)
        if v is None or not v <= bound:
            return False
    if floor is not None:
        frac = values.get(FLOOR, math.nan)
        if frac is None or not frac >= floor:
            return False
    return True
