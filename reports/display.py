"""What the report tables show and how numbers print: shared by the Markdown and HTML renderers."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

from ..harness.clock.fit import DISTURBED_RATIO, DISTURBED_WARN
from ..harness.spec.capabilities import MEASURING_RUNNERS, is_contiguous

Column = tuple[str, str, str]  # (key, header, kind)
# Kinds shown as words (left-aligned); every other kind is a number.
TEXT_KINDS = ("text", "onoff", "id", "workload", "note")
SIMULATED = ("sim", "vllm-sched")  # runners with no runtime computing tensors

CELL_COLUMNS: tuple[Column, ...] = (
    ("runner", "runner", "text"),
    ("policy", "policy", "text"),
    ("block_size", "block", "block"),
    ("device", "device", "text"),  # these two only where they differ (VARYING_ONLY)
    ("arena", "arena", "text"),
    ("hybrid_kv", "hybrid KV", "onoff"),
    ("cpu_offload_bytes", "CPU tier", "bytes"),
    ("offload_policy", "CPU tier policy", "text"),
    ("status", "status", "text"),
    ("token_states_frac", "token states %", "pct"),
    ("reservation_frac", "reservation %", "pct"),
    ("internal_frag_frac", "internal frag %", "pct"),
    ("external_frag_frac", "external frag %", "pct"),
    ("mean_running", "mean running", "f1"),
    ("peak_running", "peak running", "int"),
    ("preemptions", "preemptions", "int"),
    ("tokens_per_s", "tokens/s", "f1"),
    ("wall_tokens_per_s", "wall tokens/s", "wall"),
    ("ttft_p50_s", "TTFT p50", "time"),
    ("latency_p50_s", "latency p50", "time"),
    ("latency_p90_s", "latency p90", "time"),
    ("mean_running_x", "× mean running", "ratio"),
    ("peak_running_x", "× peak running", "ratio"),
    ("tokens_per_s_x", "× tokens/s", "ratio"),
    ("repeats", "runs", "int"),
)
GEOMEAN_COLUMNS: tuple[Column, ...] = (
    ("runner", "runner", "text"),
    ("policy", "policy", "text"),
    ("block_size", "block", "block"),
    ("device", "device", "text"),  # these two only where they differ (VARYING_ONLY), as in the cell table
    ("arena", "arena", "text"),
    ("hybrid_kv", "hybrid KV", "onoff"),  # where it varies: cells of one model, manager on and off, are two rows
    ("cpu_offload_bytes", "CPU tier", "bytes"),  # where it varies, as in the cell table
    ("offload_policy", "CPU tier policy", "text"),
    ("mean_running_x", "× mean running", "ratio"),
    ("peak_running_x", "× peak running", "ratio"),
    ("tokens_per_s_x", "× tokens/s", "ratio"),
    ("mean_running_groups", "groups", "int"),
)
DECOMP_COLUMNS: tuple[Column, ...] = (
    ("workload_id", "workload", "workload"),
    ("kv_dtype", "KV", "text"),
    ("budget_bytes", "budget", "bytes"),
    ("block_size", "block", "block"),
    ("baseline", "contiguous baseline", "text"),
    ("metric", "metric", "text"),
    ("torch_contiguous", "torch/contiguous", "g"),
    ("torch_paged", "torch/paged", "g"),
    ("vllm_contiguous", "vllm/contiguous", "g"),
    ("vllm_paged", "vllm/paged", "g"),
    ("serve_paged", "serve/paged", "g"),
    ("naive", "naive ×", "ratio"),
    ("allocation", "torch allocation ×", "ratio"),
    ("vllm_allocation", "vllm allocation ×", "ratio"),
    ("allocation_gap", "vllm ÷ torch allocation", "ratio"),
    ("runtime", "runtime ×", "ratio"),
    ("serving", "serving × (serve ÷ vllm paged)", "ratio"),
    ("torch_contiguous_unit", "torch contiguous unit", "text"),
    ("vllm_contiguous_unit", "vllm contiguous unit", "text"),
    ("sim_allocation", "sim allocation ×", "ratio"),
    ("vllm_sched_paged", "vllm-sched paged", "g"),
    ("sim_paged_preemptions", "sim paged preempt.", "int"),
    ("sim_contiguous_preemptions", "sim contiguous preempt.", "int"),
    ("vllm_sched_paged_preemptions", "vllm-sched paged preempt.", "int"),
    ("vllm_contiguous_preemptions", "vllm contiguous preempt.", "int"),
    ("serve_paged_preemptions", "serve paged preempt.", "int"),
)
REFERENCE_COLUMNS: tuple[Column, ...] = (
    ("item", "item", "text"),
    ("policy", "policy", "text"),
    ("block_size", "block", "block"),
    ("metric", "metric", "text"),
    ("published", "published", "g"),
    ("reproduced", "reproduced", "g"),
    ("basis", "fitted / predicted", "text"),
    ("runner", "runner", "text"),
    ("source", "source", "note"),
    ("note", "note", "note"),
)
PREDICTION_COLUMNS: tuple[Column, ...] = (
    ("workload", "workload", "text"),
    ("policy", "policy", "text"),
    ("engine", "engine", "text"),
    ("repeats", "engine runs", "int"),
    ("measured_total_s", "measured (median)", "time"),
    ("measured_min_s", "min", "time"),
    ("measured_max_s", "max", "time"),
    ("predicted_total_s", "predicted", "time"),
    ("total_err", "total error", "err"),
    ("step_median_err", "per-step median abs. error %", "pct"),
    ("step_p90_err", "per-step p90 abs. error %", "pct"),
    ("step_sum_err", "step-sum error", "err"),
    ("disturbed_frac", f"engine steps over {DISTURBED_RATIO:g}x their price %", "pct"),
    ("ttft_p50_s_err", "TTFT p50 error", "err"),
    ("ttft_p90_s_err", "TTFT p90 error", "err"),
    ("latency_p50_s_err", "latency p50 error", "err"),
    ("latency_p90_s_err", "latency p90 error", "err"),
)
PREDICTION_NOTE = (
    "sim on a fitted clock profile (predicted) beside the engine timing its own steps (measured), on "
    "the same work. Total: sim_time_s of each; errors are predicted ÷ the median of the engine's runs "
    "− 1 (min and max show its own spread). Per-step: the profile's price of each measured engine "
    "step against its measured time, |error| median and p90 (median over the engine's runs); "
    "step-sum: their sums (arrivals' idle time left out). Steps over "
    f"{DISTURBED_RATIO:g}x their price: the largest share over the engine's runs of steps slowed by "
    f"something else; over {DISTURBED_WARN:.0%}, the report warns."
)
DRIFT_NOTE = (
    "What the step-sum error is made of, when the engine ran in several rounds (repeats) over several "
    "workloads. The machine: per round, the median over workloads of the step-sum error (+: the engine "
    "ran faster than the profile); on a shared CPU it moves from one round to the next. The model: per "
    "workload, the median over rounds of its step-sum error less its round's: an error that repeating "
    "does not remove."
)
DRIFT_ROUND_COLUMNS: tuple[Column, ...] = (
    ("repeat", "round (repeat)", "int"),
    ("workloads", "workloads", "int"),
    ("phase", "the machine: median step-sum error", "err"),
)
DRIFT_WORKLOAD_COLUMNS: tuple[Column, ...] = (
    ("workload", "workload", "text"),
    ("rounds", "rounds", "int"),
    ("step_sum_err", "step-sum error (median)", "err"),
    ("offset", "the model: offset from its round", "err"),
)
CAPACITY_COLUMNS: tuple[Column, ...] = (
    ("family_label", "workload (rate swept)", "text"),
    ("runner", "runner", "text"),
    ("policy", "policy", "text"),
    ("block_size", "block", "block"),
    ("capacity_rps", "capacity, req/s", "g"),
    ("next_rps", "next rate tried, over the SLO", "g"),
    ("binding", "binding bound", "text"),
    ("metric_at_capacity", "binding metric at capacity", "g"),
    ("goodput_at_capacity_rps", "goodput at capacity, req/s", "g"),
    ("rates", "rates run", "int"),
    ("status", "status", "text"),
)
GOODPUT_COLUMNS: tuple[Column, ...] = (
    ("family_label", "workload (rate swept)", "text"),
    ("runner", "runner", "text"),
    ("policy", "policy", "text"),
    ("block_size", "block", "block"),
    ("rate", "rate, req/s", "g"),
    ("goodput_rps", "goodput, req/s", "g"),
    ("slo_met_frac", "requests within the SLO %", "pct"),
    ("within", "run within the SLO", "text"),
)
PREFIX_REUSE_COLUMNS: tuple[Column, ...] = (
    ("workload", "workload", "text"),
    ("runner", "runner", "text"),
    ("block_size", "block", "block"),
    ("budget_bytes", "KV budget", "bytes"),
    ("prefix_hit_rate", "hit rate %", "pct"),
    ("session_hit_rate_mean", "per-conversation hit rate % (mean)", "pct"),
    ("session_hit_rate_min", "(lowest)", "pct"),
    ("recomputed_hit_tokens", "recompute hits, tokens", "f0"),
    ("evictions", "evictions", "f0"),
    ("reuse_distance_p50_s", "reuse distance p50", "time"),
    ("tokens_per_s", "paged-prefix tok/s", "f0"),
    ("prefix_over_paged", "÷ paged", "ratio"),
    ("contiguous_budget_bytes", "contiguous needs", "bytes"),
    ("contiguous_note", "", "note"),
)
HYBRID_COLUMNS: tuple[Column, ...] = (
    ("model", "model", "text"),
    ("workload", "workload", "text"),
    ("runner", "runner", "text"),
    ("policy", "policy", "text"),
    ("budget_bytes", "KV budget", "bytes"),
    ("kv_groups_on", "groups (on)", "note"),
    ("peak_running_on", "peak running on", "f0"),
    ("peak_running_off", "off", "f0"),
    ("mean_running_on", "mean running on", "f1"),
    ("mean_running_off", "off", "f1"),
    ("preemptions_on", "preemptions on", "f0"),
    ("preemptions_off", "off", "f0"),
    ("tokens_per_s_ratio", "tokens/s on ÷ off", "ratio"),
    ("waste_on", "waste by kind, on", "note"),
    ("waste_off", "off", "note"),
    ("contiguous", "contiguous", "text"),
    ("paging_on", "paged ÷ contiguous tokens/s, on", "ratio"),
    ("paging_off", "off", "ratio"),
)
HYBRID_NOTE = (
    "Per model, workload and budget: vLLM's hybrid KV cache manager on (its default: one KV cache group per "
    "layer kind, a sliding window's blocks freed once they leave it) against off (every sliding or chunked "
    "layer sized as full attention), on identical work. Waste by kind is the time-weighted share of the budget "
    "a kind of group held without its layers reading it (blocks out of a window still held, the last block's "
    "tail, padding). For a paged pair, the last columns are what paging changed on the same work, manager on and "
    "off: its tokens per second over the named contiguous policy's (which reserves a run of blocks per group, a "
    "sliding group's bounded by its window; '-' where none ran)."
)
PREFIX_REUSE_NOTE = (
    "Per KV budget where paged-prefix ran: its prefix-cache hit rate (hit tokens at first admission ÷ prompt "
    "tokens; a preempted request's hits on its own recomputation are not hits and are counted apart), each "
    "conversation's hit rate (multi-turn workloads), cached blocks evicted, how long a reused block waited in "
    "the free queue (median, on the run's clock), throughput against paged at the same budget, and the "
    "smallest budget swept at which a contiguous policy, which shares nothing, reaches the same throughput."
)
GOODPUT_NOTE = (
    "Per run: a request meets the SLO when it finished and its own TTFT, TPOT, end-to-end and normalized "
    "latency are each within the bound on that metric (whatever percentile the bound is read at); goodput "
    "is those requests per second of the run's clock (its duration, sim_time_s). A run is within the SLO "
    "when each bound holds at its percentile over the run's requests (and the goodput floor, if any)."
)
CAPACITY_RATIO_COLUMNS: tuple[Column, ...] = (
    ("family_label", "workload (rate swept)", "text"),
    ("runner", "runner", "text"),
    ("policy", "policy", "text"),
    ("baseline", "over", "text"),
    ("kind", "kind", "text"),
    ("ratio", "capacity ratio", "ratio"),
)
CAPACITY_PUBLISHED_COLUMNS: tuple[Column, ...] = (
    ("item", "item", "text"),
    ("published", "published (low)", "g"),
    ("published_max", "published (high)", "g"),
    ("reproduced", "reproduced", "ratio"),
    ("off", "off the published range", "err"),
    ("basis", "fitted / predicted", "text"),
    ("source", "source", "note"),
    ("note", "note", "note"),
)


def capacity_note(table: pd.DataFrame) -> str:
    """What the capacity table means, with the SLO it was read against."""
    slos = "; ".join(dict.fromkeys(str(s) for s in table["slo"]))
    return (
        f"SLO: {slos}. Capacity is the highest request rate run at which every bound holds, and held at every "
        "lower rate of the same line; the true capacity lies between it and the next rate tried (which was "
        "over a bound). Binding bound: the one the next rate tried fails by the most (value ÷ bound); where "
        "every rate was within, the one with the least slack at capacity. Kind: = both capacities within "
        "their sweeps, ≥ / ≤ one of them is only a bound (every rate run was within the SLO)."
    )


CLOCK_COLUMNS: tuple[Column, ...] = (
    ("runner", "runner", "text"),
    ("clock", "clock", "text"),
    ("clock_detail", "what priced each step", "note"),
    ("runs", "runs", "int"),
)
CLOCKS_NOTE = (
    "steps: one step is one second; roofline: a GPU preset's bandwidth and FLOPs times measured "
    "efficiency factors (fitted to published kernel timings), and where a suite sets roofline_scale, "
    "every step time times that factor (fitted with `kvbench fit-roofline` to a number an engine "
    "reports); tables: each operation's time from measured GPU tables (Vidur's), the roofline for "
    "what they lack, each term's source in the row (docs/clock.md); profile: terms fitted by `kvbench "
    "calibrate` to an engine's measured steps; measured: the engine's own step times."
)
SERVE_CHECK_COLUMNS: tuple[Column, ...] = (
    ("workload", "workload", "text"),
    ("policy", "policy", "text"),
    ("block_size", "block", "block"),
    ("scrapes", "scrapes", "int"),
    ("idle_scrapes", "idle", "int"),
    ("blocks_exact", "blocks known exactly", "int"),
    ("blocks_agree_frac", "blocks agree %", "pct"),
    ("blocks_max_diff", "largest Δ blocks", "int"),
    ("running_agree_frac", "running agree %", "pct"),
    ("waiting_agree_frac", "waiting agree %", "pct"),
    ("preemptions_steps", "preemptions: steps", "int"),
    ("preemptions_metrics", "/metrics (last scrape)", "int"),
    ("preemptions_run", "run row", "int"),
    ("preemptions_lag_max", "max lag of /metrics", "int"),
    ("verdict", "verdict", "text"),
    ("note", "note", "note"),
)
SERVE_CHECK_NOTE = (
    "Per serve run: each /metrics scrape against the step rows kvbench's scheduler wrote inside the same "
    "server, both timed in seconds from the start of the replay. vLLM takes the statistics it reports at "
    "the end of a step, after its finished requests left and freed their blocks; a step row is read before "
    "that. So a scrape is compared with the state after the last step that ended before it began: running "
    "− finished, waiting, and allocated blocks (kv_cache_usage × the budget's usable blocks: vLLM's usage "
    "is used ÷ (num_gpu_blocks − 1)). The server answers a scrape after it begins while the engine steps "
    "on, and the scraper waits for each answer before the next: a scrape answered late reads the state "
    "after a later step, one that ended before the next scrape began. Verdict: agree (every scrape reads "
    "the step before it), agree (some answered late), or differ (a scrape reads neither, the last scrape "
    "disagrees, or the preemption totals differ)."
)
SERVE_CHECK_DEFINITIONS: tuple[tuple[str, str], ...] = (
    ("idle", "scrapes begun with nothing running or waiting and no step in flight"),
    (
        "blocks known exactly",
        "scrapes after a step that finished nothing, or left nothing running; after one that finished some "
        "requests, the blocks they freed are not in the step rows, so the reading need only lie between 0 "
        "and the step's count",
    ),
    (
        "… agree %",
        "share of scrapes whose reading equals the state after the step before them (blocks: or lies within "
        "that bound); a scrape answered late counts as not agreeing here",
    ),
    ("largest Δ blocks", "the largest difference, either way, where the blocks are known exactly"),
    (
        "preemptions",
        "the steps' total, /metrics' counter at the last scrape (after every request finished) and the run "
        "row's: all three are equal when the records agree",
    ),
    (
        "max lag of /metrics",
        "most preemptions the steps had counted and the counter had not yet: vLLM counts one when the "
        "preempted request next returns a token",
    ),
)
GLOSSARY: tuple[tuple[str, str], ...] = (
    ("token states %", "time-weighted mean share of the KV budget holding computed tokens' K/V (useful memory)"),
    ("reservation %", "share reserved for a request's future tokens, filled later"),
    ("internal frag %", "share allocated to requests but never filled (reservation beyond the final length)"),
    ("external frag %", "free share that cannot serve the request waiting at the head of the queue"),
    ("mean / peak running", "requests in the running batch: time-weighted mean and maximum (capacity)"),
    (
        "tokens/s",
        "generated tokens per second of kvbench's clock (roofline: simulated seconds), in every "
        "runner; tokens/step under the steps clock",
    ),
    ("wall tokens/s", "computed tokens per wall-clock second, torch and vllm only (sim's would be simulator speed)"),
    ("× …", "ratio to the baseline policy of the same runner in the same comparison group"),
    (
        "TTFT / latency p50, p90",
        "time to first token and end-to-end latency (arrival to finish) over finished "
        "requests, in seconds of the run's clock (steps under the steps clock)",
    ),
    (
        "goodput",
        "requests that finished with their TTFT, TPOT, end-to-end and normalized latency each within the "
        "bound of the suite's [slo] on that metric, per second of the run's clock",
    ),
    (
        "binding bound",
        "the [slo] bound that limits a capacity: the one the next rate tried fails by the most (value ÷ "
        "bound); where every rate was within, the one with the least slack at capacity",
    ),
)


GROUPS_NOTE = (
    "A comparison group holds the model, workload, KV precision, KV budget, max_model_len and scheduler "
    "fixed; only runner, policy and block size vary inside it (and, where shown, the device and the "
    "contiguous policies' arena)."
)
DECOMP_NOTE = (
    "naive: vllm/paged ÷ torch/contiguous; allocation: torch/paged ÷ torch/contiguous (same runtime); "
    "runtime: vllm/paged ÷ torch/paged (same allocation); naive = allocation × runtime. vllm allocation: "
    "vllm/paged ÷ vllm/contiguous, the allocation effect inside the full engine; vllm ÷ torch allocation: "
    "how far apart the two allocation factors are (1.00× = the same). A contiguous baseline is the runs "
    "reserving whole blocks of the row's block size where that runner has them, else token positions "
    "(the unit columns say which). “-”: that run is missing. tokens_per_s is on kvbench's clock in every "
    "runner, where torch and vllm take the same steps: its runtime factor is 1 by construction; "
    "wall_tokens_per_s (measured) carries the runtime effect."
)
NO_BASELINE = "No contiguous policy has an ok run, so there are no ratios."


def failure(row: dict[str, Any], cell: str | None = None) -> str:
    """'sim/contiguous-max infeasible: …' (without repeating the status when the error starts with it);
    ``cell`` names the cell otherwise than runner/policy."""
    error, status = str(row["error"]), str(row["status"])
    cell = cell or f"{row['runner']}/{row['policy']}"
    return f"{cell} {error}" if error.startswith(status) else f"{cell} {status}: {error}"


def throughput_unit(clocks: set[Any]) -> str:
    """How tokens_per_s reads: per step under the steps clock, else per second of the run's clock."""
    return "tokens/step" if clocks == {"steps"} else "tokens/s"


