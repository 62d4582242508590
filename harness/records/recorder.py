"""Recording one run: steps streamed in record batches, requests and the run row at the end.

Step rows, however they arrive (``add_step``, ``add_steps``, ``add_step_rows``), land in one
float64 buffer (NaN a null, integers exact below 2**53) and leave it as Parquet row groups of
``BATCH_ROWS`` rows, so memory stays flat and the file and the run summary are the same bit for
bit whatever the mix of calls. A full row group is written on a thread of its own
(``_Background``: pyarrow works without the GIL) while the run goes on; ``settle`` waits for it,
and a runner settles before it stops its step loop's clock. ``finish`` writes every table under
a temporary name before it publishes any, the run row last: a full disk or an interrupt leaves
the whole run or none of it (docs/records.md, docs/reliability.md).
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import StorageError, storage_error
from . import store
from .schema import (
    CPU_TIER_STEP_COLUMNS,
    KV_GROUPS,
    METRICS,
    OK,
    REQUESTS,
    RUNS,
    STATUSES,
    STEPS,
    StepRow,
    with_version,
)

BATCH_ROWS = 16_384
STEP_FIELDS: tuple[str, ...] = StepRow._fields  # STEPS's columns (checked where StepRow is declared)
_I = {name: i for i, name in enumerate(STEP_FIELDS)}
_FLOAT = [pa.types.is_floating(f.type) for f in STEPS]
_EXACT = float(2**53)
# Null unless a runner measures steps (integers held in the float64 buffer are exact below 2**53).
MEASURED_FIELDS = ("kv_bytes_allocated", "step_wall_s", "scheduled_seqs", "context_tokens", "attention_pairs")
# The columns a step row leaves null unless given: the measured ones and a CPU tier's (null for a
# run without a tier).
NULL_FIELDS: tuple[str, ...] = (*MEASURED_FIELDS, *CPU_TIER_STEP_COLUMNS)
_RUNS_NAMES = frozenset(RUNS.names)


class UnknownColumns(ValueError):
    """A run row names a column the schema does not declare: a programming error, not a fault of
    the run (``app.cell.run_cell`` still records the cell as failed, with this message)."""


def _seq_sum(start: float, terms: np.ndarray) -> float:
    """start + terms[0] + terms[1] + … left to right, as a Python loop adds them
    (``np.add.accumulate`` is sequential; ``np.sum`` is pairwise and is not)."""
    acc = np.empty(len(terms) + 1)
    acc[0] = start
    acc[1:] = terms
    return float(np.add.accumulate(acc)[-1])


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
        self.recomputed_hit_tokens = 0
        self.peak_kv_bytes: int | None = None
        self.wall_sum = 0.0
        self.wall_n = 0

    def add_many(self, columns: Sequence[np.ndarray]) -> None:
        """Add the rows of ``columns`` (``STEP_FIELDS`` order, float64 or int arrays of equal
        length; NaN is a null). The time-weighted sums are accumulated in row order, so they are
        the floats a row-by-row loop would give, however the rows were buffered."""
        n = len(columns[0])
        if n == 0:
            return
        dt = columns[_I["dt_s"]]
        self.steps += n
        self.time = _seq_sum(self.time, dt)
        for attr, name in (
            ("w_used", "used_positions"),
            ("w_reserved", "reserved_positions"),
            ("w_internal", "internal_frag_positions"),
            ("w_external", "external_frag_positions"),
            ("w_free", "free_positions"),
            ("w_running", "running"),
        ):
            setattr(self, attr, _seq_sum(getattr(self, attr), dt * columns[_I[name]]))
        peak = int(columns[_I["running"]].max())
        if peak > self.peak_running:
            self.peak_running = peak
        for attr, name in (
            ("preemptions", "preempted"),
            ("evictions", "evicted_blocks"),
            ("computed_tokens", "scheduled_tokens"),
            ("prefix_hit_tokens", "prefix_hit_tokens"),
            ("recomputed_hit_tokens", "recomputed_hit_tokens"),
        ):
            setattr(self, attr, getattr(self, attr) + int(columns[_I[name]].astype(np.int64).sum()))
        kv = columns[_I["kv_bytes_allocated"]]
        kv = kv[~np.isnan(kv)]
        if len(kv):
            top = int(kv.max())
            if self.peak_kv_bytes is None or top > self.peak_kv_bytes:
                self.peak_kv_bytes = top
        wall = columns[_I["step_wall_s"]]
        wall = wall[~np.isnan(wall)]
        if len(wall):
            self.wall_sum = _seq_sum(self.wall_sum, wall)
            self.wall_n += len(wall)

    def fractions(self) -> dict[str, float | None]:
        denom = self.time * self.budget
        if denom <= 0:
            return {
                k: None
                for k in (
                    "token_states_frac",
                    "reservation_frac",
                    "internal_frag_frac",
                    "external_frag_frac",
                    "free_frac",
                )
            }
        return {
            "token_states_frac": self.w_used / denom,
            "reservation_frac": self.w_reserved / denom,
            "internal_frag_frac": self.w_internal / denom,
            "external_frag_frac": self.w_external / denom,
            "free_frac": self.w_free / denom,
        }


def _arrow(values: np.ndarray, field: pa.Field, is_float: bool) -> pa.Array:
    """One buffered column as the schema's Arrow array (NaN → null; integers checked exact)."""
    values = np.ascontiguousarray(values)
    nulls = np.isnan(values)
    if nulls.all():
        return pa.nulls(len(values), type=field.type)
    mask = nulls if nulls.any() else None
    if is_float:
        return pa.array(values, type=field.type, mask=mask)
    live = values[~nulls] if mask is not None else values
    if len(live) and not (np.abs(live).max() < _EXACT):
        raise OverflowError(f"steps.{field.name}: {np.abs(live).max()} is past what the buffer holds exactly")
    ints = np.where(nulls, 0.0, values) if mask is not None else values
    return pa.array(ints.astype(np.int64), type=field.type, mask=mask)


