"""The CPU tier: what a CPU tier of KV memory (vLLM's native KV offloading) gives back on the same work.

For every comparison group in which some ok run has a CPU tier: one row per ``paged-prefix`` cell
(with a tier or without) and per contiguous cell, each read from its first ok repetition's
records (the run row, its steps and its requests): preemptions; recomputed tokens (tokens
computed again after a preemption: ``computed_tokens`` − Σ over its requests of
``prompt_len`` − ``prefix_hit_tokens`` + ``output_len`` − 1, the work each request does once;
null where a request did not finish); GPU hit tokens (Σ ``prefix_hit_tokens`` +
``recomputed_hit_tokens`` − ``cpu_hit_tokens``: every admission's, as vLLM counts hits) and CPU hit
tokens (Σ ``cpu_hit_tokens``); ``computed_tokens`` and its change against the ``paged-prefix``
cell without a tier of the same runner and block size; the bytes stored to and loaded from the
tier (Σ ``stored_blocks`` and ``loaded_blocks`` over steps × one block's bytes: ``block_size`` ×
``kv_bytes_per_token``, over KV cache groups ``kv_bytes_per_block``); ``tokens_per_s`` and
``ttft_p50_s`` on the run's clock. ``answer``
says what the largest tier did, and where CPU hit tokens do not rise with the tier's size.
A pure function of the records; html.py, markdown.py and figures.py show it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

from ..harness.spec.capabilities import is_contiguous
from ..harness.spec.units import format_bytes
from .display import Column, ColumnSet, format_time, throughput_unit
from .labels import CELL_KEYS, tier_bytes
from .tables import finite, policy_rank

TITLE = "CPU tier"
EVICTION_NAMES = {"lru": "LRU", "arc": "ARC"}
NO_TIER, NO_POLICY = "none", "—"
# What a row shares with the run it is set against: the cell but its policy and tier.
SAME_CELL: tuple[str, ...] = tuple(k for k in CELL_KEYS if k not in ("policy", "cpu_offload_bytes", "offload_policy"))
COLUMNS: tuple[Column, ...] = (
    ("runner", "runner", "text"),
    ("policy", "policy", "text"),
    ("block_size", "block", "block"),
    ("tier", "CPU tier", "text"),
    ("eviction", "CPU tier policy", "text"),
    ("preemptions", "preemptions", "f0"),
    ("recomputed_tokens", "recomputed tokens", "f0"),
    ("gpu_hit_tokens", "GPU hit tokens", "f0"),
    ("cpu_hit_tokens", "CPU hit tokens", "f0"),
    ("computed_tokens", "computed tokens", "f0"),
    ("computed_change", "computed vs no tier", "err"),
    ("stored_bytes", "stored to CPU", "bytes"),
    ("loaded_bytes", "loaded from CPU", "bytes"),
    ("tokens_per_s", "tokens/s", "f1"),
    ("ttft_p50_s", "TTFT p50", "time"),
)
KEYS: tuple[str, ...] = ("runner", "policy", "block_size", "tier", "eviction")
SETS: tuple[ColumnSet, ...] = (
    (
        "Tokens",
        (
            "preemptions",
            "recomputed_tokens",
            "gpu_hit_tokens",
            "cpu_hit_tokens",
            "computed_tokens",
            "computed_change",
        ),
    ),
    ("Transfers, throughput and latency", ("stored_bytes", "loaded_bytes", "tokens_per_s", "ttft_p50_s")),
)
NOTE = (
    "Per comparison group with a CPU tier of KV memory (vLLM's native KV offloading): paged-prefix with each "
    "tier and without one, and the contiguous policies, on the same work; each row is one run's records (the "
    "first ok repetition). Recomputed tokens: tokens computed again after a preemption (computed tokens less "
    "the work each request does once: its prompt less its first admission's hits, and its output less one). "
    "GPU hit tokens: tokens found in the GPU's prefix cache at any admission (a preempted request's own blocks "
    "included); CPU hit tokens: tokens loaded from the CPU tier instead of computed. Computed tokens: tokens "
    "the model ran, against paged-prefix without a tier of the same runner and block size. Stored to / loaded "
    "from CPU: blocks copied each way × the bytes of a block. Tokens/s and TTFT p50 are on the run's clock."
)


@dataclasses.dataclass(frozen=True)
class CpuTier:
    """The section: ``table`` has one row per cell shown (module docstring), ``answers`` the
    sentences of each comparison group (its number in the report's cells, 0-based)."""

    table: pd.DataFrame = dataclasses.field(default_factory=pd.DataFrame)
    answers: dict[int, tuple[str, ...]] = dataclasses.field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.table)


