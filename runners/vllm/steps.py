"""vLLM stepped by the driver loop (``runners.driver``): ``vllm-sched`` (vLLM's scheduler with a
mocked model) and ``vllm`` (the full engine).

Both hand ``VllmStepEngine`` a ``StepSource`` whose ``step()`` reports what vLLM's
``schedule()`` decided and the allocation state right after it, before the step's outputs are
applied: the simulator's sampling point, so ``sim``/``vllm-sched``/``vllm`` rows compare step
for step (``kvbench diverge``).

- arrivals: released by the driver with the simulator's rule, against this engine's clock
  (the simulator's ``StepWork`` priced, or on ``clock = "measured"`` the step's wall time:
  ``vllm`` only);
- ``allocated_blocks`` from vLLM's block pool (usable − free); ``used_positions`` = Σ
  ``num_computed_tokens`` of running requests, minus the positions of blocks held by more than
  one request beyond the first holder; a contiguous request holds its whole reservation
  (``runners.vllm.contiguous``), blocks beyond its block table included;
  ``internal_frag_positions`` = Σ max(0, blocks × block_size − (prompt + output));
  ``reserved`` = allocated − used − internal; ``external`` = the budget left below one whole
  block when anything waits (contiguous: and the free blocks in runs too short for the waiting
  head's reservation); ``preempted`` from the scheduler output; ``prefix_hit_tokens`` at first
  admission, ``recomputed_hit_tokens`` at re-admission after a preemption (as vLLM counts
  them); ``cached_free_blocks`` = the free blocks in vLLM's prefix-cache map;
- per request: vLLM's own preemption count where it gives one, and the time of each token it
  sampled (the end of its step), whose gaps are the run's ``itl_*`` columns."""

from __future__ import annotations

from collections import defaultdict
from typing import Protocol

from ...harness.clock.clocks import StepWork
from ...harness.records.recorder import RunRecorder
from ...harness.records.schema import StepRow
from ...harness.sim.latency import itl_summary
from ...harness.sim.policies.paged import reuse_distance_columns
from ...harness.sim.scheduler import Arrivals
from ...harness.sim.sequence import FINISHED, Seq
from ..base import Cell
from ..block_content import SequenceTokens
from ..common import clock_for
from .offload import StandInWorker
from .readings import CacheWatcher, VllmStep


class StepSource(Protocol):
    """vLLM stepped one scheduler step at a time."""

    usable_blocks: int

    def add(
        self, seq_index: int, prompt_ids: list[int], output_len: int, arrival_s: float, answer: list[int] | None = None
    ) -> None:
        """Hand vLLM a request; ``answer``: what a mocked model samples for it (a scripted turn)."""

    def has_unfinished(self) -> bool: ...

    def step(self) -> VllmStep | None:
        """One step; None when vLLM scheduled nothing (it held no request)."""

    def num_preemptions(self, seq_index: int) -> int | None: ...

    def placement(self, seq_index: int) -> tuple[int, int] | None:
        """A contiguous request's (first block, runs of consecutive block ids); None otherwise."""

    cache: CacheWatcher | None  # prefix caching: the block pool's watcher (its count: evictions)


