"""Reading request lengths (and times) from files.

Formats, chosen by file extension:

* ``.csv``: the Azure LLM inference trace 2023 (``TIMESTAMP, ContextTokens,
  GeneratedTokens``; times become seconds since the first row), or a generic
  table with ``prompt_len, output_len[, arrival_s][, request_id]``;
* ``.parquet``/``.pq`` and ``.jsonl``/``.ndjson``: the same columns/keys;
* ShareGPT JSON (vLLM's benchmark file) through ``read_sharegpt_json``.

Every problem is a one-line ``KvbenchError`` naming the file and the row
(CSV/JSONL: the line number in the file; Parquet: the 1-based data row).
Unsorted arrival times are an error rather than silently sorted: a replay
whose order differs from the file's would not be the trace it claims to be.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from ..harness.errors import KvbenchError

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
GENERIC_COLUMNS = ("prompt_len", "output_len")
CSV_SUFFIXES = (".csv",)
PARQUET_SUFFIXES = (".parquet", ".pq")
JSONL_SUFFIXES = (".jsonl", ".ndjson")
HUMAN_ROLES = ("human", "user")
GPT_ROLES = ("gpt", "chatgpt", "assistant")
# Far beyond any context window, and well inside int64 and exact float64.
MAX_TOKENS = 10**12

Label = Callable[[int], str]


@dataclasses.dataclass(frozen=True)
class TraceData:
    """Requests read from a file, in file order."""

    prompt_len: np.ndarray  # int64, >= 1
    output_len: np.ndarray  # int64, >= 1
    arrival_s: np.ndarray | None  # float64 seconds, non-decreasing; None when the file has no times
    kind: str  # "azure", "generic" or "sharegpt-json"
    skipped: int = 0  # ShareGPT conversations without a human->gpt pair

    @property
    def num_requests(self) -> int:
        return int(self.prompt_len.size)


def read_trace(path: str | Path, limit: int | None = None) -> TraceData:
    """The first ``limit`` requests (all when None) of a CSV, Parquet or JSONL trace."""
    p = Path(path)
    where = f"trace {p}"
    _check_file(p, where)
    suffix = p.suffix.lower()
    if suffix in CSV_SUFFIXES:
        frame, label = _read_csv(p, where, limit)
    elif suffix in PARQUET_SUFFIXES:
        frame, label = _read_parquet(p, where, limit)
    elif suffix in JSONL_SUFFIXES:
        frame, label = _read_jsonl(p, where, limit)
    else:
        hint = " (for ShareGPT JSON use source 'sharegpt-json')" if suffix == ".json" else ""
        raise KvbenchError(
            f"{where}: unsupported format {suffix or '(no extension)'!r}; use .csv, .parquet or .jsonl{hint}"
        )
    if limit is not None:
        frame = frame.iloc[:limit]
    if len(frame) == 0:
        raise KvbenchError(f"{where}: no requests in file (header only)")
    return _parse_frame(frame, where, label)


def _check_file(p: Path, where: str) -> None:
    if not p.exists():
        raise KvbenchError(f"{where}: no such file")
    if p.is_dir():
        raise KvbenchError(f"{where}: is a directory, not a file")
    if p.stat().st_size == 0:
        raise KvbenchError(f"{where}: file is empty")


def _read_csv(p: Path, where: str, limit: int | None) -> tuple[pd.DataFrame, Label]:
    try:
        # Everything as text: we want to report 'abc' or '3.5' ourselves, row by row.
        frame = pd.read_csv(p, dtype=str, keep_default_na=False, nrows=limit, skipinitialspace=True)
    except pd.errors.EmptyDataError:
        raise KvbenchError(f"{where}: file is empty") from None
    except pd.errors.ParserError as exc:
        raise KvbenchError(f"{where}: malformed CSV ({_first_line(exc)})") from None
    except UnicodeDecodeError:
        raise KvbenchError(f"{where}: not UTF-8 text") from None
    except OSError as exc:
        raise KvbenchError(f"{where}: cannot read ({exc.__class__.__name__}: {exc.strerror or exc})") from None
    frame.columns = [str(c).strip() for c in frame.columns]
    return frame, lambda i: f"line {i + 2}"  # line 1 is the header


def _read_parquet(p: Path, where: str, limit: int | None) -> tuple[pd.DataFrame, Label]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        frame = pq.read_table(p).to_pandas()
    except (pa.ArrowException, OSError) as exc:
        raise KvbenchError(f"{where}: not a readable Parquet file ({exc.__class__.__name__})") from None
    frame.columns = [str(c) for c in frame.columns]
    return frame.reset_index(drop=True), lambda i: f"row {i + 1}"


def _read_jsonl(p: Path, where: str, limit: int | None) -> tuple[pd.DataFrame, Label]:
    records: list[dict[str, Any]] = []
    lines: list[int] = []
    try:
        with p.open(encoding="utf-8") as fh:
            for lineno, text in enumerate(fh, start=1):
                if not text.strip():
                    continue
                if limit is not None and len(records) >= limit:
                    break
                try:
                    record = json.loads(text)
                except json.JSONDecodeError as exc:
                    raise KvbenchError(f"{where}: line {lineno}: malformed JSON ({exc.msg})") from None
                if not isinstance(record, dict):
                    raise KvbenchError(f"{where}: line {lineno}: expected a JSON object, got {type(record).__name__}")
                records.append(record)
                lines.append(lineno)
    except UnicodeDecodeError:
        raise KvbenchError(f"{where}: not UTF-8 text") from None
    except OSError as exc:
        raise KvbenchError(f"{where}: cannot read ({exc.__class__.__name__})") from None
    if not records:
        raise KvbenchError(f"{where}: file is empty (no JSON lines)")
    columns: list[str] = []
    for record in records:  # union of keys, first-seen order
        columns.extend(k for k in record if k not in columns)
    frame = pd.DataFrame.from_records(records, columns=columns)
    return frame, lambda i: f"line {lines[i]}"


def _parse_frame(frame: pd.DataFrame, where: str, label: Label) -> TraceData:
    columns = list(frame.columns)
    arrivals: np.ndarray | None
    if any(c in columns for c in AZURE_COLUMNS):
        _require(columns, AZURE_COLUMNS, where)
        prompts = _lengths(frame["ContextTokens"], "ContextTokens", where, label)
        outputs = _lengths(frame["GeneratedTokens"], "GeneratedTokens", where, label)
        arrivals = _azure_times(frame["TIMESTAMP"], where, label)
        kind = "azure"
    else:
        _require(columns, GENERIC_COLUMNS, where)
        prompts = _lengths(frame["prompt_len"], "prompt_len", where, label)
        outputs = _lengths(frame["output_len"], "output_len", where, label)
        arrivals = _seconds(frame["arrival_s"], where, label) if "arrival_s" in columns else None
        kind = "generic"
    if "request_id" in columns:
        _check_unique_ids(frame["request_id"], where, label)
    if arrivals is not None:
        _check_sorted(arrivals, where, label)
    return TraceData(prompts, outputs, arrivals, kind)


def _require(columns: list[str], needed: tuple[str, ...], where: str) -> None:
    for name in needed:
        if name not in columns:
            raise KvbenchError(f"{where}: column {name!r} missing (has: {', '.join(columns) or 'no columns'})")


def _is_blank(value: object) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or (
        isinstance(value, str) and not value.strip())


def _lengths(series: pd.Series, column: str, where: str, label: Label) -> np.ndarray:
    """A column of token counts as int64, every value a whole number >= 1."""
    raw = series.to_numpy(dtype=object)
    # JSON true/false would otherwise pass as 1/0.
    is_bool = np.fromiter((isinstance(v, (bool, np.bool_)) for v in raw), dtype=bool, count=raw.size)
    numbers = _numbers(series)
    bad = is_bool | ~np.isfinite(numbers) | (numbers != np.round(numbers)) | (numbers < 1) | (numbers > MAX_TOKENS)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        value, number = raw[i], numbers[i]
        if _is_blank(value):
            problem = "is missing or empty"
        elif is_bool[i] or math.isnan(number):
            problem = f"{value!r} is not a number"
        elif not math.isfinite(number) or number != round(number):
            problem = f"{value!r} is not a whole number of tokens"
        elif number > MAX_TOKENS:
            problem = f"{value!r} is implausibly large (over {MAX_TOKENS:,} tokens)"
        else:
            problem = f"must be >= 1, got {value!r}"
        raise KvbenchError(f"{where}: {label(i)}: {column} {problem}")
    return numbers.astype(np.int64)


def _numbers(series: pd.Series) -> np.ndarray:
    """Float values of a column; anything that is not a number becomes NaN."""
    if not pd.api.types.is_numeric_dtype(series.dtype):
        # CSV cells may carry stray spaces; JSON may hold bools (caught by the caller).
        series = series.map(lambda v: v.strip() if isinstance(v, str) else (None if isinstance(v, bool) else v))
    return pd.to_numeric(series, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)


def _seconds(series: pd.Series, where: str, label: Label) -> np.ndarray:
    raw = series.to_numpy(dtype=object)
    numbers = _numbers(series)
    bad = ~np.isfinite(numbers) | (numbers < 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        what = "is missing or empty" if _is_blank(raw[i]) else f"must be a number of seconds >= 0, got {raw[i]!r}"
        raise KvbenchError(f"{where}: {label(i)}: arrival_s {what}")
    return numbers + 0.0  # + 0.0 turns any -0.0 into 0.0 (identical bytes, identical id)


def _azure_times(series: pd.Series, where: str, label: Label) -> np.ndarray:
    """'2023-11-16 18:15:46.6805900' -> seconds since the first row."""
    stamps = pd.to_datetime(series.astype(str).str.strip(), format="ISO8601", errors="coerce")
    missing = stamps.isna().to_numpy()
    if missing.any():
        i = int(np.flatnonzero(missing)[0])
        raise KvbenchError(f"{where}: {label(i)}: TIMESTAMP {series.iloc[i]!r} is not a date-time")
    nanos = stamps.to_numpy(dtype="datetime64[ns]").astype(np.int64)
    # Integer nanoseconds first, then one division: no precision lost to big epoch floats.
    return (nanos - nanos[0]).astype(np.float64) / 1e9


def _check_sorted(arrivals: np.ndarray, where: str, label: Label) -> None:
    backwards = np.flatnonzero(np.diff(arrivals) < 0)
    if backwards.size:
        i = int(backwards[0]) + 1
        raise KvbenchError(
            f"{where}: {label(i)}: arrival goes backwards ({arrivals[i]:.6f} s, the row before "
            f"{arrivals[i - 1]:.6f} s); sort the trace by time"
        )


def _check_unique_ids(series: pd.Series, where: str, label: Label) -> None:
    duplicated = series.duplicated(keep="first").to_numpy()
    if duplicated.any():
        i = int(np.flatnonzero(duplicated)[0])
        first = int(np.flatnonzero((series == series.iloc[i]).to_numpy())[0])
        raise KvbenchError(
            f"{where}: {label(i)}: duplicate request_id {series.iloc[i]!r} (first at {label(first)})"
        )


def approx_token_count(text: str) -> int:
    """Offline token-count estimate: ceil(UTF-8 bytes / 4), at least 1.

    No tokenizer is available offline, so this stands in for one. About four
    characters per token is the usual figure for GPT/Llama BPE vocabularies on
    English prose; counting UTF-8 *bytes* rather than characters makes
    non-Latin scripts (2-4 bytes a character, often a token each) come out
    closer than characters/4 would. It is deterministic and dependency-free;
    expect roughly ±20% per text against a real tokenizer (worse for code).
    """
    return max(1, -(-len(text.encode("utf-8")) // 4))


def read_sharegpt_json(path: str | Path, limit: int | None = None) -> TraceData:
    """Lengths from vLLM's ShareGPT benchmark JSON.

    The file is a list of ``{"id", "conversations": [{"from", "value"}, ...]}``.
    Each conversation contributes its first human turn (prompt) and the gpt
    turn after it (output), in file order, first ``limit`` of them; like vLLM's
    benchmark, conversations without such a pair are skipped (counted in
    ``TraceData.skipped``). Token counts use ``approx_token_count``.
    """
    p = Path(path)
    where = f"sharegpt-json {p}"
    _check_file(p, where)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise KvbenchError(f"{where}: malformed JSON at line {exc.lineno} column {exc.colno} ({exc.msg})") from None
    except UnicodeDecodeError:
        raise KvbenchError(f"{where}: not UTF-8 text") from None
    except OSError as exc:
        raise KvbenchError(f"{where}: cannot read ({exc.__class__.__name__})") from None
    if not isinstance(data, list):
        raise KvbenchError(f"{where}: expected a JSON list of conversations, got {type(data).__name__}")
    prompts: list[int] = []
    outputs: list[int] = []
    skipped = 0
    for index, entry in enumerate(data):
        if limit is not None and len(prompts) >= limit:
            break
        pair = _first_exchange(entry, f"{where}: entry {index}")
        if pair is None:
            skipped += 1
            continue
        prompts.append(approx_token_count(pair[0]))
        outputs.append(approx_token_count(pair[1]))
    if not prompts:
        raise KvbenchError(f"{where}: no conversation has a human turn followed by a gpt turn")
    return TraceData(np.asarray(prompts, dtype=np.int64), np.asarray(outputs, dtype=np.int64), None,
                     "sharegpt-json", skipped)


def _first_exchange(entry: object, where: str) -> tuple[str, str] | None:
    if not isinstance(entry, dict) or not isinstance(entry.get("conversations"), list):
        raise KvbenchError(f"{where}: expected an object with a 'conversations' list")
    prompt: str | None = None
    for turn_no, turn in enumerate(entry["conversations"]):
        if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
            raise KvbenchError(f"{where}: turn {turn_no}: expected an object with 'from' and a string 'value'")
        role = turn.get("from")
        if prompt is None and role in HUMAN_ROLES:
            prompt = turn["value"]
        elif prompt is not None and role in GPT_ROLES:
            return prompt, turn["value"]
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else exc.__class__.__name__
