"""The allocation-policy interface every policy implements, and shared accounting.

A policy backs token positions of live sequences with memory. The scheduler
asks it to grow a sequence (``allocate``), to release one (``free``), and at
admission whether a prefix is already cached (``prefix_hit``). Policies keep
running totals so that a step's measurement costs O(1), not O(live requests):

- ``allocated_positions``: positions physically taken from the budget;
- ``internal_positions``: Σ max(0, A − F) over live sequences (never filled);
- ``shared_excess_positions``: positions counted more than once when several
  sequences reference one physical block (``used`` subtracts it).

``used`` comes from the scheduler (Σ computed positions of live sequences);
``reserved`` is then allocated − used − internal, which equals docs/records.md's
Σ max(0, min(A, F) − U) because U ≤ min(A, F) always holds.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from ..sequence import Seq


@runtime_checkable
class Policy(Protocol):
    name: str
    budget_positions: int
    block_size: int  # allocation granularity in positions (1 for contiguous arenas)
    internal_positions: int
    shared_excess_positions: int
    evictions: int

    @property
    def allocated_positions(self) -> int:
        """Positions physically taken from the budget (a property where it is derived from blocks)."""

    def prefix_hit(self, seq: Seq) -> int:
        """Tokens of ``seq`` already cached (whole blocks); remembered for the next ``allocate``."""

    def allocate(self, seq: Seq, num_tokens: int, must_fit: int = 0) -> bool:
        """Back positions [0, num_tokens) of ``seq``; False (and no change) when it cannot.

        ``must_fit`` > 0 is vLLM's admission gate (``scheduler_reserve_full_isl``):
        admit only if the first ``must_fit`` positions could all be backed now,
        even though chunked prefill allocates just the first chunk.
        """

    def can_allocate(self, seq: Seq, num_tokens: int, must_fit: int = 0) -> bool:
        """What ``allocate(seq, num_tokens, must_fit)`` would return now, changing nothing."""

    def free(self, seq: Seq) -> None:
        """Release everything ``seq`` holds."""

    def allocated_blocks(self) -> int:
        """Blocks (or pages, or 1 per contiguous reservation) in use now."""

    def cached_free_blocks(self) -> int:
        """Free blocks still holding cached content (prefix caching): evictable, hit-able."""

    def blocks_needed(self, seq: Seq, num_tokens: int) -> int:
        """Blocks ``allocate(seq, num_tokens)`` would take for a running ``seq``."""

    def external_frag(self, head_of_line: Seq | None) -> int:
        """Free positions that cannot serve ``head_of_line`` (0 when nothing waits)."""

    def needs_positions(self, seq: Seq) -> int:
        """Positions ``seq`` needs at its largest under this policy (for feasibility)."""


def internal_of(allocated: int, final_len: int) -> int:
    return allocated - final_len if allocated > final_len else 0
