"""The CPU tier's store: vLLM's ``CPUOffloadingManager`` (``vllm/v1/kv_offload/cpu/manager.py``).

A pool of ``capacity`` chunk slots (one GPU block each), an eviction order (``eviction``), and
what each request did with the tier, which the order reads when the request finishes:

- ``lookup``: HIT (stored and readable), PENDING (its store is in flight) or MISS;
- ``prepare_store``: the keys not yet in the tier get slots, evicting idle chunks if the pool is
  full (None when it cannot: the caller retries later); keys already stored are a reuse;
- ``complete_store`` makes stored chunks readable; ``prepare_load`` / ``complete_load`` pin and
  unpin the chunks a load reads.
"""

from __future__ import annotations

from collections.abc import Sequence

from .eviction import Chunk, EvictionOrder, Key, make_order
from .rules import OffloadRules

HIT, PENDING, MISS = "hit", "pending", "miss"


class RequestAccess:
    """The keys one request looked at (stored, reused or missed), as vLLM's
    ``_RequestCacheAccess`` keeps them for the eviction order."""

    __slots__ = (
        "keys",
        "groups",
        "_index",
        "rank",
        "seen",
        "seen_set",
        "inserted",
        "reused",
        "store_misses",
        "finished",
    )

    def __init__(self, keys: Sequence[Key], groups: int = 1) -> None:
        self.keys = keys  # the request's block keys, head to tail
        self.groups = groups  # KV cache groups: a group's offload key is ``key * groups + group``
        self._index: dict[Key, int] | None = None
        self.rank = 0  # its LRU rank while it runs (vLLM 0.33), 0: none yet
        self.seen: list[Key] = []
        self.seen_set: set[Key] = set()
        self.inserted: set[Key] = set()
        self.reused: set[Key] = set()
        self.store_misses: set[Key] = set()
        self.finished = False

    def position(self, key: Key) -> int:
        """The key's block index in the request (every group's key of a block has its position)."""
        if self._index is None:
            self._index = {k: i for i, k in enumerate(self.keys)}
        return self._index[key // self.groups]

    def record(self, keys: Sequence[Key], reused: Sequence[Key] = ()) -> list[Key]:
        """Note an access; the keys seen for the first time."""
        new = []
        for key in keys:
            if key not in self.seen_set:
                self.seen_set.add(key)
                self.seen.append(key)
                new.append(key)
        # Re-reading a chunk this request inserted is not a second access.
        self.reused.update(k for k in reused if k not in self.inserted)
        return new


class CpuTier:
    """``capacity`` chunks of one block, evicted in ``policy`` order ("lru" or "arc"), by the
    ``rules`` of one vLLM release."""

    def __init__(self, capacity: int, policy: str, rules: OffloadRules) -> None:
        self.capacity = capacity
        self.order: EvictionOrder = make_order(policy, capacity, rules.lru_request_ranks)
        self._next_slot = 0
        self._free_slots: list[int] = []
        self.evictable = 0  # chunks stored and idle
        self.evicted = 0  # chunks evicted so far
        # Moves whenever what decides a store changes (chunks held, readable or idle): a store
        # refused at one version is refused again, doing nothing, at the same version.
        self.version = 0

    def __len__(self) -> int:
        """Chunks held (stored or being stored)."""
        return len(self.order)

    def free_slots(self) -> int:
        return len(self._free_slots) + self.capacity - self._next_slot

    def lookup(self, key: Key) -> str:
        chunk = self.order.get(key)
        if chunk is None:
            return MISS
        return HIT if chunk.ready else PENDING

    def scan(self, keys: Sequence[Key], start: int, end: int) -> tuple[int, bool]:
        """``lookup`` over ``keys[start:end]`` up to the first MISS: (keys found, whether one of
        them is still PENDING)."""
        get = self.order.get
        pending = False
        for i in range(start, end):
            chunk = get(keys[i])
            if chunk is None:
                return i - start, pending
            if chunk.ref < 0:
                pending = True
        return end - start, pending

    def prepare_load(self, keys: Sequence[Key], access: RequestAccess) -> None:
        self.version += 1
        order = self.order
        for key in keys:
            chunk = order.get(key)
            assert chunk is not None and chunk.ready, f"chunk {key} is not readable"
            if chunk.ref == 0:
                order.mark_non_evictable(key)
                self.evictable -= 1
            chunk.ref += 1
        self._record(access, keys, keys)

    def _record(self, access: RequestAccess, keys: Sequence[Key], reused: Sequence[Key]) -> None:
        new = access.record(keys, reused)
        if new:
            self.order.on_request_access(new, access)

    def complete_load(self, keys: Sequence[Key]) -> None:
        self.version += 1
        order = self.order
        for key in keys:
            chunk = order.get(key)
            assert chunk is not None and chunk.ref > 0
            chunk.ref -= 1
            if chunk.ref == 0:
                self.evictable += 1
                order.mark_evictable(key)

    def prepare_store(self, keys: Sequence[Key], access: RequestAccess) -> list[Key] | None:
        """Slots for the keys not yet held; the keys to store ([] if every one is held), or None
        when the pool cannot make room (nothing allocated)."""
        order = self.order
        to_store: list[Key] = []
        ready_held: list[Key] = []
        for key in keys:
            chunk = order.get(key)
            if chunk is None:
                to_store.append(key)
            elif chunk.ready:
                ready_held.append(key)
        misses = [k for k in to_store if k not in access.store_misses]
        if misses:
            order.on_store_miss(misses)  # ARC learns from its ghost lists before insert drops them
            access.store_misses.update(misses)
        recorded = set(to_store)
        recorded.update(ready_held)
        self._record(access, [k for k in keys if k in recorded], ready_held)
        if not to_store:
            return []
        short = len(to_store) - self.free_slots()
        if short > 0:
            if short > self.evictable:
                return None
            evicted = order.evict(short, set(keys))
            if evicted is None:
                return None
            self.evictable -= len(evicted)
            self.evicted += len(evicted)
            self._free_slots.extend(chunk.slot for _, chunk in evicted)
        self.version += 1
        for key in to_store:
            if self._next_slot < self.capacity:
                slot = self._next_slot
                self._next_slot += 1
            else:
                slot = self._free_slots.pop()
            order.insert(key, Chunk(slot), access)
        access.inserted.update(to_store)
        return to_store

    def complete_store(self, keys: Sequence[Key] | set[Key]) -> None:
        self.version += 1
        order = self.order
        for key in keys:
            chunk = order.get(key)
            if chunk is not None and not chunk.ready:
                chunk.ref = 0
                self.evictable += 1
                order.mark_evictable(key)

    def on_request_finished(self, access: RequestAccess) -> None:
        """The request finished: its accesses, head to tail, to the eviction order."""
        if access.finished:
            return
        access.finished = True
        keys = sorted(access.seen, key=access.position)
        self.order.on_request_finished(keys, access.inserted - access.reused, access.reused)
