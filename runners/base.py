"""The runner interface and the pieces every runner shares."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Protocol, runtime_checkable

from ..harness.specs import RunSpec
from ..workloads.table import Workload


@dataclasses.dataclass(frozen=True)
class Cell:
    """One run to perform: the spec, its id, the workload it runs, where records go."""

    spec: RunSpec
    workload: Workload
    out: Path
    progress: bool = False  # report progress within the cell on stderr (long single cells)

    @property
    def run_id(self) -> str:
        return self.spec.run_id(self.workload.workload_id)


@runtime_checkable
class Runner(Protocol):
    name: str

    def unavailable(self) -> str | None:
        """Why this runner cannot run on this machine (None when it can)."""

    def run(self, cell: Cell) -> dict[str, object]:
        """Run the cell, write its partitions, and return its run row."""
