"""``KVUse.measure`` where requests share blocks: vLLM's prefix caching over KV cache groups.

With prefix caching a cached full block can sit in several requests' tables of one group at
once (the same block id, referenced once per holder). ``KVUse.measure`` sums per request, so a
shared block would count its bytes once per holder. ``measure_shared`` counts each block once:

- a group's real blocks are its distinct block ids (what the pool lends);
- a shared block's used bytes are what at least one holder still reads in it: per layer of the
  group, the tokens of the block inside the span that layer reads (every computed token for full
  and MLA layers, the last ``window − 1`` for sliding layers, the current chunk for chunked
  layers), the most over its holders (those spans all end at the holder's computed length, so
  the largest one covers the others);
- the bytes of a block id its group's layers do not use (padding) count once.

A shared block is a full block every holder has computed, so it never holds positions beyond a
request's final length. State layers keep one private block per request and are not shared here.
The vLLM runners call it on their block tables; the simulator keeps the same three results as
running totals (``harness.sim.policies.shared_totals``), pinned to this function step by step.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .kv_use import KVUse
from .layer_kinds import CHUNKED, SLIDING, STATE_KINDS

NULL_BLOCK = 0  # vLLM's null block id: stands in for blocks a table no longer holds

# One request: computed tokens, final length, per group its block table (``NULL_BLOCK`` for nulls).
RequestTables = tuple[int, int, Sequence[Sequence[int]]]


def _read_tokens(kind: str, window: int, computed: int, start: int, end: int) -> int:
    """Tokens of positions [start, end) a layer of ``kind`` reads at ``computed`` computed tokens."""
    if kind == SLIDING:
        start = max(start, computed - window + 1)
    elif kind == CHUNKED:
        start = max(start, computed // window * window)
    return max(0, min(end, computed) - start)


def measure_shared(use: KVUse, requests: Iterable[RequestTables]) -> tuple[int, int, list[tuple[int, int]]]:
    """(used bytes, internal bytes, per group (distinct real blocks, used bytes)) over ``requests``."""
    requests = list(requests)
    used, internal, groups = use.measure(
        (c, f, [len(t) for t in tables], [sum(1 for b in t if b != NULL_BLOCK) for t in tables])
        for c, f, tables in requests
    )
    out = [list(g) for g in groups]
    for i, g in enumerate(use.groups):
        if g.kind in STATE_KINDS:
            continue
        holders: dict[int, list[tuple[int, int]]] = {}  # block id -> (holder's computed tokens, position)
        for computed, _, tables in requests:
            for j, b in enumerate(tables[i]):
                if b != NULL_BLOCK:
                    holders.setdefault(b, []).append((computed, j))
        bs = g.block_size
        for held in holders.values():
            if len(held) < 2:
                continue
            reads = [
                sum(
                    _read_tokens(kind, window, computed, j * bs, (j + 1) * bs) * nbytes
                    for kind, window, nbytes in g.reads
                )
                for computed, j in held
            ]
            extra = sum(reads) - max(reads)
            used -= extra
            internal -= (len(held) - 1) * g.block_overhead
            out[i][0] -= len(held) - 1
            out[i][1] -= extra
    return used, internal, [(b, u) for b, u in out]
