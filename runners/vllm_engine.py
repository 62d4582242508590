"""The ``vllm`` runner: the full vLLM engine (v1, offline, in this process) on a GPU.

Engine. ``LLMEngine.from_engine_args`` rather than ``LLM``: ``LLM.generate``
runs a whole batch to completion and takes no stat loggers, while kvbench has
to release requests between steps, time each step and attach a stat logger.
The engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``,
set by this runner; vLLM caches it for the rest of the process) so that the
runner can read the scheduler's per-request state after each step.

Settings, all explicit (``engine_args``): ``num_gpu_blocks_override =
spec.budget_blocks + 1`` (vLLM's block pool keeps one *null block*, exactly as
in ``vllm-sched``), ``block_size``, ``kv_cache_dtype`` (fp16/bf16 → ``auto``
with the model dtype matching; fp8/fp8_e4m3/fp8_e5m2 → vLLM's fp8 formats;
int8 and fp32 are refused), ``enable_prefix_caching`` (off for ``paged``, on
for ``paged-prefix``), ``max_num_seqs``, ``max_num_batched_tokens``,
``max_model_len``, chunked prefill on, FCFS, synchronous scheduling (one
``step()`` = schedule + execute + update), ``load_format="dummy"`` (random
weights, nothing downloaded), ``skip_tokenizer_init=True``, ``seed=0``,
``disable_log_stats=False``; ``gpu_memory_utilization`` is at most 0.9 and
never above the device's free fraction at start (vLLM refuses to start
otherwise; the KV cache size comes from the block override, not from it).
``enforce_eager`` (no torch.compile, no CUDA graphs) is on when
``KVBENCH_VLLM_ENFORCE_EAGER=1``; such runs say ``(eager)`` in
``attention_backend``. The model is a directory holding only a generated Llama
``config.json`` with the run's geometry (``vllm_adapter.write_model_dir``), or
the directory the suite's ``config`` names, used as it is.

Requests. The same sequences and token ids as ``vllm-sched``
(``expand_seqs``: each of a request's n samples is its own request with the
same prompt; ``vllm_sched.PromptIds``), as ``TokensPrompt`` with
``SamplingParams(max_tokens=out, min_tokens=out, ignore_eos=True,
temperature=0)``, so every output has exactly the workload's length. They are
released by the simulator's rule against kvbench's clock (``spec.scheduler.
clock``), like every other runner: before each ``step()`` every request that
has arrived by ``now`` is added; when the engine is idle, ``now`` jumps to the
next arrival; after a step ``now`` advances by the clock's step time (1 s under
``steps``; under ``roofline`` the step's tokens, context and attention pairs as
read below). So the request sets offered to vLLM follow the same arrival rule
as ``torch``'s, while which of them vLLM runs in each step is its own decision.

Per step, everything is sampled at one moment: the end of ``step()``, where
vLLM makes its ``SchedulerStats`` (after the step's outputs are applied, so
requests that finished in the step have released their blocks; ``sim`` and
``vllm-sched`` sample after scheduling, before outputs are applied). A stat
logger (``StatLoggerBase``) receives the stats; the in-process scheduler is
read at the same moment:

- ``running``/``waiting``: ``SchedulerStats.num_running_reqs`` /
  ``num_waiting_reqs + num_skipped_waiting_reqs``;
- ``allocated_blocks`` = round(``kv_cache_usage`` × usable blocks)
  (``kv_cache_usage`` counts whole blocks: 1 − free / (pool − null block));
  ``allocated_positions`` = ``allocated_blocks`` × ``block_size``;
- ``used_positions`` = Σ ``num_computed_tokens`` of the running requests
  minus the positions of blocks held by more than one request beyond the first
  holder, as ``vllm-sched`` derives it (blocks per request from
  ``kv_cache_manager.get_block_ids``); ``internal_frag_positions`` = Σ
  max(0, blocks × block_size − (prompt + output)), capped so that
  ``reserved`` = allocated − used − internal is never negative; ``external``
  = the budget left below one whole block while anything waits;
- ``admitted``: requests running now that were not running after the last
  step (new or resumed), plus those admitted and finished within the step;
  ``preempted``: requests running after the last step that are neither running
  nor finished now; ``finished``: outputs marked finished;
- ``scheduled_tokens`` = Σ over scheduled requests of the growth of their
  ``num_computed_tokens`` (a finished request ends at prompt + output − 1),
  minus the step's prefix-cache hits;
- ``prefix_hit_tokens``: ``prefix_cache_stats.hits + preempted_hits``;
- ``evicted_blocks``: 0, not measured (vLLM counts evictions only with KV
  events on; ``vllm-sched`` counts them by wrapping its block pool);
- ``kv_bytes_allocated`` = ``allocated_blocks`` × the bytes of one block in the
  engine's KV cache tensors (the KV spec's page size × its layers, read from
  the engine's ``kv_cache_config``; it must equal ``block_size`` ×
  ``kv_bytes_per_token`` or the run fails: same budget, same bytes). The
  tensors themselves are allocated once, for all blocks, at start-up;
- ``step_wall_s``: wall time of ``step()`` followed by
  ``torch.cuda.synchronize()`` (scheduling, the model on the GPU, sampling,
  output processing).

Per request: ``first_scheduled_s`` (start of the step after which it was
first seen running, or finished), ``first_token_s`` and ``finished_s`` (end of
the step whose outputs carried its first token / its finish), in kvbench's
clock; ``num_preemptions`` from vLLM's ``FinishedRequestStats`` (counted here
for requests that did not finish); ``peak_allocated_positions`` from its
blocks; ``prefix_hit_tokens`` = ``RequestOutput.num_cached_tokens``.

Run row: ``tokens_per_s`` = generated tokens / Σ ``step_wall_s`` (device time,
as the reports expect for ``vllm``); ``wall_tokens_per_s`` the same (the
``torch`` runner's definition, so the decomposition's runtime factor compares
like with like); ``sim_time_s`` is kvbench's clock; ``device`` =
``torch.cuda.get_device_name()``; ``attention_backend`` = the backends of the
worker's attention groups, if the worker exposes them. Running out of GPU
memory (at start-up or mid-run) makes an ``oom`` row.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import os
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable, Sequence

from harness.clock import StepWork, make_clock
from harness.errors import KvbenchError, one_line
from harness.feasibility import explain
from harness.policies import make_policy
from harness.recorder import RunRecorder
from harness.sequence import FINISHED, Seq
from harness.specs import RunSpec
from runners import vllm_adapter
from runners.base import Cell
from runners.common import base_row, complete_row, expand_seqs, requests_columns, shortfall, write_status_only

NO_CUDA = ("no CUDA device: the full vLLM engine needs a GPU; "
           "on CPU use runner vllm-sched (vLLM's scheduler and allocator)")
HOSTED_POLICIES = ("paged", "paged-prefix")
POLICY_ERROR = "the vllm runner hosts only paged and paged-prefix; contiguous policies run on sim/torch"
UNSUPPORTED_KV_DTYPES = ("int8", "fp32")
ENGINE_SEED = 0  # vLLM's seed: the dummy weights and its sampler (greedy here)
MAX_GPU_MEMORY_UTILIZATION = 0.9
MIN_GPU_MEMORY_UTILIZATION = 0.05
EAGER_ENV = "KVBENCH_VLLM_ENFORCE_EAGER"


# -- the device: one seam, replaced in tests -------------------------------------------

class Cuda:
    """The few CUDA facts the runner needs."""

    @staticmethod
    def available() -> bool:
        import torch

        return bool(torch.cuda.is_available())

    @staticmethod
    def synchronize() -> None:
        import torch

        torch.cuda.synchronize()

    @staticmethod
    def device_name() -> str:
        import torch

        return torch.cuda.get_device_name()

    @staticmethod
    def cuda_version() -> str | None:
        import torch

        return torch.version.cuda

    @staticmethod
    def free_fraction() -> float:
        """Free device memory as a fraction of the total, after releasing torch's cache."""
        import torch

        gc.collect()
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info()
        return free / total

    @staticmethod
    def release() -> None:
        import torch

        gc.collect()
        torch.cuda.empty_cache()


