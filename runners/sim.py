"""The ``sim`` runner: kvbench's scheduler and an allocation policy, no tensors.

It runs the fast path (``harness.sim.fast_scheduler``); ``SimRunner(reference=True)``
runs the step-by-step reference scheduler, which the fast path is tested against
record for record. ``SimEngine`` is kvbench's own scheduler as the driver's ``Engine``:
the ``sim`` runner's (the reference or the fast path) and the ``torch`` runner's, whose
executor computes each planned step for real.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Protocol

from ..harness.records.recorder import RunRecorder
from ..harness.records.schema import StepRow
from ..harness.sim.fast_scheduler import FastScheduler
from ..harness.sim.latency import itl_summary
from ..harness.sim.offload import quiet
from ..harness.sim.offload.rules import mirrored_rules
from ..harness.sim.offload.scheduler import OffloadScheduler
from ..harness.sim.offload.transfers import link_bytes_per_s
from ..harness.sim.policies import FAST, REFERENCE, policy_entry
from ..harness.sim.policies.grouped import GroupedPagedPolicy
from ..harness.sim.policies.grouped_prefix import GroupedPrefixPolicy
from ..harness.sim.policies.paged import PagedPolicy, reuse_distance_columns
from ..harness.sim.scheduler import Arrivals, Scheduler, StepPlan
from ..harness.sim.sequence import Seq
from ..harness.spec.feasibility import explain
from .base import Cell, RunResult
from .common import base_row, clock_for, expand_seqs, shortfall, write_status_only
from .driver import drive


class StepExecutor(Protocol):
    """Computes each planned step for real (the torch runner)."""

    def execute(self, plan: StepPlan) -> tuple[float | None, int | None]:
        """Compute the step; (its wall seconds, the KV bytes allocated)."""

    def extra_row(self) -> dict[str, object]:
        """The run row's columns only the executor knows (device, measured throughput)."""


class SimEngine:
    """A ``Scheduler`` stepped by the driver: plan, measure, execute (when an executor is given),
    sample and free; the step's row from the plan and the allocation state while it computes."""

    def __init__(
        self,
        sched: Scheduler,
        executor: StepExecutor | None = None,
        quiet: Callable[[RunRecorder], int] | None = None,
    ) -> None:
        """``quiet``: what takes and records a run of steps at once, where the scheduler does not
        itself (a CPU tier's quiet steps)."""
        self.sched = sched
        self.executor = executor
        # The fast path records stretches of steps in bulk; never with an executor, which needs every plan.
        self._quiet = (quiet or getattr(sched, "record_quiet_steps", None)) if executor is None else None
        # With an executor every plan lists every request it computes, so each token's time (its
        # step's end) is known: the gaps are the run's itl_* columns. The fast path's plans do not.
        self._token_times: dict[int, list[float]] | None = {} if executor is not None else None
        self._sampled: dict[int, Seq] = {}
        # A policy over KV cache groups: each step's group rows (kv_groups), read with its row.
        policy = sched.policy
        self._grouped = policy if isinstance(policy, GroupedPagedPolicy) else None
        self._group_rows: list[tuple[int, int, str, int, int]] = []
        # A CPU tier: the scheduler's tokens loaded from it, by sequence (the requests' cpu_hit_tokens).
        self.cpu_hit_tokens: dict[int, int] | None = (
            sched.cpu_hit_tokens if isinstance(sched, OffloadScheduler) else None
        )

    @property
    def now(self) -> float:
        return self.sched.now

    @now.setter
    def now(self, t_s: float) -> None:
        self.sched.now = t_s

    def busy(self) -> bool:
        return self.sched.has_unfinished()

    def admit(self, seq: Seq) -> None:
        self.sched.add_request(seq)

    def record_quiet_steps(self, recorder: RunRecorder) -> int:
        return self._quiet(recorder) if self._quiet is not None else 0

    def step(self) -> StepRow:
        sched = self.sched
        plan = sched.schedule()
        (running, waiting, blocks, allocated, used, reserved, internal, external, free, evicted, cached) = (
            sched.measure_values()
        )
        offload = sched.offload_values() if self.cpu_hit_tokens is not None else None  # type: ignore[attr-defined]
        grouped = self._grouped
        if grouped is not None:
            self._group_rows = [
                (plan.step, i, g.kind, blocks, used)
                for i, (g, (blocks, used)) in enumerate(zip(grouped.groups, grouped.last_groups))
            ]
        wall, kv_bytes = self.executor.execute(plan) if self.executor is not None else (None, None)
        times = self._token_times
        before = [(seq, seq.num_output) for seq, _ in plan.scheduled] if times is not None else ()
        done = sched.finish_step(plan, wall)
        if times is not None:
            for seq, n in before:
                if seq.num_output > n:
                    times.setdefault(seq.index, []).append(sched.now)
                    self._sampled[seq.index] = seq
        work = plan.work
        measured = wall is not None  # the step's work beside its measured time (calibrate's features)
        row = StepRow(
            step=plan.step,
            t_s=plan.t_s,
            dt_s=sched.now - plan.t_s,
            running=running,
            waiting=waiting,
            admitted=plan.admitted,
            finished=len(done),
            preempted=len(plan.preempted),
            scheduled_tokens=work.scheduled_tokens,
            allocated_blocks=blocks,
            allocated_positions=allocated,
            used_positions=used,
            reserved_positions=reserved,
            internal_frag_positions=internal,
            external_frag_positions=external,
            free_positions=free,
            evicted_blocks=evicted,
            prefix_hit_tokens=plan.prefix_hit_tokens,
            recomputed_hit_tokens=plan.recomputed_hit_tokens,
            cached_free_blocks=cached,
            kv_bytes_allocated=kv_bytes,
            step_wall_s=wall,
            scheduled_seqs=work.scheduled_seqs if measured else None,
            context_tokens=work.context_tokens if measured else None,
            attention_pairs=work.attention_pairs if measured else None,
        )
        if offload is not None:
            cpu_blocks, stored, loaded, load_waiting = offload
            row = row._replace(
                cpu_blocks=cpu_blocks, stored_blocks=stored, loaded_blocks=loaded, load_waiting=load_waiting
            )
        return row

    def take_kv_groups(self) -> list[tuple[int, int, str, int, int]]:
        """The last step's KV cache group rows (none for a model of full attention only)."""
        return self._group_rows

    def finish(self) -> dict[str, object]:
        ledger = self.sched.ledger
        columns: dict[str, object] = {}
        if ledger is not None:
            columns.update(reuse_distance_columns(ledger.steps, ledger.seconds))
        if self.executor is None or self._token_times is None:
            return columns
        for seq in self._sampled.values():  # each token's time: the end of the step that sampled it
            seq.token_times = self._token_times[seq.index]
        return {
            **columns,
            **itl_summary(list(self._sampled.values()), self._token_times),
            **self.executor.extra_row(),
        }


