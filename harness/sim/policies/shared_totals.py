"""``measure_shared``'s three results kept as running totals over a prefix-caching policy's tables.

``harness.spec.kv_shared_use.measure_shared`` walks every block of every request: the plain
definition, and what the vLLM runners call. ``GroupedPrefixPolicy`` measures every step, so it
keeps the same numbers up to date as its tables change instead (``SharedTotals``), in pieces:

- per group the distinct real blocks: counted as block ids gain their first holder and lose
  their last;
- bytes beyond a request's final length: a request's share changes only when a table grows;
- every request's read bytes (``GroupUse.used_bytes``): full and MLA layers read every computed
  token, sliding layers ``min(computed, window − 1)``, so per group a rate times the sum of the
  computed tokens plus rates times the sums of ``min(computed, window − 1)``, kept per request;
- a shared block's surplus (its holders' reads less the largest): recomputed only when its
  holders change or a holder whose reads of it still move computes more. A holder whose
  computed tokens pass the block's end (full layers: all of it read) and, for sliding layers,
  the end plus ``window − 1`` (none read) reads a constant amount of it from then on; between
  the block's end and its start plus ``window − 1`` every layer reads all of it, so a holder
  there wakes the block only when a window starts to leave it (``_wake``).

``tests/sim/test_grouped_prefix_totals.py`` pins it to ``measure_shared`` step by step.
"""

from __future__ import annotations

from collections.abc import Mapping

from ...spec.kv_shared_use import NULL_BLOCK, read_tokens
from ...spec.kv_use import KVUse
from ...spec.layer_kinds import FULL, MLA, SLIDING
from ..sequence import Seq


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
        self.sum_computed = 0
        self.sum_capped = [0] * len(caps)
        self.seen: dict[int, int] = {}  # request -> its computed tokens in the sums
        self.at: dict[int, dict[int, int]] = {}  # block -> {holder: position}
        self.group_of: dict[int, int] = {}  # held block -> its group
        self.extra: dict[int, int] = {}  # shared block -> its surplus in ``surplus``
        self.shared_of: dict[int, set[int]] = {}  # request -> shared blocks it holds
        # request -> shared blocks whose reads it may still move, each with the computed tokens
        # from which it may (0: any step)
        self.moving: dict[int, dict[int, int]] = {}
        self.dirty: set[int] = set()  # shared blocks whose holders changed

    # -- requests --------------------------------------------------------------------------
    def add(self, idx: int, computed: int) -> None:
        """A request's tables start (empty); ``computed`` tokens enter the sums."""
        self.seen[idx] = computed
        self.over[idx] = 0
        self.shared_of[idx] = set()
        self.moving[idx] = {}
        self._count(computed, 1)

    def remove(self, idx: int) -> None:
        """A request's tables gone (every block dropped first)."""
        self._count(self.seen.pop(idx), -1)
        self.over_bytes -= self.over.pop(idx)
        del self.shared_of[idx], self.moving[idx]

    def _count(self, computed: int, sign: int) -> None:
        self.sum_computed += sign * computed
        for k, cap in enumerate(self.caps):
            self.sum_capped[k] += sign * min(computed, cap)

    def table_lengths(self, idx: int, lengths: list[int], final_len: int) -> None:
        """A request's table lengths now: its bytes beyond ``final_len``."""
        over = 0
        for g, n in zip(self.groups, lengths):
            tokens = n * self.bs - final_len
            if tokens > 0 and g.token_bytes:
                over += tokens * g.token_bytes
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
            for h in holders:
                self.shared_of[h].add(block)
        else:
            self.shared_of[idx].add(block)
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
        self.shared_of[idx].discard(block)
        self.moving[idx].pop(block, None)
        if len(holders) == 1:
            (last,) = holders
            self.shared_of[last].discard(block)
            self.moving[last].pop(block, None)
            self.surplus[self.group_of[block]] -= self.extra.pop(block)
            self.dirty.discard(block)
        else:
            self.dirty.add(block)

    # -- the measure -------------------------------------------------------------------------
    def measure(self, live: Mapping[int, Seq]) -> tuple[int, int, list[tuple[int, int]]]:
        """``measure_shared``'s (used bytes, internal bytes, per group (blocks, used bytes)) over
        the ``live`` requests (by index, each added here) at their computed tokens now."""
        dirty = self.dirty
        seen = self.seen
        for idx, seq in live.items():
            c = seq.num_computed
            old = seen[idx]
            if c != old:
                seen[idx] = c
                self.sum_computed += c - old
                for k, cap in enumerate(self.caps):
                    if old < cap:
                        self.sum_capped[k] += (c if c < cap else cap) - old
                    elif c < cap:
                        self.sum_capped[k] += c - cap
                if c < old:
                    dirty.update(self.shared_of[idx])
                    continue
                for block, wake in self.moving[idx].items():
                    if c >= wake:
                        dirty.add(block)
        if dirty:
            for block in dirty:
                self._resurplus(block)
            dirty.clear()
        used = 0
        internal = self.over_bytes
        groups = []
        for g, (full, per_cap), held, surplus in zip(self.groups, self.rates, self.held, self.surplus):
            u = full * self.sum_computed - surplus
            for rate, s in zip(per_cap, self.sum_capped):
                u += rate * s
            used += u
            internal += held * g.block_overhead
            groups.append((held, u))
        return used, internal, groups

    def _resurplus(self, block: int) -> None:
        """A shared block's surplus from its holders' reads now; which holders still move it."""
        gid = self.group_of[block]
        g = self.groups[gid]
        bs = self.bs
        reads = []
        for idx, pos in self.at[block].items():
            c = self.seen[idx]
            start = pos * bs
            reads.append(sum(read_tokens(k, w, c, start, start + bs) * nb for k, w, nb in g.reads))
            wake = self._wake(gid, c, start)
            if wake < 0:
                self.moving[idx].pop(block, None)
            else:
                self.moving[idx][block] = wake
        extra = sum(reads) - max(reads)
        self.surplus[gid] += extra - self.extra[block]
        self.extra[block] = extra

    def _wake(self, gid: int, c: int, start: int) -> int:
        """From how many computed tokens a holder at ``c`` may read the block at ``start``
        differently: 0 while its reads move with every token (before the block's end, or a
        window leaving it), the first token a window leaves it while every layer reads all of
        it, −1 once its reads are constant (all read, or none)."""
        end = start + self.bs
        short, long = self.spans[gid]
        if c < end:
            return 0
        if c <= start + short:
            return start + short + 1
        return 0 if c < end + long else -1
