"""The workload table, its content hash, its Parquet file and its summary."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..harness.errors import KvbenchError, StorageError, os_cause
from ..harness.files import GIB, check_regular_input
from ..harness.records.atomic import replace_file
from ..harness.records.safe_paths import output_file
from ..harness.records.store import parquet_options
from ..harness.spec.geometry import ModelGeometry

SCHEMA_VERSION = 1
# Column -> dtype, in canonical order (the order the hash reads them in).
COLUMNS: dict[str, str] = {
    "request_id": "int64",
    "arrival_s": "float64",
    "prompt_len": "int64",
    "output_len": "int64",
    "prefix_group": "int64",
    "prefix_len": "int64",
    "n": "int64",
}
# Columns only some sources make, hashed after COLUMNS when present (so a table without them
# keeps the id it always had): a Mooncake trace's hash ids, a conversation's place of each turn.
OPTIONAL_COLUMNS: dict[str, str] = {
    "hash_ids": "list<int64>",
    "session_id": "int64",
    "turn": "int64",
    "think_s": "float64",
}
SESSION_COLUMNS: tuple[str, ...] = ("session_id", "turn", "think_s")
META_SCHEMA = b"kvbench.schema_version"
META_ID = b"kvbench.workload_id"
META_SPEC = b"kvbench.workload_spec"
META_DROPPED = b"kvbench.dropped"


def compute_workload_id(df: pd.DataFrame) -> str:
    """First 16 hex digits of sha256 over column names and little-endian column bytes.

    Content only: the spec that made a table is not hashed, so the same
    requests read from a trace or generated from a spec get the same id.
    """
    digest = hashlib.sha256()
    for name, dtype in COLUMNS.items():
        values = np.ascontiguousarray(df[name].to_numpy(), dtype=np.dtype(dtype).newbyteorder("<"))
        digest.update(name.encode("utf-8") + b"\0")
        digest.update(len(values).to_bytes(8, "little"))
        digest.update(values.tobytes())
    for name in OPTIONAL_COLUMNS:
        if name not in df.columns:
            continue
        digest.update(name.encode("utf-8") + b"\0")
        digest.update(len(df).to_bytes(8, "little"))
        if name == "hash_ids":
            lists = df[name].tolist()
            lengths = np.fromiter((len(v) for v in lists), dtype="<i8", count=len(lists))
            digest.update(lengths.tobytes())
            digest.update(np.concatenate(lists).astype("<i8").tobytes())
        else:
            little = np.dtype(OPTIONAL_COLUMNS[name]).newbyteorder("<")
            digest.update(np.ascontiguousarray(df[name].to_numpy(), dtype=little).tobytes())
    return digest.hexdigest()[:16]


# A workload of the most requests a spec may ask for takes well under this.
MAX_WORKLOAD_BYTES = 4 * GIB


@dataclasses.dataclass(frozen=True, eq=False)
class Sessions:
    """Where each request stands in its conversation (arrays indexed by request id)."""

    session_id: np.ndarray  # int64
    turn: np.ndarray  # int64, 0 for a conversation's first request
    think_s: np.ndarray  # float64: delay after the previous turn's answer ends (0.0 for turn 0)
    previous: np.ndarray  # int64: request id of the same conversation's previous turn, -1 for turn 0


@dataclasses.dataclass(frozen=True, eq=False)
class Workload:
    """An immutable table of requests, identified by its content.

    Build with ``Workload.create``. Compare workloads by ``workload_id`` (the
    dataclass has no ``==``: DataFrames do not compare to one bool).
    """

    requests: pd.DataFrame
    spec_json: str
    dropped: int
    workload_id: str
    # Sampled prompts raised to prefix_len + 1 (each request computes a token of its own after
    # the shared prefix): said where the workload is built, not part of its identity.
    raised: int = 0

    @classmethod
    def create(cls, df: pd.DataFrame, spec_json: str, dropped: int = 0, raised: int = 0) -> Workload:
        """Validate columns, dtypes and invariants; copy the table; compute the id."""
        table = _canonical(df)
        if isinstance(dropped, bool) or not isinstance(dropped, (int, np.integer)) or dropped < 0:
            raise KvbenchError(f"workload: dropped must be a count >= 0, got {dropped!r}")
        return cls(table, str(spec_json), int(dropped), compute_workload_id(table), int(raised))

    @property
    def num_requests(self) -> int:
        return len(self.requests)

    @property
    def hash_ids(self) -> list[np.ndarray] | None:
        """Each request's hash ids (int64 arrays, a hash-id trace only), else None."""
        if "hash_ids" not in self.requests.columns:
            return None
        return list(self.requests["hash_ids"])

    @functools.cached_property
    def sessions(self) -> Sessions | None:
        """Each request's conversation, turn and think time (``sessions`` source only), else None."""
        if "session_id" not in self.requests.columns:
            return None
        r = self.requests
        session = r["session_id"].to_numpy()
        previous = np.full(len(r), -1, dtype=np.int64)
        order = np.lexsort((r["request_id"].to_numpy(), session))
        later = session[order][1:] == session[order][:-1]
        previous[order[1:][later]] = order[:-1][later]
        return Sessions(session, r["turn"].to_numpy(), r["think_s"].to_numpy(), previous)

    @property
    def total_tokens(self) -> int:
        """Σ (prompt + output) × n: every token position of every sample."""
        r = self.requests
        return int(((r["prompt_len"] + r["output_len"]) * r["n"]).sum())

    def raw_kv_bytes(
        self, geometry: ModelGeometry, kv_dtype: str, tensor_parallel_size: int = 1, pipeline_parallel_size: int = 1
    ) -> tuple[int, int]:
        """(all requests at full length, largest single request) in bytes (one rank's under
        tensor / pipeline parallelism).

        "Raw": no sharing of any kind, so each of the n samples holds its own
        prompt (no prefix or fork sharing): the upper bound policies improve on.
        """
        per_token = geometry.kv_bytes_per_token(kv_dtype, tensor_parallel_size, pipeline_parallel_size)
        r = self.requests
        tokens = (r["prompt_len"] + r["output_len"]) * r["n"]
        return int(tokens.sum()) * per_token, int(tokens.max()) * per_token


