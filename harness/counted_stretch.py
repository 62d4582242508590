"""Counted stretches: the paged fast path's run of many steps at once, through arrivals,
admissions, finishes and preemptions.

With block counts only (``CountingPagedPolicy``: ``paged`` and ``virtual-contiguous``
without prefix caching), a run of steps in which every running
request decodes needs no per-request work per step. Each decoder needs a new block every
``block_size`` ticks, so its crossings are an arithmetic progression (``CrossingPlan``);
the step's crossings are a count, its price the clock's formula (``Clock.price``), its row
seven running totals (rows are built once per stretch, ``bulk_rows.step_rows``). Only the
requests an event touches are touched:

- an **arrival** or a **waiting** request is admitted, first come first served, when its
  sequence fits ``max_num_seqs`` and memory (``must_fit``, as in ``Scheduler._admit``): it
  computes its prompt (re-admitted after a recompute preemption, its prompt and the tokens
  it had sampled; after a swap, only what it lacks) in one step, or, longer than the token
  budget left, in chunks — one request at a time prefills so, the tail of ``running`` —
  and decodes from the tick after. A head that does not fit blocks admission for the step,
  as in the reference;
- a **finish** frees the finisher at the end of its step;
- a step whose crossings do not fit the free blocks **preempts**: only then are the
  crossing decoders named (``CrossingPlan.crossers``); they ask for their block in running
  order, and each failure preempts from the tail of ``running`` (memory freed; recompute
  forgets the computed tokens, swap keeps them; to the front of ``waiting``) until the
  request fits or is itself preempted, which ends the step's scheduling. A prefilling
  tail whose next chunk does not fit preempts itself. Nothing is admitted in such a step.

The stretch ends before a step it cannot take whole — a request that would finish in its
admission step, or more decoders than the token budget — and the step-by-step path
(``FastScheduler.schedule``) takes that step. Equality with the reference scheduler is
tested record for record (``tests/test_fast_path.py``).
"""

from __future__ import annotations

import heapq
import math
from operator import attrgetter
from typing import TYPE_CHECKING

import numpy as np

from . import bulk_rows as R
from .policies.base import internal_of
from .decoders import Decoders
from .policies.paged import CountingPagedPolicy
from .sequence import RUNNING, WAITING, Seq

if TYPE_CHECKING:
    from .recorder import RunRecorder
    from .scheduler import Scheduler

MAX_STEPS = 8192  # steps per counted stretch (its rows are built at once)
WINDOW = 256  # ticks of crossings counted at a time, at most
FIRST_WINDOW = 32  # … and at first
_RUN_POS = attrgetter("run_pos")


