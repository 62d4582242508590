"""Step clocks: how long a scheduler step takes in simulated seconds.

``steps``: one second a step (arrival times read as step counts). ``roofline``: the
larger of bytes over achieved bandwidth and FLOPs over achieved peak for one step on a
GPU preset (``ParallelRooflineClock`` under tensor / pipeline parallelism, with its
all-reduces and stage sends). ``profile``: terms fitted to a real engine's steps
(``kvbench calibrate``). ``measured``: no model; the engine runners time each step
(``make_clock`` returns None). docs/clock.md states the model and its limits; the
presets and fitted terms are in ``harness.clock.model``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .model import GPU_PRESETS, ClockTerms, GpuPreset, ModelShape, RecentCounts

Counts = int | np.ndarray  # one count for every step, or an int64 array of one per step

# The fixed cost of one NCCL call across GPUs of one node (an all-reduce, or a stage-to-stage send)
# on top of its bytes ÷ the link's bandwidth: an assumed 10 µs, the order nccl-tests'
# all_reduce_perf reports for its smallest messages (8 B) within one NVLink/NVSwitch node, where
# published runs read from about 10 to 60 µs by launcher and GPU generation (lower under CUDA
# graphs, which vLLM captures). An assumption stated in docs/clock.md, not a measurement of ours.
LINK_CALL_LATENCY_S = 10e-6


def _floats(counts: Counts) -> np.ndarray | float:
    """``counts`` as float64, as ``price`` converts an int (exactly, below 2**53)."""
    return counts.astype(np.float64) if isinstance(counts, np.ndarray) else float(counts)


@dataclasses.dataclass(frozen=True)
class StepWork:
    """What one step computes, in tokens; enough for any clock."""

    scheduled_tokens: int  # new tokens computed this step
    context_tokens: int  # Σ over scheduled requests of their context after the step (KV read)
    attention_pairs: int  # Σ new_tokens × context, for attention FLOPs
    scheduled_seqs: int  # requests scheduled this step (per-request work: inputs, sampling, outputs)


class Clock:
    """One second per step."""

    name = "steps"

    def price(self, scheduled_tokens: int, context_tokens: int, attention_pairs: int, scheduled_seqs: int) -> float:
        """One step's time from its work, in plain ints (the fast path calls it per step without
        building a ``StepWork``); ``step_time`` is this, ``step_times`` the same over arrays."""
        return 1.0

    def price_terms(self) -> tuple[float, float, float, float, float, float, float] | None:
        """The roofline's constants where ``price`` is ``RooflineClock``'s formula, for a compiled
        copy of it (``harness.sim.step_price``); None for any other price."""
        return None

    def step_time(self, work: StepWork) -> float:
        return self.price(work.scheduled_tokens, work.context_tokens, work.attention_pairs, work.scheduled_seqs)

    def step_times(
        self, scheduled_tokens: Counts, context_tokens: np.ndarray, attention_pairs: np.ndarray, scheduled_seqs: Counts
    ) -> np.ndarray:
        """``step_time`` of many steps at once (int64 arrays; ``scheduled_tokens`` and
        ``scheduled_seqs`` one int for every step or an int64 array, one per step): the same
        floats, bit for bit, as calling ``step_time`` step by step."""
        return np.ones(len(context_tokens))

    # A clock may remember the steps it has priced (``ProfileClock``'s primitive caches): a step
    # then lasts ``price(...) + take(...)``, where ``take`` is what this step costs on top because
    # of the steps before it. These three are that memory's whole interface; a clock without one
    # adds nothing (x + 0.0 == x, so every path prices as it did before clocks had memory).
    def take(self, scheduled_tokens: int, scheduled_seqs: int) -> float:
        """A step being taken: its extra cost from the clock's memory, which it then updates."""
        return 0.0

    def peek(
        self, scheduled_tokens: int | np.ndarray, scheduled_seqs: int | np.ndarray, steps: int
    ) -> np.ndarray | None:
        """``take``'s costs for the next ``steps`` steps (ints for all, or arrays, one per step),
        without updating the memory: the fast path prices steps it may not take. None: no memory."""
        return None

    def take_many(self, scheduled_tokens: int | np.ndarray, scheduled_seqs: int | np.ndarray, steps: int) -> None:
        """The first ``steps`` of what ``peek`` priced are taken: update the memory as ``take`` would."""


