"""Contiguous policies: one reservation per request, placed in an arena of positions.

The reservation is made once, at admission, for the request's whole life, as
FasterTransformer/Orca-style systems do; growth within it never fails, so
these policies never preempt. They differ only in how much they reserve.

The arena places it (``harness/sim/policies/arena.py``): first-fit takes exactly the
reservation; buddy takes the block of 2^k ≥ the reservation. A request's allocation A
(``seq.allocated``, ``allocated_positions``) is what the arena really took, so the
measurement definitions (docs/records.md) hold unchanged: internal = Σ max(0, A − F) counts the buddy rounding
2^k − reservation as internal fragmentation (allocated to a request, never filled), beside
the over-reservation reservation − F. The vLLM paper's Fig. 2 counts the allocator's
rounding as external fragmentation instead; ``seq.rounding`` (2^k − reservation, 0 under
first-fit) is that share per request, from which the run records ``rounding_frac``, so the
paper's split is internal − rounding and external + rounding.
"""

from __future__ import annotations

from ..sequence import Seq
from .arena import ARENA_TYPES
from .base import internal_of


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


class ContiguousPolicy:
    name = "contiguous"
    block_size = 1

    def __init__(self, budget_positions: int, max_model_len: int, arena: str = "first-fit") -> None:
        self.budget_positions = budget_positions
        self.max_model_len = max_model_len
        self.arena = ARENA_TYPES[arena](budget_positions)
        self.allocated_positions = 0
        self.internal_positions = 0
        self.shared_excess_positions = 0
        self.evictions = 0
        self._live = 0
        self._frag_key: tuple[int, int] = (-1, -1)
        self._frag = 0

    def reservation(self, seq: Seq) -> int:
        raise NotImplementedError

    def needs_positions(self, seq: Seq) -> int:
        return self.arena.footprint(self.reservation(seq))

    def prefix_hit(self, seq: Seq) -> int:
        return 0

    def allocate(self, seq: Seq, num_tokens: int, must_fit: int = 0) -> bool:
        if seq.allocated:
            # Growth inside the reservation: always fits by construction.
            assert num_tokens <= seq.allocated, (seq, num_tokens)
            return True
        want = self.reservation(seq)
        start = self.arena.allocate(want)
        if start < 0:
            return False
        need = self.arena.footprint(want)  # what the arena really took (2^k under buddy)
        seq.alloc_start = start
        seq.allocated = need
        seq.peak_allocated = max(seq.peak_allocated, need)
        self.allocated_positions += need
        self.internal_positions += internal_of(need, seq.final_len)
        seq.rounding = need - want
        self._live += 1
        return True

    def can_allocate(self, seq: Seq, num_tokens: int, must_fit: int = 0) -> bool:
        """What ``allocate(seq, num_tokens, must_fit)`` would return, changing nothing."""
        return bool(seq.allocated) or self.arena.largest_free() >= self.arena.footprint(self.reservation(seq))

    def free(self, seq: Seq) -> None:
        if not seq.allocated:
            return
        self.arena.free(seq.alloc_start, seq.allocated)
        self.allocated_positions -= seq.allocated
        self.internal_positions -= internal_of(seq.allocated, seq.final_len)
        seq.allocated = 0
        seq.alloc_start = -1
        self._live -= 1

    def allocated_blocks(self) -> int:
        return self._live

    def blocks_needed(self, seq: Seq, num_tokens: int) -> int:
        return 0 if num_tokens <= seq.allocated else 1

    def external_frag(self, head_of_line: Seq | None) -> int:
        if head_of_line is None:
            return 0
        # Free positions in ranges (buddy: blocks) smaller than what the arena would take for it.
        need = self.arena.footprint(self.reservation(head_of_line))
        # The arena changes only on allocate/free: reuse the scan while it and the need stand.
        key = (self.arena.version, need)
        if key != self._frag_key:
            self._frag_key = key
            self._frag = self.arena.free_smaller_than(need)
        return self._frag


class ContiguousMax(ContiguousPolicy):
    """Reserve ``max_model_len`` positions (FasterTransformer, Orca-Max, HF static cache)."""

    name = "contiguous-max"

    def reservation(self, seq: Seq) -> int:
        return self.max_model_len


class ContiguousPow2(ContiguousPolicy):
    """Reserve prompt + the next power of two ≥ output (Orca-Pow2: at most 2× over)."""

    name = "contiguous-pow2"

    def reservation(self, seq: Seq) -> int:
        return min(seq.prompt_len + next_pow2(seq.output_len), self.max_model_len)


class ContiguousOracle(ContiguousPolicy):
    """Reserve exactly prompt + output (Orca-Oracle: knows the future)."""

    name = "contiguous-oracle"

    def reservation(self, seq: Seq) -> int:
        return seq.final_len