class VllmStepEngine:
    """A ``StepSource`` as the driver's ``Engine``: kvbench's clock, the sequences' bookkeeping
    from what vLLM decided, and each step's row (the module docstring's definitions)."""

    def __init__(self, cell: Cell, seqs: list[Seq], source: StepSource, arrivals: Arrivals[Seq]) -> None:
        spec = cell.spec
        self.source = source
        self.arrivals = arrivals
        self.seqs = seqs
        self.block_size = spec.block_size
        self.budget = spec.budget_positions
        # A model of KV cache groups counts bytes-equivalent positions (harness.spec.kv_use).
        self.use = None if spec.geometry.is_uniform_full else spec.kv_use
        usable = source.usable_blocks * self.block_size if self.use is None else self.use.usable_positions
        self.external_when_waiting = self.budget - usable
        self._group_rows: list[tuple[int, int, str, int, int]] = []
        self.clock = clock_for(spec.scheduler, spec.geometry, spec.kv_bytes_per_token)  # None: measured step time
        self.tokens = SequenceTokens(cell)
        self.now = 0.0
        self.step_index = 0
        self.evictions_seen = 0
        self.measured_s = 0.0
        self.token_times: defaultdict[int, list[float]] = defaultdict(list)  # by Seq.index: each token's step end
        # A CPU tier: vllm-sched's stand-in for the offloading connector's worker (runners.vllm.offload).
        self.worker: StandInWorker | None = getattr(source, "offload", None)

    def busy(self) -> bool:
        return self.source.has_unfinished()

    def admit(self, seq: Seq) -> None:
        answer = self.tokens.answer(seq)
        self.source.add(
            seq.index,
            self.tokens.prompts.of(seq),
            seq.output_len,
            seq.arrival_s,
            None if answer is None else answer.tolist(),
        )

    def record_quiet_steps(self, recorder: RunRecorder) -> int:
        return 0  # vLLM is stepped one schedule() at a time

    def step(self) -> StepRow | None:
        t_s = self.now
        if self.source.cache is not None:
            self.source.cache.now = (self.step_index, t_s)
        if self.worker is not None:
            self.worker.now = t_s  # a CPU tier's transfers take time on this clock
        done = self.source.step()
        if done is None:  # nothing scheduled: no step, no time
            return None
        seqs, bs = self.seqs, self.block_size
        out, occ = done.schedule, done.occupancy
        hit_tokens = recomputed = 0
        for idx, hit in out.admitted:
            seq = seqs[idx]
            if seq.num_preemptions == 0:
                seq.first_scheduled_s = t_s
                seq.prefix_hit_tokens += hit
                hit_tokens += hit
            else:  # vLLM's stats count a preempted request's hits apart
                seq.recomputed_hit_tokens += hit
                recomputed += hit
        for idx in out.preempted:
            seqs[idx].num_preemptions += 1
        context = pairs = 0
        for idx, n, computed, blocks in out.scheduled:
            context += computed
            pairs += n * computed
            seq = seqs[idx]
            held = blocks * bs if self.use is None else self.use.positions(blocks)
            if held > seq.peak_allocated:
                seq.peak_allocated = held
        work = StepWork(out.scheduled_tokens, context, pairs, len(out.scheduled))
        if self.clock is not None:
            now = t_s + (self.clock.step_time(work) + self.clock.take(work.scheduled_tokens, work.scheduled_seqs))
        else:  # measured: RunSpec allows it only for runners that time their steps
            assert done.wall_s is not None, "a measured clock needs the step's measured time"
            now = t_s + done.wall_s
        if self.worker is not None and out.scheduled_tokens == 0:
            now = self.worker.queue.wait(now)  # waiting on transfers only
        self.now = now
        for idx in done.got:
            seq = seqs[idx]
            seq.num_output += 1
            self.token_times[idx].append(now)  # the gaps between them: itl_*
            if seq.num_output == 1:
                seq.first_token_s = now
        for idx in done.finished:
            seq = seqs[idx]
            seq.status = FINISHED
            seq.finished_s = now
            self.arrivals.finished(seq, now)
        measured = done.wall_s is not None
        if done.wall_s is not None:
            self.measured_s += done.wall_s

        if occ.used_positions is None:
            allocated = occ.allocated_blocks * bs
            shared_excess = max(0, occ.held_blocks - occ.allocated_blocks) * bs
            used = occ.computed_tokens - shared_excess
        else:
            assert self.use is not None and occ.groups is not None
            allocated = self.use.positions(occ.allocated_blocks)
            used = occ.used_positions
            self._group_rows = [
                (self.step_index, i, g.kind, blocks, used_bytes)
                for i, (g, (blocks, used_bytes)) in enumerate(zip(self.use.groups, occ.groups))
            ]
        internal = occ.internal_positions
        evictions = self.source.cache.count if self.source.cache is not None else 0
        evicted, self.evictions_seen = evictions - self.evictions_seen, evictions
        row = StepRow(
            step=self.step_index,
            t_s=t_s,
            dt_s=now - t_s,
            running=occ.running,
            waiting=occ.waiting,
            admitted=len(out.admitted),
            finished=len(done.finished),
            preempted=len(out.preempted),
            scheduled_tokens=out.scheduled_tokens,
            allocated_blocks=occ.allocated_blocks,
            allocated_positions=allocated,
            used_positions=used,
            reserved_positions=allocated - used - internal,
            internal_frag_positions=internal,
            external_frag_positions=(self.external_when_waiting + (occ.external_positions or 0)) if occ.waiting else 0,
            free_positions=self.budget - allocated,
            evicted_blocks=evicted,
            prefix_hit_tokens=hit_tokens,
            recomputed_hit_tokens=recomputed,
            cached_free_blocks=occ.cached_free_blocks,
            kv_bytes_allocated=done.kv_bytes,
            step_wall_s=done.wall_s,
            scheduled_seqs=work.scheduled_seqs if measured else None,
            context_tokens=work.context_tokens if measured else None,
            attention_pairs=work.attention_pairs if measured else None,
        )
        if self.worker is not None:
            cpu_blocks, stored, loaded, load_waiting = self.worker.values
            row = row._replace(
                cpu_blocks=cpu_blocks, stored_blocks=stored, loaded_blocks=loaded, load_waiting=load_waiting
            )
        self.step_index += 1
        return row

    @property
    def cpu_hit_tokens(self) -> dict[int, int] | None:
        """A CPU tier: the tokens vLLM loaded from it per sequence (None: no tier)."""
        return self.worker.cpu_hit_tokens if self.worker is not None else None

    def take_kv_groups(self) -> list[tuple[int, int, str, int, int]]:
        """The last step's KV cache group rows (none for a model of full attention only)."""
        return self._group_rows

    def finish(self) -> dict[str, object]:
        for seq in self.seqs:  # vLLM's own count is the record
            seq.token_times = self.token_times.get(seq.index, [])
            count = self.source.num_preemptions(seq.index)
            if count is not None:
                seq.num_preemptions = count
            placed = self.source.placement(seq.index)
            if placed is not None:
                seq.first_block, seq.block_runs = placed
        columns: dict[str, object] = dict(itl_summary(self.seqs, self.token_times))
        cache = self.source.cache
        if cache is not None:
            columns.update(reuse_distance_columns(cache.steps, cache.seconds))
        if self.measured_s > 0:
            # Measured steps: generated tokens per measured second (the torch runner's wall definition);
            # tokens_per_s stays on kvbench's clock, as for every runner.
            columns["wall_tokens_per_s"] = sum(s.num_output for s in self.seqs) / self.measured_s
        return columns
