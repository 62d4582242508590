"""The driver loop every runner shares, the step-row type, the typed run result, and the
recorder's refusal of undeclared run-row columns."""

from __future__ import annotations

import typing
from pathlib import Path

import pyarrow as pa
import pytest
from kvbench.app.suite import parse_suite
from kvbench.app.sweep import build_cells
from kvbench.harness.records import store
from kvbench.harness.records.recorder import NULL_FIELDS, RunRecorder, UnknownColumns
from kvbench.harness.records.schema import REQUESTS, RUNS, STEPS, StepRow
from kvbench.harness.sim.scheduler import Arrivals
from kvbench.harness.sim.sequence import FINISHED, Seq
from kvbench.runners.base import Cell, RunResult
from kvbench.runners.common import base_row, expand_seqs
from kvbench.runners.driver import drive
from kvbench.runners.oom import is_oom
from kvbench.runners.sim import SimRunner

from tests.conftest import suite_toml

SUITE = suite_toml(
    "driver",
    model={"preset": "tiny", "kv_dtype": "fp16"},
    memory={"kv_budget": "64KiB", "max_model_len": 128},
    scheduler={"max_num_seqs": 8, "max_num_batched_tokens": 64, "max_stall_steps": 5},
    workload={
        "source": "fixed",
        "prompt_len": 20,
        "output_len": 5,
        "num_requests": 4,
        "arrival": "poisson",
        "rate": 2.0,
    },
    grid={"policy": ["paged"], "block_size": [16]},
)


def one_cell(out: Path) -> Cell:
    (cell,) = build_cells(parse_suite(SUITE, "driver.toml"), out, lambda m: None)
    return cell


def test_step_row_is_the_steps_schema():
    assert StepRow._fields == tuple(STEPS.names)
    hints = typing.get_type_hints(StepRow)
    for field in STEPS:
        hint = hints[field.name]
        nullable = typing.get_origin(hint) is not None  # X | None
        base = typing.get_args(hint)[0] if nullable else hint
        # nulls only where not measured, and in a CPU tier's columns (runs without a tier)
        assert nullable == (field.name in NULL_FIELDS), field.name
        assert base is (float if pa.types.is_floating(field.type) else int), field.name


def test_recorder_refuses_a_run_row_column_the_schema_does_not_declare(tmp_path: Path):
    recorder = RunRecorder(tmp_path, "r1", 1000)
    recorder.add_step(StepRow(0, 0.0, 1.0, *[0] * 17, None, None, None, None, None))
    row = {"status": "ok", "steps": 1, "tokens_per_sec": 3.0, "colour": "red"}
    with pytest.raises(UnknownColumns, match="'tokens_per_sec', 'colour'"):
        recorder.finish({name: [] for name in REQUESTS.names}, row)
    assert not store.existing_run_ids(tmp_path)  # nothing published
    assert not list(tmp_path.glob("*/.tmp-*")) and not list(tmp_path.glob("*/run_id=*"))


def test_a_steps_batch_that_fails_while_the_run_goes_on_stops_it_as_a_storage_error(tmp_path: Path, monkeypatch):
    # A full batch is written on the recorder's own thread; its disk error reaches the run where
    # it next hands rows over or settles, as the one-line StorageError, and nothing is left behind.
    import errno

    import numpy as np
    import pyarrow.parquet as pq
    from kvbench.harness.errors import StorageError
    from kvbench.harness.records.recorder import BATCH_ROWS, STEP_FIELDS

    def full(self, batch, row_group_size=None):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pq.ParquetWriter, "write_batch", full)
    recorder = RunRecorder(tmp_path, "r1", 1000)
    rows = np.zeros((BATCH_ROWS, len(STEP_FIELDS)))
    rows[:, STEP_FIELDS.index("kv_bytes_allocated") :] = np.nan  # the measured fields: null
    recorder.add_step_rows(rows)  # a full batch: handed to the writer's thread
    with pytest.raises(StorageError, match="No space left on device"):
        recorder.settle()
    recorder.abort()
    assert not store.existing_run_ids(tmp_path)
    assert not list(tmp_path.glob("*/.tmp-*")) and not list(tmp_path.glob("*/run_id=*"))


def test_run_result_is_the_recorded_row(tmp_path: Path):
    cell = one_cell(tmp_path)
    result = SimRunner().run(cell)
    assert isinstance(result, RunResult)
    assert result.run_id == cell.run_id and result.status == "ok" and result.error is None
    assert list(result.row) == RUNS.names  # every declared column, in order
    on_disk = store.read_table(tmp_path, "runs", {cell.run_id}).iloc[0]
    assert result.row["steps"] == on_disk["steps"] > 0
    assert result.to_row()["run_id"] == cell.run_id and "run_id" not in result.row


def test_arrivals_jump_only_when_idle_and_repeat_as_a_no_op():
    seqs = [Seq(i, i, 0, 10, 5, t, -1, 0) for i, t in enumerate((0.5, 0.5, 2.0))]
    arrivals = Arrivals(reversed(seqs))
    got: list[Seq] = []
    assert arrivals.release(0.0, False, got.append) == 0.0 and got == []  # busy: the clock stays
    assert arrivals.release(0.0, True, got.append) == 0.5 and got == seqs[:2]  # idle: jump, release both
    assert arrivals.release(0.5, False, got.append) == 0.5 and got == seqs[:2]  # repeated (now busy): nothing
    assert arrivals.release(3.0, False, got.append) == 3.0 and got == seqs


class Stuck:
    """An engine that takes requests and never computes anything (or schedules nothing at all)."""

    def __init__(self, scheduled_nothing: bool) -> None:
        self.now = 0.0
        self.held: list[Seq] = []
        self.scheduled_nothing = scheduled_nothing
        self.steps = 0

    def busy(self) -> bool:
        return bool(self.held)

    def admit(self, seq: Seq) -> None:
        self.held.append(seq)

    def record_quiet_steps(self, recorder: RunRecorder) -> int:
        return 0

    def step(self) -> StepRow | None:
        if self.scheduled_nothing:
            return None
        t, self.now = self.now, self.now + 1.0
        self.steps += 1
        return StepRow(self.steps - 1, t, 1.0, 0, len(self.held), *[0] * 15, None, None, None, None, None)

    def finish(self) -> dict[str, object]:
        return {"attention_backend": "stuck"}


@pytest.mark.parametrize("scheduled_nothing", [False, True])
def test_the_livelock_guard_ends_a_run_that_makes_no_progress(tmp_path: Path, scheduled_nothing: bool):
    cell = one_cell(tmp_path)
    seqs = expand_seqs(cell)
    engine = Stuck(scheduled_nothing)
    result = drive(cell, seqs, Arrivals(seqs), engine, base_row(cell, "sim"))
    assert result.status == "failed"
    if scheduled_nothing:
        assert result.error == "livelock: 6 engine steps without scheduler work"
        assert result.row["steps"] == 0
    else:
        assert result.error == "livelock: 6 steps without progress with 4 waiting and 0 running"
        assert result.row["steps"] == engine.steps
    assert result.row["attention_backend"] == "stuck"  # the engine's own columns reach the row
    assert not any(s.status == FINISHED for s in seqs)


def test_out_of_memory_is_recognised_once_for_every_runner():
    class OutOfMemoryError(RuntimeError):  # torch's and torch.cuda's name
        pass

    assert is_oom(MemoryError()) and is_oom(OutOfMemoryError("CUDA"))
    assert is_oom(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_oom(ValueError("... is less than requested memory for KV cache"))
    assert not is_oom(RuntimeError("shape mismatch")) and not is_oom(KeyError("out of memory"))