class CrossingPlan:
    """Every decoder's block crossings over a stretch. A decoder that has computed ``computed``
    of its ``allocated`` positions by tick ``d`` needs a new block at ticks ``c``, ``c + bs``, …
    up to ``L``, its last crossing at or before its finish tick ``f``. Crossings are counted per
    tick for a window of ticks at a time (``counts[T − base]``); the internal fragmentation a
    last crossing adds is kept by tick (``internal_at``)."""

    __slots__ = ("bs", "base", "wend", "counts", "plans", "internal_at", "phases")

    def __init__(self, block_size: int, tick0: int) -> None:
        self.bs = block_size
        self.base = tick0 + 1  # counts[0] is this tick's
        self.wend = tick0  # ticks counted so far: (tick0, wend]
        self.counts: list[int] = []
        # decoder → (first crossing c, finish f, last crossing L, internal added at L)
        self.plans: dict[Seq, tuple[int, int, int, int]] = {}
        self.internal_at: dict[int, int] = {}
        # The decoders still to cross, by the tick's residue modulo bs at which they do: where
        # to look for the crossers of one tick (``crossers``) without scanning every decoder.
        self.phases: list[list[Seq]] = [[] for _ in range(block_size)]

    def add(self, s: Seq) -> None:
        """Plan a decoder from its implicit state (the fields ``Decoders.register`` set)."""
        bs = self.bs
        c = s.allocated - s.num_computed + s.dec_tick + 1
        f = s.output_len - s.num_output + s.dec_tick
        if c > f:
            self.plans[s] = (c, f, c - bs, 0)  # no crossing before it finishes
            return
        L = c + (f - c) // bs * bs
        before = s.allocated + (L - c) // bs * bs  # its allocation before the last crossing
        fl = s.prompt_len + s.output_len
        add = internal_of(before + bs, fl) - internal_of(before, fl)
        if add:
            self.internal_at[L] = self.internal_at.get(L, 0) + add
        self.plans[s] = (c, f, L, add)
        self.phases[c % bs].append(s)
        if c <= self.wend:
            counts, base = self.counts, self.base
            for x in range(c - base, min(L, self.wend) - base + 1, bs):
                counts[x] += 1

    def extend(self) -> int:
        """Count the next window of ticks: as many as counted so far (at least ``FIRST_WINDOW``,
        at most ``WINDOW``), since most stretches are short. Returns the window's last tick."""
        ws = self.wend
        size = min(WINDOW, max(FIRST_WINDOW, ws + 1 - self.base))
        self.wend = wend = ws + size
        counts, base, bs = self.counts, self.base, self.bs
        counts.extend([0] * size)
        for c, _, L, _ in self.plans.values():
            if L <= ws:
                continue
            x0 = c if c > ws else c + ((ws - c) // bs + 1) * bs
            for x in range(x0 - base, min(L, wend) - base + 1, bs):
                counts[x] += 1
        return wend

    def crossers(self, tick: int) -> list[Seq]:
        """The decoders crossing into a new block at ``tick``, in running order (those of its
        phase; the ones past their last crossing are forgotten on the way)."""
        plans = self.plans
        phase = self.phases[tick % self.bs]
        out, keep = [], []
        for s in phase:
            c, _, L, _ = plans[s]
            if L >= tick:
                keep.append(s)
                if c <= tick:
                    out.append(s)
        phase[:] = keep
        out.sort(key=_RUN_POS)
        return out

    def blocks_by(self, s: Seq, tick: int) -> int:
        """The blocks ``s`` has taken by crossings at ticks up to ``tick``."""
        c, _, L, _ = self.plans[s]
        last = L if L < tick else tick
        return (last - c) // self.bs + 1 if c <= last else 0

    def drop(self, s: Seq, tick: int) -> None:
        """Forget a decoder preempted at ``tick``: its crossings from ``tick`` on do not happen."""
        c, _, L, add = self.plans.pop(s)
        bs = self.bs
        phase = self.phases[c % bs]
        if s in phase:  # not yet forgotten by ``crossers`` (nor without a crossing at all)
            phase.remove(s)
        if L < tick:
            return
        if add:
            self.internal_at[L] -= add
        first = c if c >= tick else c + -(-(tick - c) // bs) * bs
        counts, base = self.counts, self.base
        for x in range(first - base, min(L, self.wend) - base + 1, bs):
            counts[x] -= 1

    def grow(self, end: int, crossing: dict[int, list[tuple[Seq, int]]]) -> tuple[int, int]:
        """Give each planned decoder the blocks its crossings up to tick ``end`` took, and
        re-register its next crossing after the stretch in ``crossing``. Returns (blocks
        taken, internal fragmentation added)."""
        bs = self.bs
        grown = internal_add = 0
        for s, (c, f, L, _) in self.plans.items():
            last = L if L < end else end
            if c > last:
                continue
            m = (last - c) // bs + 1
            a, fl = s.allocated, s.prompt_len + s.output_len
            s.allocated = a_end = a + m * bs
            if a_end > s.peak_allocated:
                s.peak_allocated = a_end
            internal_add += internal_of(a_end, fl) - internal_of(a, fl)
            grown += m
            nxt = c + m * bs
            if f > end and nxt <= L:
                crossing.setdefault(nxt, []).append((s, s.epoch))
        return grown, internal_add


def eligible(sched: Scheduler) -> bool:
    """Whether ``sched``'s runs can take counted stretches: block counts and a clock (not measured)."""
    return sched.clock is not None and isinstance(sched.policy, CountingPagedPolicy)


def _first_step_whole(sched: Scheduler, dec: Decoders, avail: int) -> bool:
    """False when the stretch's first step would admit a request it cannot take whole (in
    chunks, or finishing at once), so the stretch would end before it starts. Decided against
    an upper bound on the step's crossings (its crossing events, some perhaps stale): whatever
    fits then fits in the stretch, so False is never wrong; True may be (the stretch then
    ends at its first step, as it would have)."""
    waiting = sched.waiting
    crossers = dec.crossing.get(dec.tick + 1)
    av = avail - (len(crossers) if crossers else 0)
    if not waiting or av < 0:
        return True  # nothing to admit, or the step may preempt (then nothing is admitted)
    bs, cfg, mml = sched.policy.block_size, sched.config, sched.max_model_len
    budget = cfg.max_num_batched_tokens - dec.count
    r = len(sched.running)
    for s in waiting:
        if budget <= 0 or r >= cfg.max_num_seqs:
            return True
        tokens = s.prompt_len + s.num_output
        if -(-min(tokens, mml) // bs) > av:
            return True
        if s.output_len - s.num_output < 2 or s.prompt_len + s.output_len > mml:
            return False
        if tokens - s.num_computed > budget:
            return True  # admitted in chunks: the stretch takes it
        av -= -(-tokens // bs)
        budget -= tokens - s.num_computed
        r += 1
    return True


def run(sched: Scheduler, dec: Decoders, recorder: RunRecorder) -> int:
    """Run and record as many steps as can be taken whole (module docstring) from the state of
    ``sched`` (the fast path's), in which every running request decodes implicitly (``dec``);
    return how many (0: none)."""
    clock = sched.clock
    policy = sched.policy
    assert clock is not None and isinstance(policy, CountingPagedPolicy)  # eligible()
    price = clock.price
    bs = policy.block_size
    cfg = sched.config
    B, max_seqs, mml = cfg.max_num_batched_tokens, cfg.max_num_seqs, sched.max_model_len
    swap = sched.swap
    tick0 = dec.tick
    nn, dsum = dec.count, dec.dec_sum
    run = len(sched.running)
    avail = policy.free_blocks()
    blocks = policy.allocated_blocks()
    internal = policy.internal_positions
    excess = policy.shared_excess_positions
    used = sched.used_positions - excess
    # PagedPolicy.external_frag: the budget's tail no block fits, while anything waits.
    tail = policy.budget_positions - policy.num_blocks * bs
    waiting, pending = sched.waiting, sched.pending
    next_arr = pending[0].arrival_s if pending else math.inf
    heap, finishing = dec.finish_ticks, dec.finishing

    if not _first_step_whole(sched, dec, avail):
        return 0  # the step-by-step path takes it: not worth the plan's set-up
    plan = CrossingPlan(bs, tick0)
    for s in sched.running:
        plan.add(s)
    counts, internal_at = plan.counts, plan.internal_at
    taken = taken_internal = 0  # blocks (and internal positions) of admissions and victims' growth
    gone: set[int] = set()  # finished, still in sched.running until the stretch ends
    finishes: list[tuple[int, list[Seq], int, float]] = []

    prefilling: Seq | None = None  # admitted in chunks, still prefilling: the tail of running
    wend = tick0  # the ticks counted: (tick0, wend]
    blocked = False  # the head did not fit, and nothing has been freed or admitted since
    t = sched.now
    c_ts: list[float] = []
    c_blocks: list[int] = []
    c_internal: list[int] = []
    c_used: list[int] = []
    c_sched: list[int] = []
    c_run: list[int] = []
    c_wait: list[int] = []
    ev_fin: list[tuple[int, int]] = []
    ev_adm: list[tuple[int, int]] = []
    ev_pre: list[tuple[int, int]] = []
    j = 0
    while j < MAX_STEPS and nn <= B:
        T = tick0 + 1 + j
        if T > wend:
            wend = plan.extend()
        x = counts[j]
        if next_arr <= t:  # the driver releases the arrivals due before the step
            while pending and pending[0].arrival_s <= t:
                waiting.append(pending.popleft())
            next_arr = pending[0].arrival_s if pending else math.inf
        cand: list[Seq] | None = None
        chunk = 0  # tokens of the prefilling request (the tail of running) computed this step
        victims = 0
        if x > avail:
            # Memory runs out: the crossers ask in running order, victims from the tail (finished
            # requests still listed in ``running`` cross nothing and are passed over).
            running = sched.running
            for s in plan.crossers(T):
                if s.status != RUNNING:
                    break  # preempted as a victim of an earlier crosser: so is everything after it
                while avail == 0:
                    v = running.pop()
                    while id(v) in gone:
                        v = running.pop()
                    fl = v.prompt_len + v.output_len
                    if v is prefilling:
                        a = v.allocated  # exact: a prefilling request's blocks are not deferred
                        prefilling = None
                    else:
                        a = v.allocated + plan.blocks_by(v, T - 1) * bs
                        taken += a // bs - v.allocated // bs
                        taken_internal += internal_of(a, fl) - internal_of(v.allocated, fl)
                        plan.drop(v, T)
                        v.allocated = a
                        if a > v.peak_allocated:
                            v.peak_allocated = a
                        d = T - 1 - v.dec_tick
                        contrib = v.num_computed - v.dec_tick
                        v.num_computed += d
                        v.num_output += d
                        v.dec_tick = -1
                        v.epoch += 1
                        dec.count -= 1
                        dec.dec_sum -= contrib
                        nn -= 1
                        dsum -= contrib
                    run -= 1
                    avail += a // bs
                    blocks -= a // bs
                    internal -= internal_of(a, fl)
                    used -= v.num_computed
                    policy.free(v)  # growth deferred above is taken at the end with the others'
                    if not swap:
                        v.num_computed = 0
                    v.num_preemptions += 1
                    v.status = WAITING
                    waiting.appendleft(v)
                    victims += 1
                    if v is s:
                        break
                if s.status != RUNNING:
                    break
                avail -= 1
            x = counts[j]  # the crossers left: they took a block each
            if x:
                blocks += x
                internal += internal_at.get(T, 0)
        else:
            # Decided first, changed after: a step the stretch cannot take leaves no trace.
            av = avail - x  # free after this tick's crossings
            budget = B - nn
            grow = 0  # blocks the prefilling tail's next chunk takes
            if prefilling is not None and budget > 0:
                # The tail of running goes on with its prompt: as much of it as the budget allows.
                s = prefilling
                chunk = s.prompt_len + s.num_output - s.num_computed
                if chunk > budget:
                    chunk = budget
                grow = -(-(s.num_computed + chunk) // bs) - s.allocated // bs
                if grow > av:
                    chunk = grow = 0
                    victims = 1  # it does not fit: it preempts itself (the tail: nothing was admitted after it)
                else:
                    budget -= chunk
                    av -= grow
            if waiting and not blocked and not victims:  # admission, first come first served
                r = run
                whole = True
                cand = []
                for s in waiting:
                    if budget <= 0 or r >= max_seqs:
                        break
                    tokens = s.prompt_len + s.num_output
                    if -(-min(tokens, mml) // bs) > av:
                        # It does not fit (must_fit): it is the head next step, with no more memory.
                        blocked = True
                        break
                    if s.output_len - s.num_output < 2 or s.prompt_len + s.output_len > mml:
                        whole = False  # finishing in its admission step, or longer than the model allows
                        break
                    left = tokens - s.num_computed  # all of it, but after a swap preemption
                    if left > budget:
                        cand.append(s)  # in chunks: it takes the rest of the budget
                        break
                    av -= -(-tokens // bs)
                    budget -= left
                    r += 1
                    cand.append(s)
                if not whole:
                    break  # the step-by-step path takes this step
            avail -= x
            blocks += x
            if x:
                internal += internal_at.get(T, 0)
            if victims:
                s = prefilling  # type: ignore[assignment]
                popped = sched.running.pop()
                assert popped is s
                a, fl = s.allocated, s.prompt_len + s.output_len
                run -= 1
                avail += a // bs
                blocks -= a // bs
                internal -= internal_of(a, fl)
                used -= s.num_computed
                policy.free(s)
                if not swap:
                    s.num_computed = 0
                s.num_preemptions += 1
                s.status = WAITING
                waiting.appendleft(s)
                prefilling = None
            elif chunk:
                s = prefilling  # type: ignore[assignment]
                if grow > 0:
                    fl = s.prompt_len + s.output_len
                    a = s.allocated + grow * bs
                    ia = internal_of(a, fl) - internal_of(s.allocated, fl)
                    s.allocated = a
                    if a > s.peak_allocated:
                        s.peak_allocated = a
                    avail -= grow
                    blocks += grow
                    internal += ia
                    taken += grow
                    taken_internal += ia
                s.num_computed += chunk
        if victims:
            ev_pre.append((j, victims))
            blocked = False

        # The step: every decoder's token, the prefill chunk, the admitted prompts.
        ctx = dsum + T * nn
        new = seqs = nn
        pairs = ctx
        if chunk:
            seqs += 1
            c = prefilling.num_computed  # type: ignore[union-attr]
            new += chunk
            ctx += c
            pairs += chunk * c
        if cand:
            budget = B - new
            for s in cand:
                waiting.popleft()
                comp = s.num_computed  # kept by a swap preemption, else 0 (no prefix caching here)
                n = s.prompt_len + s.num_output - comp
                if n > budget:
                    n = budget
                budget -= n
                nb = -(-(comp + n) // bs)
                a = nb * bs
                ia = internal_of(a, s.prompt_len + s.output_len)
                avail -= nb
                blocks += nb
                internal += ia
                taken += nb
                taken_internal += ia
                s.allocated = a
                if a > s.peak_allocated:
                    s.peak_allocated = a
                sched._append_running(s)
                s.status = RUNNING
                s.num_computed = c = comp + n
                if s.num_preemptions == 0:
                    s.first_scheduled_s = t
                used += comp
                new += n
                ctx += c
                pairs += n * c
            run += len(cand)
            seqs += len(cand)
            ev_adm.append((j, len(cand)))
        used += new
        c_ts.append(t)
        c_blocks.append(blocks)
        c_internal.append(internal)
        c_used.append(used)
        c_sched.append(new)
        c_run.append(run)
        c_wait.append(len(waiting))
        t_end = t + price(new, ctx, pairs, seqs)

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
                contrib = 0
                for s in live:
                    contrib += s.num_computed - s.dec_tick
                    a = s.allocated + plan.blocks_by(s, T) * bs
                    nbk = a // bs
                    blocks -= nbk
                    avail += nbk
                    internal -= internal_of(a, s.prompt_len + s.output_len)
                    used -= s.num_computed + T - s.dec_tick
                cnt = len(live)
                nn -= cnt
                dsum -= contrib
                run -= cnt
                gone.update(map(id, live))
                finishes.append((j, live, contrib, t_end))
                ev_fin.append((j, cnt))
                blocked = False
        if chunk or cand:
            carried = prefilling if chunk else None
            computed = [carried] if carried is not None else []
            if cand:
                computed += cand
            prefilling = None
            dec.tick = T
            for s in computed:  # sample, and decode implicitly from the next tick on
                if s.num_computed < s.prompt_len + s.num_output:
                    prefilling = s  # a chunk: no token yet (the last admitted, the tail of running)
                    if s is not carried:
                        dec.stretch_chunked += 1
                    continue
                s.num_output += 1
                if s.num_output == 1:
                    s.first_token_s = t_end
                dec.register(s)
                nn += 1
                dsum += s.num_computed - T
                plan.add(s)
            dec.tick = tick0
        t = t_end
        j += 1
        if nn == 0 and prefilling is None:
            break
    k = j
    if k == 0:
        return 0

    # The state after k steps: every decoder's crossings up to then, the finishers freed.
    end = tick0 + k
    crossing = dec.crossing
    for tk in range(tick0 + 1, end + 1):
        crossing.pop(tk, None)
    grown, internal_add = plan.grow(end, crossing)
    policy.take_blocks(grown + taken, internal_add + taken_internal)
    for jj, live, contrib, end_s in finishes:
        dec.finish(live, tick0 + 1 + jj, end_s, contrib, policy)
        sched.finished += len(live)
    if gone:
        sched.running = [s for s in sched.running if id(s) not in gone]
    dec.explicit = [prefilling] if prefilling is not None else []
    assert (policy.free_blocks(), policy.internal_positions, len(sched.running)) == (avail, internal, run), \
        "a counted stretch drifted from the policy's counts"

    c_ts.append(t)
    cols = np.array((c_blocks, c_internal, c_used, c_sched, c_run, c_wait), dtype=np.float64)
    evicted = policy.evictions - sched._evictions_seen
    sched._evictions_seen = policy.evictions
    rows = R.step_rows(sched.step_index, np.array(c_ts), k, {
        R.BLOCKS: cols[0], R.INTERNAL: cols[1], R.USED: cols[2], R.SCHEDULED: cols[3], R.RUNNING: cols[4],
        R.WAITING: cols[5], R.EXTERNAL: (cols[5] > 0) * float(tail),
    }, {R.FINISHED: ev_fin, R.ADMITTED: ev_adm, R.PREEMPTED: ev_pre, R.EVICTED: [(0, evicted)]})
    R.paged_allocation(rows, bs, policy.budget_positions)
    recorder.add_step_rows(rows)
    dec.stretch_admissions += sum(cnt for _, cnt in ev_adm)
    dec.tick = end
    sched.used_positions = used + excess
    sched.now = t
    sched.step_index += k
    return k
