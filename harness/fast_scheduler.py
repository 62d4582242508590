"""The simulator's fast path: the same decisions as ``Scheduler``, in work proportional
to what changes in a step rather than to the number of running requests.

Most of a serving step is decoding: every running request whose prompt is done
computes one token and samples one. Nothing about such a *decoder* needs
touching in a step unless it crosses into a new block, finishes, or is
preempted. So decoders are kept implicit: a decoder registered at tick ``t0``
with ``c0`` computed positions has ``c0 + (D − t0)`` after ``D`` ticks, and the
steps at which it will need a block or finish are known in advance and kept in
per-tick event lists. A step in which everything fits — the token budget
covers every running request's need and the free blocks cover every new block
— is *simple*: only crossing decoders, prefill chunks, admissions and
finishers are touched, and the running sums (used positions, context tokens for
the clock) advance by formula. A step whose budget covers everyone but whose new
blocks do not fit preempts event by event (``_schedule_preempting``: only the
requests needing blocks and the victims are touched; under prefix caching a
victim's filled blocks are cached before it is freed, as at a finish). Any
other step (the budget runs short: chunked prefill) materialises every decoder
and runs the reference ``Scheduler.schedule`` unchanged.

Quiet stretches — runs of steps recorded in bulk — live in
``harness.quiet_stretches``, a mixin of this class.

Equality with the reference is tested record for record (``tests/test_fast_path.py``).
Two details keep it exact under prefix caching: a block's content is cached in
the reference the step it fills, here at the next crossing or before a free
(only the sequence itself could look it up in between), and finishers are
freed in running order, because the order of frees is the LRU order.
"""

from __future__ import annotations

import heapq
from collections import defaultdict

from .clock import RooflineClock
from .quiet_stretches import MERGE, QuietStretches
from .scheduler import Scheduler, StepPlan
from .sequence import RUNNING, Seq


