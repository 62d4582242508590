"""A first-fit arena of token positions: contiguous placement with real holes."""

from __future__ import annotations

import bisect


class Arena:
    """Free ranges kept sorted by start and merged on free, so holes are exact."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._starts: list[int] = [0] if size > 0 else []
        self._lengths: list[int] = [size] if size > 0 else []
        self.free_total = size
        self.version = 0  # bumped on every change, so callers can cache scans

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