CUDA = Cuda()


# -- the spec, checked and mapped to vLLM's settings -------------------------------------

def check_spec(spec: RunSpec) -> None:
    """What the engine can host: paged allocation, recompute preemption, a vLLM KV dtype, CUDA."""
    if spec.policy not in HOSTED_POLICIES:
        raise KvbenchError(POLICY_ERROR)
    if spec.scheduler.preemption != "recompute":
        raise KvbenchError(f"the vllm runner: vLLM's v1 engine preempts by recompute only, "
                           f"not {spec.scheduler.preemption}")
    if spec.device == "cpu":
        raise KvbenchError("the vllm runner: device 'cpu' was asked for; the full vLLM engine needs CUDA "
                           "(on CPU use runner vllm-sched)")
    kv_settings(spec)


def kv_settings(spec: RunSpec) -> tuple[str, str]:
    """(vLLM ``kv_cache_dtype``, model ``dtype``) for the spec's KV precision."""
    kv = spec.model.kv_dtype
    if kv in UNSUPPORTED_KV_DTYPES:
        raise KvbenchError(f"the vllm runner: kv_dtype {kv} is not supported (vLLM's KV cache takes fp16, bf16, "
                           f"fp8, fp8_e4m3, fp8_e5m2)")
    _, cache_dtype, model_dtype = vllm_adapter.kv_dtype_of(spec)
    return cache_dtype, model_dtype


