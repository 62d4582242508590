"""``measure_shared``'s three results kept as running totals over a prefix-caching policy's tables.

``harness.spec.kv_shared_use.measure_shared`` walks every block of every request: the plain
definition, and what the vLLM runners call. ``GroupedPrefixPolicy`` measures every step, so it
keeps the same numbers up to date as its tables change instead (``SharedTotals``), in pieces:

- per group the distinct real blocks: counted as block ids gain their first holder and lose
  their last;
- bytes beyond a request's final length: a request's share changes only when a table grows;
- every request's read bytes (``GroupUse.used_bytes``): full and MLA layers read every computed
  token, sliding layers ``min(computed, window − 1)``, so per group a rate times the sum of the
  computed tokens plus rates times the sums of ``min(computed, window − 1)``: sums taken each
  step in one pass over the live requests, nothing kept per request;
- a shared block's surplus (its holders' reads less the largest): recomputed only when its
  holders change or a holder whose reads of it still move computes more. A holder whose
  computed tokens pass the block's end (full layers: all of it read) and, for sliding layers,
  the end plus ``window − 1`` (none read) reads a constant amount of it from then on; between
  the block's end and its start plus ``window − 1`` every layer reads all of it, so a holder
  there wakes the block only when a window starts to leave it (``_wake``).

``tests/sim/test_grouped_prefix_totals.py`` pins it to ``measure_shared`` step by step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import repeat
from operator import attrgetter

from ...spec.kv_shared_use import NULL_BLOCK
from ...spec.kv_use import GroupUse, KVUse
from ...spec.layer_kinds import FULL, MLA, SLIDING
from ..sequence import Seq

_COMPUTED = attrgetter("num_computed")
_ALL = 1 << 62  # a full or MLA layer's span: every computed token


def bytes_past(groups: Sequence[GroupUse], block_size: int, lengths: list[int], final_len: int) -> int:
    """The bytes of tables of ``lengths`` blocks (one a group) past a request's ``final_len``."""
    over = 0
    for g, n in zip(groups, lengths):
        tokens = n * block_size - final_len
        if tokens > 0 and g.token_bytes:
            over += tokens * g.token_bytes
    return over


