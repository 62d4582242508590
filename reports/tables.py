"""Summary tables: pure functions from the runs table to tables.

- ``summary``: one row per cell (comparison group × runner × policy × block
  size), repetitions collapsed to their median;
- ``ratios``: each cell's metrics over the baseline policy's, inside its
  comparison group and runner (same work, one variable);
- ``geomean``: those ratios across comparison groups, by geometric mean
  (never the arithmetic mean of ratios: it is not symmetric, 2× and 0.5× must
  cancel);
- ``mismatches``: what differs among runs a renderer puts side by side, so it
  can say so in red;
- ``published_vs_reproduced``: a reference table matched to the runs.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from ..harness.records.reference import SWEEP_METRICS
from ..harness.records.schema import ADDED_LATENCY_COLUMNS, OK
from ..harness.spec import identity
from .labels import CELL_KEYS, GROUP_KEYS, group_label
from .loading import REFERENCE_COLUMNS

# Per-cell metrics the summary keeps (medians over ok repetitions).
METRICS: tuple[str, ...] = (
    "token_states_frac",
    "reservation_frac",
    "internal_frag_frac",
    "external_frag_frac",
    "free_frac",
    "mean_running",
    "peak_running",
    "preemptions",
    "tokens_per_s",
    "wall_tokens_per_s",
    "mean_step_wall_s",
    "prefix_hit_rate",
    "recomputed_hit_tokens",
    "session_hit_rate_mean",
    "session_hit_rate_min",
    "evictions",
    "reuse_distance_p50_s",
    "ttft_p50_s",
    "ttft_p90_s",
    "latency_p50_s",
    "latency_p90_s",
    "tpot_p50_s",
    "tpot_p90_s",
    "normalized_latency_mean_s",
    "normalized_latency_p50_s",
    "normalized_latency_p90_s",
    *ADDED_LATENCY_COLUMNS,
    "goodput_rps",  # under the suite's SLO (harness.records.goodput), derived when the records are read
    "slo_met_frac",
)
# Ratios are taken only of metrics where higher is better and zero is not the norm.
RATIO_METRICS: tuple[str, ...] = ("mean_running", "peak_running", "tokens_per_s")
DEFAULT_BASELINE = "contiguous-max"
# Policies in the order tables list them: from the most to the least reserved.
POLICY_ORDER: tuple[str, ...] = (
    "contiguous-max",
    "contiguous-pow2",
    "contiguous-oracle",
    "virtual-contiguous",
    "paged",
    "paged-prefix",
)
# Groups are listed by model, precision, budget, then workload (a rate sweep in rate order).
GROUP_ORDER: tuple[str, ...] = (
    "model",
    "kv_dtype",
    "budget_bytes",
    "max_model_len",
    "family_label",
    "rate",
    "workload_id",
    "scheduler",
)
# What must be equal for runs to be "the same work", with the words a sentence uses for each
# (harness.spec.identity); the model is there because it sets bytes per token, hence positions
# for the same budget.
SAME_WORK: dict[str, str] = {k.column: k.label for k in identity.WORK}
# Inside a comparison group, ratios are to the baseline of the same runner on the same device.
RATIO_WITHIN: tuple[str, ...] = ("group", "runner", "device")


def summary(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per cell, in a stable order; metrics are medians over the cell's ok repetitions.

    ``runs`` must carry the derived keys of ``records.with_keys``. Columns:
    the group and cell keys, ``group`` (a number per comparison group, in
    order), ``group_label``, ``workload``, ``budget_positions``, ``clock``,
    ``repeats``, ``ok``, ``status``, ``error`` and ``METRICS``.
    """
    keys = list(GROUP_KEYS + CELL_KEYS)
    rows = []
    for key, cell in runs.groupby(keys, sort=True, dropna=False):
        ok = cell[cell["status"] == OK]
        # The run figures draw time series from: the first ok repetition.
        first = (ok if len(ok) else cell).sort_values("repeat", kind="stable").iloc[0]
        statuses = sorted(set(cell["status"]))
        row = dict(zip(keys, key))
        row.update(
            workload=first["workload"],
            workload_name=first.get("workload_name"),  # the suite's name for it: findings and titles say it
            family=first["family"],
            family_label=first["family_label"],
            rate=first.get("rate"),
            budget_positions=first.get("budget_positions"),
            clock=first.get("clock"),
            suite=first.get("suite"),
            repeats=len(cell),
            ok=len(ok),
            status=statuses[0] if len(statuses) == 1 else "/".join(statuses),
            error=next((e for e in cell["error"] if isinstance(e, str) and e), None),
            run_id=first["run_id"],
        )
        for m in METRICS:
            values = pd.to_numeric(ok[m], errors="coerce").dropna() if m in ok else pd.Series(dtype=float)
            row[m] = float(values.median()) if len(values) else math.nan
        rows.append(row)
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    table["_policy_order"] = table["policy"].map(policy_rank)
    table = table.sort_values(
        list(GROUP_ORDER) + ["runner", "_policy_order", "block_size", "device"], na_position="first"
    )
    table = table.drop(columns="_policy_order")
    groups = {k: i for i, k in enumerate(dict.fromkeys(map(tuple, table[list(GROUP_KEYS)].astype(str).values)))}
    table["group"] = [groups[tuple(v)] for v in table[list(GROUP_KEYS)].astype(str).values]
    table["group_label"] = [group_label(r) for r in table.to_dict("records")]
    return table.reset_index(drop=True)


