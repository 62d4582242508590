"""The CPU tier's eviction orders: vLLM's LRU and ARC (``vllm/v1/kv_offload/cpu/policies/``).

An order keeps the tier's chunks (offload key → ``Chunk``) and decides which idle chunks leave
when a store needs room. Both follow vLLM's rules exactly, because which chunk is evicted decides
every later CPU-tier hit:

- recency changes only when a chunk is inserted (a store) and when a request finishes
  (``on_request_finished``, over every key the request looked at, tail to head); a lookup alone
  changes nothing;
- ``evict(n, protected)`` takes exactly ``n`` idle chunks (no transfer reading or writing them,
  not in ``protected``) or takes none;
- ARC also learns from store misses that hit its ghost lists (``on_store_miss``).

vLLM 0.33's LRU also ranks a request's chunks while it runs (``request_ranks``): each request takes
one rank at its first store or access, and its chunks share it, tail before head; 0.32 ranks every
chunk by itself at insert. ``rules.OffloadRules`` says which a run mirrors.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Protocol

# vLLM's offload key of one chunk: a block's content key (``harness.sim.block_keys``) over one KV
# cache group, ``key * groups + group`` (vLLM's key is the block hash with the group index after it,
# so the keys of one block order by group, as these do).
Key = int
Rank = tuple[int, int]


class Requester(Protocol):
    """What an order knows of the request storing or reading a chunk."""

    rank: int  # its LRU rank while it runs (0.33), 0: none yet

    def position(self, key: Key) -> int:
        """The key's block index in the request."""


class Chunk:
    """One CPU-tier slot: ``ref`` −1 while its store is in flight (not readable), else the number
    of loads reading it (0: idle, evictable)."""

    __slots__ = ("slot", "ref")

    def __init__(self, slot: int) -> None:
        self.slot = slot
        self.ref = -1

    @property
    def ready(self) -> bool:
        return self.ref >= 0


class EvictionOrder(Protocol):
    def get(self, key: Key) -> Chunk | None: ...

    def insert(self, key: Key, chunk: Chunk, request: Requester) -> None: ...

    def on_request_access(self, keys: Sequence[Key], request: Requester) -> None:
        """Keys ``request`` saw for the first time (0.33's LRU ranks them)."""

    def on_store_miss(self, keys: Sequence[Key]) -> None: ...

    def on_request_finished(self, keys: Sequence[Key], inserted_only: set[Key], reused: set[Key]) -> None:
        """A request finished: ``keys`` every key it looked at, head to tail."""

    def evict(self, n: int, protected: set[Key]) -> list[tuple[Key, Chunk]] | None: ...

    def mark_evictable(self, key: Key) -> None: ...

    def mark_non_evictable(self, key: Key) -> None: ...

    def __len__(self) -> int: ...


