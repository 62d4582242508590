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
BLOCKS, ALLOCATED, USED, RESERVED, INTERNAL, EXTERNAL, FREE, EVICTED, PREFIX_HIT, RECOMPUTED_HIT, CACHED_FREE = map(
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
        "prefix_hit_tokens",
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


class StepLog:
    """The rows of a counted stretch as it takes its steps: per step, the columns that may move
    every step (start time; blocks, positions, internal fragmentation, used positions and cached
    free blocks after scheduling); per *level*, the ones that move only at events (scheduled
    tokens, running, waiting, external fragmentation), from the step a level starts; and the
    events, sparse (step, value) pairs."""

    __slots__ = ("ts", "blocks", "alloc", "internal", "used", "cached", "levels", "events", "evicted")

    def __init__(self) -> None:
        self.ts: list[float] = []
        self.blocks: list[int] = []
        self.alloc: list[int] = []
        self.internal: list[int] = []
        self.used: list[int] = []
        self.cached: list[int] = []
        self.levels: list[tuple[int, int, int, int, int]] = []
        self.events: dict[int, list[tuple[int, int]]] = {
            c: [] for c in (FINISHED, ADMITTED, PREEMPTED, EVICTED, PREFIX_HIT, RECOMPUTED_HIT)
        }
        self.evicted = self.events[EVICTED]  # the plain steps append to it directly

    def row(
        self,
        step: int,
        t_s: float,
        totals: tuple[int, int, int, int, int],
        level: tuple[int, int, int, int, int],
    ) -> None:
        """Step ``step``, starting at ``t_s``: its per-step columns (blocks, positions, internal,
        used, cached free blocks) and its level (``level``'s form)."""
        self.ts.append(t_s)
        blocks, alloc, internal, used, cached = totals
        self.blocks.append(blocks)
        self.alloc.append(alloc)
        self.internal.append(internal)
        self.used.append(used)
        self.cached.append(cached)
        self.levels.append(level)

    def level(self, step: int, scheduled: int, running: int, waiting: int, external: int) -> None:
        """From ``step`` on (until the next level): these values."""
        self.levels.append((step, scheduled, running, waiting, external))

    def event(self, col: int, step: int, value: int) -> None:
        """``value`` in column ``col`` at ``step`` (once per step and column; 0 is no event)."""
        if value:
            self.events[col].append((step, value))

    def rows(self, step0: int, t_end: float, budget_positions: int) -> np.ndarray:
        """The logged steps as rows from ``step0`` on, the last ending at ``t_end``."""
        k = len(self.ts)
        ts = np.empty(k + 1)
        ts[:k] = self.ts
        ts[k] = t_end
        levels = np.array(self.levels, dtype=np.float64)
        starts = levels[:, 0].astype(np.int64)
        rep = np.repeat(levels[:, 1:], np.diff(starts, append=k), axis=0)
        cols = np.array((self.blocks, self.alloc, self.internal, self.used, self.cached), dtype=np.float64)
        rows = step_rows(
            step0,
            ts,
            k,
            {
                BLOCKS: cols[0],
                ALLOCATED: cols[1],
                INTERNAL: cols[2],
                USED: cols[3],
                CACHED_FREE: cols[4],
                SCHEDULED: rep[:, 0],
                RUNNING: rep[:, 1],
                WAITING: rep[:, 2],
                EXTERNAL: rep[:, 3],
            },
            self.events,
        )
        np.subtract(cols[1], cols[3], out=rows[:, RESERVED])
        rows[:, RESERVED] -= cols[2]
        np.subtract(budget_positions, cols[1], out=rows[:, FREE])
        return rows