def amounts(*values: float) -> list[str]:
    """Counts or rates set side by side in a sentence, alike: one decimal where all are below 1,000,
    else whole and grouped ('1,441 vs 202', not '1,441 vs 202.4')."""
    kind = "f1" if all(abs(v) < 1000 for v in values) else "f0"
    return [fmt(kind, v) for v in values]


def format_time(value: float, clock: object = None) -> str:
    """A time with its unit: steps on the steps clock (every step is one unit), else seconds
    scaled to µs, ms or s."""
    if clock == "steps":
        return "1 step" if round(value) == 1 else f"{value:,.0f} steps"
    size = abs(value)
    if size == 0 or size >= 1:
        return f"{value:,.3g} s" if size < 1000 else f"{value:,.0f} s"
    if size >= 1e-3:
        return f"{value * 1e3:.3g} ms"
    return f"{value * 1e6:.3g} µs"


def is_missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA


def fmt(kind: str, value: Any, row: dict[str, Any] | None = None) -> str:
    if kind == "block":
        policy = (row or {}).get("policy", "")
        # A contiguous reservation in positions has no block size; one in whole blocks has.
        return "-" if is_missing(value) or (is_contiguous(str(policy)) and int(value) == 1) else str(int(value))
    if kind == "wall" and (row or {}).get("runner") in SIMULATED:
        return "-"  # a simulator's wall speed is its own speed, not the runtime's: not comparable
    if is_missing(value):
        return "-"
    if kind == "pct":
        return f"{100 * value:.1f}"
    if kind == "err":
        return f"{100 * value:+.1f}%"
    if kind == "ratio":
        return f"{value:.2f}×"
    if kind == "int":
        return f"{int(round(float(value)))}"
    if kind == "f1":
        return f"{value:.1f}"
    if kind in ("f0", "wall"):
        return f"{value:,.0f}"
    if kind == "g":
        return f"{value:.4g}"
    if kind == "id":
        return str(value)[:8]
    if kind == "workload":
        from .labels import workload_tag

        return workload_tag({**(row or {}), "workload_id": value})
    if kind == "time":
        return format_time(float(value), (row or {}).get("clock"))
    if kind == "bytes":
        from ..harness.spec.units import format_bytes

        return format_bytes(value)
    if kind == "onoff":
        return "on" if value else "off"
    return str(value)


