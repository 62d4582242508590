"""The Parquet contract: one declared schema per table, units in column names.

Writers and readers both use these objects. Every file carries
``kvbench.schema_version`` in its metadata; readers refuse a newer version.
"""

from __future__ import annotations

from typing import NamedTuple

import pyarrow as pa

from .statuses import FAILED, FAILURES, INFEASIBLE, OK, OOM, STATUSES

SCHEMA_VERSION = 1
VERSION_KEY = b"kvbench.schema_version"
# Re-exported: the schema's readers name statuses too.
__all__ = ["FAILED", "FAILURES", "INFEASIBLE", "OK", "OOM", "STATUSES"]


STEPS = pa.schema(
    [
        ("step", pa.int64()),
        ("t_s", pa.float64()),  # simulated time at the start of the step
        ("dt_s", pa.float64()),  # simulated duration of the step (time weight)
        ("running", pa.int32()),
        ("waiting", pa.int32()),
        ("admitted", pa.int32()),
        ("finished", pa.int32()),
        ("preempted", pa.int32()),
        ("scheduled_tokens", pa.int64()),
        ("allocated_blocks", pa.int64()),
        ("allocated_positions", pa.int64()),
        ("used_positions", pa.int64()),
        ("reserved_positions", pa.int64()),
        ("internal_frag_positions", pa.int64()),
        ("external_frag_positions", pa.int64()),
        ("free_positions", pa.int64()),
        ("evicted_blocks", pa.int64()),
        ("prefix_hit_tokens", pa.int64()),  # cache hits of requests admitted for the first time
        ("recomputed_hit_tokens", pa.int64()),  # … of requests re-admitted after a preemption (not hits)
        # Free blocks still holding cached content (prefix caching): the cache beyond what requests hold.
        ("cached_free_blocks", pa.int64()),
        ("kv_bytes_allocated", pa.int64()),  # null where not measured
        ("step_wall_s", pa.float64()),  # null for sim
        # The step's work, recorded beside step_wall_s by the runners that measure steps (torch,
        # vllm; null for sim and vllm-sched): the features `kvbench calibrate` fits step time on.
        ("scheduled_seqs", pa.int32()),  # requests scheduled this step
        ("context_tokens", pa.int64()),  # Σ over them of their context after the step (KV positions attended)
        ("attention_pairs", pa.int64()),  # Σ new tokens × context (query-key pairs)
        # A CPU tier of KV memory (vLLM's native KV offloading; null for runs without one): blocks it
        # holds during the step, blocks whose store to it / load from it was issued this step, and
        # requests waiting on a load from it.
        ("cpu_blocks", pa.int64()),
        ("stored_blocks", pa.int64()),
        ("loaded_blocks", pa.int64()),
        ("load_waiting", pa.int32()),
    ]
)
# The steps columns of a CPU tier: null in every row of a run without one.
CPU_TIER_STEP_COLUMNS: tuple[str, ...] = ("cpu_blocks", "stored_blocks", "loaded_blocks", "load_waiting")


class StepRow(NamedTuple):
    """One row of ``STEPS``, as every runner records it (``RunRecorder.add_step``). A NamedTuple,
    not a dataclass: the simulator builds one per step, and the recorder stores it as the tuple
    it is. None is a null (the measured columns, for runners that measure nothing; the CPU tier's,
    trailing and None unless given, for runs without a tier)."""

    step: int
    t_s: float
    dt_s: float
    running: int
    waiting: int
    admitted: int
    finished: int
    preempted: int
    scheduled_tokens: int
    allocated_blocks: int
    allocated_positions: int
    used_positions: int
    reserved_positions: int
    internal_frag_positions: int
    external_frag_positions: int
    free_positions: int
    evicted_blocks: int
    prefix_hit_tokens: int
    recomputed_hit_tokens: int
    cached_free_blocks: int
    kv_bytes_allocated: int | None
    step_wall_s: float | None
    scheduled_seqs: int | None
    context_tokens: int | None
    attention_pairs: int | None
    cpu_blocks: int | None = None
    stored_blocks: int | None = None
    loaded_blocks: int | None = None
    load_waiting: int | None = None


assert StepRow._fields == tuple(STEPS.names), "StepRow must name STEPS's columns, in their order"

