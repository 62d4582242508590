"""Running one cell where a sweep puts it (this process, a worker process, a Ray task): any
failure of the cell becomes a ``failed`` (or ``oom``) row, never a lost run; a fault of the
environment (``StorageError``) or an interrupt propagates, because it says nothing about the
cell and the sweep must stop."""

from __future__ import annotations

import traceback

from ..harness.errors import KvbenchError, StorageError, one_line
from ..harness.records.statuses import FAILED, OOM
from ..runners import availability, get_runner
from ..runners.base import Cell, RunResult
from ..runners.common import base_row, write_status_only


def run_cell(cell: Cell) -> dict[str, object]:
    """Run one cell and return its run row as recorded (with ``run_id``)."""
    return _run_or_fail(cell).to_row()


def _run_or_fail(cell: Cell) -> RunResult:
    try:
        reason = availability(cell.spec.runner)
        if reason is not None:
            return write_status_only(cell, base_row(cell, cell.spec.runner), FAILED, one_line(reason))
        return get_runner(cell.spec.runner).run(cell)
    except StorageError:
        raise  # the environment, not the cell: recording a failed row would need the same disk
    except KvbenchError as exc:
        return write_status_only(cell, base_row(cell, cell.spec.runner), FAILED, one_line(str(exc)))
    except MemoryError:
        return write_status_only(cell, base_row(cell, cell.spec.runner), OOM, "out of host memory")
    except Exception as exc:  # a bug in a runner must not end the sweep
        detail = traceback.format_exception_only(type(exc), exc)[-1].strip()
        return write_status_only(cell, base_row(cell, cell.spec.runner), FAILED, one_line(detail))
