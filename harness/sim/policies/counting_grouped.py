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

from collections.abc import Iterable

from ...spec.kv_layout import cdiv
from ...spec.kv_use import GroupUse, KVUse
from ...spec.layer_kinds import CHUNKED, SLIDING, STATE_KINDS
from ..sequence import Seq
from .grouped import GroupedPagedPolicy


def read_line(g: GroupUse, tokens: int) -> tuple[int, int, int]:
    """A group's used bytes at ``tokens`` computed tokens as a line in the tokens to come:
    (bytes now, bytes per further token, the last token count the line holds for, or −1: always)."""
    if tokens <= 0:
        return 0, 0, 0
    slope = 0
    until = -1
    for kind, window, nbytes in g.reads:
        if kind in STATE_KINDS:
            continue
        if kind == SLIDING:
            if tokens >= window - 1:
                continue  # the window is full: its reads stay put
            last = window - 1
        elif kind == CHUNKED:
            last = (tokens // window + 1) * window - 1  # the chunk's end: the reads restart at 0
        else:
            last = -1
        slope += nbytes
        if last >= 0 and (until < 0 or last < until):
            until = last
    return g.used_bytes(tokens), slope, until


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

    def crossing_net(self, seqs: Iterable[Seq]) -> int:
        """What the free count loses when the decoders ``seqs`` compute one more token each:
        their new blocks less the blocks they skip first (``allocate``'s order)."""
        return sum(self._new_blocks(s, s.num_computed + 1) - self._skippable(s) for s in seqs)

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
        """``seq``'s lines from ``tokens`` computed tokens at the next step measured; its next act."""
        self._unline(seq.index)
        at = self.steps + 1
        consts, slopes, reals = [], [], []
        internal = 0
        final_len = seq.final_len
        act = tokens + 1 + self.max_model_len  # past any act
        for i, (g, gu, t) in enumerate(zip(self.groups, self.use.groups, seq.group_tables)):
            used, slope, until = read_line(gu, tokens)
            consts.append(used - slope * at)
            slopes.append(slope)
            self._const[i] += used - slope * at
            self._slope[i] += slope
            real = t[0] - t[1]
            reals.append(real)
            self._real[i] += real
            internal += real * gu.block_overhead
            over = t[0] * g.block_size - final_len
            if over > 0 and gu.token_bytes:
                internal += over * gu.token_bytes
            # The next act: a block needed, a block skipped, or the line's end.
            bs = g.block_size
            nxt = t[0] * bs + 1
            if g.kind == SLIDING:
                nxt = min(nxt, (t[1] + 1) * bs + g.window)
            elif g.kind == CHUNKED:
                nxt = min(nxt, cdiv((t[1] + 1) * bs, g.window) * g.window + 1)
            elif g.is_state:
                nxt = min(nxt, (t[1] + 1) * bs + 2)
            if until >= 0:
                nxt = min(nxt, until + 1)
            act = min(act, nxt)
        self._internal += internal
        self._lines[seq.index] = (consts, slopes, reals, internal)
        self._reach[seq.index] = max(act, tokens + 1) - 1

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
