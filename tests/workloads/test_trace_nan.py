"""A trace cell that holds NaN itself (CSV ``NaN``, JSON's bare ``NaN``, a float NaN in Parquet) is
refused as not a number, naming the row; a missing or empty one is still called missing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from kvbench.harness.errors import KvbenchError
from kvbench.workloads.traces import read_trace

from tests.conftest import assert_one_line_error, kvbench

MOONCAKE_ROW = '{{"timestamp": {t}, "input_length": 5, "output_length": 3, "hash_ids": [1]}}\n'

# file name → (its text, what the one line must say after the file's name)
NAN_CELLS = {
    "arrival.csv": ("prompt_len,output_len,arrival_s\n5,3,0\n5,3,NaN\n", "line 3: arrival_s is not a number (NaN)"),
    "lower.csv": ("prompt_len,output_len,arrival_s\n5,3,0\n5,3, nan\n", "line 3: arrival_s is not a number (NaN)"),
    "signed.csv": ("prompt_len,output_len,arrival_s\n5,3,-nan\n", "line 2: arrival_s is not a number (NaN)"),
    "length.csv": ("prompt_len,output_len\n5,3\nNaN,3\n", "line 3: prompt_len is not a number (NaN)"),
    "arrival.jsonl": (
        '{"prompt_len": 5, "output_len": 3, "arrival_s": 0}\n\n{"prompt_len": 5, "output_len": 3, "arrival_s": NaN}\n',
        "line 3: arrival_s is not a number (NaN)",
    ),
    "length.jsonl": ('{"prompt_len": 5, "output_len": NaN}\n', "line 1: output_len is not a number (NaN)"),
    "mooncake.jsonl": (
        MOONCAKE_ROW.format(t=0) + MOONCAKE_ROW.format(t="NaN"),
        "line 2: timestamp is not a number (NaN)",
    ),
}
MISSING_CELLS = {
    "empty.csv": ("prompt_len,output_len,arrival_s\n5,3,0\n5,3,\n", "line 3: arrival_s is missing or empty"),
    "absent.jsonl": (
        '{"prompt_len": 5, "output_len": 3, "arrival_s": 0}\n{"prompt_len": 5, "output_len": 3}\n',
        "line 2: arrival_s is missing or empty",
    ),
    "null.jsonl": (MOONCAKE_ROW.format(t="null"), "line 1: timestamp is missing or empty"),
}


@pytest.mark.parametrize("name", list(NAN_CELLS) + list(MISSING_CELLS))
def test_a_nan_cell_is_not_a_number_and_a_missing_one_is_missing(tmp_path: Path, name: str) -> None:
    text, needle = {**NAN_CELLS, **MISSING_CELLS}[name]
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(KvbenchError) as info:
        read_trace(path)
    assert str(info.value) == f"trace {path}: {needle}"


def parquet_with(tmp_path: Path, arrivals: list[float | None]) -> Path:
    path = tmp_path / "trace.parquet"
    n = len(arrivals)
    # from_pandas=False: a NaN stays a NaN in the file, a None a null
    column = pa.array(arrivals, pa.float64(), from_pandas=False)
    pq.write_table(pa.table({"prompt_len": [5] * n, "output_len": [3] * n, "arrival_s": column}), path)
    return path


def test_a_parquet_nan_is_not_a_number_and_a_null_is_missing(tmp_path: Path) -> None:
    with pytest.raises(KvbenchError, match=r"row 3: arrival_s is not a number \(NaN\)$"):
        read_trace(parquet_with(tmp_path, [0.0, 1.0, float("nan")]))
    with pytest.raises(KvbenchError, match="row 2: arrival_s is missing or empty$"):
        read_trace(parquet_with(tmp_path, [0.0, None, float("nan")]))
    assert read_trace(parquet_with(tmp_path, [0.0, 1.0, 2.0])).arrival_s.tolist() == [0.0, 1.0, 2.0]


def test_a_number_beside_a_nan_cell_is_read_as_before(tmp_path: Path) -> None:
    path = tmp_path / "ok.jsonl"
    path.write_text('{"prompt_len": 5, "output_len": 3, "arrival_s": 0.5, "note": NaN}\n')
    data = read_trace(path)
    assert data.arrival_s is not None and data.arrival_s.tolist() == [0.5]
    assert data.prompt_len.dtype == np.int64


@pytest.mark.parametrize("name", ["arrival.csv", "arrival.jsonl", "mooncake.jsonl"])
def test_workload_make_names_the_nan_row_in_one_line_and_writes_nothing(tmp_path: Path, name: str) -> None:
    text, needle = NAN_CELLS[name]
    trace = tmp_path / name
    trace.write_text(text)
    out = tmp_path / "w.parquet"
    proc = kvbench("workload", "make", "--source", "trace", "--path", trace, "--arrival", "trace", "--out", out)
    assert proc.returncode == 2
    assert_one_line_error(proc, str(trace), needle)
    assert "missing or empty" not in proc.stderr
    assert not out.exists()
