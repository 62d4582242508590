"""The allocation × runtime decomposition, per workload × precision × budget × block size ×
contiguous baseline (docs/records.md, "The decomposition"; docs/runners.md, "Time and the
decomposition"):

    vllm/paged vs torch/contiguous-*     (naive: what a plain comparison shows)
      = torch/paged vs torch/contiguous-*  (allocation effect, same runtime)
      × vllm/paged  vs torch/paged         (runtime effect, same allocation)

beside the allocation effect inside the full engine (``vllm_allocation``, ``allocation_gap``),
sim's and vllm-sched's runtime-free capacities, preemptions from every side, and ``serving``
(serve/paged ÷ vllm/paged: what the server adds over the engine). ``naive`` is defined as
``allocation × runtime``, so the identity holds exactly. A cell counts as the median of its ok
repetitions; a factor whose runs are missing or not ok is NaN: nothing is filled in.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from typing import Any

import pandas as pd

from ..harness.records.schema import OK
from ..harness.spec.capabilities import MEASURING_RUNNERS, is_contiguous
from .labels import workload_tag
from .tables import mismatches, ratio_of

KEYS: tuple[str, ...] = ("workload_id", "kv_dtype", "budget_bytes")
THROUGHPUT: tuple[str, ...] = ("tokens_per_s", "wall_tokens_per_s")
CAPACITY: tuple[str, ...] = ("mean_running", "peak_running")
METRICS: tuple[str, ...] = THROUGHPUT + CAPACITY
RUNTIMES: tuple[str, ...] = MEASURING_RUNNERS  # the runners whose time is a runtime's, not a clock's
NEEDED: tuple[str, ...] = ("runner", "policy", "block_size", "status", "preemptions", *METRICS)
# A contiguous reservation's unit, as a cell's contiguous_unit names it: token positions (block size 1)
# or whole blocks of the paged block size.
POSITION, BLOCK = "position", "block"
CONTIGUOUS_SIDES: tuple[str, ...] = ("torch", "vllm", "sim")  # the runners whose contiguous runs a row uses
COLUMNS: tuple[str, ...] = (
    *KEYS,
    "workload_name",  # the suite's name for the workload, where the runs record one (reports show it)
    "block_size",
    "baseline",
    "metric",
    "torch_contiguous",
    "torch_paged",
    "vllm_contiguous",
    "vllm_paged",
    "naive",
    "allocation",
    "vllm_allocation",
    "allocation_gap",
    "runtime",
    "torch_contiguous_unit",
    "vllm_contiguous_unit",
    "sim_contiguous",
    "sim_paged",
    "sim_allocation",
    "sim_contiguous_unit",
    "vllm_sched_paged",
    "sim_contiguous_preemptions",
    "sim_paged_preemptions",
    "vllm_sched_paged_preemptions",
    "torch_contiguous_preemptions",
    "torch_paged_preemptions",
    "vllm_contiguous_preemptions",
    "vllm_paged_preemptions",
    "serve_paged",
    "serving",
    "serve_paged_preemptions",
    "models",
    "warning",
)


def _ok(record: Mapping[str, Any], runner: str, policy: str, block_size: int) -> bool:
    return (
        record["runner"] == runner
        and record["policy"] == policy
        and record["status"] == OK
        and record["block_size"] == block_size
    )


def _value(records: list[dict[str, Any]], runner: str, policy: str, block_size: int | None, metric: str) -> float:
    """Median of ``metric`` over the ok runs of (runner, policy, block size); NaN when there are none
    or no block size to match (runs of different block sizes are never pooled)."""
    if block_size is None:
        return math.nan
    values = [
        r[metric]
        for r in records
        if _ok(r, runner, policy, block_size) and r.get(metric) is not None and r[metric] == r[metric]
    ]
    return float(statistics.median(values)) if values else math.nan


def contiguous_block(records: list[dict[str, Any]], runner: str, policy: str, paged_block: int | None) -> int | None:
    """The block size of ``runner``'s ``policy`` runs that stand against paged block size ``paged_block``:
    that block size (whole blocks, like vLLM's reservations) where an ok run has it, else 1 (token
    positions), else None. One form only: a median across both would measure neither."""
    candidates = (1,) if paged_block in (None, 1) else (paged_block, 1)
    return next((b for b in candidates if any(_ok(r, runner, policy, b) for r in records)), None)


def contiguous_unit(block: int | None) -> str | None:
    """``POSITION`` for block size 1, ``BLOCK`` for whole blocks, None without a run."""
    return None if block is None else POSITION if block == 1 else BLOCK


def unit_warning(baseline: str, paged_block: int | None, units: Mapping[str, str | None]) -> str | None:
    """A sentence when the sides' contiguous baselines reserve in different units (None when they agree)."""
    present = {runner: unit for runner, unit in units.items() if unit is not None}
    if len(set(present.values())) < 2:
        return None
    words = {POSITION: "token positions", BLOCK: f"blocks of {paged_block}"}
    sides = ", ".join(f"{runner} in {words[unit]}" for runner, unit in present.items())
    return (
        f"the {baseline} baselines reserve in different units ({sides}): "
        "their allocation factors do not measure the same allocation"
    )


