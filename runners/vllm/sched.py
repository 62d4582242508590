"""The ``vllm-sched`` runner: vLLM's own v1 ``Scheduler`` and ``KVCacheManager`` deciding every
step on the CPU, with the model mocked.

The scheduler is pure Python once it has a ``ModelConfig`` for a generated local model directory,
``DeviceConfig(device="cpu")`` and a ``KVCacheConfig`` with no tensors. vLLM's ``BlockPool`` keeps
block 0 as its null block, so vLLM gets ``budget_blocks + 1`` blocks and lends exactly the
simulator's ``budget_positions // block_size``. Settings are explicit: chunked prefill on, prefix
caching only for ``paged-prefix``, FCFS, synchronous scheduling. The mocked model samples one token
per request whose prefill is complete (``sampled_token``, never a stop token; requests ignore EOS).
The driver loop records it as it records ``sim`` (docs/runners.md).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from ...harness.errors import KvbenchError, one_line
from ...harness.sim.offload.rules import installed_release
from ...harness.sim.policies import make_policy
from ...harness.sim.scheduler import Arrivals
from ...harness.spec.capabilities import is_contiguous
from ...harness.spec.feasibility import explain
from ...harness.spec.specs import RunSpec
from ..base import Cell, RunResult
from ..block_content import sampled_token
from ..common import base_row, expand_seqs, shortfall, write_status_only
from ..driver import drive
from . import build
from .contiguous import ContiguousReservations
from .grouped_contiguous import GroupedReservations
from .kv_specs import groups_of, layer_specs
from .kv_specs import kv_cache_config as planned_kv_cache_config
from .offload import StandInWorker, configure, offload_settings
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
from .steps import VllmStepEngine


def install_contiguous(scheduler: Any, spec: RunSpec) -> ContiguousReservations | GroupedReservations | None:
    """The spec's contiguous policy on a built vLLM scheduler, before its first request (None: paged);
    over KV cache groups, a run per group (``GroupedReservations``)."""
    if not is_contiguous(spec.policy):
        return None
    mml = spec.memory.max_model_len
    if not spec.geometry.is_uniform_full:
        return GroupedReservations(scheduler, spec.policy, spec.arena, spec.layout, spec.kv_use, mml)
    return ContiguousReservations(scheduler, spec.policy, spec.arena, spec.block_size, mml)


def grouped_kv_cache_config(spec: RunSpec, vllm_config: Any) -> tuple[Any, int, int]:
    """vLLM's ``KVCacheConfig`` for a model whose layers are not all full attention, built as the
    engine builds it (every layer's spec, vLLM's grouping and block split over the KV budget),
    with its scheduler and hash block sizes. The hybrid manager is set after the config is built,
    as the platform resolves it there (on the CUDA build without a GPU vLLM turns it off).
    Checked against kvbench's ``kv_layout``: the simulator must draw the same pool."""
    from .kv_specs import block_sizes

    layout = spec.layout
    cc = vllm_config.cache_config
    if cc.kv_cache_layout is None:
        cc.kv_cache_layout = "LBNHC"  # layer-outermost, as vLLM's CPU backend resolves it
    cc.block_size = layout.block_size  # after the Mamba rule, as the platform raises it
    vllm_config.scheduler_config.disable_hybrid_kv_cache_manager = not spec.hybrid_kv
    cc.mamba_cache_mode = layout.mamba_cache_mode
    state = [grp for grp in layout.groups if grp.is_state]
    cc.mamba_block_size = state[0].block_size if state else None
    cc.mamba_page_size_padded = state[0].page_bytes if state else None
    _, cache_dtype, _ = build.kv_dtype_of(spec)
    specs = layer_specs(
        spec.geometry,
        spec.model.kv_dtype,
        block_size=layout.block_size,
        vc=vllm_config,
        tensor_parallel_size=spec.scheduler.tensor_parallel_size,
        cache_dtype=cache_dtype,
    )
    kcc = planned_kv_cache_config(vllm_config, [specs], spec.memory.kv_budget_bytes)
    ours = [(grp.kind, grp.layers, grp.block_size, grp.page_bytes) for grp in layout.groups]
    expected = layout.num_blocks(spec.memory.kv_budget_bytes)
    if groups_of(kcc) != ours or kcc.num_blocks != expected:
        raise KvbenchError(
            f"vLLM formed {len(kcc.kv_cache_groups)} KV cache groups of {kcc.num_blocks} blocks where kvbench's "
            f"layout has {len(ours)} of {expected}; unsupported vLLM grouping"
        )
    scheduler_bs, hash_bs = block_sizes(kcc, vllm_config)
    return kcc, scheduler_bs, hash_bs


