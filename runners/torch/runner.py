"""The ``torch`` runner: one real runtime, two KV caches (docs/runners.md, "Real tensors").

kvbench's scheduler and policy decide every step exactly as in ``sim``
(``runners.sim.SimEngine``, stepped by the driver loop); the executor then computes each
planned step for real with a small Llama-style decoder (``runners.torch.model``) over a
contiguous arena or a paged block pool (``runners.torch.kv``), chosen by the policy, and times
it (``step_wall_s``, device-synchronised). A geometry too large for the machine is refused before
anything is allocated; running out of memory mid-run makes an ``oom`` row.
"""

from __future__ import annotations

import gc
import time
import types

import numpy as np
import torch

from ...harness.errors import KvbenchError, one_line
from ...harness.records.schema import OOM
from ...harness.sim.policies import make_policy
from ...harness.sim.scheduler import StepPlan
from ...harness.sim.sequence import RUNNING, Seq
from ...harness.spec.capabilities import is_contiguous
from ...harness.spec.geometry import ModelGeometry
from ...harness.spec.specs import RunSpec
from ...harness.spec.units import format_bytes
from ..base import Cell, RunResult
from ..common import base_row, expand_seqs, host_available_bytes, shortfall, write_status_only
from ..oom import is_oom
from ..prompts import PromptIds
from ..sim import run_scheduler
from .kv import ContiguousKVCache, KVCache, PagedKVCache
from .model import (
    Attend,
    DecoderModel,
    attention,
    compute_dtype,
    decode_attention,
    kv_storage_dtype,
    layer_param_count,
    param_count,
)

MODEL_SEED = 0  # the weights; token ids follow the workload's seed
WORK_SLACK_BYTES = 64 * 2**20  # allocator and interpreter overhead beyond the estimate
# Plan to use at most this share of the memory available: beyond it the host
# swaps or its OOM killer ends the whole sweep, which no ``oom`` row can record.
MEMORY_HEADROOM = 0.9
# Below this hidden size a CPU step's matmuls are too small to split across
# threads: OpenMP hand-offs cost more than they save, and on a shared machine
# spinning workers made the tiny preset 10-20x slower with 2 threads than with 1.
SINGLE_THREAD_HIDDEN = 512


# -- device and memory -------------------------------------------------------------


def resolve_device(choice: str) -> torch.device:
    if choice == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    if choice == "cuda":
        raise KvbenchError("torch runner: device 'cuda' was asked for but torch sees no CUDA device")
    return torch.device("cpu")


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def available_bytes(device: torch.device) -> int:
    """Free device memory (CUDA), or the host's available memory (CPU)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    return host_available_bytes()


def is_paged(spec: RunSpec) -> bool:
    return not is_contiguous(spec.policy)


def cache_bytes(spec: RunSpec) -> int:
    """Bytes of the cache tensor: the budget's positions (contiguous) or whole blocks (paged)."""
    positions = spec.budget_blocks * spec.block_size if is_paged(spec) else spec.budget_positions
    return positions * spec.kv_bytes_per_token


def memory_need(spec: RunSpec, device: torch.device) -> dict[str, int]:
    """Weights, KV cache and an upper estimate of one step's working memory, in bytes."""
    g = spec.geometry
    cb = torch.empty((), dtype=compute_dtype(spec.model.kv_dtype, device)).element_size()
    weights = param_count(g) * cb + 2 * spec.memory.max_model_len * g.head_dim * cb
    kv = cache_bytes(spec)
    T = spec.scheduler.max_num_batched_tokens
    ctx = spec.memory.max_model_len
    nh, hd = g.num_attention_heads, g.head_dim
    per_token = (4 * g.hidden_size + (nh + 2 * g.num_kv_heads) * hd + 2 * nh * hd + 3 * g.intermediate_size) * cb
    # Batched decode reads every decoding sequence's context padded to the longest:
    # at most max_num_seqs × max_model_len positions of one layer, K and V, and
    # their attention scores.
    padded = min(spec.scheduler.max_num_seqs, spec.budget_positions) * ctx
    work = (
        T * per_token
        + nh * min(T, ctx) * ctx * 4  # one prefill chunk's attention scores
        + padded * (2 * g.num_kv_heads * hd * cb + nh * 4)
        + 2 * min(T, spec.scheduler.max_num_seqs) * g.vocab_size * 4  # sampled logits
        + WORK_SLACK_BYTES
    )
    return {"weights": weights, "kv": kv, "work": work}


