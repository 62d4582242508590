"""What a model's KV cache groups hold, in the step columns' terms: one formula for every runner.

For a model whose layers are not all full attention, the runners keep vLLM's KV cache groups
(``kv_layout``): per request, one block table per group, all groups drawing block ids from one
pool of ``usable_blocks`` (vLLM's ``num_blocks`` less its null block). The step columns then count
*bytes-equivalent positions*: one position is ``unit`` bytes, the run's ``kv_bytes_per_token``
(every attention layer sized as full attention, an MLA layer as its latent: what one token costs
with the hybrid manager off). Per step, over the requests holding memory:

- allocated: the pool's blocks in use × the bytes of one block id (``KVLayout.bytes_per_block``);
- used: the bytes each layer still reads, by the layer's own kind (not its group's: with the
  hybrid manager off a sliding layer sits in a full-attention group but reads only its window):
  full and MLA layers every computed token, sliding layers the last ``window − 1``, chunked
  layers the current chunk, state layers their state (``KVGroup.skipped_tokens``'s rule);
- internal: bytes held beyond a request's final length (the last block's tail, per attention
  group) plus the bytes of each held block that no layer of its group uses (padding layers and
  padded pages: a block id costs the largest group's pages);
- reserved: the rest (blocks still held for tokens that left a window, and not yet computed).

``KVUse.measure`` takes, per request, its computed tokens, final length, and per group its block
table's length and real (non-null) blocks: the simulator's policy and the vLLM runners read the
same four things, so both runners' rows come from this one function.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from .geometry import ModelGeometry
from .kv_layout import KVLayout, cdiv
from .layer_kinds import CHUNKED, SLIDING, STATE_KINDS

# One request as ``measure`` reads it: computed tokens, final length, per group (table length, real blocks).
RequestBlocks = tuple[int, int, Sequence[int], Sequence[int]]


@dataclasses.dataclass(frozen=True)
class GroupUse:
    """One group's arithmetic: its layers' bytes per token (attention) and per state, by kind."""

    kind: str
    block_size: int
    token_bytes: int  # bytes per token over the group's real layers (0 for a state group)
    block_overhead: int  # bytes of one block id this group's layers do not use
    # (kind, window, bytes per token or per state) of the group's layers, by their own kind
    reads: tuple[tuple[str, int, int], ...]

    def used_bytes(self, computed: int) -> int:
        """Bytes this group's layers still read for a request with ``computed`` tokens."""
        if computed <= 0:
            return 0
        total = 0
        for kind, window, nbytes in self.reads:
            if kind in STATE_KINDS:
                total += nbytes
            elif kind == SLIDING:
                total += min(computed, window - 1) * nbytes
            elif kind == CHUNKED:
                total += (computed - computed // window * window) * nbytes
            else:
                total += computed * nbytes
        return total


@dataclasses.dataclass(frozen=True)
class KVUse:
    """A layout's blocks in positions of ``unit`` bytes, against a budget of ``budget_bytes``."""

    layout: KVLayout
    groups: tuple[GroupUse, ...]
    unit: int
    usable_blocks: int
    budget_positions: int

    @classmethod
    def build(
        cls, geometry: ModelGeometry, layout: KVLayout, kv_dtype: str, budget_bytes: int, unit: int, tp: int = 1
    ) -> KVUse:
        per_layer = geometry.per_layer()
        bpb = layout.bytes_per_block
        groups = []
        for g in layout.groups:
            reads: dict[tuple[str, int], int] = {}
            for i in g.layers:
                kind, window = per_layer[i]
                if kind in STATE_KINDS:
                    assert geometry.state is not None
                    nbytes = geometry.state.bytes_per_layer(tp)
                else:
                    nbytes = geometry.layer_bytes_per_token(kind, kv_dtype, tp)
                reads[(kind, window)] = reads.get((kind, window), 0) + nbytes
            token_bytes = 0 if g.is_state else len(g.layers) * (g.real_page_bytes // g.block_size)
            groups.append(
                GroupUse(
                    g.kind,
                    g.block_size,
                    token_bytes,
                    bpb - len(g.layers) * g.real_page_bytes,
                    tuple((k, w, b) for (k, w), b in reads.items()),
                )
            )
        return cls(layout, tuple(groups), unit, max(0, layout.num_blocks(budget_bytes) - 1), budget_bytes // unit)

    def positions(self, blocks: int) -> int:
        """``blocks`` block ids in positions (bytes-equivalent, rounded down)."""
        return blocks * self.layout.bytes_per_block // self.unit

    @property
    def usable_positions(self) -> int:
        return self.positions(self.usable_blocks)

    def admission_blocks(self, tokens: int) -> int:
        """Blocks vLLM's admission gate asks of a waiting request of ``tokens`` tokens (nothing
        computed): per group its blocks, capped for sliding and chunked groups."""
        total = 0
        for g in self.layout.groups:
            need = cdiv(tokens, g.block_size)
            total += need if g.admission_blocks is None else min(need, g.admission_blocks)
        return total

    def measure(self, requests: Iterable[RequestBlocks]) -> tuple[int, int, list[tuple[int, int]]]:
        """(used bytes, internal bytes, per group (real blocks, used bytes)) over ``requests``."""
        per_group = [[0, 0] for _ in self.groups]
        used = internal = 0
        for computed, final_len, lengths, reals in requests:
            for i, g in enumerate(self.groups):
                u = g.used_bytes(computed)
                real = reals[i]
                acc = per_group[i]
                acc[0] += real
                acc[1] += u
                used += u
                internal += real * g.block_overhead
                over = lengths[i] * g.block_size - final_len
                if over > 0 and g.token_bytes:
                    internal += over * g.token_bytes
        return used, internal, [(b, u) for b, u in per_group]
