"""What every runner shares: sequences from a workload, run rows, request tables and the
feasibility gate (the step loop itself is ``runners.driver``)."""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path

from ..harness.clock.clocks import LINK_CALL_LATENCY_S, Clock, make_clock
from ..harness.clock.model import GPU_PRESETS
from ..harness.clock.tables_clock import TablesClock
from ..harness.records.provenance import provenance
from ..harness.records.recorder import RunRecorder
from ..harness.records.schema import REQUESTS
from ..harness.sim.latency import latency_summary
from ..harness.sim.policies.base import Policy
from ..harness.sim.policies.grouped import GroupedPagedPolicy
from ..harness.sim.sequence import FINISHED, Seq
from ..harness.spec.capabilities import is_contiguous
from ..harness.spec.feasibility import Shortfall
from ..harness.spec.geometry import ModelGeometry
from ..harness.spec.specs import RunSpec, SchedulerSpec
from .base import Cell, RunResult
from .block_content import assign_block_keys


def expand_seqs(cell: Cell, seq_type: type[Seq] = Seq) -> list[Seq]:
    """One sequence per sample: a request with n parallel samples becomes n sequences
    sharing its prompt (as vLLM's front end fans them out); ``seq_type`` is the scheduler's
    (``Scheduler.seq_type``)."""
    df = cell.workload.requests
    seqs: list[Seq] = []
    cols = [
        df[c].to_numpy().tolist()
        for c in ("request_id", "prompt_len", "output_len", "arrival_s", "prefix_group", "prefix_len", "n")
    ]
    for rid, p, o, a, g, pl, n in zip(*cols):
        for k in range(n):
            seqs.append(seq_type(len(seqs), rid, k, p, o, a, g, pl))
    sessions = cell.workload.sessions
    if sessions is not None:  # one sample per turn: request i is sequence i
        for seq in seqs:
            i = seq.request_id
            seq.session_id = int(sessions.session_id[i])
            seq.turn = int(sessions.turn[i])
            seq.think_s = float(sessions.think_s[i])
            seq.after = int(sessions.previous[i])
    if cell.spec.policy == "paged-prefix":  # prefix caching matches blocks by their content
        assign_block_keys(cell, seqs, cell.spec.block_size)
    return seqs