def eviction_name(tier: int, policy: Any) -> str:
    return EVICTION_NAMES.get(str(policy), str(policy)) if tier and isinstance(policy, str) else NO_POLICY


def _sum(frame: pd.DataFrame, column: str) -> pd.Series:
    """Per run_id, the sum of ``column``; NaN where every value is null (or the column is absent)."""
    if frame.empty or column not in frame:
        return pd.Series(dtype=float)
    return pd.to_numeric(frame[column], errors="coerce").groupby(frame["run_id"]).sum(min_count=1)


def _request_sums(requests: pd.DataFrame) -> pd.DataFrame:
    """Per run_id: hit tokens by tier, the work each request does once, and whether all finished."""
    cols = ("prompt_len", "output_len", "prefix_hit_tokens", "recomputed_hit_tokens")
    if requests is None or requests.empty or any(c not in requests for c in cols):
        return pd.DataFrame(columns=["gpu_hit_tokens", "cpu_hit_tokens", "once_tokens", "unfinished"])
    q = requests
    cpu = pd.to_numeric(q["cpu_hit_tokens"], errors="coerce").fillna(0) if "cpu_hit_tokens" in q else 0
    frame = pd.DataFrame(
        {
            "run_id": q["run_id"],
            "gpu_hit_tokens": q["prefix_hit_tokens"] + q["recomputed_hit_tokens"] - cpu,
            "cpu_hit_tokens": cpu,
            "once_tokens": q["prompt_len"] - q["prefix_hit_tokens"] + (q["output_len"] - 1).clip(lower=0),
            "unfinished": (q["status"] != "finished") if "status" in q else False,
        }
    )
    return frame.groupby("run_id").sum()


def cpu_tier_table(
    cells: pd.DataFrame, runs: pd.DataFrame, steps: pd.DataFrame | None, requests: pd.DataFrame | None
) -> pd.DataFrame:
    """One row per cell shown (module docstring), by group, runner, policy (the report's order),
    block size and tier; empty when no ok run has a CPU tier. ``cells`` is ``tables.summary``'s
    (its ``run_id``: the first ok repetition)."""
    if cells.empty or "cpu_offload_bytes" not in cells or "run_id" not in cells:
        return pd.DataFrame()
    ok = cells[cells["ok"] > 0].assign(tier_bytes=lambda c: c["cpu_offload_bytes"].map(tier_bytes))
    tiered = set(ok.loc[ok["tier_bytes"] > 0, "group"])
    if not tiered:
        return pd.DataFrame()
    kept = [p == "paged-prefix" or is_contiguous(str(p)) for p in ok["policy"]]
    shown = ok[ok["group"].isin(tiered) & pd.Series(kept, index=ok.index, dtype=bool)]
    by_id = runs.drop_duplicates("run_id").set_index("run_id")
    ids = shown["run_id"]
    steps = steps if steps is not None else pd.DataFrame()
    mine = steps[steps["run_id"].isin(set(ids))] if len(steps) else steps
    stored, loaded = _sum(mine, "stored_blocks"), _sum(mine, "loaded_blocks")
    reqs = requests[requests["run_id"].isin(set(ids))] if requests is not None and len(requests) else requests
    sums = _request_sums(reqs if reqs is not None else pd.DataFrame())
    rows = []
    for cell in shown.to_dict("records"):
        rid = cell["run_id"]
        run = by_id.loc[rid]
        # A block moved is one block id's bytes: over KV cache groups one group's (``kv_bytes_per_block``).
        per_block = run.get("kv_bytes_per_block")
        block_bytes = (
            float(per_block) if finite(per_block) else float(run["block_size"]) * float(run["kv_bytes_per_token"])
        )
        computed = float(run["computed_tokens"])
        has = rid in sums.index
        recomputed = computed - float(sums.at[rid, "once_tokens"]) if has else math.nan
        rows.append(
            {
                **{k: cell.get(k) for k in ("group", "workload", *SAME_CELL, "policy", "clock")},
                "cpu_offload_bytes": cell["tier_bytes"],
                "offload_policy": cell.get("offload_policy") if cell["tier_bytes"] else None,
                "tier": format_bytes(cell["tier_bytes"]) if cell["tier_bytes"] else NO_TIER,
                "eviction": eviction_name(cell["tier_bytes"], cell.get("offload_policy")),
                "cpu_blocks": int(run["cpu_blocks"]) if finite(run.get("cpu_blocks")) else 0,
                "block_bytes": block_bytes,
                "preemptions": float(run["preemptions"]),
                "recomputed_tokens": recomputed if has and not sums.at[rid, "unfinished"] else math.nan,
                "gpu_hit_tokens": float(sums.at[rid, "gpu_hit_tokens"]) if has else math.nan,
                "cpu_hit_tokens": float(sums.at[rid, "cpu_hit_tokens"]) if has else math.nan,
                "computed_tokens": computed,
                "stored_bytes": float(stored.get(rid, math.nan)) * block_bytes,
                "loaded_bytes": float(loaded.get(rid, math.nan)) * block_bytes,
                "tokens_per_s": float(run["tokens_per_s"]),
                "ttft_p50_s": float(run["ttft_p50_s"]) if finite(run.get("ttft_p50_s")) else math.nan,
                "run_id": rid,
            }
        )
    table = pd.DataFrame(rows)
    table["computed_change"] = [_change(table, r) for r in table.to_dict("records")]
    order = table.assign(rank=table["policy"].map(policy_rank))
    order = order.sort_values(["group", "runner", "rank", "block_size", "cpu_offload_bytes", "eviction"], kind="stable")
    return table.loc[order.index].reset_index(drop=True)