def num_gpu_blocks(spec: RunSpec) -> int:
    """The block pool vLLM gets: the budget's whole blocks + its null block (as ``vllm-sched``)."""
    # vllm_adapter.VllmScheduler computes the same number inline (budget_blocks + 1) but
    # exposes no helper for it.
    return spec.budget_blocks + 1


def check_max_model_len(cell: Cell) -> str | None:
    """vLLM refuses to start unless one ``max_model_len`` request fits the usable blocks."""
    spec = cell.spec
    need = -(-spec.memory.max_model_len // spec.block_size)
    if spec.budget_blocks >= need:
        return None
    fits = spec.budget_blocks * spec.block_size
    return (f"infeasible: vLLM refuses to start when one max_model_len request does not fit its KV cache: "
            f"max_model_len {spec.memory.max_model_len} needs {need:,} blocks of {spec.block_size} but the budget "
            f"holds {spec.budget_blocks:,}; levers: max_model_len at most {fits:,}, or a larger kv_budget")


def model_dir(spec: RunSpec, scratch: Path) -> Path:
    """The model directory vLLM loads: the suite's own directory as is, else a generated one."""
    if spec.model.config is not None and Path(spec.model.config).is_dir():
        return Path(spec.model.config).resolve()
    return vllm_adapter.write_model_dir(spec, scratch / "model").resolve()


def enforce_eager_default() -> bool:
    return os.environ.get(EAGER_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def gpu_memory_utilization(free_fraction: float) -> float:
    util = min(MAX_GPU_MEMORY_UTILIZATION, math.floor((free_fraction - 0.02) * 100) / 100)
    if util < MIN_GPU_MEMORY_UTILIZATION:
        raise KvbenchError(f"the vllm runner: only {free_fraction:.0%} of the GPU's memory is free; "
                           f"vLLM needs at least {MIN_GPU_MEMORY_UTILIZATION + 0.02:.0%}")
    return util


def engine_args(spec: RunSpec, model: Path, *, gpu_memory_utilization: float = MAX_GPU_MEMORY_UTILIZATION,
                enforce_eager: bool = False) -> Any:
    """vLLM's ``EngineArgs`` for the cell, every setting that matters made explicit."""
    from vllm.engine.arg_utils import EngineArgs

    cache_dtype, model_dtype = kv_settings(spec)
    sched = spec.scheduler
    return EngineArgs(
        model=str(model),
        skip_tokenizer_init=True,
        load_format="dummy",
        dtype=model_dtype,
        kv_cache_dtype=cache_dtype,
        block_size=spec.block_size,
        num_gpu_blocks_override=num_gpu_blocks(spec),
        enable_prefix_caching=spec.policy == "paged-prefix",
        max_num_seqs=sched.max_num_seqs,
        max_num_batched_tokens=sched.max_num_batched_tokens,
        max_model_len=spec.memory.max_model_len,
        enable_chunked_prefill=True,
        scheduling_policy="fcfs",
        async_scheduling=False,
        disable_log_stats=False,
        seed=ENGINE_SEED,
        gpu_memory_utilization=gpu_memory_utilization,
        enforce_eager=enforce_eager,
    )


def sampling_params(output_len: int) -> Any:
    """Exactly ``output_len`` tokens: no stop token, greedy."""
    from vllm import SamplingParams

    return SamplingParams(max_tokens=output_len, min_tokens=output_len, ignore_eos=True, temperature=0.0,
                          detokenize=False)


def tokens_prompt(ids: Sequence[int]) -> Any:
    from vllm.inputs import TokensPrompt

    return TokensPrompt(prompt_token_ids=list(ids))


# -- the engine boundary --------------------------------------------------------------------

class StatSink:
    """Collects what vLLM hands its stat loggers, one (SchedulerStats, IterationStats) per call."""

    def __init__(self) -> None:
        self.records: list[tuple[Any, Any]] = []

    def logger_factory(self) -> type:
        """A ``StatLoggerBase`` subclass writing into this sink (vLLM calls it with (vllm_config, engine_index))."""
        from vllm.v1.metrics.loggers import StatLoggerBase

        sink = self

        class KvbenchStatLogger(StatLoggerBase):
            def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
                self.engine_index = engine_index

            def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
                       engine_idx: int = 0) -> None:
                sink.records.append((scheduler_stats, iteration_stats))

            def log_engine_initialized(self) -> None:
                pass

        return KvbenchStatLogger

    def drain(self) -> list[tuple[Any, Any]]:
        out, self.records = self.records, []
        return out


@dataclasses.dataclass
class EngineHandle:
    """A started engine: ``engine`` has ``add_request``/``step``/``has_unfinished_requests``;
    ``scheduler`` is its in-process v1 scheduler (read, never driven)."""

    engine: Any
    scheduler: Any
    attention_backend: str | None
    close: Callable[[], None]


def _attention_backends(worker: Any) -> list[str]:
    """Names of the attention backends a GPU worker's model runner selected (run inside the worker)."""
    names: set[str] = set()
    stack = list(getattr(worker.model_runner, "attn_groups", []) or [])
    while stack:
        item = stack.pop()
        if isinstance(item, (list, tuple)):
            stack.extend(item)
        elif getattr(item, "backend", None) is not None:
            names.add(item.backend.get_name())
    return sorted(names)


def make_engine(args: Any, stat_loggers: list[Any]) -> EngineHandle:
    """Start vLLM's engine in this process. The only place that does; tests replace it."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process
    from vllm.v1.engine.llm_engine import LLMEngine

    engine = LLMEngine.from_engine_args(args, stat_loggers=stat_loggers, enable_multiprocessing=False)

    def close() -> None:
        client = getattr(engine, "engine_core", None)
        try:
            if client is not None:
                client.shutdown()
        finally:
            try:
                from vllm.distributed import cleanup_dist_env_and_memory

                cleanup_dist_env_and_memory()
            except Exception:  # cleanup is best effort; the next engine will say if it matters
                pass

    scheduler = getattr(getattr(getattr(engine, "engine_core", None), "engine_core", None), "scheduler", None)
    if scheduler is None:
        close()
        raise KvbenchError("the vllm runner: vLLM's engine core is not in this process, so its scheduler "
                           "cannot be read (VLLM_ENABLE_V1_MULTIPROCESSING must be 0)")
    backend: str | None = None
    try:
        names = engine.collective_rpc(_attention_backends)[0]
        backend = ", ".join(names) or None
    except Exception:
        backend = None
    if backend is None:
        configured = getattr(getattr(engine.vllm_config, "attention_config", None), "backend", None)
        backend = getattr(configured, "name", None) or (str(configured) if configured else None)
    return EngineHandle(engine, scheduler, backend, close)


def kv_bytes_per_block(scheduler: Any) -> int:
    """Bytes of one block across the engine's KV cache (page size × layers, summed over groups)."""
    config = scheduler.kv_cache_config
    return sum(group.kv_cache_spec.page_size_bytes * len(group.layer_names) for group in config.kv_cache_groups)


def blocks_of(scheduler: Any, request_id: str) -> int:
    """Blocks a request holds (the first KV cache group: kvbench's models have one)."""
    ids = scheduler.kv_cache_manager.get_block_ids(request_id)
    return len(ids[0]) if ids else 0


@dataclasses.dataclass(frozen=True)
class Occupancy:
    """The running requests' state at the end of a step."""

    computed: dict[str, int]  # request id -> num_computed_tokens
    blocks: dict[str, int]  # request id -> blocks held
    computed_tokens: int
    held_blocks: int  # shared blocks counted per holder
    internal_positions: int  # Σ max(0, blocks × block_size − final length)


def occupancy(scheduler: Any, final_len: Callable[[str], int], block_size: int) -> Occupancy:
    computed: dict[str, int] = {}
    blocks: dict[str, int] = {}
    total = held = internal = 0
    for req in scheduler.running:
        rid = req.request_id
        c = req.num_computed_tokens
        nb = blocks_of(scheduler, rid)
        computed[rid] = c
        blocks[rid] = nb
        total += c
        held += nb
        extra = nb * block_size - final_len(rid)
        if extra > 0:
            internal += extra
    return Occupancy(computed, blocks, total, held, internal)


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):
        return True
    if type(exc).__name__ == "OutOfMemoryError":  # torch.OutOfMemoryError (torch.cuda.OutOfMemoryError)
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


