"""The results directory: layout, crash-safe writes, and checked reads.

    DIR/runs/run_id=<id>/part-0.parquet       one row per run (written last)
    DIR/steps/run_id=<id>/part-0.parquet      one row per scheduler step
    DIR/requests/run_id=<id>/part-0.parquet   one row per request (sample)
    DIR/workloads/<workload_id>.parquet       the exact workload used

Partitions are written under a dot-prefixed temporary name (which readers
ignore) and renamed into place, so a crash never leaves a half run that looks
whole; a run exists once its ``runs/`` partition exists.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from harness.errors import KvbenchError
from harness.schema import SCHEMA_VERSION, TABLES, VERSION_KEY, with_version

PART = "part-0.parquet"


def partition_dir(out: Path, table: str, run_id: str) -> Path:
    return out / table / f"run_id={run_id}"


def temp_dir(out: Path, table: str, run_id: str) -> Path:
    return out / table / f".tmp-run_id={run_id}-{os.getpid()}"


def run_exists(out: Path, run_id: str) -> bool:
    return (partition_dir(out, "runs", run_id) / PART).is_file()


def existing_run_ids(out: Path) -> set[str]:
    runs = out / "runs"
    if not runs.is_dir():
        return set()
    return {p.name.split("=", 1)[1] for p in runs.iterdir()
            if p.name.startswith("run_id=") and (p / PART).is_file()}


def publish(tmp: Path, final: Path) -> None:
    """Move a finished temporary partition into place, replacing an older one."""
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)


def clean_stale_temps(out: Path) -> None:
    """Remove temporary partitions left by killed runs."""
    for table in TABLES:
        d = out / table
        if d.is_dir():
            for p in d.glob(".tmp-run_id=*"):
                shutil.rmtree(p, ignore_errors=True)


def write_partition(out: Path, table: str, run_id: str, data: pa.Table) -> None:
    tmp = temp_dir(out, table, run_id)
    tmp.mkdir(parents=True, exist_ok=True)
    pq.write_table(data.replace_schema_metadata(with_version(TABLES[table]).metadata), tmp / PART)
    publish(tmp, partition_dir(out, table, run_id))


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
        dataset = ds.dataset([str(f) for f in files], format="parquet", partitioning="hive",
                             partition_base_dir=str(root))
        frame = dataset.to_table().to_pandas()
    except (pa.ArrowInvalid, OSError) as exc:
        raise KvbenchError(f"{root}: cannot read ({str(exc).splitlines()[0]})") from None
    if "run_id" in frame.columns:
        frame["run_id"] = frame["run_id"].astype(str)
    return frame
