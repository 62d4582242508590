"""The row-block builder: many steps' rows as one float64 block in the recorder's layout.

The fast path records runs of steps at once (``RunRecorder.add_step_rows``): one column per
``StepRow`` field, floats (integers are exact below 2**53), the measured columns null (NaN),
as ``SimEngine.step`` would have recorded them one by one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from ..records.recorder import MEASURED_FIELDS
from ..records.schema import StepRow

WIDTH = len(StepRow._fields)
_col = StepRow._fields.index
STEP, T_S, DT_S, RUNNING, WAITING, ADMITTED, FINISHED, PREEMPTED, SCHEDULED = map(
    _col, ("step", "t_s", "dt_s", "running", "waiting", "admitted", "finished", "preempted", "scheduled_tokens")
)
BLOCKS, ALLOCATED, USED, RESERVED, INTERNAL, EXTERNAL, FREE, EVICTED, RECOMPUTED_HIT, CACHED_FREE = map(
    _col,
    (
        "allocated_blocks",
        "allocated_positions",
        "used_positions",
        "reserved_positions",
        "internal_frag_positions",
        "external_frag_positions",
        "free_positions",
        "evicted_blocks",
        "recomputed_hit_tokens",
        "cached_free_blocks",
    ),
)

# A step's row before its varying columns are filled in: zeros, the unmeasured columns null.
_BLANK = np.array([math.nan if c in MEASURED_FIELDS else 0.0 for c in StepRow._fields])


def step_rows(
    step0: int,
    ts: np.ndarray,
    k: int,
    columns: Mapping[int, np.ndarray | Sequence[int] | float],
    events: Mapping[int, Iterable[tuple[int, int]]] | None = None,
) -> np.ndarray:
    """Rows of steps ``step0`` … ``step0 + k − 1``: ``ts`` holds their start times and then the
    end of the last (k + 1 values; ``dt_s`` is their difference); ``columns`` maps a column
    index to one value per step or one for all; ``events`` maps a column index to sparse
    (row, value) pairs over zeros (finishes, admissions, preemptions). Every column not named
    is zero, or null where it is measured. Allocation columns derived from others
    (positions from blocks, reserved, free) are the caller's: only it knows the block size."""
    rows = np.empty((k, WIDTH))
    rows[:] = _BLANK
    rows[:, STEP] = np.arange(step0, step0 + k, dtype=np.float64)
    rows[:, T_S] = ts[:k]
    np.subtract(ts[1 : k + 1], ts[:k], out=rows[:, DT_S])
    for col, values in columns.items():
        rows[:, col] = values
    for col, pairs in (events or {}).items():
        for j, v in pairs:
            rows[j, col] = v
    return rows


def paged_allocation(rows: np.ndarray, block_size: int, budget_positions: int) -> None:
    """Fill the allocation columns that follow from blocks, used and internal positions:
    allocated = blocks × block size, reserved = allocated − used − internal, free = budget − allocated."""
    alloc = rows[:, ALLOCATED]
    np.multiply(rows[:, BLOCKS], block_size, out=alloc)
    np.subtract(alloc, rows[:, USED], out=rows[:, RESERVED])
    rows[:, RESERVED] -= rows[:, INTERNAL]
    np.subtract(budget_positions, alloc, out=rows[:, FREE])