# -- the runner ---------------------------------------------------------------------------

class VllmRunner:
    name = "vllm"

    def unavailable(self) -> str | None:
        reason = vllm_adapter.unavailable()
        if reason is not None:
            return reason
        try:
            if not CUDA.available():
                return NO_CUDA
        except Exception as exc:  # a broken torch install
            return f"torch cannot query CUDA ({one_line(str(exc))})"
        return None

    def run(self, cell: Cell) -> dict[str, object]:
        spec = cell.spec
        check_spec(spec)
        seqs = expand_seqs(cell)
        row = base_row(cell, self.name)
        short = shortfall(cell, seqs, make_policy(spec))
        if short is not None:
            return write_status_only(cell, row, "infeasible", explain(short, spec.geometry, spec.model.kv_dtype))
        refused = check_max_model_len(cell)
        if refused is not None:
            return write_status_only(cell, row, "infeasible", refused)
        vllm_adapter.load()  # the version gate, one line on an unsupported vLLM
        if not CUDA.available():
            raise KvbenchError(NO_CUDA)
        row["device"] = CUDA.device_name()
        row["cuda_version"] = CUDA.cuda_version()
        eager = enforce_eager_default()
        with tempfile.TemporaryDirectory(prefix="kvbench-vllm-") as tmp:
            args = engine_args(spec, model_dir(spec, Path(tmp)), enforce_eager=eager,
                               gpu_memory_utilization=gpu_memory_utilization(CUDA.free_fraction()))
            sink = StatSink()
            handle: EngineHandle | None = None
            oom: str | None = None
            try:
                try:
                    handle = make_engine(args, [sink.logger_factory()])
                except KvbenchError:
                    raise
                except Exception as exc:
                    if is_oom(exc):
                        raise
                    raise KvbenchError(f"vLLM's engine did not start: {type(exc).__name__}: "
                                       f"{one_line(str(exc))[:400]}") from None
                if handle.attention_backend is not None:
                    row["attention_backend"] = handle.attention_backend + (" (eager)" if eager else "")
                elif eager:
                    row["attention_backend"] = "(eager)"
                return self._drive(cell, seqs, handle, sink, row)
            except BaseException as exc:
                if not is_oom(exc):
                    raise
                oom = one_line(f"{type(exc).__name__}: {exc}")[:500]
            finally:
                if handle is not None:
                    handle.close()
                    handle = None
                CUDA.release()
        # Outside the except block: the traceback no longer pins the engine's memory.
        return write_status_only(cell, row, "oom", f"out of memory on {row['device']}: {oom}")

    def _drive(self, cell: Cell, seqs: list[Seq], handle: EngineHandle, sink: StatSink,
               row: dict[str, object]) -> dict[str, object]:
        spec = cell.spec
        bs = spec.block_size
        budget = spec.budget_positions
        usable = spec.budget_blocks
        engine, scheduler = handle.engine, handle.scheduler
        pool = scheduler.kv_cache_config.num_blocks
        if pool != usable + 1:
            raise KvbenchError(f"vLLM's engine made a pool of {pool} blocks, expected {usable + 1} "
                               f"(the budget's {usable} + its null block)")
        block_bytes = kv_bytes_per_block(scheduler)
        if block_bytes != bs * spec.kv_bytes_per_token:
            raise KvbenchError(f"vLLM's KV cache holds {block_bytes:,} B per block of {bs}, kvbench's geometry "
                               f"{bs * spec.kv_bytes_per_token:,} B ({spec.kv_bytes_per_token:,} B/token at "
                               f"{spec.model.kv_dtype}): the runs would not share one budget")
        external_when_waiting = budget - usable * bs
        clock = make_clock(spec.scheduler.clock, spec.geometry, spec.kv_bytes_per_token, spec.scheduler.gpu)
        from runners.vllm_sched import PromptIds

        prompts = PromptIds(cell)
        pending = deque(sorted(seqs, key=lambda s: (s.arrival_s, s.index)))
        by_internal: dict[str, Seq] = {}
        internal_of: dict[int, str] = {}
        last_computed: dict[str, int] = {}  # running requests after the last step
        vllm_preemptions: dict[str, int] = {}  # external id -> vLLM's count, at finish
        final_len = lambda rid: by_internal[rid].final_len  # noqa: E731
        recorder = RunRecorder(cell.out, cell.run_id, budget)
        max_stall = spec.scheduler.max_stall_steps
        now = 0.0
        step = stall = 0
        device_s = 0.0
        status, error = "ok", None
        t0 = time.perf_counter()
        try:
            while pending or engine.has_unfinished_requests():
                # Arrivals: the simulator's rule (Scheduler._release_arrivals).
                if pending and not engine.has_unfinished_requests() and pending[0].arrival_s > now:
                    now = pending[0].arrival_s
                while pending and pending[0].arrival_s <= now:
                    s = pending.popleft()
                    rid = engine.add_request(str(s.index), tokens_prompt(prompts.of(s)), sampling_params(s.output_len))
                    rid = str(rid) if rid is not None else str(s.index)
                    by_internal[rid] = s
                    internal_of[s.index] = rid
                t_s = now
                w0 = time.perf_counter()
                outputs = engine.step()
                CUDA.synchronize()
                wall = time.perf_counter() - w0
                device_s += wall
                records = sink.drain()
                stats = [r[0] for r in records if r[0] is not None]
                iterations = [r[1] for r in records if r[1] is not None]
                for it in iterations:
                    for fin in getattr(it, "finished_requests", ()) or ():
                        if fin.request_id is not None:
                            vllm_preemptions[str(fin.request_id)] = fin.num_preemptions

                # Outputs: tokens so far, finishes.
                first_token: list[Seq] = []
                finished: list[Seq] = []
                for out in outputs:
                    seq = seqs[int(out.request_id)]
                    produced = len(out.outputs[0].token_ids) if out.outputs else 0
                    if produced > seq.num_output:
                        if seq.num_output == 0:
                            first_token.append(seq)
                        seq.num_output = produced
                    if out.num_cached_tokens:
                        seq.prefix_hit_tokens = max(seq.prefix_hit_tokens, int(out.num_cached_tokens))
                    if out.finished and seq.status != FINISHED:
                        seq.status = FINISHED
                        finished.append(seq)

                if not stats:  # the scheduler held no request: nothing was scheduled, no time passes
                    for seq in first_token:
                        seq.first_token_s = now
                    for seq in finished:
                        seq.finished_s = now
                    stall += 1
                    if stall > max_stall:
                        status, error = "failed", f"livelock: {stall} engine steps without scheduler work"
                        break
                    continue
                ss = stats[-1]
                occ = occupancy(scheduler, final_len, bs)
                hits = sum(s.prefix_cache_stats.hits + s.prefix_cache_stats.preempted_hits for s in stats)

                # Who was scheduled, admitted, preempted: compare with the last step.
                grown = context = pairs = admitted = 0

                def account(seq: Seq, rid: str, c: int, held: int) -> None:
                    """Request ``rid`` has ``c`` computed tokens and ``held`` positions after this step."""
                    nonlocal grown, context, pairs, admitted
                    n = c - last_computed.get(rid, 0)
                    if n > 0:
                        grown += n
                        context += c
                        pairs += n * c
                    if rid not in last_computed:
                        admitted += 1
                        if math.isnan(seq.first_scheduled_s):
                            seq.first_scheduled_s = t_s
                    if held > seq.peak_allocated:
                        seq.peak_allocated = held

                for rid, c in occ.computed.items():
                    seq = by_internal[rid]
                    if seq.status != FINISHED:
                        account(seq, rid, c, occ.blocks[rid] * bs)
                done_ids = set()
                for seq in finished:  # finished during the step: gone from the scheduler already
                    rid = internal_of[seq.index]
                    done_ids.add(rid)
                    c = seq.final_len - 1
                    account(seq, rid, c, -(-c // bs) * bs)
                preempted = 0
                for rid in last_computed:
                    if rid not in occ.computed and rid not in done_ids:
                        preempted += 1
                        by_internal[rid].num_preemptions += 1
                last_computed = {rid: c for rid, c in occ.computed.items() if rid not in done_ids}
                scheduled_tokens = max(0, grown - hits)

                dt = clock.step_time(StepWork(scheduled_tokens, context, pairs))
                now = t_s + dt
                for seq in first_token:
                    seq.first_token_s = now
                for seq in finished:
                    seq.finished_s = now

                allocated_blocks = min(usable, max(0, round(ss.kv_cache_usage * usable)))
                allocated = allocated_blocks * bs
                shared_excess = max(0, occ.held_blocks - allocated_blocks) * bs
                used = min(allocated, max(0, occ.computed_tokens - shared_excess))
                internal = min(occ.internal_positions, allocated - used)
                waiting = ss.num_waiting_reqs + getattr(ss, "num_skipped_waiting_reqs", 0)
                recorder.add_step((
                    step, t_s, dt, ss.num_running_reqs, waiting, admitted, len(finished), preempted,
                    scheduled_tokens, allocated_blocks, allocated, used, allocated - used - internal, internal,
                    external_when_waiting if waiting else 0, budget - allocated, 0, hits,
                    allocated_blocks * block_bytes, wall,
                ))
                step += 1
                # Livelock guard, as in runners.common.drive.
                stall = stall + 1 if scheduled_tokens == 0 and not first_token and not finished and not pending else 0
                if stall > max_stall:
                    status = "failed"
                    error = (f"livelock: {stall} steps without progress with {waiting} waiting and "
                             f"{ss.num_running_reqs} running")
                    break
        except BaseException:
            recorder.abort()
            raise
        wall_s = time.perf_counter() - t0
        for seq in seqs:  # vLLM's own count is the record where it gave one
            count = vllm_preemptions.get(str(seq.index))
            if count is not None:
                seq.num_preemptions = count
        row = complete_row(row, recorder, seqs, wall_s, now)
        generated = row["generated_tokens"]
        per_device_s = generated / device_s if device_s > 0 else None  # type: ignore[operator]
        row.update(status=status, error=error, tokens_per_s=per_device_s, wall_tokens_per_s=per_device_s)
        recorder.finish(requests_columns(seqs), row)
        return row
