"""``GroupedPrefixPolicy`` for the fast path: the same block ids, hits, caching and evictions,
with its step measures kept as lines in the steps to come and each request's next act named in
advance, as ``CountingGroupedPolicy`` keeps them for ``paged``.

``measure_shared`` counts per group the distinct real blocks, the bytes past each request's
final length, and the bytes read: each request's own reads less, for each shared block, all its
holders' reads of it but the largest. Here blocks and internal bytes are running totals
(``Held``); a full-attention layer reads all of a shared block for every holder, so each holder
but one adds a block's full-layer bytes to a constant; a sliding layer's reads differ, so each
shared block has a *designated* holder, the one with the fewest computed tokens (it reads the
most), and every other holder's sliding reads of it are its *surplus*. A request's used bytes
per group are a line in the measured steps, its own reads less its surplus, valid while it
computes one token a step and until its next act (``reach``): a block needed or skipped, a
window filling, or a surplus read bending (a window entering or leaving a shared block).

A request's *offset* (computed tokens less the step) orders the holders: decoders keep theirs,
so designations move only where a holder joins or leaves a block or a request computes other
than one token a step; a holder that loses its designation there may bend sooner than its filed
act, and the fast path files it again (``refile``). A decoder's full blocks are cached when it
is freed (or at its next ``allocate``), not the step each fills: a decoded block's content key
is its own, so no other request looks it up meanwhile, and only its release reads whether it is.
``tests/sim/test_fast_path_hybrid.py`` holds it to ``GroupedPrefixPolicy`` record for record.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ...spec.kv_shared_use import NULL_BLOCK
from ...spec.kv_use import KVUse
from ...spec.layer_kinds import SLIDING
from ..sequence import Seq
from .group_counts import measure_sums
from .grouped_prefix import GroupedPrefixPolicy
from .shared_totals import bytes_past

_ALL = 1 << 62  # a full or MLA layer's span: every computed token
_NEVER = 1 << 62  # past any position


def _reads(layers: list[tuple[int, int]], start: int, end: int, c: int) -> tuple[int, int, int]:
    """Bytes ``layers`` read of the block ``[start, end)`` at ``c`` computed tokens, their change
    at the next token, and the last ``c`` through which that change holds (a layer reads
    ``min(c, end) − max(start, c − span)`` tokens of it, none below zero)."""
    value = slope = 0
    bend = _NEVER
    for span, nbytes in layers:
        low = c - span
        f0 = (c if c < end else end) - (low if low > start else start)
        low += 1
        f1 = (c + 1 if c + 1 < end else end) - (low if low > start else start)
        f0 = f0 if f0 > 0 else 0
        f1 = f1 if f1 > 0 else 0
        value += f0 * nbytes
        slope += (f1 - f0) * nbytes
        for kink in (start, end, start + span, end + span):
            if c < kink < bend:
                bend = kink
    return value, slope, bend


class CountingGroupedPrefixPolicy(GroupedPrefixPolicy):
    """``GroupedPrefixPolicy`` with running totals for its measures and each request's next act
    (module docstring). The totals, ``sums``, are laid out as ``CountingGroupedPolicy``'s with
    every group a set of its own (groups of one arithmetic share cached content unevenly: an
    eviction takes one group's copy of a key and not another's): per group its used-bytes line's
    constant and slope and its real blocks, last the internal bytes over every group."""

    needs_run_order = True  # block ids: acts allocate and free in running order, as the reference

    def __init__(self, use: KVUse, max_model_len: int) -> None:
        super().__init__(use, max_model_len)
        self.steps = 0  # steps measured so far
        self.twin_of = list(range(len(self.groups)))  # each group its own set (class docstring)
        self.sums = [0] * (3 * len(self.groups) + 1)
        # Per group: (span, bytes a token) of each layer (span: window − 1, or every token); the
        # sliding layers alone, whose reads of a shared block differ between its holders; and the
        # bytes a block's full-attention (and MLA) layers read once every holder is past its end.
        self.layers = [
            [(w - 1 if kind == SLIDING else _ALL, nbytes) for kind, w, nbytes in gu.reads] for gu in use.groups
        ]
        self.sliding = [[(span, nbytes) for span, nbytes in layers if span < _ALL] for layers in self.layers]
        self.full_block = [self.bs * sum(nbytes for span, nbytes in layers if span == _ALL) for layers in self.layers]
        # Per group: the tokens past a block's start from which no sliding layer reads it (``_reads``
        # is nothing and bends no more there).
        self.read_past = [self.bs + max((span for span, _ in sliding), default=0) for sliding in self.sliding]
        self.held = Held(self)
        self.holding = self.held  # in place of ``SharedTotals``: the same calls, kept as lines here
        self._lines: dict[int, list[int]] = {}  # per request: its share of the used-bytes lines
        self._surplus: dict[int, tuple[list[int], int]] = {}  # per request: its surplus lines, valid through
        self._stale: set[int] = set()  # requests whose surplus must be drawn again
        self._off: dict[int, int] = {}  # per request: computed tokens less the measured step
        self._own: dict[int, tuple[list[int], int]] = {}  # per request: its own reads' lines, valid through
        self._reach: dict[int, int] = {}
        self._through: dict[int, int] = {}  # per request: the last position both its lines hold through (``_reach_of``)
        # The fast path files a decoder's next act again where it comes sooner than filed.
        self.refile: Callable[[Seq], None] | None = None

    # -- what the fast path reads --------------------------------------------------------
    def free_blocks(self) -> int:
        return self._free

    def reach(self, seq: Seq) -> int:
        return self._reach[seq.index]

    def crossing_need(self, seqs: Iterable[Seq]) -> int:
        tables = self.tables
        return sum(self._grow_need(tables[s.index], s.num_computed + 1) for s in seqs)

    def acts_need(self, seqs: Iterable[Seq]) -> tuple[int, int]:
        """``crossing_need``, and that less the blocks the acts free first (their skipped ones)."""
        need = net = 0
        for s in seqs:
            tables = self.tables[s.index]
            n = self._grow_need(tables, s.num_computed + 1)
            need += n
            net += n - self._skippable_in(s, tables)
        return need, net

    def act(self, seq: Seq) -> int:
        """A decoder computing one more token acts, its blocks known to fit: ``allocate`` to
        ``num_computed + 1`` less the caching, each step taken where it has work. Returns its
        ``reach`` from there."""
        idx = seq.index
        c = seq.num_computed
        tokens = c + 1
        assert tokens <= self.max_model_len, "a decoder past the model's length"
        tables = self.tables[idx]
        if c >= self.skip_from[idx]:
            self._skip_in(seq, tables)
        if tokens > self.covered[idx]:
            self._grow(seq, tables, tokens)
        self._held(seq)  # its decoded blocks are cached when it is freed (module docstring)
        self._draw(seq, tokens)
        return self._reach[idx]

    def _grow(self, seq: Seq, tables: list[list[int]], tokens: int) -> None:
        """``_extend`` for a decoder: a table short of ``tokens`` is one block short, and the
        blocks are known to fit. The blocks come off the free queue group by group, as there."""
        idx = seq.index
        bs = self.bs
        want = -(-tokens // bs)
        grow = [gid for gid, t in enumerate(tables) if len(t) < want]
        assert len(grow) <= self._free, "a decoder acted on blocks that were not free"
        held = self.held
        sums, overhead, tracked, where, holders = self.sums, held.overhead, held.tracked, held.where, held.holders
        for gid, block in zip(grow, self._pop(len(grow))):  # ``Held.hold_new``, a block at a time
            t = tables[gid]
            where[block] = (gid, len(t))
            if tracked[gid]:
                holders[block] = [idx]
            t.append(block)
            sums[3 * gid + 2] += 1
            sums[-1] += overhead[gid]
        self.held_of[idx] += len(grow)
        self.covered[idx] = want * bs
        if want * bs > seq.final_len or held.over[idx]:
            held.table_lengths(idx, [len(t) for t in tables], seq.final_len)

    def admission_blocks(self, seq: Seq, num_tokens: int, must_fit: int) -> int:
        """The free blocks ``allocate`` needs to admit ``seq`` (holding none) to ``num_tokens``
        with the hit ``prefix_hit`` remembered (``_admit``'s test)."""
        hits, hit = self._hit_of(seq)
        self.watch = {b for h in hits for b in h if b != NULL_BLOCK}
        return self._need_to_admit(num_tokens, must_fit, hits, seq.num_computed + hit)

    def measure_use(self) -> tuple[int, int]:
        return measure_sums(self)

    # -- allocation ------------------------------------------------------------------------
    def allocate(self, seq: Seq, num_tokens: int, must_fit: int = 0, cache_blocks: bool = True) -> bool:
        assert cache_blocks, "a CPU tier runs on GroupedPrefixPolicy (harness.sim.offload)"
        ok = super().allocate(seq, num_tokens, must_fit)
        # Refused, a running request is freed or allocated again in the same step (preemption):
        # its line is drawn then, and the designations settled with it.
        if ok:
            self._draw(seq, num_tokens)
        return ok

    def free(self, seq: Seq) -> None:
        idx = seq.index
        if idx in self.tables:
            self._cache(seq, min(seq.num_computed, seq.num_tokens))  # what the reference cached by now
        super().free(seq)
        line = self._lines.pop(idx, None)
        if line is not None:
            sums = self.sums
            for k in range(len(self.groups)):
                sums[3 * k] -= line[2 * k]
                sums[3 * k + 1] -= line[2 * k + 1]
        for d in (self._surplus, self._off, self._own, self._reach, self._through):
            d.pop(idx, None)
        self._stale.discard(idx)
        if self.held.dirty or self.held.left:
            self._settle()

    def resync(self) -> None:
        """Every request's lines drawn again from its computed tokens (after a step that did not
        advance every request by one token), the designations taken again."""
        at = self.steps + 1
        for idx, seq in self.live.items():
            self._off[idx] = seq.num_computed - at
        self.held.dirty.update(self.held.shared)
        self._stale.update(self.live)
        for seq in self.live.values():
            self._draw(seq, seq.num_computed)

    # -- the lines ---------------------------------------------------------------------------
    def _draw(self, seq: Seq, tokens: int) -> None:
        """``seq``'s line from ``tokens`` computed tokens at the next step measured, and its
        reach; the designations its move (or the tables' changes) touched settled first. Its
        own reads' line and its surplus line are each drawn again only where they no longer
        hold: its offset moved, or ``tokens`` passed the line's bend."""
        idx = seq.index
        at = self.steps + 1
        off = tokens - at
        moved = self._off.get(idx) != off
        if moved:  # its lines, and the designations of its blocks, move
            self._off[idx] = off
            self._stale.add(idx)
            mine = self.held.mine.get(idx)
            if mine:
                self.held.dirty.update(mine)
        if self.held.dirty or self.held.left:
            self._settle(idx)
        through = self._through.get(idx, -1)
        if not moved and tokens <= through and idx not in self._stale:
            self._reach_within(idx, tokens, through)
            return  # neither line moved
        own = self._own.get(idx)
        surplus = self._surplus.get(idx)
        if moved or own is None or tokens > own[1]:
            own = self._draw_own(idx, tokens, at)
        if surplus is None or idx in self._stale or tokens > surplus[1]:
            surplus = self._draw_surplus(idx, tokens, at)
        self._put_line(idx, own[0], surplus[0])
        self._reach_of(idx, tokens, own[1], surplus[1])

    def _reach_of(self, idx: int, tokens: int, own_bend: int, surplus_bend: int) -> int:
        """``idx``'s reach: the last position before a block act (a block needed or skipped) or a
        bend of one of its lines, at least ``tokens``."""
        through = own_bend if own_bend < surplus_bend else surplus_bend
        self._through[idx] = through
        return self._reach_within(idx, tokens, through)

    def _reach_within(self, idx: int, tokens: int, through: int) -> int:
        """``idx``'s reach where its lines hold through ``through``: only its block acts move it."""
        reach = self.covered[idx]
        skip = self.skip_from[idx]
        if skip < reach:
            reach = skip
        if through < reach:
            reach = through
        if reach < tokens:
            reach = tokens
        self._reach[idx] = reach
        return reach

    def _draw_own(self, idx: int, tokens: int, at: int) -> tuple[list[int], int]:
        """Per group the line of ``idx``'s own reads at ``tokens`` computed tokens (every token for
        a full or MLA layer, the last ``window − 1`` for a sliding one), and its bend."""
        bend = _NEVER
        own: list[int] = []
        for layers in self.layers:
            value = slope = 0
            for span, nbytes in layers:
                if tokens < span:
                    value += tokens * nbytes
                    slope += nbytes
                    if span < bend:
                        bend = span
                else:
                    value += span * nbytes
            own += (value - slope * at, slope)
        out = (own, bend)
        self._own[idx] = out
        return out

    def _put_line(self, idx: int, own: list[int], surplus: list[int]) -> None:
        """``idx``'s line, ``own`` less ``surplus``, into the totals in place of its last."""
        line = [o - s for o, s in zip(own, surplus)]
        old = self._lines.get(idx)
        sums = self.sums
        if old is None:
            for k in range(len(line) // 2):
                sums[3 * k] += line[2 * k]
                sums[3 * k + 1] += line[2 * k + 1]
        else:
            for k in range(len(line) // 2):
                sums[3 * k] += line[2 * k] - old[2 * k]
                sums[3 * k + 1] += line[2 * k + 1] - old[2 * k + 1]
        self._lines[idx] = line

    def _draw_surplus(self, idx: int, tokens: int, at: int) -> tuple[list[int], int]:
        """Per group the line of ``idx``'s reads of the shared blocks it is not designated for,
        at ``tokens`` computed tokens; and the last position through which it holds."""
        self._stale.discard(idx)
        lines = [0] * (2 * len(self.groups))
        bend = _NEVER
        held = self.held
        mine = held.mine.get(idx)
        if mine:
            bs = self.bs
            designated, where, read_past = held.designated, held.where, self.read_past
            for block in mine:
                if designated[block] == idx:
                    continue
                gid, pos = where[block]
                start = pos * bs
                if start + read_past[gid] <= tokens:
                    continue  # read by none of its sliding layers, from here on
                value, slope, kink = _reads(self.sliding[gid], start, start + bs, tokens)
                lines[2 * gid] += value - slope * at
                lines[2 * gid + 1] += slope
                if kink < bend:
                    bend = kink
        out = (lines, bend)
        self._surplus[idx] = out
        return out

    def _settle(self, current: int = -1) -> None:
        """The designations of the blocks whose holders or holders' offsets moved; every holder
        but ``current`` (whose line its caller draws) whose surplus that changed gets its line
        drawn again, and filed again where it now bends sooner."""
        held = self.held
        moved: set[int] = set()
        off = self._off
        for block in held.dirty:
            holders = held.holders.get(block)
            old = held.designated.get(block, -1)
            if holders is None or len(holders) < 2:
                if old >= 0:
                    del held.designated[block]
                    held.shared.discard(block)
                    if holders:
                        (last,) = holders
                        held.mine[last].discard(block)
                        if last != old:
                            moved.add(last)
                continue
            best = old if old in holders else -1
            for h in holders:
                mine = held.mine.setdefault(h, set())
                if block not in mine:
                    mine.add(block)
                    moved.add(h)
                if best < 0 or off.get(h, _NEVER) < off.get(best, _NEVER):
                    best = h
            if best != old:
                held.designated[block] = best
                held.shared.add(block)
                moved.add(best)
                if old in holders:
                    moved.add(old)
        held.dirty.clear()
        for h in held.left:
            if h in self._lines:
                moved.add(h)
        held.left.clear()
        if not moved:
            return
        self._stale.update(moved)
        at = self.steps + 1
        for h in moved:
            if h == current or h not in self._lines:
                continue
            tokens = off[h] + at
            own = self._own[h]
            surplus = self._draw_surplus(h, tokens, at)
            self._put_line(h, own[0], surplus[0])
            old_reach = self._reach[h]
            if self._reach_of(h, tokens, own[1], surplus[1]) < old_reach and self.refile is not None:
                self.refile(self.live[h])


class Held:
    """``SharedTotals``'s calls for ``CountingGroupedPrefixPolicy``: per group the real blocks held
    and the full-attention surplus (every holder past a shared block's end reads all of it: each
    holder but one adds a block's full-layer bytes), in the policy's ``sums``; the bytes past each
    request's final length; and, for groups with sliding layers, which requests hold each block
    (the designations' input)."""

    def __init__(self, policy: CountingGroupedPrefixPolicy) -> None:
        self.policy = policy
        self.over: dict[int, int] = {}
        self.where: dict[int, tuple[int, int]] = {}  # a held block -> (its group, its position)
        self.holders: dict[int, list[int]] = {}  # … of a group with sliding layers -> its holders
        self.mine: dict[int, set[int]] = {}  # request -> the shared blocks it holds (groups with sliding layers)
        self.designated: dict[int, int] = {}  # shared block -> the holder reading most of it
        self.shared: set[int] = set()  # blocks with a designated holder
        self.dirty: set[int] = set()  # blocks whose holders changed
        self.left: list[int] = []  # requests that let go of a shared block
        self.overhead = [g.block_overhead for g in policy.use.groups]
        self.tracked = [bool(layers) for layers in policy.sliding]  # per group: holders kept

    def _blocks(self, gid: int, delta: int) -> None:
        sums = self.policy.sums
        sums[-1] += delta * self.overhead[gid]
        sums[3 * gid + 2] += delta

    def add(self, idx: int) -> None:
        self.over[idx] = 0

    def remove(self, idx: int) -> None:
        self.policy.sums[-1] -= self.over.pop(idx)
        self.mine.pop(idx, None)

    def table_lengths(self, idx: int, lengths: list[int], final_len: int) -> None:
        policy = self.policy
        if max(lengths) * policy.bs <= final_len and not self.over[idx]:
            return  # no table past the final length, as before
        over = bytes_past(policy.use.groups, policy.bs, lengths, final_len)
        policy.sums[-1] += over - self.over[idx]
        self.over[idx] = over

    def hold_new(self, idx: int, gid: int, blocks: list[int], start: int) -> None:
        self._blocks(gid, len(blocks))
        where = self.where
        if self.tracked[gid]:
            holders = self.holders
            for pos, block in enumerate(blocks, start):
                where[block] = (gid, pos)
                holders[block] = [idx]
        else:
            for pos, block in enumerate(blocks, start):
                where[block] = (gid, pos)

    def hold(self, idx: int, gid: int, block: int, pos: int) -> None:
        tracked = self.tracked[gid]
        if self.policy.ref[block] == 0:
            self._blocks(gid, 1)
            self.where[block] = (gid, pos)
            if tracked:
                self.holders[block] = [idx]
            return
        self.policy.sums[3 * gid] -= self.policy.full_block[gid]
        if tracked:
            self.holders[block].append(idx)
            self.dirty.add(block)

    def drop(self, idx: int, blocks: list[int]) -> None:
        ref, where, tracked, holders = self.policy.ref, self.where, self.tracked, self.holders
        sums, full_block, overhead = self.policy.sums, self.policy.full_block, self.overhead
        for block in blocks:
            if block == NULL_BLOCK:
                continue
            if ref[block] == 1:  # its last holder
                gid = where.pop(block)[0]
                sums[3 * gid + 2] -= 1
                sums[-1] -= overhead[gid]
                if tracked[gid]:
                    del holders[block]
                    if block in self.designated:
                        self.dirty.add(block)
                continue
            gid = where[block][0]  # another table holds it: its full layers' surplus goes
            sums[3 * gid] += full_block[gid]
            if not tracked[gid]:
                continue
            holders[block].remove(idx)
            self.dirty.add(block)
            mine = self.mine.get(idx)
            if mine is not None and block in mine:
                mine.discard(block)
                self.left.append(idx)