# Cell keys shown only in a table where they take two values.
VARYING_ONLY = ("device", "arena", "hybrid_kv", "cpu_offload_bytes", "offload_policy")


def with_setup(columns: Sequence[Column], table: pd.DataFrame) -> list[Column]:
    """``columns`` with the model (and its tensor / pipeline parallel size) first, where a capacity
    table holds several (``reports.capacity.setup_label``); as they are otherwise."""
    if "setup" in table.columns and table["setup"].nunique(dropna=True) > 1:
        return [("setup", "model", "text"), *columns]
    return list(columns)


def visible(columns: Sequence[Column], table: pd.DataFrame, runners: set[str]) -> list[Column]:
    """The columns worth showing: present and not all missing; wall tokens/s only for real runtimes;
    the run count only when some cell was repeated."""
    out = []
    for key, header, kind in columns:
        if key not in table.columns or table[key].isna().all():
            continue
        if key == "wall_tokens_per_s" and not runners & set(MEASURING_RUNNERS):
            continue
        if key in VARYING_ONLY and table[key].nunique(dropna=False) < 2:
            continue  # the same for every cell: a column of one value says nothing
        if key == "repeats" and not (table[key] > 1).any():
            continue
        out.append((key, header, kind))
    return out


# The allocation factor in both runtimes and their ratio: shown side by side even where one is all "-",
# so that a factor not measured reads as missing rather than as absent from the report.
DECOMP_SIDE_BY_SIDE = ("allocation", "vllm_allocation", "allocation_gap")


