"""What a report shows, computed once for both renderers (Markdown and HTML):
the per-cell table with ratios to the baseline, their geometric means, the
decomposition, the published-vs-reproduced table, and the warnings to show in red."""

from __future__ import annotations

import dataclasses

import pandas as pd

from reports.decomposition import decompose
from reports.tables import POLICY_ORDER, geomean, mismatches, published_vs_reproduced, ratios, summary


def choose_baseline(runs: pd.DataFrame) -> str | None:
    """``contiguous-max`` when present, else the first contiguous policy run, else none."""
    policies = set(runs.loc[runs["status"] == "ok", "policy"]) if len(runs) else set()
    for p in POLICY_ORDER:
        if p in policies and p.startswith("contiguous-"):
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


def report_tables(runs: pd.DataFrame, reference: pd.DataFrame | None = None,
                  reference_problem: str | None = None) -> ReportTables:
    baseline = choose_baseline(runs)
    cells = summary(runs)
    cells = ratios(cells, baseline) if baseline else cells
    geo = geomean(cells[cells["policy"] != baseline]) if baseline and len(cells) else pd.DataFrame()
    decomp = decompose(runs)
    warnings = [f"decomposition ({r['workload_id'][:8]}, {r['kv_dtype']}): {r['warning']}"
                for r in decomp.drop_duplicates(["workload_id", "kv_dtype", "budget_bytes", "warning"]).to_dict("records")
                if r["warning"]]
    bad = runs[runs["status"].isin(("failed", "oom"))]
    if len(bad):
        warnings.append(f"{len(bad)} run(s) failed or ran out of memory; their rows show the error")
    if reference_problem:
        warnings.append(f"published reference not shown: {reference_problem}")
    ref = published_vs_reproduced(reference, runs) if reference is not None else None
    if ref is not None:
        for item, sub in ref.dropna(subset=["runner"]).groupby("item", sort=False):
            matched = runs[runs["run_id"].isin(set(sub["run_id"]))]
            warnings += [f"published item {item!r}: {w}" for w in mismatches(matched)]
    return ReportTables(cells, baseline, geo, decomp, ref, warnings)
