"""Arenas of token positions for the contiguous policies: where a reservation is placed.

Two placements, chosen per cell (``RunSpec.arena``, a suite's ``arena`` key):

- ``Arena`` (``first-fit``, the default): free ranges kept sorted and merged on free; a
  reservation takes exactly its length from the first range that holds it;
- ``BuddyArena`` (``buddy``): the buddy allocation the vLLM paper assumes for Orca
  (PagedAttention, SOSP'23, §6.1: "We assume Orca uses the buddy allocation algorithm to
  determine the memory address to store KV cache"): a reservation takes a whole block of
  2^k ≥ its length, split from larger blocks and coalesced with its buddy when freed.

Both share one interface: ``allocate(length)`` → start or -1, ``free(start, length)``,
``free_ranges()``, ``largest_free()``, ``free_smaller_than(length)``, ``free_total``,
``version``, and ``footprint(length)``: the positions ``allocate(length)`` really takes, which
is what a policy must count as allocated.
"""

from __future__ import annotations

import bisect


class Arena:
    """Free ranges kept sorted by start and merged on free, so holes are exact."""

    name = "first-fit"

    def __init__(self, size: int) -> None:
        self.size = size
        self._starts: list[int] = [0] if size > 0 else []
        self._lengths: list[int] = [size] if size > 0 else []
        self.free_total = size
        self.version = 0  # bumped on every change, so callers can cache scans

    def footprint(self, length: int) -> int:
        """Positions ``allocate(length)`` takes: exactly ``length``."""
        return length

    def allocate(self, length: int) -> int:
        """Start of the first free range that holds ``length`` positions, or -1."""
        self.version += 1
        for i, have in enumerate(self._lengths):
            if have >= length:
                start = self._starts[i]
                if have == length:
                    del self._starts[i], self._lengths[i]
                else:
                    self._starts[i] = start + length
                    self._lengths[i] = have - length
                self.free_total -= length
                return start
        return -1

    def free(self, start: int, length: int) -> None:
        i = bisect.bisect_left(self._starts, start)
        if i > 0 and self._starts[i - 1] + self._lengths[i - 1] > start:
            raise AssertionError(f"double free of range {start}+{length}")
        if i < len(self._starts) and start + length > self._starts[i]:
            raise AssertionError(f"double free of range {start}+{length}")
        self.free_total += length
        self.version += 1
        merge_prev = i > 0 and self._starts[i - 1] + self._lengths[i - 1] == start
        merge_next = i < len(self._starts) and start + length == self._starts[i]
        if merge_prev and merge_next:
            self._lengths[i - 1] += length + self._lengths[i]
            del self._starts[i], self._lengths[i]
        elif merge_prev:
            self._lengths[i - 1] += length
        elif merge_next:
            self._starts[i] = start
            self._lengths[i] += length
        else:
            self._starts.insert(i, start)
            self._lengths.insert(i, length)

    def free_ranges(self) -> list[tuple[int, int]]:
        return list(zip(self._starts, self._lengths))

    def largest_free(self) -> int:
        return max(self._lengths, default=0)

    def free_smaller_than(self, length: int) -> int:
        """Total free positions in ranges too small to hold ``length`` positions."""
        return sum(n for n in self._lengths if n < length)


def top_blocks(size: int) -> list[tuple[int, int]]:
    """The binary decomposition of ``size`` into power-of-two blocks, largest first, as
    (start, length): 600 → (0, 512), (512, 64), (576, 16), (592, 8)."""
    out = []
    start = 0
    for bit in range(max(size, 0).bit_length() - 1, -1, -1):
        if size >> bit & 1:
            out.append((start, 1 << bit))
            start += 1 << bit
    return out