def _same_cell(table: pd.DataFrame, row: dict[str, Any]) -> pd.Series:
    """Rows of ``row``'s group and cell but its policy and tier (nulls equal to nulls)."""
    keep = table["group"] == row["group"]
    for key in SAME_CELL:
        value = row.get(key)
        keep &= table[key].isna() if pd.isna(value) else table[key] == value
    return keep


def no_tier_row(table: pd.DataFrame, row: dict[str, Any]) -> dict[str, Any] | None:
    """The ``paged-prefix`` row without a tier that ``row`` is set against; None where none ran."""
    base = table[_same_cell(table, row) & (table["policy"] == "paged-prefix") & (table["cpu_offload_bytes"] == 0)]
    return base.iloc[0].to_dict() if len(base) else None


def _change(table: pd.DataFrame, row: dict[str, Any]) -> float:
    """``row``'s computed tokens against paged-prefix without a tier, as a fraction (NaN for that run
    itself, for a contiguous policy and where no such run exists)."""
    if row["policy"] != "paged-prefix" or not row["cpu_offload_bytes"]:
        return math.nan
    base = no_tier_row(table, row)
    if base is None or not base["computed_tokens"]:
        return math.nan
    return row["computed_tokens"] / base["computed_tokens"] - 1


def _tokens(value: float) -> str:
    return f"{value:,.0f}" if finite(value) else "-"


