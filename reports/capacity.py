"""Capacity at an SLO: the highest request rate each policy serves within latency bounds.

Pure functions over run rows (``records.with_keys``, with ``goodput.with_goodput``'s columns)
and a suite's SLO (``harness.records.slo``). A *line* is one policy's runs over a rate sweep:
the same work but for the arrival rate (``family`` is the workload without its rate), the same
cell (runner, policy, block size, device, page size, arena). Along a line, at each rate, each
bounded metric's median over repetitions is compared with its bound (and the median share of
requests within every bound with a goodput floor; ``goodput.within_slo``):

- capacity: the highest swept rate at which every bound holds, and held at every
  lower rate of the line (latency is taken to rise with the rate; the first rate
  over a bound ends the line's capacity, so a lucky point beyond it does not count);
- next: the lowest rate over a bound (None when every rate is within them);
  the true capacity lies in [capacity, next): the sweep's resolution. ``kvbench
  run`` with ``[slo] refine`` narrows that bracket by bisection (more runs at rates between);
- binding: which bound limits the capacity (``capacity_table``).

``capacity_ratios`` sets each policy's capacity over another's on the same line
key: paged ÷ contiguous-max is how much more traffic paging serves within the SLO.
A capacity that is only a bound (every rate within, or none) makes the ratio a
bound too, and says so (``kind``: "=", "≥" or "≤").
"""

from __future__ import annotations

import math

import pandas as pd

from ..harness.records.goodput import FLOOR, Bounds, pressure, suite_bounds, within_slo
from ..harness.records.schema import OK
from ..harness.spec.capabilities import is_contiguous

# Everything a line holds fixed but the rate (the work without its rate, and the cell).
LINE_KEYS: tuple[str, ...] = (
    "suite",
    "family",
    "model",
    "kv_dtype",
    "budget_bytes",
    "max_model_len",
    "scheduler",
    "runner",
    "policy",
    "block_size",
    "device",
    "page_bytes",
    "arena",
)
PAIR_KEYS: tuple[str, ...] = tuple(k for k in LINE_KEYS if k not in ("policy", "block_size", "page_bytes", "arena"))
COLUMNS: tuple[str, ...] = (
    *LINE_KEYS,
    "family_label",
    "slo",
    "metric",
    "bound",
    "rates",
    "capacity_rps",
    "next_rps",
    "status",
    "metric_at_capacity",
    "binding",
    "goodput_at_capacity_rps",
    "slo_met_frac_at_capacity",
    "run_id",
    "setup",
)


def setup_label(model: object, scheduler: object) -> str:
    """The model and, where above 1, its tensor / pipeline parallel size: ``opt-66b TP 4``."""
    from .labels import scheduler_settings

    settings = scheduler_settings(scheduler)
    label = str(model)
    for key, short in (("tensor_parallel_size", "TP"), ("pipeline_parallel_size", "PP")):
        size = settings.get(key, 1)
        if isinstance(size, int) and size > 1:
            label += f" {short} {size}"
    return label


def _key(value: object) -> object:
    # None and NaN group together (a paged run has no arena; a contiguous one no page size).
    return "∅" if value is None or (isinstance(value, float) and math.isnan(value)) else value


def bound_label(column: str, bound: float) -> str:
    return f"{FLOOR} ≥ {bound:g}" if column == FLOOR else f"{column} ≤ {bound:g}"


def slo_label(bounds: Bounds, floor: float | None) -> str:
    """The whole SLO in one line: ``ttft_p99_s ≤ 2, tpot_p99_s ≤ 0.2``."""
    return ", ".join([bound_label(c, b) for c, b in bounds] + ([bound_label(FLOOR, floor)] if floor else []))


def binding_bound(over: dict[str, float]) -> str:
    """The bound pressing hardest (highest value ÷ bound; the first on a tie)."""
    return max(over, key=lambda k: over[k])


