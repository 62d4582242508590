"""Quiet stretches: runs of steps in which only decoders run and no one's memory grows,
computed and recorded at once.

This is the fast path's bulk recording for the policies that reserve a request's memory at
admission (the contiguous ones: their decoders never need a new block); where memory is
counted in blocks, ``harness.sim.counted_stretch`` records instead, through every event.

A quiet step is one in which only decoders run: no prefill chunk is in flight, nothing is
admitted (nothing waits, or admission is blocked and stays so), no arrival is due, and no
decoder needs memory. Decoders may finish inside a stretch: they are freed (in running
order, as ``finish_step`` does) and the stretch goes on with fewer decoders — unless
requests wait (a finish may unblock admission: the stretch ends with that step) or none is
left. Between finishes the decoder count and context are piecewise constant, so the step
times (``Clock.step_times``, accumulated left to right) and the allocation columns
(changing only at finishes) come out as arrays — the same values, bit for bit, as
``schedule``/``measure``/``finish_step`` step by step.
"""

from __future__ import annotations

import heapq
import operator
from typing import TYPE_CHECKING

import numpy as np

from ..clock.clocks import StepWork
from . import bulk_rows as R
from .decoders import Decoders, FastSeq
from .scheduling_rule import admission_chunk, admission_must_fit, admission_open

if TYPE_CHECKING:
    from ..records.recorder import RunRecorder
    from .scheduler import Scheduler

BULK_MIN = 3  # a quiet stretch shorter than this is not worth the arrays
BULK_MAX = 512  # steps per bulk call (longer stretches take several calls)
_RUN_POS = operator.attrgetter("run_pos")

# One level per run of steps with the same allocation and decoders: its first step, running,
# decoders, blocks, allocated positions, used positions before it, internal, external.
Level = tuple[int, int, int, int, int, int, int, int]


def admission_blocked(sched: Scheduler[FastSeq], decoders: int) -> bool:
    """True when ``_admit`` admits nothing now, and will not while only decoders run: the
    token budget, ``max_num_seqs`` or the head's memory stops it (free memory does not grow
    while nothing finishes)."""
    budget = sched.config.max_num_batched_tokens - decoders
    if not sched.waiting or not admission_open(budget, len(sched.running), sched.config.max_num_seqs):
        return True
    head = sched.waiting[0]
    computed = head.num_computed  # no prefix caching here: no hit
    num_new = admission_chunk(head.num_tokens, computed, budget)
    must_fit = admission_must_fit(head.num_tokens, sched.max_model_len)
    return not sched.policy.can_allocate(head, computed + num_new, must_fit=must_fit)


def _finish_events(
    dec: Decoders, tick0: int, end: int, stop_at_first: bool
) -> tuple[list[tuple[int, list[FastSeq], int]], int]:
    """The finishes due in ticks (tick0, end], taken from the heap — (step after tick0,
    finishers in running order, their Σ (computed − dec_tick)) — and the stretch's last tick:
    ``end``, or the first finish when ``stop_at_first`` (requests wait: it may unblock
    admission), or the finish that leaves no decoder."""
    heap, finishing = dec.finish_ticks, dec.finishing
    events: list[tuple[int, list[FastSeq], int]] = []
    left = dec.count
    while heap and heap[0] <= end:
        t = heapq.heappop(heap)
        lst = finishing.pop(t, None)
        if lst is None or t <= tick0:
            continue
        live = dec.live(lst)
        if not live:
            continue
        if len(live) > 1:
            live.sort(key=_RUN_POS)
        left -= len(live)
        events.append((t - tick0 - 1, live, sum(s.num_computed - s.dec_tick for s in live)))
        if left == 0 or stop_at_first:
            return events, t
    return events, end


def _first_crossing(dec: Decoders, tick0: int, k: int) -> int:
    """Steps before the first decoder needs a block (``k`` when none does within ``k``)."""
    first = k
    for t, events in dec.crossing.items():
        if tick0 < t <= tick0 + first and dec.live(events):
            first = t - tick0 - 1
    return first


