"""The ``sim`` runner: kvbench's scheduler and an allocation policy, no tensors."""

from __future__ import annotations

from runners.base import Cell
from runners.common import drive


class SimRunner:
    name = "sim"

    def unavailable(self) -> str | None:
        return None

    def run(self, cell: Cell) -> dict[str, object]:
        return drive(cell, self.name)