REQUESTS = pa.schema(
    [
        ("request_id", pa.int64()),
        ("sample", pa.int32()),
        ("prompt_len", pa.int64()),
        ("output_len", pa.int64()),
        ("arrival_s", pa.float64()),
        ("first_scheduled_s", pa.float64()),
        ("first_token_s", pa.float64()),
        ("finished_s", pa.float64()),
        ("num_preemptions", pa.int32()),
        ("peak_allocated_positions", pa.int64()),
        ("prefix_hit_tokens", pa.int64()),  # cache hits at its first admission
        ("recomputed_hit_tokens", pa.int64()),  # cache hits at re-admissions after a preemption
        ("status", pa.string()),
        # Contiguous policies (null for the others): where the request's reservation began, in units of
        # the cell's block size counted from the first usable block, and how many runs of consecutive
        # block ids it held (1: one contiguous stretch; the vLLM runners read the ids vLLM held).
        ("kv_first_block", pa.int64()),
        ("kv_block_runs", pa.int32()),
        # Multi-turn workloads (null otherwise): the conversation and the turn (0 first) it belongs to.
        ("session_id", pa.int64()),
        ("turn", pa.int32()),
        # When a client sent it (serve: null for the runners that hand requests over in-process), and
        # when its tokens came, on the run's clock, the first token's included: serve, each streamed
        # chunk that carried tokens (vLLM's server merges tokens into one chunk when its client falls
        # behind); an import, each chunk vLLM's client timed; vllm-sched, vllm, torch, each token (the
        # end of the step that sampled it); null for sim. ITL is the gaps between successive entries,
        # as `vllm bench serve` measures it: one per chunk, not one per token.
        ("sent_s", pa.float64()),
        ("token_times_s", pa.list_(pa.float64())),
        # How many tokens each entry of token_times_s carried (serve); null where each entry is one
        # token (the in-process runners) or the count was not kept (an import: vLLM's client keeps none).
        ("token_counts", pa.list_(pa.int32())),
        # Tokens loaded from a CPU tier of KV memory rather than computed, summed over its admissions
        # (null for runs without a tier).
        ("cpu_hit_tokens", pa.int64()),
    ]
)

# Per-request latency summarised in the runs table: each metric (a column prefix) at each statistic.
# ttft: first token - arrival; tpot: (finish - first token) / (generated - 1); itl: each gap between
# successive tokens; latency: finish - arrival; normalized_latency: latency / generated tokens.
LATENCY_PREFIXES: tuple[str, ...] = ("ttft", "tpot", "itl", "latency", "normalized_latency")
LATENCY_STATS: tuple[str, ...] = ("p50", "p90", "p95", "p99", "mean", "std")
_FIRST_LATENCY_COLUMNS: tuple[str, ...] = (
    "ttft_p50_s",
    "ttft_p90_s",
    "tpot_p50_s",
    "tpot_p90_s",
    "latency_p50_s",
    "latency_p90_s",
    "normalized_latency_mean_s",
    "normalized_latency_p50_s",
    "normalized_latency_p90_s",
)
ADDED_LATENCY_COLUMNS: tuple[str, ...] = tuple(
    f"{prefix}_{stat}_s"
    for prefix in LATENCY_PREFIXES
    for stat in LATENCY_STATS
    if f"{prefix}_{stat}_s" not in _FIRST_LATENCY_COLUMNS
)

