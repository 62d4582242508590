"""The results directory: layout, crash-safe writes, and checked reads.

    DIR/runs/run_id=<id>/part-0.parquet       one row per run (written last)
    DIR/steps/run_id=<id>/part-0.parquet      one row per scheduler step
    DIR/requests/run_id=<id>/part-0.parquet   one row per request (sample)
    DIR/workloads/<workload_id>.parquet       the exact workload used

Partitions are written under a dot-prefixed temporary name (which readers
ignore) and renamed into place, so a crash never leaves a half run that looks
whole; a run exists once its ``runs/`` partition exists. A write the
environment refuses (disk full, no permission, the directory removed) raises
``StorageError`` naming the path and the cause, after removing its temporary
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

from .errors import KvbenchError, StorageError, storage_error
from .schema import SCHEMA_VERSION, TABLES, VERSION_KEY, with_version

PART = "part-0.parquet"


def partition_dir(out: Path, table: str, run_id: str) -> Path:
    return out / table / f"run_id={run_id}"


def temp_dir(out: Path, table: str, run_id: str) -> Path:
    return out / table / f".tmp-run_id={run_id}-{os.getpid()}"


def run_exists(out: Path, run_id: str) -> bool:
    return (partition_dir(out, "runs", run_id) / PART).is_file()


def existing_run_ids(out: Path) -> set[str]:
    runs = out / "runs"
    try:
        return {p.name.split("=", 1)[1] for p in runs.iterdir()
                if p.name.startswith("run_id=") and (p / PART).is_file()}
    except (FileNotFoundError, NotADirectoryError):
        return set()
    except OSError as exc:
        raise storage_error(runs, exc, "cannot read") from None


def publish(tmp: Path, final: Path) -> None:
    """Move a finished temporary partition into place, replacing an older one."""
    try:
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise storage_error(final, exc) from None


def unpublish_run(out: Path, run_id: str) -> None:
    """Make a run not exist (its ``runs/`` partition gone) before its records are replaced, so
    that a rerun cut short never pairs the old run row with new steps."""
    final = partition_dir(out, "runs", run_id)
    if final.exists():
        try:
            shutil.rmtree(final)
        except OSError as exc:
            raise storage_error(final, exc, "cannot replace") from None


# Temporary names, per place: what a killed or faulted writer may leave behind.
STALE_PATTERNS: tuple[tuple[str, str], ...] = (
    *((table, ".tmp-run_id=*") for table in TABLES),
    ("workloads", ".*.tmp"),  # workloads.table.write_workload
    (".", ".reference.parquet.tmp"),  # harness.reference.write_references
    (".", ".report.tmp-*"),  # reports.html.write_report
)


def clean_stale_temps(out: Path) -> None:
    """Remove temporary files left by killed or faulted runs, and the steps and requests
    partitions of runs that never got their ``runs/`` partition (a run cut short between
    publishing its steps and its run row), so that the directory holds whole runs only.

    Only safe while no other process writes ``out``: ``kvbench run`` holds the directory's
    lock (``harness.lock``). Never raises: it is also the cleanup after a fault."""
    for where, pattern in STALE_PATTERNS:
        d = out / where
        try:
            stale = list(d.glob(pattern)) if d.is_dir() else []
        except OSError:
            continue
        for p in stale:
            try:
                shutil.rmtree(p) if p.is_dir() else p.unlink()
            except OSError:
                pass
    try:
        runs = existing_run_ids(out)
    except StorageError:
        return  # cannot tell whole runs from orphans: leave them
    for table in ("steps", "requests"):
        d = out / table
        try:
            orphans = [p for p in d.glob("run_id=*") if p.name.split("=", 1)[1] not in runs] if d.is_dir() else []
        except OSError:
            continue
        for p in orphans:
            shutil.rmtree(p, ignore_errors=True)


def make_temp_dir(out: Path, table: str, run_id: str) -> Path:
    """A fresh temporary partition directory (an older one of this process's is removed).

    ``out`` must exist: it is never created here, so that a results directory removed during a
    run is not quietly recreated, half empty, by the next write (the run stops instead)."""
    tmp = temp_dir(out, table, run_id)
    if not out.is_dir():
        raise StorageError(f"{out}: the results directory does not exist (removed during the run?)")
    try:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.parent.mkdir(exist_ok=True)  # the table's folder; not its parents: out stays as it is
        tmp.mkdir()
    except OSError as exc:
        raise storage_error(partition_dir(out, table, run_id), exc) from None
    return tmp


def write_temp_partition(out: Path, table: str, run_id: str, data: pa.Table) -> Path:
    """Write a partition under its temporary name; the caller publishes it."""
    tmp = make_temp_dir(out, table, run_id)
    try:
        pq.write_table(data.replace_schema_metadata(with_version(TABLES[table]).metadata), tmp / PART)
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
    import contextlib

    from .errors import os_cause

    keep: list[dict] = []
    if path.exists():
        try:
            keep = [r for r in pq.read_table(path).to_pylist() if r["suite"] != suite]
        except (pa.ArrowInvalid, OSError, KeyError) as exc:
            raise KvbenchError(f"{path}: not a readable {what} file ({os_cause(exc)}); remove it and "
                               f"run again") from None
    table = pa.Table.from_pylist(keep + rows, schema=schema).replace_schema_metadata(with_version(schema).metadata)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        pq.write_table(table, tmp)
        tmp.replace(path)
    except OSError as exc:
        raise storage_error(path, exc) from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
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
    if not root.is_dir():
        raise KvbenchError(f"{out}: no {table}/ directory; is this a kvbench results directory?")
    files = sorted(p for p in root.glob(f"run_id=*/{PART}")
                   if run_ids is None or p.parent.name.split("=", 1)[1] in run_ids)
    if not files:
        return pd.DataFrame({"run_id": pd.Series(dtype=str), **{
            f.name: pd.Series(dtype=f.type.to_pandas_dtype()) for f in TABLES[table]
            if f.name != "run_id" and not pa.types.is_timestamp(f.type)}})
    for f in files:
        check_file(f)
    try:
        # The declared schema, not the first file's: a column added since older files were
        # written reads as null in them instead of vanishing from every file.
        schema = TABLES[table].append(pa.field("run_id", pa.string()))
        dataset = ds.dataset([str(f) for f in files], schema=schema, format="parquet", partitioning="hive",
                             partition_base_dir=str(root))
        frame = dataset.to_table().to_pandas()
    except (pa.ArrowInvalid, OSError) as exc:
        raise KvbenchError(f"{root}: cannot read ({str(exc).splitlines()[0]})") from None
    if "run_id" in frame.columns:
        frame["run_id"] = frame["run_id"].astype(str)
    return frame