class LruOrder:
    """vLLM's ``LRUCachePolicy``: ranks assigned at insert and at request finish (tail first, so
    a request's head ends most recent); the idle chunk of lowest rank is evicted first.
    ``request_ranks``: 0.33's ranks of running requests (module docstring)."""

    def __init__(self, capacity: int, request_ranks: bool = False) -> None:
        self.capacity = capacity
        self.request_ranks = request_ranks
        self.chunks: dict[Key, Chunk] = {}
        self._ranks: dict[Key, Rank] = {}
        self._evictable: set[Key] = set()
        self._heap: list[tuple[Rank, Key]] = []
        self._next_rank = 0

    def __len__(self) -> int:
        return len(self.chunks)

    def get(self, key: Key) -> Chunk | None:
        return self.chunks.get(key)

    def _push(self, key: Key) -> None:
        heapq.heappush(self._heap, (self._ranks[key], key))

    def _compact(self) -> None:
        if len(self._heap) >= max(64, 2 * len(self._evictable)):
            self._rebuild()

    def _rebuild(self) -> None:
        self._heap = [(self._ranks[k], k) for k in self._evictable]
        heapq.heapify(self._heap)

    def _request_rank(self, request: Requester) -> int:
        if not request.rank:
            self._next_rank += 1
            request.rank = self._next_rank
        return request.rank

    def insert(self, key: Key, chunk: Chunk, request: Requester) -> None:
        self.chunks[key] = chunk
        if self.request_ranks:
            self._ranks[key] = (self._request_rank(request), -request.position(key))
        else:
            self._next_rank += 1
            self._ranks[key] = (self._next_rank, 0)
        if chunk.ref == 0:
            self._evictable.add(key)
            self._push(key)

    def on_request_access(self, keys: Sequence[Key], request: Requester) -> None:
        if not self.request_ranks:
            return
        rank = self._request_rank(request)
        moved = []
        for key in keys:
            if key not in self.chunks:
                continue
            new = (rank, -request.position(key))
            if self._ranks[key] >= new:
                continue
            self._ranks[key] = new
            if key in self._evictable:
                moved.append(key)
        self._reheap(moved)

    def on_store_miss(self, keys: Sequence[Key]) -> None:
        self._update_recency(reversed(list(keys)))  # the default ``touch`` of vLLM's base policy

    def on_request_finished(self, keys: Sequence[Key], inserted_only: set[Key], reused: set[Key]) -> None:
        self._update_recency(reversed(keys))

    def _update_recency(self, keys: Iterable[Key]) -> None:
        moved = []
        for key in keys:
            if key in self.chunks:
                self._next_rank += 1
                self._ranks[key] = (self._next_rank, 0)
                if key in self._evictable:
                    moved.append(key)
        self._reheap(moved)

    def _reheap(self, moved: list[Key]) -> None:
        if not moved:
            return
        # As vLLM: a long update rebuilds the heap, a short one pushes (the same order either way).
        if len(moved) >= max(64, len(self._evictable) // 4):
            self._rebuild()
        else:
            for key in moved:
                self._push(key)
            self._compact()

    def evict(self, n: int, protected: set[Key]) -> list[tuple[Key, Chunk]] | None:
        if n == 0:
            return []
        selected: list[tuple[tuple[Rank, Key], Chunk]] = []
        taken: set[Key] = set()
        deferred: list[tuple[Rank, Key]] = []
        heap = self._heap
        while heap and len(selected) < n:
            entry = heapq.heappop(heap)
            rank, key = entry
            if key not in self._evictable or self._ranks.get(key) != rank or key in taken:
                continue  # a stale entry (re-ranked, pinned or gone)
            if key in protected:
                deferred.append(entry)
                continue
            selected.append((entry, self.chunks[key]))
            taken.add(key)
        for entry in deferred:
            heapq.heappush(heap, entry)
        if len(selected) < n:
            for entry, _ in selected:
                heapq.heappush(heap, entry)
            return None
        out = []
        for (_, key), chunk in selected:
            self._evictable.remove(key)
            del self.chunks[key]
            del self._ranks[key]
            out.append((key, chunk))
        self._compact()
        return out

    def mark_evictable(self, key: Key) -> None:
        self._evictable.add(key)
        self._push(key)
        self._compact()

    def mark_non_evictable(self, key: Key) -> None:
        self._evictable.remove(key)


class ArcOrder:
    """vLLM's ``ARCCachePolicy``: T1 (seen once) and T2 (reused), ghost lists B1 and B2 of what
    each evicted, and the adaptive target size of T1 that ghost hits move."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.target_t1 = 0.0
        self.t1: OrderedDict[Key, Chunk] = OrderedDict()
        self.t2: OrderedDict[Key, Chunk] = OrderedDict()
        self.b1: OrderedDict[Key, None] = OrderedDict()
        self.b2: OrderedDict[Key, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self.t1) + len(self.t2)

    def get(self, key: Key) -> Chunk | None:
        return self.t1.get(key) or self.t2.get(key)

    def insert(self, key: Key, chunk: Chunk, request: Requester) -> None:
        self.t1[key] = chunk
        self.b1.pop(key, None)
        self.b2.pop(key, None)

    def on_request_access(self, keys: Sequence[Key], request: Requester) -> None:
        return

    def _ghost_hit(self, key: Key) -> None:
        if key in self.b1:
            self.target_t1 = min(self.target_t1 + max(1, len(self.b2) / len(self.b1)), self.capacity)
            self.b1.move_to_end(key)
        elif key in self.b2:
            self.target_t1 = max(self.target_t1 - max(1, len(self.b1) / len(self.b2)), 0)
            self.b2.move_to_end(key)

    def on_store_miss(self, keys: Sequence[Key]) -> None:
        for key in reversed(list(keys)):
            self._ghost_hit(key)

    def on_request_finished(self, keys: Sequence[Key], inserted_only: set[Key], reused: set[Key]) -> None:
        for key in reversed(keys):
            if key in inserted_only:  # a store is not a reuse: recency only
                if key in self.t1:
                    self.t1.move_to_end(key)
                elif key in self.t2:
                    self.t2.move_to_end(key)
            elif key in reused:
                if key in self.t1:
                    self.t2[key] = self.t1.pop(key)
                elif key in self.t2:
                    self.t2.move_to_end(key)

    def evict(self, n: int, protected: set[Key]) -> list[tuple[Key, Chunk]] | None:
        if n == 0:
            return []
        t1_left = len(self.t1)
        t1_iter, t2_iter = iter(self.t1.items()), iter(self.t2.items())

        def idle(entries: Iterable[tuple[Key, Chunk]]) -> tuple[Key, Chunk] | None:
            for key, chunk in entries:
                if chunk.ref == 0 and key not in protected:
                    return key, chunk
            return None

        picked: list[tuple[Key, Chunk, bool]] = []  # (key, chunk, from T1)
        for _ in range(n):
            got: tuple[Key, Chunk, bool] | None = None
            if t1_left >= int(self.target_t1):
                entry = idle(t1_iter)
                if entry is not None:
                    got = (*entry, True)
                    t1_left -= 1
            if got is None:
                entry = idle(t2_iter)
                if entry is not None:
                    got = (*entry, False)
            if got is None:
                entry = idle(t1_iter)
                if entry is None:
                    return None
                got = (*entry, True)
                t1_left -= 1
            picked.append(got)
        out = []
        for key, chunk, from_t1 in picked:
            if from_t1:
                del self.t1[key]
                self.b1[key] = None
            else:
                del self.t2[key]
                self.b2[key] = None
            out.append((key, chunk))
        for ghost in (self.b1, self.b2):
            for _ in range(len(ghost) - self.capacity):
                ghost.popitem(last=False)
        return out

    def mark_evictable(self, key: Key) -> None:
        return

    def mark_non_evictable(self, key: Key) -> None:
        return


def make_order(name: str, capacity: int, request_ranks: bool) -> EvictionOrder:
    """The eviction order ``name`` ("lru" or "arc") of a tier of ``capacity`` chunks."""
    if name == "lru":
        return LruOrder(capacity, request_ranks)
    if name == "arc":
        return ArcOrder(capacity)
    raise ValueError(f"unknown offload policy {name!r}")
