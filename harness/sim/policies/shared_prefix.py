"""``paged-prefix`` kept as counts and content keys: vLLM's prefix cache, exact with sharing.

The block table (``PagedPolicy`` with caching) names every block. What the simulator records
depends on fewer things: how many blocks are free, which of the free ones hold content and in
what order they were freed (evictions pop the least recently freed), and which content each
cached block holds (a hit takes the first cached block with a key). A block without content —
never used, freed without a key, or a block a sequence holds whose content is not cached yet —
is interchangeable with any other, so it is a count. Only cached blocks have a name (a handle:
a number below the pool's size, taken when a block is cached and given back when it is
evicted), and each sequence's blocks are its cached handles (always a prefix of its blocks: a
block is cached only once every block before it is full) followed by a count of blocks without
content (``seq.allocated`` says how many blocks it holds).

``CachedBlocks`` holds that state: the uncached free count, the LRU of free cached handles
(an ``OrderedDict``: O(1) touch, evict, append), each handle's key and reference count, and
each key's handles in caching order. Every operation costs per block it touches, as the block
table's do, but a stretch of steps can take many blocks at once (``take``: the uncached first,
then evicting from the LRU's front) without naming the blocks a decoder grows into: a
decoder's own blocks hold tokens only it has (its sampled tokens), so nothing can hit them
before it frees them, and they are cached then (``free``; the block table caches each the step
it fills). Equality with the block table is tested call for call
(``tests/test_policy_properties.py``) and record for record through the simulator
(``tests/test_fast_path.py``).
"""

from __future__ import annotations

from collections import OrderedDict

from ..sequence import Seq
from .base import internal_of
from .paged import CountingPagedPolicy, ReuseLedger, cdiv


class CachedBlocks:
    """The free queue and the content index as the block table keeps them, less the names of
    blocks without content (module docstring). A handle is a number below the pool's size,
    given back when its block is evicted (at most that many blocks hold content at once), so
    the index lives in lists."""

    __slots__ = ("uncached", "lru", "key_of", "holders", "ref", "spare", "ledger")

    def __init__(self, blocks: int, ledger: ReuseLedger) -> None:
        self.uncached = blocks  # free blocks without content: taken first
        self.lru: OrderedDict[int, None] = OrderedDict()  # free cached handles, least recently freed first
        self.key_of = [0] * blocks  # cached handle → its content key
        self.holders: dict[int, list[int]] = {}  # key → its cached handles, in caching order
        self.ref = [0] * blocks  # cached handle → sequences holding it (0: in the LRU)
        self.spare = list(range(blocks - 1, -1, -1))  # handles no cached block has, next last
        self.ledger = ledger

    def take(self, n: int) -> int:
        """Take ``n`` free blocks (they fit): the uncached first, then evicting from the LRU's
        front. Returns how many were evicted."""
        u = self.uncached
        if n <= u:
            self.uncached = u - n
            return 0
        self.uncached = 0
        evict, key_of, holders, spare = self.lru.popitem, self.key_of, self.holders, self.spare
        forget = self.ledger.freed_at.pop
        for _ in range(n - u):
            h = evict(last=False)[0]
            key = key_of[h]
            forget(h, None)
            same = holders[key]
            if len(same) == 1:
                del holders[key]
            else:
                same.remove(h)
            spare.append(h)
        return n - u

    def cache(self, seq: Seq, full: int) -> None:
        """Give ``seq``'s blocks up to its ``full``-th their content keys (they are held: one reference)."""
        start = seq.num_cached_blocks
        if full <= start:
            return
        key_of, holders, ref, spare, handles, keys = (
            self.key_of,
            self.holders,
            self.ref,
            self.spare,
            seq.blocks,
            seq.block_keys,
        )
        for i in range(start, full):
            h = spare.pop()
            key = keys[i]
            key_of[h] = key
            same = holders.get(key)
            if same is None:
                holders[key] = [h]
            else:
                same.append(h)
            ref[h] = 1
            handles.append(h)
        seq.num_cached_blocks = full


class SharedPrefixPolicy(CountingPagedPolicy):
    """``paged-prefix`` as ``CachedBlocks``: the block table's answers, without block ids."""

    def __init__(self, budget_positions: int, block_size: int) -> None:
        super().__init__(budget_positions, block_size, "paged-prefix")
        self.ledger = ReuseLedger()
        self.pool = CachedBlocks(self.num_blocks, self.ledger)

    def cached_free_blocks(self) -> int:
        return len(self.pool.lru)

    def uncached_free(self) -> int:
        return self.pool.uncached

    def prefix_hit(self, seq: Seq) -> int:
        """The longest run of cached blocks from the start (never the whole prompt), remembered
        for the next ``allocate``."""
        hits: list[int] = []
        seq.pending_hits = hits
        if seq.num_computed:
            return 0
        holders = self.pool.holders
        for key in seq.block_keys[: (seq.num_tokens - 1) // self.block_size]:
            same = holders.get(key)
            if same is None:
                break
            hits.append(same[0])
        return len(hits) * self.block_size

    def _new_blocks(self, seq: Seq, num_tokens: int, must_fit: int) -> tuple[int, int]:
        """(fresh blocks ``allocate`` takes, or -1 when it cannot; hits waiting in the LRU):
        ``PagedPolicy._new_blocks`` (a hit in the free queue costs a free block too)."""
        bs = self.block_size
        hits = seq.pending_hits
        held = seq.allocated // bs
        ref = self.pool.ref
        evictable = sum(1 for h in hits if not ref[h]) if hits else 0
        free = self._free
        if must_fit and max(cdiv(must_fit, bs) - held - len(hits), 0) + evictable > free:
            return -1, evictable
        new = cdiv(num_tokens, bs) - held - len(hits)
        if new < 0:
            new = 0
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
            ref, lru, ledger = pool.ref, pool.lru, self.ledger
            freed_at, waited_steps, waited_s = ledger.freed_at, ledger.steps, ledger.seconds
            step, t_s = ledger.now
            for h in hits:
                if ref[h]:
                    self.shared_excess_positions += bs
                else:
                    del lru[h]
                    was = freed_at.pop(h)  # ``ReuseLedger.reused``, inlined: a hit per block
                    waited_steps.append(step - was[0])
                    waited_s.append(t_s - was[1])
                ref[h] += 1
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
        ref, lru, freed_at, now = pool.ref, pool.lru, self.ledger.freed_at, self.ledger.now
        for h in reversed(handles):
            r = ref[h] - 1
            ref[h] = r
            if r:
                self.shared_excess_positions -= bs
            else:
                lru[h] = None
                freed_at[h] = now  # ``ReuseLedger.freed``, inlined: a free per block
                freed += 1
        self._free += freed
        self.internal_positions -= internal_of(seq.allocated, seq.final_len)
        seq.blocks = []
        seq.allocated = 0
        seq.num_cached_blocks = 0

    def writable(self, seq: Seq, position: int) -> bool:
        i = position // self.block_size
        return i >= len(seq.blocks) or self.pool.ref[seq.blocks[i]] == 1
