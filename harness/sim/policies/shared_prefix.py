"""``paged-prefix`` kept as counts and content keys: vLLM's prefix cache, exact with sharing.

The block table (``PagedPolicy`` with caching) names every block; what the simulator records
depends on less: how many blocks are free, which free ones hold content and in what order they
were freed (evictions pop the least recently freed), and which content each cached block holds
(a hit takes the first cached block with a key). A block without content is a count.

While no content is cached twice (``CachedChains``), a cached block is its content and the
blocks sequences share form a tree of *chains*: the blocks one admission computed, from the
depth its hits end. Hits take a prefix, so a chain's held blocks are a prefix of it, and a free
puts what nobody else holds in the LRU as one *run*, a piece per chain, deepest first;
evictions eat chains from their deep end, hits take them from their shallow end. A call costs
per chain and run it touches, not per block. The first block cached twice (two requests
computing one prompt at once, a request swapped in, hits stopping a block short of a prompt)
moves the policy, once, to ``CachedBlocks``: a handle per cached block, the LRU an
``OrderedDict`` of handles (O(1) touch, evict, append), each key's cached handles, the
references beyond the first.

A stretch takes many blocks at once (``take``) without naming the blocks a decoder grows into:
they hold only its own sampled tokens, so nothing can hit them before it frees them, and they
are cached then (``free``). Equality with the block table is tested call for call, and the
chains against the handles with the stretch's ``take`` (``tests/sim/test_policy_properties.py``),
and record for record through the simulator (``tests/sim/test_fast_path.py``)."""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections import OrderedDict, deque
from collections.abc import Iterable
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
    given back when its block is evicted (at most that many blocks hold content at once); each
    sequence's blocks are its cached handles (a prefix of its blocks) and a count of the rest.
    The LRU keeps when each block was freed (the reuse distances); later handles of a key wait
    in ``more``. Runs of hits, caching a prompt's blocks, freeing a sequence that shares nothing
    and evicting go in bulk through the dictionaries' own loops."""

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


class Chain:
    """The blocks one admission of a sequence computed itself (depths ``a`` on of its keys), as
    long as no content is cached twice: ``[a, h)`` held, ``[h, c)`` free in the LRU (``pieces``),
    the rest evicted. Sequences that hit them hold a prefix, ``[a, end)`` (``holders``)."""

    __slots__ = ("keys", "a", "h", "c", "holders", "running", "pieces")

    def __init__(self, keys: list[int], a: int) -> None:
        self.keys = keys
        self.a = self.h = self.c = a
        self.holders: list[int] = []  # other running sequences' ends on it, sorted
        self.running = True  # its sequence runs and holds every block cached
        self.pieces: deque[Piece] = deque()  # its free blocks by depth, deepest (oldest) first


class Piece:
    """Blocks ``[lo, hi)`` of ``chain``, free in ``run``: evicted from ``hi``, hit from ``lo``."""

    __slots__ = ("chain", "lo", "hi", "run")

    def __init__(self, chain: Chain, lo: int, hi: int, run: Run) -> None:
        self.chain, self.lo, self.hi, self.run = chain, lo, hi, run


class Run:
    """The blocks one free put in the LRU, deepest first: pieces of the chains it held, freed at
    ``at`` (step, seconds). It leaves the LRU once evictions and hits have emptied it."""

    __slots__ = ("pieces", "front", "at", "live")

    def __init__(self, at: tuple[int, float]) -> None:
        self.pieces: list[Piece] = []
        self.front = 0  # pieces before it are evicted
        self.at = at
        self.live = 0


Hits = list[tuple[Chain, int]]  # a sequence's hit blocks: (chain, end) from depth 0, each from its chain's ``a``


