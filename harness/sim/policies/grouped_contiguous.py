"""The contiguous policies over vLLM's KV cache groups: a model whose layers are not all full attention.

At admission a request reserves, per KV cache group, one run of consecutive block ids
(``contiguous.group_blocks``: ⌈R ÷ block size⌉ for the policy's reservation of R positions, a
sliding or chunked group's bounded by its window, a state group's one block), the runs placed in
group order in one arena over the pool's usable block ids: vLLM's groups draw from one
``BlockPool``, so they share one address space. When one run does not fit none is kept and the
request waits. Each run is held whole until the request is freed (a sliding group's is the ring
its window's blocks cycle through, as a rolling-buffer cache keeps it), so growth never fails
and nothing is preempted; ``runners/vllm/contiguous.py`` installs the same rule in vLLM.

The step columns are ``GroupedPagedPolicy``'s (``harness.spec.kv_use``) with each group's table
read as its whole run: a full group's blocks beyond the final length (and buddy rounding) are
internal, a ring's blocks no layer reads now are reserved. External fragmentation while a request
waits: the budget no whole block id covers, and the free blocks in ranges smaller than every run
the waiting head needs (none of its runs can use them).
"""

from __future__ import annotations

from ...spec.kv_use import KVUse
from ..sequence import Seq
from .arena import ARENA_TYPES
from .contiguous import RESERVATIONS, block_runs, group_blocks, place_runs
from .grouped import GroupedPagedPolicy


class GroupedContiguousPolicy(GroupedPagedPolicy):
    """A contiguous policy (``RESERVATIONS``) over KV cache groups: one run per group per request."""

    def __init__(self, use: KVUse, max_model_len: int, policy: str, arena: str = "first-fit") -> None:
        super().__init__(use, max_model_len)
        self.name = policy
        self._rule = RESERVATIONS[policy]
        self.arena = ARENA_TYPES[arena](use.usable_blocks)
        self._runs: dict[int, list[tuple[int, int]]] = {}  # seq index -> (first unit, units) per group
        self._frag_key: tuple[int, int] = (-1, -1)
        self._frag = 0

    def wants(self, seq: Seq) -> tuple[int, ...]:
        """Blocks ``seq``'s reservation asks of each group (before the arena's rounding)."""
        return group_blocks(self.groups, self._rule(seq.prompt_len, seq.output_len, self.max_model_len))

    def needs_positions(self, seq: Seq) -> int:
        return self.use.positions(sum(self.arena.footprint(n) for n in self.wants(seq)))

    def allocate(self, seq: Seq, num_tokens: int, must_fit: int = 0) -> bool:
        if seq.group_tables:
            return True  # growth inside the reservation
        wants = self.wants(seq)
        runs = place_runs(self.arena, wants)
        if runs is None:
            return False
        took = [n for _, n in runs]
        self._runs[seq.index] = runs
        self._free -= sum(took)
        seq.group_tables = [[n, 0] for n in took]  # the whole run counts as the group's table
        self.live[seq.index] = seq
        seq.allocated = self.use.positions(sum(took))
        seq.peak_allocated = max(seq.peak_allocated, seq.allocated)
        seq.rounding = self.use.positions(sum(took) - sum(wants))
        seq.first_block = runs[0][0]
        seq.block_runs = block_runs(i for start, n in runs for i in range(start, start + n))
        return True

    def can_allocate(self, seq: Seq, num_tokens: int, must_fit: int = 0) -> bool:
        if seq.group_tables:
            return True
        runs = place_runs(self.arena, self.wants(seq))  # placed and given back: the arena is unchanged
        for start, n in runs or ():
            self.arena.free(start, n)
        return runs is not None

    def blocks_needed(self, seq: Seq, num_tokens: int) -> int:
        return 0 if seq.group_tables else sum(self.arena.footprint(n) for n in self.wants(seq))

    def free(self, seq: Seq) -> None:
        for start, n in self._runs.pop(seq.index, ()):
            self.arena.free(start, n)
        super().free(seq)

    def external_frag(self, head_of_line: Seq | None) -> int:
        if head_of_line is None:
            return 0
        need = min(self.arena.footprint(n) for n in self.wants(head_of_line))
        key = (self.arena.version, need)  # the arena changes only on allocate/free: reuse the scan
        if key != self._frag_key:
            self._frag_key = key
            self._frag = self.use.positions(self.arena.free_smaller_than(need))
        return self.budget_positions - self.use.usable_positions + self._frag
