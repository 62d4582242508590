"""The simulator's fast path: the same decisions as ``Scheduler``, in work proportional
to what changes in a step rather than to the number of running requests.

Decoders are implicit (``harness.sim.decoders``): a step touches only crossing decoders, prefill
chunks, admissions, finishers and victims. A step in which everything fits — the token budget
covers every running request's need and the free blocks cover every new block — is
*simple*: the running sums (used positions, context tokens for the clock) advance by
formula. A step whose budget covers everyone but whose new blocks do not fit preempts event
by event (``_schedule_preempting``: only the requests needing blocks and the victims are
touched; under prefix caching a victim's filled blocks are cached before it is freed, as at
a finish). Any other step (the budget runs short: chunked prefill) materialises every
decoder and runs the reference ``Scheduler.schedule`` unchanged.

Before each step the driver asks for a run of steps at once (``record_quiet_steps``): a
counted stretch (``harness.sim.counted_stretch``) for every policy that keeps no block ids on
a model clock, or ``harness.sim.grouped_stretch`` for vLLM's KV cache groups
(``CountingGroupedPolicy``, or ``CountingGroupedPrefixPolicy`` with block ids, whose allocations
go in running order: decoders act where the policy says, ``reach``; a step taken whole
from the reference redraws the policy's lines, ``resync``).

Equality with the reference is tested record for record (``tests/sim/test_fast_path.py``).
Under prefix caching a block's content is cached in the reference the step it fills, here at
the next crossing or before a free (only the sequence itself could look it up in between),
and finishers are freed in running order, because the order of frees is the LRU order.
docs/design.md ("The simulator's fast path") has the whole design."""

from __future__ import annotations

from operator import attrgetter

from ..clock.clocks import Clock
from ..records.recorder import RunRecorder
from ..spec.specs import SchedulerSpec
from . import counted_stretch, grouped_stretch
from .decoders import Decoders, FastSeq
from .policies.base import Policy
from .policies.counting_grouped import CountingGroupedPolicy
from .policies.counting_grouped_prefix import CountingGroupedPrefixPolicy
from .policies.group_counts import GroupCounts
from .policies.paged import PagedBase, PagedPolicy
from .scheduler import Arrivals, Scheduler, StepPlan
from .sequence import RUNNING, Seq

_RUN_POS = attrgetter("run_pos")


