"""The history's cache, ``DIR/history/nights.parquet``: the run rows it read, with each night's
signature (``nights.night_signature``: its run files' names, sizes and modification times).

A night's records do not change once written, and opening a run file costs about a millisecond
whatever is read from it (a Parquet footer of a hundred columns), so a year of nights of fifty
cells is most of a minute to read cold. ``kvbench history`` writes what it read into the page
folder (listed in its manifest like every file there) and, the next night, reads back every night
whose signature is unchanged: only the new night, and any rewritten since, come from their files.
The cache is only ever a copy: one that is missing, unreadable or of another layout is ignored.
"""

from __future__ import annotations

import io
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from .nights import COLUMNS, SCHEMA, SIGNATURE, Nights

CACHE_FILE = "nights.parquet"
LAYOUT_KEY = b"kvbench.history_cache"
LAYOUT = ",".join(COLUMNS).encode()  # a cache of other columns is another layout
CACHE_SCHEMA = SCHEMA.append(pa.field("night", pa.string())).append(pa.field(SIGNATURE, pa.string()))


def load_cache(page_folder: Path) -> pd.DataFrame | None:
    """The rows cached in ``page_folder``, or None when there is no usable cache."""
    path = page_folder / CACHE_FILE
    if not path.is_file() or path.is_symlink():
        return None
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError):
        return None
    if (table.schema.metadata or {}).get(LAYOUT_KEY) != LAYOUT or not table.schema.equals(CACHE_SCHEMA):
        return None
    return table.to_pandas()


def cache_bytes(nights: Nights) -> bytes:
    """The cache of ``nights`` (the rows read, each with its night's signature) as a Parquet file."""
    runs = nights.runs.assign(**{SIGNATURE: nights.runs["night"].map(nights.signatures)})
    table = pa.Table.from_pandas(runs[CACHE_SCHEMA.names], schema=CACHE_SCHEMA, preserve_index=False)
    buf = io.BytesIO()
    pq.write_table(table.replace_schema_metadata({LAYOUT_KEY: LAYOUT}), buf)
    return buf.getvalue()
