"""The ``vllm-sched`` runner: vLLM's own v1 ``Scheduler`` and ``KVCacheManager``
deciding every step, with the model mocked (see ``runners.vllm_adapter``).

It runs the same work as ``sim`` and records the same Parquet columns,
measured at the same point (after ``schedule()``, before the step's outputs
are applied), through the driver loop every runner shares, as the full engine
does (``runners.vllm_steps``), so that ``sim``/``paged``, ``vllm-sched``/``paged``
and ``vllm``/``paged`` compare step for step (``kvbench diverge``):

- sequences: ``runners.common.expand_seqs`` (n samples of a request share its prompt);
- token ids: ``runners.prompts.PromptIds``;
- budget: vLLM gets ``budget_blocks + 1`` blocks (its null block), so it can
  allocate exactly the simulator's ``budget_positions // block_size`` blocks.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from ..harness.sim.policies import make_policy
from ..harness.sim.scheduler import Arrivals
from ..harness.spec.feasibility import explain
from . import vllm_adapter
from .base import Cell, RunResult
from .common import base_row, expand_seqs, shortfall, write_status_only
from .driver import drive
from .vllm_steps import VllmStepEngine


class VllmSchedRunner:
    name = "vllm-sched"

    def unavailable(self) -> str | None:
        return vllm_adapter.unavailable()

    def run(self, cell: Cell) -> RunResult:
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
            arrivals = Arrivals(seqs)
            return drive(cell, seqs, arrivals, VllmStepEngine(cell, seqs, sched, arrivals), row)