class _Background:
    """A Parquet writer fed one record batch at a time on a thread of its own (started at the
    first batch): pyarrow encodes, compresses and writes without the GIL, so the caller's thread
    runs on meanwhile (the batch is built in the caller's: Python work there would only take
    turns with it). ``put`` hands a batch over once the one before it is written; a write's error
    is raised by the next ``put`` or by ``wait``, in the caller's thread."""

    def __init__(self, writer: pq.ParquetWriter) -> None:
        self.writer = writer
        self._pool: ThreadPoolExecutor | None = None
        self._pending: Future[None] | None = None

    def put(self, batch: pa.RecordBatch) -> None:
        self.wait()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvbench-steps")
        self._pending = self._pool.submit(self.writer.write_batch, batch)

    def wait(self) -> None:
        """Until the batch in flight, if any, is written; its error raised here."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def stop(self) -> None:
        """Wait for the batch in flight (its error ignored: the caller is failing already, or has
        waited) and end the thread."""
        try:
            self.wait()
        except BaseException:
            pass
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


class RunRecorder:
    """Writes one run's partitions under ``out`` (which must exist); publish order: steps,
    requests, runs."""

    def __init__(self, out: Path, run_id: str, budget_positions: int) -> None:
        self.out = Path(out)
        self.run_id = run_id
        self._summary = StepSummary(budget_positions)
        self._tmp_steps = store.make_temp_dir(self.out, "steps", run_id)
        self._writer: pq.ParquetWriter | None = None
        try:
            self._writer = pq.ParquetWriter(
                self._tmp_steps / store.PART, with_version(STEPS), **store.parquet_options(STEPS)
            )
        except OSError as exc:
            self.abort()
            raise self._failed("steps", exc) from None
        self._background = _Background(self._writer)
        # Buffered steps, one row per step, one float64 column per field (NaN: null). Unused
        # rows hold the "nothing" row (0, nulls as NaN), so bulk writes skip such columns.
        self._blank = np.array([math.nan if name in NULL_FIELDS else 0.0 for name in STEP_FIELDS])
        self._buf = np.tile(self._blank, (2 * BATCH_ROWS, 1))
        self._n = 0
        self._summarized = 0  # rows of the buffer already in the summary
        self._groups = _GroupRows()  # the kv_groups rows

    @property
    def summary(self) -> StepSummary:
        """Running totals over every step flushed so far (``finish`` flushes the rest first;
        ``complete_row`` reads it after the step loop, so it covers every step)."""
        self._flush()
        return self._summary

    def add_step(self, row: StepRow) -> None:
        self._buf[self._n] = row  # a tuple: None → NaN
        self._n += 1
        if self._n >= BATCH_ROWS:
            self._flush()

    def add_steps(self, columns: Sequence[object], n: int) -> None:
        """Record ``n`` consecutive steps at once, column-wise in ``STEP_FIELDS`` order: each
        column an array of ``n`` values or one value (None: null) for all ``n`` rows. The
        steps table and the summary are the same as from ``n`` calls of ``add_step``."""
        if n <= 0:
            return
        assert len(columns) == len(STEP_FIELDS)
        if self._n + n > len(self._buf):
            grown = np.tile(self._blank, (self._n + n + BATCH_ROWS, 1))
            grown[: self._n] = self._buf[: self._n]
            self._buf = grown
        rows = self._buf[self._n : self._n + n]
        for i, value in enumerate(columns):
            if isinstance(value, np.ndarray):
                assert len(value) == n, (len(value), n)
                rows[:, i] = value
            elif value is None:
                if not math.isnan(self._blank[i]):
                    rows[:, i] = math.nan
            elif value != self._blank[i]:
                rows[:, i] = value
        self._n += n
        if self._n >= BATCH_ROWS:
            self._flush()

    def add_step_rows(self, rows: np.ndarray) -> None:
        """Record steps given as a (steps × ``STEP_FIELDS``) float64 block in the buffer's own
        layout: NaN for a null, integers as exact floats (below 2**53). The fastest bulk form."""
        n = len(rows)
        if n == 0:
            return
        if self._n + n > len(self._buf):
            grown = np.tile(self._blank, (self._n + n + BATCH_ROWS, 1))
            grown[: self._n] = self._buf[: self._n]
            self._buf = grown
        self._buf[self._n : self._n + n] = rows
        self._n += n
        if self._n >= BATCH_ROWS:
            self._flush()

    def add_kv_groups(self, rows: Sequence[tuple[int, int, str, int, int]]) -> None:
        """Record a step's KV cache group rows (``KV_GROUPS``'s columns, in order)."""
        self._groups.rows.extend(rows)

    def add_kv_group_columns(
        self, step: np.ndarray, group: np.ndarray, kinds: Sequence[str], blocks: np.ndarray, used: np.ndarray
    ) -> None:
        """Record many steps' KV cache group rows at once, column-wise: row ``i`` is ``(step[i],
        group[i], kinds[group[i]], blocks[i], used[i])``. The table is the same as from
        ``add_kv_groups`` with those rows."""
        self._groups.add_columns(step, group, kinds, blocks, used)

    def _flush(self, final: bool = False) -> None:
        """Summarise the buffer and write it as row groups of ``BATCH_ROWS`` rows (and, when
        ``final``, the rest); the rows of an incomplete group stay buffered."""
        n = self._n
        done = n if final else n - n % BATCH_ROWS
        if done == 0 or self._writer is None:
            if self._n and not final:
                self._summarize_pending()
            return
        self._summarize_pending()
        buf = self._buf
        for start in range(0, done, BATCH_ROWS):
            stop = min(start + BATCH_ROWS, done)
            # A full batch's columns are copies (strided slices of the buffer), so it is written while
            # the buffer moves on; the last, short one may share the buffer's memory: waited for.
            batch = pa.RecordBatch.from_arrays(
                [_arrow(buf[start:stop, i], field, _FLOAT[i]) for i, field in enumerate(STEPS)], schema=STEPS
            )
            try:
                self._background.put(batch)
                if final:
                    self._background.wait()
            except OSError as exc:
                raise self._failed("steps", exc) from None
        rest = n - done
        buf[:rest] = buf[done:n]
        buf[rest:n] = self._blank
        self._n = rest
        self._summarized = min(self._summarized, n) - done

    def settle(self) -> None:
        """Until every full batch handed over is written (the step loop's clock stops after this)."""
        try:
            self._background.wait()
        except OSError as exc:
            raise self._failed("steps", exc) from None

    def _summarize_pending(self) -> None:
        lo, hi = self._summarized, self._n
        if hi > lo:
            rows = self._buf[lo:hi]
            self._summary.add_many([rows[:, i] for i in range(len(STEP_FIELDS))])
            self._summarized = hi

    def _failed(self, table: str, exc: OSError) -> StorageError:
        return storage_error(store.partition_dir(self.out, table, self.run_id), exc)

    def finish(
        self, requests: dict[str, list], run_row: Mapping[str, object], metrics: pa.Table | None = None
    ) -> dict[str, object]:
        """Write steps, requests (and ``metrics``, a served engine's scrapes, when given) and the
        run row under temporary names, then publish them in that order: the run row last, since it
        is what makes the run exist. Returns the run row as written: every ``RUNS`` column, in
        order, a missing one and NaN as None."""
        tmps: list[Path] = [self._tmp_steps]
        published: list[str] = []
        try:
            unknown = [key for key in run_row if key not in _RUNS_NAMES]
            if unknown:
                raise UnknownColumns(
                    f"run row: {', '.join(map(repr, unknown))} not in harness.records.schema.RUNS "
                    f"(declare the column there, or stop setting it)"
                )
            if run_row.get("status", OK) not in STATUSES:
                raise ValueError(f"run row: status {run_row['status']!r} is not one of {', '.join(STATUSES)}")
            self._flush(final=True)
            self.settle()  # a batch still in flight where nothing was left to flush
            self._background.stop()
            if self._writer is not None:
                writer, self._writer = self._writer, None
                try:
                    _close(writer)
                except OSError as exc:
                    raise self._failed("steps", exc) from None
            if not self._tmp_steps.is_dir():  # the results directory was removed under the run:
                # stop here rather than create a new one for the requests and the run row
                raise StorageError(f"{self.out}: the results directory was removed during the run")
            req_table = pa.Table.from_pydict(requests, schema=REQUESTS)
            tmps.append(store.write_temp_partition(self.out, "requests", self.run_id, req_table))
            tables = ["steps", "requests"]
            if metrics is not None:
                tmps.append(store.write_temp_partition(self.out, "metrics", self.run_id, metrics.cast(METRICS)))
                tables.append("metrics")
            n_groups = self._groups.count()
            if n_groups:
                groups = self._groups.table()
                tmps.append(store.write_temp_partition(self.out, "kv_groups", self.run_id, groups))
                tables.append("kv_groups")
            row = {name: run_row.get(name) for name in RUNS.names}
            # What the run's partitions hold: how a reader tells a whole run from one that lost a file.
            row["steps_rows"] = self._summary.steps
            row["requests_rows"] = req_table.num_rows
            row["kv_groups_rows"] = n_groups or None
            for key, value in row.items():  # NaN → null: a missing measurement, not a number
                if isinstance(value, float) and math.isnan(value):
                    row[key] = None
            tmps.append(
                store.write_temp_partition(self.out, "runs", self.run_id, pa.Table.from_pylist([row], schema=RUNS))
            )
            store.unpublish_run(self.out, self.run_id)  # a rerun: the old run stops existing first
            if metrics is None:
                store.drop_partition(self.out, "metrics", self.run_id)  # an older run's scrapes
            if not n_groups:
                store.drop_partition(self.out, "kv_groups", self.run_id)
            for table, tmp in zip((*tables, "runs"), tmps):
                store.publish(tmp, store.partition_dir(self.out, table, self.run_id))
                published.append(table)
        except BaseException:
            self.abort()
            for tmp in tmps:
                shutil.rmtree(tmp, ignore_errors=True)
            if "runs" not in published:  # no run row: its steps and requests are orphans
                for table in published:
                    shutil.rmtree(store.partition_dir(self.out, table, self.run_id), ignore_errors=True)
            raise
        return row

    def abort(self) -> None:
        """Drop the run's temporary files; never raises (it runs on the way out of a failure)."""
        background = getattr(self, "_background", None)  # absent where opening the writer failed
        if background is not None:
            background.stop()  # no write lands in the files removed below
        if self._writer is not None:
            writer, self._writer = self._writer, None
            try:
                _close(writer)  # flushes a footer: may itself fail on a full disk
            except OSError:
                pass
        shutil.rmtree(self._tmp_steps, ignore_errors=True)


class _GroupRows:
    """The kv_groups rows in arrival order: blocks of Arrow columns, then the rows given one
    tuple at a time since the last block (turned into a block when columns follow them)."""

    def __init__(self) -> None:
        self.blocks: list[list[pa.Array]] = []
        self.rows: list[tuple[int, int, str, int, int]] = []
        self._n = 0  # rows in ``blocks``

    def count(self) -> int:
        return self._n + len(self.rows)

    def _close_rows(self) -> None:
        if self.rows:
            columns = zip(*self.rows)
            self.blocks.append([pa.array(c, f.type) for c, f in zip(columns, KV_GROUPS)])
            self._n += len(self.rows)
            self.rows = []

    def add_columns(
        self, step: np.ndarray, group: np.ndarray, kinds: Sequence[str], blocks: np.ndarray, used: np.ndarray
    ) -> None:
        if not len(step):
            return
        self._close_rows()
        index = pa.array(group, pa.int32())
        kind = pa.array(kinds, pa.string()).take(index)
        types = [f.type for f in KV_GROUPS]
        self.blocks.append(
            [pa.array(step, types[0]), index, kind, pa.array(blocks, types[3]), pa.array(used, types[4])]
        )
        self._n += len(step)

    def table(self) -> pa.Table:
        """Every row, one chunk a column (as ``pa.array`` over all rows at once gives)."""
        self._close_rows()
        columns = [pa.concat_arrays([b[i] for b in self.blocks]) for i in range(len(KV_GROUPS))]
        return pa.Table.from_arrays(columns, schema=KV_GROUPS)


def _close(writer: pq.ParquetWriter) -> None:
    """Close a writer; if that fails (its footer did not fit on the disk), mark it closed all
    the same: pyarrow's ``__del__`` would otherwise close it again and print the same error as
    an 'Exception ignored' traceback on stderr, long after the one line was printed."""
    try:
        writer.close()
    except BaseException:
        writer.is_open = False
        raise