class FastScheduler(Scheduler[FastSeq]):
    """The fast path, built on the reference's public hooks (``Scheduler``) and its rule
    (``harness.sim.scheduling_rule``); its per-sequence state lives on ``FastSeq``."""

    needs_block_ids = False
    seq_type = FastSeq

    def __init__(
        self,
        arrivals: Arrivals[FastSeq],
        policy: Policy,
        config: SchedulerSpec,
        max_model_len: int,
        clock: Clock | None,
    ) -> None:
        super().__init__(arrivals, policy, config, max_model_len, clock)
        self.dec = Decoders()
        self._simple = False
        self._caching = isinstance(policy, PagedPolicy) and policy.enable_caching
        self._counted = counted_stretch.eligible(self)
        # KV cache groups: a decoder acts where the policy says (``reach``), not at its allocation.
        self._groups: GroupCounts | None = None
        if isinstance(policy, (CountingGroupedPolicy, CountingGroupedPrefixPolicy)):
            self._groups = policy
        # Block ids over the groups (prefix caching): a step's allocations in running order, and a
        # decoder whose next act comes sooner than filed (a designation moved) filed again.
        self._ordered = False
        if self._groups is not None:
            self.dec.reach = self._groups.reach
            if isinstance(policy, CountingGroupedPrefixPolicy):
                self._ordered = True
                policy.refile = self._refile

    def preempt(self, seq: FastSeq) -> None:
        """An implicit decoder is made explicit first, so its computed tokens count up to this step."""
        if seq.dec_tick >= 0:
            self._unregister(seq)
        super().preempt(seq)

    def _unregister(self, seq: FastSeq) -> None:
        self.dec.unregister(seq)
        policy = self.policy
        if self._caching and isinstance(policy, PagedPolicy):
            policy.cache_full_blocks(seq, seq.num_computed)  # the reference cached the block the step it filled

    def _refile(self, seq: Seq) -> None:
        """A decoder's next act filed again (``CountingGroupedPrefixPolicy.refile``)."""
        assert isinstance(seq, FastSeq)
        if seq.dec_tick >= 0:
            self.dec.unregister(seq)
            self.dec.register(seq)

    def record_quiet_steps(self, recorder: RunRecorder) -> int:
        """Run and record a run of steps at once, where one can be taken (module docstring);
        return how many (0: the next step goes one by one)."""
        if self._groups is not None:
            return grouped_stretch.run(self, self.dec, self._groups, recorder)
        dec = self.dec
        n = dec.count
        if not self._counted or n > self.config.max_num_batched_tokens:
            return 0
        explicit = dec.explicit
        if explicit and (len(explicit) > 1 or explicit[0] is not self.running[-1]):
            return 0  # a stretch carries one prefilling request, the tail of running
        if n == 0 and not explicit and not self.waiting:
            return 0
        return counted_stretch.run(self, dec, recorder)

    # -- scheduling ----------------------------------------------------------------------
    def schedule(self) -> StepPlan[FastSeq]:
        dec = self.dec
        policy = self.policy
        if self.ledger is not None:
            self.ledger.now = (self.step_index, self.now)
        budget = self.config.max_num_batched_tokens
        tick = dec.tick + 1
        crossers = dec.live(dec.crossing.pop(tick, []))
        need_tokens = dec.count
        need_blocks = len(crossers)
        groups = self._groups
        if groups is not None:  # a crosser may need several blocks, or none
            for seq in crossers:
                dec.materialize(seq)
            need_blocks = groups.crossing_need(crossers)
        for seq in dec.explicit:
            n = seq.num_tokens - seq.num_computed
            need_tokens += n
            need_blocks += policy.blocks_needed(seq, seq.num_computed + n)
        free = need_blocks  # contiguous: no blocks
        if isinstance(policy, (PagedBase, CountingGroupedPolicy, CountingGroupedPrefixPolicy)):
            free = policy.free_blocks()
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
            dec.clear()  # every pending event belonged to a decoder just handed over
            plan = super().schedule()
            if groups is not None:
                groups.resync()  # the requests the short budget left out did not advance
            return plan

        ordered = self._ordered and bool(crossers)
        if ordered:  # block ids: every allocation in running order
            for seq in sorted([*crossers, *dec.explicit], key=_RUN_POS):
                policy.allocate(seq, seq.num_computed + 1 if seq.dec_tick >= 0 else seq.num_tokens)
                if seq.dec_tick >= 0:
                    self._file_next_crossing(seq)
        else:
            for seq in crossers:  # a new block each, in any order: all of them fit
                dec.materialize(seq)
                seq.dec_tick = dec.tick
                policy.allocate(seq, seq.num_computed + 1)
                self._file_next_crossing(seq)
        scheduled: list[tuple[FastSeq, int]] = []
        for seq in dec.explicit:
            n = seq.num_tokens - seq.num_computed
            if not ordered:
                policy.allocate(seq, seq.num_computed + n)
            scheduled.append((seq, n))
            budget -= n
        budget -= dec.count
        dec.tick = tick
        admitted, hit_tokens, recomputed = self.admit_waiting(budget, scheduled)

        decoders = dec.count
        implicit = dec.dec_sum + tick * decoders  # Σ computed of the decoders after this step
        return StepPlan(
            self.step_index,
            self.now,
            scheduled,
            admitted,
            [],
            hit_tokens,
            recomputed,
            self._compute(scheduled, decoders, implicit, implicit, decoders),
        )

    def _file_next_crossing(self, seq: FastSeq) -> None:
        """File a decoder that just took its blocks at its next crossing (or act), if it decodes that far."""
        dec = self.dec
        reach = seq.allocated if self._groups is None else self._groups.reach(seq)
        nxt = reach - seq.num_computed + dec.tick + 1
        if nxt <= seq.output_len - seq.num_output + dec.tick:
            dec.crossing[nxt].append((seq, seq.epoch))

    def _schedule_preempting(self, tick: int, crossers: list[FastSeq]) -> StepPlan[FastSeq]:
        """A step whose token budget covers every running request but whose new blocks do not
        fit: the reference's rule (``make_room``), applied only where it acts. Only the
        requests that need blocks (this tick's crossing decoders and the prefilling ones) can
        fail to allocate; they ask in running order, as in the reference, and nothing is
        admitted after a preemption. Work is proportional to the requests needing blocks plus
        the victims, not to the batch."""
        dec = self.dec
        policy = self.policy
        needy = sorted([*crossers, *dec.explicit], key=lambda s: s.run_pos)
        preempted: list[FastSeq] = []
        allocated: list[FastSeq] = []
        for seq in needy:
            if seq.status != RUNNING:
                continue  # preempted as a victim of an earlier request in this step
            implicit = seq.dec_tick >= 0
            if implicit:
                dec.materialize(seq)
            target = seq.num_computed + (1 if implicit else seq.num_tokens - seq.num_computed)
            if not policy.allocate(seq, target) and not self.make_room(seq, target, preempted):
                break
            allocated.append(seq)
        for seq in allocated:
            if seq.dec_tick >= 0:  # a crossing decoder: its next crossing from here
                self._file_next_crossing(seq)
        scheduled: list[tuple[FastSeq, int]] = []
        for seq in dec.explicit:
            if seq.status == RUNNING:
                n = seq.num_tokens - seq.num_computed
                scheduled.append((seq, n))
        dec.explicit = [s for s, _ in scheduled]
        dec.tick = tick
        decoders = dec.count
        admitted = hit_tokens = recomputed = 0
        if not preempted:  # KV cache groups: the blocks skipped on the way made room for all
            budget = self.config.max_num_batched_tokens - decoders - sum(n for _, n in scheduled)
            admitted, hit_tokens, recomputed = self.admit_waiting(budget, scheduled)
        implicit_sum = dec.dec_sum + tick * decoders
        return StepPlan(
            self.step_index,
            self.now,
            scheduled,
            admitted,
            preempted,
            hit_tokens,
            recomputed,
            self._compute(scheduled, decoders, implicit_sum, implicit_sum, decoders),
        )

    def finish_step(self, plan: StepPlan[FastSeq], measured_s: float | None = None) -> list[FastSeq]:
        # sim only: always a Clock, so measured_s never sets the step's duration here.
        dec = self.dec
        if not self._simple:
            finished = super().finish_step(plan, measured_s)
            dec.explicit = []
            for seq in self.running:
                if seq.num_tokens - seq.num_computed == 1 and seq.num_output:
                    dec.register(seq)
                else:
                    dec.explicit.append(seq)  # still prefilling
            return finished

        clock = self.clock
        assert clock is not None
        work = plan.work
        dt = clock.step_time(work) + clock.take(work.scheduled_tokens, work.scheduled_seqs)
        self.now = plan.t_s + dt
        done: list[FastSeq] = []
        newly_decoding: list[FastSeq] = []
        explicit: list[FastSeq] = []
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
        finishing = dec.live(dec.finishing.pop(dec.tick, []))
        for seq in finishing:
            self._unregister(seq)
        if finishing or done:
            done = sorted(done + finishing, key=lambda s: s.run_pos)  # frees in running order (LRU)
            self._retire(done)
        dec.explicit = explicit
        for seq in newly_decoding:
            dec.register(seq)
        self.step_index += 1
        return done