def capacity_table(runs: pd.DataFrame, slo: pd.DataFrame) -> pd.DataFrame:
    """One row per (suite's SLO, line) with two or more rates; empty when none.

    ``slo``: ``slo.parquet``'s rows, one per bound (``harness.records.slo``); a goodput floor
    reads ``slo_met_frac`` (``harness.records.goodput.with_goodput``). ``binding``: the bound the
    next rate fails by the most (value ÷ bound); when every rate is within, the one with the
    least slack at capacity. ``metric``, ``bound`` and ``metric_at_capacity`` are the binding
    bound's."""
    rows = []
    ok = runs[(runs["status"] == OK) & runs["rate"].notna()] if len(runs) else runs
    for suite, (bounds, floor) in suite_bounds(slo).items():
        mine = ok[ok["suite"] == suite] if len(ok) else ok
        if mine.empty or any(c not in mine or mine[c].isna().all() for c, _ in bounds):
            continue  # a bound on a column these runs do not hold (recorded before it existed)
        columns = [c for c, _ in bounds] + ([FLOOR] if floor is not None and FLOOR in mine else [])
        limits = dict(bounds, **({FLOOR: floor} if floor is not None else {}))
        keyed = mine.assign(**{f"_{k}": [_key(v) for v in mine[k]] for k in LINE_KEYS})
        for _, line in keyed.groupby([f"_{k}" for k in LINE_KEYS], sort=True, dropna=False):
            numeric = line[["rate"]].assign(**{c: pd.to_numeric(line[c], errors="coerce") for c in columns})
            if "goodput_rps" in line:
                numeric["goodput_rps"] = pd.to_numeric(line["goodput_rps"], errors="coerce")
            per_rate = numeric.groupby("rate").median().sort_index()
            if len(per_rate) < 2:
                continue
            capacity = next_rate = math.nan
            at_capacity: dict[str, float] = {}
            over: dict[str, float] = {}
            for rate, medians in per_rate.iterrows():
                values = medians.to_dict()
                if not within_slo(values, bounds, floor):  # NaN (nothing finished) counts as over
                    next_rate, over = float(rate), pressure(values, bounds, floor)
                    break
                capacity, at_capacity = float(rate), values
            binding = binding_bound(over if over else pressure(at_capacity, bounds, floor))
            status = (
                "below the lowest rate"
                if math.isnan(capacity)
                else "at or above the highest rate"
                if math.isnan(next_rate)
                else "within the sweep"
            )
            first = line.iloc[0]
            rows.append(
                {
                    **{k: first[k] for k in LINE_KEYS},
                    "family_label": first["family_label"],
                    "slo": slo_label(bounds, floor),
                    "metric": binding,
                    "bound": limits[binding],
                    "rates": len(per_rate),
                    "capacity_rps": capacity,
                    "next_rps": next_rate,
                    "status": status,
                    "metric_at_capacity": at_capacity.get(binding, math.nan),
                    "binding": bound_label(binding, limits[binding]),
                    "goodput_at_capacity_rps": at_capacity.get("goodput_rps", math.nan),
                    "slo_met_frac_at_capacity": at_capacity.get(FLOOR, math.nan),
                    "run_id": line.sort_values("rate").iloc[0]["run_id"],
                    "setup": setup_label(first["model"], first["scheduler"]),
                }
            )  # a run of the line: its spec
    return pd.DataFrame(rows, columns=list(COLUMNS))


def goodput_table(runs: pd.DataFrame, slo: pd.DataFrame) -> pd.DataFrame:
    """Each ok run of a rate sweep under an SLO: its goodput, its share of requests within every
    bound, and whether the run is within the SLO; by line and rate."""
    cols = [*LINE_KEYS, "family_label", "rate", "goodput_rps", "slo_met_frac", "within", "run_id"]
    rows = []
    ok = runs[(runs["status"] == OK) & runs["rate"].notna()] if len(runs) else runs
    for suite, (bounds, floor) in suite_bounds(slo).items():
        mine = ok[ok["suite"] == suite] if len(ok) else ok
        for r in mine.to_dict("records"):
            rows.append(
                {
                    **{k: r.get(k) for k in cols if k != "within"},
                    "within": "yes" if within_slo(r, bounds, floor) else "no",
                }
            )
    table = pd.DataFrame(rows, columns=cols)
    return table.sort_values(["suite", "family", "runner", "policy", "block_size", "rate"]) if len(table) else table


