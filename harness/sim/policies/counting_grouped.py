"""``GroupedPagedPolicy`` for the fast path: the same block tables, with its step measures kept
as running totals and each request's next act named in advance.

The reference measures a step by walking every request holding blocks (``KVUse.measure``).
Here each request's share of a step's measures is a line in the steps to come, valid until its
next *act*: per group its real blocks and its internal fragmentation (they change only when an
``allocate`` grows or skips its table) and its used bytes, ``const + slope × step`` (its computed
tokens grow by one a step while it decodes; a sliding layer's reads stop growing once its
window is full, a chunked layer's drop to nothing at a chunk's end). The policy keeps the sums
of those lines, so a step's measures cost O(groups) however many requests run.

A request acts (``reach``: the last position it can compute before its next act) where any of
its groups needs a block (``cdiv(tokens, block size)`` grows), frees one (``remove_skipped_blocks``:
a sliding window, a chunk or a state moving past a block) or a read's line bends. Between acts
its ``allocate`` changes nothing, so the fast path leaves a decoder implicit until its act
(``harness.sim.decoders``). A line assumes one token a step: a request the step did not advance
(a reference step, whose budget ran short) is put right by ``resync``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from ...spec.kv_layout import KVGroup, cdiv
from ...spec.kv_use import GroupUse, KVUse
from ...spec.layer_kinds import CHUNKED, SLIDING, STATE_KINDS
from ..sequence import Seq
from .group_counts import measure_sums
from .grouped import GroupedPagedPolicy

# How a group frees blocks its layers no longer read (``KVGroup.skipped_tokens``).
_KEEP, _WINDOW, _CHUNK, _STATE = range(4)
_NEVER = 1 << 62  # a position past any request's


@dataclasses.dataclass(frozen=True)
class GroupLine:
    """One group's arithmetic for ``CountingGroupedPolicy._line``, fetched once: its block size,
    how it skips blocks (and its window), what a held block wastes, and its reads by shape —
    bytes per token read for every token (full, MLA), per state, and per sliding window and
    per chunk (``GroupUse.used_bytes``'s terms)."""

    block_size: int
    skips: int
    window: int
    block_overhead: int
    token_bytes: int
    linear: int
    state: int
    sliding: tuple[tuple[int, int], ...]
    chunked: tuple[tuple[int, int], ...]

    @classmethod
    def of(cls, g: KVGroup, gu: GroupUse) -> GroupLine:
        skips = _WINDOW if g.kind == SLIDING else _CHUNK if g.kind == CHUNKED else _STATE if g.is_state else _KEEP
        reads = gu.reads
        return cls(
            g.block_size,
            skips,
            g.window,
            gu.block_overhead,
            gu.token_bytes,
            sum(b for k, _, b in reads if k not in STATE_KINDS and k not in (SLIDING, CHUNKED)),
            sum(b for k, _, b in reads if k in STATE_KINDS),
            tuple((w, b) for k, w, b in reads if k == SLIDING),
            tuple((w, b) for k, w, b in reads if k == CHUNKED),
        )


def _skipped_blocks(p: GroupLine, computed: int, length: int) -> int:
    """The blocks of a table of ``length`` a group frees once ``computed`` tokens are computed
    (``KVGroup.skipped_tokens`` in blocks, as ``remove_skipped_blocks`` counts them)."""
    skips = p.skips
    if skips == _KEEP:
        return 0
    if skips == _WINDOW:
        tokens = computed - p.window + 1
    elif skips == _CHUNK:
        tokens = computed // p.window * p.window
    else:
        tokens = computed - 1
    if tokens <= 0:
        return 0
    blocks = tokens // p.block_size
    return blocks if blocks < length else length


def _block_act(bs: int, skips: int, window: int, t0: int, t1: int) -> int:
    """The position at which a table of ``t0`` blocks, ``t1`` of them skipped, next acts: a block
    needed, or one skipped."""
    nxt = t0 * bs + 1
    if skips == _WINDOW:
        return min(nxt, (t1 + 1) * bs + window)
    if skips == _CHUNK:
        return min(nxt, cdiv((t1 + 1) * bs, window) * window + 1)
    if skips == _STATE:
        return min(nxt, (t1 + 1) * bs + 2)
    return nxt


def _block_terms(p: GroupLine) -> tuple[int, int, int, int, int]:
    """What an act reads of ``p`` where no used-bytes line bends: block size, how it skips, its
    window, what a held block and a token past the sequence's end waste."""
    return p.block_size, p.skips, p.window, p.block_overhead, p.token_bytes


@dataclasses.dataclass(frozen=True)
class TwinGroups:
    """Groups with one ``GroupLine`` (gpt-oss's or Gemma-3's sliding groups, a model's state
    groups): every ``allocate`` and skip treats their tables alike, so their tables, lines and
    acts are one group's, drawn once and counted ``len(members)`` times."""

    line: GroupLine
    members: tuple[int, ...]  # the groups' indices; the first one's table is read

    @property
    def first(self) -> int:
        return self.members[0]


def twin_groups(lines: list[GroupLine]) -> tuple[TwinGroups, ...]:
    """The groups of ``lines`` gathered by equal ``GroupLine``, in order of first appearance."""
    members: dict[GroupLine, list[int]] = {}
    for i, p in enumerate(lines):
        members.setdefault(p, []).append(i)
    return tuple(TwinGroups(p, tuple(m)) for p, m in members.items())


class CountingGroupedPolicy(GroupedPagedPolicy):
    """``GroupedPagedPolicy`` with running totals for its measures and each request's next act.

    The totals are kept per set of twin groups (``TwinGroups``, a *twin set*) as one flat list,
    ``totals()``: per twin set its line's constant, its slope and its real blocks (one member's:
    each member holds as much), then the internal bytes over every group."""

    needs_run_order = False  # counts, no ids: acts in any order
    # Nothing cached: a waiting request's need moves only at the events that end a level.
    admission_epoch = 0
    admission_grown = 0
    admission_slack = 0

    def __init__(self, use: KVUse, max_model_len: int) -> None:
        super().__init__(use, max_model_len)
        self.steps = 0  # steps measured so far
        self.twins = twin_groups([GroupLine.of(g, gu) for g, gu in zip(self.groups, use.groups)])
        # Per twin set: its arithmetic, its first member, its other members, how many.
        self._sets = [(w.line, w.first, w.members[1:], len(w.members)) for w in self.twins]
        # … and its arithmetic for ``_line``, unpacked once.
        self._draw = [(w.first, len(w.members), *dataclasses.astuple(w.line)) for w in self.twins]
        self.twin_of = [0] * len(self.groups)  # per group: its twin set
        for k, w in enumerate(self.twins):
            for i in w.members:
                self.twin_of[i] = k
        # ``totals()`` as a live list, updated in place (never replaced): a stretch's levels copy it.
        self.sums = [0] * (3 * len(self.twins) + 1)
        self._slots = range(len(self.sums))
        # … and what ``act`` reads of it where no used-bytes line bends: its line, its first slot
        # in the totals, its slot in ``_due``, its first member, the others, how many, and of its
        # line the block size, how it skips, its window, what a held block and a token past the
        # sequence's end waste.
        self._acts = [
            (w.line, 3 * k, k + 1, w.first, w.members[1:], len(w.members), *_block_terms(w.line))
            for k, w in enumerate(self.twins)
        ]
        self._lines: dict[int, list[int]] = {}  # per request (index): its share of the totals
        self._reach: dict[int, int] = {}  # per request: the last position before its next act
        # Per request: the first position at which one of its used-bytes lines bends (a window
        # fills, a chunk ends), as drawn, 0 where its lines must be drawn again at the next act;
        # then per twin set the first position at which its table acts (``_block_act``): short of
        # it, ``allocate`` leaves that table as it is.
        self._due: dict[int, list[int]] = {}
        self._bytes_per_block = use.layout.bytes_per_block
        self._unit = use.unit
        self._external = self.budget_positions - use.usable_positions

    def free_blocks(self) -> int:
        return self._free

    def external_frag(self, head_of_line: Seq | None) -> int:
        return 0 if head_of_line is None else self._external  # ``GroupedPagedPolicy``'s, fetched once

    def reach(self, seq: Seq) -> int:
        """The position ``seq`` computes last before its next act (as ``allocated`` for a
        policy of one block size: the step computing past it calls ``allocate`` to act)."""
        return self._reach[seq.index]

    def crossing_need(self, seqs: Iterable[Seq]) -> int:
        """The new blocks the decoders ``seqs`` (their counts brought up to date) ask for to
        compute one more token each; their own frees not subtracted, so an upper bound."""
        return sum(self._new_blocks(s, s.num_computed + 1) for s in seqs)

    def acts_need(self, seqs: Iterable[Seq]) -> tuple[int, int]:
        """``crossing_need`` of the decoders ``seqs``, and what the free count loses when they
        act (``act``): their new blocks less the blocks they skip first."""
        need = net = 0
        limit = self.max_model_len
        sets = self._sets
        for seq in seqs:
            c = seq.num_computed
            computed = c if c < limit else limit
            tables = seq.group_tables
            for p, first, _, m in sets:
                t0, t1 = tables[first]
                new = -(-(c + 1) // p.block_size) - t0
                if new > 0:
                    need += new * m
                    net += new * m
                skip = _skipped_blocks(p, computed, t0) - t1
                if skip > 0:
                    net -= skip * m
        return need, net

    def act(self, seq: Seq) -> int:
        """A decoder computing one more token acts, its blocks known to fit: ``allocate`` to
        ``num_computed + 1`` (the skipped blocks freed, then the new ones taken), in one pass.
        Returns its ``reach`` from there. Short of a bend its used-bytes lines hold (a decoder
        computes one token a step, and each line is drawn for that): only its blocks and
        internal bytes move in the totals; at a bend every line is drawn again (``_line``)."""
        c = seq.num_computed
        tokens = c + 1
        index = seq.index
        limit = self.max_model_len
        computed = c if c < limit else limit
        free = self._free
        tables = seq.group_tables
        due = self._due[index]
        line = None
        held = waste = 0
        act = bend = due[0]
        for p, k, d, first, rest, m, bs, skips, window, overhead, token_bytes in self._acts:
            t = tables[first]
            t0, t1 = t
            nxt = due[d]
            if tokens < nxt:  # this table does not act yet
                held += (t0 - t1) * m
                if nxt < act:
                    act = nxt
                continue
            # ``_skipped_blocks`` and ``_block_act``, the window's inlined: a skip ≤ 0 frees nothing.
            if skips == _KEEP:
                skip = 0
            elif skips == _WINDOW:
                skip = (computed - window + 1) // bs
                if skip > t0:
                    skip = t0
            else:
                skip = _skipped_blocks(p, computed, t0)
            need = -(-tokens // bs)
            if skip > t1 or need > t0:
                if line is None:
                    line = self._lines[index]
                h0 = t0 - t1
                if skip > t1:
                    free += (skip - t1) * m
                    t1 = skip
                if need > t0:
                    free -= (need - t0) * m
                    if token_bytes:  # a token past the sequence's end wastes its bytes
                        over = need * bs - seq.prompt_len - seq.output_len  # past ``final_len``
                        if over > 0:
                            before = over - (need - t0) * bs
                            waste += (over - before if before > 0 else over) * token_bytes * m
                    t0 = need
                t[0], t[1] = t0, t1
                for i in rest:
                    twin = tables[i]
                    twin[0], twin[1] = t0, t1
                h = t0 - t1
                line[k + 2] = h
                if h != h0:
                    self.sums[k + 2] += h - h0
                    if overhead:
                        waste += (h - h0) * overhead * m
            else:
                h = t0 - t1
            held += h * m
            nxt = t0 * bs + 1
            if skips == _WINDOW:
                nxt_skip = (t1 + 1) * bs + window
                if nxt_skip < nxt:
                    nxt = nxt_skip
            elif skips != _KEEP:
                nxt = _block_act(bs, skips, window, t0, t1)
            due[d] = nxt
            if nxt < act:
                act = nxt
        assert free >= 0, "a decoder acted on blocks that were not free"
        self._free = free
        if waste:
            assert line is not None
            self.sums[-1] += waste
            line[-1] += waste
        seq.allocated = allocated = held * self._bytes_per_block // self._unit  # ``KVUse.positions``
        if allocated > seq.peak_allocated:
            seq.peak_allocated = allocated
        if tokens + 1 >= bend:  # at a bend, or one short of it (a window full)
            return self._line(seq, tokens)
        past = tokens + 1 + limit  # past any act
        if past < act:
            act = past
        self._reach[index] = reach = (act if act > tokens + 1 else tokens + 1) - 1
        return reach

    def admission_blocks(self, seq: Seq, num_tokens: int, must_fit: int) -> int:
        """The free blocks ``allocate`` needs to admit ``seq`` (holding none) to ``num_tokens``."""
        new = self._new_blocks(seq, num_tokens)
        return max(new, self._admission_need(must_fit)) if must_fit else new

    # -- the running totals -------------------------------------------------------------
    def _unline(self, index: int) -> None:
        line = self._lines.pop(index, None)
        if line is not None:
            totals = self.sums
            for i in self._slots:
                totals[i] -= line[i]

    def _line(self, seq: Seq, tokens: int) -> int:
        """``seq``'s lines from ``tokens`` computed tokens at the next step measured (a group's
        used bytes: ``GroupUse.used_bytes``, growing by ``slope`` a token until a read's line
        bends); per twin set its line, real blocks and internal bytes; its next act: a block
        needed, a block skipped, or a line's end."""
        index = seq.index
        at = self.steps + 1
        final_len = seq.final_len
        tables = seq.group_tables
        act = tokens + 1 + self.max_model_len  # past any act
        bend = _NEVER  # the first bend of a used-bytes line
        line: list[int] = []
        due = [0]
        internal = 0
        for first, m, bs, skips, window, overhead, token_bytes, linear, state, sliding, chunked in self._draw:
            t0, t1 = tables[first]
            if tokens > 0:
                used = linear * tokens + state
                slope = linear
                for w, b in sliding:
                    if tokens >= w - 1:
                        used += (w - 1) * b  # the window is full: its reads stay put
                    else:
                        used += tokens * b
                        slope += b
                        if w < bend:
                            bend = w
                for w, b in chunked:
                    used += (tokens - tokens // w * w) * b
                    slope += b
                    end = (tokens // w + 1) * w  # the chunk's end: the reads restart at 0
                    if end < bend:
                        bend = end
            else:
                used = slope = 0
            waste = (t0 - t1) * overhead
            over = t0 * bs - final_len
            if over > 0 and token_bytes:
                waste += over * token_bytes
            internal += waste * m
            nxt = _block_act(bs, skips, window, t0, t1)
            due.append(nxt)
            if nxt < act:
                act = nxt
            line += (used - slope * at, slope, t0 - t1)
        line.append(internal)
        totals = self.sums
        old = self._lines.get(index)
        if old is None:
            for i in self._slots:
                totals[i] += line[i]
        else:  # the request's old share comes off the totals in the same pass
            for i in self._slots:
                totals[i] += line[i] - old[i]
        self._lines[index] = line
        due[0] = bend if tokens > 0 else 0  # no tokens, no line: drawn at the next act
        self._due[index] = due
        if bend < act:
            act = bend
        self._reach[index] = reach = (act if act > tokens + 1 else tokens + 1) - 1
        return reach

    def resync(self) -> None:
        """Redraw every request's lines from its computed tokens (after a step that did not
        advance every request by one token)."""
        for seq in self.live.values():
            self._line(seq, seq.num_computed)

    def totals(self) -> tuple[int, ...]:
        """The running totals (class docstring): per twin set the used-bytes line's constant
        and slope (the bytes used at step ``at``: ``const + slope × at``) and the real blocks
        held, one member's; last the internal fragmentation in bytes."""
        return tuple(self.sums)

    # -- what the scheduler reads ---------------------------------------------------------
    def measure_use(self) -> tuple[int, int]:
        return measure_sums(self)

    # -- allocation ---------------------------------------------------------------------
    def allocate(self, seq: Seq, num_tokens: int, must_fit: int = 0) -> bool:
        """``GroupedPagedPolicy.allocate`` a twin set at a time (their tables alike), the request's
        lines drawn again: from ``num_tokens``, or, refused after freeing its skipped blocks, from
        its computed tokens."""
        tables = seq.group_tables
        free = self._free
        sets = self._sets
        new = 0
        if not tables:
            if must_fit and self._admission_need(must_fit) > free:
                return False
            for p, _, _, m in sets:
                new += -(-num_tokens // p.block_size) * m
            if new > free:
                return False
            seq.group_tables = tables = [[0, 0] for _ in self.block_sizes]
            self.live[seq.index] = seq
        else:
            c = seq.num_computed
            computed = c if c < self.max_model_len else self.max_model_len
            for p, first, rest, m in sets:  # ``remove_skipped_blocks``, whatever follows
                t = tables[first]
                if p.skips != _KEEP:
                    skip = _skipped_blocks(p, computed, t[0])
                    if skip > t[1]:
                        free += (skip - t[1]) * m
                        t[1] = skip
                        for i in rest:
                            tables[i][1] = skip
                need = -(-num_tokens // p.block_size) - t[0]
                if need > 0:
                    new += need * m
            if new > free:
                self._free = free
                self._line(seq, c)
                return False
        self._free = free - new
        held = 0
        for p, first, rest, m in sets:
            t = tables[first]
            need = -(-num_tokens // p.block_size)
            if need > t[0]:
                t[0] = need
                for i in rest:
                    tables[i][0] = need
            held += (t[0] - t[1]) * m
        seq.allocated = allocated = held * self._bytes_per_block // self._unit  # ``KVUse.positions``
        if allocated > seq.peak_allocated:
            seq.peak_allocated = allocated
        self._line(seq, num_tokens)
        return True

    def free(self, seq: Seq) -> None:
        self._unline(seq.index)
        self._reach.pop(seq.index, None)
        self._due.pop(seq.index, None)
        super().free(seq)