def run(sched: Scheduler[FastSeq], dec: Decoders, recorder: RunRecorder) -> int:
    """Run and record a quiet stretch from the state of ``sched`` (the fast path's), in which
    every running request decodes implicitly (``dec``); return how many steps (0: none now)."""
    n = dec.count
    waiting = sched.waiting  # arrivals due by now are in it: the driver released them
    if waiting and not admission_blocked(sched, n):
        return 0
    tick0 = dec.tick
    clock = sched.clock
    assert clock is not None, "the simulator always runs on a clock"
    now = sched.now
    dec_sum = dec.dec_sum
    ctx0 = dec_sum + (tick0 + 1) * n
    pending = sched.pending
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

    events, end = _finish_events(dec, tick0, tick0 + limit, stop_at_first=bool(waiting))
    limit = end - tick0
    if limit < BULK_MIN:
        dec.restore_finishes(events, tick0)
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
    extra = clock.peek(step_n, step_n, limit)  # the clock's memory (a profile's primitive caches)
    if extra is not None:
        ts[1:] += extra  # price + take, per step, as the step-by-step path adds them
    np.add.accumulate(ts, out=ts)  # t_s of each step, then the end: sequential sums
    k = limit
    if pending:
        k = int(np.searchsorted(ts[:limit], pending[0].arrival_s, side="left"))
    k = _first_crossing(dec, tick0, k)  # a decoder needing memory: the step-by-step path allocates it
    if k < BULK_MIN:
        dec.restore_finishes(events, tick0)
        return 0

    # The finishes inside the k steps: freed at the end of their step, in running order.
    policy = sched.policy
    head = waiting[0] if waiting else None
    levels: list[Level] = [
        (
            0,
            len(sched.running),
            n,
            policy.allocated_blocks(),
            policy.allocated_positions,
            sched.used_positions,
            policy.internal_positions,
            policy.external_frag(head),
        )
    ]
    finished_rows: list[tuple[int, int]] = []
    done = 0
    for j, live, contrib in events:
        if j >= k:
            break
        done += 1
        lv = levels[-1]
        used = lv[5] + lv[2] * (j + 1 - lv[0])
        used -= dec.finish(live, tick0 + 1 + j, float(ts[j + 1]), contrib, policy)
        sched.finished += len(live)
        gone = set(map(id, live))
        sched.running = [s for s in sched.running if id(s) not in gone]
        c = len(live)
        finished_rows.append((j, c))
        levels.append(
            (
                j + 1,
                lv[1] - c,
                lv[2] - c,
                policy.allocated_blocks(),
                policy.allocated_positions,
                used,
                policy.internal_positions,
                policy.external_frag(head),
            )
        )
    dec.restore_finishes(events[done:], tick0)

    # The k rows (exact: integers < 2**53). A level starts at most one step after the last recorded.
    starts = [lv[0] for lv in levels] + [k]
    rep = np.repeat(np.array(levels, dtype=np.float64), [max(b - a, 0) for a, b in zip(starts, starts[1:])], axis=0)
    lv = levels[-1]
    used_end = lv[5] + lv[2] * (k - lv[0])
    steps = np.arange(k, dtype=np.float64)
    used_col = rep[:, 5] + rep[:, 2] * (steps + 1 - rep[:, 0])
    used_col -= policy.shared_excess_positions
    alloc = rep[:, 4]
    internal = rep[:, 6]
    evicted = sched.take_evictions()
    rows = R.step_rows(
        sched.step_index,
        ts,
        k,
        {
            R.RUNNING: rep[:, 1],
            R.WAITING: float(len(waiting)),
            R.SCHEDULED: rep[:, 2],
            R.BLOCKS: rep[:, 3],
            R.ALLOCATED: alloc,
            R.USED: used_col,
            R.RESERVED: alloc - used_col - internal,
            R.INTERNAL: internal,
            R.EXTERNAL: rep[:, 7],
            R.FREE: policy.budget_positions - alloc,
        },
        {R.FINISHED: finished_rows, R.EVICTED: [(0, evicted)]},
    )
    recorder.add_step_rows(rows)
    clock.take_many(step_n, step_n, k)
    dec.tick = tick0 + k
    sched.used_positions = used_end
    sched.now = float(ts[k])
    sched.step_index += k
    return k
