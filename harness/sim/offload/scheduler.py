"""vLLM's scheduler with a CPU tier: the reference ``Scheduler`` plus what vLLM's ``Scheduler`` does
when its KV connector is the offloading connector (``vllm/v1/core/sched/scheduler.py``, 0.32/0.33).

Beside the rules of ``harness.sim.scheduler``:

- a waiting request's admission asks the connector for a CPU-tier hit after its GPU hit; a hit
  allocates its blocks (not cached yet), starts a load and parks the request, holding them, until
  the worker reports the load (``WAITING_FOR_REMOTE_KVS``); a request the connector cannot answer
  yet is skipped for the step and keeps its place;
- requests that hold blocks while waiting (a finished load) sit in a queue of their own that is
  admitted before the waiting queue (vLLM's ``kv_holding_waiting``); a finished load caches its
  blocks when its request comes up, and a request whose whole sequence was loaded recomputes its
  last token (to sample the next);
- a load is admitted only if it leaves free the blocks the prefills in flight still need
  (``reserved_blocks``);
- after scheduling, the connector issues the step's stores and flushes; after the step, the
  worker's completions (``transfers.TransferQueue``) make stores readable and release loads.

The policy is ``PagedPolicy`` with prefix caching (one full-attention KV cache group) or
``GroupedPrefixPolicy`` (vLLM's KV cache groups: sliding windows beside full attention); the
connector reads each request's tables per group from it (``tables_of``).

The step row reads the allocation state as ``vllm-sched`` reads vLLM's: ``used`` and ``internal``
over running requests only (a request waiting on a load holds blocks it has not computed into).
"""

from __future__ import annotations

from collections import deque
from typing import Generic

from ...clock.clocks import Clock
from ...spec.kv_shared_use import NULL_BLOCK, measure_shared
from ...spec.specs import SchedulerSpec
from ..policies.grouped_prefix import GroupedPrefixPolicy
from ..policies.paged import PagedPolicy, internal_of
from ..scheduler import Arrivals, Scheduler, StepPlan
from ..scheduling_rule import S, admission_chunk, admission_must_fit, join_running
from ..sequence import Seq
from ..step_price import StepPrice
from .connector import OffloadConnector, StepMeta
from .cpu_tier import CpuTier
from .rules import OffloadRules, mirrored_rules
from .transfers import TransferQueue

TierPolicy = PagedPolicy | GroupedPrefixPolicy


