"""Paged policies: fixed-size blocks on demand, optionally with prefix caching.

``paged`` is vLLM's PagedAttention allocator; ``paged-prefix`` adds vLLM's
automatic prefix caching, modelled on vLLM v1's ``BlockPool`` and
``KVCacheManager``:

- a block becomes cached (keyed by its token content and everything before
  it) once the tokens filling it are scheduled; only full blocks are cached;
- at admission the longest run of cached full blocks is reused, never the
  whole prompt (at least one token is always computed);
- freed blocks go to the tail of an LRU free queue, the sequence's last
  block first, and stay cached until a new allocation pops and evicts them;
- reference counts say how many live sequences hold a block.

Copy-on-write: a block another sequence references is never written. Only
full blocks are shared, and a full block is immutable, so when parallel
samples of one prompt diverge each gets its own copy of the partially filled
tail block (recomputed, as vLLM v1 does) instead of writing into a shared one.
``writable`` states the rule and the property tests check it.
"""

from __future__ import annotations

from collections import OrderedDict, deque

import numpy as np

from ..sequence import Seq
from .base import internal_of

BlockKey = int  # ``harness.sim.block_keys``: equal keys, equal tokens up to the block's end


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class PagedBase:
    """What every paged policy shares: a budget cut into fixed-size blocks, the running totals
    a step's measurement reads, and the rules that depend only on how many blocks a sequence
    holds. Its two kinds differ in what they keep: ``PagedPolicy`` the block ids (a block
    table, prefix caching), ``CountingPagedPolicy`` only counts."""

    name = "paged"

    def __init__(self, budget_positions: int, block_size: int) -> None:
        self.budget_positions = budget_positions
        self.block_size = block_size
        self.num_blocks = budget_positions // block_size
        self.internal_positions = 0
        self.shared_excess_positions = 0
        self.evictions = 0

    def free_blocks(self) -> int:
        raise NotImplementedError

    # -- accounting ----------------------------------------------------------
    @property
    def allocated_positions(self) -> int:
        return (self.num_blocks - self.free_blocks()) * self.block_size

    def allocated_blocks(self) -> int:
        return self.num_blocks - self.free_blocks()

    def cached_free_blocks(self) -> int:
        return 0  # no prefix caching (``PagedPolicy`` and ``CountingPrefixPolicy`` count theirs)

    def external_frag(self, head_of_line: Seq | None) -> int:
        """While anything waits, the budget's tail that no whole block fits."""
        if head_of_line is None:
            return 0
        return self.budget_positions - self.num_blocks * self.block_size

    def needs_positions(self, seq: Seq) -> int:
        # The last sampled token's K/V is never computed, so a finished
        # sequence holds prompt + output − 1 positions at most.
        return cdiv(seq.final_len - 1, self.block_size) * self.block_size


class ReuseLedger:
    """When each cached free block was freed, and how long after its free each block a hit
    took back out of the free queue had waited: the reuse distance, in steps and seconds. The
    scheduler moves ``now`` at every step."""

    __slots__ = ("now", "freed_at", "steps", "seconds")

    def __init__(self) -> None:
        self.now: tuple[int, float] = (0, 0.0)  # (step, t_s)
        self.freed_at: dict[int, tuple[int, float]] = {}
        self.steps: list[int] = []
        self.seconds: list[float] = []

    def freed(self, block: int) -> None:
        self.freed_at[block] = self.now

    def reused(self, block: int) -> None:
        self.reused_run(1, self.freed_at.pop(block))

    def reused_run(self, blocks: int, freed_at: tuple[int, float]) -> None:
        """``blocks`` blocks freed together at ``freed_at`` are taken back now."""
        steps, seconds = self.now[0] - freed_at[0], self.now[1] - freed_at[1]
        self.steps.extend([steps] * blocks)
        self.seconds.extend([seconds] * blocks)


def reuse_distance_columns(steps: list[int], seconds: list[float]) -> dict[str, float | None]:
    """The run row's reuse-distance columns (median and 90th percentile, numpy's default
    interpolation); null where no cached free block was reused."""
    if not steps:
        return {f"reuse_distance_{q}_{u}": None for q in ("p50", "p90") for u in ("steps", "s")}
    st, sec = np.asarray(steps, dtype=np.float64), np.asarray(seconds, dtype=np.float64)
    return {
        "reuse_distance_p50_steps": float(np.percentile(st, 50)),
        "reuse_distance_p90_steps": float(np.percentile(st, 90)),
        "reuse_distance_p50_s": float(np.percentile(sec, 50)),
        "reuse_distance_p90_s": float(np.percentile(sec, 90)),
    }


