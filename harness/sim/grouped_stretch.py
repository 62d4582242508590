"""Stretches over vLLM's KV cache groups: the fast path's run of steps, recorded at once, for a
policy of several block tables per request (``GroupCounts``: ``paged``, or ``paged-prefix``
with block ids).

A *plain* step — only decoders run, none acts (``reach``) or finishes, nothing is admitted —
only counts: its time is the clock's formula (``StepPrice``), its row the level the last event
left. A step's acts are taken here when their new blocks fit the free ones whatever their own
frees: each acting decoder ``act``s (in any order where the policy keeps counts, in running
order where it keeps block ids) and files its next act. If the waiting head then fits in the free blocks
(``allocate``'s test; a need known to be out of reach is not worked out again), the rest of
the step, its admission, is the fast path's own, which finds no crossers left; otherwise the
decoders that sample their last token are freed at the step's end in running order. Every
other step — a prompt chunk, a preemption, more decoders than the token budget — is the fast
path's own (``FastScheduler.schedule`` and ``finish_step``). Each non-plain step starts a
*level*: the step columns, the cached free blocks and the policy's group totals
(``GroupCounts.sums``) from that step on; a step's used bytes per group are its level's
``const + slope × step``. The step rows and KV cache group rows are built from the levels
once per stretch (``bulk_rows.step_rows``).

A stretch ends where the driver must act: an arrival due, nothing left to run, a step that
computed nothing, or ``MAX_STEPS``. Equality with the reference scheduler is tested record for
record (``tests/sim/test_fast_path_hybrid.py``).
"""

from __future__ import annotations

import math
from array import array
from operator import attrgetter
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from ..clock.clocks import Clock
from . import bulk_rows as R
from .decoders import Decoders, FastSeq
from .policies.group_counts import GroupCounts
from .scheduling_rule import admission, admission_open
from .step_price import StepPrice

if TYPE_CHECKING:
    from ..records.recorder import RunRecorder
    from .scheduler import Scheduler

MAX_STEPS = 8192  # steps per stretch (its rows are built at once)
_RUN_POS = attrgetter("run_pos")


def _RUN_POS_OF_EVENT(event: tuple[FastSeq, int]) -> int:
    return event[0].run_pos


def _head_blocks(sched: Scheduler[FastSeq], dec: Decoders, policy: GroupCounts) -> int:
    """The free blocks (after the step's acts) the head of ``waiting`` needs to be admitted,
    with the budget the decoders leave (``scheduling_rule.admit_waiting``'s test); −1: the step
    admits nothing whatever is free."""
    budget = sched.config.max_num_batched_tokens - dec.count
    if not admission_open(budget, len(sched.running), sched.config.max_num_seqs):
        return -1
    head = sched.waiting[0]
    _, target, must_fit = admission(sched.policy, head, budget, sched.max_model_len)
    return policy.admission_blocks(head, target, must_fit)