def shortfall(cell: Cell, seqs: list[Seq], policy: Policy) -> Shortfall | None:
    """The largest need no policy state could ever meet, if any."""
    spec = cell.spec
    if policy.budget_positions < policy.block_size or policy.budget_positions <= 0:
        return Shortfall(
            f"one block of {policy.block_size} positions",
            f"a block size of at most {max(policy.budget_positions, 0)} positions",
            policy.block_size,
            policy.budget_positions,
            spec.kv_bytes_per_token,
            spec.memory.kv_budget_bytes,
            spec.scheduler.tensor_parallel_size,
            spec.scheduler.pipeline_parallel_size,
        )
    usable = (policy.budget_positions // policy.block_size) * policy.block_size
    if isinstance(policy, GroupedPagedPolicy):  # whole block ids, the null block left out
        use = policy.use
        usable = use.usable_positions
        max_len = spec.memory.max_model_len
        if use.admission_blocks(max_len) > use.usable_blocks:
            # vLLM's engine refuses a KV cache that cannot hold one request of max_model_len
            # (check_enough_kv_cache_memory, over its groups' blocks).
            return Shortfall(
                f"one request of max_model_len ({max_len}) tokens, which vLLM needs to start",
                f"a max_model_len below {max_len}",
                use.positions(use.admission_blocks(max_len)),
                policy.budget_positions,
                spec.kv_bytes_per_token,
                spec.memory.kv_budget_bytes,
                spec.scheduler.tensor_parallel_size,
                spec.scheduler.pipeline_parallel_size,
            )
    worst = max(seqs, key=policy.needs_positions)
    need = policy.needs_positions(worst)
    if need > usable:
        what = (
            f"{spec.policy}'s reservation for request {worst.request_id} "
            f"(prompt {worst.prompt_len} + output {worst.output_len})"
        )
        if spec.policy == "contiguous-max":
            smaller = f"a max_model_len of at most {usable} (it is {spec.memory.max_model_len})"
        else:
            smaller = f"a smaller workload: requests of at most {usable} tokens"
        return Shortfall(
            what,
            smaller,
            need,
            policy.budget_positions,
            spec.kv_bytes_per_token,
            spec.memory.kv_budget_bytes,
            spec.scheduler.tensor_parallel_size,
            spec.scheduler.pipeline_parallel_size,
        )
    return None


def host_available_bytes() -> int:
    """The host's available memory (MemAvailable where Linux says it), in bytes."""
    try:
        for line in Path("/proc/meminfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    pages = os.sysconf("SC_AVPHYS_PAGES") if "SC_AVPHYS_PAGES" in os.sysconf_names else os.sysconf("SC_PHYS_PAGES")
    return int(pages) * int(os.sysconf("SC_PAGE_SIZE"))


def base_row(cell: Cell, runner: str) -> dict[str, object]:
    spec, w = cell.spec, cell.workload
    return {
        "suite": spec.suite,
        "runner": runner,
        "policy": spec.policy,
        "block_size": spec.block_size,
        "arena": spec.arena if is_contiguous(spec.policy) else None,
        "serve_url": spec.serve_url,
        "kv_dtype": spec.model.kv_dtype,
        "kv_bytes_per_token": spec.kv_bytes_per_token,
        "budget_bytes": spec.memory.kv_budget_bytes,
        "budget_positions": spec.budget_positions,
        "max_model_len": spec.memory.max_model_len,
        "model": spec.geometry.name,
        "tensor_parallel_size": spec.scheduler.tensor_parallel_size,
        "pipeline_parallel_size": spec.scheduler.pipeline_parallel_size,
        "workload_id": w.workload_id,
        "workload_name": cell.workload_name,
        "workload_source": spec.workload.source,
        "arrival": spec.workload.arrival,
        "rate": spec.workload.rate,
        "num_requests": w.num_requests,
        "dropped_requests": w.dropped,
        "max_num_seqs": spec.scheduler.max_num_seqs,
        "max_num_batched_tokens": spec.scheduler.max_num_batched_tokens,
        "clock": spec.scheduler.clock,
        **clock_columns(spec),
        "repeat": spec.repeat,
        **cpu_tier_columns(spec),
        "device": "cpu",
        "started_at": _dt.datetime.now(_dt.UTC),
        "spec_json": spec.to_json(),
        **provenance(),
        **layout_columns(spec),
    }


def cpu_tier_columns(spec: RunSpec) -> dict[str, object]:
    """The run row's CPU tier columns: its bytes (0: none), eviction policy (null without a tier)
    and capacity in blocks (0 without a tier)."""
    tier = spec.memory.cpu_offload_bytes
    return {
        "cpu_offload_bytes": tier,
        "offload_policy": spec.memory.offload_policy if tier else None,
        "cpu_blocks": spec.cpu_blocks,
    }


def layout_columns(spec: RunSpec) -> dict[str, object]:
    """The run row's KV cache group columns: null for a model of full attention only."""
    if spec.geometry.is_uniform_full:
        return {}
    layout = spec.layout
    groups = " | ".join(
        f"{g.kind}×{len(g.layers)}{f'+{g.padding_layers} pad' if g.padding_layers else ''}"
        f"{f' w{g.window}' if g.window else ''} b{g.block_size}"
        for g in layout.groups
    )
    return {"hybrid_kv": spec.hybrid_kv, "kv_bytes_per_block": layout.bytes_per_block, "kv_groups": groups}


def clock_columns(spec: RunSpec) -> dict[str, object]:
    """``clock_detail`` (what priced each step, in one line) and ``clock_profile`` (the profile's JSON)."""
    sched = spec.scheduler
    if sched.clock == "profile":
        profile = sched.profile()
        return {"clock_detail": profile.describe(), "clock_profile": json.dumps(profile.document, sort_keys=True)}
    if sched.clock == "roofline":
        scaled = (
            f"; step time × {sched.roofline_scale:g} (roofline_scale, fitted)" if sched.roofline_scale != 1.0 else ""
        )
        parallel = parallel_detail(spec)
        return {
            "clock_detail": f"roofline {GPU_PRESETS[sched.gpu].describe()}{parallel}{scaled}; "
            'terms measured: none (clock = "tables" reads measured GPU tables)',
            "clock_profile": None,
        }
    if sched.clock == "tables":
        clock = clock_for(sched, spec.geometry, spec.kv_bytes_per_token)
        assert isinstance(clock, TablesClock)
        return {"clock_detail": clock.describe(), "clock_profile": None}
    if sched.clock == "measured":
        return {"clock_detail": "measured: each step's wall time", "clock_profile": None}
    return {"clock_detail": "steps: 1 step = 1 s", "clock_profile": None}


def parallel_detail(spec: RunSpec) -> str:
    """The roofline's parallel terms in words ("" at tensor and pipeline parallel size 1)."""
    sched, g = spec.scheduler, spec.geometry
    tp, pp = sched.tensor_parallel_size, sched.pipeline_parallel_size
    out = ""
    link = GPU_PRESETS[sched.gpu].link_bytes_s
    call = f"{LINK_CALL_LATENCY_S * 1e6:g} µs"
    if pp > 1:
        out += (
            f"; PP {pp}: one batch through every stage in turn, each priced as its layers' share "
            f"({g.num_layers} layers, the largest stage {g.layers_per_stage(pp)}), + {pp - 1} sends of "
            f"tokens × {g.hidden_size} × 2 B ÷ {link / 1e9:g} GB/s NVLink + {call} each"
        )
    if tp > 1:
        out += (
            f"; TP {tp}: one rank's weights, KV and FLOPs (÷ {tp}) + 2 ring all-reduces per layer, "
            f"each 2 × ({tp}−1)/{tp} × tokens × {g.hidden_size} × 2 B ÷ {link / 1e9:g} GB/s NVLink (one way) "
            f"+ {call}"
        )
    return out


def requests_columns(seqs: list[Seq], cpu_hit_tokens: Mapping[int, int] | None = None) -> dict[str, list]:
    """The requests table of ``seqs``; ``cpu_hit_tokens``: the tokens each sequence (by
    ``Seq.index``) loaded from a CPU tier, over its admissions (None: no tier, the column null;
    a sequence it does not name loaded none)."""
    cols: dict[str, list] = {name: [] for name in REQUESTS.names}
    for s in seqs:
        cols["cpu_hit_tokens"].append(None if cpu_hit_tokens is None else cpu_hit_tokens.get(s.index, 0))
        cols["request_id"].append(s.request_id)
        cols["sample"].append(s.sample)
        cols["prompt_len"].append(s.prompt_len)
        cols["output_len"].append(s.output_len)
        cols["arrival_s"].append(s.arrival_s)
        cols["first_scheduled_s"].append(None if math.isnan(s.first_scheduled_s) else s.first_scheduled_s)
        cols["first_token_s"].append(None if math.isnan(s.first_token_s) else s.first_token_s)
        cols["finished_s"].append(None if math.isnan(s.finished_s) else s.finished_s)
        cols["num_preemptions"].append(s.num_preemptions)
        cols["peak_allocated_positions"].append(s.peak_allocated)
        cols["prefix_hit_tokens"].append(s.prefix_hit_tokens)
        cols["recomputed_hit_tokens"].append(s.recomputed_hit_tokens)
        cols["session_id"].append(s.session_id if s.session_id >= 0 else None)
        cols["turn"].append(s.turn if s.session_id >= 0 else None)
        cols["sent_s"].append(None if math.isnan(s.sent_s) else s.sent_s)
        cols["token_times_s"].append(s.token_times)
        cols["token_counts"].append(None)  # one token per entry; the serve runner gives its chunks' counts
        cols["status"].append("finished" if s.status == FINISHED else "unfinished")
        cols["kv_first_block"].append(s.first_block if s.block_runs else None)
        cols["kv_block_runs"].append(s.block_runs or None)
    return cols


def session_hit_rates(seqs: list[Seq]) -> dict[str, float | None]:
    """Each conversation's hit rate (its turns' first-admission hit tokens ÷ their prompt tokens),
    mean and lowest over conversations; null without multi-turn sessions."""
    hits: dict[int, list[int]] = {}
    for s in seqs:
        if s.session_id >= 0:
            h = hits.setdefault(s.session_id, [0, 0])
            h[0] += s.prefix_hit_tokens
            h[1] += s.prompt_len
    rates = [h / p for h, p in hits.values() if p]
    if not rates:
        return {"session_hit_rate_mean": None, "session_hit_rate_min": None}
    return {"session_hit_rate_mean": sum(rates) / len(rates), "session_hit_rate_min": min(rates)}


def rounding_frac(seqs: list[Seq], denominator: float) -> float | None:
    """The time-weighted share of the budget held as buddy rounding. A contiguous request never
    preempts: it holds its block from the step that admits it (``first_scheduled_s``) to the end
    of the step it finishes in (``finished_s``), the same steps whose rows count its allocation,
    so this weighs exactly as the step-row fractions do."""
    if denominator <= 0:
        return None
    held = sum(s.rounding * (s.finished_s - s.first_scheduled_s) for s in seqs if s.rounding)
    return held / denominator


def complete_row(
    row: dict[str, object], recorder: RunRecorder, seqs: list[Seq], wall_s: float, sim_time_s: float
) -> dict[str, object]:
    summ = recorder.summary
    generated = sum(s.num_output for s in seqs)
    prompt_tokens = sum(s.prompt_len for s in seqs)
    row.update(summ.fractions())
    row["rounding_frac"] = rounding_frac(seqs, summ.time * summ.budget) if is_contiguous(str(row["policy"])) else None
    row.update(
        {
            "wall_s": wall_s,
            "sim_time_s": sim_time_s,
            "steps": summ.steps,
            "generated_tokens": generated,
            "computed_tokens": summ.computed_tokens,
            "tokens_per_s": generated / sim_time_s if sim_time_s > 0 else None,
            "computed_tokens_per_wall_s": summ.computed_tokens / wall_s if wall_s > 0 else None,
            "preemptions": summ.preemptions,
            "evictions": summ.evictions,
            "prefix_hit_rate": summ.prefix_hit_tokens / prompt_tokens if prompt_tokens else 0.0,
            "recomputed_hit_tokens": summ.recomputed_hit_tokens,
            **session_hit_rates(seqs),
            "peak_running": summ.peak_running,
            "mean_running": summ.w_running / summ.time if summ.time > 0 else None,
            "peak_kv_bytes_allocated": summ.peak_kv_bytes,
            "mean_step_wall_s": summ.wall_sum / summ.wall_n if summ.wall_n else None,
            **latency_summary(seqs),
        }
    )
    return row


def write_status_only(cell: Cell, row: dict[str, object], status: str, error: str) -> RunResult:
    """A run that could not run is still a row (failed / infeasible / oom), with no steps."""
    recorder = RunRecorder(cell.out, cell.run_id, cell.spec.budget_positions)
    row.update(status=status, error=error, steps=0, wall_s=0.0)
    return RunResult(cell.run_id, recorder.finish({name: [] for name in REQUESTS.names}, row))


def clock_for(scheduler: SchedulerSpec, geometry: ModelGeometry, kv_bytes_per_token: int) -> Clock | None:
    """The clock a cell's steps are priced by; None for ``measured`` (the runner's own step time)."""
    if scheduler.clock == "tables":
        return TablesClock(
            geometry,
            kv_bytes_per_token,
            GPU_PRESETS[scheduler.gpu],
            float(scheduler.roofline_scale),
            scheduler.tensor_parallel_size,
            scheduler.pipeline_parallel_size,
        )
    terms = scheduler.profile().terms if scheduler.clock == "profile" else None
    return make_clock(
        scheduler.clock,
        geometry,
        kv_bytes_per_token,
        scheduler.gpu,
        terms,
        float(scheduler.roofline_scale),
        scheduler.tensor_parallel_size,
        scheduler.pipeline_parallel_size,
    )
