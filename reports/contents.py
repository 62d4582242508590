"""What a report shows, computed once for both renderers (Markdown and HTML):
the per-cell table with ratios to the baseline, their geometric means, the
decomposition, the published-vs-reproduced table, and the warnings to show in red."""

from __future__ import annotations

import dataclasses

import pandas as pd

from ..harness.records.schema import FAILURES, OK
from ..harness.spec.capabilities import is_contiguous
from .capacity import capacity_ratios, capacity_table, capacity_vs_published, goodput_table
from .cpu_tier import CpuTier, cpu_tier
from .decomposition import decompose, gap_sentence
from .hybrid import hybrid_table
from .labels import code_note, workload_tag
from .prediction import Drift, disturbed_warning, prediction_drift, prediction_summary, prediction_table
from .prefix_reuse import prefix_reuse_table
from .serve_check import serve_check
from .tables import POLICY_ORDER, geomean, mismatches, published_vs_reproduced, ratios, summary


def choose_baseline(runs: pd.DataFrame) -> str | None:
    """``contiguous-max`` when present, else the first contiguous policy run, else none."""
    policies = set(runs.loc[runs["status"] == OK, "policy"]) if len(runs) else set()
    for p in POLICY_ORDER:
        if p in policies and is_contiguous(p):
            return p
    return None


@dataclasses.dataclass(frozen=True)
class ReportTables:
    cells: pd.DataFrame  # summary + ratios to the baseline
    baseline: str | None
    geomean: pd.DataFrame
    decomposition: pd.DataFrame
    reference: pd.DataFrame | None  # published vs reproduced
    warnings: list[str]  # shown in red
    clocks: pd.DataFrame = dataclasses.field(default_factory=pd.DataFrame)  # which clock every run used
    prediction: pd.DataFrame = dataclasses.field(default_factory=pd.DataFrame)  # sim on a profile vs the engine
    capacity: pd.DataFrame = dataclasses.field(default_factory=pd.DataFrame)  # per policy line: rate within the SLO
    capacity_ratios: pd.DataFrame = dataclasses.field(default_factory=pd.DataFrame)
    capacity_published: pd.DataFrame = dataclasses.field(default_factory=pd.DataFrame)
    drift: Drift | None = None  # the prediction's error split into the machine's and the model's
    decomposition_gap: str = ""  # one sentence: the allocation factor in vLLM against torch's
    goodput: pd.DataFrame = dataclasses.field(default_factory=pd.DataFrame)  # per run of a sweep under an SLO
    prefix_reuse: pd.DataFrame = dataclasses.field(default_factory=pd.DataFrame)  # paged-prefix against budget
    serve_check: pd.DataFrame = dataclasses.field(default_factory=pd.DataFrame)  # serve: steps against /metrics
    hybrid: pd.DataFrame = dataclasses.field(default_factory=pd.DataFrame)  # the hybrid KV cache manager on vs off
    cpu_tier: CpuTier = dataclasses.field(default_factory=CpuTier)  # a CPU tier of KV memory against none


def drift_to_show(table: pd.DataFrame) -> Drift | None:
    """``prediction_drift`` when it can say something: at least two rounds and two workloads."""
    drift = prediction_drift(table)
    if len(drift.rounds) < 2 or len(drift.workloads) < 2:
        return None
    return drift


def clock_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per (runner, clock, detail): how many runs priced their steps that way."""
    if runs.empty or "clock" not in runs:
        return pd.DataFrame()
    detail = runs["clock_detail"] if "clock_detail" in runs else pd.Series([None] * len(runs), index=runs.index)
    frame = pd.DataFrame(
        {
            "runner": runs["runner"],
            "clock": runs["clock"],
            "clock_detail": detail.fillna("(not recorded: written before kvbench recorded it)"),
        }
    )
    return frame.groupby(["runner", "clock", "clock_detail"], sort=True).size().rename("runs").reset_index()


def report_tables(
    runs: pd.DataFrame,
    reference: pd.DataFrame | None = None,
    reference_problem: str | None = None,
    steps: pd.DataFrame | None = None,
    slo: pd.DataFrame | None = None,
    metrics: pd.DataFrame | None = None,
    kv_groups: pd.DataFrame | None = None,
    requests: pd.DataFrame | None = None,
) -> ReportTables:
    baseline = choose_baseline(runs)
    cells = summary(runs)
    cells = ratios(cells, baseline) if baseline else cells
    geo = geomean(cells[cells["policy"] != baseline]) if baseline and len(cells) else pd.DataFrame()
    decomp = decompose(runs)
    warnings = [
        f"decomposition ({workload_tag(r)}, {r['kv_dtype']}): {r['warning']}"
        for r in decomp.drop_duplicates(["workload_id", "kv_dtype", "budget_bytes", "warning"]).to_dict("records")
        if r["warning"]
    ]
    code = code_note(runs["code_digest"] if "code_digest" in runs else [])
    if code:  # results of different code side by side: said first, it qualifies every table below
        warnings.insert(0, code)
    bad = runs[runs["status"].isin(FAILURES)]
    if len(bad):
        warnings.append(f"{len(bad)} run(s) failed or ran out of memory; their rows show the error")
    if reference_problem:
        warnings.append(f"published reference not shown: {reference_problem}")
    ref = published_vs_reproduced(reference, runs) if reference is not None else None
    if ref is not None:
        for item, sub in ref.dropna(subset=["runner"]).groupby("item", sort=False):
            matched = runs[runs["run_id"].isin(set(sub["run_id"]))]
            warnings += [f"published item {item!r}: {w}" for w in mismatches(matched)]
    paired = prediction_table(runs, steps) if steps is not None and len(steps) else pd.DataFrame()
    prediction = prediction_summary(paired)
    busy = disturbed_warning(prediction)
    if busy:
        warnings.append(busy)
    capacity = capacity_table(runs, slo) if slo is not None and len(slo) else pd.DataFrame()
    cap_ratios = capacity_ratios(capacity) if len(capacity) else pd.DataFrame()
    cap_published = capacity_vs_published(cap_ratios, reference, runs) if len(cap_ratios) else pd.DataFrame()
    goodput = goodput_table(runs, slo) if len(capacity) and "goodput_rps" in runs else pd.DataFrame()
    return ReportTables(
        cells,
        baseline,
        geo,
        decomp,
        ref,
        warnings,
        clock_table(runs),
        prediction,
        capacity,
        cap_ratios,
        cap_published,
        drift_to_show(paired),
        decomposition_gap=gap_sentence(decomp),
        goodput=goodput,
        prefix_reuse=prefix_reuse_table(cells),
        serve_check=serve_check(runs, steps, metrics),
        hybrid=hybrid_table(runs, steps, kv_groups),
        cpu_tier=cpu_tier(cells, runs, steps, requests),
    )