def _canonical(df: pd.DataFrame) -> pd.DataFrame:
    if not isinstance(df, pd.DataFrame):
        raise KvbenchError(f"workload: expected a table, got {type(df).__name__}")
    names = list(df.columns)
    missing = [c for c in COLUMNS if c not in names]
    extra = [c for c in names if c not in COLUMNS and c not in OPTIONAL_COLUMNS]
    if missing or extra:
        raise KvbenchError(
            f"workload: columns must be exactly {', '.join(COLUMNS)}, and optionally "
            f"{', '.join(OPTIONAL_COLUMNS)} "
            f"(missing: {', '.join(map(str, missing)) or 'none'}; extra: {', '.join(map(str, extra)) or 'none'})"
        )
    session_cols = [c for c in SESSION_COLUMNS if c in names]
    if session_cols and len(session_cols) != len(SESSION_COLUMNS):
        raise KvbenchError(
            f"workload: columns {', '.join(SESSION_COLUMNS)} come together (has only {', '.join(session_cols)})"
        )
    if len(df) == 0:
        raise KvbenchError("workload is empty")
    out: dict[str, np.ndarray] = {}
    for name, dtype in COLUMNS.items():
        values = df[name].to_numpy()
        kind = np.dtype(dtype).kind
        # Lossless widening (int32 -> int64) is fine; anything else is a bug upstream.
        if values.dtype.kind != kind and not (kind == "f" and values.dtype.kind in "iu"):
            raise KvbenchError(f"workload: column {name!r} must be {dtype}, got {values.dtype}")
        out[name] = values.astype(dtype, copy=True)
    out["arrival_s"] = out["arrival_s"] + 0.0  # -0.0 -> 0.0: same time, same bytes
    _check_invariants(out)
    frame = pd.DataFrame(out)
    if "hash_ids" in names:
        frame["hash_ids"] = _canonical_hash_ids(df["hash_ids"], out)
    if session_cols:
        extra_cols: dict[str, np.ndarray] = {}
        for name in SESSION_COLUMNS:
            values = df[name].to_numpy()
            kind = np.dtype(OPTIONAL_COLUMNS[name]).kind
            if values.dtype.kind != kind and not (kind == "f" and values.dtype.kind in "iu"):
                raise KvbenchError(f"workload: column {name!r} must be {OPTIONAL_COLUMNS[name]}, got {values.dtype}")
            extra_cols[name] = values.astype(OPTIONAL_COLUMNS[name], copy=True)
        extra_cols["think_s"] = extra_cols["think_s"] + 0.0
        _check_sessions(out, extra_cols)
        for name in SESSION_COLUMNS:
            frame[name] = extra_cols[name]
    return frame


def _canonical_hash_ids(column: pd.Series, c: dict[str, np.ndarray]) -> pd.Series:
    """Each row's hash ids as an int64 array of ids >= 0, at least one per request."""
    values: list[np.ndarray] = []
    for i, raw in enumerate(column.tolist()):
        ids = np.asarray(raw)
        if ids.ndim != 1 or ids.size == 0 or (ids.dtype.kind not in "iu"):
            raise KvbenchError(f"workload: request {i}: hash_ids must be a non-empty list of integers")
        if ids.dtype.kind == "u" and ids.size and int(ids.max()) > np.iinfo(np.int64).max:
            raise KvbenchError(f"workload: request {i}: hash_ids must fit int64")
        ids = ids.astype(np.int64)
        if (ids < 0).any():
            raise KvbenchError(f"workload: request {i}: hash_ids must be >= 0 (got {int(ids.min())})")
        values.append(ids)
    grouped = np.flatnonzero(c["prefix_group"] != -1)
    if grouped.size:
        raise KvbenchError(f"workload: request {int(grouped[0])}: prefix_group must be -1 with hash_ids")
    return pd.Series(values, dtype=object)


