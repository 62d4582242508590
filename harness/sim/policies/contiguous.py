"""Contiguous policies: one reservation per request, placed in an arena.

The reservation is made once, at admission, for the request's whole life, as
FasterTransformer/Orca-style systems do; growth within it never fails, so
these policies never preempt. They differ only in how much they reserve
(``RESERVATIONS``: one rule per policy, which the vLLM runners install too).

The arena's unit is the cell's ``block_size``: 1 (a token position, the papers'
arithmetic and the default) or whole blocks of N positions, the form a paged engine
can host: a reservation of R positions takes ceil(R / N) consecutive blocks, one
stretch of each layer's KV tensor. ``seq.alloc_start`` and ``seq.allocated`` stay in
positions whatever the unit.

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

from collections.abc import Callable, Iterable, Sequence

from ...spec.kv_layout import KVGroup
from ..sequence import Seq
from .arena import ARENA_TYPES, Arena, BuddyArena
from .base import internal_of


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


# Positions each contiguous policy reserves for a request of (prompt, output) tokens under max_model_len.
RESERVATIONS: dict[str, Callable[[int, int, int], int]] = {
    "contiguous-max": lambda prompt, output, max_model_len: max_model_len,
    "contiguous-pow2": lambda prompt, output, max_model_len: min(prompt + next_pow2(output), max_model_len),
    "contiguous-oracle": lambda prompt, output, max_model_len: prompt + output,
}


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def group_blocks(groups: Sequence[KVGroup], reservation: int) -> tuple[int, ...]:
    """Blocks a reservation of ``reservation`` positions takes in each KV cache group: ⌈R ÷ the
    group's block size⌉, a sliding or chunked group's at most vLLM's per-request admission cap
    (the most blocks its manager ever holds for a request: the run is a ring its window cycles
    through). A state group's block is ``max_model_len`` long without prefix caching: one block."""
    out = []
    for g in groups:
        n = cdiv(reservation, g.block_size)
        out.append(n if g.admission_blocks is None else min(n, g.admission_blocks))
    return tuple(out)


def place_runs(arena: Arena | BuddyArena, wants: Iterable[int]) -> list[tuple[int, int]] | None:
    """One run per want, placed in order in ``arena``, as (start, units taken); None (and the
    arena unchanged) when one does not fit: a request's reservation is whole or nothing."""
    runs: list[tuple[int, int]] = []
    for want in wants:
        start = arena.allocate(want)
        if start < 0:
            for s, took in runs:
                arena.free(s, took)
            return None
        runs.append((start, arena.footprint(want)))
    return runs


def block_runs(ids: Iterable[int]) -> int:
    """Maximal runs of consecutive ids in ``ids``, in the order given (1 for one contiguous run)."""
    runs = 0
    last = None
    for i in ids:
        if last is None or i != last + 1:
            runs += 1
        last = i
    return runs


class ContiguousPolicy:
    name = "contiguous"

    def __init__(
        self, budget_positions: int, max_model_len: int, arena: str = "first-fit", block_size: int = 1
    ) -> None:
        self.budget_positions = budget_positions
        self.max_model_len = max_model_len
        self.block_size = block_size
        self.arena = ARENA_TYPES[arena](budget_positions // block_size)
        # Positions below one whole block at the budget's end: never part of the arena.
        self._tail = budget_positions - self.arena.size * block_size
        self._rule = RESERVATIONS[self.name]
        self.allocated_positions = 0
        self.internal_positions = 0
        self.shared_excess_positions = 0
        self.evictions = 0
        self._live = 0
        self._frag_key: tuple[int, int] = (-1, -1)
        self._frag = 0
        # The last request ``units`` was asked about and its answer: the head of the queue is
        # asked at every admission try and every step's external fragmentation while it waits.
        self._units_of: tuple[Seq | None, int] = (None, 0)

    def reservation(self, seq: Seq) -> int:
        """Positions reserved for ``seq`` (before rounding to the arena's unit)."""
        return self._rule(seq.prompt_len, seq.output_len, self.max_model_len)

    def units(self, seq: Seq) -> int:
        """Arena units (positions or blocks) the arena takes for ``seq``'s reservation."""
        last, units = self._units_of
        if seq is not last:
            units = self.arena.footprint(cdiv(self.reservation(seq), self.block_size))
            self._units_of = (seq, units)
        return units

    def needs_positions(self, seq: Seq) -> int:
        return self.units(seq) * self.block_size

    def prefix_hit(self, seq: Seq) -> int:
        return 0

    def allocate(self, seq: Seq, num_tokens: int, must_fit: int = 0) -> bool:
        if seq.allocated:
            # Growth inside the reservation: always fits by construction.
            assert num_tokens <= seq.allocated, (seq, num_tokens)
            return True
        bs = self.block_size
        want = cdiv(self.reservation(seq), bs)
        start = self.arena.allocate(want)
        if start < 0:
            return False
        took = self.arena.footprint(want)  # what the arena really took (2^k under buddy)
        need = took * bs
        seq.alloc_start = start * bs
        seq.allocated = need
        seq.peak_allocated = max(seq.peak_allocated, need)
        self.allocated_positions += need
        self.internal_positions += internal_of(need, seq.final_len)
        seq.rounding = (took - want) * bs
        seq.first_block = start
        seq.block_runs = 1  # the arena hands out one range
        self._live += 1
        return True

    def can_allocate(self, seq: Seq, num_tokens: int, must_fit: int = 0) -> bool:
        """What ``allocate(seq, num_tokens, must_fit)`` would return, changing nothing."""
        return bool(seq.allocated) or self.arena.largest_free() >= self.units(seq)

    def free(self, seq: Seq) -> None:
        if not seq.allocated:
            return
        bs = self.block_size
        self.arena.free(seq.alloc_start // bs, seq.allocated // bs)
        self.allocated_positions -= seq.allocated
        self.internal_positions -= internal_of(seq.allocated, seq.final_len)
        seq.allocated = 0
        seq.alloc_start = -1
        self._live -= 1

    def cached_free_blocks(self) -> int:
        return 0  # no prefix caching

    def allocated_blocks(self) -> int:
        """Blocks held; a reservation counts as one where the unit is a position."""
        return self._live if self.block_size == 1 else self.allocated_positions // self.block_size

    def blocks_needed(self, seq: Seq, num_tokens: int) -> int:
        return 0 if num_tokens <= seq.allocated else 1

    def external_frag(self, head_of_line: Seq | None) -> int:
        if head_of_line is None:
            return 0
        # Free positions in ranges (buddy: blocks) smaller than what the arena would take for it,
        # and the budget's tail below one whole block.
        need = self.units(head_of_line)
        # The arena changes only on allocate/free: reuse the scan while it and the need stand.
        key = (self.arena.version, need)
        if key != self._frag_key:
            self._frag_key = key
            self._frag = self.arena.free_smaller_than(need) * self.block_size + self._tail
        return self._frag


class ContiguousMax(ContiguousPolicy):
    """Reserve ``max_model_len`` positions (FasterTransformer, Orca-Max, HF static cache)."""

    name = "contiguous-max"


class ContiguousPow2(ContiguousPolicy):
    """Reserve prompt + the next power of two ≥ output (Orca-Pow2: at most 2× over)."""

    name = "contiguous-pow2"


class ContiguousOracle(ContiguousPolicy):
    """Reserve exactly prompt + output (Orca-Oracle: knows the future)."""

    name = "contiguous-oracle"