def shares_blocks(seqs: list[Seq]) -> bool:
    """Whether two sequences share a block's content. Content keys are chained (equal keys,
    equal tokens from position 0), so two share a block only if they share their first."""
    first = [s.block_keys[0] for s in seqs if s.block_keys]
    return len(set(first)) < len(first)


def run_scheduler(
    cell: Cell, runner: str, executor: StepExecutor | None = None, scheduler_cls: type[Scheduler] = Scheduler
) -> RunResult:
    """Run kvbench's scheduler over the cell through the driver, recording every step.

    ``scheduler_cls`` may be the fast path (``FastScheduler``) only without an
    executor: its plans list only the requests it touched, not every decoder.
    """
    assert executor is None or scheduler_cls is Scheduler, "an executor needs every scheduled request"
    spec = cell.spec
    entry = policy_entry(spec)
    offload = spec.memory.cpu_offload_bytes > 0
    if not entry.fast or offload:
        # A policy off the fast path runs exact on the reference loop; so does a CPU tier
        # (harness.sim.offload: vLLM's connector sees every request of every step).
        scheduler_cls = Scheduler
    seqs = expand_seqs(cell, scheduler_cls.seq_type)
    policy = entry.build(spec, block_ids=scheduler_cls.needs_block_ids, shared=shares_blocks(seqs))
    row = base_row(cell, runner)
    row["sim_path"] = REFERENCE if scheduler_cls is Scheduler else FAST
    short = shortfall(cell, seqs, policy)
    if short is not None:
        return write_status_only(cell, row, "infeasible", explain(short, spec.geometry, spec.model.kv_dtype))
    clock = clock_for(spec.scheduler, spec.geometry, spec.kv_bytes_per_token)
    assert clock is not None or executor is not None, "a measured clock needs a runner that measures steps"
    arrivals = Arrivals(seqs)
    sched: Scheduler
    if offload:
        rules = mirrored_rules()
        row["offload_rules"] = rules.release
        assert isinstance(policy, (PagedPolicy, GroupedPrefixPolicy))
        block_bytes = spec.block_bytes
        sched = OffloadScheduler(
            arrivals,
            policy,
            spec.scheduler,
            spec.memory.max_model_len,
            clock,
            spec.cpu_blocks,
            spec.memory.offload_policy,
            block_bytes,
            link_bytes_per_s(spec.scheduler),
            rules,
        )
    else:
        sched = scheduler_cls(arrivals, policy, spec.scheduler, spec.memory.max_model_len, clock)
    quiet_steps = partial(quiet.run, sched) if isinstance(sched, OffloadScheduler) else None
    return drive(cell, seqs, arrivals, SimEngine(sched, executor, quiet_steps), row)


class SimRunner:
    name = "sim"

    def __init__(self, reference: bool = False) -> None:
        self.scheduler_cls = Scheduler if reference else FastScheduler

    def unavailable(self) -> str | None:
        return None

    def run(self, cell: Cell) -> RunResult:
        return run_scheduler(cell, self.name, scheduler_cls=self.scheduler_cls)
