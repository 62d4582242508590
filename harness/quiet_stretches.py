"""Quiet stretches: runs of simulator steps computed and recorded at once.

A mixin of ``harness.fast_scheduler.FastScheduler`` (it uses the implicit-decoder
state kept there).

``record_quiet_steps`` (called by ``runners.driver.drive`` before each step, once the
arrivals due are released): while only decoders run — no prefill in flight, nothing admitted,
no arrival due, crossings fitting the free blocks — a whole run of steps is computed
at once (step times by ``Clock.step_times``, start times by a sequential
``np.add.accumulate``) and handed to the recorder as one block of rows. Decoders may
finish inside a stretch (the decoder count and context are piecewise constant between
finishes); with requests waiting, the stretch ends at the first finish (it may unblock
admission). With block counts only (``CountingPagedPolicy``: the paged policies
without prefix caching; nothing here reads block ids) a decoder's crossings in a
stretch are an arithmetic progression, so the allocation columns come from per-step
counts rather than per-crossing bookkeeping; other policies walk the stretch step by
step. Per-step Python work disappears from most of a realistic trace.

With block counts, the roofline clock and nothing waiting, a stretch also runs on through
arrivals (``_quiet_merged``): an arrival whose whole prompt fits the token budget,
``max_num_seqs`` and memory (``must_fit``, as in ``_admit``) is admitted by one step inside
the stretch (its prompt scheduled, its blocks allocated, its first token sampled at the
step's end) and decodes implicitly from the next tick on. Such a stretch prices each step
with the clock's own formula in Python floats (the same IEEE operations as
``RooflineClock.step_time``), counts crossings per window of ticks, defers the decoders'
block growth and the finishers' frees to its end, and builds its rows once; an arrival it
cannot admit whole, a crossing that does not fit, or more decoders than the token budget
ends it. On the Azure trace nearly every step is recorded this way.
"""

from __future__ import annotations

import heapq
import math
import operator
from typing import TYPE_CHECKING

import numpy as np

from .clock import RooflineClock, StepWork
from .policies.paged import CountingPagedPolicy, PagedPolicy
from .recorder import MEASURED_FIELDS
from .schema import StepRow
from .sequence import FINISHED, RUNNING, Seq

if TYPE_CHECKING:
    from collections import defaultdict, deque

    from .clock import Clock
    from .policies.base import Policy
    from .recorder import RunRecorder
    from .specs import SchedulerSpec

# The bulk rows are float64 blocks in the recorder's layout: one column per StepRow field.
_WIDTH = len(StepRow._fields)
_col = StepRow._fields.index
STEP, T_S, DT_S, RUNNING_COL, WAITING_COL, ADMITTED_COL, FINISHED_COL, SCHEDULED_COL = map(_col, (
    "step", "t_s", "dt_s", "running", "waiting", "admitted", "finished", "scheduled_tokens"))
BLOCKS, ALLOCATED, USED, RESERVED, INTERNAL, EXTERNAL, FREE, EVICTED = map(_col, (
    "allocated_blocks", "allocated_positions", "used_positions", "reserved_positions", "internal_frag_positions",
    "external_frag_positions", "free_positions", "evicted_blocks"))

# A quiet step's row before its varying columns are filled in: zeros, the unmeasured columns null.
_QUIET_ROW = np.array([math.nan if c in MEASURED_FIELDS else 0.0 for c in StepRow._fields])
_RUN_POS = operator.attrgetter("run_pos")
# The columns a counting stretch fills from its per-step lists, in their order.
_VARYING = [BLOCKS, INTERNAL, USED, SCHEDULED_COL, RUNNING_COL]

SHORT_STRETCH = 8  # steps: below this, expected from free memory, the step-by-step path is cheaper (measured)
BULK_MIN = 3  # a quiet stretch shorter than this is not worth the arrays
BULK_MAX = 512  # steps per bulk call (longer stretches take several calls)
MERGE_MAX = 8192  # steps per merged stretch (``_quiet_merged``)
WINDOW = 256  # ticks of crossings counted at a time in a merged stretch
MERGE = True  # quiet stretches run on through simple admissions (``_quiet_merged``)


