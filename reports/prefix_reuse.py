"""Prefix reuse against KV budget: what content-addressed sharing buys at each budget.

For every line of cells that differ only in budget and policy (same work otherwise, same
runner, no CPU tier: ``cpu_tier`` reads those), and every budget at which ``paged-prefix``
ran: its hit rate (first admissions only; a preempted request's hits on its own
recomputation are counted apart), the
conversations' hit rates, evictions, how long reused blocks waited, its throughput against
``paged`` at the same budget, and the smallest swept budget at which a contiguous policy (no
sharing) reaches the same throughput. A pure function of the cell table; the renderers show it.
"""

from __future__ import annotations

import math

import pandas as pd

from ..harness.spec.capabilities import is_contiguous
from ..harness.spec.units import format_bytes
from .labels import GROUP_KEYS, tier_bytes

# Everything that makes two cells the same work but the budget (a budget sweep is one line).
LINE_KEYS: tuple[str, ...] = (*(k for k in GROUP_KEYS if k != "budget_bytes"), "runner")


def _num(value: object) -> float:
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan
    return v


def prefix_reuse_table(cells: pd.DataFrame) -> pd.DataFrame:
    """One row per ``paged-prefix`` cell (module docstring); empty without one."""
    if cells.empty or "paged-prefix" not in set(cells["policy"]):
        return pd.DataFrame()
    keys = [k for k in LINE_KEYS if k in cells]
    rows = []
    for _, line in cells.groupby(keys, sort=False, dropna=False):
        ok = line[line["ok"] > 0]
        if "cpu_offload_bytes" in ok:  # one tier, the GPU's: runs with a CPU tier have their own section
            ok = ok[ok["cpu_offload_bytes"].map(tier_bytes) == 0]
        contiguous = ok[[is_contiguous(str(p)) for p in ok["policy"]]]
        for r in ok[ok["policy"] == "paged-prefix"].to_dict("records"):
            budget = r["budget_bytes"]
            paged = ok[
                (ok["policy"] == "paged") & (ok["budget_bytes"] == budget) & (ok["block_size"] == r["block_size"])
            ]
            paged_tps = _num(paged["tokens_per_s"].iloc[0]) if len(paged) else math.nan
            tps = _num(r["tokens_per_s"])
            enough = contiguous[pd.to_numeric(contiguous["tokens_per_s"], errors="coerce") >= tps]
            rows.append(
                {
                    "workload": r["workload"],
                    "runner": r["runner"],
                    "block_size": r["block_size"],
                    "budget_bytes": budget,
                    "prefix_hit_rate": _num(r.get("prefix_hit_rate")),
                    "recomputed_hit_tokens": _num(r.get("recomputed_hit_tokens")),
                    "session_hit_rate_mean": _num(r.get("session_hit_rate_mean")),
                    "session_hit_rate_min": _num(r.get("session_hit_rate_min")),
                    "evictions": _num(r.get("evictions")),
                    "reuse_distance_p50_s": _num(r.get("reuse_distance_p50_s")),
                    "tokens_per_s": tps,
                    "paged_tokens_per_s": paged_tps,
                    "prefix_over_paged": tps / paged_tps if paged_tps > 0 else math.nan,
                    "contiguous_budget_bytes": float(enough["budget_bytes"].min()) if len(enough) else math.nan,
                    "contiguous_note": _contiguous_note(contiguous, enough),
                }
            )
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    return table.sort_values(["workload", "runner", "block_size", "budget_bytes"], kind="stable").reset_index(drop=True)


def _contiguous_note(contiguous: pd.DataFrame, enough: pd.DataFrame) -> str:
    if contiguous.empty:
        return "no contiguous policy ran on this work"
    if enough.empty:
        return f"not reached at any budget swept (largest {format_bytes(int(contiguous['budget_bytes'].max()))})"
    best = enough.sort_values("budget_bytes").iloc[0]
    return f"{best['policy']}"
