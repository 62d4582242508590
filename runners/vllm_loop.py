"""The step loop both vLLM runners share: ``vllm-sched`` (vLLM's scheduler with a
mocked model) and ``vllm`` (the full engine).

Both hand it a ``StepSource`` whose ``step()`` reports what vLLM's
``schedule()`` decided and the allocation state right after it, before the
step's outputs are applied: the simulator's sampling point. So a request that
finishes in a step still holds its blocks in that step's row, in all three
runners, and ``sim``/``vllm-sched``/``vllm`` rows compare step for step
(``kvbench diverge``).

- arrivals: released by the run's clock with the simulator's rule (jump to the
  next arrival when idle; release everything that has arrived before each
  step); step time from the same ``StepWork``, or, on ``clock = "measured"``,
  the step's measured wall time (``vllm`` only: ``vllm-sched`` measures nothing);
- ``allocated_blocks`` from vLLM's block pool (usable − free);
  ``used_positions`` = Σ ``num_computed_tokens`` of running requests, minus
  the positions of blocks held by more than one request beyond the first
  holder (the simulator's "shared block counted once");
  ``internal_frag_positions`` = Σ max(0, blocks × block_size − (prompt +
  output)); ``reserved`` = allocated − used − internal; ``external`` = the
  budget left below one whole block when anything waits; ``preempted`` from
  the scheduler output; ``prefix_hit_tokens`` = the admitted requests'
  computed tokens at admission;
- per request: vLLM's own preemption count where it gives one.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Protocol

from ..harness.clock import StepWork
from ..harness.recorder import RunRecorder
from ..harness.sequence import FINISHED, Seq
from .base import Cell
from .common import Heartbeat, complete_row, requests_columns
from .vllm_adapter import VllmStep
from .vllm_prompts import PromptIds


class StepSource(Protocol):
    """vLLM stepped one scheduler step at a time."""

    usable_blocks: int

    def add(self, seq_index: int, prompt_ids: list[int], output_len: int, arrival_s: float) -> None: ...

    def has_unfinished(self) -> bool: ...

    def step(self) -> VllmStep | None:
        """One step; None when vLLM scheduled nothing (it held no request)."""

    def num_preemptions(self, seq_index: int) -> int | None: ...

    @property
    def evictions(self) -> int: ...


def drive(cell: Cell, seqs: list[Seq], source: StepSource, row: dict[str, object], runner: str) -> dict[str, object]:
    """Run the cell's sequences through ``source``, recording every step; the completed run row."""
    spec = cell.spec
    bs = spec.block_size
    budget = spec.budget_positions
    external_when_waiting = budget - source.usable_blocks * bs
    clock = spec.scheduler.make_clock(spec.geometry, spec.kv_bytes_per_token)  # None: measured step time
    prompts = PromptIds(cell)
    pending = deque(sorted(seqs, key=lambda s: (s.arrival_s, s.index)))
    recorder = RunRecorder(cell.out, cell.run_id, budget)
    max_stall = spec.scheduler.max_stall_steps
    beat = Heartbeat(f"{runner} {spec.policy}", len(seqs)) if cell.progress else None
    now = 0.0
    step = stall = finished_count = 0
    evictions_seen = 0
    measured_s = 0.0
    status, error = "ok", None
    t0 = time.perf_counter()
    try:
        while pending or source.has_unfinished():
            # Arrivals: the simulator's rule (Scheduler._release_arrivals).
            if pending and not source.has_unfinished() and pending[0].arrival_s > now:
                now = pending[0].arrival_s
            while pending and pending[0].arrival_s <= now:
                s = pending.popleft()
                source.add(s.index, prompts.of(s), s.output_len, s.arrival_s)
            t_s = now
            done = source.step()
            if done is None:  # nothing scheduled: no step, no time
                stall += 1
                if stall > max_stall:
                    status, error = "failed", f"livelock: {stall} engine steps without scheduler work"
                    break
                continue
            out, occ = done.schedule, done.occupancy
            hit_tokens = 0
            for idx, hit in out.admitted:
                seq = seqs[idx]
                if seq.num_preemptions == 0:
                    seq.first_scheduled_s = t_s
                seq.prefix_hit_tokens += hit
                hit_tokens += hit
            for idx in out.preempted:
                seqs[idx].num_preemptions += 1
            context = pairs = 0
            for idx, n, computed, blocks in out.scheduled:
                context += computed
                pairs += n * computed
                seq = seqs[idx]
                if blocks * bs > seq.peak_allocated:
                    seq.peak_allocated = blocks * bs
            work = StepWork(out.scheduled_tokens, context, pairs, len(out.scheduled))
            if clock is not None:
                now = t_s + clock.step_time(work)
            else:  # measured: RunSpec allows it only for runners that time their steps
                assert done.wall_s is not None, "a measured clock needs the step's measured time"
                now = t_s + done.wall_s
            for idx in done.got:
                seq = seqs[idx]
                seq.num_output += 1
                if seq.num_output == 1:
                    seq.first_token_s = now
            for idx in done.finished:
                seq = seqs[idx]
                seq.status = FINISHED
                seq.finished_s = now
            finished_count += len(done.finished)
            if done.wall_s is not None:
                measured_s += done.wall_s

            allocated = occ.allocated_blocks * bs
            shared_excess = max(0, occ.held_blocks - occ.allocated_blocks) * bs
            used = occ.computed_tokens - shared_excess
            internal = occ.internal_positions
            evicted = source.evictions - evictions_seen
            evictions_seen = source.evictions
            recorder.add_step((
                step, t_s, now - t_s, occ.running, occ.waiting, len(out.admitted), len(done.finished), len(out.preempted),
                out.scheduled_tokens, occ.allocated_blocks, allocated, used, allocated - used - internal,
                internal, external_when_waiting if occ.waiting else 0, budget - allocated, evicted, hit_tokens,
                done.kv_bytes, done.wall_s,
                *((work.scheduled_seqs, work.context_tokens, work.attention_pairs) if done.wall_s is not None
                  else (None, None, None)),
            ))
            step += 1
            if beat is not None:
                beat.tick(step, finished_count)
            # Livelock guard, as in runners.common.drive.
            stall = stall + 1 if out.scheduled_tokens == 0 and not pending else 0
            if stall > max_stall:
                status = "failed"
                error = (f"livelock: {stall} steps without progress with {occ.waiting} waiting and "
                         f"{occ.running} running")
                break
    except BaseException:
        recorder.abort()
        raise
    finally:
        if beat is not None:
            beat.close()
    wall_s = time.perf_counter() - t0
    for seq in seqs:  # vLLM's own count is the record
        count = source.num_preemptions(seq.index)
        if count is not None:
            seq.num_preemptions = count
    row = complete_row(row, recorder, seqs, wall_s, now)
    row.update(status=status, error=error)
    if measured_s > 0:
        # Measured steps: generated tokens per measured second (the torch runner's wall definition);
        # tokens_per_s stays on kvbench's clock, as for every runner.
        generated = int(row["generated_tokens"])  # type: ignore[call-overload]
        row["wall_tokens_per_s"] = generated / measured_s
    recorder.finish(requests_columns(seqs), row)
    return row
