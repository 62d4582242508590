"""The results directory: layout, crash-safe writes, and checked reads.

    DIR/runs/run_id=<id>/part-0.parquet       one row per run (written last)
    DIR/steps/run_id=<id>/part-0.parquet      one row per scheduler step
    DIR/requests/run_id=<id>/part-0.parquet   one row per request (sample)
    DIR/metrics/run_id=<id>/part-0.parquet    one row per /metrics scrape (serve runner only)
    DIR/kv_groups/run_id=<id>/part-0.parquet  one row per step and KV cache group (hybrid layouts only)
    DIR/workloads/<workload_id>.parquet       the exact workload used

Partitions are written under a dot-prefixed temporary name, made exclusively with a
random suffix (``harness.records.atomic``; readers ignore it), and renamed into
place, so a crash never leaves a half run that looks whole; a run exists once
its ``runs/`` partition exists, and it is complete when its steps and requests
partitions are there too, holding the row counts its run row records
(``incomplete_runs``). A write the environment refuses (disk full, no
permission, the directory removed) raises ``StorageError`` naming the path and
the cause, after removing its temporary
files; ``clean_stale_temps`` removes whatever a killed process left.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from ..errors import KvbenchError, StorageError, storage_error
from .atomic import replace_file, temp_folder
from .safe_paths import check_records, check_table, is_own_partition, own_file
from .schema import SCHEMA_VERSION, TABLES, VERSION_KEY, with_version

PART = "part-0.parquet"


def parquet_options(schema: pa.Schema) -> dict[str, object]:
    """How every table is written (``pq.write_table``'s and ``pq.ParquetWriter``'s options): integer
    columns delta-encoded (``DELTA_BINARY_PACKED``: step indices and block counts move by small
    steps, so each value packs into a few bits), the others plain, all Snappy-compressed, no
    dictionary pages (on such columns a dictionary saves little and is the costliest part of
    writing): faster to write and fewer bytes than pyarrow's defaults on these tables."""
    ints = {f.name: "DELTA_BINARY_PACKED" for f in schema if pa.types.is_integer(f.type)}
    return {"use_dictionary": False, "column_encoding": ints}


def partition_dir(out: Path, table: str, run_id: str) -> Path:
    return out / table / f"run_id={run_id}"


def temp_prefix(run_id: str) -> str:
    """The start of a temporary partition folder's name (``atomic.temp_folder`` adds a random end)."""
    return f".tmp-run_id={run_id}-"


def existing_run_ids(out: Path) -> set[str]:
    runs = out / "runs"
    try:
        return {
            p.name.split("=", 1)[1]
            for p in runs.iterdir()
            if p.name.startswith("run_id=") and not p.is_symlink() and (p / PART).is_file()
        }
    except (FileNotFoundError, NotADirectoryError):
        return set()
    except OSError as exc:
        raise storage_error(runs, exc, "cannot read") from None


def incomplete_runs(out: Path, run_ids: set[str] | None = None) -> dict[str, str]:
    """Runs (of ``run_ids``, or all) whose run row exists but whose records are not whole,
    each with the reason: a steps or requests partition missing, unreadable, or holding a
    number of rows other than the run row records. Runs recorded before the counts were kept
    are checked for presence only."""
    present = existing_run_ids(out)
    ids = present if run_ids is None else present & set(run_ids)
    if not ids:
        return {}
    try:
        rows = read_table(out, "runs", ids)
    except KvbenchError as exc:
        return {rid: str(exc) for rid in ids}
    counts = {
        r["run_id"]: r for r in rows[["run_id", "steps_rows", "requests_rows", "kv_groups_rows"]].to_dict("records")
    }
    problems: dict[str, str] = {}
    for rid in sorted(ids):
        grouped = counts.get(rid, {}).get("kv_groups_rows")
        tables = (
            ("steps", "requests", "kv_groups") if grouped is not None and grouped == grouped else ("steps", "requests")
        )
        for table in tables:
            path = partition_dir(out, table, rid) / PART
            if not path.is_file():
                problems[rid] = f"{path.relative_to(out)} is missing"
                break
            try:
                found = pq.read_metadata(path).num_rows
            except (pa.ArrowInvalid, OSError) as exc:
                problems[rid] = f"{path.relative_to(out)} is not readable ({str(exc).splitlines()[0]})"
                break
            expected = counts.get(rid, {}).get(f"{table}_rows")
            if expected is not None and expected == expected and int(expected) != found:
                problems[rid] = f"{path.relative_to(out)} holds {found} rows, the run row says {int(expected)}"
                break
    return problems


