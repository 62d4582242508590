"""The row-block builder: many steps' rows as one float64 block in the recorder's layout.

The fast path records runs of steps at once (``RunRecorder.add_step_rows``): one column per
``StepRow`` field, floats (integers are exact below 2**53), the measured columns and a CPU
tier's null (NaN), as ``SimEngine.step`` would have recorded them one by one.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from ..records.recorder import NULL_FIELDS
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

LEVEL = 8  # values per level (``StepLog.level``)
# A step's row before its varying columns are filled in: zeros, the unmeasured columns and the
# CPU tier's null.
_BLANK = np.array([math.nan if c in NULL_FIELDS else 0.0 for c in StepRow._fields])


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
    is zero, or null where it is measured or a CPU tier's. Allocation columns derived from others
    (positions from blocks, reserved, free) are the caller's: only it knows the block size."""
    rows = np.empty((k, WIDTH))
    rows[:] = _BLANK
    rows[:, STEP] = np.arange(step0, step0 + k, dtype=np.float64)
    rows[:, T_S] = ts[:k]
    np.subtract(ts[1 : k + 1], ts[:k], out=rows[:, DT_S])
    for col, values in columns.items():
        rows[:, col] = values
    for col, pairs in (events or {}).items():
        if pairs:
            at, values = zip(*pairs)
            rows[list(at), col] = values
    return rows


class StepLog:
    """The rows of a counted stretch as it takes its steps: per step, the columns that may move
    every step (start time; blocks allocated and cached free blocks after scheduling); per
    *level*, the ones that move only at events (scheduled tokens, running, waiting, external and
    internal fragmentation, the positions allocated beyond ``per_block`` a block: a contiguous
    policy's reservations) and the used positions at its first step, which grow by its scheduled
    tokens a step (every step of a level computes them), from the step a level starts; and the
    events, sparse (step, value) pairs. Columns are typed arrays, so ``rows`` reads them without
    converting a Python object per value."""

    __slots__ = ("per_block", "ts", "blocks", "cached", "levels", "events", "evicted")

    def __init__(self, per_block: int) -> None:
        self.per_block = per_block
        self.ts = array("d")
        self.blocks = array("q")
        self.cached = array("q")
        # The levels, ``LEVEL`` values each, one after another: first step, scheduled tokens,
        # running, waiting, external, internal, positions allocated beyond the blocks', used
        # positions at the first step.
        self.levels = array("q")
        self.events: dict[int, list[tuple[int, int]]] = {
            c: [] for c in (FINISHED, ADMITTED, PREEMPTED, EVICTED, PREFIX_HIT, RECOMPUTED_HIT)
        }
        self.evicted = self.events[EVICTED]  # the plain steps append to it directly

    def row(self, t_s: float, blocks: int, cached: int) -> None:
        """One step, starting at ``t_s``: its per-step columns (its level is the last ``level``)."""
        self.ts.append(t_s)
        self.blocks.append(blocks)
        self.cached.append(cached)

    def steady(self, times: list[float], m: int, blocks: int, cached: int) -> None:
        """``m`` steps starting at ``times[:m]`` in which nothing is allocated or freed: the
        blocks and cached free blocks stay."""
        self.ts.extend(times[:m])
        self.blocks.extend(array("q", (blocks,)) * m)
        self.cached.extend(array("q", (cached,)) * m)

    def level(
        self,
        step: int,
        scheduled: int,
        running: int,
        waiting: int,
        external: int,
        internal: int,
        beyond: int,
        used: int,
    ) -> None:
        """From ``step`` on (until the next level): scheduled tokens, running, waiting, external
        and internal fragmentation, positions allocated beyond the blocks'; ``used``: the used
        positions at ``step`` (``scheduled`` more at each step after it)."""
        self.levels.extend((step, scheduled, running, waiting, external, internal, beyond, used))

    def event(self, col: int, step: int, value: int) -> None:
        """``value`` in column ``col`` at ``step`` (once per step and column; 0 is no event)."""
        if value:
            self.events[col].append((step, value))

    def rows(self, step0: int, t_end: float, budget_positions: int) -> np.ndarray:
        """The logged steps as rows from ``step0`` on, the last ending at ``t_end``."""
        k = len(self.ts)
        ts = np.empty(k + 1)
        ts[:k] = np.frombuffer(self.ts)
        ts[k] = t_end

        def ints(values: array[int]) -> np.ndarray:
            return np.frombuffer(values, dtype=np.int64)

        levels = ints(self.levels).reshape(-1, LEVEL)
        first, sched, running, waiting, external, internal, beyond, used = np.repeat(
            levels, np.diff(levels[:, 0], append=k), axis=0
        ).T
        used += sched * (np.arange(k) - first)
        blocks = ints(self.blocks)
        alloc = blocks * self.per_block + beyond
        rows = step_rows(
            step0,
            ts,
            k,
            {
                BLOCKS: blocks,
                ALLOCATED: alloc,
                INTERNAL: internal,
                USED: used,
                CACHED_FREE: ints(self.cached),
                SCHEDULED: sched,
                RUNNING: running,
                WAITING: waiting,
                EXTERNAL: external,
                RESERVED: alloc - used - internal,
                FREE: budget_positions - alloc,
            },
            self.events,
        )
        return rows