class VllmScheduler:
    """vLLM's v1 ``Scheduler`` + ``KVCacheManager`` over a budget of ``spec.budget_blocks`` blocks."""

    def __init__(self, spec: RunSpec, model_dir: Path) -> None:
        build.check_policy(spec)
        build.load()
        torch_dtype_name, cache_dtype, model_dtype = build.kv_dtype_of(spec)
        with build.quiet_vllm():
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
        build.write_model_dir(spec, model_dir)  # an existing local directory: nothing is downloaded
        with build.quiet_vllm():
            try:
                model_config = ModelConfig(
                    model=str(model_dir.resolve()),
                    skip_tokenizer_init=True,
                    max_model_len=spec.memory.max_model_len,
                    dtype=model_dtype,
                )
                cache_config = CacheConfig(
                    block_size=bs, cache_dtype=cache_dtype, enable_prefix_caching=self.caching, **offload_settings(spec)
                )
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
                configure(spec, vllm_config)
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
                hash_bs = None
                if not g.is_uniform_full:  # vLLM's KV cache groups, from every layer's spec
                    kv_cache_config, bs, hash_bs = grouped_kv_cache_config(spec, vllm_config)
                    self.num_blocks = kv_cache_config.num_blocks
                    self.usable_blocks = self.num_blocks - 1
                vllm_config.cache_config.num_gpu_blocks = self.num_blocks
                self.sched = Scheduler(
                    vllm_config=vllm_config,
                    kv_cache_config=kv_cache_config,
                    structured_output_manager=StructuredOutputManager(vllm_config),
                    block_size=bs,
                    hash_block_size=hash_bs,
                    log_stats=False,
                )
            except KvbenchError:
                raise
            except Exception as exc:  # pydantic ValidationError, ValueError, ...
                raise KvbenchError(f"vLLM rejected the configuration: {one_line(str(exc))}") from None

        # A CPU tier: vLLM's connector as built, its worker half stood in for.
        self.offload = StandInWorker(self.sched, spec) if spec.memory.cpu_offload_bytes else None
        self.kv_dtype = layer_spec.dtype  # what vLLM's KV cache spec holds
        self.cache_dtype = self.sched.cache_config.cache_dtype
        manager = self.sched.kv_cache_manager
        self.pool = manager.block_pool
        self.use = None if g.is_uniform_full else spec.kv_use
        self._req_blocks = request_blocks(self.sched) if self.use is None else GroupTables(self.sched)
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
            # Content hashed per hash block (a grouped layout's, resolved by vLLM; else the block).
            self._block_hasher = get_request_block_hasher(hash_bs or bs, hash_fn)
        from vllm.sampling_params import SamplingParams
        from vllm.v1.outputs import ModelRunnerOutput
        from vllm.v1.request import Request

        self._Request, self._SamplingParams, self._Output = Request, SamplingParams, ModelRunnerOutput
        self.requests: dict[str, Any] = {}  # live requests (added, not finished)
        self._final_len: dict[str, int] = {}
        self._answers: dict[str, list[int]] = {}  # scripted answers of conversation turns
        self._preemptions_at_finish: dict[int, int] = {}

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
        out = self.sched.schedule()
        if self.offload is not None:
            self.offload.read(out)
        return read_schedule(out, self.requests, self._req_blocks, int, self.reservations)

    def occupancy(self) -> Occupancy:
        res = self.reservations
        if isinstance(self._req_blocks, GroupTables):
            assert self.use is not None and not isinstance(res, ContiguousReservations)
            return read_group_occupancy(self.sched, self._req_blocks, self._final_len, self.use, res)
        assert not isinstance(res, GroupedReservations)
        return read_occupancy(self.sched, self._req_blocks, self._final_len, self.block_size, self.usable_blocks, res)

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
        kv_out = self.offload.step(out) if self.offload is not None else None
        self.sched.update_from_output(
            out,
            self._Output(
                req_ids=ids,
                req_id_to_index={r: i for i, r in enumerate(ids)},
                sampled_token_ids=sampled,
                kv_connector_output=kv_out,
            ),
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


class VllmSchedRunner:
    name = "vllm-sched"

    def unavailable(self) -> str | None:
        return build.unavailable()

    def run(self, cell: Cell) -> RunResult:
        spec = cell.spec
        build.check_policy(spec)
        build.kv_dtype_of(spec)
        seqs = expand_seqs(cell)
        row = base_row(cell, self.name)
        short = shortfall(cell, seqs, make_policy(spec))
        if short is not None:
            return write_status_only(cell, row, "infeasible", explain(short, spec.geometry, spec.model.kv_dtype))
        with tempfile.TemporaryDirectory(prefix="kvbench-vllm-sched-") as tmp:
            sched = VllmScheduler(spec, Path(tmp) / "model")
            if sched.offload is not None:
                row["offload_rules"] = f"vllm {installed_release()}"  # vLLM's own connector ran the tier
            arrivals = Arrivals(seqs)
            return drive(cell, seqs, arrivals, VllmStepEngine(cell, seqs, sched, arrivals), row)
