"""Iteration-level continuous batching, mirroring vLLM v1's ``Scheduler``.

The rules, as in ``vllm/v1/core/sched/scheduler.py`` (0.33):

1. Running requests first, in admission order. Each asks for the tokens it lacks (1 when
   decoding, the rest of its prompt when prefilling), capped by the step's token budget
   (chunked prefill).
2. When a running request cannot grow, the most recently admitted running request is
   preempted (recompute: its memory is freed, its computed tokens are forgotten, it goes to
   the front of the waiting queue) until the request fits or preempts itself.
3. Waiting requests are admitted, first come first served, only in a step that preempted
   nothing, while the token budget and ``max_num_seqs`` allow and the head of the queue fits
   (its whole current sequence, vLLM's ``scheduler_reserve_full_isl``). The first that does
   not fit stops admission (head-of-line blocking).
4. After the step, every request whose prefill is complete samples one token; a request with
   all its output tokens finishes and is freed.

Rules 2 and 3 are ``harness.sim.scheduling_rule``'s, which the fast path applies too.
``swap`` preemption keeps a preempted request's computed tokens (its K/V assumed copied to
host memory): resuming re-allocates but does not recompute.

Arrivals are released by the driver loop (``runners.driver``, ``Arrivals.release``) before
every step, as vLLM's front end adds requests; the scheduler holds the requests still to come
(``pending``, shared with ``Arrivals``) only for the fast path's counted stretches, which
release each arrival at the step the driver would have."""

from __future__ import annotations

import bisect
import dataclasses
from collections import deque
from collections.abc import Callable, Iterable
from typing import Generic

from ..clock.clocks import Clock, StepWork
from ..spec.specs import SchedulerSpec
from .policies.base import Policy
from .policies.paged import ReuseLedger
from .scheduling_rule import S, admit_waiting, preempt_until_fits
from .sequence import FINISHED, WAITING, Seq


@dataclasses.dataclass
class StepPlan(Generic[S]):
    """What one step computes: the scheduler's output, before execution."""

    step: int
    t_s: float
    scheduled: list[tuple[S, int]]  # (sequence, new tokens computed this step)
    admitted: int
    preempted: list[S]
    prefix_hit_tokens: int  # hits of requests admitted for the first time
    recomputed_hit_tokens: int  # … of requests re-admitted after a preemption (their own recomputation)
    work: StepWork


def _arrival_key(s: Seq) -> tuple[float, int]:
    """The order of arrivals: time, then index."""
    return s.arrival_s, s.index


class Arrivals(Generic[S]):
    """The requests still to arrive, in arrival order, and the one rule every runner releases
    them by, against its run's clock: an idle engine jumps to the next arrival; then every
    request that has arrived is released, in order.

    A request that follows another (``Seq.after``: the next turn of a conversation) is held
    until that one finishes, then arrives ``think_s`` later (never before its own
    ``arrival_s``): a closed loop on the run's clock. Whoever finishes a request says so
    (``finished``)."""

    def __init__(self, seqs: Iterable[S]) -> None:
        first: list[S] = []
        self.held: dict[int, list[S]] = {}  # sequence index -> the sequences its finish releases
        for s in seqs:
            if s.after >= 0:
                self.held.setdefault(s.after, []).append(s)
            else:
                first.append(s)
        self.pending: deque[S] = deque(sorted(first, key=_arrival_key))

    def release(self, now: float, idle: bool, admit: Callable[[S], None]) -> float:
        """Hand every request arrived by ``now`` to ``admit``; return the clock (moved on to the
        next arrival first when ``idle``: nothing running or waiting). Repeated before the engine
        steps, it does nothing: whatever it released has made the engine busy."""
        pending = self.pending
        if pending and idle and pending[0].arrival_s > now:
            now = pending[0].arrival_s
        while pending and pending[0].arrival_s <= now:
            admit(pending.popleft())
        return now

    def finished(self, seq: S, now: float) -> None:
        """``seq`` finished at ``now``: the requests that follow it arrive ``think_s`` later."""
        if not self.held:
            return
        pending = self.pending
        for nxt in self.held.pop(seq.index, ()):
            nxt.arrival_s = max(nxt.arrival_s, now + nxt.think_s)
            pending.insert(bisect.bisect_right(pending, _arrival_key(nxt), key=_arrival_key), nxt)


