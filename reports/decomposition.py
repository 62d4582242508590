"""The allocation × runtime decomposition (docs/records.md, docs/runners.md), per workload × precision × budget:

    vllm/paged vs torch/contiguous-*     (naive: what a plain comparison shows)
      = torch/paged vs torch/contiguous-*  (allocation effect, same runtime)
      × vllm/paged  vs torch/paged         (runtime effect, same allocation)

for throughput (``tokens_per_s``, ``wall_tokens_per_s``) and capacity
(``mean_running``, ``peak_running``), with the runtime-free figures beside
them: ``sim``'s capacity for the same two policies, ``vllm-sched``'s capacity
for paged, and preemptions from both.

``tokens_per_s`` is on kvbench's clock in every runner; ``torch`` and
``vllm`` take the same steps on the same work (their allocation columns agree
step for step), so on that clock the runtime factor is 1 by construction and
the allocation factor is the whole story. ``wall_tokens_per_s`` (generated
tokens per measured second of step time in both runners) carries the
measured runtime effect.

``naive`` is defined as ``allocation × runtime``, so the identity holds exactly
(it equals ``vllm_paged / torch_contiguous`` up to one rounding). A factor
whose runs are missing (or not ok) is NaN; a group with no torch and no vllm
run has no rows. Nothing is filled in. A cell repeated several times counts
as the median of its ok repetitions.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

import pandas as pd

from ..harness.spec.capabilities import MEASURING_RUNNERS, is_contiguous
from .tables import mismatches

KEYS: tuple[str, ...] = ("workload_id", "kv_dtype", "budget_bytes")
THROUGHPUT: tuple[str, ...] = ("tokens_per_s", "wall_tokens_per_s")
CAPACITY: tuple[str, ...] = ("mean_running", "peak_running")
METRICS: tuple[str, ...] = THROUGHPUT + CAPACITY
RUNTIMES: tuple[str, ...] = MEASURING_RUNNERS  # the runners whose time is a runtime's, not a clock's
NEEDED: tuple[str, ...] = ("runner", "policy", "block_size", "status", "preemptions", *METRICS)
COLUMNS: tuple[str, ...] = (
    *KEYS,
    "workload_name",  # the suite's name for the workload, where the runs record one (reports show it)
    "block_size",
    "baseline",
    "metric",
    "torch_contiguous",
    "torch_paged",
    "vllm_paged",
    "naive",
    "allocation",
    "runtime",
    "sim_contiguous",
    "sim_paged",
    "sim_allocation",
    "vllm_sched_paged",
    "sim_contiguous_preemptions",
    "sim_paged_preemptions",
    "vllm_sched_paged_preemptions",
    "torch_paged_preemptions",
    "vllm_paged_preemptions",
    "models",
    "warning",
)


def _value(records: list[dict[str, Any]], runner: str, policy: str, block_size: int | None, metric: str) -> float:
    """Median of ``metric`` over the ok runs of (runner, policy[, block size]); NaN when there are none."""
    values = [
        r[metric]
        for r in records
        if r["runner"] == runner
        and r["policy"] == policy
        and r["status"] == "ok"
        and (block_size is None or r["block_size"] == block_size)
        and r.get(metric) is not None
        and r[metric] == r[metric]
    ]
    return float(statistics.median(values)) if values else math.nan


def _ratio(num: float, den: float) -> float:
    if not (math.isfinite(num) and math.isfinite(den)) or den == 0:
        return math.nan
    return num / den


def decompose(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per (workload, precision, budget, paged block size, contiguous baseline, metric)."""
    rows: list[dict[str, object]] = []
    for key, group in runs.groupby(list(KEYS), sort=True):
        timed = group[group["runner"].isin(RUNTIMES)]
        if timed.empty:
            continue
        timed_models = set(timed["model"].dropna())
        if len(timed_models) == 1:  # the runtime-free figures beside them: same model only
            group = group[group["runner"].isin(RUNTIMES) | group["model"].isin(timed_models)]
        records = group[list(NEEDED)].to_dict("records")
        names = group["workload_name"].dropna() if "workload_name" in group else ()
        name = next(iter(names), None)
        sizes = sorted({int(b) for b in timed.loc[timed["policy"] == "paged", "block_size"]})
        paged_sizes: list[int | None] = list(sizes) or [None]
        baselines: list[str | None] = sorted(
            {p for p in timed.loc[timed["runner"] == "torch", "policy"] if is_contiguous(str(p))}
        ) or [None]
        for bs in paged_sizes:
            for base in baselines:
                used = group[
                    ((group["policy"] == "paged") & ((group["block_size"] == bs) if bs else True))
                    | (group["policy"] == base)
                ]
                warning = "; ".join(mismatches(used)) or None
                models = ", ".join(sorted({str(m) for m in used["model"].dropna()}))
                for metric in METRICS:
                    rows.append(_row(records, key, bs, base, metric, models, warning) | {"workload_name": name})
    return pd.DataFrame(rows, columns=list(COLUMNS))


def _row(
    records: list[dict[str, Any]],
    key: tuple,
    bs: int | None,
    base: str | None,
    metric: str,
    models: str,
    warning: str | None,
) -> dict[str, object]:
    def v(runner: str, policy: str | None, m: str = metric, block: int | None = None) -> float:
        return math.nan if policy is None else _value(records, runner, policy, block, m)

    torch_c, torch_p, vllm_p = v("torch", base), v("torch", "paged", block=bs), v("vllm", "paged", block=bs)
    allocation = _ratio(torch_p, torch_c)
    runtime = _ratio(vllm_p, torch_p)
    capacity = metric in CAPACITY
    sim_c = v("sim", base) if capacity else math.nan
    sim_p = v("sim", "paged", block=bs) if capacity else math.nan
    sched_p = v("vllm-sched", "paged", block=bs) if capacity else math.nan
    return {
        **dict(zip(KEYS, key)),
        "block_size": bs,
        "baseline": base,
        "metric": metric,
        "torch_contiguous": torch_c,
        "torch_paged": torch_p,
        "vllm_paged": vllm_p,
        "naive": allocation * runtime,
        "allocation": allocation,
        "runtime": runtime,
        "sim_contiguous": sim_c,
        "sim_paged": sim_p,
        "sim_allocation": _ratio(sim_p, sim_c),
        "vllm_sched_paged": sched_p,
        "sim_contiguous_preemptions": v("sim", base, "preemptions"),
        "sim_paged_preemptions": v("sim", "paged", "preemptions", bs),
        "vllm_sched_paged_preemptions": v("vllm-sched", "paged", "preemptions", bs),
        "torch_paged_preemptions": v("torch", "paged", "preemptions", bs),
        "vllm_paged_preemptions": v("vllm", "paged", "preemptions", bs),
        "models": models,
        "warning": warning,
    }
