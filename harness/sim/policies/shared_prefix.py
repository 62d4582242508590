"""``paged-prefix`` kept as counts and content keys: vLLM's prefix cache, exact with sharing.

The block table (``PagedPolicy`` with caching) names every block; what the simulator records
depends on less: how many blocks are free, which free ones hold content and in what order they
were freed (evictions pop the least recently freed), and which content each cached block holds
(a hit takes the first cached block with a key). A block without content is interchangeable
with any other, so it is a count. Only cached blocks have a name (a handle below the pool's
size, taken when a block is cached, given back when it is evicted); each sequence's blocks are
its cached handles (a prefix of its blocks) followed by a count of blocks without content.

``CachedBlocks`` holds that state: the uncached free count, the LRU of free cached handles (an
``OrderedDict``: O(1) touch, evict, append; each with when it was freed, for the reuse
distances), each handle's key, each key's first cached handle (later ones with the same key,
rare, wait in ``more``), and the references beyond the first of handles several sequences hold.
Runs of hits, caching a prompt's blocks, freeing a sequence that shares nothing and evicting a
run go in bulk through the dictionaries' own loops. A stretch takes many blocks at once
(``take``) without naming the blocks a decoder grows into: they hold only its own sampled
tokens, so nothing can hit them before it frees them, and they are cached then (``free``).
Equality with the block table is tested call for call (``tests/sim/test_policy_properties.py``)
and record for record through the simulator (``tests/sim/test_fast_path.py``)."""

from __future__ import annotations

from collections import OrderedDict, deque
from functools import partial
from itertools import filterfalse, repeat, takewhile
from operator import is_not
from typing import cast

from ..sequence import Seq
from .base import internal_of
from .paged import CountingPagedPolicy, ReuseLedger, cdiv


class CachedBlocks:
    """The free queue and the content index as the block table keeps them, less the names of
    blocks without content (module docstring). A handle is a number below the pool's size,
    given back when its block is evicted (at most that many blocks hold content at once)."""

    __slots__ = ("uncached", "lru", "key_of", "first", "more", "shared", "spare", "ledger", "evicted")

    def __init__(self, blocks: int, ledger: ReuseLedger) -> None:
        self.uncached = blocks  # free blocks without content: taken first
        # Free cached handles, least recently freed first, each with when it was freed (step, seconds).
        self.lru: OrderedDict[int, tuple[int, float]] = OrderedDict()
        self.key_of = [0] * blocks  # cached handle → its content key
        self.first: dict[int, int] = {}  # key → its earliest cached handle (a hit takes it)
        self.more: dict[int, list[int]] = {}  # key → its later cached handles, in caching order
        self.shared: dict[int, int] = {}  # held handle → its references beyond one
        self.spare = list(range(blocks - 1, -1, -1))  # handles no cached block has, next last
        self.ledger = ledger
        self.evicted = 0  # blocks evicted so far: ``first`` loses keys only then

    def hits(self, keys: list[int]) -> list[int]:
        """The cached handles of the longest run of ``keys`` from the first."""
        return cast(list[int], list(takewhile(_CACHED, map(self.first.get, keys, repeat(None)))))

    def take(self, n: int) -> int:
        """Take ``n`` free blocks (they fit): the uncached first, then evicting from the LRU's
        front. Returns how many were evicted."""
        u = self.uncached
        if n <= u:
            self.uncached = u - n
            return 0
        self.uncached = 0
        self.evicted += n - u
        evict = self.lru.popitem
        gone = [evict(False)[0] for _ in range(n - u)]
        keys = list(map(self.key_of.__getitem__, gone))
        if self.more:
            for h, key in zip(gone, keys):
                self._forget(h, key)
        else:  # every key has one handle: its own
            deque(map(self.first.__delitem__, keys), maxlen=0)
        self.spare.extend(gone)
        return n - u

    def _forget(self, h: int, key: int) -> None:
        """Handle ``h`` (of ``key``) is evicted: the next handle with ``key``, if any, is the first."""
        first, more = self.first, self.more
        later = more.get(key)
        if first[key] == h:
            if later:
                first[key] = later.pop(0)
                if not later:
                    del more[key]
            else:
                del first[key]
        else:
            assert later is not None
            later.remove(h)
            if not later:
                del more[key]

    def cache(self, seq: Seq, full: int) -> None:
        """Give ``seq``'s blocks up to its ``full``-th their content keys (they are held: one reference)."""
        start = seq.num_cached_blocks
        if full <= start:
            return
        spare, key_of, first = self.spare, self.key_of, self.first
        keys = seq.block_keys[start:full]
        handles = spare[start - full :]
        del spare[start - full :]
        for h, key in zip(handles, keys):
            key_of[h] = key
        if first.keys().isdisjoint(keys):
            first.update(zip(keys, handles))
        else:  # content some other sequence computed too, apart: later handles of its key
            for h, key in zip(handles, keys):
                if key in first:
                    self.more.setdefault(key, []).append(h)
                else:
                    first[key] = h
        seq.blocks.extend(handles)
        seq.num_cached_blocks = full


_CACHED = partial(is_not, None)  # a handle, not None: in C, one call per key


