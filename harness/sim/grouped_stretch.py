"""Stretches over vLLM's KV cache groups: the fast path's run of steps, recorded at once, for a
policy of several block tables per request (``CountingGroupedPolicy``).

A *plain* step — only decoders run, none acts (``reach``) or finishes, nothing is admitted —
only counts: its time is the clock's formula, its row the level the last event left. A step's
acts are taken here when their new blocks fit the free ones whatever their own frees: each
acting decoder ``act``s (in any order: all of them fit) and files its next act. If the waiting
head then fits in the free blocks (``allocate``'s test), the rest of the step, its admission,
is the fast path's own, which finds no crossers left; otherwise the decoders that sample their
last token are freed at the step's end in running order. Every other step — a prompt chunk, a
preemption, more decoders than the token budget — is the fast path's own
(``FastScheduler.schedule`` and ``finish_step``). Each non-plain step starts a *level*: the
step columns and the policy's group totals (``CountingGroupedPolicy.totals``) from that step
on; a step's used bytes per group are its level's ``const + slope × step``. The step rows and
KV cache group rows are built from the levels once per stretch (``bulk_rows.step_rows``).

A stretch ends where the driver must act: an arrival due, nothing left to run, a step that
computed nothing, or ``MAX_STEPS``. Equality with the reference scheduler is tested record for
record (``tests/sim/test_fast_path_hybrid.py``).
"""

from __future__ import annotations

import math
from array import array
from operator import attrgetter
from typing import TYPE_CHECKING

import numpy as np

from ..clock.clocks import Clock
from . import bulk_rows as R
from .decoders import Decoders, FastSeq
from .policies.counting_grouped import CountingGroupedPolicy
from .scheduling_rule import admission_open

if TYPE_CHECKING:
    from ..records.recorder import RunRecorder
    from .scheduler import Scheduler

MAX_STEPS = 8192  # steps per stretch (its rows are built at once)
_RUN_POS = attrgetter("run_pos")


def _head_blocks(sched: Scheduler[FastSeq], dec: Decoders, policy: CountingGroupedPolicy) -> int:
    """The free blocks (after the step's acts) the head of ``waiting`` needs to be admitted,
    with the budget the decoders leave (``Scheduler.admit_waiting``'s test); −1: the step
    admits nothing whatever is free."""
    budget = sched.config.max_num_batched_tokens - dec.count
    if not admission_open(budget, len(sched.running), sched.config.max_num_seqs):
        return -1
    head = sched.waiting[0]
    _, target, must_fit = sched.admission(head, budget)
    return policy.admission_blocks(head, target, must_fit)


