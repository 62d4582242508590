"""Can this work fit this KV budget at all? And if not, what would make it fit?

Paging cannot make a payload disappear. When one
request's KV alone exceeds the budget, no allocation policy helps; the levers
are fewer KV heads (GQA/MQA), a smaller KV dtype, or a smaller workload.
"""

from __future__ import annotations

import dataclasses

from .geometry import KV_DTYPE_BYTES, ModelGeometry
from .units import format_bytes


@dataclasses.dataclass(frozen=True)
class Shortfall:
    what: str  # which request or reservation does not fit
    smaller: str  # the "smaller workload" lever, in this shortfall's terms
    needed_positions: int
    budget_positions: int
    kv_bytes_per_token: int  # one rank's (tensor / pipeline parallel): the budget is per GPU
    budget_bytes: int
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1

    @property
    def needed_bytes(self) -> int:
        return self.needed_positions * self.kv_bytes_per_token


def levers(
    geometry: ModelGeometry,
    kv_dtype: str,
    needed_bytes: int,
    budget_bytes: int,
    smaller: str | None = None,
    tensor_parallel_size: int = 1,
) -> list[str]:
    """Each lever with the number that would make ``needed_bytes`` fit ``budget_bytes`` (one
    rank's bytes and one GPU's budget under tensor parallelism)."""
    out = []
    ratio = budget_bytes / needed_bytes
    heads = geometry.kv_heads_per_rank(tensor_parallel_size)
    per_rank = " per rank" if tensor_parallel_size > 1 else ""
    kv_heads = int(heads * ratio)
    if kv_heads >= 1:
        out.append(f"fewer KV heads: at most {kv_heads} of {heads}{per_rank}")
    else:
        out.append(f"fewer KV heads: not enough even with 1 KV head{per_rank}")
    dtype_bytes = KV_DTYPE_BYTES[kv_dtype]
    if dtype_bytes > 1:
        fp8_bytes = needed_bytes // dtype_bytes
        verdict = "fits" if fp8_bytes <= budget_bytes else "still too large"
        out.append(f"fp8 KV: {format_bytes(fp8_bytes)} ({verdict})")
    out.append(smaller or f"a smaller workload: at most {ratio:.0%} of this size")
    return out


def explain(shortfall: Shortfall, geometry: ModelGeometry, kv_dtype: str) -> str:
    s = shortfall
    tp, pp = s.tensor_parallel_size, s.pipeline_parallel_size
    rank = f" per rank at TP {tp} × PP {pp}" if tp * pp > 1 else ""
    gpu = " per GPU" if rank else ""
    return (
        f"infeasible: {s.what} needs {s.needed_positions:,} positions = {format_bytes(s.needed_bytes)} of KV "
        f"({s.kv_bytes_per_token:,} B/token{rank} at {kv_dtype}) but the budget holds {s.budget_positions:,} "
        f"positions = {format_bytes(s.budget_bytes)}{gpu}; levers: "
        + "; ".join(levers(geometry, kv_dtype, s.needed_bytes, s.budget_bytes, s.smaller, tp))
    )