class QuietStretches:
    """Bulk recording of quiet steps; mixed into ``FastScheduler``."""

    if TYPE_CHECKING:  # the host's state this mixin reads and writes (``Scheduler``, ``FastScheduler``)
        pending: deque[Seq]
        waiting: deque[Seq]
        running: list[Seq]
        policy: Policy
        config: SchedulerSpec
        max_model_len: int
        clock: Clock | None
        now: float
        step_index: int
        finished: int
        used_positions: int
        _evictions_seen: int
        tick: int
        num_decoders: int
        dec_sum: int
        crossing: defaultdict[int, list[tuple[Seq, int]]]
        finishing: dict[int, list[tuple[Seq, int]]]
        _finish_ticks: list[int]
        explicit: list[Seq]
        _caching: bool
        _merge: bool
        merged_admissions: int

        def _append_running(self, seq: Seq) -> None: ...

        def _register(self, seq: Seq) -> None: ...

    def _next_finish_tick(self) -> int | None:
        """The first tick at which a live decoder finishes (stale events dropped)."""
        heap, finishing = self._finish_ticks, self.finishing
        while heap:
            t = heap[0]
            events = finishing.get(t)
            if events is not None and t > self.tick:
                if any(s.epoch == e and s.dec_tick >= 0 for s, e in events):
                    return t
                del finishing[t]
            heapq.heappop(heap)
        return None

    def _admission_blocked(self, decoders: int) -> bool:
        """True when ``_admit`` admits nothing now, and will not while only decoders grow:
        the token budget, ``max_num_seqs`` or the head's memory stops it (free memory only
        shrinks while nothing finishes; a contiguous arena does not change at all)."""
        budget = self.config.max_num_batched_tokens - decoders
        if not self.waiting or budget <= 0 or len(self.running) >= self.config.max_num_seqs:
            return True
        head = self.waiting[0]
        computed = head.num_computed  # no prefix caching here: no hit
        num_new = min(head.num_tokens - computed, budget)
        return not self.policy.can_allocate(head, computed + num_new,
                                            must_fit=min(head.num_tokens, self.max_model_len))

    def _memory_runs_out_soon(self, decoders: int) -> bool:
        """Whether the free blocks last fewer than ``SHORT_STRETCH`` steps of ``decoders`` crossing
        one block every ``block_size`` steps on average. An estimate, not a bound: it only
        chooses the step-by-step path (the same records) where a stretch would be too short to
        pay for setting it up, as it is between the preemptions of a full cache."""
        policy = self.policy
        free_blocks = getattr(policy, "free_blocks", None)
        if free_blocks is None:
            return False  # contiguous: memory does not grow per step
        return free_blocks() * policy.block_size < SHORT_STRETCH * decoders

    def record_quiet_steps(self, recorder: RunRecorder) -> int:
        """Run and record a stretch of *quiet* steps at once; return how many (0: none now).

        A quiet step is a simple step in which only decoders run: no prefill chunk is in
        flight, nothing is admitted (nothing waits, or admission is blocked and stays so),
        no arrival is due, and the block crossings fit the free blocks. Decoders may finish
        inside a stretch: they are freed (in running order, as ``finish_step`` does) and the
        stretch goes on with fewer decoders — unless requests wait (a finish may unblock
        admission: the stretch ends with that step) or none is left. Between finishes the
        step times (``Clock.step_times``, accumulated left to right) and the allocation
        columns (changing only at crossings and finishes) come out as arrays — the same
        values, bit for bit, as ``schedule``/``measure``/``finish_step`` step by step.
        Prefix caching is left to the step-by-step path (crossings there cache and may
        evict blocks). With nothing waiting, block counts and the roofline clock, the
        stretch is ``_quiet_merged``'s, which also admits arrivals inside it.
        """
        n = self.num_decoders
        if self._caching or self.explicit or n == 0 or n > self.config.max_num_batched_tokens:
            return 0
        if self._memory_runs_out_soon(n):
            return 0  # under memory pressure a stretch would end within a few steps: not worth its set-up
        waiting = self.waiting  # arrivals due by now are in it: the driver released them
        if not waiting and self._merge:
            return self._quiet_merged(recorder)
        if waiting and not self._admission_blocked(n):
            return 0
        tick0 = self.tick
        clock = self.clock
        assert clock is not None, "the simulator always runs on a clock"
        now = self.now
        dec_sum = self.dec_sum
        ctx0 = dec_sum + (tick0 + 1) * n
        pending = self.pending
        limit = BULK_MAX
        if pending:
            # While the decoders stay, steps only get longer (context grows); a finish may make
            # them shorter, but never shorter than an empty step. That bounds the stretch by
            # the arrival; the exact cut comes below.
            dt0 = clock.step_time(StepWork(n, ctx0, ctx0, n))
            room = pending[0].arrival_s - now
            if room <= (BULK_MIN - 1) * dt0:
                return 0
            floor = clock.step_time(StepWork(0, 0, 0, 0))
            limit = min(limit, int(room / floor) + 2)

        # The finishes due in the stretch: (step, finishers in running order, Σ computed − dec_tick).
        heap, finishing = self._finish_ticks, self.finishing
        events: list[tuple[int, list[Seq], int]] = []
        end = tick0 + limit
        left = n
        while heap and heap[0] <= end:
            t = heapq.heappop(heap)
            lst = finishing.pop(t, None)
            if lst is None or t <= tick0:
                continue
            live = [s for s, e in lst if s.epoch == e and s.dec_tick >= 0]
            if not live:
                continue
            if len(live) > 1:
                live.sort(key=_RUN_POS)
            left -= len(live)
            events.append((t - tick0 - 1, live, sum(s.num_computed - s.dec_tick for s in live)))
            if left == 0 or waiting:
                end = t  # nothing left to decode, or admission may be unblocked: stop after it
                break
        limit = end - tick0
        if limit < BULK_MIN:
            self._restore_finishes(events, tick0)
            return 0

        if events:  # the decoder count and Σ (computed − dec_tick), piecewise constant
            ns, ds, starts = [n], [dec_sum], [0]
            for j, live, contrib in events:
                ns.append(ns[-1] - len(live))
                ds.append(ds[-1] - contrib)
                starts.append(j + 1)
            starts.append(limit)
            counts = [y - x for x, y in zip(starts, starts[1:])]
            n_arr = np.repeat(np.array(ns, dtype=np.int64), counts)
            context = np.repeat(np.array(ds, dtype=np.int64), counts)
            context += np.arange(tick0 + 1, tick0 + 1 + limit, dtype=np.int64) * n_arr
            step_n: int | np.ndarray = n_arr
        else:
            context = np.arange(ctx0, ctx0 + limit * n, n, dtype=np.int64)[:limit]
            step_n = n
        ts = np.empty(limit + 1)
        ts[0] = now
        ts[1:] = clock.step_times(step_n, context, context, step_n)
        np.add.accumulate(ts, out=ts)  # t_s of each step, then the end: sequential sums
        k = limit
        if pending:
            k = int(np.searchsorted(ts[:limit], pending[0].arrival_s, side="left"))
            if k < BULK_MIN:
                self._restore_finishes(events, tick0)
                return 0

        policy = self.policy
        counting = getattr(policy, "counting", False)
        if counting:
            return self._quiet_counting(recorder, events, ts, k, limit, n)

        # Crossings and finishes, step by step, while the crossings fit the free blocks.
        paged = policy if isinstance(policy, PagedPolicy) else None  # the ones that count free blocks
        free = paged.free_blocks() if paged is not None else math.inf
        head = waiting[0] if waiting else None
        running = len(self.running)
        used = self.used_positions
        # (first step, running, decoders, blocks, positions, used before it, internal, external)
        # of each run of steps with the same allocation and decoders
        levels = [(0, running, n, policy.allocated_blocks(), policy.allocated_positions, used,
                   policy.internal_positions, policy.external_frag(head))]
        finished_rows: list[tuple[int, int]] = []
        crossing = self.crossing
        next_event = events[0][0] if events else -1
        done_events = 0
        for j in range(k):
            t = tick0 + 1 + j
            events_t = crossing.get(t)
            if events_t:
                crossers = [s for s, e in events_t if s.epoch == e and s.dec_tick >= 0]
                if len(crossers) > free:
                    k = j  # this step must preempt: the step-by-step path takes it
                    break
                del crossing[t]
                if crossers:
                    free -= len(crossers)
                    tm1 = t - 1
                    for seq in crossers:  # as in schedule(): materialise, one more block, the next crossing
                        d = tm1 - seq.dec_tick
                        seq.num_computed += d
                        seq.num_output += d
                        seq.dec_tick = tm1
                    for seq in crossers:  # not counting here: counting policies took _quiet_counting
                        policy.allocate(seq, seq.num_computed + 1)
                    for seq in crossers:
                        nxt = seq.allocated - seq.num_computed + t
                        if nxt <= seq.output_len - seq.num_output + tm1:
                            crossing[nxt].append((seq, seq.epoch))
                    lv = levels[-1]
                    levels.append((j, lv[1], lv[2], policy.allocated_blocks(), policy.allocated_positions,
                                   lv[5] + lv[2] * (j - lv[0]), policy.internal_positions, lv[7]))
            if j == next_event:  # as in finish_step(): the last token sampled, then freed in running order
                _, live, contrib = events[done_events]
                done_events += 1
                next_event = events[done_events][0] if done_events < len(events) else -1
                end_s = float(ts[j + 1])
                lv = levels[-1]
                used = lv[5] + lv[2] * (j + 1 - lv[0])
                used -= self._finish_decoders(live, t, end_s, contrib)
                gone = set(map(id, live))
                self.running = [s for s in self.running if id(s) not in gone]
                c = len(live)
                if paged is not None:
                    free = paged.free_blocks()
                finished_rows.append((j, c))
                levels.append((j + 1, lv[1] - c, lv[2] - c, policy.allocated_blocks(), policy.allocated_positions,
                               used, policy.internal_positions, policy.external_frag(head)))
        self._restore_finishes(events[done_events:], tick0)
        if k == 0:
            return 0

        # The k rows, as one float64 block in the recorder's layout (exact: integers < 2**53).
        starts = [lv[0] for lv in levels]
        starts.append(k)
        counts = [max(y, 0) for y in (b - a for a, b in zip(starts, starts[1:]))]
        lv = levels[-1]
        if lv[0] <= k:
            used_end = lv[5] + lv[2] * (k - lv[0])
        else:  # unreachable: a level starts at most one step after the last recorded
            raise AssertionError("level past the stretch")
        rep = np.repeat(np.array(levels, dtype=np.float64), counts, axis=0)
        steps = np.arange(k, dtype=np.float64)
        rows = np.empty((k, _WIDTH))
        rows[:] = _QUIET_ROW
        rows[:, STEP] = steps + self.step_index
        rows[:, T_S] = ts[:k]
        rows[:, DT_S] = ts[1:k + 1] - ts[:k]
        rows[:, RUNNING_COL] = rep[:, 1]
        rows[:, WAITING_COL] = len(waiting)
        rows[:, SCHEDULED_COL] = rep[:, 2]
        rows[:, BLOCKS] = rep[:, 3]
        alloc = rep[:, 4]
        rows[:, ALLOCATED] = alloc
        used_col = rep[:, 5] + rep[:, 2] * (steps + 1 - rep[:, 0])
        used_col -= policy.shared_excess_positions
        rows[:, USED] = used_col
        internal = rep[:, 6]
        rows[:, RESERVED] = alloc - used_col - internal
        rows[:, INTERNAL] = internal
        rows[:, EXTERNAL] = rep[:, 7]
        rows[:, FREE] = policy.budget_positions - alloc
        for j, c in finished_rows:
            rows[j, FINISHED_COL] = c
        evicted = policy.evictions - self._evictions_seen
        self._evictions_seen = policy.evictions
        rows[0, EVICTED] = evicted
        recorder.add_step_rows(rows)
        self.tick = tick0 + k
        self.used_positions = used_end
        self.now = float(ts[k])
        self.step_index += k
        return k

    def _quiet_counting(self, recorder: RunRecorder, events: list[tuple[int, list[Seq], int]],
                        ts: np.ndarray, k: int, limit: int, n: int) -> int:
        """The stretch's crossings and finishes with block counts (``CountingPagedPolicy``), as
        arithmetic: decoder i needs a block at ticks c_i, c_i + bs, … up to its finish, so the
        allocation columns are cumulative counts, with no per-step Python."""
        policy = self.policy
        assert isinstance(policy, CountingPagedPolicy)
        bs = policy.block_size
        tick0 = self.tick
        # Per step (0-based, within ``limit``): blocks taken by crossings, internal fragmentation added.
        decs = self.running
        cross = [0] * limit
        int_add = [0] * limit
        end_all = tick0 + limit
        for s in decs:
            f = s.output_len - s.num_output + s.dec_tick
            c = s.allocated - s.num_computed + s.dec_tick + 1
            last = f if f < end_all else end_all
            if c > last:
                continue
            m = (last - c) // bs + 1
            first = c - tick0 - 1
            for x in range(first, first + m * bs, bs):
                cross[x] += 1
            a, fl = s.allocated, s.prompt_len + s.output_len
            a_end = a + m * bs
            if a_end > fl:  # only the last block may pass the final length
                if a_end - bs > fl:
                    self._restore_finishes(events, tick0)
                    return 0
                int_add[first + (m - 1) * bs] += a_end - fl - (a - fl if a > fl else 0)
        # Frees at the end of finishing steps: step → (blocks, internal, used positions, sequences).
        frees: dict[int, tuple[int, int, int, int]] = {}
        for j, live, _ in events:
            t = tick0 + 1 + j
            fb = fi = fu = 0
            for s in live:
                c = s.allocated - s.num_computed + s.dec_tick + 1
                a = s.allocated + ((t - c) // bs + 1) * bs if c <= t else s.allocated
                fl = s.prompt_len + s.output_len
                fb += a // bs
                fi += a - fl if a > fl else 0
                fu += s.num_computed + t - s.dec_tick
            frees[j] = (fb, fi, fu, len(live))

        # The columns that vary, step by step, while the crossings fit the free blocks.
        avail = policy.free_blocks()
        blocks = policy.allocated_blocks()
        internal = policy.internal_positions
        used = self.used_positions - policy.shared_excess_positions
        nn = n
        run = len(self.running)
        c_blocks: list[int] = []
        c_internal: list[int] = []
        c_used: list[int] = []
        c_n: list[int] = []
        c_run: list[int] = []
        c_fin: list[tuple[int, int]] = []
        used_end = self.used_positions
        for j in range(k):
            x = cross[j]
            if x:
                avail -= x
                if avail < 0:
                    k = j  # this step must preempt: the step-by-step path takes it
                    break
                blocks += x
                internal += int_add[j]
            used += nn
            c_blocks.append(blocks)
            c_internal.append(internal)
            c_used.append(used)
            c_n.append(nn)
            c_run.append(run)
            fr = frees.get(j)
            if fr is not None:
                fb, fi, fu, fc = fr
                c_fin.append((j, fc))
                avail += fb
                blocks -= fb
                internal -= fi
                used -= fu
                nn -= fc
                run -= fc
        if k == 0:
            self._restore_finishes(events, tick0)
            return 0
        used_end = used + policy.shared_excess_positions

        # The rows (float64, the recorder's layout; integers exact below 2**53).
        cols = np.array((c_blocks, c_internal, c_used, c_n, c_run), dtype=np.float64)
        alloc = cols[0] * bs
        rows = np.empty((k, _WIDTH))
        rows[:] = _QUIET_ROW
        rows[:, STEP] = np.arange(self.step_index, self.step_index + k, dtype=np.float64)
        rows[:, T_S] = ts[:k]
        rows[:, DT_S] = ts[1:k + 1] - ts[:k]
        rows[:, _VARYING] = cols.T
        rows[:, ALLOCATED] = alloc
        rows[:, RESERVED] = alloc - cols[2] - cols[1]
        rows[:, WAITING_COL] = len(self.waiting)
        rows[:, EXTERNAL] = policy.external_frag(self.waiting[0] if self.waiting else None)
        rows[:, FREE] = policy.budget_positions - alloc
        for j, fc in c_fin:
            rows[j, FINISHED_COL] = fc
        evicted = policy.evictions - self._evictions_seen
        self._evictions_seen = policy.evictions
        rows[0, EVICTED] = evicted

        # The state after k steps: every decoder's crossings up to then, the finishers freed.
        end = tick0 + k
        crossing = self.crossing
        for t in range(tick0 + 1, end + 1):
            crossing.pop(t, None)
        plans = []
        for s in decs:
            f = s.output_len - s.num_output + s.dec_tick
            plans.append((s, s.allocated - s.num_computed + s.dec_tick + 1, f, f))
        grown, internal_add = self._grow_decoders(plans, end, bs)
        policy.take_blocks(grown, internal_add)
        done_events = 0
        for j, live, contrib in events:
            if j >= k:
                break
            done_events += 1
            t = tick0 + 1 + j
            end_s = float(ts[j + 1])
            self._finish_decoders(live, t, end_s, contrib)
            gone = set(map(id, live))
            self.running = [s for s in self.running if id(s) not in gone]
        self._restore_finishes(events[done_events:], tick0)
        recorder.add_step_rows(rows)
        self.tick = end
        self.used_positions = used_end
        self.now = float(ts[k])
        self.step_index += k
        return k

    def _quiet_merged(self, recorder: RunRecorder) -> int:
        """A quiet stretch that runs on through arrivals (``CountingPagedPolicy``, roofline clock,
        nothing waiting): an arrival whose whole prompt fits the token budget, ``max_num_seqs``
        and memory (``must_fit``, as in ``_admit``) is admitted inside the stretch — one step
        with its prompt scheduled, its blocks allocated, its first token sampled at the step's
        end — and decodes from the next tick on. Step times come from the clock's own formula
        step by step (the same IEEE operations as ``RooflineClock.step_time``); crossings are
        counted arithmetically per window of ticks; rows are built once per stretch. Any other
        arrival, a crossing that would not fit, or too many decoders for the budget ends it."""
        clock = self.clock
        policy = self.policy
        assert isinstance(clock, RooflineClock) and isinstance(policy, CountingPagedPolicy)  # as _merge requires
        W, kvb, bw = clock._weight_bytes, clock._kv_bytes_per_token, clock._bw
        fpt, apf, peak = clock._flops_per_token, clock._attn_flops_per_pair, clock._peak
        scale = clock.scale
        bs = policy.block_size
        cfg = self.config
        B, max_seqs, mml = cfg.max_num_batched_tokens, cfg.max_num_seqs, self.max_model_len
        tick0 = self.tick
        nn, dsum = self.num_decoders, self.dec_sum
        run = len(self.running)
        avail = policy.free_blocks()
        blocks = policy.allocated_blocks()
        internal = policy.internal_positions
        excess = policy.shared_excess_positions
        used = self.used_positions - excess
        pending = self.pending
        next_arr = pending[0].arrival_s if pending else math.inf
        heap, finishing = self._finish_ticks, self.finishing
        # Each decoder's crossings: ticks c, c + bs, …, L (its last before finishing at f).
        plans: list[tuple[Seq, int, int, int]] = []
        iadd: dict[int, int] = {}  # tick → internal fragmentation added by a last crossing
        for s in self.running:
            c = s.allocated - s.num_computed + s.dec_tick + 1
            f = s.output_len - s.num_output + s.dec_tick
            if c > f:
                continue
            L = c + (f - c) // bs * bs
            a_old = s.allocated + (L - c) // bs * bs
            fl = s.prompt_len + s.output_len
            if a_old + bs > fl:
                iadd[L] = iadd.get(L, 0) + a_old + bs - fl - (a_old - fl if a_old > fl else 0)
            plans.append((s, c, f, L))
        cross: list[int] = []  # per step of the stretch: decoders crossing into a new block
        wend = tick0  # the ticks counted so far: (tick0, wend]
        t = self.now
        c_ts: list[float] = []
        c_blocks: list[int] = []
        c_internal: list[int] = []
        c_used: list[int] = []
        c_sched: list[int] = []
        c_run: list[int] = []
        fin_rows: list[tuple[int, int]] = []
        adm_rows: list[tuple[int, int]] = []
        events: list[tuple[int, list[Seq], int, float]] = []
        adm_blocks = adm_internal = 0
        j = 0
        while j < MERGE_MAX and nn <= B:
            T = tick0 + 1 + j
            if T > wend:
                ws = wend
                wend = ws + WINDOW
                cross.extend([0] * WINDOW)
                base = tick0 + 1
                for _, c, _, L in plans:
                    if L <= ws:
                        continue
                    x0 = c if c > ws else c + ((ws - c) // bs + 1) * bs
                    hi = L if L < wend else wend
                    for x in range(x0 - base, hi - base + 1, bs):
                        cross[x] += 1
            x = cross[j]
            if x > avail:
                break  # this step must preempt: the step-by-step path takes it
            cand: list[Seq] = []
            if next_arr <= t:  # arrivals released now: admitted whole, or the stretch ends here
                budget = B - nn
                r = run
                av = avail - x
                ok = True
                i = 0
                while i < len(pending) and pending[i].arrival_s <= t:
                    s = pending[i]
                    p = s.prompt_len
                    need = -(-p // bs)
                    if (budget <= 0 or r >= max_seqs or p > budget or need > av or s.num_computed
                            or s.num_output or s.num_preemptions or s.output_len < 2 or p + s.output_len > mml):
                        ok = False
                        break
                    av -= need
                    budget -= p
                    r += 1
                    cand.append(s)
                    i += 1
                if not ok:
                    break
            # The step: crossings, admissions, every decoder's token.
            avail -= x
            blocks += x
            if x:
                internal += iadd.get(T, 0)
            ctx = dsum + T * nn
            new = nn
            pairs = ctx
            if cand:
                for s in cand:
                    pending.popleft()
                    p = s.prompt_len
                    nb = -(-p // bs)
                    a = nb * bs
                    fl = p + s.output_len
                    avail -= nb
                    blocks += nb
                    s.allocated = a
                    if a > s.peak_allocated:
                        s.peak_allocated = a
                    ia = a - fl if a > fl else 0
                    internal += ia
                    adm_blocks += nb
                    adm_internal += ia
                    self._append_running(s)
                    s.status = RUNNING
                    s.num_computed = p
                    s.first_scheduled_s = t
                    new += p
                    ctx += p
                    pairs += p * p
                run += len(cand)
                adm_rows.append((j, len(cand)))
                next_arr = pending[0].arrival_s if pending else math.inf
            used += new
            c_ts.append(t)
            c_blocks.append(blocks)
            c_internal.append(internal)
            c_used.append(used)
            c_sched.append(new)
            c_run.append(run)
            b_ = W + ctx * kvb
            f_ = new * fpt + pairs * apf
            dt = max(b_ / bw, f_ / peak) * scale
            t_end = t + dt
            # The end of the step: finishers freed, then the admitted decode from the next tick on.
            if heap and heap[0] <= T:
                live: list[Seq] = []
                while heap and heap[0] <= T:
                    tt = heapq.heappop(heap)
                    if tt == T:
                        lst = finishing.pop(T, None)
                        if lst:
                            live.extend(s for s, e in lst if s.epoch == e and s.dec_tick >= 0)
                if live:
                    if len(live) > 1:
                        live.sort(key=_RUN_POS)
                    cnt = len(live)
                    contrib = 0
                    for s in live:
                        dtk = s.dec_tick
                        contrib += s.num_computed - dtk
                        cc = s.allocated - s.num_computed + dtk + 1
                        a = s.allocated + ((T - cc) // bs + 1) * bs if cc <= T else s.allocated
                        fl = s.prompt_len + s.output_len
                        nbk = a // bs
                        blocks -= nbk
                        avail += nbk
                        internal -= a - fl if a > fl else 0
                        used -= s.num_computed + T - dtk
                    nn -= cnt
                    dsum -= contrib
                    run -= cnt
                    events.append((j, live, contrib, t_end))
                    fin_rows.append((j, cnt))
            if cand:
                self.tick = T
                for s in cand:
                    s.num_output = 1
                    s.first_token_s = t_end
                    self._register(s)
                    nn += 1
                    dsum += s.num_computed - T
                    c = s.allocated - s.num_computed + T + 1
                    f = s.output_len - 1 + T
                    if c > f:
                        continue
                    L = c + (f - c) // bs * bs
                    a_old = s.allocated + (L - c) // bs * bs
                    fl = s.prompt_len + s.output_len
                    if a_old + bs > fl:
                        iadd[L] = iadd.get(L, 0) + a_old + bs - fl - (a_old - fl if a_old > fl else 0)
                    plans.append((s, c, f, L))
                    base = tick0 + 1
                    hi = L if L < wend else wend
                    for xx in range(c - base, hi - base + 1, bs):
                        cross[xx] += 1
                self.tick = tick0
            t = t_end
            j += 1
            if nn == 0:
                break
        k = j
        if k == 0:
            return 0

        # The state after k steps: every decoder's crossings up to then, the finishers freed.
        end = tick0 + k
        crossing = self.crossing
        for tk in range(tick0 + 1, end + 1):
            crossing.pop(tk, None)
        grown, internal_add = self._grow_decoders(plans, end, bs)
        policy.take_blocks(grown + adm_blocks, internal_add + adm_internal)
        if events:
            gone: set[int] = set()
            for jj, live, contrib, end_s in events:
                self._finish_decoders(live, tick0 + 1 + jj, end_s, contrib)
                gone.update(map(id, live))
            self.running = [s for s in self.running if id(s) not in gone]

        # The rows (float64, the recorder's layout; integers exact below 2**53).
        c_ts.append(t)
        tsa = np.array(c_ts)
        rows = np.empty((k, _WIDTH))
        rows[:] = _QUIET_ROW
        rows[:, STEP] = np.arange(self.step_index, self.step_index + k, dtype=np.float64)
        rows[:, T_S] = tsa[:k]
        np.subtract(tsa[1:], tsa[:k], out=rows[:, DT_S])
        cols = np.array((c_blocks, c_internal, c_used, c_sched, c_run), dtype=np.float64)
        rows[:, _VARYING] = cols.T
        alloc = rows[:, ALLOCATED]
        np.multiply(cols[0], bs, out=alloc)
        rows[:, RESERVED] = alloc - cols[2] - cols[1]
        rows[:, EXTERNAL] = policy.external_frag(None)
        np.subtract(policy.budget_positions, alloc, out=rows[:, FREE])
        for jj, cnt in fin_rows:
            rows[jj, FINISHED_COL] = cnt
        for jj, cnt in adm_rows:
            rows[jj, ADMITTED_COL] = cnt
        evicted = policy.evictions - self._evictions_seen
        self._evictions_seen = policy.evictions
        rows[0, EVICTED] = evicted
        recorder.add_step_rows(rows)
        self.merged_admissions += sum(cnt for _, cnt in adm_rows)
        self.tick = end
        self.used_positions = used + excess
        self.now = t
        self.step_index += k
        return k

    def _finish_decoders(self, live: list[Seq], tick: int, end_s: float, contrib: int) -> int:
        """Decoders that sampled their last token at ``tick``: bring them up to date, free
        them in the given (running) order, stop tracking them. Their removal from
        ``self.running`` is the caller's (batched across finish events where it can be).
        Returns the positions they held, for the used-positions count."""
        policy = self.policy
        held = 0
        for seq in live:
            d = tick - seq.dec_tick
            seq.num_computed += d
            seq.num_output += d
            seq.dec_tick = -1
            seq.epoch += 1
            policy.free(seq)
            held += seq.num_computed
            seq.status = FINISHED
            seq.finished_s = end_s
        self.finished += len(live)
        self.num_decoders -= len(live)
        self.dec_sum -= contrib
        return held

    def _grow_decoders(self, plans: list[tuple[Seq, int, int, int]], end: int, bs: int) -> tuple[int, int]:
        """Give each decoder the blocks its crossings up to tick ``end`` took, in one go.

        ``plans`` holds (sequence, first crossing tick, finish tick, last tick it may
        cross at); crossings come every ``bs`` ticks. The next crossing after the
        stretch is re-registered. Returns (blocks taken, internal fragmentation added).
        """
        crossing = self.crossing
        grown = internal_add = 0
        for s, c, f, limit in plans:
            last = limit if limit < end else end
            if c > last:
                continue
            m = (last - c) // bs + 1
            a, fl = s.allocated, s.prompt_len + s.output_len
            s.allocated = a_end = a + m * bs
            if a_end > s.peak_allocated:
                s.peak_allocated = a_end
            if a_end > fl:
                internal_add += a_end - fl - (a - fl if a > fl else 0)
            grown += m
            nxt = c + m * bs
            if f > end and nxt <= limit:
                crossing[nxt].append((s, s.epoch))
        return grown, internal_add

    def _restore_finishes(self, events: list[tuple[int, list[Seq], int]], tick0: int) -> None:
        """Put back finish events taken from the heap but not reached."""
        for j, live, _ in events:
            t = tick0 + 1 + j
            self.finishing[t] = [(s, s.epoch) for s in live]
            heapq.heappush(self._finish_ticks, t)
