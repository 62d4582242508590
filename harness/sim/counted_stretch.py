"""Counted stretches: the paged fast path's run of many steps at once, through arrivals,
admissions, finishes and preemptions.

With block counts only (``CountingPagedPolicy``: ``paged`` and ``virtual-contiguous``, and
``paged-prefix`` where no two sequences share a block, ``CountingPrefixPolicy``), a run of
steps in which every running request decodes needs no per-request work per step. Each decoder needs a new block every
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
  as in the reference. Under prefix caching a request re-admitted after a recompute
  preemption first takes back its blocks still cached (a hit: those tokens are not
  computed again), and every block taken comes from the free queue's uncached blocks first,
  then evicts (``CachedRuns``), in the reference's order within the step;
- a **finish** frees the finisher at the end of its step (under prefix caching its full
  blocks join the free queue, cached, in running order);
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
from collections.abc import Iterable
from operator import attrgetter
from typing import TYPE_CHECKING

import numpy as np

from . import bulk_rows as R
from .decoders import Decoders, FastSeq
from .policies.base import internal_of
from .policies.counting_prefix import CountingPrefixPolicy
from .policies.paged import CountingPagedPolicy
from .scheduling_rule import admission_chunk, admission_must_fit, admission_open, preempt_until_fits
from .sequence import RUNNING, WAITING

if TYPE_CHECKING:
    from ..records.recorder import RunRecorder
    from .scheduler import Scheduler

MAX_STEPS = 8192  # steps per counted stretch (its rows are built at once)
_RUN_POS = attrgetter("run_pos")
_NO_HITS: list[int] = []  # a step admitting nothing (never written to)


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

    def grow(self, end: int, crossing: dict[int, list[tuple[FastSeq, int]]], tick0: int) -> tuple[int, int]:
        """Give each planned decoder the blocks its crossings up to tick ``end`` took, and file
        its next crossing after the stretch in ``crossing`` (a decoder that started decoding in
        the stretch, after ``tick0``, has none filed yet). Returns (blocks taken, internal
        fragmentation added)."""
        bs = self.bs
        grown = internal_add = 0
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
            grown += m
            nxt = c + m * bs
            if f > end and nxt <= L:
                crossing.setdefault(nxt, []).append((s, s.epoch))
        return grown, internal_add


def eligible(sched: Scheduler[FastSeq]) -> bool:
    """Whether ``sched``'s runs can take counted stretches: block counts and a clock (not measured)."""
    return sched.clock is not None and isinstance(sched.policy, CountingPagedPolicy)