def run(sched: Scheduler[FastSeq], dec: Decoders, policy: GroupCounts, recorder: RunRecorder) -> int:
    """Take and record steps from the state of ``sched`` (the fast path's, its decoders ``dec``;
    module docstring); return how many (0: the next step goes one by one)."""
    clock = sched.clock
    if clock is None or not (sched.running or sched.waiting):
        return 0
    budget = sched.config.max_num_batched_tokens
    price = StepPrice(clock)
    act = policy.act
    groups, num_blocks = len(policy.groups), policy.num_blocks
    take = clock.take if type(clock).take is not Clock.take else None  # a clock with memory
    # One second a step (``Clock`` itself, the default): the price is a constant, the steps only count.
    second = price.second and take is None
    waiting, pending, crossing, finishing = sched.waiting, sched.pending, dec.crossing, dec.finishing
    next_arr = pending[0].arrival_s if pending else math.inf
    step0, measured0 = sched.step_index, policy.steps
    t = sched.now
    ts: list[float] = []
    levels = Levels(policy)
    act_levels, sums = levels.flat, policy.sums  # an act's level: appended here (``Levels``)
    events: dict[int, list[tuple[int, int]]] = {
        c: [] for c in (R.FINISHED, R.ADMITTED, R.PREEMPTED, R.EVICTED, R.PREFIX_HIT, R.RECOMPUTED_HIT)
    }
    finished, evicted = events[R.FINISHED], events[R.EVICTED]
    # Block ids (prefix caching): acts in running order, each step's evictions and cached free
    # blocks recorded, the reuse ledger's clock kept, a waiting head's need read again where the
    # pool's cached blocks or the lookups moved (``admission_epoch``).
    ordered = policy.needs_run_order
    ledger = sched.ledger
    cached_free = policy.cached_free_blocks
    epoch_seen, grown_seen, slack_seen = policy.admission_epoch, policy.admission_grown, policy.admission_slack
    # The free blocks the head of ``waiting`` needs (``_head_blocks``); None: to be worked out again.
    # What it depends on (the queue, its head's tokens, the decoders, the running count) moves
    # only at the steps that set ``changed``: a general step, a finish.
    head_need: int | None = None
    n = base = computed = 0  # decoders, their Σ (computed − dec_tick), tokens computed in the stretch
    changed = True  # the state moved since the last level
    free = policy.free_blocks()  # read again after whatever moves it: acts, a general step, a finish
    j = 0
    while j < MAX_STEPS and t < next_arr:  # an arrival due: the driver releases it before the step
        T = dec.tick + 1
        if changed or dec.explicit:
            general = bool(dec.explicit) or not 0 < dec.count <= budget
            ends = None if general else crossing.pop(T, None)
        else:  # only acts can be due: the decoders and the budget are the last level's, not general
            general = False
            ends = crossing.pop(T, None)
        if changed or ends is not None or general:
            policy.steps = measured0 + j
            if not general:
                if ends:
                    tick = dec.tick
                    # An act takes at most one block a group: within that bound the acts fit unasked
                    # (stale events counted too); beyond it they may not fit (preemptions, event by
                    # event: the fast path's step, which takes these events back).
                    if len(ends) * groups > free:
                        acting = dec.live(ends)
                        for s in acting:
                            dec.materialize(s)
                        general = policy.acts_need(acting)[0] > free
                        if general:
                            crossing[T] = ends
                    if not general:
                        # The acting decoders allocate (all of them fit) and file their next act:
                        # in any order, or in running order where the policy keeps block ids.
                        if ordered:
                            if len(ends) > 1:
                                ends.sort(key=_RUN_POS_OF_EVENT)
                            if ledger is not None:
                                ledger.now = (step0 + j, t)
                        for s, epoch in ends:
                            if s.epoch == epoch and s.dec_tick >= 0:  # ``Decoders.live``, ``materialize``d
                                k = tick - s.dec_tick
                                c = s.num_computed = s.num_computed + k
                                out = s.num_output = s.num_output + k
                                s.dec_tick = tick
                                nxt = act(s) - c + T
                                if nxt <= s.output_len - out + tick:
                                    crossing[nxt].append((s, epoch))
                        if ordered and policy.evictions != sched._evictions_seen:
                            evicted.append((j, sched.take_evictions()))  # the first of the step's
                if not general:
                    free = policy.free_blocks()
                    if waiting:
                        if not ordered:  # counts: the need moves only where a level ends
                            if head_need is None:
                                head_need = _head_blocks(sched, dec, policy)
                        else:  # block ids: worked out again where it may have moved and may now fit
                            if head_need is None or policy.admission_epoch != epoch_seen:
                                again = True
                            elif head_need >= 0 and (
                                policy.admission_grown != grown_seen or policy.admission_slack != slack_seen
                            ):  # the last need less what it may have fallen by is a lower bound
                                again = head_need - (policy.admission_slack - slack_seen) <= free
                            else:
                                again = False
                            if again:
                                head_need = _head_blocks(sched, dec, policy)
                                epoch_seen, grown_seen = policy.admission_epoch, policy.admission_grown
                                slack_seen = policy.admission_slack
                        assert head_need is not None
                        # An admission after the acts: the fast path's step takes the rest of this
                        # one, its crossers done (popped above).
                        general = 0 <= head_need - (policy.admission_slack - slack_seen) <= free
            if general:
                if not (sched.running or waiting):
                    break  # idle: the driver moves the clock on to the next arrival
                # The fast path's own step (``FastScheduler.schedule``), recorded as a level.
                sched.used_positions += computed
                computed = 0
                sched.now, sched.step_index = t, step0 + j
                plan = sched.schedule()
                work = plan.work
                levels.add(sched, policy, j, work.scheduled_tokens)
                for col, value in (
                    (R.ADMITTED, plan.admitted),
                    (R.PREEMPTED, len(plan.preempted)),
                    (R.PREFIX_HIT, plan.prefix_hit_tokens),
                    (R.RECOMPUTED_HIT, plan.recomputed_hit_tokens),
                ):
                    if value:
                        events[col].append((j, value))
                if ordered and policy.evictions != sched._evictions_seen:  # added to the acts' ones
                    ev = sched.take_evictions()
                    if evicted and evicted[-1][0] == j:
                        ev += evicted.pop()[1]
                    evicted.append((j, ev))
                ts.append(t)
                policy.steps = measured0 + j + 1  # the frees' lines are drawn for the next step measured
                done = sched.finish_step(plan)
                if done:
                    finished.append((j, len(done)))
                t = sched.now
                next_arr = pending[0].arrival_s if pending else math.inf
                changed = True
                head_need = None
                free = policy.free_blocks()
                j += 1
                if not work.scheduled_tokens:
                    break  # a step without work: the driver's livelock guard sees the next
                continue
            if changed:
                n, base = dec.count, dec.dec_sum
                levels.add(sched, policy, j, n)
                changed = False
            else:
                act_levels += (j, num_blocks - free, cached_free() if ordered else 0, *sums)
        # The step: every decoder computes one token.
        dec.tick = T
        ts.append(t)
        if second:
            t = t + 1.0
        else:
            ctx = base + T * n
            dt = price.step(n, ctx, ctx, n)
            t = t + (dt + take(n, n) if take is not None else dt)
        computed += n
        ends = finishing.pop(T, None)
        if ends:  # the decoders that sampled their last token, freed in running order
            done = dec.live(ends)
            if done:
                sched.now = t
                policy.steps = measured0 + j + 1
                if ledger is not None:
                    ledger.now = (step0 + j, ts[-1])
                sched.used_positions += computed
                computed = 0
                for s in done:
                    dec.unregister(s)
                done.sort(key=_RUN_POS)
                sched._retire(done)  # the reference's free, as ``finish_step`` calls it
                finished.append((j, len(done)))
                changed = True
                head_need = None
                free = policy.free_blocks()
                next_arr = pending[0].arrival_s if pending else math.inf  # a next turn, released
        j += 1
        if not changed:  # the steps before the next act or finish: only decoders run, and count
            T += 1
            j0 = j
            if second:
                while j < MAX_STEPS and t < next_arr and T not in crossing and T not in finishing:
                    ts.append(t)
                    t = t + 1.0
                    j += 1
                    T += 1
            else:
                while j < MAX_STEPS and t < next_arr and T not in crossing and T not in finishing:
                    ctx = base + T * n
                    ts.append(t)
                    dt = price.step(n, ctx, ctx, n)
                    t = t + (dt + take(n, n) if take is not None else dt)
                    j += 1
                    T += 1
            computed += n * (j - j0)
            dec.tick = T - 1
    sched.used_positions += computed
    policy.steps = measured0 + j
    sched.step_index = step0 + j
    if j == 0:
        return 0
    ts.append(t)
    sched.now = t
    _record(recorder, policy, step0, measured0, ts, levels, events)
    return j


