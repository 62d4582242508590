"""Recording one run: steps streamed in record batches, requests and the run row at the end.

Memory stays flat as steps grow: step rows are buffered column-wise and
flushed as Parquet row groups every ``BATCH_ROWS`` rows. The run summary
(time-weighted fractions of the budget, running-request statistics) is
accumulated on the fly from the same rows.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from harness import store
from harness.schema import REQUESTS, RUNS, STEPS, with_version

BATCH_ROWS = 16_384
STEP_FIELDS = tuple(STEPS.names)
_I = {name: i for i, name in enumerate(STEP_FIELDS)}


class StepSummary:
    """Running totals over step rows, for the run row."""

    def __init__(self, budget_positions: int) -> None:
        self.budget = budget_positions
        self.steps = 0
        self.time = 0.0
        self.w_used = self.w_reserved = self.w_internal = self.w_external = self.w_free = 0.0
        self.w_running = 0.0
        self.peak_running = 0
        self.preemptions = 0
        self.evictions = 0
        self.computed_tokens = 0
        self.prefix_hit_tokens = 0
        self.peak_kv_bytes: int | None = None
        self.wall_sum = 0.0
        self.wall_n = 0

    def add(self, row: Sequence[object]) -> None:
        dt = row[_I["dt_s"]]
        self.steps += 1
        self.time += dt
        self.w_used += dt * row[_I["used_positions"]]
        self.w_reserved += dt * row[_I["reserved_positions"]]
        self.w_internal += dt * row[_I["internal_frag_positions"]]
        self.w_external += dt * row[_I["external_frag_positions"]]
        self.w_free += dt * row[_I["free_positions"]]
        running = row[_I["running"]]
        self.w_running += dt * running
        if running > self.peak_running:
            self.peak_running = running
        self.preemptions += row[_I["preempted"]]
        self.evictions += row[_I["evicted_blocks"]]
        self.computed_tokens += row[_I["scheduled_tokens"]]
        self.prefix_hit_tokens += row[_I["prefix_hit_tokens"]]
        kv = row[_I["kv_bytes_allocated"]]
        if kv is not None and (self.peak_kv_bytes is None or kv > self.peak_kv_bytes):
            self.peak_kv_bytes = kv
        wall = row[_I["step_wall_s"]]
        if wall is not None:
            self.wall_sum += wall
            self.wall_n += 1

    def fractions(self) -> dict[str, float | None]:
        denom = self.time * self.budget
        if denom <= 0:
            return {k: None for k in ("token_states_frac", "reservation_frac", "internal_frag_frac",
                                      "external_frag_frac", "free_frac")}
        return {
            "token_states_frac": self.w_used / denom,
            "reservation_frac": self.w_reserved / denom,
            "internal_frag_frac": self.w_internal / denom,
            "external_frag_frac": self.w_external / denom,
            "free_frac": self.w_free / denom,
        }


class RunRecorder:
    """Writes one run's partitions under ``out``; publish order: steps, requests, runs."""

    def __init__(self, out: Path, run_id: str, budget_positions: int) -> None:
        self.out = Path(out)
        self.run_id = run_id
        self.summary = StepSummary(budget_positions)
        self._tmp_steps = store.temp_dir(self.out, "steps", run_id)
        if self._tmp_steps.exists():
            shutil.rmtree(self._tmp_steps)
        self._tmp_steps.mkdir(parents=True)
        self._writer: pq.ParquetWriter | None = pq.ParquetWriter(
            self._tmp_steps / store.PART, with_version(STEPS))
        self._rows: list[tuple] = []

    def add_step(self, row: tuple) -> None:
        self._rows.append(row)
        self.summary.add(row)
        if len(self._rows) >= BATCH_ROWS:
            self._flush()

    def _flush(self) -> None:
        if not self._rows or self._writer is None:
            return
        columns = list(zip(*self._rows))
        batch = pa.RecordBatch.from_arrays(
            [pa.array(col, type=field.type) for col, field in zip(columns, STEPS)], schema=STEPS)
        self._writer.write_batch(batch)
        self._rows = []

    def finish(self, requests: dict[str, list], run_row: dict[str, object]) -> None:
        """Publish steps and requests, then the run row that makes the run exist."""
        self._flush()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        store.publish(self._tmp_steps, store.partition_dir(self.out, "steps", self.run_id))
        req_table = pa.Table.from_pydict(requests, schema=REQUESTS)
        store.write_partition(self.out, "requests", self.run_id, req_table)
        row = {name: run_row.get(name) for name in RUNS.names}
        for key, value in row.items():  # NaN → null: a missing measurement, not a number
            if isinstance(value, float) and math.isnan(value):
                row[key] = None
        store.write_partition(self.out, "runs", self.run_id, pa.Table.from_pylist([row], schema=RUNS))

    def abort(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        shutil.rmtree(self._tmp_steps, ignore_errors=True)
