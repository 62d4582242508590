"""What vLLM's hybrid KV cache manager changes, from records: for every pair of runs that differ
only in ``hybrid_kv`` (same work, runner, policy and block size), the manager on against off:
peak and mean running requests, preemptions, tokens per second, and the time-weighted share of
the budget each kind of KV cache group held without its layers reading it (waste by kind, from
the ``kv_groups`` table: ``allocated_blocks × kv_bytes_per_block − used_bytes``, weighted by
each step's ``dt_s``). A paged pair also shows what paging changed: its tokens per second over a
contiguous policy's on the same work, runner, block size and manager setting (``paging_on``,
``paging_off``; the contiguous policy named in ``contiguous``, the first by name where several ran).
A pure function of the run, step and group tables; the renderers show it.
"""

from __future__ import annotations

import math

import pandas as pd

from ..harness.records.schema import OK
from ..harness.spec.capabilities import is_contiguous
from .labels import CELL_KEYS, GROUP_KEYS

# What a pair shares: the work and the cell but the manager.
PAIR_KEYS: tuple[str, ...] = tuple(k for k in GROUP_KEYS + CELL_KEYS if k != "hybrid_kv")


def waste_by_kind(runs: pd.DataFrame, steps: pd.DataFrame, groups: pd.DataFrame) -> pd.DataFrame:
    """Per run and group kind: the time-weighted share of the budget its blocks held beyond what
    its layers read (``waste_frac``), and the share they held at all (``held_frac``)."""
    if groups is None or groups.empty or steps is None or steps.empty:
        return pd.DataFrame(columns=["run_id", "kind", "held_frac", "waste_frac"])
    dt = steps[["run_id", "step", "dt_s"]]
    g = groups.merge(dt, on=["run_id", "step"], how="left")
    per_block = runs.set_index("run_id")["kv_bytes_per_block"]
    budget = runs.set_index("run_id")["budget_bytes"]
    g["held"] = g["allocated_blocks"] * g["run_id"].map(per_block)
    g["w_held"] = g["held"] * g["dt_s"]
    g["w_waste"] = (g["held"] - g["used_bytes"]) * g["dt_s"]
    time = steps.groupby("run_id")["dt_s"].sum()
    out = g.groupby(["run_id", "kind"], sort=True)[["w_held", "w_waste"]].sum().reset_index()
    denom = out["run_id"].map(time) * out["run_id"].map(budget)
    out["held_frac"] = out["w_held"] / denom
    out["waste_frac"] = out["w_waste"] / denom
    return out[["run_id", "kind", "held_frac", "waste_frac"]]


def _num(value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan


def _waste_text(waste: pd.DataFrame, run_id: str) -> str:
    rows = waste[waste["run_id"] == run_id]
    return ", ".join(f"{r.kind} {r.waste_frac:.1%}" for r in rows.itertuples()) if len(rows) else "-"


def hybrid_table(runs: pd.DataFrame, steps: pd.DataFrame | None, groups: pd.DataFrame | None) -> pd.DataFrame:
    """One row per pair of ok runs differing only in ``hybrid_kv`` (module docstring); empty
    without one. Values are the first repetition's (``repeat`` 0 where there are several)."""
    if runs.empty or "hybrid_kv" not in runs or runs["hybrid_kv"].isna().all():
        return pd.DataFrame()
    ok = runs[(runs["status"] == OK) & runs["hybrid_kv"].notna()].sort_values("repeat", kind="stable")
    waste = waste_by_kind(ok, steps if steps is not None else pd.DataFrame(), groups)
    keys = [k for k in PAIR_KEYS if k in ok and k != "budget_bytes"] + ["budget_bytes"]
    contiguous = runs[(runs["status"] == OK) & runs["policy"].map(lambda p: is_contiguous(str(p)))]
    contiguous = contiguous.sort_values(["policy", "repeat"], kind="stable")
    rows = []
    for _, pair in ok.groupby(keys, sort=False, dropna=False):
        flags = pair["hybrid_kv"].map(bool)  # a column of bools (nulls dropped above)
        on, off = pair[flags], pair[~flags]
        if on.empty or off.empty:
            continue
        a, b = on.iloc[0], off.iloc[0]
        base = None if is_contiguous(str(a["policy"])) else _same_work(contiguous, a)
        rows.append(
            {
                "model": a["model"],
                "workload": a.get("workload"),
                "runner": a["runner"],
                "policy": a["policy"],
                "budget_bytes": a["budget_bytes"],
                "kv_groups_on": a["kv_groups"],
                "peak_running_on": _num(a["peak_running"]),
                "peak_running_off": _num(b["peak_running"]),
                "mean_running_on": _num(a["mean_running"]),
                "mean_running_off": _num(b["mean_running"]),
                "preemptions_on": _num(a["preemptions"]),
                "preemptions_off": _num(b["preemptions"]),
                "tokens_per_s_ratio": _num(a["tokens_per_s"]) / _num(b["tokens_per_s"]),
                "waste_on": _waste_text(waste, a["run_id"]),
                "waste_off": _waste_text(waste, b["run_id"]),
                "contiguous": None if base is None or base.empty else base["policy"].iloc[0],
                "paging_on": _paging(a, base, True),
                "paging_off": _paging(b, base, False),
            }
        )
    table = pd.DataFrame(rows)
    return table.sort_values(["model", "runner", "policy"], kind="stable").reset_index(drop=True) if rows else table


def _same_work(contiguous: pd.DataFrame, run: pd.Series) -> pd.DataFrame:
    """The contiguous runs of ``run``'s work, model, budget, runner and block size."""
    same = contiguous
    for key in ("workload_id", "model", "budget_bytes", "runner", "block_size"):
        same = same[same[key] == run[key]]
    return same


def _paging(paged: pd.Series, contiguous: pd.DataFrame | None, hybrid_kv: bool) -> float:
    """``paged``'s tokens per second over the first contiguous run with the same manager setting."""
    if contiguous is None:
        return math.nan
    same = contiguous[contiguous["hybrid_kv"].map(lambda v: v is not None and not pd.isna(v) and bool(v) == hybrid_kv)]
    return _num(paged["tokens_per_s"]) / _num(same["tokens_per_s"].iloc[0]) if len(same) else math.nan