class Levels:
    """The stretch's levels, one row each (``matrix``): from its first step on, until the next
    level, the blocks allocated, the cached free blocks, the group totals (``GroupCounts.sums``),
    then the step's scheduled tokens, running, waiting and external fragmentation. A stretch
    adds a level at every act, where only the blocks, cached blocks and totals move: those are
    kept as one flat list of ints, the scheduler's four fields only where a level is ``add``ed,
    and each act's level takes them from the last one added. The stretch appends an act's level
    to ``flat`` itself (its step, the blocks, the cached blocks, the totals)."""

    SCALARS: ClassVar[int] = 4  # the fields after the totals

    __slots__ = ("flat", "width", "totals", "marks")

    def __init__(self, policy: GroupCounts) -> None:
        self.flat: list[int] = []  # per level: its first step, the blocks, the cached free blocks, the totals
        self.totals = policy.sums  # live: a level copies them as they stand
        self.width = 3 + len(self.totals)
        self.marks: list[int] = []  # per level added: its index, then its four scheduler fields

    def add(self, sched: Scheduler[FastSeq], policy: GroupCounts, step: int, scheduled: int) -> None:
        """A level from ``step`` on, as the state stands after scheduling."""
        waiting = sched.waiting
        head = waiting[0] if waiting else None
        self.marks += (
            len(self.flat) // self.width,
            scheduled,
            len(sched.running),
            len(waiting),
            policy.external_frag(head),
        )
        self.flat += (step, policy.num_blocks - policy.free_blocks(), policy.cached_free_blocks(), *self.totals)

    def matrix(self) -> np.ndarray:
        """One row a level: its first step, the blocks, the cached free blocks, the totals, the
        scheduler's four fields."""
        rows = np.frombuffer(array("q", self.flat), dtype=np.int64).reshape(-1, self.width)
        marks = np.array(self.marks, dtype=np.int64).reshape(-1, 1 + self.SCALARS)
        last_added = np.searchsorted(marks[:, 0], np.arange(len(rows)), side="right") - 1
        return np.hstack((rows, marks[last_added, 1:]))