def run(sched: Scheduler[FastSeq], dec: Decoders, policy: CountingGroupedPolicy, recorder: RunRecorder) -> int:
    """Take and record steps from the state of ``sched`` (the fast path's, its decoders ``dec``;
    module docstring); return how many (0: the next step goes one by one)."""
    clock = sched.clock
    if clock is None or not (sched.running or sched.waiting):
        return 0
    budget = sched.config.max_num_batched_tokens
    price = clock.price
    act = policy.act
    groups = len(policy.groups)
    take = clock.take if type(clock).take is not Clock.take else None  # a clock with memory
    waiting, pending, crossing, finishing = sched.waiting, sched.pending, dec.crossing, dec.finishing
    next_arr = pending[0].arrival_s if pending else math.inf
    step0, measured0 = sched.step_index, policy.steps
    t = sched.now
    ts: list[float] = []
    levels = Levels(len(policy.totals()))
    events: dict[int, list[tuple[int, int]]] = {
        c: [] for c in (R.FINISHED, R.ADMITTED, R.PREEMPTED, R.PREFIX_HIT, R.RECOMPUTED_HIT)
    }
    finished = events[R.FINISHED]
    # The free blocks the head of ``waiting`` needs (``_head_blocks``); None: to be worked out again.
    # What it depends on (the queue, its head's tokens, the decoders, the running count) moves
    # only at the steps that set ``changed``: a general step, a finish.
    head_need: int | None = None
    n = base = computed = 0  # decoders, their Σ (computed − dec_tick), tokens computed in the stretch
    changed = True  # the state moved since the last level
    j = 0
    while j < MAX_STEPS and t < next_arr:  # an arrival due: the driver releases it before the step
        T = dec.tick + 1
        if changed or dec.explicit or T in crossing:
            general = bool(dec.explicit) or not 0 < dec.count <= budget
            policy.steps = measured0 + j
            if not general:
                acting: list[FastSeq] = []
                ends = crossing.get(T)
                if ends:
                    tick = dec.tick
                    for s, epoch in ends:  # ``Decoders.live``, each ``Decoders.materialize``d
                        if s.epoch == epoch and s.dec_tick >= 0:
                            k = tick - s.dec_tick
                            s.num_computed += k
                            s.num_output += k
                            s.dec_tick = tick
                            acting.append(s)
                # An act takes at most one block a group: within that bound the acts fit unasked;
                # beyond it they may not fit (preemptions, event by event: the fast path's step).
                if acting and len(acting) * groups > policy.free_blocks():
                    general = policy.acts_need(acting)[0] > policy.free_blocks()
                if not general:
                    # The acting decoders allocate (all of them fit, in any order) and file their next act.
                    crossing.pop(T, None)
                    tick = dec.tick
                    for s in acting:
                        nxt = act(s) - s.num_computed + tick + 1
                        if nxt <= s.output_len - s.num_output + tick:
                            crossing[nxt].append((s, s.epoch))
                    if waiting:
                        if head_need is None:
                            head_need = _head_blocks(sched, dec, policy)
                        # An admission after the acts: the fast path's step takes the rest of this
                        # one, its crossers done (popped above).
                        general = 0 <= head_need <= policy.free_blocks()
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
                ts.append(t)
                done = sched.finish_step(plan)
                policy.steps = measured0 + j + 1
                if done:
                    finished.append((j, len(done)))
                t = sched.now
                next_arr = pending[0].arrival_s if pending else math.inf
                changed = True
                head_need = None
                j += 1
                if not work.scheduled_tokens:
                    break  # a step without work: the driver's livelock guard sees the next
                continue
            n, base = dec.count, dec.dec_sum
            levels.add(sched, policy, j, n)
            changed = False
        # The step: every decoder computes one token.
        dec.tick = T
        ctx = base + T * n
        ts.append(t)
        dt = price(n, ctx, ctx, n)
        t = t + (dt + take(n, n) if take is not None else dt)
        computed += n
        ends = finishing.pop(T, None)
        if ends:  # the decoders that sampled their last token, freed in running order
            done = dec.live(ends)
            if done:
                sched.now = t
                sched.used_positions += computed
                computed = 0
                for s in done:
                    dec.unregister(s)
                done.sort(key=_RUN_POS)
                sched._retire(done)  # the reference's free, as ``finish_step`` calls it
                finished.append((j, len(done)))
                changed = True
                head_need = None
                next_arr = pending[0].arrival_s if pending else math.inf  # a next turn, released
        j += 1
        if not changed:  # the steps before the next act or finish: only decoders run, and count
            T += 1
            while j < MAX_STEPS and t < next_arr and T not in crossing and T not in finishing:
                ctx = base + T * n
                ts.append(t)
                dt = price(n, ctx, ctx, n)
                t = t + (dt + take(n, n) if take is not None else dt)
                computed += n
                j += 1
                T += 1
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
    """The stretch's levels as one flat list of ints, a level's fields side by side (``WIDTH``
    of them, then ``CountingGroupedPolicy.totals``): from its first step on, until the next
    level, the step's scheduled tokens, running, waiting, blocks allocated and external
    fragmentation, and the group totals. Flat, because a stretch adds a level at every act and
    a flat list becomes one array in C."""

    WIDTH = 6  # the fields before the totals

    __slots__ = ("flat", "width")

    def __init__(self, totals: int) -> None:
        self.flat: list[int] = []
        self.width = self.WIDTH + totals

    def add(self, sched: Scheduler[FastSeq], policy: CountingGroupedPolicy, step: int, scheduled: int) -> None:
        """A level from ``step`` on, as the state stands after scheduling."""
        waiting = sched.waiting
        flat = self.flat
        flat += (
            step,
            scheduled,
            len(sched.running),
            len(waiting),
        )
        flat += policy.level(waiting[0] if waiting else None)

    def matrix(self) -> np.ndarray:
        """One row a level."""
        return np.frombuffer(array("q", self.flat), dtype=np.int64).reshape(-1, self.width)


def _record(
    recorder: RunRecorder,
    policy: CountingGroupedPolicy,
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
    # One row per level (``Levels``): its first step, five scalars, then the totals (per twin set
    # the line's constant and slope and the real blocks, last the internal bytes); per step.
    matrix = levels.matrix()
    repeats = np.diff(matrix[:, 0], append=k)
    per_step = np.repeat(matrix[:, : Levels.WIDTH], repeats, axis=0)
    per_total = np.repeat(matrix[:, Levels.WIDTH :], repeats, axis=0)
    sched_tokens, running, waiting, blocks = per_step[:, 1], per_step[:, 2], per_step[:, 3], per_step[:, 4]
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
        R.EXTERNAL: per_step[:, 5],
        R.FREE: policy.budget_positions - alloc,
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
