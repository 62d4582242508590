"""The ``vllm-sched`` runner: vLLM's own v1 ``Scheduler`` and ``KVCacheManager``
deciding every step, with the model mocked (see ``runners.vllm_adapter``).

It runs the same work as ``sim`` and records the same Parquet columns,
measured at the same point (after ``schedule()``, before the step's outputs
are applied), so that ``sim``/``paged`` and ``vllm-sched``/``paged`` can be
compared step for step (``kvbench diverge``):

- sequences: ``runners.common.expand_seqs`` (n samples of a request share its prompt);
- token ids, deterministic: a prefix group's shared tokens from
  ``default_rng([seed, 1, group])``, the rest of the prompt from
  ``default_rng([seed, 2, request_id])``, ids in [1, vocab);
- arrivals: released by kvbench's clock with the simulator's rule (jump to the
  next arrival when idle; release everything that has arrived before each
  ``schedule()``); step time from the same ``StepWork``;
- budget: vLLM gets ``budget_blocks + 1`` blocks (its null block), so it can
  allocate exactly the simulator's ``budget_positions // block_size`` blocks.

Per step: ``allocated_blocks`` from vLLM's block pool (usable − free);
``used_positions`` = Σ ``num_computed_tokens`` of running requests, minus the
positions of blocks held by more than one request beyond the first holder
(the simulator's "shared block counted once"); ``internal_frag_positions`` =
Σ max(0, blocks × block_size − (prompt + output)); ``reserved`` = allocated −
used − internal; ``external`` = the budget left below one whole block when
anything waits; ``preempted`` from the scheduler output; ``prefix_hit_tokens``
= the admitted requests' computed tokens at admission.
"""

from __future__ import annotations

import tempfile
import time
from collections import deque
from pathlib import Path

import numpy as np

from harness.clock import StepWork, make_clock
from harness.feasibility import explain
from harness.policies import make_policy
from harness.recorder import RunRecorder
from harness.sequence import FINISHED, Seq
from runners import vllm_adapter
from runners.base import Cell
from runners.common import base_row, complete_row, expand_seqs, requests_columns, shortfall, write_status_only


class PromptIds:
    """Deterministic prompt token ids per request (see the module docstring)."""

    def __init__(self, cell: Cell) -> None:
        self.seed = cell.spec.workload.seed
        self.vocab = cell.spec.geometry.vocab_size
        df = cell.workload.requests
        grouped = df[df["prefix_group"] >= 0]
        self.groups = {int(g): self._draw([self.seed, 1, int(g)], int(n))
                       for g, n in grouped.groupby("prefix_group")["prefix_len"].max().items()}
        self._last: tuple[int, list[int]] | None = None

    def _draw(self, key: list[int], size: int) -> list[int]:
        if size <= 0:
            return []
        return np.random.default_rng(key).integers(1, self.vocab, size=size).tolist()

    def of(self, seq: Seq) -> list[int]:
        if self._last is not None and self._last[0] == seq.request_id:
            return self._last[1]  # samples of one request share the whole prompt
        shared = min(seq.prefix_len, seq.prompt_len) if seq.prefix_group >= 0 else 0
        ids = self.groups[seq.prefix_group][:shared] if shared else []
        ids = ids + self._draw([self.seed, 2, seq.request_id], seq.prompt_len - shared)
        self._last = (seq.request_id, ids)
        return ids


class VllmSchedRunner:
    name = "vllm-sched"

    def unavailable(self) -> str | None:
        return vllm_adapter.unavailable()

    def run(self, cell: Cell) -> dict[str, object]:
        spec = cell.spec
        vllm_adapter.check_policy(spec)
        vllm_adapter.kv_dtype_of(spec)
        seqs = expand_seqs(cell)
        row = base_row(cell, self.name)
        short = shortfall(cell, seqs, make_policy(spec))
        if short is not None:
            return write_status_only(cell, row, "infeasible", explain(short, spec.geometry, spec.model.kv_dtype))
        with tempfile.TemporaryDirectory(prefix="kvbench-vllm-sched-") as tmp:
            sched = vllm_adapter.VllmScheduler(spec, Path(tmp) / "model")
            return self._drive(cell, seqs, sched, row)

    def _drive(self, cell: Cell, seqs: list[Seq], vs: vllm_adapter.VllmScheduler,
               row: dict[str, object]) -> dict[str, object]:
        spec = cell.spec
        bs = spec.block_size
        budget = spec.budget_positions
        external_when_waiting = budget - vs.usable_blocks * bs
        clock = make_clock(spec.scheduler.clock, spec.geometry, spec.kv_bytes_per_token, spec.scheduler.gpu)
        prompts = PromptIds(cell)
        pending = deque(sorted(seqs, key=lambda s: (s.arrival_s, s.index)))
        recorder = RunRecorder(cell.out, cell.run_id, budget)
        max_stall = spec.scheduler.max_stall_steps
        now = 0.0
        step = stall = 0
        evictions_seen = 0
        status, error = "ok", None
        t0 = time.perf_counter()
        try:
            while pending or vs.has_unfinished():
                # Arrivals: the simulator's rule (Scheduler._release_arrivals).
                if pending and not vs.has_unfinished() and pending[0].arrival_s > now:
                    now = pending[0].arrival_s
                while pending and pending[0].arrival_s <= now:
                    s = pending.popleft()
                    vs.add(s.index, prompts.of(s), s.output_len, s.arrival_s)
                t_s = now
                out = vs.schedule()
                occ = vs.occupancy()

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
                dt = clock.step_time(StepWork(out.scheduled_tokens, context, pairs))
                now = t_s + dt

                got, finished = vs.execute(out)
                for idx in got:
                    seq = seqs[idx]
                    seq.num_output += 1
                    if seq.num_output == 1:
                        seq.first_token_s = now
                for idx in finished:
                    seq = seqs[idx]
                    seq.status = FINISHED
                    seq.finished_s = now

                allocated = occ.allocated_blocks * bs
                shared_excess = max(0, occ.held_blocks - occ.allocated_blocks) * bs
                used = occ.computed_tokens - shared_excess
                internal = occ.internal_positions
                evicted = vs.evictions - evictions_seen
                evictions_seen = vs.evictions
                recorder.add_step((
                    step, t_s, now - t_s, occ.running, occ.waiting, len(out.admitted), len(finished), len(out.preempted),
                    out.scheduled_tokens, occ.allocated_blocks, allocated, used, allocated - used - internal,
                    internal, external_when_waiting if occ.waiting else 0, budget - allocated, evicted, hit_tokens,
                    None, None,
                ))
                step += 1
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
        wall_s = time.perf_counter() - t0
        for seq in seqs:  # vLLM's own count is the record
            count = vs.num_preemptions(seq.index)
            if count is not None:
                seq.num_preemptions = count
        row = complete_row(row, recorder, seqs, wall_s, now)
        row.update(status=status, error=error)
        recorder.finish(requests_columns(seqs), row)
        return row