class SharedPrefixPolicy(CountingPagedPolicy):
    """``paged-prefix`` as ``CachedBlocks``: the block table's answers, without block ids."""

    def __init__(self, budget_positions: int, block_size: int) -> None:
        super().__init__(budget_positions, block_size, "paged-prefix")
        self.ledger = ReuseLedger()
        self.pool = CachedBlocks(self.num_blocks, self.ledger)
        # The last ``prefix_hit`` answered: (sequence, keys looked at, evictions then, hits).
        self._last: tuple[Seq, int, int, list[int]] | None = None

    def cached_free_blocks(self) -> int:
        return len(self.pool.lru)

    def uncached_free(self) -> int:
        return self.pool.uncached

    def prefix_hit(self, seq: Seq) -> int:
        """The longest run of cached blocks from the start (never the whole prompt), remembered
        for the next ``allocate``."""
        if seq.num_computed:
            seq.pending_hits = []
            return 0
        pool = self.pool
        limit = (seq.num_tokens - 1) // self.block_size
        last = self._last
        if last is not None and last[0] is seq and last[1] == limit and last[2] == pool.evicted:
            # Asked again (a head tried at every finish) with nothing evicted since: keys are
            # only added to the index then, so the run so far holds and can only grow.
            hits = last[3]
            if len(hits) < limit:
                more = pool.hits(seq.block_keys[len(hits) : limit])
                if more:
                    hits = hits + more
        else:
            hits = pool.hits(seq.block_keys[:limit])
        self._last = (seq, limit, pool.evicted, hits)
        seq.pending_hits = hits
        return len(hits) * self.block_size

    def _new_blocks(self, seq: Seq, num_tokens: int, must_fit: int) -> tuple[int, int]:
        """(fresh blocks ``allocate`` takes, or -1 when it cannot; hits waiting in the LRU):
        ``PagedPolicy._new_blocks`` (a hit in the free queue costs a free block too)."""
        bs = self.block_size
        hits = seq.pending_hits
        held = seq.allocated // bs + len(hits)
        free = self._free
        need = max(cdiv(must_fit, bs) - held, 0) if must_fit else 0
        new = cdiv(num_tokens, bs) - held
        if new < 0:
            new = 0
        if need > free or new > free:
            return -1, 0  # refused whatever the hits in the free queue add
        evictable = len(self.pool.lru.keys() & hits) if hits else 0
        if need + evictable > free:
            return -1, evictable
        return (new if new + evictable <= free else -1), evictable

    def can_allocate(self, seq: Seq, num_tokens: int, must_fit: int = 0) -> bool:
        return self._new_blocks(seq, num_tokens, must_fit)[0] >= 0

    def allocate(self, seq: Seq, num_tokens: int, must_fit: int = 0) -> bool:
        new, evictable = self._new_blocks(seq, num_tokens, must_fit)
        if new < 0:
            return False
        bs = self.block_size
        pool = self.pool
        old = seq.allocated
        hits = seq.pending_hits
        if hits:
            lru = pool.lru
            waiting = list(filter(lru.__contains__, hits))  # the hits no sequence holds: out of the LRU
            if len(waiting) < len(hits):  # … the others gain a reference
                shared = pool.shared
                for h in filterfalse(lru.__contains__, hits):
                    shared[h] = shared.get(h, 0) + 1
                self.shared_excess_positions += (len(hits) - len(waiting)) * bs
            if waiting:
                step, t_s = self.ledger.now
                freed = list(map(lru.pop, waiting))  # ``ReuseLedger.reused``, per block
                self.ledger.steps.extend([step - was[0] for was in freed])
                self.ledger.seconds.extend([t_s - was[1] for was in freed])
            seq.blocks.extend(hits)
            seq.num_cached_blocks = len(seq.blocks)
            seq.pending_hits = []
        self.evictions += pool.take(new)
        self._free -= new + evictable
        seq.allocated = allocated = old + (len(hits) + new) * bs
        if allocated > seq.peak_allocated:
            seq.peak_allocated = allocated
        self.internal_positions += internal_of(allocated, seq.final_len) - internal_of(old, seq.final_len)
        pool.cache(seq, min(num_tokens, seq.num_tokens) // bs)
        return True

    def take(self, n: int) -> int:
        self._free -= n
        evicted = self.pool.take(n)
        self.evictions += evicted
        return evicted

    def cache_full_blocks(self, seq: Seq, num_tokens: int) -> None:
        """Cache the blocks of ``seq`` its first ``num_tokens`` positions fill."""
        self.pool.cache(seq, num_tokens // self.block_size)

    def free(self, seq: Seq) -> None:
        """Free as the block table does — last block first: a block without content to the
        uncached, a cached one to the LRU's tail once no sequence holds it — after caching the
        blocks its computed tokens fill (a decoder's, deferred: only it could hit them)."""
        seq.pending_hits = []
        if not seq.allocated:
            return
        bs = self.block_size
        pool = self.pool
        pool.cache(seq, seq.num_computed // bs)
        blocks = seq.allocated // bs
        handles = seq.blocks
        pool.uncached += blocks - len(handles)
        freed = blocks - len(handles)
        shared = pool.shared
        held = shared.keys() & handles if shared else ()  # blocks other sequences hold too: they stay
        for h in held:
            more = shared[h]
            if more == 1:
                del shared[h]
            else:
                shared[h] = more - 1
        back = [h for h in reversed(handles) if h not in held] if held else handles[::-1]
        pool.lru.update(zip(back, repeat(self.ledger.now)))  # ``ReuseLedger.freed``, per block
        self.shared_excess_positions -= len(held) * bs
        freed += len(back)
        self._free += freed
        self.internal_positions -= internal_of(seq.allocated, seq.final_len)
        seq.blocks = []
        seq.allocated = 0
        seq.num_cached_blocks = 0

    def writable(self, seq: Seq, position: int) -> bool:
        i = position // self.block_size
        return i >= len(seq.blocks) or seq.blocks[i] not in self.pool.shared