class BuddyArena:
    """Binary buddy allocation over ``size`` positions.

    A request of ``length`` positions takes the lowest-addressed free block of the smallest
    order k with 2^k ≥ ``length``, splitting a larger block in halves when no such block is
    free (the upper halves stay free). A freed block merges with its buddy (start XOR 2^k)
    whenever that buddy is free and whole, and the merged block with its own buddy, and so on.

    The budget is generally not a power of two. Rounding it down to one would waste up to half
    the memory, and rounding it up would hand out memory that does not exist; so the arena is
    the binary decomposition of ``size`` into maximal power-of-two top-level blocks, largest
    first (600 = 512 + 64 + 16 + 8). Each top-level block is a complete buddy tree, exactly as a
    buddy allocator over several power-of-two regions works; and because every block before a
    top-level block of 2^j is a larger power of two, each starts at a multiple of its own
    size, so start XOR 2^k finds the buddy anywhere in the arena. Coalescing stops at a
    top-level block: it has no buddy. Freeing everything gives back exactly those blocks.

    The arena takes 2^k ≥ ``length`` (``footprint``); a policy counts all of it as allocated.
    """

    name = "buddy"

    def __init__(self, size: int) -> None:
        self.size = size
        self.top = top_blocks(size)
        self._top_starts = [s for s, _ in self.top]
        self._top_orders = [n.bit_length() - 1 for _, n in self.top]
        top_order = self._top_orders[0] if self.top else 0
        self._free: list[list[int]] = [[] for _ in range(top_order + 1)]  # order → sorted free starts
        for (start, _), order in zip(self.top, self._top_orders):
            self._free[order].append(start)
        self._live: dict[int, int] = {}  # start → order of each block handed out
        self.free_total = size
        self.version = 0  # bumped on every change, so callers can cache scans

    @staticmethod
    def order_of(length: int) -> int:
        """The smallest k with 2^k ≥ ``length``."""
        return 0 if length <= 1 else (length - 1).bit_length()

    def footprint(self, length: int) -> int:
        """Positions ``allocate(length)`` takes: the block of 2^k ≥ ``length``."""
        return 1 << self.order_of(length)

    def allocate(self, length: int) -> int:
        """Start of the block of 2^k ≥ ``length`` positions now taken, or -1 when none is free."""
        self.version += 1
        want = self.order_of(length)
        order = want
        free = self._free
        while order < len(free) and not free[order]:
            order += 1
        if order >= len(free):
            return -1
        start = free[order].pop(0)  # the lowest address: deterministic, and it packs low
        while order > want:  # split: keep the lower half, free the upper
            order -= 1
            bisect.insort(free[order], start + (1 << order))
        self._live[start] = want
        self.free_total -= 1 << want
        return start

    def free(self, start: int, length: int) -> None:
        """Release the block at ``start`` (``length``: the requested length or its footprint)."""
        order = self._live.get(start)
        if order is None or order != self.order_of(length):
            raise AssertionError(f"double free (or wrong length) of block {start}+{length}")
        del self._live[start]
        self.free_total += 1 << order
        self.version += 1
        top = self._top_orders[bisect.bisect_right(self._top_starts, start) - 1]
        free = self._free
        while order < top:
            buddy = start ^ (1 << order)
            lst = free[order]
            i = bisect.bisect_left(lst, buddy)
            if i == len(lst) or lst[i] != buddy:
                break
            del lst[i]
            start = min(start, buddy)
            order += 1
        bisect.insort(free[order], start)

    def free_ranges(self) -> list[tuple[int, int]]:
        """Every free block as (start, length), by start (free buddies are always merged, but
        adjacent blocks that are not buddies stay two ranges)."""
        return sorted((s, 1 << k) for k, starts in enumerate(self._free) for s in starts)

    def largest_free(self) -> int:
        for order in range(len(self._free) - 1, -1, -1):
            if self._free[order]:
                return 1 << order
        return 0

    def free_smaller_than(self, length: int) -> int:
        """Free positions in blocks too small to hold ``length`` positions (smaller than its 2^k)."""
        total = 0
        for order, starts in enumerate(self._free):
            if (1 << order) >= length:
                break
            total += len(starts) << order
        return total

    def live_blocks(self) -> list[tuple[int, int]]:
        """Every block handed out, as (start, length), by start."""
        return sorted((s, 1 << k) for s, k in self._live.items())


ARENA_TYPES: dict[str, type[Arena] | type[BuddyArena]] = {"first-fit": Arena, "buddy": BuddyArena}
