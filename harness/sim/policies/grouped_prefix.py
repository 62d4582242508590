"""``paged-prefix`` over vLLM's KV cache groups: prefix caching on a model whose layers are not
all full attention, with block ids, as vLLM 0.32's ``HybridKVCacheCoordinator`` (one group:
``UnitaryKVCacheCoordinator``) does it over one ``BlockPool``.

- **Lookup** (``find_longest_cache_hit``): groups of one spec are looked up together, full
  attention (MLA included) first. A full group hits the longest run of cached blocks from the
  start; a sliding group searches from the right for ``cdiv(window − 1, block)`` contiguous
  cached blocks (or a run from the start), the blocks before them the null block. Each finder
  takes the length the previous one left; with two specs (full and one other) one pass decides,
  else passes repeat until the length holds. The full groups' blocks are then cut to it. At most
  ``num_tokens − 1`` tokens hit. A full group's run longer than the hit marks a shared prefix
  the other groups have not cached (``shared_prefix_boundary``).
- **Caching** (``cache_blocks``): a group's new full blocks are keyed by content (``(key, group)``:
  the same content is a separate entry per group). A full group caches every full block; a
  sliding group, under vLLM's default ``prefix_cache_retention_interval`` 0, only the
  ``cdiv(window − 1, block)`` blocks ending at the prompt's last whole block before its final
  token and at the shared prefix boundary: the only places a later lookup can end.
- **Blocks**: one free queue for every group (uncached frees at its front, cached frees at its
  back, a cached block evicted when popped), reference counts, hits touched out of the queue;
  blocks that leave a sliding window freed at the next step as ``GroupedPagedPolicy`` frees them
  (here by id, so a shared block stays while another table holds it).

State (Mamba, gated delta net) and chunked local layers are not modelled here: the cell is
refused (``RunSpec``). Every group has the run's block size (no state layers: equal pages).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol

from ...spec.kv_layout import cdiv
from ...spec.kv_shared_use import NULL_BLOCK
from ...spec.kv_use import KVUse
from ...spec.layer_kinds import FULL, MLA, SLIDING
from ..sequence import Seq
from .grouped import GroupedPagedPolicy
from .paged import ReuseLedger
from .shared_totals import SharedTotals

# ``_lookup``'s answer: tokens looked up, the keys read, per group its hit blocks, hit, boundary,
# and every block a finder found on the way.
Lookup = tuple[int, set[int], list[list[int]], int, int, set[int]]

FULL_SPECS = (FULL, MLA)  # vLLM's FullAttentionSpec and its subclass MLAAttentionSpec: FullAttentionManager


class Holding(Protocol):
    """What the policy tells of its tables (``SharedTotals``'s calls): a request's tables start
    and end, take blocks (fresh or hit) and let them go, and grow."""

    def add(self, idx: int) -> None: ...

    def remove(self, idx: int) -> None: ...

    def hold_new(self, idx: int, gid: int, blocks: list[int], start: int) -> None: ...

    def hold(self, idx: int, gid: int, block: int, pos: int) -> None: ...

    def drop(self, idx: int, blocks: list[int]) -> None: ...

    def table_lengths(self, idx: int, lengths: list[int], final_len: int) -> None: ...


class GroupedPrefixPolicy(GroupedPagedPolicy):
    """vLLM's KV cache groups over one pool with prefix caching (module docstring)."""

    name = "paged-prefix"

    def __init__(self, use: KVUse, max_model_len: int) -> None:
        super().__init__(use, max_model_len)
        sizes = set(self.block_sizes)
        assert len(sizes) == 1 and self.groups[0].kind in (FULL, MLA, SLIDING), "RunSpec refuses other layouts"
        self.bs = self.block_sizes[0]
        # Groups of one spec are looked up together, full attention first (a stable sort, as vLLM's).
        specs: dict[tuple[str, int, int], list[int]] = {}
        for i, g in enumerate(self.groups):
            specs.setdefault((g.kind, g.window, g.page_bytes), []).append(i)
        self.spec_groups = sorted(specs.items(), key=lambda item: item[0][0] not in FULL_SPECS)
        self.simple = len(self.spec_groups) == 2 and self.spec_groups[0][0][0] in FULL_SPECS
        # The pool: free queue in three parts popped in order (as ``PagedPolicy``'s): uncached frees,
        # never-used ids (``next_fresh`` on; id 0 is the null block), cached frees (LRU).
        self.front: list[int] = []  # the uncached frees, the free queue's front last (popped first)
        self.next_fresh = 1
        self.lru: OrderedDict[int, tuple[int, float]] = OrderedDict()  # cached free -> when freed (``ledger.now``)
        self.ref = [0] * (self.num_blocks + 1)  # by block id: the tables holding it
        self.block_hash: dict[int, tuple[int, int]] = {}  # block -> (content key, group)
        self.cache: dict[tuple[int, int], list[int]] = {}  # (content key, group) -> blocks, first inserted first
        self.ledger = ReuseLedger()
        self.tables: dict[int, list[list[int]]] = {}  # by sequence index: per group its block ids
        self.num_cached: dict[int, list[int]] = {}  # per group, blocks already offered to the cache
        self.boundary: dict[int, int] = {}  # shared_prefix_boundary of the last lookup
        self.hits: dict[int, tuple[list[list[int]], int]] = {}  # the last lookup's blocks and length
        self.lookups: dict[int, Lookup] = {}  # by sequence index: its last ``_lookup`` while it waits
        self.frees = 0  # blocks returned to the free queue so far (``_admit``'s refusals)
        # by sequence index: its last refusal's hit blocks and (frees, hit, computed, tokens, must fit)
        self.refused: dict[int, tuple[list[list[int]], tuple[int, int, int, int, int]]] = {}
        self.shared_totals = SharedTotals(use, self.bs)  # ``measure_shared`` kept up to date
        self.holding: Holding = self.shared_totals  # told of every block a table takes or lets go
        self.held_of: dict[int, int] = {}  # by sequence index: its real blocks over the groups
        self.block_bytes = use.layout.bytes_per_block
        # The groups whose layers stop reading old tokens (full attention and MLA read them all).
        self.skipping = [(gid, g) for gid, g in enumerate(self.groups) if g.kind not in FULL_SPECS]
        assert all(g.kind == SLIDING for _, g in self.skipping), "RunSpec refuses other layouts"
        self.windows = [(gid, g.window) for gid, g in self.skipping]
        self.window_of = [g.window if g.kind == SLIDING else 0 for g in self.groups]  # 0: a full group
        # by sequence index: the block counts at which a lookup can end (``_cache``), in order
        self.cache_ends: dict[int, list[int]] = {}
        self.skip_from: dict[int, int] = {}  # by sequence index: computed tokens at which ``_skip_in`` acts
        self.covered: dict[int, int] = {}  # by sequence index: the tokens every one of its tables covers
        self.cache_from: dict[int, int] = {}  # by sequence index: tokens from which ``_cache`` has work
        # What a waiting request's admission need (the fast path's ``admission_blocks``) may have
        # done since it was worked out, for the fast path (the reference reads none of it): moved
        # anyhow where ``admission_epoch`` moves (a key it reads newly cached: it may hit more);
        # grown where ``admission_grown`` does (a block it hit, ``watch``, back in the free queue
        # costs a free block again); fallen by at most ``admission_slack``'s growth, where a
        # block its lookup found is evicted: the hit shortens, a full-attention group's need
        # grows by the blocks it lost (each hit block costs at most what a missing one does), a
        # sliding group's run moves and saves at most its ``cdiv(window − 1, block)`` blocks.
        self.admission_epoch = 0
        self.admission_grown = 0
        self.admission_slack = 0
        self.slack_per_eviction = sum(cdiv(g.window - 1, self.bs) for _, g in self.skipping)
        self.watch: set[int] = set()

    # -- what the scheduler reads ------------------------------------------------------------
    def cached_free_blocks(self) -> int:
        return len(self.lru)

    def measure_use(self) -> tuple[int, int]:
        """``measure_shared`` over the live tables, from the running totals (``SharedTotals``)."""
        used, internal, self.last_groups = self.shared_totals.measure(self.live)
        unit = self.use.unit
        return used // unit, internal // unit

    # -- the pool ----------------------------------------------------------------------------
    def _pop(self, n: int) -> list[int]:
        """``get_new_blocks``: ``n`` blocks from the front of the free queue (its three parts in
        order: uncached frees, never-used ids, cached frees), each cached one evicted."""
        front = self.front
        if len(front) >= n:
            out = front[: -n - 1 : -1]  # its last n, the last first
            del front[-n:]
        else:
            out = front[::-1]
            front.clear()
            fresh = self.next_fresh
            take = min(n - len(out), self.num_blocks + 1 - fresh)
            if take > 0:
                out.extend(range(fresh, fresh + take))
                self.next_fresh = fresh + take
            if len(out) < n:
                self._evict(n - len(out), out)
        ref = self.ref
        for b in out:
            ref[b] = 1
        self._free -= n
        return out

    def _evict(self, n: int, out: list[int]) -> None:
        """The ``n`` least recently freed cached blocks out of the cache, onto ``out``."""
        lru, block_hash, cache, lookups = self.lru, self.block_hash, self.cache, self.lookups
        for _ in range(n):
            b, _ = lru.popitem(last=False)
            key = block_hash.pop(b)
            holders = cache[key]
            if len(holders) == 1:
                del cache[key]
            else:
                holders.remove(b)
            if lookups:
                self._block_evicted(b)
            out.append(b)
        self.evictions += n

    def _release(self, idx: int, runs: list[list[int]]) -> None:
        """``free_blocks`` of sequence ``idx``'s blocks, run by run (one a group, as vLLM frees them
        group by group): one reference less each; a block no table holds goes to the front of
        the free queue (a run's uncached blocks in the run's order, before the earlier runs') or
        to its back (cached)."""
        self.holding.drop(idx, [b for run in runs for b in run] if len(runs) > 1 else runs[0])
        ref, block_hash, lru, front = self.ref, self.block_hash, self.lru, self.front
        now = self.ledger.now
        for blocks in runs:
            first = []
            for b in blocks:
                if b == NULL_BLOCK:
                    continue
                r = ref[b] - 1
                ref[b] = r
                if r:
                    continue
                self._free += 1
                self.frees += 1
                if b in block_hash:
                    lru[b] = now
                    if b in self.watch:
                        self.admission_grown += 1
                else:
                    first.append(b)
            front.extend(reversed(first))

    def _touch(self, idx: int, gid: int, blocks: list[int], start: int) -> None:
        """Sequence ``idx`` takes the hit ``blocks`` from ``start`` of group ``gid``'s table."""
        for pos, b in enumerate(blocks, start):
            if b == NULL_BLOCK:
                continue
            self.holding.hold(idx, gid, b, pos)
            if self.ref[b] == 0:
                self.ledger.reused_run(1, self.lru.pop(b))
                self._free -= 1
            self.ref[b] += 1

    def _cached(self, key: int, gids: list[int]) -> list[int] | None:
        out = []
        for g in gids:
            holders = self.cache.get((key, g))
            if not holders:
                return None
            out.append(holders[0])
        return out

    # -- lookup ------------------------------------------------------------------------------
    def _find_full(self, keys: list[int], max_len: int, gids: list[int]) -> list[list[int]]:
        if len(gids) == 1:  # one group of this spec (the usual case): ``_cached`` inlined
            cache, g = self.cache, gids[0]
            one: list[int] = []
            for key in keys[: max_len // self.bs]:
                holders = cache.get((key, g))
                if not holders:
                    break
                one.append(holders[0])
            return [one]
        found: list[list[int]] = [[] for _ in gids]
        for key in keys[: max_len // self.bs]:
            cached = self._cached(key, gids)
            if cached is None:
                break
            for f, b in zip(found, cached):
                f.append(b)
        return found

    def _find_sliding(self, keys: list[int], max_len: int, gids: list[int], window: int) -> list[list[int]]:
        need = cdiv(window - 1, self.bs)
        n = max_len // self.bs
        run = 0
        if len(gids) == 1:  # one group of this spec: ``_cached`` inlined
            cache, g = self.cache, gids[0]
            one = [NULL_BLOCK] * n
            for i in range(n - 1, -1, -1):
                holders = cache.get((keys[i], g))
                if not holders:
                    run = 0
                    continue
                one[i] = holders[0]
                run += 1
                if run >= need:
                    return [one[: i + run]]
            return [one[:run]]
        found = [[NULL_BLOCK] * n for _ in gids]
        for i in range(n - 1, -1, -1):
            cached = self._cached(keys[i], gids)
            if cached is None:
                run = 0
                continue
            for f, b in zip(found, cached):
                f[i] = b
            run += 1
            if run >= need:
                return [f[: i + run] for f in found]
        return [f[:run] for f in found]

    def prefix_hit(self, seq: Seq) -> int:
        """``find_longest_cache_hit`` over the groups (module docstring); remembered for ``allocate``.
        A request that waits is looked up again each step: the last answer stands while no block
        it found was evicted (``_block_evicted``) and no key it reads gained its first cached
        block (``_key_changed``)."""
        seq.pending_hits = []
        if seq.num_computed:
            return 0
        last = self.lookups.get(seq.index)
        if last is None or last[0] != seq.num_tokens:
            last = self._lookup(seq)
            self.lookups[seq.index] = last
        _, _, out, hit, boundary, _ = last
        self.hits[seq.index] = (out, hit)
        self.boundary[seq.index] = boundary
        return hit

    def _key_changed(self, key: int) -> None:
        """``key`` gained its first cached block (in some group): lookups that read it are stale."""
        stale = [i for i, last in self.lookups.items() if key in last[1]]
        if stale:
            self.admission_epoch += 1
            for idx in stale:
                del self.lookups[idx]

    def _block_evicted(self, block: int) -> None:
        """``block`` left the cache: lookups that found it are stale. One that did not find it
        stands: a finder reads a key's first cached block only (a later copy becomes first only
        when the first leaves), and a block it did not find lay past the run it found (a full
        group's first miss, a sliding group's run to the right too short)."""
        stale = [i for i, last in self.lookups.items() if block in last[5]]
        if stale:
            self.admission_grown += 1
            self.admission_slack += self.slack_per_eviction
            for idx in stale:
                del self.lookups[idx]

    def _lookup(self, seq: Seq) -> Lookup:
        """``prefix_hit``'s answer: (tokens, keys read, per group its hit blocks, hit, boundary,
        blocks found)."""
        keys = seq.block_keys
        hit = seq.num_tokens - 1
        longest = 0
        blocks: list[list[int] | None] = [None] * len(self.groups)
        lengths = [0] * len(self.groups)
        seen: set[int] = set()
        while True:
            curr = hit
            for (kind, window, _), gids in self.spec_groups:
                if kind in FULL_SPECS and blocks[gids[0]] is not None:
                    curr = min(curr, lengths[gids[0]])  # a full group's run only shortens
                    continue
                if kind in FULL_SPECS:
                    found = self._find_full(keys, curr, gids)
                else:
                    found = self._find_sliding(keys, curr, gids, window)
                curr = len(found[0]) * self.bs
                for g, f in zip(gids, found):
                    blocks[g] = f
                    lengths[g] = curr
                    seen.update(f)
                longest = max(longest, curr)
            if curr >= hit:
                break
            hit = curr
            if self.simple:
                break
        n = cdiv(hit, self.bs)
        out = []
        for group, found_blocks in zip(self.groups, blocks):
            b = found_blocks if found_blocks is not None else []
            out.append(b[:n] if group.kind in FULL_SPECS else b)
        read = set(keys[: (seq.num_tokens - 1) // self.bs])
        seen.discard(NULL_BLOCK)
        return seq.num_tokens, read, out, hit, longest if longest > hit else 0, seen

    # -- allocation --------------------------------------------------------------------------
    def _new_need(self, num_tokens: int, computed: int, hits: list[list[int]], cap: bool) -> int:
        """``get_num_blocks_to_allocate`` summed over groups, for a request without tables yet."""
        blocks = -(-num_tokens // self.bs)
        ref = self.ref
        total = 0
        for g, h in zip(self.groups, hits):
            required = blocks
            if cap and g.admission_blocks is not None and g.admission_blocks < blocks:
                required = g.admission_blocks
            skipped = g.skipped_tokens(computed) // self.bs if g.kind == SLIDING else 0
            total += max(required - max(skipped, len(h)), 0)
            for b in h[skipped:]:
                if b != NULL_BLOCK and ref[b] == 0:
                    total += 1  # a cached block the hit takes back from the free queue
        return total

    def _grow_need(self, tables: list[list[int]], num_tokens: int) -> int:
        """``get_num_blocks_to_allocate`` summed over a request's tables."""
        want = -(-num_tokens // self.bs)
        total = 0
        for t in tables:
            if want > len(t):
                total += want - len(t)
        return total

    def _skip_in(self, seq: Seq, tables: list[list[int]]) -> None:
        """``remove_skipped_blocks``: per group, the blocks of tokens no layer reads any more freed
        from the last one back to the first null, the null block put in their place. Nothing
        moves until a window leaves one more block (``skip_from``, which ``allocate`` checks):
        everything before the last call's skipped blocks is null already, and tables only grow."""
        computed = min(seq.num_computed, self.max_model_len)
        bs = self.bs
        again = self.max_model_len + 1  # past every computed count ``_skip_in`` reads
        runs = []
        for gid, window in self.windows:
            table = tables[gid]
            skipped = (computed - window + 1) // bs if computed >= window else 0  # ``skipped_tokens``, in blocks
            if skipped > len(table):
                skipped = len(table)
                again = 0  # the table grows under its skipped tokens: look again next call
            else:
                nxt = (skipped + 1) * bs + window - 1  # a sliding group's next block out
                if nxt < again:
                    again = nxt
            freed = []
            for i in range(skipped - 1, -1, -1):
                if table[i] == NULL_BLOCK:
                    break
                freed.append(table[i])
                table[i] = NULL_BLOCK
            if freed:
                runs.append(freed)
                self.held_of[seq.index] -= len(freed)
        if runs:
            self._release(seq.index, runs)
        self.skip_from[seq.index] = again

    def _skippable_in(self, seq: Seq, tables: list[list[int]]) -> int:
        computed = min(seq.num_computed, self.max_model_len)
        n = 0
        for gid, g in self.skipping:
            table = tables[gid]
            for i in range(min(g.skipped_tokens(computed) // self.bs, len(table)) - 1, -1, -1):
                if table[i] == NULL_BLOCK:
                    break
                n += self.ref[table[i]] == 1
        return n

    def can_allocate(self, seq: Seq, num_tokens: int, must_fit: int = 0) -> bool:
        tables = self.tables.get(seq.index)
        if tables is not None:
            return self._grow_need(tables, num_tokens) <= self._free + self._skippable_in(seq, tables)
        hits, hit = self._hit_of(seq)
        return self._need_to_admit(num_tokens, must_fit, hits, seq.num_computed + hit) <= self._free

    def allocate(self, seq: Seq, num_tokens: int, must_fit: int = 0, cache_blocks: bool = True) -> bool:
        """``allocate_slots``: the admission gate (with the hit), the skipped blocks freed, the new
        blocks if they fit (the hit touched first), then the full blocks offered to the cache.
        ``cache_blocks`` False: a waiting request's positions past its hit up to ``num_tokens``
        arrive by a load from a CPU tier (``harness.sim.offload``): they count as computed (a
        sliding group skips what they put outside its window) and are cached when it lands
        (``cache_full_blocks``; vLLM's ``delay_cache_blocks``)."""
        idx = seq.index
        tables = self.tables.get(idx)
        if tables is None:
            return self._admit(seq, num_tokens, must_fit, cache_blocks)
        # Each step is taken only where something can move (each is a no-op otherwise).
        if seq.num_computed >= self.skip_from[idx]:
            self._skip_in(seq, tables)
        slot = min(num_tokens, self.max_model_len)
        if slot > self.covered[idx]:
            if self._grow_need(tables, slot) > self._free:
                return False
            self._extend(seq, tables, slot)
        cache_from = self.cache_from[idx]
        if num_tokens >= cache_from and seq.num_tokens >= cache_from:
            self._cache(seq, min(num_tokens, seq.num_tokens))
        self._held(seq)
        return True

    def _admit(self, seq: Seq, num_tokens: int, must_fit: int, cache_blocks: bool = True) -> bool:
        """``allocate`` for a request without tables: the gate with its hit, then its tables.
        A refusal stands while the lookup and the asked stand and no block was freed: a block
        taken from the free queue is one less free, and one less to take back if it is a hit
        (an evicted hit makes a new lookup), so the blocks lacking never shrink."""
        hits, hit = self._hit_of(seq)
        computed = seq.num_computed + hit if cache_blocks else num_tokens
        asked = (self.frees, hit, seq.num_computed, num_tokens, must_fit)
        refused = self.refused.get(seq.index)
        if cache_blocks and refused is not None and refused[0] is hits and refused[1] == asked:
            return False
        if self._need_to_admit(num_tokens, must_fit, hits, computed) > self._free:
            if cache_blocks:
                self.refused[seq.index] = (hits, asked)
            return False
        slot = min(num_tokens, self.max_model_len)
        tables = self._open(seq, hits, min(computed, self.max_model_len))
        self._extend(seq, tables, slot)
        if cache_blocks:
            self._cache(seq, min(num_tokens, seq.num_tokens))
        self._held(seq)
        return True

    # -- a CPU tier (``harness.sim.offload``) ----------------------------------------------------
    def fits_leaving(self, seq: Seq, num_tokens: int, must_fit: int, reserved: int) -> bool:
        """Whether a load admission of ``seq`` backing ``num_tokens`` positions (its hit and what the
        load fills) fits with ``reserved`` free blocks left for others (vLLM's ``reserved_blocks``;
        the whole-sequence gate reads every free block)."""
        hits, _ = self._hit_of(seq)
        mml = self.max_model_len
        computed = min(num_tokens, mml)
        if must_fit and self._new_need(must_fit, computed, hits, True) > self._free:
            return False
        return self._new_need(computed, computed, hits, False) <= self._free - reserved

    def remaining_blocks(self, seq: Seq, max_model_len: int) -> int:
        """The blocks ``seq`` (holding tables) still needs to hold its whole sequence, a sliding
        group's capped as at admission (vLLM's ``_request_remaining_blocks``)."""
        tables = self.tables[seq.index]
        want = cdiv(min(seq.num_tokens, max_model_len), self.bs)
        total = 0
        for g, t in zip(self.groups, tables):
            need = want if g.admission_blocks is None else min(want, g.admission_blocks)
            if need > len(t):
                total += need - len(t)
        return total

    def cache_full_blocks(self, seq: Seq, num_tokens: int) -> None:
        """Cache what a load filled, once it landed (``cache_blocks``)."""
        self._cache(seq, min(num_tokens, seq.num_tokens))

    def tables_of(self, seq: Seq) -> list[list[int]]:
        return self.tables[seq.index]

    def _hit_of(self, seq: Seq) -> tuple[list[list[int]], int]:
        """The hit ``prefix_hit`` remembered for ``seq``: per group its blocks, and its tokens."""
        hits, hit = self.hits.get(seq.index, ([], 0))
        return (hits or [[] for _ in self.groups]), hit

    def _need_to_admit(self, num_tokens: int, must_fit: int, hits: list[list[int]], computed: int) -> int:
        """The free blocks admitting a request to ``num_tokens`` with ``hits`` and ``computed`` tokens
        asks: its slot's and, with ``must_fit``, its whole sequence's (vLLM's gate, a sliding
        group's capped), the larger."""
        need = self._new_need(min(num_tokens, self.max_model_len), computed, hits, False)
        if must_fit:
            need = max(need, self._new_need(must_fit, min(computed, self.max_model_len), hits, True))
        return need

    def _extend(self, seq: Seq, tables: list[list[int]], slot: int) -> None:
        """Each table grown to cover ``slot`` tokens with blocks from the free queue."""
        idx = seq.index
        want = -(-slot // self.bs)
        lengths = [len(t) for t in tables]
        total = sum(want - n for n in lengths if n < want)
        if total:
            blocks = self._pop(total)  # group by group, as each group's own call would take them
            i = 0
            for gid, (t, n) in enumerate(zip(tables, lengths)):
                if n < want:
                    part = blocks[i : i + want - n]
                    i += want - n
                    self.holding.hold_new(idx, gid, part, n)
                    t.extend(part)
            self.held_of[idx] += total
            lengths = [len(t) for t in tables]
        self.covered[idx] = min(lengths) * self.bs
        self.holding.table_lengths(idx, lengths, seq.final_len)

    def _held(self, seq: Seq) -> None:
        """``seq.allocated`` (and its peak) from the real blocks it holds."""
        seq.allocated = self.held_of[seq.index] * self.block_bytes // self.use.unit
        if seq.allocated > seq.peak_allocated:
            seq.peak_allocated = seq.allocated

    def _open(self, seq: Seq, hits: list[list[int]], computed: int) -> list[list[int]]:
        """A new request's tables: per group its hit blocks past what its layers skip at
        ``computed`` tokens, the null block before them."""
        idx = seq.index
        self.holding.add(idx)
        tables = []
        held = 0
        for gid, (g, h) in enumerate(zip(self.groups, hits)):
            skipped = g.skipped_tokens(computed) // self.bs
            kept = h[skipped:]
            self._touch(idx, gid, kept, skipped)
            held += sum(1 for b in kept if b != NULL_BLOCK)
            tables.append([NULL_BLOCK] * skipped + kept)
        self.tables[idx] = tables
        self.num_cached[idx] = [len(t) for t in tables]
        boundary = self.boundary.get(idx, 0)
        self.cache_ends[idx] = sorted({(seq.prompt_len - 1) // self.bs, *([boundary // self.bs] if boundary else [])})
        self.cache_from[idx] = (min(self.num_cached[idx]) + 1) * self.bs
        self.skip_from[idx] = 0
        self.held_of[idx] = held
        self.live[idx] = seq
        self.hits.pop(idx, None)
        self.lookups.pop(idx, None)
        self.refused.pop(idx, None)
        return tables

    def _cache(self, seq: Seq, num_tokens: int) -> None:
        """``cache_blocks``: each group's new full blocks keyed; a sliding group's only where a
        later lookup can end (module docstring): the blocks before one of the request's
        boundaries (``cache_ends``), none from the last of them on."""
        idx = seq.index
        bs = self.bs
        full = num_tokens // bs
        done = self.num_cached[idx]
        if min(done) >= full:
            return
        keys = seq.block_keys
        ends = self.cache_ends[idx]
        block_hash, cache = self.block_hash, self.cache
        for gid, table in enumerate(self.tables[idx]):
            start = done[gid]
            if start >= full:
                continue
            done[gid] = full
            stop = full
            wanted: set[int] | None = None
            window = self.window_of[gid]
            if window:  # a sliding group
                if start >= ends[-1]:
                    continue
                need = cdiv(window - 1, bs)
                wanted = set()
                for end in ends:
                    wanted.update(range(max(start, end - need), min(full, end)))
                stop = min(full, ends[-1])
            for i in range(start, stop):
                b = table[i]
                if b == NULL_BLOCK or (wanted is not None and i not in wanted):
                    continue
                key = (keys[i], gid)
                block_hash[b] = key
                holders = cache.get(key)
                if holders:
                    holders.append(b)
                else:
                    cache[key] = [b]
                    if self.lookups:
                        self._key_changed(keys[i])
        self.cache_from[idx] = (min(done) + 1) * bs

    def blocks_needed(self, seq: Seq, num_tokens: int) -> int:
        tables = self.tables.get(seq.index)
        if tables is None:
            return len(self.groups) * cdiv(num_tokens, self.bs)
        return self._grow_need(tables, num_tokens)

    def free(self, seq: Seq) -> None:
        """Each group's table released last block first, group by group (``coordinator.free``)."""
        tables = self.tables.pop(seq.index, None)
        if tables is not None:
            self._release(seq.index, [t[::-1] for t in tables])
            self.holding.remove(seq.index)
            del self.skip_from[seq.index], self.covered[seq.index], self.cache_from[seq.index]
            del self.num_cached[seq.index], self.live[seq.index], self.held_of[seq.index]
            del self.cache_ends[seq.index]
        self.hits.pop(seq.index, None)
        self.lookups.pop(seq.index, None)
        self.refused.pop(seq.index, None)
        seq.allocated = 0
        seq.pending_hits = []