class OffloadScheduler(Scheduler[S], Generic[S]):
    """The reference scheduler over a paged prefix-caching policy (one group or vLLM's KV cache
    groups) and a CPU tier of ``cpu_blocks`` blocks evicted in ``offload_policy`` order."""

    def __init__(
        self,
        arrivals: Arrivals[S],
        policy: TierPolicy,
        config: SchedulerSpec,
        max_model_len: int,
        clock: Clock | None,
        cpu_blocks: int,
        offload_policy: str,
        block_bytes: int,
        bytes_per_s: float | None = None,
        rules: OffloadRules | None = None,
    ) -> None:
        super().__init__(arrivals, policy, config, max_model_len, clock)
        self.paged = policy
        self.block_bytes = block_bytes
        self.rules = rules or mirrored_rules()
        tier = CpuTier(cpu_blocks, offload_policy, self.rules)
        if isinstance(policy, GroupedPrefixPolicy):
            self.connector = OffloadConnector(
                tier,
                policy.bs,
                self.rules,
                policy.tables_of,
                policy.window_of,
                lambda seq: policy.boundary.get(seq.index, 0),
                NULL_BLOCK,
            )
        else:
            assert policy.enable_caching, "a CPU tier needs paged-prefix"
            self.connector = OffloadConnector(tier, policy.block_size, self.rules, policy.tables_of)
        self.transfers: TransferQueue[Seq] = TransferQueue(bytes_per_s)
        self.holding: deque[S] = deque()  # waiting while holding blocks (vLLM's kv_holding_waiting)
        self.loading: set[int] = set()  # requests waiting for a load (WAITING_FOR_REMOTE_KVS)
        self.received: set[int] = set()  # … whose load the worker reported done
        self.inflight: dict[int, S] = {}  # prefills in flight (vLLM's _inflight_prefills)
        self.cpu_hit_tokens: dict[int, int] = {}  # by Seq.index: tokens loaded from the CPU tier
        self._finished: list[S] = []  # finished in the last step: their last stores come next
        self._meta: StepMeta | None = None
        # Whether the last step changed nothing its admission attempt read after it was made, and
        # the head that attempt failed on (``quiet``: the steps after it may be taken at once).
        self.settled = False
        self.settled_head: S | None = None
        self.price: StepPrice | None = None  # the clock's price, compiled (``quiet``)
        self._attempted = False  # this step's admission attempt admitted and skipped nothing …
        self._attempt_head: S | None = None  # … at this head (holding's first, else waiting's; None: none)

    def add_request(self, seq: S) -> None:
        self.connector.on_new_request(seq)
        super().add_request(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.holding)

    # -- the hooks -----------------------------------------------------------------------
    def preempt(self, seq: S) -> None:
        self.inflight.pop(seq.index, None)
        super().preempt(seq)

    def _retire(self, done: list[S]) -> None:
        for seq in done:
            self.connector.request_finished(seq)  # before its blocks are freed
            self.inflight.pop(seq.index, None)
        super()._retire(done)
        self._finished.extend(done)

    # -- scheduling ----------------------------------------------------------------------
    def schedule(self) -> StepPlan[S]:
        """The reference step (running requests, then ``admit_waiting``: vLLM's waiting loop with
        the connector), then what vLLM does after scheduling: prefills that completed leave the
        in-flight set, and the connector issues the step's stores and flushes."""
        self._attempted = False
        plan = super().schedule()
        for seq, _ in plan.scheduled:
            if seq.num_computed >= seq.num_tokens:
                self.inflight.pop(seq.index, None)
        self._meta = self.connector.build_meta([s for s, _ in plan.scheduled], plan.preempted, self._finished)
        self._finished = []
        return plan

    def _reserved_blocks(self) -> int:
        """Blocks the prefills in flight still need to hold their whole sequence."""
        mml = self.max_model_len
        return sum(self.paged.remaining_blocks(seq, mml) for seq in self.inflight.values())

    def _fits_load(self, seq: S, target: int, must_fit: int) -> bool:
        """Whether a load admission of ``seq`` backing ``target`` positions fits while leaving the
        in-flight prefills their blocks (vLLM's ``reserved_blocks``)."""
        return self.paged.fits_leaving(seq, target, must_fit, self._reserved_blocks())

    def admit_waiting(self, budget: int, scheduled: list[tuple[S, int]]) -> tuple[int, int, int]:
        """vLLM's waiting loop with a connector (module docstring); returns (admitted, hit tokens at
        first admissions, hit tokens at re-admissions)."""
        policy, connector = self.paged, self.connector
        skipped_holding: list[S] = []
        skipped_waiting: list[S] = []
        admitted = hit_tokens = recomputed = 0
        max_seqs, mml = self.config.max_num_seqs, self.max_model_len
        while budget > 0:
            queue = self.holding if self.holding else self.waiting
            if not queue or len(self.running) >= max_seqs:
                break
            seq = queue[0]
            if seq.index in self.loading:
                if seq.index not in self.received:
                    skipped_holding.append(queue.popleft())
                    continue
                self.loading.discard(seq.index)
                self.received.discard(seq.index)
                policy.cache_full_blocks(seq, seq.num_computed)  # the loaded blocks are cached now
                if seq.num_computed == seq.num_tokens:
                    seq.num_computed -= 1  # the last token is recomputed, to sample the next
            looked = self._look_up(seq)
            if looked is None:
                skipped_waiting.append(queue.popleft())
                continue
            computed, external = looked
            must_fit = admission_must_fit(seq.num_tokens, mml)
            if external:
                if not self._fits_load(seq, computed, must_fit):
                    break
                policy.allocate(seq, computed, must_fit, cache_blocks=False)
                connector.after_alloc(seq, external)
                seq.num_computed = computed
                self.loading.add(seq.index)
                self.inflight[seq.index] = seq
                self.cpu_hit_tokens[seq.index] = self.cpu_hit_tokens.get(seq.index, 0) + external
                skipped_holding.append(queue.popleft())
                continue
            num_new = admission_chunk(seq.num_tokens, computed, budget)
            if not policy.allocate(seq, computed + num_new, must_fit):
                break
            queue.popleft()
            admitted += 1
            # What vLLM reports at admission: every token not computed now (GPU hits, CPU loads).
            if join_running(seq, self.running, self.admissions + admitted, self.now, computed):
                recomputed += computed
            else:
                hit_tokens += computed
            seq.num_computed = computed
            self.used_positions += computed
            scheduled.append((seq, num_new))
            budget -= num_new
            if computed + num_new < seq.num_tokens:
                self.inflight[seq.index] = seq
        self.admissions += admitted
        self.holding.extendleft(reversed(skipped_holding))
        self.waiting.extendleft(reversed(skipped_waiting))
        if not (admitted or skipped_holding or skipped_waiting):
            self._attempted = True
            self._attempt_head = self.head()
        return admitted, hit_tokens, recomputed

    def head(self) -> S | None:
        """The request the next admission attempt starts at: holding's first, else waiting's."""
        if self.holding:
            return self.holding[0]
        return self.waiting[0] if self.waiting else None

    def _look_up(self, seq: S) -> tuple[int, int] | None:
        """The tokens ``seq`` has computed at its admission and how many of them the CPU tier loads
        (its GPU prefix hit, then the connector's lookup past it); None when the connector cannot
        answer yet (the request is skipped for the step)."""
        if seq.num_computed:
            seq.pending_hits = []
            return seq.num_computed, 0
        hit = self.paged.prefix_hit(seq)
        found = self.connector.matched_tokens(seq, hit)
        if found is None:
            seq.pending_hits = []
            return None
        return hit + found, found

    def attempt_fails(self, budget: int) -> bool:
        """Whether ``admit_waiting`` with ``budget`` tokens left would admit, load and skip nothing now,
        doing only what it does before it fails: the head's lookups. The quiet steps (``quiet``) ask
        it after a step's allocations change what the head looks up."""
        queue = self.holding if self.holding else self.waiting
        if budget <= 0 or not queue or len(self.running) >= self.config.max_num_seqs:
            return True
        seq = queue[0]
        if seq.index in self.loading:
            return False  # its load lands or it is skipped: not a failed attempt
        looked = self._look_up(seq)
        if looked is None:
            return False
        computed, external = looked
        must_fit = admission_must_fit(seq.num_tokens, self.max_model_len)
        if external:
            return not self._fits_load(seq, computed, must_fit)
        return not self.paged.can_allocate(seq, computed + admission_chunk(seq.num_tokens, computed, budget), must_fit)

    # -- after the step ------------------------------------------------------------------
    def finish_step(self, plan: StepPlan[S], measured_s: float | None = None) -> list[S]:
        done = super().finish_step(plan, measured_s)
        meta = self._meta
        assert meta is not None
        bb = self.block_bytes
        jobs = self.connector.jobs
        completed, received = self.transfers.step(
            plan.step,
            plan.t_s,
            meta.flush,
            [(j, len(jobs[j].blocks) * bb) for j in meta.stores],
            [(j, len(jobs[j].blocks) * bb, seq) for j, seq in meta.loads],
        )
        self.connector.update_output(completed)
        self.received.update(seq.index for seq in received)
        if not plan.scheduled:
            self.now = self.transfers.wait(self.now)
        self.settled = self._attempted and not (
            done or plan.preempted or completed or meta.stores or meta.loads or meta.flush
        )
        self.settled_head = self._attempt_head
        return done

    def offload_values(self) -> tuple[int, int, int, int]:
        """The step's CPU-tier columns, read after scheduling: blocks held in the tier, blocks whose
        store and load were issued this step, requests waiting for a load."""
        meta = self._meta
        assert meta is not None
        return len(self.connector.tier), meta.stored_blocks, meta.loaded_blocks, len(self.loading)

    def measure_values(self) -> tuple[int, ...]:
        policy = self.paged
        if isinstance(policy, GroupedPrefixPolicy):
            blocks, allocated = policy.allocated_blocks(), policy.allocated_positions
            used, internal = self._groups_use(policy)
        else:
            bs = policy.block_size
            blocks = policy.allocated_blocks()
            computed = held = internal = 0
            for seq in self.running:
                computed += seq.num_computed
                held += len(seq.blocks)
                internal += internal_of(len(seq.blocks) * bs, seq.final_len)
            allocated = blocks * bs
            used = computed - max(0, held - blocks) * bs
        head = self.head()
        return (
            len(self.running),
            len(self.waiting) + len(self.holding),
            blocks,
            allocated,
            used,
            allocated - used - internal,
            internal,
            policy.external_frag(head),
            policy.budget_positions - allocated,
            self.take_evictions(),
            policy.cached_free_blocks(),
        )

    def _groups_use(self, policy: GroupedPrefixPolicy) -> tuple[int, int]:
        """Used and internal positions over KV cache groups: the policy's running totals, or over
        running requests only (``measure_shared``, as ``vllm-sched`` reads vLLM's tables) while a
        waiting request holds blocks."""
        if not any(s.index in policy.tables for s in self.holding):
            return policy.measure_use()
        tables, unit = policy.tables, policy.use.unit
        used, internal, policy.last_groups = measure_shared(
            policy.use, [(s.num_computed, s.final_len, tables[s.index]) for s in self.running]
        )
        return used // unit, internal // unit
