"""When the worker half of the offloading connector reports a transfer done: one rule for the
simulator and for ``vllm-sched`` (whose GPU worker, ``vllm/v1/kv_offload/cpu/gpu_worker.py``,
cannot run without CUDA and is stood in for by this rule).

As vLLM's worker (``offloading/worker.py``) runs them:

- a store issued in step N is submitted at the start of step N+1 and reported done in the output
  of step N+1 at the earliest;
- a load issued in step N is submitted in step N and reported done in the output of step N+1 at
  the earliest (``finished_recving``); the next ``schedule()`` releases its request;
- a flushed job (its request preempted, or a source block allocated again) is waited for before
  the step's forward pass: reported done in the output of the same step.

A transfer also takes its time over the link between the tiers: it is reported by the first step
at least one after it was issued that starts after ``issue time + bytes ÷ bandwidth``, the GPU
preset's host link on a GPU clock, roofline or tables (``link_bytes_per_s``); on any other clock the
next step.
A step that schedules nothing while transfers are in flight lasts until the soonest is done.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Generic, TypeVar

from ...clock.model import GPU_PRESETS
from ...spec.specs import GPU_CLOCKS, SchedulerSpec

R = TypeVar("R")


def link_bytes_per_s(scheduler: SchedulerSpec) -> float | None:
    """The GPU-to-host bandwidth a run's transfers take: the GPU preset's on a GPU clock (roofline, tables);
    None (each transfer lasts until the next step) on every other clock."""
    if scheduler.clock not in GPU_CLOCKS:
        return None
    return GPU_PRESETS[scheduler.gpu].host_link_bytes_s or None


class TransferQueue(Generic[R]):
    """Jobs in flight, by job id; ``R`` is what a load reports back (its request)."""

    def __init__(self, bytes_per_s: float | None = None) -> None:
        self.bytes_per_s = bytes_per_s  # None: every transfer lasts until the next step
        self._pending: list[tuple[int, float, int, R | None]] = []  # (earliest step, ready at, job, load's request)

    def __len__(self) -> int:
        return len(self._pending)

    def _ready_at(self, t_s: float, nbytes: int) -> float:
        return t_s if self.bytes_per_s is None else t_s + nbytes / self.bytes_per_s

    def wait(self, now: float) -> float:
        """The end of a step that scheduled nothing, ending at ``now``: an engine with only
        transfers to wait for idles until the soonest is done."""
        soonest = min((p[1] for p in self._pending), default=now)
        return soonest if soonest > now else now

    def step(
        self,
        step: int,
        t_s: float,
        flush: Iterable[int],
        stores: Iterable[tuple[int, int]],
        loads: Iterable[tuple[int, int, R]],
    ) -> tuple[list[int], list[R]]:
        """Step ``step``, started at ``t_s``: its flushed jobs, the stores (job, bytes) and loads
        (job, bytes, request) it issued. Returns the jobs reported done in its output and the
        requests whose loads are done."""
        done: list[int] = []
        flushed = set(flush)
        if flushed:
            self._pending = [p for p in self._pending if p[2] not in flushed]
            done.extend(sorted(flushed))
        for jid, nbytes in stores:
            if jid not in flushed:
                self._pending.append((step + 1, self._ready_at(t_s, nbytes), jid, None))
        for jid, nbytes, req in loads:
            self._pending.append((step + 1, self._ready_at(t_s, nbytes), jid, req))
        received: list[R] = []
        keep = []
        for entry in self._pending:
            earliest, ready, job, waiter = entry
            if earliest <= step and ready <= t_s:
                done.append(job)
                if waiter is not None:
                    received.append(waiter)
            else:
                keep.append(entry)
        self._pending = keep
        return done, received