def complete_run_ids(out: Path) -> set[str]:
    """The runs of ``out`` whose records are whole (see ``incomplete_runs``)."""
    present = existing_run_ids(out)
    return present - set(incomplete_runs(out, present))


def check_complete(out: Path, run_ids: set[str] | None = None) -> None:
    """Refuse to read a results directory holding an incomplete run, naming the run: its numbers
    would be read as whole. The same ``kvbench run`` runs such a cell again."""
    check_records(out)  # no table read through a link into another directory
    problems = incomplete_runs(out, run_ids)
    if problems:
        rid, why = next(iter(problems.items()))
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise KvbenchError(
            f"{out}: run {rid} is incomplete: {why}{more}; run the same `kvbench run` again to record it whole"
        )


def publish(tmp: Path, final: Path) -> None:
    """Move a finished temporary partition into place, replacing an older one (a real
    partition folder only: never through a symbolic link, never a folder kvbench did not make)."""
    try:
        if os.path.lexists(final):
            if not is_own_partition(final, PART):
                shutil.rmtree(tmp, ignore_errors=True)
                raise StorageError(f"{final}: holds files kvbench did not write; move it away and run again")
            shutil.rmtree(final)
        os.replace(tmp, final)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise storage_error(final, exc) from None


def unpublish_run(out: Path, run_id: str) -> None:
    """Make a run not exist (its ``runs/`` partition gone) before its records are replaced, so
    that a rerun cut short never pairs the old run row with new steps."""
    final = partition_dir(out, "runs", run_id)
    if os.path.lexists(final):
        if not is_own_partition(final, PART):
            raise StorageError(f"{final}: holds files kvbench did not write; move it away and run again")
        try:
            shutil.rmtree(final)
        except OSError as exc:
            raise storage_error(final, exc, "cannot replace") from None


def drop_partition(out: Path, table: str, run_id: str) -> None:
    """Remove a run's partition of ``table`` if there is one kvbench wrote (nothing otherwise)."""
    final = partition_dir(out, table, run_id)
    if os.path.lexists(final) and is_own_partition(final, PART):
        try:
            shutil.rmtree(final)
        except OSError as exc:
            raise storage_error(final, exc, "cannot replace") from None


# Temporary names, per place: what a killed or faulted writer may leave behind.
STALE_PATTERNS: tuple[tuple[str, str], ...] = (
    *((table, ".tmp-run_id=*") for table in TABLES),
    ("workloads", ".*.tmp"),  # workloads.table.write_workload
    (".", ".reference.parquet*.tmp"),  # harness.records.reference.write_references
    (".", ".slo.parquet*.tmp"),  # harness.records.slo.write_slo
    (".", ".report.tmp-*"),  # reports.html.write_report
)


def clean_stale_temps(out: Path) -> None:
    """Remove temporary files left by killed or faulted runs, and the partitions (of every table
    but ``runs/``) of runs that never got their ``runs/`` partition (a run cut short between
    publishing its steps and its run row), so that the directory holds whole runs only.

    Only safe while no other process writes ``out``: ``kvbench run`` holds the directory's
    lock (``harness.records.lock``). Never raises: it is also the cleanup after a fault. Never follows
    a symbolic link, and removes an orphan partition only when it is one kvbench writes (a real
    folder holding its one Parquet file)."""
    for where, pattern in STALE_PATTERNS:
        d = out / where
        try:
            if d.is_symlink() or not d.is_dir():
                continue
            stale = list(d.glob(pattern))
        except OSError:
            continue
        for p in stale:
            try:
                if p.is_symlink():
                    continue  # not a name kvbench makes a link under: not ours
                shutil.rmtree(p) if p.is_dir() else p.unlink()
            except OSError:
                pass
    try:
        runs = existing_run_ids(out)
    except StorageError:
        return  # cannot tell whole runs from orphans: leave them
    for table in (t for t in TABLES if t != "runs"):
        d = out / table
        try:
            if d.is_symlink() or not d.is_dir():
                continue
            orphans = [p for p in d.glob("run_id=*") if p.name.split("=", 1)[1] not in runs]
        except OSError:
            continue
        for p in orphans:
            if is_own_partition(p, PART):
                shutil.rmtree(p, ignore_errors=True)


