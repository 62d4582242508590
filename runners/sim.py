"""The ``sim`` runner: kvbench's scheduler and an allocation policy, no tensors.

It runs the fast path (``harness.sim.fast_scheduler``); ``SimRunner(reference=True)``
runs the step-by-step reference scheduler, which the fast path is tested against
record for record.
"""

from __future__ import annotations

from ..harness.sim.fast_scheduler import FastScheduler
from ..harness.sim.scheduler import Scheduler
from .base import Cell, RunResult
from .sim_engine import run_scheduler


class SimRunner:
    name = "sim"

    def __init__(self, reference: bool = False) -> None:
        self.scheduler_cls = Scheduler if reference else FastScheduler

    def unavailable(self) -> str | None:
        return None

    def run(self, cell: Cell) -> RunResult:
        return run_scheduler(cell, self.name, scheduler_cls=self.scheduler_cls)