def _check_sessions(c: dict[str, np.ndarray], s: dict[str, np.ndarray]) -> None:
    """Each conversation's turns 0, 1, ... in request order, one sample each, each prompt
    holding the whole conversation before it plus a message of at least one token."""

    def fail(i: int, rule: str) -> None:
        raise KvbenchError(f"workload: request {i}: {rule}")

    for mask, rule in (
        (s["session_id"] < 0, "session_id must be >= 0"),
        (s["turn"] < 0, "turn must be >= 0"),
        (~np.isfinite(s["think_s"]) | (s["think_s"] < 0), "think_s must be a finite number of seconds >= 0"),
        ((s["turn"] == 0) & (s["think_s"] != 0), "think_s must be 0 for turn 0"),
        (c["n"] != 1, "n must be 1 in a conversation"),
        (c["prefix_group"] != -1, "prefix_group must be -1 in a conversation"),
    ):
        if mask.any():
            fail(int(np.flatnonzero(mask)[0]), rule)
    order = np.lexsort((c["request_id"], s["session_id"]))
    session, turn = s["session_id"][order], s["turn"][order]
    first = np.concatenate(([True], session[1:] != session[:-1]))
    if (bad := first & (turn != 0)).any():
        fail(int(order[np.flatnonzero(bad)[0]]), "a conversation's first request must be turn 0")
    later = np.flatnonzero(~first)
    prev, this = order[later - 1], order[later]
    if (bad := s["turn"][this] != s["turn"][prev] + 1).any():
        fail(int(this[np.flatnonzero(bad)[0]]), "turns of a conversation must follow 0, 1, 2, ... in request order")
    if (bad := c["arrival_s"][this] != c["arrival_s"][prev]).any():
        fail(int(this[np.flatnonzero(bad)[0]]), "a conversation's turns must share its start as arrival_s")
    history = c["prompt_len"][prev] + c["output_len"][prev]
    if (bad := c["prompt_len"][this] <= history).any():
        fail(
            int(this[np.flatnonzero(bad)[0]]),
            "prompt_len must exceed the previous turn's prompt_len + output_len (its history plus a new message)",
        )


def _check_invariants(c: dict[str, np.ndarray]) -> None:
    def fail(column: str, mask: np.ndarray, rule: str) -> None:
        i = int(np.flatnonzero(mask)[0])
        raise KvbenchError(f"workload: request {i}: {column} {rule} (got {c[column][i]!r})")

    count = len(c["request_id"])
    if (bad := c["request_id"] != np.arange(count)).any():
        fail("request_id", bad, "must be 0..N-1 in arrival order")
    arrival = c["arrival_s"]
    if (bad := ~np.isfinite(arrival) | (arrival < 0)).any():
        fail("arrival_s", bad, "must be a finite number of seconds >= 0")
    if (bad := np.concatenate(([False], np.diff(arrival) < 0))).any():
        fail("arrival_s", bad, "must not decrease")
    for name in ("prompt_len", "output_len", "n"):
        if (bad := c[name] < 1).any():
            fail(name, bad, "must be >= 1")
    if (bad := c["prefix_group"] < -1).any():
        fail("prefix_group", bad, "must be >= 0, or -1 for none")
    no_group = c["prefix_group"] == -1
    if (bad := no_group & (c["prefix_len"] != 0)).any():
        fail("prefix_len", bad, "must be 0 when prefix_group is -1")
    if (bad := (c["prefix_len"] < 0) | (c["prefix_len"] >= c["prompt_len"])).any():
        fail("prefix_len", bad, "must be >= 0 and below prompt_len")