def policy_rank(policy: str) -> int:
    """A policy's place in the tables' order (an unknown one last)."""
    return POLICY_ORDER.index(policy) if policy in POLICY_ORDER else len(POLICY_ORDER)


def finite(value: Any) -> bool:
    """A number that is neither NaN nor infinite (None, NA and text are not)."""
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def ratio_of(num: Any, den: Any) -> float:
    """num ÷ den, NaN where either is not finite or den is 0."""
    if not (finite(num) and finite(den)) or float(den) == 0:
        return math.nan
    return float(num) / float(den)


def ratios(
    cells: pd.DataFrame, baseline: str = DEFAULT_BASELINE, metrics: Sequence[str] = RATIO_METRICS
) -> pd.DataFrame:
    """``cells`` (from ``summary``) plus ``<metric>_x``: the cell over the baseline policy of its
    group, runner and device. NaN where that has no ok baseline, or the baseline is 0."""
    out = cells.copy()
    within = [c for c in RATIO_WITHIN if c in cells]
    base = cells[cells["policy"] == baseline].drop_duplicates(within).set_index(within)
    keys = list(zip(*(cells[c] for c in within)))
    for m in metrics:
        denom = [base[m].get(k, math.nan) for k in keys]
        with np.errstate(divide="ignore", invalid="ignore"):
            x = cells[m].to_numpy(dtype=float) / np.asarray(denom, dtype=float)
        out[f"{m}_x"] = np.where(np.isfinite(x), x, math.nan)
    return out


def geometric_mean(values: Iterable[float]) -> float:
    """Geometric mean of the positive finite values; NaN when there are none."""
    xs = [float(v) for v in values if v == v and v is not None and math.isfinite(v) and v > 0]
    if not xs:
        return math.nan
    product = math.prod(xs)
    if product == 0 or not math.isfinite(product):  # under/overflow: go through logs
        return math.exp(math.fsum(math.log(v) for v in xs) / len(xs))
    return product ** (1.0 / len(xs))


def geomean(ratio_table: pd.DataFrame, metrics: Sequence[str] = RATIO_METRICS) -> pd.DataFrame:
    """Per cell (runner, policy, block size, device, page size): the geometric mean of each
    ``<metric>_x`` over the comparison groups where it exists, with ``groups`` = how many groups
    each one spans. A cell with no ratio in any group (no baseline beside it) has no row."""
    rows = []
    keys = [k for k in CELL_KEYS if k in ratio_table]
    for key, sub in ratio_table.groupby(keys, sort=False, dropna=False):
        row: dict[str, object] = dict(zip(keys, key))
        for m in metrics:
            col = sub[f"{m}_x"].dropna()
            row[f"{m}_x"] = geometric_mean(col)
            row[f"{m}_groups"] = int(len(col))
        if any(row[f"{m}_groups"] for m in metrics):
            rows.append(row)
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    table["_o"] = table["policy"].map(policy_rank)
    return table.sort_values(["runner", "_o", "block_size"]).drop(columns="_o").reset_index(drop=True)


