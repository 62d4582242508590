"""``paged-prefix`` kept as counts, for workloads in which no two sequences share a block.

vLLM's prefix caching (``PagedPolicy`` with caching) keys each full block by its content.
When no two sequences can hold equal content — no shared prompt prefixes (``prefix_groups``)
and one sample per request — a block's key belongs to one sequence only, and so does every
hit: a sequence preempted by recompute finds, when it is re-admitted, the blocks it had
filled that are still cached. Then nothing the simulator records depends on block ids, and
the free queue reduces to counts:

- the *uncached* free blocks (never used, or freed without a key: a partly filled last
  block) are a count: which of them a new block takes never matters;
- the *cached* free blocks, in LRU order, are *runs*, one per freed sequence: a sequence
  frees its last block first, so its cached blocks enter the queue as one run (its highest
  block index first), evictions eat a run from that end, and what is left of a sequence's
  cache is always its first ``left`` blocks — the run is just that count.

A new block comes from the uncached ones first, then evicts from the front of the queue (as
vLLM's free queue pops its front, where uncached blocks are put); a hit takes a sequence's
whole run out of the queue. Each operation costs per run touched, not per block, where the
block table costs per block (a long prompt admitted under a full cache evicts and caches one
block at a time). Equality with ``PagedPolicy`` is tested record for record through the
simulator (``tests/sim/test_fast_path.py``), and the fast path only picks this policy when the
workload shares nothing (``policies.make_policy``).
"""

from __future__ import annotations

from collections import deque

from ..sequence import Seq
from .base import internal_of
from .paged import CountingPagedPolicy, ReuseLedger, cdiv


class Run:
    """What is left in the cache of one freed sequence: its first ``left`` blocks, freed at
    ``freed_at`` (step, seconds)."""

    __slots__ = ("left", "seq", "freed_at")

    def __init__(self, left: int, seq: int, freed_at: tuple[int, float] = (0, 0.0)) -> None:
        self.left = left
        self.seq = seq  # the sequence's index
        self.freed_at = freed_at


class CachedRuns:
    """The free block queue as counts (module docstring): ``uncached`` blocks, then the cached
    ones (``queued`` in all) in ``runs``, least recently freed first."""

    __slots__ = ("uncached", "queued", "runs", "by_seq")

    def __init__(self, blocks: int) -> None:
        self.uncached = blocks
        self.queued = 0
        self.runs: deque[Run] = deque()  # a run taken by a hit stays, empty, until it reaches the front
        self.by_seq: dict[int, Run] = {}

    def take(self, n: int) -> int:
        """Take ``n`` free blocks (they fit): uncached ones first, then from the front of the
        queue, evicting. Returns how many were evicted."""
        u = self.uncached
        if n <= u:
            self.uncached = u - n
            return 0
        self.uncached = 0
        evicted = rest = n - u
        self.queued -= rest
        runs, by_seq = self.runs, self.by_seq
        while rest:
            r = runs[0]
            if r.left > rest:
                r.left -= rest
                break
            rest -= r.left
            r.left = 0
            runs.popleft()
            if by_seq.get(r.seq) is r:
                del by_seq[r.seq]
        return evicted

    def park(self, seq: Seq, blocks: int, cached: int, now: tuple[int, float] = (0, 0.0)) -> None:
        """A sequence frees ``blocks`` blocks at ``now``, its first ``cached`` of them with a key."""
        self.uncached += blocks - cached
        if cached:
            r = Run(cached, seq.index, now)
            self.runs.append(r)
            self.by_seq[seq.index] = r  # a swapped-in sequence's older run, if any, is never hit
            self.queued += cached

    def cached(self, seq: Seq) -> int:
        """The blocks of ``seq`` still cached (it is not running)."""
        r = self.by_seq.get(seq.index)
        return r.left if r is not None else 0

    def hit(self, seq: Seq, blocks: int) -> tuple[int, float]:
        """``seq`` takes its ``blocks`` cached blocks back out of the queue: all of them. Returns
        when they were freed."""
        r = self.by_seq.pop(seq.index)
        assert r.left == blocks, "a prefix hit takes a sequence's whole cached run"
        r.left = 0
        self.queued -= blocks
        return r.freed_at


class CountingPrefixPolicy(CountingPagedPolicy):
    """``paged-prefix`` as counts, exact when no two sequences share a block (module docstring)."""

    def __init__(self, budget_positions: int, block_size: int) -> None:
        super().__init__(budget_positions, block_size, "paged-prefix")
        self.pool = CachedRuns(self.num_blocks)
        self.ledger = ReuseLedger()

    def cached_free_blocks(self) -> int:
        return self.pool.queued

    def uncached_free(self) -> int:
        return self.pool.uncached

    def take(self, n: int) -> int:
        self._free -= n
        evicted = self.pool.take(n)
        self.evictions += evicted
        return evicted

    def hit_blocks(self, seq: Seq, cached: int) -> int:
        """The blocks a hit on ``cached`` cached blocks gives ``seq`` at admission: at least one
        token is computed, and a sequence with tokens computed (swapped in) looks nothing up."""
        if seq.num_computed:
            return 0
        most = (seq.num_tokens - 1) // self.block_size
        return cached if cached < most else most

    def prefix_hit(self, seq: Seq) -> int:
        seq.pending_hits = []
        return self.hit_blocks(seq, self.pool.cached(seq)) * self.block_size

    def _fits(self, seq: Seq, num_tokens: int, must_fit: int) -> tuple[int, int]:
        """(new blocks, hit blocks) ``allocate`` takes, new −1 when it cannot: ``PagedPolicy._new_blocks``
        (a hit sits in the free queue, so it costs a free block too). A sequence holding no
        blocks is being admitted: it takes the hit ``prefix_hit`` has just reported."""
        h = self.hit_blocks(seq, self.pool.cached(seq)) if not seq.allocated else 0
        bs = self.block_size
        held = seq.allocated // bs
        free = self._free
        if must_fit and max(cdiv(must_fit, bs) - held - h, 0) + h > free:
            return -1, h
        new = cdiv(num_tokens, bs) - held - h
        if new < 0:
            new = 0
        return (new if new + h <= free else -1), h

    def can_allocate(self, seq: Seq, num_tokens: int, must_fit: int = 0) -> bool:
        return self._fits(seq, num_tokens, must_fit)[0] >= 0

    def allocate(self, seq: Seq, num_tokens: int, must_fit: int = 0) -> bool:
        new, h = self._fits(seq, num_tokens, must_fit)
        if new < 0:
            return False
        pool = self.pool
        if h:
            self.ledger.reused_run(h, pool.hit(seq, h))
        self.evictions += pool.take(new)
        self._free -= new + h
        old = seq.allocated
        seq.allocated = allocated = old + (new + h) * self.block_size
        if allocated > seq.peak_allocated:
            seq.peak_allocated = allocated
        self.internal_positions += internal_of(allocated, seq.final_len) - internal_of(old, seq.final_len)
        return True

    def free(self, seq: Seq) -> None:
        """Free as ``CountingPagedPolicy`` does, and queue the blocks: the full ones its computed
        tokens fill are cached (vLLM caches a block the step it fills)."""
        if seq.allocated:
            blocks = seq.allocated // self.block_size
            full = seq.num_computed // self.block_size
            self.pool.park(seq, blocks, full if full < blocks else blocks, self.ledger.now)
        super().free(seq)

    def writable(self, seq: Seq, position: int) -> bool:
        return True  # nothing is shared