# ``run_id`` is not stored in the files: it is the hive partition key
# (``run_id=<id>/``), which every reader adds back as a column.
RUNS = pa.schema(
    [
        ("suite", pa.string()),
        ("runner", pa.string()),
        ("policy", pa.string()),
        ("block_size", pa.int64()),
        (
            "arena",
            pa.string(),
        ),  # where a contiguous policy placed reservations: first-fit or buddy (null: other policies)
        ("serve_url", pa.string()),  # the server the serve runner attached to (null: it started its own; other runners)
        ("kv_dtype", pa.string()),
        ("kv_bytes_per_token", pa.int64()),
        ("budget_bytes", pa.int64()),
        ("budget_positions", pa.int64()),
        ("max_model_len", pa.int64()),
        ("model", pa.string()),
        # Tensor and pipeline parallel size: kv_bytes_per_token, budget_bytes and budget_positions are
        # one rank's (one GPU's). Null in results written before them: read as 1.
        ("tensor_parallel_size", pa.int64()),
        ("pipeline_parallel_size", pa.int64()),
        ("workload_id", pa.string()),
        # The suite's name for the workload ([workloads.NAME]; null for a suite's one [workload]):
        # what reports call it. Not part of the run's identity.
        ("workload_name", pa.string()),
        ("workload_source", pa.string()),
        ("arrival", pa.string()),
        ("rate", pa.float64()),
        ("num_requests", pa.int64()),
        ("dropped_requests", pa.int64()),
        ("max_num_seqs", pa.int64()),
        ("max_num_batched_tokens", pa.int64()),
        ("clock", pa.string()),
        ("repeat", pa.int64()),
        ("status", pa.string()),
        ("error", pa.string()),
        ("wall_s", pa.float64()),
        ("sim_time_s", pa.float64()),
        ("steps", pa.int64()),
        ("generated_tokens", pa.int64()),
        ("computed_tokens", pa.int64()),
        (
            "tokens_per_s",
            pa.float64(),
        ),  # generated tokens per second of the run's clock (simulated, or device for vllm)
        (
            "wall_tokens_per_s",
            pa.float64(),
        ),  # generated tokens per second of measured step time (torch, vllm; null for sim)
        ("computed_tokens_per_wall_s", pa.float64()),  # computed tokens per wall second of the whole run (runner speed)
        ("preemptions", pa.int64()),
        ("evictions", pa.int64()),
        ("prefix_hit_rate", pa.float64()),  # first-admission hit tokens ÷ prompt tokens
        ("recomputed_hit_tokens", pa.int64()),  # hits at re-admissions after a preemption, never in the rate
        # Multi-turn workloads: each conversation's hit rate (its turns' hit tokens ÷ their prompt
        # tokens), mean and lowest over conversations; null otherwise.
        ("session_hit_rate_mean", pa.float64()),
        ("session_hit_rate_min", pa.float64()),
        # Prefix caching: how long a cached block waited in the free queue between its free and a
        # hit that took it back, in steps and seconds of the run's clock (null: no such reuse, or a
        # runner that does not see block ids).
        ("reuse_distance_p50_steps", pa.float64()),
        ("reuse_distance_p90_steps", pa.float64()),
        ("reuse_distance_p50_s", pa.float64()),
        ("reuse_distance_p90_s", pa.float64()),
        ("peak_running", pa.int64()),
        ("mean_running", pa.float64()),
        ("token_states_frac", pa.float64()),
        ("reservation_frac", pa.float64()),
        ("internal_frag_frac", pa.float64()),
        ("external_frag_frac", pa.float64()),
        ("free_frac", pa.float64()),
        # Contiguous policies: the time-weighted share of the budget that a buddy arena's rounding
        # (2^k − reservation) took; part of internal_frag_frac (0 first-fit, null other policies).
        ("rounding_frac", pa.float64()),
        ("peak_kv_bytes_allocated", pa.int64()),
        ("device_peak_bytes", pa.int64()),  # CUDA allocator peak during the run (torch, vllm on CUDA)
        ("mean_step_wall_s", pa.float64()),
        # Per-request latency on the run's clock (harness.sim.latency), over finished requests.
        ("ttft_p50_s", pa.float64()),
        ("ttft_p90_s", pa.float64()),
        ("tpot_p50_s", pa.float64()),
        ("tpot_p90_s", pa.float64()),
        ("latency_p50_s", pa.float64()),
        ("latency_p90_s", pa.float64()),
        ("normalized_latency_mean_s", pa.float64()),  # latency ÷ generated tokens
        ("normalized_latency_p50_s", pa.float64()),
        ("normalized_latency_p90_s", pa.float64()),
        # The rest of each metric's summary (LATENCY_PREFIXES x LATENCY_STATS): p95, p99, mean and
        # std (numpy's, ddof 0); itl_* are the gaps between successive tokens of one request, null
        # where the runner records no per-token times. Null in results written before them.
        *((name, pa.float64()) for name in ADDED_LATENCY_COLUMNS),
        ("clock_detail", pa.string()),  # the clock in one line: preset and factors, profile terms, or "measured"
        ("clock_profile", pa.string()),  # profile clock: the whole profile file (JSON), for the report
        # Which loop of kvbench's scheduler ran it: "fast" or "reference" (harness/sim/README.md;
        # sim and torch; null for vLLM's runners and in results written before it).
        ("sim_path", pa.string()),
        ("git_sha", pa.string()),
        ("git_dirty", pa.bool_()),
        ("host", pa.string()),
        ("python_version", pa.string()),
        ("torch_version", pa.string()),
        ("vllm_version", pa.string()),
        ("cuda_version", pa.string()),
        ("device", pa.string()),
        ("kvbench_version", pa.string()),
        (
            "code_digest",
            pa.string(),
        ),  # harness.records.code_identity: which code produced the run (null: older kvbench)
        ("attention_backend", pa.string()),
        ("started_at", pa.timestamp("us", tz="UTC")),
        ("spec_json", pa.string()),
        # How many rows the run's steps and requests partitions hold: a run is complete only when
        # both partitions are there with these counts (harness.records.store.incomplete_runs; null: older kvbench).
        ("steps_rows", pa.int64()),
        ("requests_rows", pa.int64()),
        # A model whose layers are not all full attention (null otherwise): vLLM's hybrid KV cache
        # manager on or off, one block id's bytes across all groups, the groups in one line
        # ("kind×layers/block" each), and the rows of its kv_groups partition.
        ("hybrid_kv", pa.bool_()),
        ("kv_bytes_per_block", pa.int64()),
        ("kv_groups", pa.string()),
        ("kv_groups_rows", pa.int64()),
        # A CPU tier of KV memory (vLLM's native KV offloading, ``harness.spec.cpu_tier``): its bytes
        # (0: none; null in results written before it, read as 0), its eviction policy (null without
        # a tier) and its capacity in blocks of block_size (0 without a tier).
        ("cpu_offload_bytes", pa.int64()),
        ("offload_policy", pa.string()),
        ("cpu_blocks", pa.int64()),
        # Whose offloading rules ran the tier: vllm-sched, the installed vLLM's ("vllm 0.32"); sim, the
        # release it mirrors (``harness.sim.offload.rules``); null without a tier or elsewhere.
        ("offload_rules", pa.string()),
    ]
)

