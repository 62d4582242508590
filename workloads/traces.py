"""Reading request lengths (and times) from files.

Formats, chosen by file extension:

* ``.csv``: the Azure LLM inference trace 2023 (``TIMESTAMP, ContextTokens,
  GeneratedTokens``; times become seconds since the first row), or a generic
  table with ``prompt_len, output_len[, arrival_s][, request_id]``;
* ``.parquet``/``.pq`` and ``.jsonl``/``.ndjson``: the same columns/keys;
* the Mooncake form of a JSONL trace: rows carry ``timestamp`` (milliseconds),
  ``input_length``, ``output_length`` and ``hash_ids`` (one id per
  ``hash_block_size`` tokens of the prompt; equal ids, equal tokens), recognised by
  its ``hash_ids`` key;
* ShareGPT JSON (vLLM's benchmark file) through ``read_sharegpt_json``.

Every problem is a one-line ``KvbenchError`` naming the file and the row
(CSV/JSONL: the line number in the file; Parquet: the 1-based data row).
JSONL and Parquet carry types: a string where a number belongs (``"input_length": "33"``) is
refused there, as a string hash id is; only CSV, where every cell is text, reads numbers from
text. A time is at most ``MAX_TRACE_S`` seconds from the trace's origin.
Unsorted arrival times are an error rather than silently sorted: a replay
whose order differs from the file's would not be the trace it claims to be.
So is a file that says one thing twice: a column (or JSON key) given twice, or
both the Azure columns and the plain ones — which of them would be read is not
the user's choice made visible.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..harness.errors import KvbenchError
from ..harness.files import GIB, check_regular_input, read_text_capped
from ..harness.spec.workload_spec import MAX_REQUESTS

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
GENERIC_COLUMNS = ("prompt_len", "output_len")
GENERIC_TIME_COLUMN = "arrival_s"
MOONCAKE_COLUMNS = ("timestamp", "input_length", "output_length", "hash_ids")
# Trace files: the largest public traces are hundreds of MB; a bound keeps a wrong path (a disk
# image, say) from being read whole. What matters more is that the path is a regular file.
MAX_TRACE_BYTES = 4 * GIB
CSV_SUFFIXES = (".csv",)
PARQUET_SUFFIXES = (".parquet", ".pq")
JSONL_SUFFIXES = (".jsonl", ".ndjson")
HUMAN_ROLES = ("human", "user")
GPT_ROLES = ("gpt", "chatgpt", "assistant")
# Far beyond any context window, and well inside int64 and exact float64.
MAX_TOKENS = 10**12
# A trace's times, in seconds from its origin: at most 2**32 s (136 years), where a float64 second
# still resolves a microsecond (its spacing there is 2**-20 s); beyond it a request's arrival and
# its first token would round to the same time, and its latency would read 0.
MAX_TRACE_S = float(2**32)

Label = Callable[[int], str]


class _NaNCell:
    """A cell that holds NaN itself (JSON's bare ``NaN``, a float NaN in Parquet), told apart
    from a missing cell, which pandas also fills with NaN."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NaN"


NAN_CELL = _NaNCell()


@dataclasses.dataclass(frozen=True)
class TraceData:
    """Requests read from a file, in file order."""

    prompt_len: np.ndarray  # int64, >= 1
    output_len: np.ndarray  # int64, >= 1
    arrival_s: np.ndarray | None  # float64 seconds, non-decreasing; None when the file has no times
    kind: str  # "azure", "generic", "mooncake" or "sharegpt-json"
    skipped: int = 0  # ShareGPT conversations without a human->gpt pair
    hash_ids: list[np.ndarray] | None = None  # mooncake: each row's int64 hash ids

    @property
    def num_requests(self) -> int:
        return int(self.prompt_len.size)


def read_trace(path: str | Path, limit: int | None = None, hash_block_size: int = 512) -> TraceData:
    """The first ``limit`` requests (all when None) of a CSV, Parquet or JSONL trace
    (``hash_block_size``: tokens per hash id, for the Mooncake form)."""
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
    _check_count(len(frame), where)
    return _parse_frame(frame, where, label, hash_block_size, typed=suffix not in CSV_SUFFIXES)


def _rows_to_read(limit: int | None) -> int:
    """Rows worth reading: ``limit``, or one past the most a workload may have (to say so)."""
    return limit if limit is not None else MAX_REQUESTS + 1


def _check_count(rows: int, where: str) -> None:
    if rows > MAX_REQUESTS:
        raise KvbenchError(
            f"{where}: holds more than {MAX_REQUESTS:,} requests, the limit of a workload "
            f"(set limit to use its first ones)"
        )


def _check_file(p: Path, where: str) -> None:
    try:
        size = check_regular_input(p, "trace", MAX_TRACE_BYTES, where)
    except FileNotFoundError:
        raise KvbenchError(f"{where}: no such file") from None
    if size == 0:
        raise KvbenchError(f"{where}: file is empty")


def _check_unique_names(names: list[str], where: str, what: str) -> None:
    """Refuse a name given twice: pandas would rename the second (``prompt_len.1``) and read the first."""
    seen: set[str] = set()
    for name in names:
        if name and name in seen:  # unnamed columns are never read: they cannot be ambiguous
            raise KvbenchError(f"{where}: {what} {name!r} appears more than once: keep one")
        seen.add(name)


def _csv_header(p: Path, where: str) -> list[str]:
    """The header's names as the file spells them (pandas renames duplicates)."""
    try:
        with p.open(encoding="utf-8-sig", newline="") as fh:
            return [name.strip() for name in next(csv.reader(fh, skipinitialspace=True), [])]
    except csv.Error as exc:
        raise KvbenchError(f"{where}: malformed CSV header ({exc})") from None
    except UnicodeDecodeError:
        raise KvbenchError(f"{where}: not UTF-8 text") from None
    except OSError as exc:
        raise KvbenchError(f"{where}: cannot read ({exc.__class__.__name__}: {exc.strerror or exc})") from None


def _read_csv(p: Path, where: str, limit: int | None) -> tuple[pd.DataFrame, Label]:
    _check_unique_names(_csv_header(p, where), where, "column")
    try:
        # Everything as text: we want to report 'abc' or '3.5' ourselves, row by row.
        frame = pd.read_csv(
            p, dtype=str, keep_default_na=False, nrows=_rows_to_read(limit), skipinitialspace=True, encoding="utf-8"
        )
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
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(p)
        if limit is None:
            _check_count(parquet.metadata.num_rows, where)  # before reading any row
        table = parquet.read()
    except (pa.ArrowException, OSError) as exc:
        raise KvbenchError(f"{where}: not a readable Parquet file ({exc.__class__.__name__})") from None
    _check_unique_names([str(c) for c in table.column_names], where, "column")
    frame = table.to_pandas().reset_index(drop=True)
    frame.columns = [str(c) for c in frame.columns]
    for name, column in zip(table.column_names, table.columns):
        if pa.types.is_floating(column.type) and str(name) in frame.columns:
            # to_pandas makes a null NaN as well: a NaN the file holds is kept as what it is
            held = pc.fill_null(pc.is_nan(column), False).to_numpy(zero_copy_only=False)
            if held.any():
                cells = frame[str(name)].astype(object)
                cells[held] = NAN_CELL
                frame[str(name)] = cells
    return frame, lambda i: f"row {i + 1}"


def _read_jsonl(p: Path, where: str, limit: int | None) -> tuple[pd.DataFrame, Label]:
    records: list[dict[str, Any]] = []
    lines: list[int] = []
    rows = _rows_to_read(limit)
    try:
        with p.open(encoding="utf-8") as fh:
            for lineno, text in enumerate(fh, start=1):
                if not text.strip():
                    continue
                if len(records) >= rows:
                    break
                try:
                    record = json.loads(text, object_pairs_hook=_object_once, parse_constant=_json_constant)
                except _DuplicateKey as exc:
                    raise KvbenchError(
                        f"{where}: line {lineno}: key {exc.key!r} appears more than once: keep one"
                    ) from None
                except json.JSONDecodeError as exc:
                    raise KvbenchError(f"{where}: line {lineno}: malformed JSON ({exc.msg})") from None
                except (ValueError, RecursionError) as exc:  # a 5,000-digit number; deep nesting
                    raise KvbenchError(f"{where}: line {lineno}: malformed JSON ({type(exc).__name__})") from None
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


def _json_constant(name: str) -> object:
    """JSON's non-standard constants: ``NaN`` kept as what it is (not a missing value), the
    infinities as floats."""
    return NAN_CELL if name == "NaN" else float(name)


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _object_once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are each given once (``json`` keeps the last silently)."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return obj


def _parse_frame(
    frame: pd.DataFrame, where: str, label: Label, hash_block_size: int = 512, typed: bool = False
) -> TraceData:
    """``typed``: the file's values carry types (JSONL, Parquet), so a string is not a number."""
    columns = list(frame.columns)
    arrivals: np.ndarray | None
    azure = [c for c in AZURE_COLUMNS if c in columns]
    plain = [c for c in (*GENERIC_COLUMNS, GENERIC_TIME_COLUMN) if c in columns]
    if "hash_ids" in columns:
        other = azure + plain
        if other:
            raise KvbenchError(
                f"{where}: has Mooncake trace keys (hash_ids) and others ({', '.join(other)}): keep one scheme"
            )
        return _parse_mooncake(frame, where, label, hash_block_size, typed)
    if azure and plain:
        raise KvbenchError(
            f"{where}: has both Azure trace columns ({', '.join(azure)}) and plain ones "
            f"({', '.join(plain)}): keep one scheme"
        )
    if any(c in columns for c in AZURE_COLUMNS):
        _require(columns, AZURE_COLUMNS, where)
        prompts = _lengths(frame["ContextTokens"], "ContextTokens", where, label, typed)
        outputs = _lengths(frame["GeneratedTokens"], "GeneratedTokens", where, label, typed)
        arrivals = _azure_times(frame["TIMESTAMP"], where, label)
        kind = "azure"
    else:
        _require(columns, GENERIC_COLUMNS, where)
        prompts = _lengths(frame["prompt_len"], "prompt_len", where, label, typed)
        outputs = _lengths(frame["output_len"], "output_len", where, label, typed)
        times = frame[GENERIC_TIME_COLUMN] if GENERIC_TIME_COLUMN in columns else None
        arrivals = None if times is None else _seconds(times, where, label, typed)
        kind = "generic"
    if "request_id" in columns:
        _check_unique_ids(frame["request_id"], where, label)
    if arrivals is not None:
        _check_sorted(arrivals, where, label)
    return TraceData(prompts, outputs, arrivals, kind)


def _parse_mooncake(frame: pd.DataFrame, where: str, label: Label, hash_block_size: int, typed: bool) -> TraceData:
    """Rows of ``timestamp`` (ms), ``input_length``, ``output_length``, ``hash_ids``."""
    _require(list(frame.columns), MOONCAKE_COLUMNS, where)
    prompts = _lengths(frame["input_length"], "input_length", where, label, typed)
    outputs = _lengths(frame["output_length"], "output_length", where, label, typed)
    arrivals = _times(frame["timestamp"], 1000.0, "timestamp", "milliseconds", where, label, typed)
    hash_ids: list[np.ndarray] = []
    for i, value in enumerate(frame["hash_ids"].tolist()):
        ids = _hash_id_list(value, f"{where}: {label(i)}")
        needed = -(-int(prompts[i]) // hash_block_size)
        if ids.size != needed:
            raise KvbenchError(
                f"{where}: {label(i)}: hash_ids has {ids.size} ids, but input_length {int(prompts[i])} needs "
                f"ceil({int(prompts[i])} / {hash_block_size}) = {needed} (hash_block_size {hash_block_size})"
            )
        hash_ids.append(ids)
    _check_sorted(arrivals, where, label)
    return TraceData(prompts, outputs, arrivals, "mooncake", hash_ids=hash_ids)


def _hash_id_list(value: object, where: str) -> np.ndarray:
    """A row's hash ids: a list of whole numbers >= 0 (JSON true/false are not ids)."""
    items = value.tolist() if isinstance(value, np.ndarray) else value
    if not isinstance(items, list):
        raise KvbenchError(f"{where}: hash_ids must be a list of integers, got {_short(value)}")
    for item in items:
        if isinstance(item, (bool, np.bool_)) or not isinstance(item, (int, np.integer)):
            raise KvbenchError(f"{where}: hash_ids must hold integers, got {_short(item)}")
        if not 0 <= item <= np.iinfo(np.int64).max:
            raise KvbenchError(f"{where}: hash_ids must be integers >= 0 (int64), got {item!r}")
    return np.asarray(items, dtype=np.int64)


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _require(columns: list[str], needed: tuple[str, ...], where: str) -> None:
    for name in needed:
        if name not in columns:
            raise KvbenchError(f"{where}: column {name!r} missing (has: {', '.join(columns) or 'no columns'})")


def _is_blank(value: object) -> bool:
    return (
        value is None
        or (isinstance(value, float) and math.isnan(value))
        or (isinstance(value, str) and not value.strip())
    )


def _is_nan(value: object) -> bool:
    """A cell that says NaN: JSON's or Parquet's (``NAN_CELL``), or CSV text such as ``NaN``."""
    return value is NAN_CELL or (isinstance(value, str) and value.strip().lstrip("+-").lower() == "nan")


def _lengths(series: pd.Series, column: str, where: str, label: Label, typed: bool = False) -> np.ndarray:
    """A column of token counts as int64, every value a whole number >= 1."""
    raw = series.to_numpy(dtype=object)
    # JSON true/false would otherwise pass as 1/0.
    is_bool = np.fromiter((isinstance(v, (bool, np.bool_)) for v in raw), dtype=bool, count=raw.size)
    numbers = _numbers(series, typed)
    bad = is_bool | ~np.isfinite(numbers) | (numbers != np.round(numbers)) | (numbers < 1) | (numbers > MAX_TOKENS)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        value, number = raw[i], numbers[i]
        if _is_blank(value):
            problem = "is missing or empty"
        elif _is_nan(value):
            problem = "is not a number (NaN)"
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


def _numbers(series: pd.Series, typed: bool = False) -> np.ndarray:
    """Float values of a column; anything that is not a number becomes NaN: in a ``typed`` file
    (JSONL, Parquet) a string too, since there a number is written as one."""
    if not pd.api.types.is_numeric_dtype(series.dtype):
        # CSV cells may carry stray spaces; JSON may hold bools (caught by the caller).
        def number(v: Any) -> Any:
            if isinstance(v, str):
                return None if typed else v.strip()
            return None if isinstance(v, bool) or v is NAN_CELL else v

        series = series.map(number)
    return pd.to_numeric(series, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)


def _times(
    series: pd.Series, per_s: float, column: str, unit: str, where: str, label: Label, typed: bool
) -> np.ndarray:
    """A column of times in ``unit`` (``per_s`` of them a second) as seconds: numbers from 0 up to
    ``MAX_TRACE_S`` seconds."""
    raw = series.to_numpy(dtype=object)
    numbers = _numbers(series, typed)
    bad = ~np.isfinite(numbers) | (numbers < 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        if _is_blank(raw[i]):
            what = "is missing or empty"
        elif _is_nan(raw[i]):
            what = "is not a number (NaN)"
        else:
            what = f"must be a number of {unit} >= 0, got {raw[i]!r}"
        raise KvbenchError(f"{where}: {label(i)}: {column} {what}")
    seconds = numbers / per_s + 0.0  # + 0.0 turns any -0.0 into 0.0 (identical bytes, identical id)
    far = seconds > MAX_TRACE_S
    if far.any():
        i = int(np.flatnonzero(far)[0])
        raise KvbenchError(
            f"{where}: {label(i)}: {column} {raw[i]!r} is {seconds[i]:.3g} s from the trace's origin, beyond "
            f"{MAX_TRACE_S:.0f} s (136 years), where a float64 time no longer resolves a microsecond"
        )
    return seconds


def _seconds(series: pd.Series, where: str, label: Label, typed: bool = False) -> np.ndarray:
    return _times(series, 1.0, "arrival_s", "seconds", where, label, typed)


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
        raise KvbenchError(f"{where}: {label(i)}: duplicate request_id {series.iloc[i]!r} (first at {label(first)})")


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
        data = json.loads(read_text_capped(p, "ShareGPT JSON file", MAX_TRACE_BYTES, where))
    except FileNotFoundError:
        raise KvbenchError(f"{where}: no such file") from None
    except json.JSONDecodeError as exc:
        raise KvbenchError(f"{where}: malformed JSON at line {exc.lineno} column {exc.colno} ({exc.msg})") from None
    except (ValueError, RecursionError) as exc:  # a 5,000-digit number; deep nesting
        raise KvbenchError(f"{where}: malformed JSON ({type(exc).__name__})") from None
    if not isinstance(data, list):
        raise KvbenchError(f"{where}: expected a JSON list of conversations, got {type(data).__name__}")
    prompts: list[int] = []
    outputs: list[int] = []
    skipped = 0
    rows = _rows_to_read(limit)
    for index, entry in enumerate(data):
        if len(prompts) >= rows:
            break
        pair = _first_exchange(entry, f"{where}: entry {index}")
        if pair is None:
            skipped += 1
            continue
        prompts.append(approx_token_count(pair[0]))
        outputs.append(approx_token_count(pair[1]))
    if not prompts:
        raise KvbenchError(f"{where}: no conversation has a human turn followed by a gpt turn")
    _check_count(len(prompts), where)
    return TraceData(
        np.asarray(prompts, dtype=np.int64), np.asarray(outputs, dtype=np.int64), None, "sharegpt-json", skipped
    )


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