def write_workload(w: Workload, path: str | Path) -> Path:
    """Write ``w`` as Parquet, whole or not at all (``harness.records.atomic``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = output_file(Path(path), "workload")  # the rename below would replace a device or a FIFO
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StorageError(f"workload {p}: cannot create folder {p.parent} ({os_cause(exc)})") from None
    table = pa.Table.from_pandas(w.requests, preserve_index=False)
    metadata = dict(table.schema.metadata or {})
    metadata.update(
        {
            META_SCHEMA: str(SCHEMA_VERSION).encode(),
            META_ID: w.workload_id.encode(),
            META_SPEC: w.spec_json.encode("utf-8"),
            META_DROPPED: str(w.dropped).encode(),
        }
    )
    table = table.replace_schema_metadata(metadata)
    try:
        with replace_file(p, "workload") as fh:
            pq.write_table(table, fh, **parquet_options(table.schema))  # as every kvbench table
    except StorageError as exc:
        raise StorageError(f"workload {exc}") from None
    return p


def read_workload(path: str | Path) -> Workload:
    """Read a workload file, refusing newer schema versions and content that does not match its id."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = Path(path)
    where = f"workload {p}"
    if not p.exists():
        raise KvbenchError(f"{where}: no such file")
    if p.is_dir():
        raise KvbenchError(f"{where}: is a directory, not a workload file")
    check_regular_input(p, "workload file", MAX_WORKLOAD_BYTES, where)
    try:
        table = pq.read_table(p)
    except (pa.ArrowException, OSError) as exc:
        raise KvbenchError(f"{where}: not a readable Parquet file ({exc.__class__.__name__})") from None
    meta = table.schema.metadata or {}
    if META_SCHEMA not in meta:
        raise KvbenchError(f"{where}: not a kvbench workload file (no kvbench.schema_version metadata)")
    try:
        version = int(meta[META_SCHEMA])
        dropped = int(meta.get(META_DROPPED, b"0"))
        stored_id = meta[META_ID].decode()
        spec_json = meta.get(META_SPEC, b"").decode("utf-8")
    except (KeyError, ValueError, UnicodeDecodeError):
        raise KvbenchError(f"{where}: corrupt kvbench metadata") from None
    if version > SCHEMA_VERSION:
        raise KvbenchError(
            f"{where}: schema version {version} is newer than this kvbench reads ({SCHEMA_VERSION}); upgrade kvbench"
        )
    try:
        w = Workload.create(table.to_pandas(), spec_json, dropped)
    except KvbenchError as exc:
        raise KvbenchError(f"{where}: {str(exc).removeprefix('workload: ')}") from None
    if w.workload_id != stored_id:
        raise KvbenchError(
            f"{where}: content does not match its id (file says {stored_id}, content hashes to {w.workload_id})"
        )
    return w


def _percentiles(values: np.ndarray) -> dict[str, float]:
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {
        "mean": float(values.mean()),
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
        "max": float(values.max()),
    }


def summarize(w: Workload, geometry: ModelGeometry | None = None, kv_dtype: str = "fp16") -> dict[str, Any]:
    """Plain-data summary of a workload (what ``kvbench workload show`` prints).

    Percentiles interpolate linearly (numpy's default). ``rate_per_s`` is
    (N-1)/span, None when everything arrives at once; ``burstiness_cv`` is the
    population std / mean of the inter-arrival gaps (1 for Poisson), None
    with fewer than two gaps or a zero mean gap. For conversations both are of the
    conversations' starts (sessions per second), the process a ``sessions`` spec draws.
    """
    r = w.requests
    arrival = r["arrival_s"].to_numpy()
    sessions = w.sessions
    if sessions is not None:  # a conversation's later turns carry its start: count the starts
        arrival = arrival[sessions.turn == 0]
    span = float(arrival[-1] - arrival[0])
    gaps = np.diff(arrival)
    mean_gap = float(gaps.mean()) if gaps.size else 0.0
    groups = r["prefix_group"].to_numpy()
    out: dict[str, Any] = {
        "workload_id": w.workload_id,
        "num_requests": w.num_requests,
        "dropped": w.dropped,
        "prompt_len": _percentiles(r["prompt_len"].to_numpy()),
        "output_len": _percentiles(r["output_len"].to_numpy()),
        "arrival_span_s": span,
        "rate_per_s": (arrival.size - 1) / span if span > 0 else None,
        "burstiness_cv": float(gaps.std()) / mean_gap if gaps.size >= 2 and mean_gap > 0 else None,
        "total_tokens": w.total_tokens,
        "prefix_groups": int(np.unique(groups[groups >= 0]).size),
        "max_n": int(r["n"].max()),
        "spec": w.spec_json,
    }
    if sessions is not None:
        out["sessions"] = int(np.unique(sessions.session_id).size)
        out["max_turns"] = int(sessions.turn.max()) + 1
    hash_ids = w.hash_ids
    if hash_ids is not None:
        every = np.concatenate(hash_ids)
        out["hash_ids"] = {"total": int(every.size), "distinct": int(np.unique(every).size)}
    if geometry is not None:
        total, largest = w.raw_kv_bytes(geometry, kv_dtype)
        out.update(
            {
                "model": geometry.name,
                "kv_dtype": kv_dtype,
                "kv_bytes_per_token": geometry.kv_bytes_per_token(kv_dtype),
                "raw_kv_bytes_total": total,
                "raw_kv_bytes_largest_request": largest,
            }
        )
    return out
