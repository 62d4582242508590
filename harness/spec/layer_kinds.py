"""What each layer of a model keeps between steps, as vLLM sizes it.

Attention layers keep something per token: ``full`` (K and V of every KV head for
every token), ``sliding`` (the same, for the last ``window`` tokens only),
``chunked`` (Llama-4's chunked local attention: the tokens of the current chunk)
and ``mla`` (DeepSeek's multi-head latent attention: one latent of
``kv_lora_rank + qk_rope_head_dim`` values per token, no separate V, the same on
every tensor-parallel rank). State layers keep a fixed amount per request:
``mamba1``, ``mamba2`` and ``gdn`` (Qwen3-Next's gated delta net, linear attention),
their shapes computed as vLLM's ``MambaStateShapeCalculator`` computes them
(``vllm/model_executor/layers/mamba/mamba_utils.py``).

A model's layers are runs of consecutive layers of one kind (``LayerRun``); a
model with state layers has one ``StateGeometry`` shared by all of them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

from ..errors import KvbenchError

FULL, SLIDING, CHUNKED, MLA = "full", "sliding", "chunked", "mla"
MAMBA1, MAMBA2, GDN = "mamba1", "mamba2", "gdn"
ATTENTION_KINDS: tuple[str, ...] = (FULL, SLIDING, CHUNKED, MLA)
STATE_KINDS: tuple[str, ...] = (MAMBA1, MAMBA2, GDN)
WINDOWED_KINDS: tuple[str, ...] = (SLIDING, CHUNKED)  # kinds whose run carries a window (chunk) in tokens
KINDS: tuple[str, ...] = ATTENTION_KINDS + STATE_KINDS
# The longest window (or chunk) a run may carry, in tokens: far past any context length (a window
# as long as the context is full attention), and well inside int64 wherever it is counted with.
MAX_WINDOW = 2**32

# Bytes per element of the dtypes a state is kept in (vLLM's model dtype and its
# mamba_ssm_cache_dtype choices).
STATE_DTYPE_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclasses.dataclass(frozen=True)
class LayerRun:
    """``count`` consecutive layers of one ``kind``; ``window`` is the sliding window or the
    attention chunk in tokens for ``sliding`` and ``chunked``, 0 for every other kind."""

    kind: str
    count: int
    window: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise KvbenchError(f"unknown layer kind {self.kind!r} (known: {', '.join(KINDS)})")
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count <= 0:
            raise KvbenchError(f"layer run of {self.kind}: count must be a positive integer, got {self.count!r}")
        windowed = self.kind in WINDOWED_KINDS
        if isinstance(self.window, bool) or not isinstance(self.window, int) or not 0 <= self.window <= MAX_WINDOW:
            raise KvbenchError(
                f"layer run of {self.kind}: window must be a whole number of tokens up to {MAX_WINDOW:,}, "
                f"got {self.window!r}"
            )
        if windowed and self.window == 0:
            raise KvbenchError(f"{self.kind} layers need a window of at least one token")
        if not windowed and self.window:
            raise KvbenchError(f"{self.kind} layers have no window (got {self.window})")


def runs_of(kinds: list[tuple[str, int]]) -> tuple[LayerRun, ...]:
    """Per-layer (kind, window) pairs, in layer order, as runs of equal neighbours."""
    return merged([LayerRun(kind, 1, window) for kind, window in kinds])


def merged(runs: Iterable[LayerRun]) -> tuple[LayerRun, ...]:
    """Runs with equal neighbours joined, without spelling out their layers one by one."""
    out: list[LayerRun] = []
    for run in runs:
        if out and (out[-1].kind, out[-1].window) == (run.kind, run.window):
            out[-1] = dataclasses.replace(out[-1], count=out[-1].count + run.count)
        else:
            out.append(run)
    return tuple(out)


def _divide(value: int, tp: int, what: str) -> int:
    if value % tp:
        raise KvbenchError(f"tensor_parallel_size {tp} does not divide the state's {what} ({value})")
    return value // tp


@dataclasses.dataclass(frozen=True)
class StateGeometry:
    """The inputs of vLLM's state-shape calculator for one state kind (fields a kind does not
    use stay 0), and the dtypes of its two tensors: the convolution state (the model's dtype)
    and the temporal (SSM / recurrent) state."""

    kind: str
    conv_kernel: int
    intermediate_size: int = 0  # mamba1, mamba2
    state_size: int = 0  # mamba1, mamba2
    n_groups: int = 0  # mamba2
    num_heads: int = 0  # mamba2
    head_dim: int = 0  # mamba2
    num_k_heads: int = 0  # gdn
    num_v_heads: int = 0  # gdn
    head_k_dim: int = 0  # gdn
    head_v_dim: int = 0  # gdn
    conv_dtype: str = "bf16"
    temporal_dtype: str = "bf16"

    def __post_init__(self) -> None:
        if self.kind not in STATE_KINDS:
            raise KvbenchError(f"unknown state kind {self.kind!r} (known: {', '.join(STATE_KINDS)})")
        needed = {
            MAMBA1: ("conv_kernel", "intermediate_size", "state_size"),
            MAMBA2: ("conv_kernel", "intermediate_size", "state_size", "n_groups", "num_heads", "head_dim"),
            GDN: ("conv_kernel", "num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim"),
        }[self.kind]
        for name in needed:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise KvbenchError(f"{self.kind} state: {name} must be a positive integer, got {value!r}")
        for name in ("conv_dtype", "temporal_dtype"):
            if getattr(self, name) not in STATE_DTYPE_BYTES:
                raise KvbenchError(
                    f"{self.kind} state: unknown {name} {getattr(self, name)!r} (known: {', '.join(STATE_DTYPE_BYTES)})"
                )

    def shapes(self, tensor_parallel_size: int = 1) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(conv state, temporal state) of one layer on one rank, as vLLM's calculator gives them
        (conv state as (kernel - 1, channels): its default "SD" layout)."""
        tp = tensor_parallel_size
        if self.kind == MAMBA1:
            conv = _divide(self.intermediate_size, tp, "intermediate size")
            return (self.conv_kernel - 1, conv), (conv, self.state_size)
        if self.kind == MAMBA2:
            # Groups a head shard needs are replicated when TP does not divide them (vLLM's
            # extra_groups_for_head_shards).
            groups = self.n_groups if self.n_groups % tp == 0 else tp
            conv_dim = self.intermediate_size + 2 * groups * self.state_size
            return (
                (self.conv_kernel - 1, _divide(conv_dim, tp, "convolution channels")),
                (_divide(self.num_heads, tp, "heads"), self.head_dim, self.state_size),
            )
        conv_dim = self.head_k_dim * self.num_k_heads * 2 + self.head_v_dim * self.num_v_heads
        return (
            (self.conv_kernel - 1, _divide(conv_dim, tp, "convolution channels")),
            (_divide(self.num_v_heads, tp, "value heads"), self.head_v_dim, self.head_k_dim),
        )

    def bytes_per_layer(self, tensor_parallel_size: int = 1) -> int:
        """One layer's state for one request on one rank (vLLM's ``MambaSpec`` unpadded page)."""
        conv, temporal = self.shapes(tensor_parallel_size)
        return (
            math.prod(conv) * STATE_DTYPE_BYTES[self.conv_dtype]
            + math.prod(temporal) * STATE_DTYPE_BYTES[self.temporal_dtype]
        )