def capacity_ratios(table: pd.DataFrame, numerator: str = "paged") -> pd.DataFrame:
    """``numerator``'s capacity over each contiguous policy's on the same line key, with what kind of
    number it is: "=" (both within their sweeps), "≥" or "≤" (a capacity is only a bound), or "?"."""
    out = []
    if table.empty:
        return pd.DataFrame(
            columns=[
                "suite",
                "family",
                "family_label",
                "runner",
                "policy",
                "baseline",
                "ratio",
                "kind",
                "capacity_rps",
                "baseline_capacity_rps",
            ]
        )
    for _, group in table.groupby([c for c in PAIR_KEYS], sort=True, dropna=False):
        tops = group[group["policy"] == numerator]
        if tops.empty:
            continue
        top = tops.sort_values("block_size").iloc[0]  # several block sizes: the smallest, as the paper's 16
        for base in group[group["policy"].map(is_contiguous)].to_dict("records"):
            out.append(
                {
                    "suite": top["suite"],
                    "family": top["family"],
                    "family_label": top["family_label"],
                    "runner": top["runner"],
                    "policy": numerator,
                    "baseline": base["policy"],
                    "capacity_rps": top["capacity_rps"],
                    "baseline_capacity_rps": base["capacity_rps"],
                    "setup": top.get("setup"),
                    **_ratio(top, base),
                }
            )
    return pd.DataFrame(out)


def _ratio(top: pd.Series, base: dict) -> dict[str, object]:
    a, b = float(top["capacity_rps"]), float(base["capacity_rps"])
    a_floor = top["status"] == "at or above the highest rate"  # a is at least this
    b_floor = base["status"] == "at or above the highest rate"
    if math.isnan(a) or math.isnan(b) or b == 0:
        return {"ratio": math.nan, "kind": "?"}
    kind = (
        "="
        if not a_floor and not b_floor
        else "≥"
        if a_floor and not b_floor
        else "≤"
        if b_floor and not a_floor
        else "?"
    )
    return {"ratio": a / b, "kind": kind}


def capacity_vs_published(ratios: pd.DataFrame, reference: pd.DataFrame | None, runs: pd.DataFrame) -> pd.DataFrame:
    """Each published capacity ratio (reference rows of metric ``capacity_rps``, a value or a
    range) beside the reproduced ratio of the line it names (its suite, policy, baseline and
    workload — any rate of the workload names the sweep); ``off``: the relative distance from
    the published value or range (0 inside it), NaN where nothing matched."""
    cols = [
        "item",
        "policy",
        "baseline",
        "published",
        "published_max",
        "reproduced",
        "kind",
        "off",
        "runner",
        "basis",
        "source",
        "note",
        "setup",
    ]
    if reference is None or reference.empty or "metric" not in reference:
        return pd.DataFrame(columns=cols)
    wanted = reference[reference["metric"] == "capacity_rps"]
    family_of = dict(zip(runs["workload_id"], runs["family"])) if len(runs) else {}
    out = []
    for ref in wanted.to_dict("records"):
        fam = family_of.get(ref.get("workload_id"))
        match = (
            ratios[
                (ratios["suite"] == ref["suite"])
                & (ratios["policy"] == ref["policy"])
                & (ratios["baseline"] == ref["baseline_policy"])
            ]
            if len(ratios)
            else ratios
        )
        if fam is not None and len(match):
            match = match[match["family"] == fam]
        low = float(ref["published"])
        high = ref.get("published_max")
        high = low if high is None or high != high else float(high)
        base = {
            "item": ref["item"],
            "policy": ref["policy"],
            "baseline": ref["baseline_policy"],
            "published": low,
            "published_max": high if high != low else math.nan,
            "basis": ref.get("basis") or "predicted",
            "source": ref.get("source"),
            "note": ref.get("note"),
        }
        if match.empty:
            out.append({**base, "reproduced": math.nan, "kind": "?", "off": math.nan, "runner": None, "setup": None})
            continue
        for r in match.to_dict("records"):
            x = float(r["ratio"])
            off = 0.0 if low <= x <= high else (x / high - 1 if x > high else x / low - 1)
            out.append(
                {
                    **base,
                    "reproduced": x,
                    "kind": r["kind"],
                    "off": off if x == x else math.nan,
                    "runner": r["runner"],
                    "setup": r.get("setup"),
                }
            )
    return pd.DataFrame(out, columns=cols)