class SharedTotals:
    """``measure_shared`` over the tables told to it by ``hold``/``drop``/``table_len``."""

    def __init__(self, use: KVUse, block_size: int) -> None:
        self.groups = use.groups
        self.bs = block_size
        caps = sorted({w - 1 for g in use.groups for kind, w, _ in g.reads if kind == SLIDING})
        self.caps = caps  # distinct sliding spans (window − 1)
        self.rates: list[tuple[int, list[int]]] = []  # per group: bytes per computed token, per capped token
        # Per group: its sliding layers' shortest and longest span (window − 1; 0: none).
        self.spans: list[tuple[int, int]] = []
        # Per group: (span, bytes per token) of its layers, for ``_reads``.
        self.layers = [
            [(w - 1 if kind == SLIDING else _ALL, nbytes) for kind, w, nbytes in g.reads] for g in use.groups
        ]
        for g in use.groups:
            per_cap = [0] * len(caps)
            full = 0
            spans = [0]
            for kind, w, nbytes in g.reads:
                if kind == SLIDING:
                    per_cap[caps.index(w - 1)] += nbytes
                    spans.append(w - 1)
                else:
                    assert kind in (FULL, MLA), "RunSpec refuses other layers with prefix caching"
                    full += nbytes
            self.rates.append((full, per_cap))
            self.spans.append((min(spans[1:], default=0), max(spans)))
        self.held = [0] * len(use.groups)  # distinct real blocks per group
        self.surplus = [0] * len(use.groups)  # shared blocks' surplus bytes per group
        self.over_bytes = 0  # bytes beyond the requests' final lengths
        self.over: dict[int, int] = {}  # … per request
        self.at: dict[int, dict[int, int]] = {}  # block -> {holder: position}
        self.group_of: dict[int, int] = {}  # held block -> its group
        self.extra: dict[int, int] = {}  # shared block -> its surplus in ``surplus``
        # request -> the shared blocks whose reads it may still move, each with the computed
        # tokens from which it may (requests with none left out)
        self.moving: dict[int, dict[int, int]] = {}
        self.dirty: set[int] = set()  # shared blocks whose holders changed

    # -- requests --------------------------------------------------------------------------
    def add(self, idx: int) -> None:
        """A request's tables start (empty)."""
        self.over[idx] = 0

    def remove(self, idx: int) -> None:
        """A request's tables gone (every block dropped first)."""
        self.over_bytes -= self.over.pop(idx)

    def table_lengths(self, idx: int, lengths: list[int], final_len: int) -> None:
        """A request's table lengths now: its bytes beyond ``final_len``."""
        over = bytes_past(self.groups, self.bs, lengths, final_len)
        self.over_bytes += over - self.over[idx]
        self.over[idx] = over

    # -- blocks ------------------------------------------------------------------------------
    def hold_new(self, idx: int, gid: int, blocks: list[int], start: int) -> None:
        """Request ``idx`` holds fresh ``blocks`` (no other holder) from ``start`` of group ``gid``."""
        at = self.at
        group_of = self.group_of
        for pos, block in enumerate(blocks, start):
            at[block] = {idx: pos}
            group_of[block] = gid
        self.held[gid] += len(blocks)

    def hold(self, idx: int, gid: int, block: int, pos: int) -> None:
        """Request ``idx`` holds ``block`` at ``pos`` of group ``gid``'s table."""
        holders = self.at.get(block)
        if holders is None:
            self.at[block] = {idx: pos}
            self.group_of[block] = gid
            self.held[gid] += 1
            return
        holders[idx] = pos
        if len(holders) == 2:
            self.extra[block] = 0
        self.dirty.add(block)

    def drop(self, idx: int, blocks: list[int]) -> None:
        """Request ``idx`` no longer holds ``blocks`` (null blocks skipped)."""
        at = self.at
        for block in blocks:
            if block == NULL_BLOCK:
                continue
            holders = at[block]
            del holders[idx]
            if holders:
                self._unshare(idx, block, holders)
            else:
                del at[block]
                self.held[self.group_of.pop(block)] -= 1

    def _unshare(self, idx: int, block: int, holders: dict[int, int]) -> None:
        """``block`` lost holder ``idx`` and keeps others: its surplus is stale, or gone with one left."""
        self._settle(idx, block)
        if len(holders) == 1:
            (last,) = holders
            self._settle(last, block)
            self.surplus[self.group_of[block]] -= self.extra.pop(block)
            self.dirty.discard(block)
        else:
            self.dirty.add(block)

    # -- the measure -------------------------------------------------------------------------
    def measure(self, live: Mapping[int, Seq]) -> tuple[int, int, list[tuple[int, int]]]:
        """``measure_shared``'s (used bytes, internal bytes, per group (blocks, used bytes)) over
        the ``live`` requests (by index, each added here) at their computed tokens now. A
        request's computed tokens only grow while it holds tables (a preemption frees them)."""
        computed = list(map(_COMPUTED, live.values()))
        sum_computed = sum(computed)
        sum_capped = [sum(map(min, computed, repeat(cap))) for cap in self.caps]
        dirty = self.dirty
        for idx, blocks in self.moving.items():
            c = live[idx].num_computed
            for block, wake in blocks.items():
                if c >= wake:
                    dirty.add(block)
        if dirty:
            for block in dirty:
                self._resurplus(block, live)
            dirty.clear()
        used = 0
        internal = self.over_bytes
        groups = []
        for g, (full, per_cap), held, surplus in zip(self.groups, self.rates, self.held, self.surplus):
            u = full * sum_computed - surplus
            for rate, s in zip(per_cap, sum_capped):
                u += rate * s
            used += u
            internal += held * g.block_overhead
            groups.append((held, u))
        return used, internal, groups

    def _resurplus(self, block: int, live: Mapping[int, Seq]) -> None:
        """A shared block's surplus from its holders' reads now; which holders still move it."""
        gid = self.group_of[block]
        bs = self.bs
        reads = []
        for idx, pos in self.at[block].items():
            c = live[idx].num_computed
            start = pos * bs
            reads.append(self._reads(gid, c, start))
            wake = self._wake(gid, c, start)
            if wake < 0:
                self._settle(idx, block)
            else:
                self.moving.setdefault(idx, {})[block] = wake
        extra = sum(reads) - max(reads)
        self.surplus[gid] += extra - self.extra[block]
        self.extra[block] = extra

    def _reads(self, gid: int, c: int, start: int) -> int:
        """Bytes group ``gid``'s layers read of the block at ``start`` at ``c`` computed tokens
        (``kv_shared_use._read_tokens`` per layer kind: a full layer every computed token, a
        sliding one the last ``window − 1``)."""
        end = start + self.bs
        top = c if c < end else end
        total = 0
        for span, nbytes in self.layers[gid]:
            low = c - span
            if low < start:
                low = start
            if top > low:
                total += (top - low) * nbytes
        return total

    def _wake(self, gid: int, c: int, start: int) -> int:
        """From how many computed tokens a holder at ``c`` may read the block at ``start``
        differently: its next token while its reads move with every token (before the block's
        end, or a window leaving it), the first token a window leaves it while every layer
        reads all of it, −1 once its reads are constant (all read, or none)."""
        end = start + self.bs
        short, long = self.spans[gid]
        if c < end:
            return c + 1
        if c <= start + short:
            return start + short + 1
        return c + 1 if c < end + long else -1

    def _settle(self, idx: int, block: int) -> None:
        """Request ``idx`` no longer moves ``block``'s reads (or holds it)."""
        blocks = self.moving.get(idx)
        if blocks is not None:
            blocks.pop(block, None)
            if not blocks:
                del self.moving[idx]