def largest_tier_sentence(tiered: pd.DataFrame, base: dict[str, Any] | None) -> str:
    """What the largest tier did: its CPU hit tokens and computed tokens against no tier (its best
    eviction policy first, by computed tokens, then the others in a clause)."""
    size = tiered["cpu_offload_bytes"].max()
    at = tiered[tiered["cpu_offload_bytes"] == size].sort_values(["computed_tokens", "eviction"], kind="stable")
    best, rest = at.iloc[0], at.iloc[1:]
    text = f"A {best['tier']} CPU tier ({best['eviction']}) served {_tokens(best['cpu_hit_tokens'])} tokens from CPU"
    if base is None or not finite(best["computed_change"]):
        text += (
            f" and computed {_tokens(best['computed_tokens'])} tokens (no paged-prefix run without a tier on "
            "this work to set them against)"
        )
    else:
        change = best["computed_change"]
        verb = "cut computed tokens by" if change < 0 else "raised computed tokens by"
        clock = base.get("clock")
        ttft = (
            f"; TTFT p50 {format_time(base['ttft_p50_s'], clock)} → {format_time(best['ttft_p50_s'], clock)}"
            if finite(base["ttft_p50_s"]) and finite(best["ttft_p50_s"])
            else ""
        )
        text += (
            f" and {verb} {abs(change):.1%} against no tier "
            f"({_tokens(base['computed_tokens'])} → {_tokens(best['computed_tokens'])}{ttft})"
            if change
            else " and left computed tokens as they were without a tier"
        )
    others = [
        f"{r['eviction']} at {r['tier']}: {_tokens(r['cpu_hit_tokens'])} tokens from CPU"
        + (f", computed tokens {r['computed_change']:+.1%}" if finite(r["computed_change"]) else "")
        for r in rest.to_dict("records")
    ]
    return text + "".join(f"; {o}" for o in others) + "."


def flat_sentences(tiered: pd.DataFrame, base: dict[str, Any] | None) -> list[str]:
    """Per eviction policy, where CPU hit tokens do not rise from one tier size to the next larger
    (from no tier, at 0, where that ran), and why where it is plain: a tier that holds no block."""
    out = []
    for eviction, series in tiered.groupby("eviction", sort=True):
        series = series.sort_values("cpu_offload_bytes")
        points = [(NO_TIER, 0.0)] if base is not None else []
        points += [(r["tier"], float(r["cpu_hit_tokens"])) for r in series.to_dict("records")]
        if all(b > a for (_, a), (_, b) in zip(points, points[1:])):
            continue
        text = f"Under {eviction}, CPU hit tokens do not rise with the tier's size: " + ", ".join(
            f"{_tokens(hits)} at {tier}" for tier, hits in points
        )
        empty = [r for r in series.to_dict("records") if r["cpu_blocks"] == 0]
        if empty:
            text += "; " + "; ".join(
                f"a {r['tier']} tier holds no block (one block is {format_bytes(r['block_bytes'])}), so it can "
                "serve nothing"
                for r in empty
            )
        out.append(text + ".")
    return out


def answer(group: pd.DataFrame) -> list[str]:
    """A group's sentences: per runner and block size (named where the group holds several), the
    largest tier's effect, then where CPU hit tokens do not rise with the tier's size."""
    paged = group[group["policy"] == "paged-prefix"]
    lines = list(paged.groupby(list(SAME_CELL), sort=False, dropna=False))
    out = []
    for _, line in lines:
        tiered = line[line["cpu_offload_bytes"] > 0]
        if tiered.empty:
            continue
        base = no_tier_row(group, tiered.iloc[0].to_dict())
        said = [largest_tier_sentence(tiered, base), *flat_sentences(tiered, base)]
        if len(lines) > 1:
            first = tiered.iloc[0]
            said[0] = f"{first['runner']}, block {first['block_size']}: {said[0]}"
        out += said
    return out


def cpu_tier(
    cells: pd.DataFrame, runs: pd.DataFrame, steps: pd.DataFrame | None, requests: pd.DataFrame | None
) -> CpuTier:
    """The section (``cpu_tier_table`` and each group's ``answer``); empty without a CPU tier."""
    table = cpu_tier_table(cells, runs, steps, requests)
    if table.empty:
        return CpuTier()
    answers = {int(g): tuple(answer(sub)) for g, sub in table.groupby("group", sort=True)}
    return CpuTier(table, answers)


def columns(table: pd.DataFrame) -> list[Column]:
    """``COLUMNS``, throughput in tokens/step under the steps clock."""
    unit = throughput_unit(set(table["clock"]))
    return [(k, unit if k == "tokens_per_s" else h, kind) for k, h, kind in COLUMNS]


def groups(section: CpuTier) -> Sequence[tuple[int, tuple[str, ...], pd.DataFrame]]:
    """What a renderer lays out, per group in order: its number, its sentences and its rows."""
    return [(int(g), section.answers.get(int(g), ()), sub) for g, sub in section.table.groupby("group", sort=True)]