class FastScheduler(QuietStretches, Scheduler):
    needs_block_ids = False
    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.tick = 0  # D: simple decode ticks so far
        self.num_decoders = 0
        self.dec_sum = 0  # Σ (computed − dec_tick) over decoders: Σ computed = dec_sum + D × n
        self.crossing: defaultdict[int, list[tuple[Seq, int]]] = defaultdict(list)
        self.finishing: dict[int, list[tuple[Seq, int]]] = {}
        self._finish_ticks: list[int] = []  # heap of the keys of ``finishing``
        self.explicit: list[Seq] = []  # running requests still prefilling, in running order
        self._next_pos = 0
        self._simple = False
        self._caching = bool(getattr(self.policy, "enable_caching", False))
        self._merge = (MERGE and getattr(self.policy, "counting", False) and type(self.clock) is RooflineClock)
        self.merged_admissions = 0  # requests admitted inside merged stretches

    # -- the implicit decoders -------------------------------------------------------
    def _append_running(self, seq: Seq) -> None:
        self._next_pos += 1
        seq.run_pos = self._next_pos
        self.running.append(seq)

    def _register(self, seq: Seq) -> None:
        """Make a decoding sequence implicit from the current tick on."""
        d = self.tick
        seq.dec_tick = d
        seq.epoch += 1
        self.num_decoders += 1
        self.dec_sum += seq.num_computed - d
        # Tick T computes position num_computed + (T − 1 − d): a block is needed when
        # that reaches the allocation, and the last token is sampled at T_f.
        if seq.allocated - seq.num_computed + d + 1 <= seq.output_len - seq.num_output + d:
            self.crossing[seq.allocated - seq.num_computed + d + 1].append((seq, seq.epoch))
        t = seq.output_len - seq.num_output + d
        lst = self.finishing.get(t)
        if lst is None:
            self.finishing[t] = [(seq, seq.epoch)]
            heapq.heappush(self._finish_ticks, t)
        else:
            lst.append((seq, seq.epoch))

    def _materialize(self, seq: Seq) -> None:
        k = self.tick - seq.dec_tick
        seq.num_computed += k
        seq.num_output += k
        seq.dec_tick = self.tick

    def _unregister(self, seq: Seq) -> None:
        self._materialize(seq)
        self.num_decoders -= 1
        self.dec_sum -= seq.num_computed - seq.dec_tick
        seq.dec_tick = -1
        seq.epoch += 1
        if self._caching:  # the reference cached the block the step it filled
            self.policy._cache_full_blocks(seq, seq.num_computed)  # type: ignore[attr-defined]

    def _live(self, events: list[tuple[Seq, int]]) -> list[Seq]:
        return [s for s, e in events if s.epoch == e and s.dec_tick >= 0]

    # -- scheduling ----------------------------------------------------------------------
    def schedule(self) -> StepPlan:
        policy = self.policy
        budget = self.config.max_num_batched_tokens
        tick = self.tick + 1
        crossers = self._live(self.crossing.pop(tick, []))
        need_tokens = self.num_decoders
        need_blocks = len(crossers)
        for seq in self.explicit:
            n = seq.num_tokens - seq.num_computed
            need_tokens += n
            need_blocks += policy.blocks_needed(seq, seq.num_computed + n)
        free = policy.free_blocks() if hasattr(policy, "free_blocks") else need_blocks
        self._simple = need_tokens <= budget and need_blocks <= free
        if need_tokens <= budget and not self._simple:
            # Memory runs out this step but the budget does not: preempt event by event.
            self._simple = True
            return self._schedule_preempting(tick, crossers)
        if not self._simple:
            # A short budget ahead (chunked prefill): hand every decoder to the reference.
            for seq in self.running:
                if seq.dec_tick >= 0:
                    self._unregister(seq)
            self.crossing.clear()  # every pending event belonged to a decoder just handed over
            self.finishing.clear()
            self._finish_ticks.clear()
            self.explicit = []
            return super().schedule()

        for seq in crossers:  # a new block each, in any order: all of them fit
            self._materialize(seq)
            seq.dec_tick = self.tick
            policy.allocate(seq, seq.num_computed + 1)
            nxt = seq.allocated - seq.num_computed + self.tick + 1
            if nxt <= seq.output_len - seq.num_output + self.tick:
                self.crossing[nxt].append((seq, seq.epoch))
        scheduled: list[tuple[Seq, int]] = []
        for seq in self.explicit:
            n = seq.num_tokens - seq.num_computed
            policy.allocate(seq, seq.num_computed + n)
            scheduled.append((seq, n))
            budget -= n
        budget -= self.num_decoders
        self.tick = tick
        admitted, hit_tokens = self._admit(budget, scheduled)

        decoders = self.num_decoders
        implicit = self.dec_sum + tick * decoders  # Σ computed of the decoders after this step
        return StepPlan(self.step_index, self.now, scheduled, admitted, [], hit_tokens,
                        self._compute(scheduled, decoders, implicit, implicit, decoders))

    def _schedule_preempting(self, tick: int, crossers: list[Seq]) -> StepPlan:
        """A step whose token budget covers every running request but whose new blocks do not
        fit: the reference's rule, applied only where it acts. Only the requests that need
        blocks (this tick's crossing decoders and the prefilling ones) can fail to allocate;
        they ask in running order, and each failure preempts from the tail of ``running``
        (the most recently admitted) until the request fits or is itself preempted — which
        ends the scheduling pass, as in the reference. Nothing is admitted after a preemption.
        Work is proportional to the requests needing blocks plus the victims, not to the batch."""
        policy = self.policy
        running = self.running
        needy = sorted([*crossers, *self.explicit], key=lambda s: s.run_pos)
        preempted: list[Seq] = []
        allocated: list[Seq] = []
        for seq in needy:
            if seq.status != RUNNING:
                continue  # preempted as a victim of an earlier request in this step
            implicit = seq.dec_tick >= 0
            if implicit:
                self._materialize(seq)
            target = seq.num_computed + (1 if implicit else seq.num_tokens - seq.num_computed)
            while not policy.allocate(seq, target):
                victim = running.pop()
                self._preempt_fast(victim)
                preempted.append(victim)
                if victim is seq:
                    break
            if seq.status != RUNNING:
                break
            allocated.append(seq)
        for seq in allocated:
            if seq.dec_tick >= 0:  # a crossing decoder: its next crossing from here
                nxt = seq.allocated - seq.num_computed + self.tick + 1
                if nxt <= seq.output_len - seq.num_output + self.tick:
                    self.crossing[nxt].append((seq, seq.epoch))
        scheduled: list[tuple[Seq, int]] = []
        for seq in self.explicit:
            if seq.status == RUNNING:
                n = seq.num_tokens - seq.num_computed
                scheduled.append((seq, n))
        self.explicit = [s for s, _ in scheduled]
        self.tick = tick
        decoders = self.num_decoders
        implicit_sum = self.dec_sum + tick * decoders
        return StepPlan(self.step_index, self.now, scheduled, 0, preempted, 0,
                        self._compute(scheduled, decoders, implicit_sum, implicit_sum, decoders))

    def _preempt_fast(self, victim: Seq) -> None:
        """Preempt ``victim`` (popped from ``running`` by the caller): an implicit decoder is
        made explicit first, so its computed tokens are counted up to this step."""
        if victim.dec_tick >= 0:
            self._unregister(victim)
        self._preempt(victim)

    def finish_step(self, plan: StepPlan, measured_s: float | None = None) -> list[Seq]:
        # sim only: always a Clock, so measured_s never sets the step's duration here.
        if not self._simple:
            finished = super().finish_step(plan, measured_s)
            self.explicit = []
            for seq in self.running:
                if seq.num_tokens - seq.num_computed == 1 and seq.num_output:
                    self._register(seq)
                else:
                    self.explicit.append(seq)  # still prefilling
            return finished

        clock = self.clock
        assert clock is not None
        dt = clock.step_time(plan.work)
        self.now = plan.t_s + dt
        done: list[Seq] = []
        newly_decoding: list[Seq] = []
        explicit: list[Seq] = []
        for seq, _ in plan.scheduled:
            if seq.num_computed < seq.num_tokens:
                explicit.append(seq)  # a prefill chunk: no token yet
                continue
            seq.num_output += 1
            if seq.num_output == 1:
                seq.first_token_s = self.now
            if seq.num_output >= seq.output_len or seq.num_tokens >= self.max_model_len:
                done.append(seq)
            else:
                newly_decoding.append(seq)
        finishing = self._live(self.finishing.pop(self.tick, []))
        for seq in finishing:
            self._unregister(seq)
        if finishing or done:
            done = sorted(done + finishing, key=lambda s: s.run_pos)  # frees in running order (LRU)
            self._retire(done)
        self.explicit = explicit
        for seq in newly_decoding:
            self._register(seq)
        self.step_index += 1
        return done

    # -- quiet stretches, in bulk ----------------------------------------------------------