def decomp_columns(table: pd.DataFrame, runners: set[str]) -> list[Column]:
    """The decomposition's columns: those ``visible`` shows, and the allocation factors side by side."""
    shown = {key for key, _, _ in visible(DECOMP_COLUMNS, table, runners)}
    return [c for c in DECOMP_COLUMNS if c[0] in shown or (c[0] in DECOMP_SIDE_BY_SIDE and c[0] in table.columns)]


def rows(columns: Sequence[Column], table: pd.DataFrame) -> list[list[str]]:
    return [[fmt(kind, r.get(key), r) for key, _, kind in columns] for r in table.to_dict("records")]


def cell_columns(table: pd.DataFrame, runners: set[str]) -> list[Column]:
    """The per-cell columns for one group's table; throughput reads 'tokens/step' under the steps clock."""
    cols = visible(CELL_COLUMNS, table, runners)
    unit = throughput_unit(set(table["clock"]))
    return [
        (k, h.replace("tokens/s", unit) if k in ("tokens_per_s", "tokens_per_s_x") else h, kind) for k, h, kind in cols
    ]


ColumnSet = tuple[str, tuple[str, ...]]  # (title, the keys of the columns it holds): a section's parts (reports.layout)


CELL_TABLE_KEYS: tuple[str, ...] = ("runner", "policy", "block_size", *VARYING_ONLY, "status")
CONCURRENCY_KEYS: tuple[str, ...] = (
    "mean_running",
    "peak_running",
    "preemptions",
    "tokens_per_s",
    "wall_tokens_per_s",
    "mean_running_x",
    "peak_running_x",
    "tokens_per_s_x",
    "repeats",
)
MEMORY_KEYS: tuple[str, ...] = ("token_states_frac", "reservation_frac", "internal_frag_frac", "external_frag_frac")
LATENCY_KEYS: tuple[str, ...] = ("ttft_p50_s", "latency_p50_s", "latency_p90_s")