@dataclasses.dataclass(frozen=True)
class RoofParts:
    """A roofline's per-unit terms for one rank of its largest stage (achieved rates, the preset's
    efficiency factors in): what a clock that prices some terms itself reads of the roofline."""

    bandwidth_bytes_s: float
    peak_flops_s: float
    weight_bytes: float
    kv_bytes_per_token: float
    flops_per_token: float
    attn_flops_per_pair: float
    comm_s_per_token: float  # the stage's all-reduces (TP > 1), per scheduled token
    calls_s: float  # their calls' fixed cost
    stages: float  # layers ÷ the largest stage's layers
    send_s_per_token: float  # the PP − 1 sends between stages, per scheduled token
    sends_s: float  # their calls' fixed cost


class RooflineClock(Clock):
    name = "roofline"

    def __init__(
        self,
        geometry: ModelShape,
        kv_bytes_per_token: int,
        gpu: GpuPreset,
        weight_dtype_bytes: int = 2,
        scale: float = 1.0,
        tensor_parallel_size: int = 1,
        pipeline_parallel_size: int = 1,
    ) -> None:
        # ``scale``: a real engine's step time over the roofline's, fitted to what an engine reports
        # (``[scheduler] roofline_scale``; 1.0: the roofline itself). Multiplying by 1.0 is exact,
        # so an unscaled clock prices every step as it did before the factor existed.
        self.scale = float(scale)
        # One rank's share (``kv_bytes_per_token`` is one rank's already): the weights and FLOPs of
        # the largest pipeline stage's layers, split across the tensor-parallel ranks. At tensor and
        # pipeline parallel size 1 the share is 1.0 and the division by 1 exact: the same floats.
        tp, pp = tensor_parallel_size, pipeline_parallel_size
        stage_layers = geometry.layers_per_stage(pp)
        share = stage_layers / geometry.num_layers
        # The parallel terms ``ParallelRooflineClock`` prices (none at tensor and pipeline parallel
        # size 1). Tensor parallelism: two ring all-reduces per layer of the stage, seconds per
        # scheduled token and the calls' fixed cost. Pipeline parallelism: the stages one batch goes
        # through in turn (layers ÷ the largest stage's, each stage's work being its layers' share),
        # and the PP − 1 sends of the batch's activations between them.
        comm_per_token = calls_s = send_per_token = sends_s = 0.0
        stages = 1.0
        if (tp > 1 or pp > 1) and gpu.link_bytes_s <= 0:
            raise ValueError(f"GPU preset {gpu.name}: no interconnect bandwidth for tensor or pipeline parallelism")
        bytes_per_token = geometry.hidden_size * weight_dtype_bytes
        if tp > 1:
            comm_per_token = 2 * stage_layers * 2.0 * (tp - 1) / tp * bytes_per_token / gpu.link_bytes_s
            calls_s = 2 * stage_layers * LINK_CALL_LATENCY_S
        if pp > 1:
            stages = geometry.num_layers / stage_layers
            send_per_token = (pp - 1) * bytes_per_token / gpu.link_bytes_s
            sends_s = (pp - 1) * LINK_CALL_LATENCY_S
        self.parts = parts = RoofParts(
            # Achieved, not datasheet, rates: the preset's measured efficiency factors fold in here.
            bandwidth_bytes_s=gpu.bandwidth_bytes_s * gpu.bandwidth_efficiency,
            peak_flops_s=gpu.peak_flops * gpu.flops_efficiency,
            weight_bytes=float(geometry.weight_bytes(weight_dtype_bytes)) * share / tp,
            kv_bytes_per_token=float(kv_bytes_per_token),
            flops_per_token=2.0 * geometry.num_params * share / tp,
            # QK^T and PV: 2 matmuls × 2 FLOPs × heads × head_dim per (query, key) pair per layer
            attn_flops_per_pair=4.0 * stage_layers * (geometry.num_attention_heads // tp) * geometry.head_dim,
            comm_s_per_token=comm_per_token,
            calls_s=calls_s,
            stages=stages,
            send_s_per_token=send_per_token,
            sends_s=sends_s,
        )
        # ``price``'s constants in one tuple: the fast path calls it every step.
        self._k = (
            parts.weight_bytes,
            parts.kv_bytes_per_token,
            parts.flops_per_token,
            parts.attn_flops_per_pair,
            parts.bandwidth_bytes_s,
            parts.peak_flops_s,
            self.scale,
        )

    def price(self, scheduled_tokens: int, context_tokens: int, attention_pairs: int, scheduled_seqs: int) -> float:
        weights, kv, per_token, per_pair, bw, peak, scale = self._k
        memory = (weights + context_tokens * kv) / bw
        compute = (scheduled_tokens * per_token + attention_pairs * per_pair) / peak
        return (memory if memory >= compute else compute) * scale  # max(), without the call

    def price_terms(self) -> tuple[float, float, float, float, float, float, float] | None:
        # ``price``'s constants in its order, unless a subclass prices otherwise.
        return self._k if type(self).price is RooflineClock.price else None

    def step_times(
        self, scheduled_tokens: Counts, context_tokens: np.ndarray, attention_pairs: np.ndarray, scheduled_seqs: Counts
    ) -> np.ndarray:
        # The same IEEE operations in the same order as step_time: int → float64, ×, +, /, max, × scale.
        return self._roofs(_floats(scheduled_tokens), context_tokens, attention_pairs) * self.scale

    def _roofs(self, tokens: np.ndarray | float, context_tokens: np.ndarray, attention_pairs: np.ndarray) -> np.ndarray:
        """``price``'s max(memory, compute) of many steps, before the scale."""
        p = self.parts
        bytes_moved = p.weight_bytes + context_tokens * p.kv_bytes_per_token
        flops = tokens * p.flops_per_token + attention_pairs * p.attn_flops_per_pair
        return np.maximum(bytes_moved / p.bandwidth_bytes_s, flops / p.peak_flops_s)


class ParallelRooflineClock(RooflineClock):
    """A step under tensor and pipeline parallelism, one batch at a time:

        stage  = one rank's roofline over the largest stage's layers
                 + 2 ring all-reduces per layer (TP > 1), each 2 × (TP − 1) / TP × tokens × hidden
                   × 2 B ÷ the one-way NVLink bandwidth + ``LINK_CALL_LATENCY_S``
        step   = stage × (layers ÷ largest stage's layers)
                 + (PP − 1) sends of tokens × hidden × 2 B ÷ NVLink + ``LINK_CALL_LATENCY_S`` each

    A Llama/OPT block all-reduces its activations twice (after attention's output projection and
    after the MLP), not overlapped with the rank's compute. Every term of a stage is in proportion
    to its layers, so the stages' sum is the largest stage's price times layers ÷ its layers (PP
    when the layers divide evenly). The stages are summed because kvbench's scheduler, like vLLM's
    when one batch takes every request it can schedule, has one batch in the pipeline at a time:
    vLLM v1 keeps up to PP batches in flight (``max_concurrent_batches``, the engine core's batch
    queue) only when requests are left over for them, so this is its latency per step, and a
    lower bound on its throughput where it fills the pipeline."""

    # The terms are ``RooflineClock.__init__``'s ``parts`` (0 and 1.0 where a size is 1, leaving those floats).

    def price(self, scheduled_tokens: int, context_tokens: int, attention_pairs: int, scheduled_seqs: int) -> float:
        weights, kv, per_token, per_pair, bw, peak, scale = self._k
        p = self.parts
        memory = (weights + context_tokens * kv) / bw
        compute = (scheduled_tokens * per_token + attention_pairs * per_pair) / peak
        stage = (memory if memory >= compute else compute) + scheduled_tokens * p.comm_s_per_token + p.calls_s
        return (stage * p.stages + scheduled_tokens * p.send_s_per_token + p.sends_s) * scale

    def step_times(
        self, scheduled_tokens: Counts, context_tokens: np.ndarray, attention_pairs: np.ndarray, scheduled_seqs: Counts
    ) -> np.ndarray:
        # The same IEEE operations in the same order as price.
        tokens, p = _floats(scheduled_tokens), self.parts
        stage = self._roofs(tokens, context_tokens, attention_pairs) + tokens * p.comm_s_per_token + p.calls_s
        return (stage * p.stages + tokens * p.send_s_per_token + p.sends_s) * self.scale


def _segments(values: int | np.ndarray, steps: int) -> list[tuple[int, int]]:
    """(first step, value) where a per-step value (one int for all steps, or an array) changes.
    A cache touched by the same value on consecutive steps misses at most on the first."""
    if not isinstance(values, np.ndarray):
        return [(0, int(values))] if steps > 0 else []
    v = values[:steps]
    if len(v) == 0:
        return []
    starts = np.flatnonzero(np.concatenate(([True], v[1:] != v[:-1])))
    return [(int(i), int(v[i])) for i in starts]


class ProfileClock(Clock):
    """Step time from a fitted ``ClockTerms`` (``kvbench calibrate``)."""

    name = "profile"

    def __init__(self, terms: ClockTerms) -> None:
        self.terms = terms
        self._c = (
            float(terms.step_s),
            float(terms.per_token_s),
            float(terms.per_seq_s),
            float(terms.per_context_token_s),
            float(terms.per_attention_pair_s),
        )
        self._early = float(terms.per_early_token_s)
        self._knee = int(terms.token_knee)
        # The run's primitive caches: one for the token count (every dense layer), one for the
        # request count (the logits). None when the profile models no cache.
        self._caches = (
            (RecentCounts(terms.primitive_cache), RecentCounts(terms.primitive_cache)) if terms.models_cache else None
        )
        self._miss = (float(terms.miss_s), float(terms.miss_per_token_s), float(terms.seq_miss_s))

    def price(self, scheduled_tokens: int, context_tokens: int, attention_pairs: int, scheduled_seqs: int) -> float:
        # ClockTerms.step_price, on floats unpacked once. The early-token term comes last: with
        # it 0 (a profile from before it), x + 0.0 == x.
        c0, tok, seq, ctx, pair = self._c
        return (
            c0
            + scheduled_tokens * tok
            + scheduled_seqs * seq
            + context_tokens * ctx
            + attention_pairs * pair
            + min(scheduled_tokens, self._knee) * self._early
        )

    def step_times(
        self, scheduled_tokens: Counts, context_tokens: np.ndarray, attention_pairs: np.ndarray, scheduled_seqs: Counts
    ) -> np.ndarray:
        # The same IEEE operations in the same order as step_time: int → float64, ×, + left to right.
        c0, tok, seq, ctx, pair = self._c
        tokens = _floats(scheduled_tokens)
        seqs = _floats(scheduled_seqs)
        early = np.minimum(tokens, float(self._knee)) * self._early
        return ((c0 + tokens * tok + seqs * seq + context_tokens * ctx) + attention_pairs * pair) + early

    def _miss_cost(self, token_miss: bool, seq_miss: bool, scheduled_tokens: int) -> float:
        fixed, per_token, seq = self._miss
        return ((fixed + scheduled_tokens * per_token) if token_miss else 0.0) + (seq if seq_miss else 0.0)

    def take(self, scheduled_tokens: int, scheduled_seqs: int) -> float:
        if self._caches is None or scheduled_tokens == 0:  # an empty step runs no forward pass
            return 0.0
        tokens, seqs = self._caches
        return self._miss_cost(tokens.use(scheduled_tokens), seqs.use(scheduled_seqs), scheduled_tokens)

    def peek(
        self, scheduled_tokens: int | np.ndarray, scheduled_seqs: int | np.ndarray, steps: int
    ) -> np.ndarray | None:
        if self._caches is None:
            return None
        extra = np.zeros(steps)
        self._walk(scheduled_tokens, scheduled_seqs, steps, extra)
        return extra

    def take_many(self, scheduled_tokens: int | np.ndarray, scheduled_seqs: int | np.ndarray, steps: int) -> None:
        if self._caches is not None:
            self._walk(scheduled_tokens, scheduled_seqs, steps, None)

    def _walk(
        self, scheduled_tokens: int | np.ndarray, scheduled_seqs: int | np.ndarray, steps: int, extra: np.ndarray | None
    ) -> None:
        """Use the caches step by step over ``steps`` steps, as ``take`` would: on copies when
        pricing (``extra`` gets each step's cost), on the caches themselves when taking. Only a
        step where a count changes can miss, so only those are visited."""
        assert self._caches is not None
        tokens, seqs = self._caches if extra is None else (self._caches[0].copy(), self._caches[1].copy())
        tok_at = dict(_segments(scheduled_tokens, steps))
        seq_at = dict(_segments(scheduled_seqs, steps))
        tok_now = seq_now = -1
        for i in sorted(tok_at.keys() | seq_at.keys()):
            tok_now = tok_at.get(i, tok_now)
            seq_now = seq_at.get(i, seq_now)
            if tok_now == 0:
                continue
            # Both caches are used on every step; between changes a use hits the most recent
            # key and moves nothing, so skipping those steps leaves the caches as ``take`` would.
            t_miss = tokens.use(tok_now)
            s_miss = seqs.use(seq_now)
            if extra is not None:
                extra[i] = self._miss_cost(t_miss, s_miss, tok_now)


def make_clock(
    kind: str,
    geometry: ModelShape,
    kv_bytes_per_token: int,
    gpu: str,
    terms: ClockTerms | None = None,
    roofline_scale: float = 1.0,
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
) -> Clock | None:
    """The clock a run's steps are priced by; None for ``measured`` (the runner's own step time)."""
    if kind == "steps":
        return Clock()
    if kind == "measured":
        return None
    if kind == "profile":
        assert terms is not None, "a profile clock needs the profile's terms"
        return ProfileClock(terms)
    if kind != "roofline":  # the tables clock is built from its own module (tables_clock.py)
        raise ValueError(f"make_clock builds steps, measured, profile and roofline clocks, not {kind!r}")
    cls = ParallelRooflineClock if tensor_parallel_size > 1 or pipeline_parallel_size > 1 else RooflineClock
    return cls(
        geometry,
        kv_bytes_per_token,
        GPU_PRESETS[gpu],
        scale=roofline_scale,
        tensor_parallel_size=tensor_parallel_size,
        pipeline_parallel_size=pipeline_parallel_size,
    )