def choose_admissions(
    waiting: Iterable[FastSeq],
    budget: int,
    running: int,
    free: int,
    bs: int,
    max_seqs: int,
    mml: int,
    prefix: CountingPrefixPolicy | None = None,
    taken: int = 0,
) -> tuple[list[FastSeq] | None, list[int], bool]:
    """The waiting requests a step admits, first come first served, with ``budget`` tokens and
    ``free`` blocks left after the running requests: the reference's ``_admit`` for block
    counts. Returns them (the last may take the rest of the budget as its first chunk) — or
    None when one would finish in its admission step or is longer than the model allows (a
    step the stretch cannot take) —, the blocks each finds cached (prefix caching: ``prefix``,
    from whose free queue the running requests take ``taken`` blocks first this step), and whether the
    head was refused for memory (``must_fit``; a hit costs a free block too, so it is the same test)."""
    cand: list[FastSeq] = []
    hits: list[int] = []
    pool = prefix.pool if prefix is not None else None
    if pool is not None:  # the step's evictions so far, and the uncached blocks left to take first
        evicted = taken - pool.uncached if taken > pool.uncached else 0
        uncached = pool.uncached - taken + evicted
        taking: list[tuple[FastSeq, int]] = []  # the hits of the requests before
    for s in waiting:
        if not admission_open(budget, running, max_seqs):
            break
        tokens = s.prompt_len + s.num_output
        if -(-admission_must_fit(tokens, mml) // bs) > free:
            return cand, hits, True  # it does not fit: it is the head next step, with no more memory
        if s.output_len - s.num_output < 2 or s.prompt_len + s.output_len > mml:
            return None, hits, False
        h = prefix.hit_blocks(s, prefix.pool.cached_after(s, evicted, taking)) if prefix is not None else 0
        computed = h * bs if h else s.num_computed  # a hit, or what a swap preemption kept
        left = tokens - computed
        cand.append(s)
        hits.append(h)
        if pool is not None:  # its new blocks: the uncached first, then evicting
            new = -(-(computed + admission_chunk(tokens, computed, budget)) // bs) - h
            if new > uncached:
                evicted += new - uncached
                uncached = 0
            else:
                uncached -= new
            if h:
                taking.append((s, h))
        if left > budget:
            break  # in chunks: it takes the rest of the budget
        free -= -(-tokens // bs)
        budget -= left
        running += 1
    return cand, hits, False


def _first_step_whole(sched: Scheduler[FastSeq], dec: Decoders, free: int) -> bool:
    """False when the stretch's first step would admit a request it cannot take whole, so the
    stretch would end before it starts (not worth its set-up). Decided against an upper bound
    on the step's crossings (its crossing events, some perhaps stale): whatever fits then fits
    in the stretch, so False is never wrong; True may be (the stretch then ends at once)."""
    crossers = dec.crossing.get(dec.tick + 1)
    av = free - (len(crossers) if crossers else 0)
    if not sched.waiting or av < 0:
        return True  # nothing to admit, or the step may preempt (then nothing is admitted)
    cfg = sched.config
    policy = sched.policy
    prefix = policy if isinstance(policy, CountingPrefixPolicy) else None
    cand, _, _ = choose_admissions(
        sched.waiting,
        cfg.max_num_batched_tokens - dec.count,
        len(sched.running),
        av,
        policy.block_size,
        cfg.max_num_seqs,
        sched.max_model_len,
        prefix,
        free - av,
    )
    return cand is not None


class Stretch:
    """One counted stretch: the fast path's state it advances (``sched``, ``dec``), its crossing
    plan, and the running totals the next step's row reads. What touches requests — a
    preemption, an admission, a finish, a prompt done — is a method; ``run``'s loop counts."""

    __slots__ = (
        "sched",
        "dec",
        "policy",
        "pool",
        "plan",
        "bs",
        "swap",
        "tick0",
        "free",
        "blocks",
        "internal",
        "used",
        "decoders",
        "dec_sum",
        "running",
        "taken",
        "taken_internal",
        "prefilling",
        "gone",
        "evicted",
        "recomputed",
    )

    def __init__(self, sched: Scheduler[FastSeq], dec: Decoders) -> None:
        policy = sched.policy
        assert isinstance(policy, CountingPagedPolicy)  # eligible()
        self.sched, self.dec, self.policy = sched, dec, policy
        # Prefix caching (as counts): every block taken comes from the pool, and may evict.
        self.pool = policy.pool if isinstance(policy, CountingPrefixPolicy) else None
        self.evicted = sched.pending_evictions()  # this step's evictions, so far
        self.recomputed = 0  # … and its hit tokens (re-admissions after a preemption)
        self.bs = policy.block_size
        self.swap = sched.swap
        self.tick0 = dec.tick
        # The totals as the next row reads them (positions used net of shared ones: none here).
        self.free = policy.free_blocks()
        self.blocks = policy.allocated_blocks()
        self.internal = policy.internal_positions
        self.used = sched.used_positions - policy.shared_excess_positions
        self.decoders, self.dec_sum = dec.count, dec.dec_sum
        self.running = len(sched.running)
        # Blocks (and internal positions) taken beside the plan's crossings — admissions, prompt
        # chunks, victims' growth — told to the policy at the end with the crossings'.
        self.taken = self.taken_internal = 0
        self.prefilling: FastSeq | None = None  # admitted in chunks, still prefilling: the tail of running
        self.gone: set[int] = set()  # finished, still listed in sched.running until the end
        self.plan = CrossingPlan(self.bs)
        for s in sched.running:
            self.plan.add(s)

    # -- events --------------------------------------------------------------------------
    def _take(self, n: int) -> None:
        """``n`` free blocks taken (they fit): under prefix caching, from the pool, evicting."""
        if self.pool is not None and n:
            e = self.pool.take(n)
            self.evicted += e
            self.policy.evictions += e

    def _evict(self, v: FastSeq, tick: int) -> None:
        """Preempt ``v`` (already popped from the tail of ``running``) at ``tick``: a decoder is
        brought up to the tick before (its deferred growth taken), the prefilling tail is exact;
        its memory is freed, recompute forgets its computed tokens, and it waits at the front."""
        bs, policy = self.bs, self.policy
        fl = v.prompt_len + v.output_len
        if v is self.prefilling:
            a = v.allocated
            ia = internal_of(a, fl)
            self.prefilling = None
        else:
            a = v.allocated + self.plan.blocks_by(v, tick - 1) * bs
            ia = internal_of(a, fl)
            self.taken += a // bs - v.allocated // bs
            self.taken_internal += ia - internal_of(v.allocated, fl)
            self.plan.drop(v, tick)
            v.allocated = a
            if a > v.peak_allocated:
                v.peak_allocated = a
            contrib = v.num_computed - v.dec_tick
            self.dec.unregister(v, at=tick - 1)
            self.decoders -= 1
            self.dec_sum -= contrib
        self.running -= 1
        self.free += a // bs
        self.blocks -= a // bs
        self.internal -= ia
        self.used -= v.num_computed
        policy.free(v)  # the growth above reaches the policy at the end, with the others'
        if not self.swap:
            v.num_computed = 0
        v.num_preemptions += 1
        v.status = WAITING
        self.sched.waiting.appendleft(v)

    def _preempt_crossers(self, tick: int) -> int:
        """Memory runs out at ``tick``: the crossers ask for their block in running order, and
        the preemption rule (``scheduling_rule.preempt_until_fits``) makes room over ``running``,
        passing over the finished requests still listed. Returns the victims."""
        running, gone = self.sched.running, self.gone

        def pop_tail() -> FastSeq:
            v = running.pop()
            while id(v) in gone:
                v = running.pop()
            return v

        victims: list[FastSeq] = []
        for s in self.plan.crossers(tick):
            if s.status != RUNNING:
                break  # preempted as a victim of an earlier crosser: so is everything after it
            if self.free == 0 and not preempt_until_fits(
                s, lambda: self.free > 0, pop_tail, lambda v: self._evict(v, tick), victims
            ):
                break
            self.free -= 1
            if self.pool is not None:
                self._take(1)
        x = self.plan.counted(tick)  # the crossers left: each took a block
        self.blocks += x
        if x:
            self.internal += self.plan.internal_at.get(tick, 0)
        return len(victims)

    def _grow_prefill(self, chunk: int, grow: int) -> None:
        """The prefilling tail computes ``chunk`` more tokens, in ``grow`` more blocks (they fit)."""
        s = self.prefilling
        assert s is not None
        if grow > 0:
            fl = s.prompt_len + s.output_len
            a = s.allocated + grow * self.bs
            ia = internal_of(a, fl) - internal_of(s.allocated, fl)
            s.allocated = a
            if a > s.peak_allocated:
                s.peak_allocated = a
            self.free -= grow
            self.blocks += grow
            self.internal += ia
            self.taken += grow
            self.taken_internal += ia
        s.num_computed += chunk

    def _admit(self, cand: list[FastSeq], hits: list[int], t: float, budget: int) -> tuple[int, int, int]:
        """Admit ``cand`` (chosen in ``run``, with the blocks each finds cached; the last may take
        the rest of ``budget`` as its first chunk): its memory, its tokens. Returns (tokens,
        context, attention pairs) added to the step."""
        sched, bs, pool = self.sched, self.bs, self.pool
        waiting = sched.waiting
        new = ctx = pairs = 0
        for s, h in zip(cand, hits):
            waiting.popleft()
            if h:  # nothing is shared: a hit is the request's own recomputation, counted apart
                assert pool is not None
                assert isinstance(self.policy, CountingPrefixPolicy)
                self.policy.ledger.reused_run(h, pool.hit(s, h))
                comp = h * bs
                s.recomputed_hit_tokens += comp
                self.recomputed += comp
            else:
                comp = s.num_computed  # kept by a swap preemption, else 0
            n = admission_chunk(s.prompt_len + s.num_output, comp, budget)
            budget -= n
            nb = -(-(comp + n) // bs)
            if pool is not None:
                self._take(nb - h)  # its hits were free blocks too
            a = nb * bs
            ia = internal_of(a, s.prompt_len + s.output_len)
            self.free -= nb
            self.blocks += nb
            self.internal += ia
            self.taken += nb
            self.taken_internal += ia
            s.allocated = a
            if a > s.peak_allocated:
                s.peak_allocated = a
            sched.start_running(s, t)
            s.num_computed = c = comp + n
            self.used += comp
            new += n
            ctx += c
            pairs += n * c
        self.running += len(cand)
        return new, ctx, pairs

    def _finish(self, tick: int, end_s: float) -> int:
        """Decoders sampling their last token at ``tick`` (their step ending at ``end_s``): brought
        up to date (their deferred growth taken) and freed now, in running order — the order of
        frees is the free queue's. They leave ``sched.running`` when the stretch ends. Returns how many."""
        heap, finishing, bs, plan = self.dec.finish_ticks, self.dec.finishing, self.bs, self.plan
        live: list[FastSeq] = []
        while heap and heap[0] <= tick:
            tt = heapq.heappop(heap)
            if tt == tick:
                lst = finishing.pop(tick, None)
                if lst:
                    live.extend(Decoders.live(lst))
        if not live:
            return 0
        if len(live) > 1:
            live.sort(key=_RUN_POS)
        contrib = 0
        for s in live:
            contrib += s.num_computed - s.dec_tick
            fl = s.prompt_len + s.output_len
            a = s.allocated + plan.blocks_by(s, tick) * bs
            ia = internal_of(a, fl)
            plan.forget(s)
            self.taken += a // bs - s.allocated // bs
            self.taken_internal += ia - internal_of(s.allocated, fl)
            s.allocated = a
            if a > s.peak_allocated:
                s.peak_allocated = a
            self.blocks -= a // bs
            self.free += a // bs
            self.internal -= ia
            self.used -= s.num_computed + tick - s.dec_tick
        self.dec.finish(live, tick, end_s, contrib, self.policy)
        self.sched.finished += len(live)
        self.decoders -= len(live)
        self.dec_sum -= contrib
        self.running -= len(live)
        self.gone.update(map(id, live))
        return len(live)

    def _start_decoding(self, computed: list[FastSeq], tick: int, end_s: float) -> None:
        """The requests that computed prompt tokens at ``tick``: those whose prompt is done sample
        their token and decode implicitly from the next tick on; one still short of it stays the
        prefilling tail."""
        dec = self.dec
        carried, self.prefilling = self.prefilling, None
        for s in computed:
            if s.num_computed < s.prompt_len + s.num_output:
                self.prefilling = s  # a chunk: no token yet (the last admitted, the tail of running)
                if s is not carried:
                    dec.stretch_chunked += 1
                continue
            s.num_output += 1
            if s.num_output == 1:
                s.first_token_s = end_s
            dec.start(s, tick)
            self.decoders += 1
            self.dec_sum += s.num_computed - tick
            self.plan.add(s)

    # -- the loop --------------------------------------------------------------------------
    def run(self, recorder: RunRecorder) -> int:
        """Take steps while each can be taken whole (module docstring); record them; return how many."""
        sched, plan = self.sched, self.plan
        clock = sched.clock
        assert clock is not None
        price, take = clock.price, clock.take
        bs = self.bs
        cfg = sched.config
        B, max_seqs, mml = cfg.max_num_batched_tokens, cfg.max_num_seqs, sched.max_model_len
        tick0 = self.tick0
        waiting, pending = sched.waiting, sched.pending
        next_arr = pending[0].arrival_s if pending else math.inf
        heap = self.dec.finish_ticks
        internal_at = plan.internal_at
        count = plan.count
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
        ev_evict: list[tuple[int, int]] = []
        ev_hit: list[tuple[int, int]] = []
        c_cached: list[int] = []  # cached free blocks (prefix caching)
        pool = self.pool
        ledger = self.policy.ledger if isinstance(self.policy, CountingPrefixPolicy) else None
        base = sched.step_index
        prefix = self.policy if isinstance(self.policy, CountingPrefixPolicy) else None
        j = 0
        while j < MAX_STEPS and self.decoders <= B:
            T = tick0 + 1 + j
            if ledger is not None:
                ledger.now = (base + j, t)
            x = count(T)
            if next_arr <= t:  # the driver releases the arrivals due before the step
                while pending and pending[0].arrival_s <= t:
                    waiting.append(pending.popleft())
                next_arr = pending[0].arrival_s if pending else math.inf
            cand: list[FastSeq] | None = None
            hits: list[int] = _NO_HITS
            chunk = victims = 0
            if x > self.free:
                victims = self._preempt_crossers(T)
            else:
                # Decided first, changed after: a step the stretch cannot take leaves no trace.
                av = self.free - x  # free after this tick's crossings
                budget = B - self.decoders
                grow = 0  # blocks the prefilling tail's next chunk takes
                s = self.prefilling
                if s is not None and budget > 0:
                    # The tail of running goes on with its prompt: as much as the budget allows.
                    chunk = s.prompt_len + s.num_output - s.num_computed
                    if chunk > budget:
                        chunk = budget
                    grow = -(-(s.num_computed + chunk) // bs) - s.allocated // bs
                    if grow > av:
                        chunk = grow = 0
                        victims = 1  # it does not fit: it preempts itself (the tail)
                    else:
                        budget -= chunk
                        av -= grow
                if waiting and not blocked and not victims:  # admission, first come first served
                    cand, hits, blocked = choose_admissions(
                        waiting, budget, self.running, av, bs, max_seqs, mml, prefix, x + grow
                    )
                    if cand is None:
                        break  # the step-by-step path takes this step
                self.free -= x
                if pool is not None:
                    self._take(x + grow)  # the crossers', then the prefilling tail's
                self.blocks += x
                if x:
                    self.internal += internal_at.get(T, 0)
                if victims:
                    v = sched.running.pop()
                    assert v is self.prefilling
                    self._evict(v, T)
                elif chunk:
                    self._grow_prefill(chunk, grow)
            if victims:
                ev_pre.append((j, victims))
                blocked = False

            # The step: every decoder's token, the prefill chunk, the admitted prompts.
            nn = self.decoders
            ctx = self.dec_sum + T * nn
            new = seqs = nn
            pairs = ctx
            if chunk:
                c = self.prefilling.num_computed  # type: ignore[union-attr]
                seqs += 1
                new += chunk
                ctx += c
                pairs += chunk * c
            if cand:
                n_, ctx_, pairs_ = self._admit(cand, hits, t, B - new)
                new += n_
                ctx += ctx_
                pairs += pairs_
                seqs += len(cand)
                ev_adm.append((j, len(cand)))
            if pool is not None:
                if self.evicted:
                    ev_evict.append((j, self.evicted))
                    self.evicted = 0
                if self.recomputed:
                    ev_hit.append((j, self.recomputed))
                    self.recomputed = 0
                c_cached.append(pool.queued)
            self.used += new
            c_ts.append(t)
            c_blocks.append(self.blocks)
            c_internal.append(self.internal)
            c_used.append(self.used)
            c_sched.append(new)
            c_run.append(self.running)
            c_wait.append(len(waiting))
            t_end = t + (price(new, ctx, pairs, seqs) + take(new, seqs))

            # The end of the step: finishers freed, then the requests done with their prompt decode.
            if heap and heap[0] <= T:
                done = self._finish(T, t_end)
                if done:
                    ev_fin.append((j, done))
                    blocked = False
            if chunk or cand:
                computed = [self.prefilling] if chunk else []
                self._start_decoding(computed + cand if cand else computed, T, t_end)  # type: ignore[arg-type]
            t = t_end
            j += 1
            if self.decoders == 0 and self.prefilling is None:
                break
        if j == 0:
            return 0
        c_ts.append(t)
        cols = np.array((c_blocks, c_internal, c_used, c_sched, c_run, c_wait), dtype=np.float64)
        step0 = base
        self._close(j, t)
        policy = self.policy
        sched.take_evictions()  # counted in the rows below, step by step
        # PagedBase.external_frag: the budget's tail no block fits, while anything waits.
        tail = float(policy.budget_positions - policy.num_blocks * bs)
        rows = R.step_rows(
            step0,
            np.array(c_ts),
            j,
            {
                R.BLOCKS: cols[0],
                R.INTERNAL: cols[1],
                R.USED: cols[2],
                R.SCHEDULED: cols[3],
                R.RUNNING: cols[4],
                R.WAITING: cols[5],
                R.EXTERNAL: (cols[5] > 0) * tail,
                R.CACHED_FREE: np.array(c_cached, dtype=np.float64) if pool is not None else 0.0,
            },
            {
                R.FINISHED: ev_fin,
                R.ADMITTED: ev_adm,
                R.PREEMPTED: ev_pre,
                R.EVICTED: ev_evict,
                R.RECOMPUTED_HIT: ev_hit,
            },
        )
        R.paged_allocation(rows, bs, policy.budget_positions)
        recorder.add_step_rows(rows)
        self.dec.stretch_admissions += sum(cnt for _, cnt in ev_adm)
        return j

    def _close(self, k: int, t: float) -> None:
        """Hand the state after ``k`` steps back: every decoder's crossings up to then taken, the
        finished out of ``running``, the clocks and counters moved on."""
        sched, dec, policy = self.sched, self.dec, self.policy
        end = self.tick0 + k
        crossing = dec.crossing
        for tk in range(self.tick0 + 1, end + 1):
            crossing.pop(tk, None)
        grown, internal_add = self.plan.grow(end, crossing, self.tick0)
        policy.take_blocks(grown + self.taken, internal_add + self.taken_internal)
        if self.gone:
            sched.running = [s for s in sched.running if id(s) not in self.gone]
        dec.explicit = [self.prefilling] if self.prefilling is not None else []
        assert (policy.free_blocks(), policy.internal_positions, len(sched.running)) == (
            self.free,
            self.internal,
            self.running,
        ), "a counted stretch drifted from the policy's counts"
        assert self.pool is None or self.pool.uncached + self.pool.queued == self.free, "… or from its free queue"
        dec.tick = end
        sched.used_positions = self.used + policy.shared_excess_positions
        sched.now = t
        sched.step_index += k


def run(sched: Scheduler[FastSeq], dec: Decoders, recorder: RunRecorder) -> int:
    """Run and record as many steps as can be taken whole (module docstring) from the state of
    ``sched`` (the fast path's), in which every running request decodes implicitly (``dec``);
    return how many (0: none)."""
    policy = sched.policy
    assert isinstance(policy, CountingPagedPolicy)  # eligible()
    if not _first_step_whole(sched, dec, policy.free_blocks()):
        return 0  # the step-by-step path takes it: not worth the plan's set-up
    return Stretch(sched, dec).run(recorder)