def check_fits(spec: RunSpec, device: torch.device) -> None:
    """Refuse, before allocating anything, a geometry this device cannot hold."""
    need = memory_need(spec, device)
    total = sum(need.values())
    avail = int(available_bytes(device) * MEMORY_HEADROOM)
    if total <= avail:
        return
    g = spec.geometry
    cb = torch.empty((), dtype=compute_dtype(spec.model.kv_dtype, device)).element_size()
    per_layer = layer_param_count(g) * cb
    fixed = need["weights"] - g.num_layers * per_layer
    layers_fit = max(0, (avail - fixed - need["kv"] - need["work"]) // per_layer)
    lever = (
        f"at most {layers_fit} of its {g.num_layers} layers would fit (runners.torch.model.scale_layers, "
        f"or a config.json with num_hidden_layers = {layers_fit})"
        if layers_fit
        else "not even one of its layers fits beside this KV budget"
    )
    raise KvbenchError(
        f"torch runner: {g.name} with a {format_bytes(need['kv'])} {spec.model.kv_dtype} KV cache "
        f"on {device_name(device)} "
        f"needs {total:,} B = {format_bytes(total)} (weights {format_bytes(need['weights'])} + KV cache "
        f"{format_bytes(need['kv'])} + working memory {format_bytes(need['work'])}) but {avail:,} B = "
        f"{format_bytes(avail)} is usable ({MEMORY_HEADROOM:.0%} of what is available); {lever}; or shrink kv_budget"
    )


def cpu_threads(geometry: ModelGeometry) -> int:
    """Intra-op threads for a CPU run: one for small models, torch's default otherwise."""
    return 1 if geometry.hidden_size <= SINGLE_THREAD_HIDDEN else torch.get_num_threads()


# -- the executor ------------------------------------------------------------------


class TorchExecutor:
    """Computes each ``StepPlan`` with a real model and KV cache (``runners.sim.StepExecutor``)."""

    def __init__(
        self, cell: Cell, device: torch.device, record_logits: bool = False, batch_decode: bool = True
    ) -> None:
        spec = cell.spec
        g = spec.geometry
        self.spec = spec
        self.device = device
        self.device_name = device_name(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        self.dtype = compute_dtype(spec.model.kv_dtype, device)
        storage = kv_storage_dtype(spec.model.kv_dtype)
        self.model = DecoderModel(
            g, dtype=self.dtype, device=device, seed=MODEL_SEED, max_positions=spec.memory.max_model_len
        )
        if is_paged(spec):
            self.cache: KVCache = PagedKVCache(
                g.num_layers, spec.budget_blocks, spec.block_size, g.num_kv_heads, g.head_dim, storage, device
            )
        else:
            self.cache = ContiguousKVCache(
                g.num_layers, spec.budget_positions, g.num_kv_heads, g.head_dim, storage, device
            )
        assert self.cache.bytes_per_position == spec.kv_bytes_per_token, "cache dtype disagrees with kv_dtype"
        df = cell.workload.requests
        if (df["prefix_len"] > df["prompt_len"]).any():
            raise KvbenchError("torch runner: a request's shared prefix is longer than its prompt")
        self.prompts = PromptIds(cell)
        self.swap = spec.scheduler.preemption == "swap"
        self.record_logits = record_logits
        self.batch_decode = batch_decode
        self.tokens: dict[int, np.ndarray] = {}  # seq index → prompt + output token ids
        self.length: dict[int, int] = {}  # seq index → ids known so far
        self.seqs: dict[int, Seq] = {}
        self.logits: dict[int, list[torch.Tensor]] = {}
        self.holders: dict[int, Seq] = {}  # sequences that may hold cache memory
        self.placement: dict[int, tuple[int, int, list[int]]] = {}  # swap: last placement seen
        self.swapped: dict[int, torch.Tensor] = {}  # swap: host copies of preempted K/V
        self.generated = 0
        self.wall_total = 0.0

    # -- token bookkeeping ---------------------------------------------------------
    def _ids(self, seq: Seq) -> np.ndarray:
        ids = self.tokens.get(seq.index)
        if ids is None:
            ids = np.zeros(seq.prompt_len + seq.output_len, dtype=np.int64)
            ids[: seq.prompt_len] = self.prompts.of(seq)
            self.tokens[seq.index] = ids
            self.length[seq.index] = seq.prompt_len
            self.seqs[seq.index] = seq
        return ids

    def outputs(self) -> dict[tuple[int, int], list[int]]:
        """Generated token ids of every sequence, by (request_id, sample)."""
        return {
            (s.request_id, s.sample): self.tokens[i][s.prompt_len : self.length[i]].tolist()
            for i, s in self.seqs.items()
        }

    def sampled_logits(self) -> dict[tuple[int, int], torch.Tensor]:
        """[outputs, vocab] fp32 logits each token was sampled from (record_logits only)."""
        return {
            (self.seqs[i].request_id, self.seqs[i].sample): torch.stack(rows) for i, rows in self.logits.items() if rows
        }

    # -- swap preemption -------------------------------------------------------------
    def _swap_out(self, seq: Seq) -> None:
        start, allocated, blocks = self.placement[seq.index]
        where = types.SimpleNamespace(alloc_start=start, allocated=allocated, blocks=blocks)
        slots = torch.tensor(self.cache.slots(where, 0, seq.num_computed), dtype=torch.long, device=self.device)  # type: ignore[arg-type]
        self.swapped[seq.index] = self.cache.copy_out(slots)

    # -- one step --------------------------------------------------------------------
    @torch.inference_mode()
    def execute(self, plan: StepPlan) -> tuple[float | None, int | None]:
        t0 = time.perf_counter()
        if self.swap:
            for seq in plan.preempted:  # before anything this step overwrites the freed memory
                if seq.num_computed:
                    self._swap_out(seq)
        if plan.scheduled:
            self._compute(plan.scheduled)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        wall = time.perf_counter() - t0
        self.wall_total += wall
        for seq, _ in plan.scheduled:
            self.holders[seq.index] = seq
            if self.swap:
                self.placement[seq.index] = (seq.alloc_start, seq.allocated, list(seq.blocks))
        for index in [i for i, s in self.holders.items() if s.status != RUNNING]:
            del self.holders[index]  # finished last step, or preempted: memory freed
        return wall, self.cache.allocated_bytes(self.holders.values())

    def _compute(self, scheduled: list[tuple[Seq, int]]) -> None:
        """Compute the new tokens' K/V into the cache, attend, and sample where prefill completes."""
        cache, device = self.cache, self.device
        chunks: list[np.ndarray] = []
        positions: list[int] = []
        slots: list[int] = []
        spans: list[tuple[Seq, int]] = []  # (sequence, context length after this step)
        rows: list[tuple[int, int]] = []  # (first row in the flat batch, new tokens)
        sample_rows: list[int] = []
        samplers: list[Seq] = []
        T = 0
        for seq, n in scheduled:
            end = seq.num_computed  # the scheduler already counts this step's tokens
            start = end - n
            ids = self._ids(seq)
            assert end <= self.length[seq.index], (seq, end, self.length[seq.index])
            held = self.swapped.pop(seq.index, None)
            if held is not None:  # swap in, at the sequence's new placement
                assert held.shape[2] == start, (seq, held.shape, start)
                cache.copy_in(torch.tensor(cache.slots(seq, 0, start), dtype=torch.long, device=device), held)
            chunks.append(ids[start:end])
            positions.extend(range(start, end))
            slots.extend(cache.slots(seq, start, end))
            spans.append((seq, end))
            rows.append((T, n))
            T += n
            if end >= seq.num_tokens:  # prefill complete: this step samples a token
                sample_rows.append(T - 1)
                samplers.append(seq)
        attend = self._attend(torch.tensor(slots, dtype=torch.long).to(device), spans, rows)
        logits = self.model.forward(
            torch.from_numpy(np.concatenate(chunks)).to(device),
            torch.tensor(positions, dtype=torch.long).to(device),
            attend,
            torch.tensor(sample_rows, dtype=torch.long).to(device),
        )
        for i, (seq, tok) in enumerate(zip(samplers, logits.argmax(dim=-1).tolist())):
            k = self.length[seq.index]
            self.tokens[seq.index][k] = tok
            self.length[seq.index] = k + 1
            if self.record_logits:
                self.logits.setdefault(seq.index, []).append(logits[i].cpu())
        self.generated += len(samplers)

    def _attend(self, slots: torch.Tensor, spans: list[tuple[Seq, int]], rows: list[tuple[int, int]]) -> Attend:
        """The model's per-layer attention over this cache for one step.

        Each layer first writes the whole step's new K/V, then reads: decoding
        sequences (one new token) as one padded batch, prefill chunks one by one
        with their causal masks.
        """
        cache, dtype = self.cache, self.dtype
        one = [i for i, (_, n) in enumerate(rows) if n == 1] if self.batch_decode else []
        if len(one) < 2:
            one = []
        many = [i for i, (_, n) in enumerate(rows) if n > 1 or not one]
        reads = cache.plan_reads([spans[i] for i in many])
        many_rows = [rows[i] for i in many]
        batch = cache.plan_batch([spans[i] for i in one]) if one else None
        one_rows = torch.tensor([rows[i][0] for i in one], dtype=torch.long).to(self.device)

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            cache.write(layer, slots, k, v)
            if batch is None:  # every row is in ``many``, in order
                return torch.cat(
                    [
                        attention(q[r : r + n], kv[0].to(dtype), kv[1].to(dtype))
                        for (r, n), kv in zip(many_rows, cache.contexts(layer, reads))
                    ]
                )
            out = q.new_empty(q.shape[0], q.shape[1] * q.shape[2])
            kv = cache.batch_contexts(layer, batch).to(dtype)
            out.index_copy_(0, one_rows, decode_attention(q.index_select(0, one_rows), kv, batch.mask))
            for (r, n), kv in zip(many_rows, cache.contexts(layer, reads)):
                out[r : r + n] = attention(q[r : r + n], kv[0].to(dtype), kv[1].to(dtype))
            return out

        return attend

    def extra_row(self) -> dict[str, object]:
        return {
            "device": self.device_name,
            "attention_backend": self.cache.backend,
            "wall_tokens_per_s": self.generated / self.wall_total if self.wall_total > 0 else None,
            # The CUDA allocator's own figure: weights, KV cache and activations together.
            "device_peak_bytes": (torch.cuda.max_memory_allocated(self.device) if self.device.type == "cuda" else None),
        }


# -- the runner --------------------------------------------------------------------


def run_torch(
    cell: Cell, record_logits: bool = False, batch_decode: bool = True
) -> tuple[RunResult, TorchExecutor | None]:
    """Run one cell; what was recorded, and the executor (its tokens and logits) when the run happened."""
    spec = cell.spec
    device = resolve_device(spec.device)
    if shortfall(cell, expand_seqs(cell), make_policy(spec)) is not None:
        return run_scheduler(cell, "torch"), None  # writes the infeasible row; nothing to build
    check_fits(spec, device)
    executor: TorchExecutor | None = None
    oom: str | None = None
    threads = torch.get_num_threads()
    try:
        if device.type == "cpu":
            torch.set_num_threads(cpu_threads(spec.geometry))
        executor = TorchExecutor(cell, device, record_logits, batch_decode)
        result = run_scheduler(cell, "torch", executor=executor)
    except BaseException as exc:
        if not is_oom(exc):
            raise
        oom = one_line(f"{type(exc).__name__}: {exc}")[:500]
    finally:
        torch.set_num_threads(threads)
    if oom is None:
        return result, executor
    # Outside the except block, so the traceback no longer pins the model and cache.
    executor = None
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    row = base_row(cell, "torch")
    row.update(
        device=device_name(device),
        attention_backend=PagedKVCache.backend if is_paged(spec) else ContiguousKVCache.backend,
    )
    return write_status_only(cell, row, OOM, f"out of memory on {device_name(device)}: {oom}"), None


class TorchRunner:
    name = "torch"

    def unavailable(self) -> str | None:
        return None

    def run(self, cell: Cell) -> RunResult:
        return run_torch(cell)[0]