def cell_sets(columns: Sequence[Column]) -> tuple[ColumnSet, ...]:
    """A group's cell table in two: concurrency and throughput (the answer), then memory and latency
    (titled by which of the two its columns hold)."""
    shown = {k for k, _, _ in columns}
    words = [
        w
        for w, keys in (("Memory (share of the KV budget)", MEMORY_KEYS), ("latency", LATENCY_KEYS))
        if shown & set(keys)
    ]
    rest = " and ".join(words)
    return (("Concurrency and throughput", CONCURRENCY_KEYS), (rest[:1].upper() + rest[1:], MEMORY_KEYS + LATENCY_KEYS))


GEOMEAN_KEYS: tuple[str, ...] = ("runner", "policy", "block_size", *VARYING_ONLY)
DECOMP_KEYS: tuple[str, ...] = ("workload_id", "kv_dtype", "budget_bytes", "block_size", "baseline", "metric")
DECOMP_ONCE: tuple[str, ...] = ("torch_contiguous_unit", "vllm_contiguous_unit")
DECOMP_SETS: tuple[ColumnSet, ...] = (
    ("Factors", ("naive", "allocation", "vllm_allocation", "allocation_gap", "runtime", "serving", "sim_allocation")),
    (
        "The runs' values",
        (
            "torch_contiguous",
            "torch_paged",
            "vllm_contiguous",
            "vllm_paged",
            "serve_paged",
            "vllm_sched_paged",
            "torch_contiguous_unit",
            "vllm_contiguous_unit",
        ),
    ),
    (
        "Preemptions",
        (
            "sim_paged_preemptions",
            "sim_contiguous_preemptions",
            "vllm_sched_paged_preemptions",
            "vllm_contiguous_preemptions",
            "serve_paged_preemptions",
        ),
    ),
)
HYBRID_KEYS: tuple[str, ...] = ("model", "workload", "runner", "policy", "budget_bytes")
HYBRID_SETS: tuple[ColumnSet, ...] = (
    (
        "Running, preemptions and throughput",
        (
            "peak_running_on",
            "peak_running_off",
            "mean_running_on",
            "mean_running_off",
            "preemptions_on",
            "preemptions_off",
            "tokens_per_s_ratio",
            "contiguous",
            "paging_on",
            "paging_off",
        ),
    ),
    ("KV cache groups and their waste", ("kv_groups_on", "waste_on", "waste_off")),
)
PREDICTION_KEYS: tuple[str, ...] = ("workload", "policy", "engine")
PREDICTION_SETS: tuple[ColumnSet, ...] = (
    (
        "Total and per-step time",
        (
            "repeats",
            "measured_total_s",
            "measured_min_s",
            "measured_max_s",
            "predicted_total_s",
            "total_err",
            "step_median_err",
            "step_p90_err",
            "step_sum_err",
            "disturbed_frac",
        ),
    ),
    ("Latency", ("ttft_p50_s_err", "ttft_p90_s_err", "latency_p50_s_err", "latency_p90_s_err")),
)
REFERENCE_KEYS: tuple[str, ...] = ("item", "policy", "block_size", "metric")
CAPACITY_KEYS: tuple[str, ...] = ("setup", "family_label", "runner", "policy", "block_size")
PREFIX_REUSE_KEYS: tuple[str, ...] = ("workload", "runner", "block_size", "budget_bytes")
PREFIX_REUSE_SETS: tuple[ColumnSet, ...] = (
    (
        "Reuse",
        (
            "prefix_hit_rate",
            "session_hit_rate_mean",
            "session_hit_rate_min",
            "recomputed_hit_tokens",
            "evictions",
            "reuse_distance_p50_s",
        ),
    ),
    (
        "Throughput against the budget",
        ("tokens_per_s", "prefix_over_paged", "contiguous_budget_bytes", "contiguous_note"),
    ),
)
SERVE_CHECK_KEYS: tuple[str, ...] = ("workload", "policy", "block_size")
SERVE_CHECK_SETS: tuple[ColumnSet, ...] = (
    (
        "Scrapes against the steps",
        (
            "scrapes",
            "idle_scrapes",
            "blocks_exact",
            "blocks_agree_frac",
            "blocks_max_diff",
            "running_agree_frac",
            "waiting_agree_frac",
            "verdict",
        ),
    ),
    (
        "Preemptions",
        ("preemptions_steps", "preemptions_metrics", "preemptions_run", "preemptions_lag_max", "note"),
    ),
)
CLOCK_KEYS: tuple[str, ...] = ("runner", "clock")