class CachedChains:
    """``CachedBlocks`` as runs and chains, while no content is cached twice (the module docstring).

    Then a chain's reference counts fall with depth (a hit holds a prefix of each chain it
    touches), and a hit's blocks, chain by chain, start each at a chain's first block: the
    content index (``index``) keeps only first keys. Per block, only caching looks its keys up
    (in C): content already cached is answered ``False`` (``cache``), and the policy moves to
    ``CachedBlocks`` (``to_blocks``)."""

    __slots__ = ("uncached", "lru", "queued", "index", "live")

    def __init__(self, blocks: int) -> None:
        self.uncached = blocks
        self.lru: OrderedDict[Run, None] = OrderedDict()  # O(1) at the front and wherever hits empty one
        self.queued = 0  # free cached blocks
        self.index: dict[int, Chain] = {}  # a chain's first key → it, while that block is cached
        self.live: dict[int, tuple[Seq, Hits, Chain]] = {}  # running sequence → (it, its hits, its own chain)

    def hits(self, keys: list[int], limit: int) -> Hits:
        """The longest run of cached blocks of ``keys``, up to ``limit``, chain by chain."""
        index = self.index
        path: Hits = []
        d = 0
        limit = min(limit, len(keys))
        while d < limit:
            ch = index.get(keys[d])
            if ch is None:
                break
            assert ch.a == d, "a chain is entered at its first block"
            end = ch.c if ch.c < limit else limit
            mine = ch.keys
            if keys[end - 1] != mine[end - 1]:  # keys are chained: they agree up to some depth
                lo, hi = d, end - 1  # keys[lo] agree, keys[hi] differ
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    if keys[mid] == mine[mid]:
                        lo = mid
                    else:
                        hi = mid
                end = hi
            path.append((ch, end))
            d = end
        return path

    def take(self, n: int) -> int:
        """Take ``n`` free blocks (they fit): the uncached first, then the LRU's front, each
        chain from its deep end. Returns how many were evicted."""
        u = self.uncached
        if n <= u:
            self.uncached = u - n
            return 0
        self.uncached = 0
        rest = n - u
        self.queued -= rest
        lru, index = self.lru, self.index
        while rest:
            run = next(iter(lru))
            pieces, i = run.pieces, run.front
            while rest and i < len(pieces):
                p = pieces[i]
                m = p.hi - p.lo
                if not m:  # emptied by hits
                    i += 1
                    continue
                if m > rest:
                    m = rest
                ch, hi = p.chain, p.hi
                assert ch.c == hi, "the LRU's front is its chain's deepest free block"
                ch.c = p.hi = hi - m
                if ch.c == ch.a:  # nothing of it is cached any more
                    del index[ch.keys[ch.a]]
                run.live -= m
                rest -= m
                if p.hi == p.lo:
                    ch.pieces.popleft()
                    i += 1
            run.front = i
            if not run.live:
                del lru[run]
        return n - u

    def admit(self, seq: Seq, path: Hits, ledger: ReuseLedger) -> tuple[int, int]:
        """``seq`` is admitted on the hits ``path``: the blocks others hold gain a reference, the
        free ones leave the LRU. Returns (blocks shared with others, blocks out of the LRU)."""
        shared = revived = 0
        for ch, end in path:
            h = ch.h
            if end > h:
                shared += h - ch.a
                revived += end - h
                pieces = ch.pieces
                while h < end:  # the chain's shallowest free blocks, in the newest runs
                    p = pieces[-1]
                    assert p.lo == h
                    m = p.hi - h if p.hi < end else end - h
                    p.lo = h = h + m
                    run = p.run
                    run.live -= m
                    ledger.reused_run(m, run.at)
                    if p.lo == p.hi:
                        pieces.pop()
                        if not run.live:
                            del self.lru[run]
                ch.h = end
            else:
                shared += end - ch.a
            insort(ch.holders, end)
        self.queued -= revived
        self.live[seq.index] = (seq, path, Chain(seq.block_keys, path[-1][1] if path else 0))
        return shared, revived

    def cache(self, seq: Seq, full: int) -> bool:
        """``seq``'s blocks up to its ``full``-th get their content keys; False (nothing changed)
        when one of them is cached already: where a chain starts (so only first keys are looked
        up), or in the chain its hits end in, past them (its hits stopped short of the prompt)."""
        _, path, own = self.live[seq.index]
        c = own.c
        keys = seq.block_keys[c:full]
        if path:
            last = path[-1][0]
            if last.c > c and last.keys[c] == keys[0]:
                return False
        index = self.index
        if not index.keys().isdisjoint(keys):
            return False
        if c == own.a:
            index[keys[0]] = own
        own.c = own.h = full
        seq.num_cached_blocks = full
        return True

    def free(self, seq: Seq, now: tuple[int, float]) -> tuple[int, int]:
        """``seq`` frees its cached blocks: those nobody else holds go to the LRU's tail as one
        run. Returns (blocks to the LRU, blocks others still hold)."""
        _, path, own = self.live.pop(seq.index)
        run = Run(now)
        own.running = False
        top = own.holders[-1] if own.holders else own.a
        freed = own.c - top
        if freed:
            p = Piece(own, top, own.c, run)
            run.pieces.append(p)
            own.pieces.append(p)
            own.h = top
        held = top - own.a
        for ch, end in reversed(path):
            hs = ch.holders
            del hs[bisect_left(hs, end)]
            top = ch.c if ch.running else hs[-1] if hs else ch.a
            if top < ch.h:  # it held the deepest: the rest goes free
                p = Piece(ch, top, ch.h, run)
                run.pieces.append(p)
                ch.pieces.append(p)
                freed += ch.h - top
                ch.h = top
                held += top - ch.a
            else:
                held += end - ch.a
        if freed:
            run.live = freed
            self.lru[run] = None
            self.queued += freed
        return freed, held

    def refs(self, seq: Seq, i: int) -> int:
        """The sequences holding block ``i`` of running ``seq`` (0: a block without content)."""
        _, path, own = self.live[seq.index]
        for ch, end in [*path, (own, own.c)]:
            if ch.a <= i < end:
                return ch.running + len(ch.holders) - bisect_right(ch.holders, i)
        return 0

    def to_blocks(self, blocks: int, ledger: ReuseLedger, pending: Iterable[tuple[Seq, Hits]]) -> CachedBlocks:
        """The same state as ``CachedBlocks``: a handle for each cached block, the LRU in order,
        the references beyond one, each running sequence's handles."""
        pool = CachedBlocks(blocks, ledger)
        pool.uncached = self.uncached
        names: dict[int, list[int]] = {}  # id(chain) → the handles of its blocks from ``a``
        spare, key_of, first = pool.spare, pool.key_of, pool.first

        def name(ch: Chain) -> list[int]:
            got = names.get(id(ch))
            if got is None:
                got = names[id(ch)] = [spare.pop() for _ in range(ch.a, ch.c)]
                for h, key in zip(got, ch.keys[ch.a : ch.c]):
                    key_of[h] = key
                    first[key] = h
                for d in range(ch.a, ch.h):
                    refs = ch.running + len(ch.holders) - bisect_right(ch.holders, d)
                    if refs > 1:
                        pool.shared[got[d - ch.a]] = refs - 1
            return got

        for run in self.lru:
            for p in run.pieces[run.front :]:
                handles = name(p.chain)
                for d in range(p.hi - 1, p.lo - 1, -1):
                    pool.lru[handles[d - p.chain.a]] = run.at
        for seq, path, own in self.live.values():
            seq.blocks = [h for ch, end in path for h in name(ch)[: end - ch.a]] + name(own)
        for seq, path in pending:
            seq.pending_hits = [h for ch, end in path for h in name(ch)[: end - ch.a]]
        return pool