def _record(
    recorder: RunRecorder,
    policy: GroupCounts,
    step0: int,
    measured0: int,
    ts: list[float],
    levels: Levels,
    events: dict[int, list[tuple[int, int]]],
) -> None:
    """The stretch's step rows and KV cache group rows, from its levels, as the reference
    records them step by step (``SimEngine.step``, ``Scheduler.measure_values``)."""
    k = len(ts) - 1
    g = len(policy.groups)
    # One row per level (``Levels``): its first step, the blocks, the totals (per twin set the
    # line's constant and slope and the real blocks, last the internal bytes), four scalars.
    matrix = levels.matrix()
    per_level = np.repeat(matrix, np.diff(matrix[:, 0], append=k), axis=0)
    blocks = per_level[:, 1]
    cached = per_level[:, 2]
    per_total = per_level[:, 3 : -Levels.SCALARS]
    sched_tokens, running, waiting, external = per_level[:, -Levels.SCALARS :].T
    twin_of = np.array(policy.twin_of, dtype=np.intp) * 3  # each group's twin set's columns
    group_blocks = per_total[:, twin_of + 2]
    at = measured0 + 1 + np.arange(k, dtype=np.int64)  # each step's measure (``measure_use``'s count)
    group_used = per_total[:, twin_of] + per_total[:, twin_of + 1] * at[:, None]
    use = policy.use
    unit = use.unit
    used = group_used.sum(axis=1) // unit
    internal = per_total[:, -1] // unit
    alloc = blocks * use.layout.bytes_per_block // unit
    columns = {
        R.SCHEDULED: sched_tokens,
        R.RUNNING: running,
        R.WAITING: waiting,
        R.BLOCKS: blocks,
        R.ALLOCATED: alloc,
        R.USED: used,
        R.RESERVED: alloc - used - internal,
        R.INTERNAL: internal,
        R.EXTERNAL: external,
        R.FREE: policy.budget_positions - alloc,
        R.CACHED_FREE: cached,
    }
    recorder.add_step_rows(R.step_rows(step0, np.frombuffer(array("d", ts)), k, columns, events))
    kinds = [grp.kind for grp in policy.groups]
    recorder.add_kv_group_columns(
        np.repeat(np.arange(step0, step0 + k, dtype=np.int64), g),
        np.tile(np.arange(g, dtype=np.int32), k),
        kinds,
        group_blocks.ravel(),
        group_used.ravel(),
    )
    policy.last_groups = list(zip(group_blocks[-1].tolist(), group_used[-1].tolist()))
