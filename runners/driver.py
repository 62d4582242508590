"""The one step loop every runner goes through: ``sim``, ``torch``, ``vllm-sched``, ``vllm``.

The loop owns what does not depend on the engine being stepped:

- arrivals, released against the run's clock by one rule (``harness.sim.scheduler.Arrivals``:
  an idle engine jumps to the next arrival, then everything arrived is handed over), before
  every step, as a server's front end adds requests to vLLM's scheduler;
- every step recorded as a ``StepRow`` (or a stretch of them at once, the fast path's);
- the livelock guard: a run whose steps compute nothing while work waits ends ``failed``;
- progress on stderr, and finishing the run: the requests table and the run row, published
  together (``RunRecorder.finish``), returned as a ``RunResult``.

What differs between engines is behind ``Engine``: kvbench's scheduler
(``runners.sim.SimEngine``, for ``sim`` and ``torch``) and vLLM's scheduler or whole
engine (``runners.vllm.steps.VllmStepEngine``, for ``vllm-sched`` and ``vllm``).
"""

from __future__ import annotations

import gc
import sys
import time
from typing import Protocol

from ..harness.records.recorder import RunRecorder
from ..harness.records.schema import FAILED, OK, StepRow
from ..harness.sim.scheduler import Arrivals
from ..harness.sim.sequence import FINISHED, Seq
from .base import Cell, RunResult
from .common import complete_row, requests_columns


class Engine(Protocol):
    """What the driver steps, one step (or one quiet stretch) at a time."""

    now: float  # the run's clock: where the last step ended (moved on to the next arrival when idle)

    def busy(self) -> bool:
        """Whether a request handed over is unfinished."""

    def admit(self, seq: Seq) -> None:
        """A request that has arrived (handed over in arrival order)."""

    def record_quiet_steps(self, recorder: RunRecorder) -> int:
        """Run and record a stretch of steps at once; how many (0: none now, so ``step``)."""

    def step(self) -> StepRow | None:
        """One step and its row; None when the engine scheduled nothing (no step, no time)."""

    def finish(self) -> dict[str, object]:
        """After the last step: settle what only the engine knows about the sequences; the run
        row's columns that only this engine fills."""


class Heartbeat:
    """Progress inside one long cell: a line on stderr every few seconds (a TTY only)."""

    def __init__(self, label: str, seqs: list[Seq], every_s: float = 2.0) -> None:
        self.label, self.seqs, self.every_s = label, seqs, every_s
        self.last = time.monotonic()
        self.shown = False
        self.live = sys.stderr.isatty()

    def tick(self, step: int) -> None:
        now = time.monotonic()
        if self.live and now - self.last >= self.every_s:
            self.last = now
            self.shown = True
            finished = sum(s.status == FINISHED for s in self.seqs)  # counted only when shown
            sys.stderr.write(
                f"\r\033[K  {self.label}: step {step:,}, {finished:,}/{len(self.seqs):,} sequences finished"
            )
            sys.stderr.flush()

    def close(self) -> None:
        if self.shown:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def drive(cell: Cell, seqs: list[Seq], arrivals: Arrivals, engine: Engine, row: dict[str, object]) -> RunResult:
    """Step ``engine`` until every sequence has finished (or the run livelocks), recording every
    step; write the run and return it. ``arrivals`` holds ``seqs`` not yet handed over; ``row``
    is the run row so far (``common.base_row`` and what the runner added)."""
    spec = cell.spec
    max_stall = spec.scheduler.max_stall_steps
    pending = arrivals.pending
    recorder = RunRecorder(cell.out, cell.run_id, spec.budget_positions)
    # An engine over KV cache groups hands each step's group rows over after the step.
    take_groups = getattr(engine, "take_kv_groups", None) if not spec.geometry.is_uniform_full else None
    beat = Heartbeat(f"{row['runner']} {spec.policy}", seqs) if cell.progress else None
    steps = stall = 0
    status, error = OK, None
    t0 = time.perf_counter()
    # The objects made before the loop (the requests, an engine) outlive it: frozen, the cyclic GC
    # stops re-scanning them on every collection the loop's own allocations trigger. Collections
    # still run; measured on the simulator, this removes a run-to-run spread of up to 1.5x.
    gc.freeze()
    try:
        while pending or engine.busy():
            if beat is not None:
                beat.tick(steps)
            if pending:
                engine.now = arrivals.release(engine.now, not engine.busy(), engine.admit)
            quiet = engine.record_quiet_steps(recorder)
            if quiet:
                steps += quiet
                stall = 0  # every quiet step computes a token per decoder
                continue
            step = engine.step()
            if step is None:
                stall += 1
                if stall > max_stall:
                    status, error = FAILED, f"livelock: {stall} engine steps without scheduler work"
                    break
                continue
            recorder.add_step(step)
            if take_groups is not None:
                recorder.add_kv_groups(take_groups())
            steps += 1
            # Livelock guard: steps that compute nothing while work waits.
            stall = stall + 1 if step.scheduled_tokens == 0 and not pending else 0
            if stall > max_stall:
                status = FAILED
                error = (
                    f"livelock: {stall} steps without progress with {step.waiting} waiting and {step.running} running"
                )
                break
        recorder.settle()  # the batches the loop filled are written within its time
    except BaseException:
        recorder.abort()
        raise
    finally:
        gc.unfreeze()
        if beat is not None:
            beat.close()
    wall_s = time.perf_counter() - t0
    engine_columns = engine.finish()
    row = complete_row(row, recorder, seqs, wall_s, engine.now)
    row.update(status=status, error=error)
    row.update(engine_columns)
    # A CPU tier: the tokens each request loaded from it rather than computed (the engine counts them).
    cpu_hits = getattr(engine, "cpu_hit_tokens", None)
    return RunResult(cell.run_id, recorder.finish(requests_columns(seqs, cpu_hits), row))