def _block_sizes(timed: pd.DataFrame) -> list[int | None]:
    """The block sizes a row set stands at: every paged block size of torch or vllm, and every block size of
    their block-granular contiguous runs (shown, with paged n/a, when no paged run shares it)."""
    contiguous = timed["policy"].map(lambda p: is_contiguous(str(p)))
    paged = timed["policy"] == "paged"
    sizes = {int(b) for b in timed.loc[paged, "block_size"].dropna()}
    sizes |= {int(b) for b in timed.loc[contiguous, "block_size"].dropna() if int(b) > 1}
    return [*sorted(sizes)] if sizes else [None]


def _used(group: pd.DataFrame, bs: int | None, base: str | None, blocks: Mapping[str, int | None]) -> pd.DataFrame:
    """The runs a row set reads: paged at ``bs`` and each side's matched contiguous runs (for the warnings)."""
    used = (group["policy"] == "paged") & (group["block_size"] == bs)
    for runner, block in blocks.items():
        used |= (group["runner"] == runner) & (group["policy"] == base) & (group["block_size"] == block)
    return group[used]


def decompose(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per (workload, precision, budget, block size, contiguous baseline, metric)."""
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
        baselines: list[str | None] = sorted(
            {p for p in timed.loc[timed["runner"].isin(("torch", "vllm")), "policy"] if is_contiguous(str(p))}
        ) or [None]
        for bs in _block_sizes(timed):
            for base in baselines:
                blocks = {r: None if base is None else contiguous_block(records, r, base, bs) for r in CONTIGUOUS_SIDES}
                used = _used(group, bs, base, blocks)
                units = {r: contiguous_unit(b) for r, b in blocks.items()}
                unit_note = unit_warning(str(base), bs, units)
                warning = "; ".join([*mismatches(used), *([unit_note] if unit_note else [])]) or None
                models = ", ".join(sorted({str(m) for m in used["model"].dropna()}))
                for metric in METRICS:
                    row = _row(records, key, bs, base, blocks, metric)
                    rows.append(
                        row
                        | {f"{r}_contiguous_unit": u for r, u in units.items()}
                        | {"workload_name": name, "models": models, "warning": warning}
                    )
    return pd.DataFrame(rows, columns=list(COLUMNS))


def _row(
    records: list[dict[str, Any]],
    key: tuple,
    bs: int | None,
    base: str | None,
    blocks: Mapping[str, int | None],
    metric: str,
) -> dict[str, object]:
    def paged(runner: str, m: str = metric) -> float:
        return _value(records, runner, "paged", bs, m)

    def contiguous(runner: str, m: str = metric) -> float:
        return math.nan if base is None else _value(records, runner, base, blocks[runner], m)

    torch_c, torch_p = contiguous("torch"), paged("torch")
    vllm_c, vllm_p = contiguous("vllm"), paged("vllm")
    allocation, vllm_allocation = ratio_of(torch_p, torch_c), ratio_of(vllm_p, vllm_c)
    runtime = ratio_of(vllm_p, torch_p)
    capacity = metric in CAPACITY  # sim's and vllm-sched's throughput is a clock's, not a runtime's
    sim_c = contiguous("sim") if capacity else math.nan
    sim_p = paged("sim") if capacity else math.nan
    return {
        **dict(zip(KEYS, key)),
        "block_size": bs,
        "baseline": base,
        "metric": metric,
        "torch_contiguous": torch_c,
        "torch_paged": torch_p,
        "vllm_contiguous": vllm_c,
        "vllm_paged": vllm_p,
        "naive": allocation * runtime,
        "allocation": allocation,
        "vllm_allocation": vllm_allocation,
        "allocation_gap": ratio_of(vllm_allocation, allocation),
        "runtime": runtime,
        "sim_contiguous": sim_c,
        "sim_paged": sim_p,
        "sim_allocation": ratio_of(sim_p, sim_c),
        "vllm_sched_paged": paged("vllm-sched") if capacity else math.nan,
        "sim_contiguous_preemptions": contiguous("sim", "preemptions"),
        "sim_paged_preemptions": paged("sim", "preemptions"),
        "vllm_sched_paged_preemptions": paged("vllm-sched", "preemptions"),
        "torch_contiguous_preemptions": contiguous("torch", "preemptions"),
        "torch_paged_preemptions": paged("torch", "preemptions"),
        "vllm_contiguous_preemptions": contiguous("vllm", "preemptions"),
        "vllm_paged_preemptions": paged("vllm", "preemptions"),
        "serve_paged": paged("serve"),
        "serving": ratio_of(paged("serve"), vllm_p),
        "serve_paged_preemptions": paged("serve", "preemptions"),
    }


def _span(values: pd.Series) -> str:
    lo, hi = f"{values.min():.2f}×", f"{values.max():.2f}×"
    return lo if lo == hi else f"{lo}–{hi}"


def gap_sentence(decomp: pd.DataFrame) -> str:
    """One sentence on how far apart the allocation factor measured in vLLM and in torch is, from the rows'
    numbers: ``allocation_gap`` per metric, the row where the two are furthest apart, and how many rows lack
    one of the two. Empty for an empty decomposition."""
    if decomp.empty:
        return ""
    gap = pd.to_numeric(decomp["allocation_gap"], errors="coerce")
    both = decomp[gap.notna() & (gap > 0)]
    if both.empty:
        return (
            "The allocation factor is measured in one runtime at most, so allocation_gap is n/a in every row: "
            "it needs torch/paged and torch/contiguous-* as well as vllm/paged and vllm/contiguous-* at one block size."
        )
    per_metric = ", ".join(
        f"{m} {_span(both.loc[both['metric'] == m, 'allocation_gap'])}" for m in METRICS if (both["metric"] == m).any()
    )
    far = both.loc[both["allocation_gap"].map(lambda g: abs(math.log(g))).idxmax()].to_dict()
    where = f"{far['metric']} against {far['baseline']}"
    where += f" at block {int(far['block_size'])}" if pd.notna(far["block_size"]) else ""
    if len(decomp[list(KEYS)].drop_duplicates()) > 1:  # several workloads, precisions or budgets: say which
        where += f" ({workload_tag(far)}, {far['kv_dtype']})"
    text = (
        f"vLLM's allocation factor ÷ torch's (allocation_gap; 1.00× = the same) over {len(both)} row(s): "
        f"{per_metric}; furthest apart: {where}, {far['allocation']:.2f}× in torch and "
        f"{far['vllm_allocation']:.2f}× in vLLM ({far['allocation_gap'] - 1:+.0%})"
    )
    missing = len(decomp) - len(both)
    return text + (f"; n/a in the other {missing} row(s), where one runtime's factor is missing." if missing else ".")
