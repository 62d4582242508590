"""Decoding stretches over vLLM's KV cache groups: the fast path's run of steps, recorded at once,
for a policy of several block tables per request (``CountingGroupedPolicy``).

A step is taken here when only decoders run (no prompt in flight, no arrival due, no more
decoders than the token budget), no waiting request is admitted in it and the blocks its
acting decoders ask for fit the free ones whatever their own frees. It is the fast path's
simple step (``FastScheduler.schedule``): each decoder whose ``reach`` ends acts (``allocate``,
in any order: all of them fit) and files its next act; the others only count. The step's
measures are the policy's running totals (O(groups)); its decoders that sample their last
token are freed at its end in running order. Its step row and KV cache group rows are kept
and recorded once per stretch (``bulk_rows.step_rows``), so a step costs a few operations
plus its acts and finishes, whatever the batch.

The stretch ends before a step that does not qualify: a waiting request the step would
admit (its blocks counted after the acts' frees and takes, exactly as ``allocate`` counts
them), acts that may not fit (the step-by-step path preempts), a prompt in flight, an
arrival due. Equality with the reference scheduler is tested record for record
(``tests/test_fast_path_hybrid.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from . import bulk_rows as R
from .decoders import FastSeq
from .policies.counting_grouped import CountingGroupedPolicy
from .scheduling_rule import admission_open

if TYPE_CHECKING:
    from ..records.recorder import RunRecorder
    from .fast_scheduler import FastScheduler

MAX_STEPS = 8192  # steps per stretch (its rows are built at once)
# The step columns ``Scheduler.measure_values`` gives that move in a stretch, in its order
# (external fragmentation stays put; nothing is evicted or cached without prefix caching).
_MEASURED = (R.RUNNING, R.WAITING, R.BLOCKS, R.ALLOCATED, R.USED, R.RESERVED, R.INTERNAL)


def _head_blocks(sched: FastScheduler, policy: CountingGroupedPolicy) -> int:
    """The free blocks (after the step's acts) the head of ``waiting`` needs to be admitted,
    with the budget the decoders leave (``Scheduler.admit_waiting``'s test); −1: the step
    admits nothing whatever is free."""
    budget = sched.config.max_num_batched_tokens - sched.dec.count
    if not admission_open(budget, len(sched.running), sched.config.max_num_seqs):
        return -1
    head = sched.waiting[0]
    _, target, must_fit = sched.admission(head, budget)
    return policy.admission_blocks(head, target, must_fit)


def run(sched: FastScheduler, policy: CountingGroupedPolicy, recorder: RunRecorder) -> int:
    """Take and record the steps that qualify from the state of ``sched`` (module docstring);
    return how many (0: the next step goes one by one)."""
    dec = sched.dec
    clock = sched.clock
    if clock is None or dec.explicit or not dec.count:
        return 0
    budget = sched.config.max_num_batched_tokens
    price, take = clock.price, clock.take
    waiting, pending, crossing, finishing = sched.waiting, sched.pending, dec.crossing, dec.finishing
    kinds = [g.kind for g in policy.groups]
    step0 = sched.step_index
    t = sched.now
    ts: list[float] = []
    values: list[tuple[int, ...]] = []
    scheduled: list[int] = []
    finished: list[tuple[int, int]] = []
    group_rows: list[tuple[int, int, str, int, int]] = []
    head_key: tuple[FastSeq, int, int] | None = None  # what ``head_need`` was worked out for
    head_need = -1
    # The step columns that stay put while only decoders run: their row is the policy's measures.
    use = policy.use
    bpb, unit = use.layout.bytes_per_block, use.unit
    external = policy.external_frag(waiting[0]) if waiting else 0
    num_blocks, budget_positions = policy.num_blocks, policy.budget_positions
    j = 0
    while j < MAX_STEPS and 0 < dec.count <= budget and not dec.explicit:
        if pending and pending[0].arrival_s <= t:
            break  # the driver releases it before the step
        T = dec.tick + 1
        events = crossing.get(T)
        acting = dec.live(events) if events else []
        for s in acting:
            dec.materialize(s)
        free = policy.free_blocks()
        if acting:
            if policy.crossing_need(acting) > free:
                break  # they may not fit: the step-by-step path preempts event by event
            free -= policy.crossing_net(acting)
        if waiting:
            key = (waiting[0], dec.count, len(sched.running))
            if key != head_key:
                head_key, head_need = key, _head_blocks(sched, policy)
            if 0 <= head_need <= free:
                break  # an admission: the step-by-step path takes it
        # The step: the acting decoders allocate, every decoder computes one token.
        crossing.pop(T, None)
        for s in acting:
            s.dec_tick = dec.tick
            policy.allocate(s, s.num_computed + 1)
            nxt = policy.reach(s) - s.num_computed + dec.tick + 1
            if nxt <= s.output_len - s.num_output + dec.tick:
                crossing[nxt].append((s, s.epoch))
        dec.tick = T
        n = dec.count
        ctx = dec.dec_sum + T * n
        sched.used_positions += n
        used, internal = policy.measure_use()
        blocks = num_blocks - policy.free_blocks()
        alloc = blocks * bpb // unit
        row = (len(sched.running), len(waiting), blocks, alloc, used, alloc - used - internal, internal)
        step = step0 + j
        group_rows.extend((step, i, kinds[i], b, u) for i, (b, u) in enumerate(policy.last_groups))
        ts.append(t)
        values.append(row)
        scheduled.append(n)
        t = t + price(n, ctx, ctx, n) + take(n, n)
        sched.now = t
        # The end of the step: the decoders that sampled their last token, freed in running order.
        ends = finishing.pop(T, None)
        done = dec.live(ends) if ends else []
        if done:
            for s in done:
                dec.unregister(s)
            done.sort(key=lambda s: s.run_pos)
            sched._retire(done)  # the reference's free, as ``finish_step`` calls it
            finished.append((j, len(done)))
        j += 1
    if j == 0:
        return 0
    ts.append(t)
    cols = np.array(values, dtype=np.int64)
    columns: dict[int, np.ndarray] = {c: cols[:, i] for i, c in enumerate(_MEASURED)}
    columns[R.SCHEDULED] = np.array(scheduled, dtype=np.int64)
    columns[R.FREE] = budget_positions - columns[R.ALLOCATED]
    columns[R.EXTERNAL] = np.full(j, external, dtype=np.int64)
    recorder.add_step_rows(R.step_rows(step0, np.array(ts), j, columns, {R.FINISHED: finished}))
    recorder.add_kv_groups(group_rows)
    sched.step_index += j
    return j
