"""The runner interface and the pieces every runner shares."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol, runtime_checkable

from ..harness.spec.specs import RunSpec
from ..workloads.table import Workload


@dataclasses.dataclass(frozen=True)
class Cell:
    """One run to perform: the spec, its id, the workload it runs, where records go."""

    spec: RunSpec
    workload: Workload
    out: Path
    progress: bool = False  # report progress within the cell on stderr (long single cells)
    workload_name: str | None = None  # the suite's name for the workload (reports show it; not identity)

    @property
    def run_id(self) -> str:
        return self.spec.run_id(self.workload.workload_id)


@dataclasses.dataclass(frozen=True)
class RunResult:
    """What a run left: its run row exactly as recorded (``RunRecorder.finish``: every ``RUNS``
    column, in order, nulls as None; read-only by contract, a plain dict so that it pickles
    across worker processes and Ray) and its id (the partition key, not a column)."""

    run_id: str
    row: Mapping[str, object] = dataclasses.field(hash=False)

    @property
    def status(self) -> str:
        return str(self.row["status"])

    @property
    def error(self) -> str | None:
        error = self.row["error"]
        return None if error is None else str(error)

    def to_row(self) -> dict[str, object]:
        """The run row with its ``run_id``: what ``app.cell.run_cell`` hands the sweep."""
        return {**self.row, "run_id": self.run_id}


@runtime_checkable
class Runner(Protocol):
    name: str

    def unavailable(self) -> str | None:
        """Why this runner cannot run on this machine (None when it can)."""

    def run(self, cell: Cell) -> RunResult:
        """Run the cell, write its partitions, and return what was recorded."""