class SharedPrefixPolicy(CountingPagedPolicy):
    """``paged-prefix`` as ``CachedBlocks``: the block table's answers, without block ids."""

    def __init__(self, budget_positions: int, block_size: int) -> None:
        super().__init__(budget_positions, block_size, "paged-prefix")
        self.ledger = ReuseLedger()
        self.pool = CachedBlocks(self.num_blocks, self.ledger)
        # Runs and chains until some content is cached twice, then ``pool`` (``CachedChains``).
        self.chains: CachedChains | None = CachedChains(self.num_blocks)
        self._pending: dict[int, tuple[Seq, Hits]] = {}  # ``prefix_hit``'s answers for ``chains``
        # The last ``prefix_hit`` answered: (sequence, keys looked at, evictions then, hits).
        self._last: tuple[Seq, int, int, list[int]] | None = None

    def cached_free_blocks(self) -> int:
        chains = self.chains
        return chains.queued if chains is not None else len(self.pool.lru)

    def uncached_free(self) -> int:
        chains = self.chains
        return chains.uncached if chains is not None else self.pool.uncached

    def _to_blocks(self) -> None:
        """Some content is about to be cached twice: name every block (``CachedBlocks``)."""
        assert self.chains is not None
        self.pool = self.chains.to_blocks(self.num_blocks, self.ledger, self._pending.values())
        self.chains = None
        self._pending.clear()
        self._last = None

    def prefix_hit(self, seq: Seq) -> int:
        """The longest run of cached blocks from the start (never the whole prompt), remembered
        for the next ``allocate``."""
        if seq.num_computed:
            seq.pending_hits = []
            self._pending.pop(seq.index, None)
            return 0
        limit = (seq.num_tokens - 1) // self.block_size
        chains = self.chains
        if chains is not None:
            path = chains.hits(seq.block_keys, limit)
            self._pending[seq.index] = (seq, path)
            return path[-1][1] * self.block_size if path else 0
        pool = self.pool
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
        chains = self.chains
        if chains is not None:
            got = self._pending.get(seq.index)
            path = got[1] if got is not None else None
            hit = path[-1][1] if path else 0
        else:
            hits = seq.pending_hits
            hit = len(hits)
        held = seq.allocated // bs + hit
        free = self._free
        need = max(cdiv(must_fit, bs) - held, 0) if must_fit else 0
        new = cdiv(num_tokens, bs) - held
        if new < 0:
            new = 0
        if need > free or new > free:
            return -1, 0  # refused whatever the hits in the free queue add
        if not hit:
            evictable = 0
        elif chains is not None:
            assert path is not None
            evictable = sum(end - ch.h for ch, end in path if end > ch.h)
        else:
            evictable = len(self.pool.lru.keys() & hits)
        if need + evictable > free:
            return -1, evictable
        return (new if new + evictable <= free else -1), evictable

    def admission_floor(self, seq: Seq, must_fit: int) -> int:
        return 0  # a hit on a block another request holds stands in for a free block

    def can_allocate(self, seq: Seq, num_tokens: int, must_fit: int = 0) -> bool:
        return self._new_blocks(seq, num_tokens, must_fit)[0] >= 0

    def allocate(self, seq: Seq, num_tokens: int, must_fit: int = 0) -> bool:
        new, evictable = self._new_blocks(seq, num_tokens, must_fit)
        if new < 0:
            return False
        bs = self.block_size
        chains = self.chains
        if chains is not None:
            old = seq.allocated
            hit = 0
            if seq.index not in chains.live:  # admitted: on its hits
                got = self._pending.pop(seq.index, None)
                path = got[1] if got is not None else []
                sharing, _ = chains.admit(seq, path, self.ledger)
                self.shared_excess_positions += sharing * bs
                seq.num_cached_blocks = hit = path[-1][1] if path else 0
            self.evictions += chains.take(new)
            self._free -= new + evictable
            seq.allocated = allocated = old + (hit + new) * bs
            if allocated > seq.peak_allocated:
                seq.peak_allocated = allocated
            self.internal_positions += internal_of(allocated, seq.final_len) - internal_of(old, seq.final_len)
            self.cache_full_blocks(seq, min(num_tokens, seq.num_tokens))
            return True
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
        chains = self.chains
        evicted = chains.take(n) if chains is not None else self.pool.take(n)
        self.evictions += evicted
        return evicted

    def cache_full_blocks(self, seq: Seq, num_tokens: int) -> None:
        """Cache the blocks of ``seq`` its first ``num_tokens`` positions fill."""
        full = num_tokens // self.block_size
        chains = self.chains
        if chains is not None:
            if full <= seq.num_cached_blocks or chains.cache(seq, full):
                return
            self._to_blocks()
        self.pool.cache(seq, full)

    def free(self, seq: Seq) -> None:
        """Free as the block table does — last block first: a block without content to the
        uncached, a cached one to the LRU's tail once no sequence holds it — after caching the
        blocks its computed tokens fill (a decoder's, deferred: only it could hit them)."""
        seq.pending_hits = []
        chains = self.chains
        if chains is not None:
            self._pending.pop(seq.index, None)
            if seq.index in chains.live:
                self._free_chains(seq, chains)
            return
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

    def _free_chains(self, seq: Seq, chains: CachedChains) -> None:
        """``free`` on ``CachedChains``."""
        bs = self.block_size
        if seq.num_computed // bs > seq.num_cached_blocks:  # a decoder's blocks, cached now
            self.cache_full_blocks(seq, seq.num_computed)
            if self.chains is None:  # some content is cached twice now: freed by handles
                self.free(seq)
                return
        queued, kept = chains.free(seq, self.ledger.now)
        uncached = seq.allocated // bs - seq.num_cached_blocks
        chains.uncached += uncached
        self._free += queued + uncached
        self.shared_excess_positions -= kept * bs
        self.internal_positions -= internal_of(seq.allocated, seq.final_len)
        seq.allocated = 0
        seq.num_cached_blocks = 0

    def writable(self, seq: Seq, position: int) -> bool:
        i = position // self.block_size
        if self.chains is not None:
            return self.chains.refs(seq, i) <= 1
        return i >= len(seq.blocks) or seq.blocks[i] not in self.pool.shared