def make_temp_dir(out: Path, table: str, run_id: str) -> Path:
    """A new temporary partition directory, made exclusively under a random name.

    ``out`` must exist: it is never created here, so that a results directory removed during a
    run is not quietly recreated, half empty, by the next write (the run stops instead)."""
    if not out.is_dir():
        raise StorageError(f"{out}: the results directory does not exist (removed during the run?)")
    try:
        (out / table).mkdir(exist_ok=True)  # the table's folder; not its parents: out stays as it is
    except OSError as exc:
        raise storage_error(partition_dir(out, table, run_id), exc) from None
    try:
        return temp_folder(out / table, temp_prefix(run_id))
    except StorageError:
        raise StorageError(f"{partition_dir(out, table, run_id)}: cannot write (no temporary folder)") from None


def write_temp_partition(out: Path, table: str, run_id: str, data: pa.Table) -> Path:
    """Write a partition under its temporary name; the caller publishes it."""
    tmp = make_temp_dir(out, table, run_id)
    try:
        pq.write_table(
            data.replace_schema_metadata(with_version(TABLES[table]).metadata),
            tmp / PART,
            **parquet_options(data.schema),
        )
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise storage_error(partition_dir(out, table, run_id), exc) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tmp


def write_partition(out: Path, table: str, run_id: str, data: pa.Table) -> None:
    publish(write_temp_partition(out, table, run_id, data), partition_dir(out, table, run_id))


def replace_suite_rows(path: Path, suite: str, rows: list[dict], schema: pa.Schema, what: str) -> Path:
    """Replace ``suite``'s rows of a small per-directory file (``reference.parquet``,
    ``slo.parquet``) with ``rows``; other suites' rows stay. Written to a temporary file and
    renamed: an error or an interrupt never leaves half a file, nor the temporary one."""
    from ..errors import os_cause

    own_file(path)  # a link or a device there is not ours to replace
    keep: list[dict] = []
    if path.exists():
        try:
            keep = [r for r in pq.read_table(path).to_pylist() if r["suite"] != suite]
        except (pa.ArrowInvalid, OSError, KeyError) as exc:
            raise KvbenchError(
                f"{path}: not a readable {what} file ({os_cause(exc)}); remove it and run again"
            ) from None
    table = pa.Table.from_pylist(keep + rows, schema=schema).replace_schema_metadata(with_version(schema).metadata)
    with replace_file(path, what) as fh:
        pq.write_table(table, fh, **parquet_options(table.schema))
    return path


# -- reading ---------------------------------------------------------------------


def check_file(path: Path) -> None:
    """Refuse a corrupt file or one written by a newer kvbench, naming it."""
    try:
        meta = pq.read_metadata(path).metadata or {}
    except (pa.ArrowInvalid, OSError) as exc:
        raise KvbenchError(f"{path}: not a readable Parquet file ({str(exc).splitlines()[0]})") from None
    version = meta.get(VERSION_KEY)
    if version is None:
        raise KvbenchError(f"{path}: no kvbench.schema_version in its metadata; not a kvbench file")
    try:
        v = int(version)
    except ValueError:
        raise KvbenchError(f"{path}: bad kvbench.schema_version {version!r}") from None
    if v > SCHEMA_VERSION:
        raise KvbenchError(
            f"{path}: written with schema version {v}, this kvbench reads up to {SCHEMA_VERSION}; upgrade kvbench"
        )


def read_table(out: Path, table: str, run_ids: set[str] | None = None) -> pd.DataFrame:
    """One table of a results directory as a DataFrame with a ``run_id`` column."""
    root = Path(out) / table
    check_table(Path(out), table)  # never read through a link into another directory
    if not root.is_dir():
        raise KvbenchError(f"{out}: no {table}/ directory; is this a kvbench results directory?")
    files = sorted(
        p for p in root.glob(f"run_id=*/{PART}") if run_ids is None or p.parent.name.split("=", 1)[1] in run_ids
    )
    if not files:
        return pd.DataFrame(
            {
                "run_id": pd.Series(dtype=str),
                **{
                    f.name: pd.Series(dtype=f.type.to_pandas_dtype())
                    for f in TABLES[table]
                    if f.name != "run_id" and not pa.types.is_timestamp(f.type)
                },
            }
        )
    for f in files:
        check_file(f)
    try:
        # The declared schema, not the first file's: a column added since older files were
        # written reads as null in them instead of vanishing from every file.
        schema = TABLES[table].append(pa.field("run_id", pa.string()))
        dataset = ds.dataset(
            [str(f) for f in files], schema=schema, format="parquet", partitioning="hive", partition_base_dir=str(root)
        )
        frame = dataset.to_table().to_pandas()
    except (pa.ArrowInvalid, OSError) as exc:
        raise KvbenchError(f"{root}: cannot read ({str(exc).splitlines()[0]})") from None
    if "run_id" in frame.columns:
        frame["run_id"] = frame["run_id"].astype(str)
    return frame
