"""Counted stretches: the fast path's run of many steps at once, through arrivals (open and
closed loop), admissions, prompt chunks, finishes and preemptions.

Where memory is block counts (``CountingPagedPolicy``; ``paged-prefix`` as
``SharedPrefixPolicy`` or ``CountingPrefixPolicy``) or a contiguous reservation made at
admission (``ContiguousPolicy``, either arena, either unit), a run of steps in which every
running request decodes needs no per-request work per step: each decoder's block crossings
are an arithmetic progression (``CrossingPlan``), the step's price the clock's formula
(``StepPrice``), its row a few running totals (``bulk_rows.StepLog``): a *plain* step costs a
few operations (``Stretch._count_crossings``; a contiguous policy's run to the next finish, at
once: ``Stretch._glide``). What an event touches goes through the policy and the reference's rules:

- an **arrival** is released at the step the driver would release it (a conversation's next
  turn too, filed when the turn before it finishes inside the stretch);
- **waiting** requests are admitted by the reference's rule (``scheduling_rule.admit_waiting``),
  the last perhaps in chunks (the prefilling request is the tail of ``running``); one with a
  single token to sample finishes at once; a head refused for memory is not tried again until
  memory is freed or a prompt chunk caches blocks;
- a **finish** frees the finisher at the end of its step, in running order; a step whose
  crossings do not fit **preempts**: crossers (``CrossingPlan.crossers``) ask in running
  order, victims come from the tail; a prefilling tail whose next chunk does not fit preempts
  itself; nothing is admitted in such a step.

It ends after ``MAX_STEPS``, before a step with more decoders than the token budget, or when
nothing is left; docs/design.md ("The simulator's fast path") has the rules that keep it exact."""

from __future__ import annotations

import bisect
import heapq
import math
from operator import attrgetter
from typing import TYPE_CHECKING

from ..clock.clocks import Clock
from . import bulk_rows as R
from .decoders import Decoders, FastSeq
from .policies.base import internal_of
from .policies.contiguous import ContiguousPolicy
from .policies.paged import CountingPagedPolicy
from .scheduling_rule import admission, admission_must_fit, admission_open, admit_waiting, preempt_until_fits
from .sequence import FINISHED, RUNNING, WAITING
from .step_price import StepPrice

if TYPE_CHECKING:
    from ..records.recorder import RunRecorder
    from .scheduler import Scheduler

MAX_STEPS = 8192  # steps per counted stretch (its rows are built at once)
_RUN_POS = attrgetter("run_pos")