class Scheduler(Generic[S]):
    """The reference scheduler. Its public hooks — ``preempt``, ``make_room``,
    ``admit_waiting``, ``take_evictions`` — are what the fast path (``harness.sim.fast_scheduler``
    and its stretches) builds on; the rule itself is ``harness.sim.scheduling_rule``."""

    needs_block_ids = True  # the reference may be driven with an executor that reads block tables
    seq_type: type[Seq] = Seq  # the sequences it schedules (the runners build them: ``runners.common``)

    def __init__(
        self, arrivals: Arrivals[S], policy: Policy, config: SchedulerSpec, max_model_len: int, clock: Clock | None
    ) -> None:
        """``clock`` None: every step's duration is measured by the caller (``finish_step``)."""
        self.arrivals = arrivals
        self.pending = arrivals.pending  # the driver releases them; the fast path looks ahead (module docstring)
        self.ledger: ReuseLedger | None = getattr(policy, "ledger", None)
        self.waiting: deque[S] = deque()
        self.running: list[S] = []
        self.policy = policy
        self.config = config
        self.max_model_len = max_model_len
        self.clock = clock
        self.swap = config.preemption == "swap"
        self.now = 0.0
        self.step_index = 0
        self.finished = 0
        self.admissions = 0  # admissions so far, re-admissions included: a request's ``run_pos``
        self.used_positions = 0  # Σ computed positions over sequences holding memory
        # A policy over KV cache groups measures use itself (bytes-equivalent positions).
        self._measure_use: Callable[[], tuple[int, int]] | None = getattr(policy, "measure_use", None)
        self._evictions_seen = 0

    def add_request(self, seq: S) -> None:
        """A request handed over by the driver: it waits, last."""
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        """Whether a request handed over is unfinished."""
        return bool(self.waiting or self.running)

    # -- the hooks -----------------------------------------------------------------------
    def preempt(self, seq: S) -> None:
        """Preempt ``seq`` (already out of ``running``): its memory freed, recompute forgets its
        computed tokens (swap keeps them), and it waits at the front of ``waiting``."""
        self.policy.free(seq)
        self.used_positions -= seq.num_computed
        if not self.swap:
            seq.num_computed = 0
        seq.num_preemptions += 1
        seq.status = WAITING
        self.waiting.appendleft(seq)

    def make_room(self, seq: S, target: int, victims: list[S]) -> bool:
        """``seq`` could not grow to ``target`` positions: the preemption rule over ``running``.
        True when it then fits (its memory allocated) and keeps running."""
        return preempt_until_fits(
            seq, lambda: self.policy.allocate(seq, target), self.running.pop, self.preempt, victims
        )

    def take_evictions(self) -> int:
        """Blocks the policy evicted since the last call (a step's ``evicted_blocks``)."""
        evictions = self.policy.evictions - self._evictions_seen
        self._evictions_seen = self.policy.evictions
        return evictions

    def pending_evictions(self) -> int:
        """What ``take_evictions`` would return now, without taking them."""
        return self.policy.evictions - self._evictions_seen

    # -- scheduling ----------------------------------------------------------
    def schedule(self) -> StepPlan[S]:
        """The next step's plan, over what has been released to ``waiting`` by now."""
        policy = self.policy
        if self.ledger is not None:
            self.ledger.now = (self.step_index, self.now)
        budget = self.config.max_num_batched_tokens
        # vLLM keeps input positions below max_model_len − 1 (one sampled token per step).
        limit = self.max_model_len - 1
        scheduled: list[tuple[S, int]] = []
        preempted: list[S] = []
        running = self.running

        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            num_new = min(seq.num_tokens - seq.num_computed, budget, limit - seq.num_computed)
            if num_new <= 0:
                i += 1
                continue
            target = seq.num_computed + num_new
            if not policy.allocate(seq, target) and not self.make_room(seq, target, preempted):
                break
            scheduled.append((seq, num_new))
            budget -= num_new
            i += 1

        admitted, hit_tokens, recomputed = self.admit_waiting(budget, scheduled) if not preempted else (0, 0, 0)

        return StepPlan(
            self.step_index, self.now, scheduled, admitted, preempted, hit_tokens, recomputed, self._compute(scheduled)
        )

    def _compute(
        self, scheduled: list[tuple[S, int]], new_tokens: int = 0, context: int = 0, pairs: int = 0, seqs: int = 0
    ) -> StepWork:
        """Advance the scheduled sequences by their new tokens; the step's work, starting
        from what the caller already counted. Tokens computed now count as used."""
        for seq, n in scheduled:
            seq.num_computed += n
            new_tokens += n
            context += seq.num_computed
            pairs += n * seq.num_computed
        self.used_positions += new_tokens
        return StepWork(new_tokens, context, pairs, seqs + len(scheduled))

    def admit_waiting(self, budget: int, scheduled: list[tuple[S, int]]) -> tuple[int, int, int]:
        """Admit waiting requests at ``now`` while the rule allows (``scheduling_rule.admit_waiting``),
        with ``budget`` tokens left; append them to ``running`` and ``scheduled`` (each with the
        tokens it computes, its ``num_computed`` its hit or what a swap kept); return (admitted,
        hit tokens at first admissions, hit tokens at re-admissions after a preemption: vLLM
        counts these apart, never as prefix-cache hits)."""
        admitted, hit_tokens, recomputed, held = admit_waiting(
            self.waiting,
            self.running,
            self.policy,
            budget,
            self.config.max_num_seqs,
            self.max_model_len,
            self.now,
            scheduled,
            self.admissions,
        )
        self.admissions += admitted
        self.used_positions += held
        return admitted, hit_tokens, recomputed

    def measure_values(self) -> tuple[int, ...]:
        """The allocation state while the step computes (after scheduling, before frees), as a
        plain tuple: running, waiting, allocated blocks, allocated, used, reserved, internal,
        external and free positions, blocks evicted since the last call."""
        policy = self.policy
        blocks = policy.allocated_blocks()
        allocated = policy.allocated_positions
        if self._measure_use is None:
            used = self.used_positions - policy.shared_excess_positions
            internal = policy.internal_positions
        else:
            used, internal = self._measure_use()
        waiting = self.waiting
        evictions = self.take_evictions()
        return (
            len(self.running),
            len(waiting),
            blocks,
            allocated,
            used,
            allocated - used - internal,
            internal,
            policy.external_frag(waiting[0] if waiting else None),
            policy.budget_positions - allocated,
            evictions,
            policy.cached_free_blocks(),
        )

    def finish_step(self, plan: StepPlan[S], measured_s: float | None = None) -> list[S]:
        """Sample a token for every request whose prefill is complete; free the finished.
        The step lasts ``measured_s`` on a measured clock (no ``Clock``), else the clock's price
        (``measured_s`` is then only the runner's record, not the step's duration)."""
        if self.clock is None:
            assert measured_s is not None, "a measured clock needs each step's measured time"
            dt = measured_s
        else:
            work = plan.work
            dt = self.clock.step_time(work) + self.clock.take(work.scheduled_tokens, work.scheduled_seqs)
        self.now = plan.t_s + dt
        done: list[S] = []
        for seq, _ in plan.scheduled:
            if seq.num_computed < seq.num_tokens:
                continue  # a prefill chunk: no token yet
            seq.num_output += 1
            if seq.num_output == 1:
                seq.first_token_s = self.now
            if seq.num_output >= seq.output_len or seq.num_tokens >= self.max_model_len:
                done.append(seq)
        if done:
            self._retire(done)
        self.step_index += 1
        return done

    def _retire(self, done: list[S]) -> None:
        """Free finished sequences, in the given order (the free order is the LRU order)."""
        gone = set(map(id, done))
        self.running = [s for s in self.running if id(s) not in gone]
        for seq in done:
            self.policy.free(seq)
            self.used_positions -= seq.num_computed
            seq.status = FINISHED
            seq.finished_s = self.now
            self.arrivals.finished(seq, self.now)
        self.finished += len(done)
