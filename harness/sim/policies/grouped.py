"""``paged`` over vLLM's KV cache groups: a model whose layers are not all full attention.

vLLM's ``KVCacheCoordinator`` gives each request one block table per KV cache group
(``harness.spec.kv_layout``), every group drawing block ids from one ``BlockPool``. Per group
the single-type manager decides (``vllm/v1/core/single_type_kv_cache_manager.py``), and
``KVCacheManager.allocate_slots`` runs them in this order:

1. admission (a waiting request; ``full_sequence_must_fit``): the sum over groups of the blocks
   its whole current sequence needs, a sliding or chunked group's capped at
   ``max_admission_blocks_per_request``, must be free;
2. ``remove_skipped_blocks`` on the tokens computed before the step: a group frees the blocks
   of tokens its layers no longer read (``KVGroup.skipped_tokens``: out of the window, before
   the current chunk, all but the last state) and puts the null block in their place, so a
   table keeps its length. This happens even when step 3 then fails, and a prefill chunk holds
   all its blocks until the next step's call;
3. the sum over groups of ``cdiv(tokens, group block size) − table length`` new blocks must be
   free; they are appended.

Without prefix caching nothing recorded depends on which ids a request holds, so a table is
kept as two counts per group: its length and its leading null blocks. The step columns come
from ``harness.spec.kv_use.KVUse`` (bytes-equivalent positions), as the vLLM runners' do.
"""

from __future__ import annotations

from ...spec.kv_layout import cdiv
from ...spec.kv_use import KVUse, RequestBlocks
from ..sequence import Seq


class GroupedPagedPolicy:
    """vLLM's block tables per KV cache group over one shared pool, as counts."""

    name = "paged"
    block_size = 1  # a hybrid layout's positions are bytes-equivalent: no one block size in positions
    shared_excess_positions = 0
    evictions = 0

    def __init__(self, use: KVUse, max_model_len: int) -> None:
        self.use = use
        layout = use.layout
        self.block_sizes = tuple(g.block_size for g in layout.groups)
        self.caps = tuple(g.admission_blocks for g in layout.groups)
        self.groups = layout.groups
        self.max_model_len = max_model_len
        self.num_blocks = use.usable_blocks
        self.budget_positions = use.budget_positions
        self._free = use.usable_blocks
        self.live: dict[int, Seq] = {}  # sequences holding blocks, by index
        self.internal_positions = 0  # read through ``measure_use``
        self.last_groups: list[tuple[int, int]] = [(0, 0)] * len(layout.groups)

    # -- what the scheduler reads ------------------------------------------------------------
    @property
    def allocated_positions(self) -> int:
        return self.use.positions(self.num_blocks - self._free)

    def allocated_blocks(self) -> int:
        return self.num_blocks - self._free

    def cached_free_blocks(self) -> int:
        return 0

    def external_frag(self, head_of_line: Seq | None) -> int:
        """While anything waits: the budget no whole block id covers (the null block included)."""
        if head_of_line is None:
            return 0
        return self.budget_positions - self.use.usable_positions

    def needs_positions(self, seq: Seq) -> int:
        """The most a request holds at once: per group its whole sequence, a sliding or chunked
        group's capped as vLLM caps its admission (the most it ever holds, vLLM's invariant)."""
        return self.use.positions(self.use.admission_blocks(seq.final_len - 1))

    def measure_use(self) -> tuple[int, int]:
        """(used, internal) positions over the sequences holding blocks; each group's (real
        blocks, used bytes) kept in ``last_groups`` for the step's group rows."""
        used, internal, self.last_groups = self.use.measure(self._requests())
        unit = self.use.unit
        return used // unit, internal // unit

    def _requests(self) -> list[RequestBlocks]:
        out: list[RequestBlocks] = []
        for seq in self.live.values():
            tables = seq.group_tables
            out.append((seq.num_computed, seq.final_len, [t[0] for t in tables], [t[0] - t[1] for t in tables]))
        return out

    # -- allocation --------------------------------------------------------------------------
    def prefix_hit(self, seq: Seq) -> int:
        seq.pending_hits = []
        return 0

    def _admission_need(self, must_fit: int) -> int:
        need = 0
        for bs, cap in zip(self.block_sizes, self.caps):
            blocks = cdiv(must_fit, bs)
            need += blocks if cap is None else min(blocks, cap)
        return need

    def _new_blocks(self, seq: Seq, num_tokens: int) -> int:
        tables = seq.group_tables
        if not tables:
            return sum(cdiv(num_tokens, bs) for bs in self.block_sizes)
        return sum(max(cdiv(num_tokens, bs) - t[0], 0) for bs, t in zip(self.block_sizes, tables))

    def _skip(self, seq: Seq) -> None:
        """``remove_skipped_blocks``: free the blocks of tokens no layer of a group reads any more."""
        computed = min(seq.num_computed, self.max_model_len)
        for g, t in zip(self.groups, seq.group_tables):
            skipped = min(g.skipped_tokens(computed) // g.block_size, t[0])
            if skipped > t[1]:
                self._free += skipped - t[1]
                t[1] = skipped

    def can_allocate(self, seq: Seq, num_tokens: int, must_fit: int = 0) -> bool:
        if must_fit and not seq.group_tables and self._admission_need(must_fit) > self._free:
            return False
        return self._new_blocks(seq, num_tokens) <= self._free + self._skippable(seq)

    def _skippable(self, seq: Seq) -> int:
        computed = min(seq.num_computed, self.max_model_len)
        return sum(
            max(min(g.skipped_tokens(computed) // g.block_size, t[0]) - t[1], 0)
            for g, t in zip(self.groups, seq.group_tables)
        )

    def allocate(self, seq: Seq, num_tokens: int, must_fit: int = 0) -> bool:
        """As ``allocate_slots``: the admission gate, then the skipped blocks freed (whatever
        follows), then the new blocks if they fit. False when they do not."""
        tables = seq.group_tables
        if must_fit and not tables and self._admission_need(must_fit) > self._free:
            return False
        if tables:
            self._skip(seq)
        new = self._new_blocks(seq, num_tokens)
        if new > self._free:
            return False
        self._free -= new
        if not tables:
            seq.group_tables = tables = [[0, 0] for _ in self.block_sizes]
            self.live[seq.index] = seq
        for bs, t in zip(self.block_sizes, tables):
            t[0] = max(t[0], cdiv(num_tokens, bs))
        held = sum(t[0] - t[1] for t in tables)
        seq.allocated = self.use.positions(held)
        if seq.allocated > seq.peak_allocated:
            seq.peak_allocated = seq.allocated
        return True

    def blocks_needed(self, seq: Seq, num_tokens: int) -> int:
        return self._new_blocks(seq, num_tokens)

    def free(self, seq: Seq) -> None:
        tables = seq.group_tables
        if tables:
            self._free += sum(t[0] - t[1] for t in tables)
            seq.group_tables = []
            del self.live[seq.index]
        seq.allocated = 0
        seq.pending_hits = []