class CrossingPlan:
    """Every decoder's block crossings over a stretch. A decoder that has computed ``computed``
    of its ``allocated`` positions by tick ``d`` needs a new block at ticks ``c``, ``c + bs``, …
    up to ``L``, its last crossing at or before its finish tick ``f``: one arithmetic
    progression, so the decoders crossing at tick ``T`` are those of ``T``'s phase (``T`` mod
    ``bs``) whose progression covers ``T``. Their count is kept per phase as it was at the
    phase's last tick counted (``now``) and moved on by the changes filed at the ticks where a
    progression starts or ends (``delta``): adding or dropping a decoder is O(1), whatever
    the stretch's length. The internal fragmentation a last crossing adds is kept by tick
    (``internal_at``)."""

    __slots__ = ("bs", "now", "delta", "plans", "internal_at", "phases")

    def __init__(self, block_size: int) -> None:
        self.bs = block_size
        self.now = [0] * block_size  # per phase: the crossings at its last tick counted
        self.delta: dict[int, int] = {}  # tick → its count less its phase's previous tick's
        # decoder → (first crossing c, finish f, last crossing L, internal added at L)
        self.plans: dict[FastSeq, tuple[int, int, int, int]] = {}
        self.internal_at: dict[int, int] = {}
        # The decoders still to cross, by phase: where to name the crossers of one tick
        # (``crossers``) without scanning every decoder. Dicts, for O(1) removal.
        self.phases: list[dict[FastSeq, None]] = [{} for _ in range(block_size)]

    def add(self, s: FastSeq) -> None:
        """Plan a decoder from its implicit state (the fields ``Decoders.start`` set); its first
        crossing is after the last tick counted."""
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
        self.phases[c % bs][s] = None
        delta = self.delta
        delta[c] = delta.get(c, 0) + 1
        delta[L + bs] = delta.get(L + bs, 0) - 1

    def count(self, tick: int) -> int:
        """The crossings at ``tick``, the tick after the last counted (which it becomes)."""
        p = tick % self.bs
        self.now[p] = x = self.now[p] + self.delta.pop(tick, 0)
        return x

    def counted(self, tick: int) -> int:
        """The crossings at ``tick``, the last tick counted, as they stand now."""
        return self.now[tick % self.bs]

    def crossers(self, tick: int) -> list[FastSeq]:
        """The decoders crossing into a new block at ``tick``, in running order (those of its
        phase; the ones past their last crossing are forgotten on the way)."""
        plans = self.plans
        phase = self.phases[tick % self.bs]
        out, past = [], []
        for s in phase:
            c, _, L, _ = plans[s]
            if L < tick:
                past.append(s)
            elif c <= tick:
                out.append(s)
        for s in past:
            del phase[s]
        out.sort(key=_RUN_POS)
        return out

    def blocks_by(self, s: FastSeq, tick: int) -> int:
        """The blocks ``s`` has taken by crossings at ticks up to ``tick``."""
        c, _, L, _ = self.plans[s]
        last = L if L < tick else tick
        return (last - c) // self.bs + 1 if c <= last else 0

    def forget(self, s: FastSeq) -> None:
        """Forget a decoder that finished: every crossing of it is past (its progression's end
        is already filed)."""
        c = self.plans.pop(s)[0]
        self.phases[c % self.bs].pop(s, None)

    def drop(self, s: FastSeq, tick: int) -> None:
        """Forget a decoder preempted at ``tick``, the last tick counted: its crossings from
        ``tick`` on do not happen."""
        c, _, L, add = self.plans.pop(s)
        bs = self.bs
        self.phases[c % bs].pop(s, None)
        if L < tick:
            return
        if add:
            self.internal_at[L] -= add
        first = c if c >= tick else c + -(-(tick - c) // bs) * bs
        delta = self.delta
        if first == tick:
            self.now[tick % bs] -= 1
        else:
            delta[first] = delta.get(first, 0) - 1
        delta[L + bs] = delta.get(L + bs, 0) + 1

    def grow(self, end: int, crossing: dict[int, list[tuple[FastSeq, int]]], tick0: int) -> int:
        """Give each planned decoder the blocks its crossings up to tick ``end`` took (taken from
        the policy at each crossing), and file its next crossing after the stretch in
        ``crossing`` (a decoder that started decoding in the stretch, after ``tick0``, has none
        filed yet). Returns the internal fragmentation added."""
        bs = self.bs
        internal_add = 0
        for s, (c, f, L, _) in self.plans.items():
            last = L if L < end else end
            if c > last:
                if c <= L and s.dec_tick > tick0:
                    crossing.setdefault(c, []).append((s, s.epoch))
                continue
            m = (last - c) // bs + 1
            a, fl = s.allocated, s.prompt_len + s.output_len
            s.allocated = a_end = a + m * bs
            if a_end > s.peak_allocated:
                s.peak_allocated = a_end
            internal_add += internal_of(a_end, fl) - internal_of(a, fl)
            nxt = c + m * bs
            if f > end and nxt <= L:
                crossing.setdefault(nxt, []).append((s, s.epoch))
        return internal_add


def eligible(sched: Scheduler[FastSeq]) -> bool:
    """Whether ``sched``'s runs can take counted stretches: a clock (not measured), memory as block
    counts or contiguous reservations, and no request longer than the model allows (the workload
    drops those: a stretch never cuts an output short at ``max_model_len``)."""
    if sched.clock is None or not isinstance(sched.policy, (CountingPagedPolicy, ContiguousPolicy)):
        return False
    later = (s for follow in sched.arrivals.held.values() for s in follow)
    return all(s.prompt_len + s.output_len <= sched.max_model_len for s in (*sched.pending, *later))


class Stretch:
    """One counted stretch: the fast path's state it advances (``sched``, ``dec``), its crossing
    plan, the running totals the next step's row reads, and the rows so far (``log``). What
    touches requests — an admission, a prompt chunk, a preemption, a finish — is a method; a
    plain step (only decoders run: no prompt in flight, no admission possible, no arrival due,
    the crossings fit) only counts, in ``_plain``."""

    __slots__ = (
        "sched",
        "dec",
        "policy",
        "counting",
        "paged",
        "plan",
        "bs",
        "tick0",
        "free",
        "blocks",
        "alloc",
        "internal",
        "used",
        "running",
        "grown_internal",
        "prefilling",
        "seen",
        "log",
        "consts",
        "price",
        "glides",
    )

    def __init__(self, sched: Scheduler[FastSeq], dec: Decoders) -> None:
        policy = sched.policy
        self.sched, self.dec, self.policy = sched, dec, policy
        # The policy as block counts (paged, virtual-contiguous, paged-prefix); None: contiguous.
        self.counting = policy if isinstance(policy, CountingPagedPolicy) else None
        self.paged = self.counting is not None
        self.bs = policy.block_size
        self.tick0 = dec.tick
        # The totals as the next row reads them. ``free``: free blocks (paged; a contiguous
        # policy's decoders never cross, so 0 blocks always fit), current, as the policy's.
        self.free = self.counting.free_blocks() if self.counting is not None else 0
        self.blocks = policy.allocated_blocks()
        self.alloc = policy.allocated_positions
        self.internal = policy.internal_positions  # the policy's, plus the decoders' deferred growth
        self.used = sched.used_positions - policy.shared_excess_positions
        self.running = len(sched.running)
        # Internal fragmentation the deferred growth of the finished and preempted added (the
        # policy saw their blocks freed, never grown): told to the policy at the end.
        self.grown_internal = 0
        self.seen = policy.evictions - sched.pending_evictions()  # evictions in the rows so far
        # A request admitted in chunks, still prefilling: the tail of running (``record_quiet_steps``).
        self.prefilling: FastSeq | None = dec.explicit[0] if dec.explicit else None
        self.plan = CrossingPlan(self.bs)
        for s in sched.running:
            if s.dec_tick >= 0:
                self.plan.add(s)
        self.log = R.StepLog(self.bs if self.paged else 0)
        # What the plain steps read, fetched once (``_plain`` is entered at every event).
        clock = sched.clock
        assert clock is not None
        self.price = price = StepPrice(clock)
        # A contiguous policy's plain steps allocate nothing: priced and logged a run at once
        # (``_glide``), where the clock has no memory of the steps it priced.
        self.glides = self.counting is None and type(clock).take is Clock.take
        plan = self.plan
        self.consts = (
            price,
            clock.take if type(clock).take is not Clock.take else None,  # a clock with memory
            plan.now,
            plan.delta,
            plan.internal_at,
            self.bs,
            self.tick0,
            self.bs if self.paged else 0,  # positions per block crossed (contiguous: none cross)
            sched.waiting,
            sched.pending,
            dec.finish_ticks,
            self.log,
        )

    # -- events --------------------------------------------------------------------------
    def _refresh(self) -> None:
        """Read the allocation totals back from the policy after an event changed them."""
        counting = self.counting
        if counting is not None:
            self.free = free = counting.free_blocks()
            self.blocks = blocks = counting.num_blocks - free
            self.alloc = blocks * self.bs
        else:
            self.blocks = self.policy.allocated_blocks()
            self.alloc = self.policy.allocated_positions

    def _take(self, n: int) -> None:
        """``n`` free blocks taken by crossings (they fit): from the policy now, evicting as it must."""
        assert self.counting is not None
        self.free -= n
        self.counting.take(n)

    def _catch_up(self, s: FastSeq, tick: int) -> None:
        """Give decoder ``s`` the blocks its crossings up to ``tick`` took (taken from the policy then)."""
        m = self.plan.blocks_by(s, tick)
        if m:
            fl = s.prompt_len + s.output_len
            a0 = s.allocated
            s.allocated = a = a0 + m * self.bs
            if a > s.peak_allocated:
                s.peak_allocated = a
            self.grown_internal += internal_of(a, fl) - internal_of(a0, fl)

    def _release(self, s: FastSeq) -> None:
        """Free ``s``'s memory (its deferred growth already given) and count it out of the totals
        (the free blocks at once; blocks and positions allocated by the caller's ``_refresh``)."""
        policy = self.policy
        internal, shared = policy.internal_positions, policy.shared_excess_positions
        policy.free(s)
        self.internal += policy.internal_positions - internal
        self.used -= s.num_computed + policy.shared_excess_positions - shared
        if self.counting is not None:
            self.free = self.counting.free_blocks()

    def _retire(self, s: FastSeq, end_s: float) -> None:
        """``s`` sampled its last token in the step ending at ``end_s``: freed, out of ``running``,
        and the requests that follow it (a conversation's next turn) arrive from then on."""
        s.status = FINISHED
        s.finished_s = end_s
        self._release(s)
        sched = self.sched
        sched.running.remove(s)
        self.running -= 1
        sched.finished += 1
        sched.arrivals.finished(s, end_s)

    def _evict(self, v: FastSeq, tick: int) -> None:
        """Preempt ``v`` (already popped from the tail of ``running``) at ``tick``: a decoder is
        brought up to the tick before (its deferred growth given), the prefilling tail is exact;
        its memory is freed, recompute forgets its computed tokens, and it waits at the front."""
        if v is self.prefilling:
            self.prefilling = None
        else:
            self._catch_up(v, tick - 1)
            self.plan.drop(v, tick)
            self.dec.unregister(v, at=tick - 1)
        self.running -= 1
        self._release(v)
        if not self.sched.swap:
            v.num_computed = 0
        v.num_preemptions += 1
        v.status = WAITING
        self.sched.waiting.appendleft(v)

    def _preempt_crossers(self, tick: int) -> int:
        """Memory runs out at ``tick``: the crossers ask for their block in running order, and
        the preemption rule (``scheduling_rule.preempt_until_fits``) makes room over ``running``.
        Returns the victims."""
        victims: list[FastSeq] = []
        for s in self.plan.crossers(tick):
            if s.status != RUNNING:
                break  # preempted as a victim of an earlier crosser: so is everything after it
            if self.free == 0 and not preempt_until_fits(
                s, lambda: self.free > 0, self.sched.running.pop, lambda v: self._evict(v, tick), victims
            ):
                break
            self._take(1)
        if self.plan.counted(tick):  # the crossers left: each took a block
            self.internal += self.plan.internal_at.get(tick, 0)
        self._refresh()
        return len(victims)

    def _chunk(self, s: FastSeq, chunk: int) -> bool:
        """The prefilling tail computes ``chunk`` more prompt tokens, if its blocks fit."""
        policy = self.policy
        internal = policy.internal_positions
        if not policy.allocate(s, s.num_computed + chunk):
            return False
        self.internal += policy.internal_positions - internal
        s.num_computed += chunk
        return True

    def _admit(self, budget: int, t: float, scheduled: list[tuple[FastSeq, int]]) -> tuple[int, int, int]:
        """Admit waiting requests at ``t`` by the reference's own rule and policy calls
        (``scheduling_rule.admit_waiting``), into ``scheduled``; (admitted, hit tokens, recomputed hit tokens)."""
        sched, policy = self.sched, self.policy
        sched.now = t
        internal, shared = policy.internal_positions, policy.shared_excess_positions
        admitted, hits, recomputed, held = admit_waiting(
            sched.waiting,
            sched.running,
            policy,
            budget,
            sched.config.max_num_seqs,
            sched.max_model_len,
            t,
            scheduled,
            sched.admissions,
        )
        sched.admissions += admitted
        self.internal += policy.internal_positions - internal
        self.used += held - (policy.shared_excess_positions - shared)
        self.running += admitted
        self.dec.stretch_admissions += admitted
        return admitted, hits, recomputed

    def _finish(self, tick: int, end_s: float) -> int:
        """Decoders sampling their last token at ``tick`` (their step ending at ``end_s``): brought
        up to date (their deferred growth given) and freed now, in running order — the order of
        frees is the free queue's. Returns how many."""
        heap, finishing, dec = self.dec.finish_ticks, self.dec.finishing, self.dec
        live: list[FastSeq] = []
        while heap and heap[0] <= tick:
            if heapq.heappop(heap) == tick:
                lst = finishing.pop(tick, None)
                if lst:
                    live.extend(Decoders.live(lst))
        if not live:
            return 0
        if len(live) > 1:
            live.sort(key=_RUN_POS)
        for s in live:
            self._catch_up(s, tick)
            self.plan.forget(s)
            dec.unregister(s, at=tick)
            self._retire(s, end_s)
        self._refresh()
        return len(live)

    def _start_decoding(self, computed: list[FastSeq], tick: int, end_s: float) -> int:
        """The requests that computed prompt tokens at ``tick``: those whose prompt is done sample
        their token and decode implicitly from the next tick on (or finish, freed after the
        decoders that finished with them: running order); one still short of it stays the
        prefilling tail. Returns how many finished."""
        dec = self.dec
        carried, self.prefilling = self.prefilling, None
        done = 0
        for s in computed:
            if s.num_computed < s.prompt_len + s.num_output:
                self.prefilling = s  # a chunk: no token yet (the last admitted, the tail of running)
                if s is not carried:
                    dec.stretch_chunked += 1
                continue
            s.num_output += 1
            if s.num_output == 1:
                s.first_token_s = end_s
            if s.num_output >= s.output_len:
                self._retire(s, end_s)
                done += 1
                continue
            dec.start(s, tick)
            self.plan.add(s)
        if done:
            self._refresh()
        return done

    # -- the loop --------------------------------------------------------------------------
    def _plain(self, j: int, t: float, next_arr: float, closed: bool) -> tuple[int, float, bool | None]:
        """Plain steps from the stretch's step ``j`` (starting at ``t``) while the next one is
        plain; a finish ends them (after its step) unless the head of ``waiting``, if any, stays
        refused. ``closed``: requests wait and none can be admitted until something finishes,
        so arrivals only join them. Returns the step and time reached, and whether the head is
        refused for memory now (None: as it was)."""
        sched, policy, dec, log = self.sched, self.policy, self.dec, self.log
        waiting, pending = sched.waiting, sched.pending
        steps = self._glide if self.glides else self._count_crossings
        refused: bool | None = None
        while True:  # a run of plain steps, from the state the last event left
            external = policy.external_frag(waiting[0] if waiting else None)
            beyond = self.alloc - self.blocks * log.per_block
            n = dec.count
            log.level(j, n, self.running, len(waiting), external, self.internal, beyond, self.used + n)
            j, t, t_end, finishing = steps(j, t, next_arr, closed, external, beyond)
            if not finishing:
                return j, t, refused
            if sched.ledger is not None:
                sched.ledger.now = (sched.step_index + j - 1, t)
            done = self._finish(self.tick0 + j, t_end)
            log.event(R.FINISHED, j - 1, done)
            t = t_end
            if not dec.count:
                return j, t, False  # nothing is left to run
            if waiting:
                if self._head_fits():
                    return j, t, False  # the general step admits it
                closed = refused = True  # until the next finish, memory only shrinks
            next_arr = pending[0].arrival_s if pending else math.inf  # a next turn, released

    def _count_crossings(
        self, j: int, t: float, next_arr: float, closed: bool, external: int, beyond: int
    ) -> tuple[int, float, float, bool]:
        """Plain steps from step ``j`` (starting at ``t``), each counting its crossings' blocks
        (``CrossingPlan``), until one does not fit, an arrival may be admitted (not ``closed``),
        ``MAX_STEPS``, or decoders finish. Returns the step reached, its start (or the finishing
        step's), the finishing step's end, and whether decoders finish at it."""
        policy, counting, dec = self.policy, self.counting, self.dec
        price, extra, now, delta, internal_at, bs, tick0, per_block, waiting, pending, heap, log = self.consts
        c_ts, c_blocks, c_cached = log.ts.append, log.blocks.append, log.cached.append
        evicted, limit = log.evicted, MAX_STEPS
        free, blocks, internal, used = self.free, self.blocks, self.internal, self.used
        unc = counting.uncached_free() if counting is not None else 0
        cached = policy.cached_free_blocks()
        n, dec_sum = dec.count, dec.dec_sum
        fin = heap[0] if heap else -1
        taken = 0
        finishing = False
        t_end = t
        while j < limit:
            if t >= next_arr:  # the driver releases the arrivals due before the step
                if not closed:
                    break  # one may be admitted: the general step takes it
                while pending and pending[0].arrival_s <= t:
                    waiting.append(pending.popleft())
                next_arr = pending[0].arrival_s if pending else math.inf
                log.level(j, n, self.running, len(waiting), external, internal, beyond, used + n)
            T = tick0 + 1 + j
            p = T % bs
            d = delta.get(T)
            x = now[p] + d if d else now[p]
            if x > free:
                break  # a preemption: the general step takes it
            if d is not None:
                now[p] = x
                del delta[T]
            if x:
                free -= x
                blocks += x
                taken += x
                if x > unc:  # the uncached free blocks are gone: each block taken evicts one
                    evicted.append((j, x - unc))
                    cached -= x - unc
                    unc = 0
                else:
                    unc -= x
                ia = internal_at.get(T) if internal_at else None
                if ia:  # a decoder's last block: what it will never fill
                    internal += ia
                    log.level(j, n, self.running, len(waiting), external, internal, beyond, used + n)
            used += n
            c_ts(t)
            c_blocks(blocks)
            c_cached(cached)
            ctx = dec_sum + T * n
            dt = price.step(n, ctx, ctx, n)
            t_end = t + (dt + extra(n, n) if extra is not None else dt)
            j += 1
            if 0 <= fin <= T:
                finishing = True  # decoders finish at the end of this step
                break
            t = t_end
        self.free, self.blocks, self.internal, self.used = free, blocks, internal, used
        self.alloc = blocks * per_block + beyond
        if taken:
            self._flush_taken(taken)
        return j, t, t_end, finishing

    def _glide(
        self, j: int, t: float, next_arr: float, closed: bool, external: int, beyond: int
    ) -> tuple[int, float, float, bool]:
        """``_count_crossings`` for a contiguous policy on a clock without memory: nothing
        crosses (a reservation covers its request's whole life), so the steps up to the next
        finish are known before they are taken, priced at once (``StepPrice.decode_run``) and logged at once
        (``StepLog.steady``); arrivals are placed among them by their start times."""
        dec, log = self.dec, self.log
        n = dec.count
        T0 = self.tick0 + 1 + j
        m = MAX_STEPS - j
        heap = dec.finish_ticks
        if m <= 0:
            return j, t, t, False
        finishing = bool(heap) and heap[0] < T0 + m
        if finishing:
            m = max(heap[0] - T0 + 1, 1)  # a finish tick already past (its decoder gone) ends the first step
        times = self.price.decode_run(t, n, dec.dec_sum, T0, m)
        if next_arr <= times[m - 1]:  # the driver releases an arrival before one of these steps
            if not closed:
                m = bisect.bisect_left(times, next_arr, 0, m)  # it may be admitted: the general step takes it
                finishing = False
            else:
                waiting, pending = self.sched.waiting, self.sched.pending
                while next_arr <= times[m - 1]:
                    k = bisect.bisect_left(times, next_arr, 0, m)
                    while pending and pending[0].arrival_s <= times[k]:
                        waiting.append(pending.popleft())
                    next_arr = pending[0].arrival_s if pending else math.inf
                    used = self.used + n * (k + 1)
                    log.level(j + k, n, self.running, len(waiting), external, self.internal, beyond, used)
        log.steady(times, m, self.blocks, self.policy.cached_free_blocks())
        self.used += n * m
        if finishing:
            return j + m, times[m - 1], times[m], True
        return j + m, times[m], times[m], False

    def _head_fits(self) -> bool:
        """Whether the head of ``waiting`` could be admitted now, before the next step's crossings
        take their blocks (so False stays False through them): room under ``max_num_seqs`` and
        the token budget, and memory for it as ``scheduling_rule.admit_waiting`` asks."""
        sched = self.sched
        budget = sched.config.max_num_batched_tokens - self.dec.count
        if not admission_open(budget, self.running, sched.config.max_num_seqs):
            return False
        if self._below_floor():
            return False
        head = sched.waiting[0]
        _, target, must_fit = admission(self.policy, head, budget, sched.max_model_len)
        return self.policy.can_allocate(head, target, must_fit=must_fit)

    def _below_floor(self) -> bool:
        """Whether the free blocks are fewer than any admission of the head of ``waiting`` needs
        (``CountingPagedPolicy.admission_floor``): it is refused whatever the budget, as
        ``scheduling_rule.admit_waiting`` would refuse it, at the cost of a comparison."""
        counting = self.counting
        if counting is None:
            return False
        head = self.sched.waiting[0]
        must_fit = admission_must_fit(head.prompt_len + head.num_output, self.sched.max_model_len)
        return counting.admission_floor(head, must_fit) > self.free

    def _flush_taken(self, taken: int) -> None:
        """Take from the policy the blocks a run of plain steps counted (evicting what they
        counted as evicted: the same blocks in the same order, one call for the run)."""
        assert self.counting is not None
        self.seen += self.counting.take(taken)

    def run(self, recorder: RunRecorder) -> int:
        """Take steps while each can be taken whole (module docstring); record them; return how many."""
        sched, plan, policy, dec, log = self.sched, self.plan, self.policy, self.dec, self.log
        clock = sched.clock
        assert clock is not None
        price, extra = self.price, clock.take
        cfg = sched.config
        B, max_seqs = cfg.max_num_batched_tokens, cfg.max_num_seqs
        tick0 = self.tick0
        waiting, pending = sched.waiting, sched.pending
        heap = dec.finish_ticks
        ledger = sched.ledger
        base = sched.step_index
        bs, now, delta = self.bs, plan.now, plan.delta
        blocked = False  # the head did not fit, and nothing has been freed since
        t = sched.now
        j = 0
        while j < MAX_STEPS and dec.count <= B:
            next_arr = pending[0].arrival_s if pending else math.inf
            # Requests wait and none can be admitted until something finishes: arrivals only join them.
            closed = bool(waiting) and (blocked or not admission_open(B - dec.count, self.running, max_seqs))
            T = tick0 + 1 + j
            # A run of plain steps, unless the first one's crossings do not fit (a preemption: the
            # general step takes it at once).
            if (
                self.prefilling is None
                and (closed or (not waiting and t < next_arr))
                and now[T % bs] + delta.get(T, 0) <= self.free
            ):
                j0 = j
                j, t, refused = self._plain(j, t, next_arr, closed)
                if refused is not None:
                    blocked = refused  # decoders finished: the head was tried again
                if j > j0:
                    if dec.count == 0 and self.prefilling is None and (not waiting or blocked):
                        break
                    continue
                # No plain step taken: the general step takes this one (``T`` is still its tick).
            if ledger is not None:
                ledger.now = (base + j, t)
            if next_arr <= t:  # the driver releases the arrivals due before the step
                while pending and pending[0].arrival_s <= t:
                    waiting.append(pending.popleft())
            p = T % bs  # ``plan.count(T)``, inlined
            x = now[p] + delta.pop(T, 0)
            now[p] = x
            chunk = victims = 0
            scheduled: list[tuple[FastSeq, int]] = []
            admitted = _NOTHING
            s = self.prefilling
            if x > self.free:
                victims = self._preempt_crossers(T)  # nothing is admitted in this step
            else:
                if x:
                    self._take(x)
                    self.internal += plan.internal_at.get(T, 0)
                budget = B - dec.count
                if s is not None and budget > 0:
                    # The tail of running goes on with its prompt: as much as the budget allows.
                    chunk = min(s.prompt_len + s.num_output - s.num_computed, budget)
                    if self._chunk(s, chunk):
                        budget -= chunk
                        blocked = False  # its blocks, cached, may be the head's hits
                    else:
                        chunk = 0
                        victims = 1  # it does not fit: it preempts itself (the tail)
                        v = sched.running.pop()
                        assert v is s
                        self._evict(v, T)
                if waiting and not blocked and not victims:  # admission, first come first served
                    if self._below_floor():
                        blocked = admission_open(budget, self.running, max_seqs)  # as _admit would leave it
                    else:
                        admitted = self._admit(budget, t, scheduled)
                        for _, n in scheduled:
                            budget -= n
                        blocked = bool(waiting) and admission_open(budget, self.running, max_seqs)
                self._refresh()
            if victims:
                log.event(R.PREEMPTED, j, victims)
                blocked = False

            # The step: every decoder's token, the prefill chunk, the admitted prompts.
            nn = dec.count
            ctx = dec.dec_sum + T * nn
            new = seqs = nn
            pairs = ctx
            if chunk:
                assert s is not None
                c = s.num_computed
                seqs += 1
                new += chunk
                ctx += c
                pairs += chunk * c
            for a, n in scheduled:
                a.num_computed = c = a.num_computed + n
                new += n
                ctx += c
                pairs += n * c
            seqs += len(scheduled)
            self.used += new
            if scheduled:
                log.event(R.ADMITTED, j, admitted[0])
                log.event(R.PREFIX_HIT, j, admitted[1])
                log.event(R.RECOMPUTED_HIT, j, admitted[2])
            evicted = policy.evictions - self.seen
            if evicted:
                self.seen += evicted
                log.event(R.EVICTED, j, evicted)
            log.row(t, self.blocks, policy.cached_free_blocks())
            log.level(
                j,
                new,
                self.running,
                len(waiting),
                policy.external_frag(waiting[0] if waiting else None),
                self.internal,
                self.alloc - self.blocks * log.per_block,
                self.used,
            )
            t_end = t + (price.step(new, ctx, pairs, seqs) + extra(new, seqs))

            # The end of the step: finishers freed, then the requests done with their prompt decode.
            done = self._finish(T, t_end) if heap and heap[0] <= T else 0
            if chunk or scheduled:
                computed = [a for a, _ in scheduled]
                if chunk and s is not None:
                    computed.insert(0, s)
                done += self._start_decoding(computed, T, t_end)
            if done:
                log.event(R.FINISHED, j, done)
                blocked = False
            t = t_end
            j += 1
            if dec.count == 0 and self.prefilling is None and (not waiting or blocked):
                break
        if j == 0:
            return 0
        self._close(j, t)
        rows = log.rows(base, t, policy.budget_positions)
        recorder.add_step_rows(rows)
        return j

    def _close(self, k: int, t: float) -> None:
        """Hand the state after ``k`` steps back: every decoder's crossings up to then given, the
        clocks and counters moved on, the policy's totals checked against the rows'."""
        sched, dec, policy = self.sched, self.dec, self.policy
        end = self.tick0 + k
        crossing = dec.crossing  # events filed before the stretch for its ticks: stale now
        for tk in [tk for tk in crossing if self.tick0 < tk <= end]:
            del crossing[tk]
        internal_add = self.plan.grow(end, crossing, self.tick0)
        policy.internal_positions += internal_add + self.grown_internal
        dec.explicit = [self.prefilling] if self.prefilling is not None else []
        self._refresh()
        assert (policy.internal_positions, len(sched.running), policy.evictions) == (
            self.internal,
            self.running,
            self.seen,
        ), "a counted stretch drifted from the policy's counts"
        sched.take_evictions()  # counted in the rows, step by step
        dec.tick = end
        sched.used_positions = self.used + policy.shared_excess_positions
        sched.now = t
        sched.step_index += k


_NOTHING = (0, 0, 0)


def run(sched: Scheduler[FastSeq], dec: Decoders, recorder: RunRecorder) -> int:
    """Run and record as many steps as can be taken whole (module docstring) from the state of
    ``sched`` (the fast path's), in which every running request decodes implicitly (``dec``)
    but perhaps the last, prefilling; return how many (0: none)."""
    return Stretch(sched, dec).run(recorder)
