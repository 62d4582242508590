"""Run specifications: frozen, validated at construction, hashed into run ids.

A ``RunSpec`` is one cell of a sweep. Its ``run_id`` hashes everything that
changes what the cell measures (runner, policy, block size, geometry, KV
precision, budget, scheduler settings, and the workload's *content* id), and
nothing that does not (the suite's name, provenance), so the same cell always
gets the same id and sweeps can resume by id.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import TYPE_CHECKING, Any

from ..clock.model import GPU_PRESETS
from ..errors import KvbenchError
from . import identity
from .capabilities import (
    BLOCK_TABLE_POLICIES,
    CPU_TIER_RUNNERS,
    LAYOUT_CONTIGUOUS_RUNNERS,
    LAYOUT_POLICIES,
    LAYOUT_RUNNERS,
    MEASURING_RUNNERS,
    PARALLEL_RUNNERS,
    POLICIES,
    PREFIX_LAYOUT_KINDS,
    RUNNER_FACTS,
    block_bound,
    is_contiguous,
)
from .cpu_tier import PAGE_BYTES, cpu_block_bytes, cpu_tier_blocks
from .geometry import KV_DTYPE_BYTES, ModelGeometry, resolve_model
from .kv_layout import KVLayout, kv_layout
from .kv_use import KVUse
from .units import format_bytes
from .workload_spec import WorkloadSpec

if TYPE_CHECKING:
    from ..clock.profile import ClockProfile

PREEMPTION_MODES = ("recompute", "swap")
CLOCKS = ("steps", "roofline", "tables", "profile", "measured")
# The clocks that price steps on a GPU preset (``gpu``) and read ``roofline_scale``.
GPU_CLOCKS = ("roofline", "tables")
# Where a contiguous policy places its reservations (harness/sim/policies/arena.py); the first is
# the default, left out of run ids so that ids from before the choice existed stay the same.
ARENAS = ("first-fit", "buddy")
# Tensor or pipeline parallel ranks, and GPUs: far beyond any one serving deployment; more is a typo.
MAX_PARALLEL = 4096
# A CPU tier's eviction policies (vLLM's offloading ``CPUOffloadingManager``'s cache_policy,
# ``harness.spec.cpu_tier``); the first is vLLM's default, and the spec's without a tier.
OFFLOAD_POLICIES = ("lru", "arc")


def _positive_int(owner: str, field: str, value: object, upper: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise KvbenchError(f"{owner}: {field} must be a positive integer, got {value!r}")
    if upper is not None and value > upper:
        raise KvbenchError(f"{owner}: {field} = {value} is absurdly large (at most {upper})")


def check_arena(value: object, owner: str) -> None:
    if value not in ARENAS:
        raise KvbenchError(f"{owner}: unknown arena {value!r} (known: {', '.join(ARENAS)})")


def check_offload_policy(value: object, owner: str) -> None:
    if value not in OFFLOAD_POLICIES:
        raise KvbenchError(f"{owner} unknown offload_policy {value!r} (known: {', '.join(OFFLOAD_POLICIES)})")


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    preset: str | None = "opt-13b"
    config: str | None = None
    kv_dtype: str = "fp16"

    def __post_init__(self) -> None:
        if self.kv_dtype not in KV_DTYPE_BYTES:
            raise KvbenchError(f"[model] unknown kv_dtype {self.kv_dtype!r} (known: {', '.join(KV_DTYPE_BYTES)})")
        self.geometry()  # validate the preset / config now, not mid-sweep

    def geometry(self) -> ModelGeometry:
        return resolve_model(self.preset, self.config)


@dataclasses.dataclass(frozen=True)
class MemorySpec:
    kv_budget_bytes: int = 12 * 2**30
    max_model_len: int = 2048
    # A CPU tier of KV memory (vLLM's native KV offloading, ``harness.spec.cpu_tier``): its bytes
    # (0: no tier) and its eviction policy (read only with a tier; the default without one).
    cpu_offload_bytes: int = 0
    offload_policy: str = OFFLOAD_POLICIES[0]

    def __post_init__(self) -> None:
        _positive_int("[memory]", "kv_budget", self.kv_budget_bytes, upper=2**50)  # 1 PiB: beyond any machine
        _positive_int("[memory]", "max_model_len", self.max_model_len, upper=10**8)
        cpu = self.cpu_offload_bytes
        if isinstance(cpu, bool) or not isinstance(cpu, int) or cpu < 0:
            raise KvbenchError(
                f"[memory] cpu_offload must be 0 (no CPU tier) or a positive number of bytes, got {cpu!r}"
            )
        if cpu > 2**50:
            raise KvbenchError(f"[memory] cpu_offload = {format_bytes(cpu)} is absurdly large (at most 1.0 PiB)")
        check_offload_policy(self.offload_policy, "[memory]")


@dataclasses.dataclass(frozen=True)
class SchedulerSpec:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    preemption: str = "recompute"
    clock: str = "steps"
    gpu: str = "A100-40GB"  # roofline clock only
    clock_profile: str | None = None  # profile clock only: a `kvbench calibrate` file
    # roofline clock only: a real engine's step time over the roofline's, fitted to what an engine
    # reports (`kvbench fit-roofline`); 1.0 is the roofline itself.
    roofline_scale: float = 1.0
    max_stall_steps: int = 10_000  # livelock guard: steps without progress before a run fails
    # Parallelism (a suite's [parallel] table): KV heads split across tensor-parallel ranks, layers
    # across pipeline stages; the KV budget is per GPU, and every per-token figure is one rank's.
    # Part of the run's identity only when not 1, so run ids from before they existed stay.
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    # The GPUs the cell may use, when stated: tensor × pipeline parallel size must fit. A check,
    # not part of the identity (it changes nothing a run measures).
    num_gpus: int | None = None

    def __post_init__(self) -> None:
        _positive_int("[scheduler]", "max_num_seqs", self.max_num_seqs, upper=10**6)
        _positive_int("[parallel]", "tensor_parallel_size", self.tensor_parallel_size, upper=MAX_PARALLEL)
        _positive_int("[parallel]", "pipeline_parallel_size", self.pipeline_parallel_size, upper=MAX_PARALLEL)
        if self.num_gpus is not None:
            _positive_int("[parallel]", "num_gpus", self.num_gpus, upper=MAX_PARALLEL)
            ranks = self.tensor_parallel_size * self.pipeline_parallel_size
            if ranks > self.num_gpus:
                raise KvbenchError(
                    f"[parallel] tensor_parallel_size {self.tensor_parallel_size} × pipeline_parallel_size "
                    f"{self.pipeline_parallel_size} = {ranks} GPUs, more than num_gpus = {self.num_gpus}"
                )
        _positive_int("[scheduler]", "max_num_batched_tokens", self.max_num_batched_tokens, upper=10**8)
        _positive_int("[scheduler]", "max_stall_steps", self.max_stall_steps)
        if self.preemption not in PREEMPTION_MODES:
            raise KvbenchError(
                f"[scheduler] unknown preemption {self.preemption!r} (known: {', '.join(PREEMPTION_MODES)})"
            )
        if self.clock not in CLOCKS:
            raise KvbenchError(f"[scheduler] unknown clock {self.clock!r} (known: {', '.join(CLOCKS)})")
        if self.gpu not in GPU_PRESETS:
            raise KvbenchError(f"[scheduler] unknown gpu {self.gpu!r} (known: {', '.join(GPU_PRESETS)})")
        if self.clock == "profile":
            if not isinstance(self.clock_profile, str) or not self.clock_profile:
                raise KvbenchError(
                    '[scheduler] clock = "profile" needs clock_profile = "FILE.json" (made by `kvbench calibrate`)'
                )
            self.profile()  # a missing or corrupt file is an error now, not mid-sweep
        elif self.clock_profile is not None:
            raise KvbenchError(
                f'[scheduler] clock_profile is read only with clock = "profile" (clock is {self.clock!r})'
            )
        scale = self.roofline_scale
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
            raise KvbenchError(f"[scheduler] roofline_scale must be a finite number ≥ 1, got {scale!r}")
        if scale < 1.0:
            why = (
                "the tables are measured times: a scale below 1 prices steps faster than they were measured"
                if self.clock == "tables"
                else "a roofline is the fastest a step can be: a scale below 1 prices steps faster than the hardware"
            )
            raise KvbenchError(f"[scheduler] roofline_scale must be a number ≥ 1 ({why}), got {scale!r}")
        if scale != 1.0 and self.clock not in GPU_CLOCKS:
            raise KvbenchError(
                f'[scheduler] roofline_scale is read only with clock = "roofline" or "tables" (clock is {self.clock!r})'
            )

    def profile(self) -> ClockProfile:
        from ..clock.profile import load_profile  # local: only profile clocks read files

        assert self.clock_profile is not None
        return load_profile(self.clock_profile)


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One cell: a runner and a policy over one workload, precision and budget."""

    runner: str
    policy: str
    block_size: int
    model: ModelSpec
    memory: MemorySpec
    workload: WorkloadSpec
    scheduler: SchedulerSpec
    page_bytes: int = 2 * 2**20  # virtual-contiguous only
    arena: str = ARENAS[0]  # contiguous policies only: first-fit or buddy placement (ignored by the others)
    # vLLM's hybrid KV cache manager (on by default, as in vLLM; off: ``disable_hybrid_kv_cache_manager``,
    # every sliding or chunked layer sized as full attention). Read only for a model whose layers
    # are not all full attention, and part of the run's identity only there.
    hybrid_kv: bool = True
    repeat: int = 0  # repetition index, for timed metrics' spread
    device: str = "auto"  # torch / vllm runners: cpu, cuda or auto
    suite: str = "adhoc"
    # The serve runner only ([runners.serve]): a running OpenAI-compatible server to attach to
    # instead of starting one (part of the run's identity when set: another server is another
    # measurement), how long a started server may take to answer /health, the /metrics scrape
    # interval and the longest one request may take (not identity: a finished run is the same
    # measurement whatever they were; None: the runner's defaults).
    serve_url: str | None = None
    serve_startup_timeout_s: float | None = None
    serve_metrics_interval_s: float | None = None
    serve_request_timeout_s: float | None = None

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise KvbenchError(f"unknown policy {self.policy!r} (known: {', '.join(POLICIES)})")
        _positive_int("cell", "block_size", self.block_size, upper=2**20)
        _positive_int("cell", "page_bytes", self.page_bytes, upper=2**40)
        if isinstance(self.repeat, bool) or not isinstance(self.repeat, int) or self.repeat < 0:
            raise KvbenchError(f"cell: repeat must be a non-negative integer, got {self.repeat!r}")
        check_arena(self.arena, "cell")
        if self.device not in ("auto", "cpu", "cuda"):
            raise KvbenchError(f"cell: unknown device {self.device!r} (known: auto, cpu, cuda)")
        serving = [
            f.name
            for f in dataclasses.fields(self)
            if f.name.startswith("serve_") and getattr(self, f.name) is not None
        ]
        if serving and self.runner != "serve":
            raise KvbenchError(
                f"cell: {serving[0][len('serve_') :]} is a setting of the serve runner ([runners.serve])"
            )
        url = self.serve_url
        if url is not None and not (isinstance(url, str) and url.startswith(("http://", "https://"))):
            raise KvbenchError(f'[runners.serve] url must be "http://host:port", got {url!r}')
        for name in ("serve_startup_timeout_s", "serve_metrics_interval_s", "serve_request_timeout_s"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf
            ):
                raise KvbenchError(
                    f"[runners.serve] {name[len('serve_') :]} must be a positive number of seconds, got {value!r}"
                )
        tp, pp = self.scheduler.tensor_parallel_size, self.scheduler.pipeline_parallel_size
        self.geometry.check_parallel(tp, pp)
        if not isinstance(self.hybrid_kv, bool):
            raise KvbenchError(f"cell: hybrid_kv must be true or false, got {self.hybrid_kv!r}")
        if not self.geometry.is_uniform_full:
            self._check_layout()
        if self.memory.cpu_offload_bytes:
            self._check_cpu_tier()  # after the layout: a tier's blocks are the layout's
        if tp * pp > 1 and self.runner not in PARALLEL_RUNNERS:
            raise KvbenchError(
                f"runner {self.runner}: computes on one device's tensors, so tensor_parallel_size {tp} × "
                f"pipeline_parallel_size {pp} cannot run there (runners that take them: {', '.join(PARALLEL_RUNNERS)})"
            )
        self._check_block_bound()
        clock = self.scheduler.clock
        if clock == "measured" and self.runner not in MEASURING_RUNNERS:
            raise KvbenchError(
                f'runner {self.runner}: clock = "measured" is an engine\'s own step time; only '
                f"{', '.join(MEASURING_RUNNERS[:-1])} and {MEASURING_RUNNERS[-1]} measure steps (give {self.runner} "
                f'"profile" or "roofline", e.g. in [runners.{self.runner}])'
            )
        if clock == "profile":
            self.scheduler.profile().check(
                self.geometry,
                self.model.kv_dtype,
                self.block_size,
                self.policy in BLOCK_TABLE_POLICIES,
                f"clock profile {self.scheduler.clock_profile}",
            )

    def _check_block_bound(self) -> None:
        """Refuse a budget of more KV blocks than the runner can hold (``capabilities.BlockBound``):
        where a runner makes something for every block of the budget, the budget's blocks must fit
        a host, whatever a run would use of them."""
        bound = block_bound(self.runner, self.policy)
        if bound is None:
            return
        blocks, size = self.pool_blocks
        if blocks > bound.max_blocks:
            every = set(bound.policies) >= set(RUNNER_FACTS[self.runner].policies)
            who = self.runner if every else f"{self.runner}'s {self.policy}"
            raise KvbenchError(
                f"kv_budget {format_bytes(self.memory.kv_budget_bytes)} holds {blocks:,} blocks of {size} tokens, "
                f"more than {who} can hold (at most {bound.max_blocks:,} blocks: {bound.why}); give it "
                f"a smaller kv_budget or a larger block_size"
            )

    def _check_cpu_tier(self) -> None:
        """A CPU tier (``memory.cpu_offload_bytes`` > 0) where kvbench mirrors vLLM's offloading:
        prefix caching (over the KV cache groups paged-prefix takes: full attention, MLA, sliding
        window), one rank, recompute preemption, a runner that hosts it, and room for a block."""
        tier = f"cpu_offload {format_bytes(self.memory.cpu_offload_bytes)}"
        if self.policy != "paged-prefix":
            raise KvbenchError(
                f"{tier}: vLLM's offloading connector keys the blocks it stores by their prefix-cache hashes, "
                f'so a CPU tier needs policy "paged-prefix" (the cell\'s policy is {self.policy})'
            )
        if self.runner not in CPU_TIER_RUNNERS:
            raise KvbenchError(
                f"{tier}: runner {self.runner} does not host a CPU tier of KV memory "
                f"(runners that do: {', '.join(CPU_TIER_RUNNERS)})"
            )
        if self.scheduler.preemption != "recompute":
            raise KvbenchError(
                f'{tier}: preemption "{self.scheduler.preemption}" beside a CPU tier is not modelled (vLLM\'s v1 '
                f"preempts by recompute, and its offloading connector is what keeps KV in host memory); give "
                f'preemption "recompute"'
            )
        if self.runner in ("vllm", "serve") and self.device == "cpu":
            raise KvbenchError(
                f"{tier}: runner {self.runner} on device cpu: the worker half of vLLM's offloading connector "
                f"(CPUOffloadingSpec.get_worker) copies blocks on CUDA or XPU streams only; run the cell on a "
                f"CUDA device, or use vllm-sched, whose scheduler half runs on CPU"
            )
        tp, pp = self.scheduler.tensor_parallel_size, self.scheduler.pipeline_parallel_size
        if tp * pp > 1:
            raise KvbenchError(
                f"{tier}: tensor_parallel_size {tp} × pipeline_parallel_size {pp}: kvbench mirrors vLLM's CPU tier "
                f"of one rank (vLLM keeps a copy per worker); run the tier at tensor and pipeline parallel size 1"
            )
        if self.cpu_blocks == 0:
            block = self.block_bytes
            raise KvbenchError(
                f"cpu_offload {self.memory.cpu_offload_bytes:,} B holds no block: one block of {self.block_size} "
                f"tokens is {block:,} B "
                f"({cpu_block_bytes(block):,} B in whole {PAGE_BYTES:,}-B pages, as vLLM stores it); give "
                f"cpu_offload at least that, or 0 for no CPU tier"
            )

    def _check_layout(self) -> None:
        """A model whose layers are not all full attention runs where vLLM's KV cache groups are
        kept (``capabilities.LAYOUT_RUNNERS``, ``LAYOUT_POLICIES``), as vLLM runs it."""
        g = self.geometry
        kinds = ", ".join(f"{g.layer_count(k)} {k}" for k in g.kinds)
        where = f"model {g.name!r} ({kinds} layers)"
        if self.runner not in LAYOUT_RUNNERS or self.policy not in LAYOUT_POLICIES:
            what = f"runner {self.runner}" if self.runner not in LAYOUT_RUNNERS else f"policy {self.policy}"
            raise KvbenchError(
                f"{where}: {what} sizes every layer as full attention K and V, so its cells do not run "
                f"(runners: {', '.join(LAYOUT_RUNNERS)}; policies: {', '.join(LAYOUT_POLICIES)}); "
                f"`kvbench calc --model` gives its KV layout"
            )
        if is_contiguous(self.policy) and self.runner not in LAYOUT_CONTIGUOUS_RUNNERS:
            raise KvbenchError(
                f"{where}: runner {self.runner} does not reserve {self.policy} per KV cache group "
                f"(runners that do: {', '.join(LAYOUT_CONTIGUOUS_RUNNERS)})"
            )
        sched = self.scheduler
        if sched.preemption != "recompute":
            raise KvbenchError(f"{where}: its KV cache groups are preempted by recompute only, as vLLM's v1 does")
        if sched.pipeline_parallel_size != 1:
            raise KvbenchError(f"{where}: its KV cache groups run at pipeline_parallel_size 1 only")
        if self.kv_bytes_per_token <= 0:
            raise KvbenchError(f"{where}: no attention layer keeps KV per token; kvbench's positions need one")
        try:
            _ = self.layout  # vLLM's refusals (state layers with the hybrid manager off) now, not mid-sweep
        except KvbenchError as exc:
            raise KvbenchError(f"{where}: {exc}") from None
        if self.policy == "paged-prefix":
            self._check_prefix_layout(where)

    def _check_prefix_layout(self, where: str) -> None:
        """Prefix caching over KV cache groups: the layer kinds whose vLLM managers kvbench mirrors
        (``capabilities.PREFIX_LAYOUT_KINDS``), every group at the run's block size."""
        other = [k for k in self.geometry.kinds if k not in PREFIX_LAYOUT_KINDS]
        if other:
            raise KvbenchError(
                f"{where}: paged-prefix on {other[0]} layers is not modelled (kvbench mirrors vLLM's prefix "
                f"caching on {', '.join(PREFIX_LAYOUT_KINDS)} layers; run policy paged)"
            )
        sizes = sorted({g.block_size for g in self.layout.groups})
        if sizes != [self.block_size]:
            raise KvbenchError(
                f"{where}: paged-prefix needs every KV cache group at block_size {self.block_size}; vLLM forms "
                f"groups of block size {', '.join(map(str, sizes))} (pages of different sizes)"
            )

    # -- derived quantities every runner must agree on --------------------
    @property
    def layout(self) -> KVLayout:
        """vLLM's KV cache groups and block pool for this cell (``harness.spec.kv_layout``)."""
        sched = self.scheduler
        return kv_layout(
            self.geometry,
            self.model.kv_dtype,
            self.block_size,
            max_model_len=self.memory.max_model_len,
            hybrid=self.hybrid_kv,
            max_num_batched_tokens=sched.max_num_batched_tokens,
            tensor_parallel_size=sched.tensor_parallel_size,
            pipeline_parallel_size=sched.pipeline_parallel_size,
            prefix_caching=self.policy == "paged-prefix",
        )

    @property
    def geometry(self) -> ModelGeometry:
        return self.model.geometry()

    @property
    def kv_use(self) -> KVUse:
        """The layout's blocks in the step columns' terms (``harness.spec.kv_use``)."""
        sched = self.scheduler
        return KVUse.build(
            self.geometry,
            self.layout,
            self.model.kv_dtype,
            self.memory.kv_budget_bytes,
            self.kv_bytes_per_token,
            sched.tensor_parallel_size,
        )

    @property
    def kv_bytes_per_token(self) -> int:
        """One rank's KV bytes per token (the whole model's at tensor and pipeline parallel size 1)."""
        sched = self.scheduler
        return self.geometry.kv_bytes_per_token(
            self.model.kv_dtype, sched.tensor_parallel_size, sched.pipeline_parallel_size
        )

    @property
    def block_bytes(self) -> int:
        """One block id's bytes: a block of every layer on a model of one KV cache group, a block of
        one group's layers over vLLM's groups (the pool's page, ``KVLayout.bytes_per_block``)."""
        if self.geometry.is_uniform_full:
            return self.block_size * self.kv_bytes_per_token
        return self.layout.bytes_per_block

    @property
    def cpu_blocks(self) -> int:
        """The CPU tier's capacity in blocks (0 without a tier), as vLLM's ``CPUOffloadingSpec``
        counts them (``harness.spec.cpu_tier.cpu_tier_blocks``): over KV cache groups a block of
        one group, whose offload keys are the group's own."""
        if not self.memory.cpu_offload_bytes:
            return 0
        return cpu_tier_blocks(self.memory.cpu_offload_bytes, self.block_bytes)

    @property
    def budget_positions(self) -> int:
        return self.memory.kv_budget_bytes // self.kv_bytes_per_token

    @property
    def budget_blocks(self) -> int:
        """Whole blocks of ``block_size`` positions the budget holds (paged runners)."""
        return self.budget_positions // self.block_size

    @property
    def pool_blocks(self) -> tuple[int, int]:
        """The blocks the budget holds and their size in tokens, as a block pool over it is made:
        ``budget_blocks`` of ``block_size``, or for a model of KV cache groups vLLM's split of the
        budget (``KVLayout.num_blocks``, at its block size)."""
        if self.geometry.is_uniform_full:
            return self.budget_blocks, self.block_size
        layout = self.layout
        return layout.num_blocks(self.memory.kv_budget_bytes), layout.block_size

    def canonical(self, workload_id: str) -> dict[str, Any]:
        """What the run id hashes: everything that changes the measurement (``harness.spec.identity``)."""
        return identity.run_canonical(
            {
                # the shapes, not the name: a config file has no preset
                "model": identity.geometry_identity(dataclasses.asdict(self.geometry)),
                "workload_id": workload_id,
                "kv_dtype": self.model.kv_dtype,
                "budget_bytes": self.memory.kv_budget_bytes,
                "max_model_len": self.memory.max_model_len,
                "scheduler": self._scheduler_identity(),
                "runner": self.runner,
                "policy": self.policy,
                "block_size": self.block_size,
                "device": self.device,  # as requested: "auto" resumes as the same cell on any machine
                "page_bytes": self.page_bytes,
                "arena": self.arena,
                "hybrid_kv": None if self.geometry.is_uniform_full else self.hybrid_kv,
                "cpu_offload_bytes": self.memory.cpu_offload_bytes,
                # the tier's eviction policy: none without a tier (the run row's null)
                "offload_policy": self.memory.offload_policy if self.memory.cpu_offload_bytes else None,
                "repeat": self.repeat,
                "serve_url": self.serve_url,
            }
        )

    def _scheduler_identity(self) -> dict[str, Any]:
        # The profile's content, not its path: a recalibrated file is a different clock.
        profile = {"clock_profile_digest": self.scheduler.profile().digest} if self.scheduler.clock_profile else {}
        return identity.scheduler_identity(dataclasses.asdict(self.scheduler), profile)

    def run_id(self, workload_id: str) -> str:
        return identity.digest(self.canonical(workload_id))

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True, default=str)

    def replace(self, **changes: Any) -> RunSpec:
        return dataclasses.replace(self, **changes)
