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
from .grouped import GroupedPagedPolicy

# How a group frees blocks its layers no longer read (``KVGroup.skipped_tokens``).
_KEEP, _WINDOW, _CHUNK, _STATE = range(4)


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


class CountingGroupedPolicy(GroupedPagedPolicy):
    """``GroupedPagedPolicy`` with running totals for its measures and each request's next act."""

    def __init__(self, use: KVUse, max_model_len: int) -> None:
        super().__init__(use, max_model_len)
        n = len(self.groups)
        self.steps = 0  # steps measured so far
        self._const = [0] * n  # per group: Σ of the requests' used-bytes lines at step 0
        self._slope = [0] * n  # … and of their slopes (bytes per step)
        self._real = [0] * n  # per group: real blocks held
        self._internal = 0  # bytes of internal fragmentation over the requests holding blocks
        # Per request (index): its lines' (consts, slopes), its real blocks and internal bytes.
        self._lines: dict[int, tuple[list[int], list[int], list[int], int]] = {}
        self._reach: dict[int, int] = {}  # per request: the last position before its next act
        self._params = [GroupLine.of(g, gu) for g, gu in zip(self.groups, use.groups)]
        # Per group: whether it is the group before's twin (the same arithmetic: the same table)
        self._same = [i > 0 and p == self._params[i - 1] for i, p in enumerate(self._params)]

    def free_blocks(self) -> int:
        return self._free

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
        for seq in seqs:
            c = seq.num_computed
            computed = c if c < limit else limit
            for p, (t0, t1) in zip(self._params, seq.group_tables):
                new = -(-(c + 1) // p.block_size) - t0
                if new > 0:
                    need += new
                    net += new
                skip = _skipped_blocks(p, computed, t0) - t1
                if skip > 0:
                    net -= skip
        return need, net

    def act(self, seq: Seq) -> None:
        """A decoder computing one more token acts, its blocks known to fit: ``allocate`` to
        ``num_computed + 1`` (the skipped blocks freed, then the new ones taken), in one pass."""
        c = seq.num_computed
        computed = c if c < self.max_model_len else self.max_model_len
        free = self._free
        held = 0
        for p, t in zip(self._params, seq.group_tables):
            t0, t1 = t
            skip = _skipped_blocks(p, computed, t0)
            if skip > t1:
                free += skip - t1
                t[1] = t1 = skip
            need = -(-(c + 1) // p.block_size)
            if need > t0:
                free -= need - t0
                t[0] = t0 = need
            held += t0 - t1
        assert free >= 0, "a decoder acted on blocks that were not free"
        self._free = free
        seq.allocated = self.use.positions(held)
        if seq.allocated > seq.peak_allocated:
            seq.peak_allocated = seq.allocated
        self._line(seq, c + 1)

    def admission_blocks(self, seq: Seq, num_tokens: int, must_fit: int) -> int:
        """The free blocks ``allocate`` needs to admit ``seq`` (holding none) to ``num_tokens``."""
        new = self._new_blocks(seq, num_tokens)
        return max(new, self._admission_need(must_fit)) if must_fit else new

    # -- the running totals -------------------------------------------------------------
    def _unline(self, index: int) -> None:
        line = self._lines.pop(index, None)
        if line is None:
            return
        consts, slopes, reals, internal = line
        for i in range(len(consts)):
            self._const[i] -= consts[i]
            self._slope[i] -= slopes[i]
            self._real[i] -= reals[i]
        self._internal -= internal

    def _line(self, seq: Seq, tokens: int) -> None:
        """``seq``'s lines from ``tokens`` computed tokens at the next step measured (a group's
        used bytes: ``GroupUse.used_bytes``, growing by ``slope`` a token until ``until``); its
        next act: a block needed, a block skipped, or a line's end."""
        index = seq.index
        at = self.steps + 1
        consts, slopes, reals = [], [], []
        internal = 0
        final_len = seq.final_len
        act = tokens + 1 + self.max_model_len  # past any act
        sum_const, sum_slope, sum_real = self._const, self._slope, self._real
        same = self._same
        # The request's old lines come off the totals in the same pass (zeros: it had none).
        old = self._lines.get(index)
        if old is None:
            zeros = [0] * len(same)
            old_c = old_s = old_r = zeros
            old_internal = 0
        else:
            old_c, old_s, old_r, old_internal = old
        prev: list[int] = []
        c = slope = real = waste = 0
        for i, (p, t) in enumerate(zip(self._params, seq.group_tables)):
            if not (same[i] and t == prev):  # else: a group like the one before, its table too
                prev = t
                c, slope, real, waste, nxt = self._group_line(p, t, tokens, at, final_len)
                if nxt < act:
                    act = nxt
            consts.append(c)
            slopes.append(slope)
            reals.append(real)
            sum_const[i] += c - old_c[i]
            sum_slope[i] += slope - old_s[i]
            sum_real[i] += real - old_r[i]
            internal += waste
        self._internal += internal - old_internal
        self._lines[index] = (consts, slopes, reals, internal)
        self._reach[index] = max(act, tokens + 1) - 1

    @staticmethod
    def _group_line(p: GroupLine, t: list[int], tokens: int, at: int, final_len: int) -> tuple[int, int, int, int, int]:
        """One group's share of ``_line``: its line's constant and slope, its real blocks, its
        internal bytes, and its next act."""
        act = 1 << 62  # past any act
        if tokens > 0:
            used = p.linear * tokens + p.state
            slope = p.linear
            for w, b in p.sliding:
                if tokens >= w - 1:
                    used += (w - 1) * b  # the window is full: its reads stay put
                else:
                    used += tokens * b
                    slope += b
                    act = min(act, w)
            for w, b in p.chunked:
                used += (tokens - tokens // w * w) * b
                slope += b
                act = min(act, (tokens // w + 1) * w)  # the chunk's end: the reads restart at 0
        else:
            used = slope = 0
        t0, t1 = t
        real = t0 - t1
        waste = real * p.block_overhead
        bs = p.block_size
        over = t0 * bs - final_len
        if over > 0 and p.token_bytes:
            waste += over * p.token_bytes
        nxt = t0 * bs + 1
        skips = p.skips
        if skips == _WINDOW:
            nxt = min(nxt, (t1 + 1) * bs + p.window)
        elif skips == _CHUNK:
            nxt = min(nxt, cdiv((t1 + 1) * bs, p.window) * p.window + 1)
        elif skips == _STATE:
            nxt = min(nxt, (t1 + 1) * bs + 2)
        return used - slope * at, slope, real, waste, min(act, nxt)

    def resync(self) -> None:
        """Redraw every request's lines from its computed tokens (after a step that did not
        advance every request by one token)."""
        for seq in self.live.values():
            self._line(seq, seq.num_computed)

    def totals(self) -> tuple[list[int], list[int], list[int], int]:
        """Per group the real blocks held and the used-bytes line's constant and slope (the
        bytes used at step ``at``: ``const + slope × at``); the internal fragmentation in bytes."""
        return list(self._real), list(self._const), list(self._slope), self._internal

    # -- what the scheduler reads ---------------------------------------------------------
    def measure_use(self) -> tuple[int, int]:
        self.steps = at = self.steps + 1
        per = [(r, c + s * at) for r, c, s in zip(self._real, self._const, self._slope)]
        self.last_groups = per
        unit = self.use.unit
        return sum(u for _, u in per) // unit, self._internal // unit

    # -- allocation ---------------------------------------------------------------------
    def allocate(self, seq: Seq, num_tokens: int, must_fit: int = 0) -> bool:
        ok = super().allocate(seq, num_tokens, must_fit)
        if ok:
            self._line(seq, num_tokens)
        elif seq.group_tables:  # refused after freeing skipped blocks: its tokens stay, its blocks moved
            self._line(seq, seq.num_computed)
        return ok

    def free(self, seq: Seq) -> None:
        self._unline(seq.index)
        self._reach.pop(seq.index, None)
        super().free(seq)
