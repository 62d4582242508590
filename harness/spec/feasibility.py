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
    kv_bytes_per_token: int
    budget_bytes: int

    @property
    def needed_bytes(self) -> int:
        return self.needed_positions * self.kv_bytes_per_token


def levers(
    geometry: ModelGeometry, kv_dtype: str, needed_bytes: int, budget_bytes: int, smaller: str | None = None
) -> list[str]:
    """Each lever with the number that would make ``needed_bytes`` fit ``budget_bytes``."""
    out = []
    ratio = budget_bytes / needed_bytes
    kv_heads = int(geometry.num_kv_heads * ratio)
    if kv_heads >= 1:
        out.append(f"fewer KV heads: at most {kv_heads} of {geometry.num_kv_heads}")
    else:
        out.append("fewer KV heads: not enough even with 1 KV head")
    dtype_bytes = KV_DTYPE_BYTES[kv_dtype]
    if dtype_bytes > 1:
        fp8_bytes = needed_bytes // dtype_bytes
        verdict = "fits" if fp8_bytes <= budget_bytes else "still too large"
        out.append(f"fp8 KV: {format_bytes(fp8_bytes)} ({verdict})")
    out.append(smaller or f"a smaller workload: at most {ratio:.0%} of this size")
    return out


def explain(shortfall: Shortfall, geometry: ModelGeometry, kv_dtype: str) -> str:
    s = shortfall
    return (
        f"infeasible: {s.what} needs {s.needed_positions:,} positions = {format_bytes(s.needed_bytes)} of KV "
        f"({s.kv_bytes_per_token:,} B/token at {kv_dtype}) but the budget holds {s.budget_positions:,} positions "
        f"= {format_bytes(s.budget_bytes)}; levers: "
        + "; ".join(levers(geometry, kv_dtype, s.needed_bytes, s.budget_bytes, s.smaller))
    )
