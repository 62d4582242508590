"""Step clocks: how long a scheduler step takes in simulated seconds.

``steps`` makes every step one second, so arrival times read as step counts.
``roofline`` prices a step from the model geometry and a GPU preset: a step
reads the weights once and the KV of every scheduled request's context, and
performs 2 FLOPs per parameter per scheduled token plus attention; its time is
the larger of bytes over bandwidth and FLOPs over the peak rate. It ignores
kernel launch overheads and the sampler, which is why its absolute numbers sit
below a real engine's; it exists so that Poisson and trace arrivals interact
with step durations in a meaningful way.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from harness.geometry import ModelGeometry


@dataclasses.dataclass(frozen=True)
class GpuPreset:
    name: str
    memory_bytes: int
    bandwidth_bytes_s: float
    peak_flops: float  # dense fp16/bf16 tensor-core rate


GPU_PRESETS: dict[str, GpuPreset] = {
    g.name: g
    for g in (
        GpuPreset("A100-40GB", 40 * 10**9, 1.555e12, 312e12),
        GpuPreset("A100-80GB", 80 * 10**9, 2.039e12, 312e12),
        GpuPreset("H100", 80 * 10**9, 3.35e12, 989e12),
        GpuPreset("H200", 141 * 10**9, 4.8e12, 989e12),
    )
}


@dataclasses.dataclass(frozen=True)
class StepWork:
    """What one step computes, in tokens; enough for any clock."""

    scheduled_tokens: int  # new tokens computed this step
    context_tokens: int  # Σ over scheduled requests of their context after the step (KV read)
    attention_pairs: int  # Σ new_tokens × context, for attention FLOPs


class Clock:
    """One second per step."""

    name = "steps"

    def step_time(self, work: StepWork) -> float:
        return 1.0

    def step_times(self, scheduled_tokens: int | np.ndarray, context_tokens: np.ndarray,
                   attention_pairs: np.ndarray) -> np.ndarray:
        """``step_time`` of many steps at once (int64 arrays; ``scheduled_tokens`` one int for
        every step or an int64 array, one per step): the same floats, bit for bit, as calling
        ``step_time`` step by step."""
        return np.ones(len(context_tokens))


class RooflineClock(Clock):
    name = "roofline"

    def __init__(self, geometry: ModelGeometry, kv_bytes_per_token: int, gpu: GpuPreset,
                 weight_dtype_bytes: int = 2) -> None:
        self._weight_bytes = float(geometry.weight_bytes(weight_dtype_bytes))
        self._kv_bytes_per_token = float(kv_bytes_per_token)
        self._bw = gpu.bandwidth_bytes_s
        self._peak = gpu.peak_flops
        self._flops_per_token = 2.0 * geometry.num_params
        # QK^T and PV: 2 matmuls × 2 FLOPs × heads × head_dim per (query, key) pair per layer
        self._attn_flops_per_pair = 4.0 * geometry.num_layers * geometry.num_attention_heads * geometry.head_dim

    def step_time(self, work: StepWork) -> float:
        bytes_moved = self._weight_bytes + work.context_tokens * self._kv_bytes_per_token
        flops = work.scheduled_tokens * self._flops_per_token + work.attention_pairs * self._attn_flops_per_pair
        return max(bytes_moved / self._bw, flops / self._peak)

    def step_times(self, scheduled_tokens: int | np.ndarray, context_tokens: np.ndarray,
                   attention_pairs: np.ndarray) -> np.ndarray:
        # The same IEEE operations in the same order as step_time: int → float64, ×, +, /, max.
        bytes_moved = self._weight_bytes + context_tokens * self._kv_bytes_per_token
        tokens = scheduled_tokens.astype(np.float64) if isinstance(scheduled_tokens, np.ndarray) else float(scheduled_tokens)
        flops = tokens * self._flops_per_token + attention_pairs * self._attn_flops_per_pair
        return np.maximum(bytes_moved / self._bw, flops / self._peak)


def make_clock(kind: str, geometry: ModelGeometry, kv_bytes_per_token: int, gpu: str) -> Clock:
    if kind == "steps":
        return Clock()
    return RooflineClock(geometry, kv_bytes_per_token, GPU_PRESETS[gpu])