def mismatches(runs: pd.DataFrame, allow: Iterable[str] = ()) -> list[str]:
    """One sentence per 'same work' key on which ``runs`` differ (those in ``allow`` excepted).

    An empty list means the runs are comparable; renderers show any sentence as a
    red warning next to whatever puts these runs side by side.
    """
    allowed = set(allow)
    out = []
    for key, what in SAME_WORK.items():
        if key in allowed or key not in runs:
            continue
        if key == "scheduler":
            out += _scheduling_mismatches(runs[key].dropna(), what)
            continue
        values = sorted({str(v) for v in runs[key].dropna()})
        if len(values) > 1:
            out.append(f"not the same work: these runs differ in {what} ({key}: {_shown(values)})")
    return out


def _shown(values: list[str]) -> str:
    return ", ".join(values[:4]) + (f" and {len(values) - 4} more" if len(values) > 4 else "")


def _scheduling_mismatches(schedulers: pd.Series, what: str) -> list[str]:
    """The scheduling settings (``identity.scheduling_part``) on which the runs differ, in one
    sentence. Timing settings (the clock) are left to the Clocks section: a report sets an
    engine's measured steps beside sim on a profile fitted to them on purpose."""
    settings = [identity.scheduling_part(json.loads(s)) for s in set(schedulers) if isinstance(s, str)]
    names = sorted({k for d in settings for k in d})
    differ = []
    for k in names:
        values = sorted({str(d.get(k)) for d in settings})
        if len(values) > 1:
            differ.append(f"{k}: {_shown(values)}")
    return [f"not the same work: these runs differ in {what} ({'; '.join(differ)})"] if differ else []


def published_vs_reproduced(reference: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Each reference row beside the reproduced value of ``metric`` from every matching run
    (same suite, policy, and — when given — block size and workload id). With a
    ``baseline_policy`` the reproduced value is the ratio of ``metric`` to that of the
    baseline policy's run of the same runner on the same workload. A reference row no run
    matches is kept with ``reproduced`` NaN: missing is shown as missing, never filled in."""
    rows = []
    ok = runs[runs["status"] == OK]
    for ref in reference.to_dict("records"):
        if ref["metric"] in SWEEP_METRICS:
            continue  # a whole sweep's number: the capacity table sets it beside the published one
        match = ok[(ok["suite"] == ref["suite"]) & (ok["policy"] == ref["policy"])]
        bs = ref.get("block_size")
        if bs is not None and bs == bs:
            match = match[match["block_size"] == int(bs)]
        wid = ref.get("workload_id")
        if isinstance(wid, str) and wid:
            match = match[match["workload_id"] == wid]
        metric = ref["metric"]
        baseline = ref.get("baseline_policy")
        base = {k: ref.get(k) for k in REFERENCE_COLUMNS}
        base["basis"] = ref.get("basis") or "predicted"
        if isinstance(baseline, str) and baseline:
            base["metric"] = f"{metric} ÷ {baseline}"
        if metric not in runs.columns:
            rows.append(
                {
                    **base,
                    "runner": None,
                    "workload": None,
                    "run_id": None,
                    "reproduced": math.nan,
                    "problem": f"{metric!r} is not a runs column",
                }
            )
            continue
        if match.empty:
            rows.append(
                {
                    **base,
                    "runner": None,
                    "workload": None,
                    "run_id": None,
                    "reproduced": math.nan,
                    "problem": "no matching ok run",
                }
            )
            continue
        for r in match.to_dict("records"):
            value = float(pd.to_numeric(pd.Series([r.get(metric)]), errors="coerce").iloc[0])
            problem = None
            if isinstance(baseline, str) and baseline:
                peers = ok[
                    (ok["suite"] == r["suite"])
                    & (ok["runner"] == r["runner"])
                    & (ok["workload_id"] == r["workload_id"])
                    & (ok["policy"] == baseline)
                ]
                denom = float(pd.to_numeric(peers[metric], errors="coerce").median()) if len(peers) else math.nan
                if denom == denom and denom != 0:
                    value = value / denom
                else:
                    value, problem = math.nan, f"no ok {baseline} run on the same workload"
            rows.append(
                {
                    **base,
                    "runner": r["runner"],
                    "workload": r.get("workload"),
                    "run_id": r["run_id"],
                    "reproduced": value,
                    "problem": problem,
                }
            )
    return pd.DataFrame(
        rows, columns=[*REFERENCE_COLUMNS, "basis", "runner", "workload", "run_id", "reproduced", "problem"]
    )