# The runs columns of per-request latency an [slo] may bound (harness.sim.latency fills them): every
# metric at every statistic but the spread.
LATENCY_COLUMNS: tuple[str, ...] = tuple(
    f"{prefix}_{stat}_s" for prefix in LATENCY_PREFIXES for stat in LATENCY_STATS if stat != "std"
)

# A served engine's Prometheus /metrics, scraped at a fixed interval (the serve runner; runs of other
# runners have no metrics partition). One row per scrape; a family the server does not export is null.
METRICS = pa.schema(
    [
        ("t_s", pa.float64()),  # seconds from the start of the replay
        ("kv_cache_usage_frac", pa.float64()),  # vllm:kv_cache_usage_perc: used ÷ usable blocks (0..1)
        ("num_requests_running", pa.float64()),
        ("num_requests_waiting", pa.float64()),
        ("num_preemptions", pa.float64()),  # cumulative (a counter)
        ("prefix_cache_queries", pa.float64()),  # cumulative tokens queried
        ("prefix_cache_hits", pa.float64()),  # cumulative tokens hit
        # A CPU tier (vLLM's offloading connector; null where the server exports none): the external
        # prefix cache's tokens queried and hit, and the bytes its worker loaded and stored (cumulative).
        ("external_prefix_cache_queries", pa.float64()),
        ("external_prefix_cache_hits", pa.float64()),
        ("kv_offload_load_bytes", pa.float64()),
        ("kv_offload_store_bytes", pa.float64()),
    ]
)

# A model's KV cache groups, per step (docs/records.md, "KV cache groups"): written only for a model
# whose layers are not all full attention. One row per step and group, read at the step row's point.
KV_GROUPS = pa.schema(
    [
        ("step", pa.int64()),
        ("group", pa.int32()),  # the group's index, in vLLM's order
        ("kind", pa.string()),  # the group's spec kind (full, sliding, chunked, mla, mamba1, mamba2, gdn)
        ("allocated_blocks", pa.int64()),  # real (non-null) blocks its block tables hold
        ("used_bytes", pa.int64()),  # bytes its layers still read, each layer by its own kind
    ]
)

TABLES: dict[str, pa.Schema] = {
    "runs": RUNS,
    "steps": STEPS,
    "requests": REQUESTS,
    "metrics": METRICS,
    "kv_groups": KV_GROUPS,
}


def with_version(schema: pa.Schema) -> pa.Schema:
    return schema.with_metadata({VERSION_KEY: str(SCHEMA_VERSION).encode()})