class PagedPolicy(PagedBase):
    """The block table: which blocks each sequence holds, vLLM's free queue, and (with
    ``enable_caching``) prefix caching over block contents."""

    def __init__(self, budget_positions: int, block_size: int, enable_caching: bool = False) -> None:
        super().__init__(budget_positions, block_size)
        self.enable_caching = enable_caching
        # vLLM's free queue, in three parts popped in this order:
        #   front      freed blocks that are not cached (reused first);
        #   fresh      never-used blocks, ids from ``next_fresh`` on, kept
        #              implicit so memory follows the blocks used, not the budget;
        #   free_queue freed cached blocks, least recently freed first (LRU).
        self.front: deque[int] = deque()
        self.next_fresh = 0
        self.free_queue: OrderedDict[int, None] = OrderedDict()
        self.ref: dict[int, int] = {}
        self.block_key: dict[int, BlockKey] = {}
        self.cache: dict[BlockKey, list[int]] = {}
        self.ledger = ReuseLedger()

    def free_blocks(self) -> int:
        return len(self.front) + self.num_blocks - self.next_fresh + len(self.free_queue)

    def is_free(self, b: int) -> bool:
        return b >= self.next_fresh or b in self.free_queue or b in self.front

    # -- prefix caching --------------------------------------------------------
    def cached_free_blocks(self) -> int:
        """Free blocks still holding cached content: the LRU part of the free queue (a freed
        block without content goes to its front, ``free``)."""
        return len(self.free_queue) if self.enable_caching else 0

    def prefix_hit(self, seq: Seq) -> int:
        seq.pending_hits = []
        if not self.enable_caching or seq.num_computed:
            return 0
        max_blocks = (seq.num_tokens - 1) // self.block_size
        hits = seq.pending_hits
        get = self.cache.get
        for key in seq.block_keys[:max_blocks]:
            cached = get(key)
            if not cached:
                break
            hits.append(cached[0])
        return len(hits) * self.block_size

    # -- allocation ----------------------------------------------------------
    def _new_blocks(self, seq: Seq, num_tokens: int, must_fit: int) -> int:
        """Fresh blocks ``allocate`` would take, or -1 when it cannot (vLLM's
        ``get_num_blocks_to_allocate``: a cached hit that sits in the free queue costs a
        free block too)."""
        bs = self.block_size
        hits = seq.pending_hits
        held = len(seq.blocks)
        evictable = sum(1 for b in hits if self.ref[b] == 0) if hits else 0
        free = self.free_blocks()
        if must_fit and max(cdiv(must_fit, bs) - held - len(hits), 0) + evictable > free:
            return -1
        new = cdiv(num_tokens, bs) - held - len(hits)
        if new < 0:
            new = 0
        return new if new + evictable <= free else -1

    def can_allocate(self, seq: Seq, num_tokens: int, must_fit: int = 0) -> bool:
        """What ``allocate(seq, num_tokens, must_fit)`` would return, changing nothing."""
        return self._new_blocks(seq, num_tokens, must_fit) >= 0

    def fits_leaving(self, seq: Seq, num_tokens: int, must_fit: int, reserved: int) -> bool:
        """``can_allocate`` with ``reserved`` free blocks left for others (vLLM's ``reserved_blocks``,
        which gates a load from a CPU tier: ``harness.sim.offload``)."""
        new = self._new_blocks(seq, num_tokens, must_fit)
        if new < 0:
            return False
        evictable = sum(1 for b in seq.pending_hits if self.ref[b] == 0)
        return new + evictable <= self.free_blocks() - reserved

    def remaining_blocks(self, seq: Seq, max_model_len: int) -> int:
        """The blocks ``seq`` (holding blocks) still needs to hold its whole sequence (vLLM's
        ``_request_remaining_blocks``, which gates a load from a CPU tier)."""
        need = cdiv(min(seq.num_tokens, max_model_len), self.block_size) - len(seq.blocks)
        return need if need > 0 else 0

    def tables_of(self, seq: Seq) -> list[list[int]]:
        """``seq``'s block ids, as the one KV cache group's table."""
        return [seq.blocks]

    def allocate(self, seq: Seq, num_tokens: int, must_fit: int = 0, cache_blocks: bool = True) -> bool:
        """``cache_blocks`` False: the new blocks are not cached yet (vLLM's ``delay_cache_blocks``: their
        content arrives by a load from the CPU tier, ``harness.sim.offload``)."""
        new = self._new_blocks(seq, num_tokens, must_fit)
        if new < 0:
            return False
        bs = self.block_size
        hits = seq.pending_hits
        held = len(seq.blocks)
        old_internal = internal_of(held * bs, seq.final_len)
        if hits:
            ledger = self.ledger
            for b in hits:
                if self.ref[b] == 0:
                    del self.free_queue[b]
                    ledger.reused(b)
                else:
                    self.shared_excess_positions += bs
                self.ref[b] += 1
            seq.blocks.extend(hits)
            seq.num_cached_blocks = len(seq.blocks)
            seq.pending_hits = []
        front, ref, blocks = self.front, self.ref, seq.blocks
        block_key, cache = self.block_key, self.cache
        for _ in range(new):
            if front:
                b = front.popleft()
            elif self.next_fresh < self.num_blocks:
                b = self.next_fresh
                self.next_fresh += 1
            else:
                b, _ = self.free_queue.popitem(last=False)
                key = block_key.pop(b, None)
                if key is not None:  # evicted from the cache (a full cache evicts at every new block)
                    self.ledger.freed_at.pop(b, None)
                    holders = cache.get(key)
                    if holders is not None:
                        holders.remove(b)
                        if not holders:
                            del cache[key]
                    self.evictions += 1
            ref[b] = 1
            blocks.append(b)
        seq.allocated = len(seq.blocks) * bs
        if seq.allocated > seq.peak_allocated:
            seq.peak_allocated = seq.allocated
        self.internal_positions += internal_of(seq.allocated, seq.final_len) - old_internal
        if self.enable_caching and cache_blocks:
            self.cache_full_blocks(seq, min(num_tokens, seq.num_tokens))
        return True

    def cache_full_blocks(self, seq: Seq, num_tokens: int) -> None:
        """Cache the blocks of ``seq`` its first ``num_tokens`` positions fill (prefix caching)."""
        full = num_tokens // self.block_size
        start = seq.num_cached_blocks
        if full <= start:
            return
        block_key, cache, blocks, keys = self.block_key, self.cache, seq.blocks, seq.block_keys
        for i in range(start, full):
            b = blocks[i]
            key = keys[i]
            block_key[b] = key
            holders = cache.get(key)
            if holders is None:
                cache[key] = [b]
            else:
                holders.append(b)
        seq.num_cached_blocks = full

    def blocks_needed(self, seq: Seq, num_tokens: int) -> int:
        """New blocks ``allocate(seq, num_tokens)`` would take (a running sequence: no hits)."""
        new = cdiv(num_tokens, self.block_size) - len(seq.blocks)
        return new if new > 0 else 0

    def writable(self, seq: Seq, position: int) -> bool:
        """True when ``seq`` may write K/V at ``position``: its block is referenced by it alone."""
        return self.ref[seq.blocks[position // self.block_size]] == 1

    def free(self, seq: Seq) -> None:
        if not seq.blocks:
            seq.pending_hits = []
            return
        bs = self.block_size
        self.internal_positions -= internal_of(len(seq.blocks) * bs, seq.final_len)
        # Last block first, so the tail of a sequence is evicted before its prefix.
        # As vLLM's BlockPool.free_blocks: a freed block that is not cached (it
        # can never be hit) goes to the *front* of the free queue, to be reused
        # first; cached blocks go to the back (LRU). Without caching the order
        # changes no count, so only caching pays for it.
        uncached: list[int] | None = [] if self.enable_caching else None
        for b in reversed(seq.blocks):
            r = self.ref[b] - 1
            if r < 0:
                raise AssertionError(f"block {b} freed while unreferenced")
            self.ref[b] = r
            if r == 0:
                if uncached is None:
                    self.free_queue[b] = None
                elif b not in self.block_key:
                    uncached.append(b)
                else:
                    self.free_queue[b] = None
                    self.ledger.freed(b)
            else:
                self.shared_excess_positions -= bs
        if uncached:
            self.front.extendleft(reversed(uncached))  # the first freed ends up at the very front
        seq.blocks = []
        seq.allocated = 0
        seq.num_cached_blocks = 0
        seq.pending_hits = []


class PagedPrefixPolicy(PagedPolicy):
    name = "paged-prefix"

    def __init__(self, budget_positions: int, block_size: int) -> None:
        super().__init__(budget_positions, block_size, enable_caching=True)


class VirtualContiguousPolicy(PagedPolicy):
    """vAttention: a contiguous virtual range per request, physical pages mapped on demand.

    Physical memory is committed in pages of ``page_bytes`` per layer and per
    K/V tensor, so one page holds ``page_bytes / (kv_heads × head_dim × dtype
    bytes)`` token positions; allocation granularity is that many positions.
    Pages can sit anywhere physically, so, like ``paged``, it leaves no holes.
    """

    name = "virtual-contiguous"

    def __init__(self, budget_positions: int, page_tokens: int) -> None:
        super().__init__(budget_positions, page_tokens, enable_caching=False)


class CountingPagedPolicy(PagedBase):
    """``paged`` (or ``virtual-contiguous``) keeping block counts instead of block ids.

    Without prefix caching nothing the simulator records depends on which blocks
    a sequence holds, only on how many: every count, the free-block test and the
    internal fragmentation are exactly those of ``PagedPolicy`` (the policy property
    tests and the fast path's identity tests check it). ``seq.blocks`` stays empty,
    so only a caller that never reads block ids may use it: the simulator's fast
    path does (``make_policy(spec, block_ids=False)``); the reference scheduler,
    vllm-sched's accounting and the torch runner never do.
    """

    def __init__(self, budget_positions: int, block_size: int, name: str = "paged") -> None:
        super().__init__(budget_positions, block_size)
        self.name = name
        self._free = self.num_blocks

    def free_blocks(self) -> int:
        return self._free

    def prefix_hit(self, seq: Seq) -> int:
        seq.pending_hits = []
        return 0  # no prefix caching

    def writable(self, seq: Seq, position: int) -> bool:
        return True  # nothing is ever shared without prefix caching

    def take(self, n: int) -> int:
        """``n`` free blocks taken for sequences whose ``allocated`` the caller grows (they fit:
        a counted stretch's crossings). Returns the cached blocks this evicted (none here)."""
        self._free -= n
        return 0

    def uncached_free(self) -> int:
        """Free blocks ``take`` hands out before it must evict (all of them here)."""
        return self._free

    def admission_floor(self, seq: Seq, must_fit: int) -> int:
        """Free blocks below which no admission of ``seq`` with ``must_fit`` positions to fit can
        succeed: the must-fit gate's blocks, ``seq`` holding none of them (a prefix hit could stand
        in for some: the prefix policies' floor is 0)."""
        need = cdiv(must_fit, self.block_size) - seq.allocated // self.block_size
        return need if need > 0 else 0

    def can_allocate(self, seq: Seq, num_tokens: int, must_fit: int = 0) -> bool:
        if must_fit and self.admission_floor(seq, must_fit) > self._free:
            return False
        return cdiv(num_tokens, self.block_size) - seq.allocated // self.block_size <= self._free

    def allocate(self, seq: Seq, num_tokens: int, must_fit: int = 0) -> bool:
        bs = self.block_size
        held = seq.allocated // bs
        free = self._free
        if must_fit and self.admission_floor(seq, must_fit) > free:
            return False
        new = cdiv(num_tokens, bs) - held
        if new < 0:
            new = 0
        if new > free:
            return False
        self._free = free - new
        old = seq.allocated
        seq.allocated = allocated = old + new * bs
        if allocated > seq.peak_allocated:
            seq.peak_allocated = allocated
        self.internal_positions += internal_of(allocated, seq.final_len) - internal_of(old, seq.final_len)
        return True

    def free(self, seq: Seq) -> None:
        seq.pending_hits = []
        if not seq.allocated:
            return
        self._free += seq.allocated // self.block_size
        self.internal_positions -= internal_of(seq.allocated, seq.final_len)
        seq.allocated = 0

    def blocks_needed(self, seq: Seq, num_tokens: int) -> int:
        new = cdiv(num_tokens, self.block_size) - seq.allocated // self.block_size
        return new if new > 0 else 0
