"""Workload specs, generators, trace readers, the table and its file."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from kvbench.harness.errors import KvbenchError
from kvbench.harness.spec.geometry import preset
from kvbench.harness.spec.workload_spec import SOURCES, WorkloadSpec
from kvbench.workloads.arrivals import gamma_arrivals, poisson_arrivals
from kvbench.workloads.build import build_workload
from kvbench.workloads.distributions import ALPACA_OUTPUT, ALPACA_PROMPT, SHAREGPT_OUTPUT, SHAREGPT_PROMPT
from kvbench.workloads.table import COLUMNS, Workload, read_workload, summarize, write_workload
from kvbench.workloads.traces import approx_token_count, read_sharegpt_json, read_trace

DATA = Path(__file__).parents[1] / "data"
AZURE_SLICE = DATA / "azure-conv-slice.csv"


def cols(w: Workload, name: str) -> list:
    return w.requests[name].tolist()


# --- spec ---------------------------------------------------------------------------------------


def test_spec_defaults_and_canonical_json() -> None:
    spec = WorkloadSpec()
    data = json.loads(spec.to_json())
    assert data["source"] == "fixed" and data["num_requests"] == 100 and data["rate"] is None
    assert list(data) == sorted(data)
    assert WorkloadSpec.from_json(spec.to_json(), "x") == spec
    # Unused parameters are allowed (a [grid] may vary source/arrival over one table); the id ignores them.
    assert (
        build_workload(WorkloadSpec(num_requests=2, rate=3.0, path="unused.csv")).workload_id
        == build_workload(WorkloadSpec(num_requests=2)).workload_id
    )
    # An int given for a float field is the same spec (same JSON) as the float.
    assert WorkloadSpec(sigma=1).to_json() == WorkloadSpec(sigma=1.0).to_json()


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"source": "zipf"}, "known: " + ", ".join(SOURCES)),
        ({"arrival": "burst"}, "unknown arrival 'burst'"),
        ({"num_requests": 0}, "num_requests must be >= 1"),
        ({"prompt_len": -3}, "prompt_len must be >= 1"),
        ({"output_len": 0}, "output_len must be >= 1"),
        ({"n": 0}, "n must be >= 1"),
        ({"arrival": "poisson"}, "needs rate > 0"),
        ({"arrival": "gamma", "rate": -1.0}, "rate must be > 0"),
        ({"rate": 0.0}, "rate must be > 0"),
        ({"source": "trace"}, "needs a path"),
        ({"source": "sharegpt-json", "path": ""}, "needs a path"),
        ({"limit": 0}, "limit must be >= 1"),
        ({"arrival": "trace"}, "arrival 'trace' needs source 'trace'"),
        ({"prompt_min": 10, "prompt_max": 5}, "prompt_max (5) is below prompt_min (10)"),
        ({"prefix_groups": 2}, "must both be > 0 or both 0"),
        ({"prefix_groups": 1, "prefix_len": 64, "max_prompt_len": 64}, "below max_prompt_len"),
        ({"cv": 0.0}, "cv must be > 0"),
        ({"prompt_mean": float("nan")}, "prompt_mean must be finite"),
        ({"num_requests": True}, "num_requests must be an integer"),
        ({"seed": -1}, "seed must be >= 0"),
    ],
)
def test_spec_rejects(kwargs: dict, needle: str) -> None:
    with pytest.raises(KvbenchError) as info:
        WorkloadSpec(**kwargs)
    assert needle in str(info.value)
    assert "\n" not in str(info.value)


def test_spec_from_mapping_errors_name_file_and_key() -> None:
    with pytest.raises(KvbenchError, match=r"^s\.toml: unknown key 'prompt_lenn' in \[workload\] \(known: source, "):
        WorkloadSpec.from_mapping({"prompt_lenn": 3}, where="s.toml")
    with pytest.raises(KvbenchError, match=r"^s\.toml: \[workload\] num_requests must be an integer, got 'ten'$"):
        WorkloadSpec.from_mapping({"num_requests": "ten"}, where="s.toml")
    with pytest.raises(KvbenchError, match=r"^s\.toml: \[workload\] num_requests must be >= 1, got 0$"):
        WorkloadSpec.from_mapping({"num_requests": 0}, where="s.toml")
    spec = WorkloadSpec.from_mapping(
        {"source": "lognormal", "prompt_mean": 100, "arrival": "poisson", "rate": 2}, where="s.toml"
    )
    assert spec.prompt_mean == 100.0 and isinstance(spec.rate, float)


# --- synthetic sources ------------------------------------------------------------------------


def test_fixed_workload_exact_table() -> None:
    w = build_workload(WorkloadSpec(num_requests=3, prompt_len=5, output_len=7, n=2))
    assert list(w.requests.columns) == list(COLUMNS)
    assert [str(t) for t in w.requests.dtypes] == list(COLUMNS.values())
    assert cols(w, "request_id") == [0, 1, 2]
    assert cols(w, "arrival_s") == [0.0, 0.0, 0.0]
    assert cols(w, "prompt_len") == [5, 5, 5]
    assert cols(w, "output_len") == [7, 7, 7]
    assert cols(w, "prefix_group") == [-1, -1, -1]
    assert cols(w, "prefix_len") == [0, 0, 0]
    assert cols(w, "n") == [2, 2, 2]
    assert w.num_requests == 3 and w.dropped == 0
    assert w.total_tokens == 3 * (5 + 7) * 2
    # tiny: 2 layers x 2 KV heads x head_dim 16 x 2 (K,V) x 2 bytes = 256 bytes/token.
    assert w.raw_kv_bytes(preset("tiny"), "fp16") == (72 * 256, 24 * 256)
    assert len(w.workload_id) == 16 and int(w.workload_id, 16) >= 0


def test_prefix_groups_round_robin_and_sampled_prompt_floor() -> None:
    w = build_workload(
        WorkloadSpec(
            source="uniform", num_requests=5, prompt_min=5, prompt_max=5, output_len=1, prefix_groups=2, prefix_len=8
        )
    )
    assert cols(w, "prefix_group") == [0, 1, 0, 1, 0]
    assert cols(w, "prefix_len") == [8] * 5
    assert cols(w, "prompt_len") == [9] * 5  # sampled prompts raised to prefix_len + 1, and counted
    assert w.raised == 5


def test_a_fixed_prompt_not_longer_than_the_prefix_is_refused() -> None:
    with pytest.raises(KvbenchError, match="prefix_len"):
        build_workload(WorkloadSpec(num_requests=5, prompt_len=5, output_len=1, prefix_groups=2, prefix_len=8))


def test_uniform_deterministic_and_inclusive_bounds() -> None:
    spec = WorkloadSpec(
        source="uniform", num_requests=2000, prompt_min=3, prompt_max=9, output_min=1, output_max=2, seed=7
    )
    a, b = build_workload(spec), build_workload(spec)
    pd.testing.assert_frame_equal(a.requests, b.requests)
    assert a.workload_id == b.workload_id
    assert sorted(set(cols(a, "prompt_len"))) == list(range(3, 10))
    assert sorted(set(cols(a, "output_len"))) == [1, 2]
    assert build_workload(spec.replace(seed=8)).workload_id != a.workload_id


def test_lognormal_mean_and_clamps() -> None:
    spec = WorkloadSpec(source="lognormal", num_requests=20_000, prompt_mean=300.0, output_mean=80.0, sigma=0.7)
    w = build_workload(spec)
    assert w.requests["prompt_len"].mean() == pytest.approx(300.0, rel=0.03)
    assert w.requests["output_len"].mean() == pytest.approx(80.0, rel=0.03)
    assert w.requests["prompt_len"].min() >= 1
    clamped = build_workload(spec.replace(max_prompt_len=200, max_output_len=50))
    assert clamped.requests["prompt_len"].max() == 200 and clamped.requests["output_len"].max() == 50
    assert build_workload(spec).workload_id == w.workload_id


@pytest.mark.parametrize(
    ("source", "fits"), [("sharegpt", (SHAREGPT_PROMPT, SHAREGPT_OUTPUT)), ("alpaca", (ALPACA_PROMPT, ALPACA_OUTPUT))]
)
def test_dataset_fits_match_published_means(source: str, fits: tuple) -> None:
    assert (fits[0].mean, fits[1].mean) == {"sharegpt": (161.31, 337.99), "alpaca": (19.31, 58.45)}[source]
    w = build_workload(WorkloadSpec(source=source, num_requests=20_000))
    assert w.requests["prompt_len"].mean() == pytest.approx(fits[0].mean, rel=0.04)
    assert w.requests["output_len"].mean() == pytest.approx(fits[1].mean, rel=0.04)


# --- arrivals ---------------------------------------------------------------------------------


def test_poisson_gaps_mean_one_over_rate() -> None:
    times = poisson_arrivals(np.random.default_rng(1), 20_000, rate=4.0)
    assert times[0] == 0.0 and np.all(np.diff(times) >= 0)
    gaps = np.diff(times)
    assert gaps.mean() == pytest.approx(0.25, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("cv", [0.5, 2.0])
def test_gamma_gaps_have_requested_cv(cv: float) -> None:
    gaps = np.diff(gamma_arrivals(np.random.default_rng(2), 20_000, rate=10.0, cv=cv))
    assert gaps.mean() == pytest.approx(0.1, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.08)


def test_arrival_process_does_not_change_lengths() -> None:
    base = WorkloadSpec(source="uniform", num_requests=50, seed=3)
    batch = build_workload(base)
    poisson = build_workload(base.replace(arrival="poisson", rate=2.0))
    faster = build_workload(base.replace(arrival="poisson", rate=8.0))
    assert cols(batch, "prompt_len") == cols(poisson, "prompt_len") == cols(faster, "prompt_len")
    assert cols(batch, "arrival_s") == [0.0] * 50
    assert cols(poisson, "arrival_s")[0] == 0.0
    np.testing.assert_allclose(np.array(cols(faster, "arrival_s")) * 4, cols(poisson, "arrival_s"))


def test_same_spec_same_table_despite_global_rng_scrambling() -> None:
    spec = WorkloadSpec(
        source="sharegpt", num_requests=300, arrival="gamma", rate=3.0, cv=1.5, prefix_groups=4, prefix_len=16, seed=11
    )
    first = build_workload(spec, max_model_len=1024)
    np.random.seed(12345)
    np.random.random(1000)
    random.seed(999)
    random.random()
    second = build_workload(spec, max_model_len=1024)
    pd.testing.assert_frame_equal(first.requests, second.requests, check_exact=True)
    assert first.workload_id == second.workload_id
    for name in COLUMNS:
        assert first.requests[name].to_numpy().tobytes() == second.requests[name].to_numpy().tobytes()


# --- dropping -----------------------------------------------------------------------------------


def test_drop_over_max_model_len_counts_and_renumbers(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("prompt_len,output_len,arrival_s\n10,10,0.0\n100,10,1.0\n5,5,2.5\n40,11,3.0\n")
    w = build_workload(WorkloadSpec(source="trace", path=str(trace), arrival="trace"), max_model_len=50)
    assert w.dropped == 2
    assert cols(w, "request_id") == [0, 1]
    assert cols(w, "prompt_len") == [10, 5]
    assert cols(w, "arrival_s") == [0.0, 2.5]  # trace times stay with their rows
    assert build_workload(WorkloadSpec(source="trace", path=str(trace)), max_model_len=51).dropped == 1


def test_all_dropped_is_an_error() -> None:
    with pytest.raises(KvbenchError, match=r"^workload: all 5 requests exceed max_model_len 2048"):
        build_workload(WorkloadSpec(num_requests=5, prompt_len=2000, output_len=100), max_model_len=2048)


# --- traces ---------------------------------------------------------------------------------------


def test_azure_slice() -> None:
    data = read_trace(AZURE_SLICE)
    assert data.kind == "azure" and data.num_requests == 2000
    assert data.arrival_s is not None
    assert data.arrival_s[0] == 0.0
    assert data.arrival_s[1] == pytest.approx(4.3145790, abs=1e-9)  # 18:15:50.9951690 - 18:15:46.6805900
    assert data.arrival_s[-1] == pytest.approx(424.2594570, abs=1e-9)
    assert (data.prompt_len[0], data.output_len[0]) == (374, 44)
    assert (int(data.prompt_len.sum()), int(data.output_len.sum())) == (2209565, 529807)
    assert read_trace(AZURE_SLICE, limit=10).num_requests == 10


def test_azure_slice_replay_with_time_scale() -> None:
    spec = WorkloadSpec(source="trace", path=str(AZURE_SLICE), limit=3, arrival="trace", time_scale=0.5)
    w = build_workload(spec)
    assert cols(w, "prompt_len") == [374, 396, 879]
    assert cols(w, "output_len") == [44, 109, 55]
    assert cols(w, "arrival_s") == pytest.approx([0.0, 2.1572895, 2.27093850])
    poisson = build_workload(spec.replace(arrival="poisson", rate=1.0, time_scale=1.0))
    assert cols(poisson, "prompt_len") == [374, 396, 879]


def _write_generic(path: Path, rows: list[dict]) -> None:
    if path.suffix == ".csv":
        pd.DataFrame(rows).to_csv(path, index=False)
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        pq.write_table(pa.Table.from_pandas(pd.DataFrame(rows), preserve_index=False), path)


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".parquet"])
def test_generic_traces(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"trace{suffix}"
    _write_generic(
        path,
        [
            {"prompt_len": 3, "output_len": 4, "arrival_s": 0.5},
            {"prompt_len": 30, "output_len": 1, "arrival_s": 0.5},
            {"prompt_len": 7, "output_len": 2, "arrival_s": 2.0},
        ],
    )
    data = read_trace(path)
    assert data.kind == "generic"
    assert data.prompt_len.tolist() == [3, 30, 7] and data.output_len.tolist() == [4, 1, 2]
    assert data.arrival_s is not None and data.arrival_s.tolist() == [0.5, 0.5, 2.0]
    assert read_trace(path, limit=2).prompt_len.tolist() == [3, 30]


def test_generic_trace_without_times(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"prompt_len": 3, "output_len": 4}\n\n{"prompt_len": 5, "output_len": 6}\n')
    assert read_trace(path).arrival_s is None
    w = build_workload(WorkloadSpec(source="trace", path=str(path)))
    assert cols(w, "arrival_s") == [0.0, 0.0]
    with pytest.raises(KvbenchError, match="t.jsonl.*no arrival_s column"):
        build_workload(WorkloadSpec(source="trace", path=str(path), arrival="trace"))


BAD_TRACES = [
    ("missing.csv", None, "no such file"),
    ("empty.csv", "", "file is empty"),
    ("header.csv", "prompt_len,output_len\n", "no requests"),
    ("cols.csv", "a,b\n1,2\n", "column 'prompt_len' missing (has: a, b)"),
    ("azcols.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.68,3\n", "column 'GeneratedTokens' missing"),
    ("nan.csv", "prompt_len,output_len\n3,4\n,5\n", "line 3: prompt_len is missing or empty"),
    ("text.csv", "prompt_len,output_len\n3,abc\n", "line 2: output_len 'abc' is not a number"),
    ("frac.csv", "prompt_len,output_len\n3.5,4\n", "line 2: prompt_len '3.5' is not a whole number"),
    ("zero.csv", "prompt_len,output_len\n3,4\n3,0\n", "line 3: output_len must be >= 1, got '0'"),
    ("neg.csv", "prompt_len,output_len\n-3,4\n", "line 2: prompt_len must be >= 1"),
    ("unsorted.csv", "prompt_len,output_len,arrival_s\n1,1,0\n1,1,2\n1,1,1\n", "line 4: arrival goes backwards"),
    ("negtime.csv", "prompt_len,output_len,arrival_s\n1,1,-1\n", "line 2: arrival_s must be a number of seconds"),
    (
        "dup.csv",
        "request_id,prompt_len,output_len\n0,1,1\n1,1,1\n0,2,2\n",
        "line 4: duplicate request_id '0' (first at line 2)",
    ),
    (
        "badtime.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,3,4\n",
        "line 2: TIMESTAMP 'yesterday' is not a date-time",
    ),
    (
        "azunsorted.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,3,4\n2023-11-16 18:15:45.0000000,3,4\n",
        "line 3: arrival goes backwards",
    ),
    ("bad.jsonl", '{"prompt_len": 3, "output_len": 4}\n{"prompt_len": \n', "line 2: malformed JSON"),
    ("bool.jsonl", '{"prompt_len": true, "output_len": 4}\n', "line 1: prompt_len True is not a number"),
    ("corrupt.parquet", "this is not parquet", "not a readable Parquet file"),
    ("trace.txt", "prompt_len,output_len\n1,1\n", "unsupported format '.txt'"),
    ("trace.json", "[]", "use source 'sharegpt-json'"),
]


@pytest.mark.parametrize(("name", "content", "needle"), BAD_TRACES, ids=[b[0] for b in BAD_TRACES])
def test_bad_traces_name_the_file(tmp_path: Path, name: str, content: str | None, needle: str) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(KvbenchError) as info:
        read_trace(path)
    message = str(info.value)
    assert str(path) in message and needle in message
    assert "\n" not in message


def test_sharegpt_json(tmp_path: Path) -> None:
    assert [approx_token_count(t) for t in ("", "abcd", "abcde", "é" * 4, "x" * 400)] == [1, 1, 2, 2, 100]
    path = tmp_path / "sg.json"
    path.write_text(
        json.dumps(
            [
                {
                    "id": "a",
                    "conversations": [{"from": "human", "value": "x" * 40}, {"from": "gpt", "value": "y" * 81}],
                },
                {"id": "b", "conversations": [{"from": "gpt", "value": "hi"}]},  # no human turn: skipped
                {
                    "id": "c",
                    "conversations": [
                        {"from": "system", "value": "s"},
                        {"from": "human", "value": "q" * 8},
                        {"from": "human", "value": "again"},
                        {"from": "gpt", "value": "a" * 12},
                    ],
                },
            ]
        )
    )
    data = read_sharegpt_json(path)
    assert data.prompt_len.tolist() == [10, 2] and data.output_len.tolist() == [21, 3] and data.skipped == 1
    w = build_workload(WorkloadSpec(source="sharegpt-json", path=str(path), limit=1))
    assert cols(w, "prompt_len") == [10] and cols(w, "output_len") == [21]
    bad = tmp_path / "bad.json"
    bad.write_text('[{"id": "a", "conversations": "nope"}]')
    with pytest.raises(KvbenchError, match=r"bad\.json: entry 0: expected an object with a 'conversations' list"):
        read_sharegpt_json(bad)
    bad.write_text("[{")
    with pytest.raises(KvbenchError, match=r"bad\.json: malformed JSON at line 1"):
        read_sharegpt_json(bad)


# --- the table and its file -----------------------------------------------------------------------


def _frame(**changes: list) -> pd.DataFrame:
    base = {
        "request_id": [0, 1, 2],
        "arrival_s": [0.0, 1.0, 3.0],
        "prompt_len": [4, 5, 6],
        "output_len": [1, 2, 3],
        "prefix_group": [-1, -1, -1],
        "prefix_len": [0, 0, 0],
        "n": [1, 1, 1],
    }
    base.update(changes)
    return pd.DataFrame(base)  # Python ints -> int64, floats -> float64


def test_workload_id_is_content_only() -> None:
    a = Workload.create(_frame(), '{"a":1}', 0)
    b = Workload.create(_frame(), "from some file", 3)
    c = Workload.create(_frame(output_len=[1, 2, 4]), '{"a":1}', 0)
    assert a.workload_id == b.workload_id != c.workload_id
    reordered = _frame()[list(reversed(COLUMNS))]
    assert Workload.create(reordered, "", 0).workload_id == a.workload_id


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"request_id": [0, 2, 1]}, "request 1: request_id must be 0..N-1"),
        ({"arrival_s": [0.0, 2.0, 1.0]}, "request 2: arrival_s must not decrease"),
        ({"prompt_len": [4, 0, 6]}, "request 1: prompt_len must be >= 1"),
        ({"prefix_group": [0, -1, -1], "prefix_len": [4, 0, 0]}, "request 0: prefix_len must be >= 0 and below"),
        ({"prefix_len": [0, 1, 0]}, "request 1: prefix_len must be 0 when prefix_group is -1"),
        ({"prompt_len": [4.0, 5.0, 6.0]}, "column 'prompt_len' must be int64"),
    ],
)
def test_workload_create_validates(changes: dict, needle: str) -> None:
    with pytest.raises(KvbenchError, match=needle.replace("(", r"\(").replace(".", r"\.")):
        Workload.create(_frame(**changes), "", 0)
    with pytest.raises(KvbenchError, match="missing: n"):
        Workload.create(_frame().drop(columns=["n"]), "", 0)
    with pytest.raises(KvbenchError, match="^workload is empty$"):
        Workload.create(_frame().iloc[:0], "", 0)


def test_parquet_round_trip_keeps_id_and_metadata(tmp_path: Path) -> None:
    spec = WorkloadSpec(
        source="lognormal", num_requests=200, arrival="poisson", rate=5.0, prefix_groups=3, prefix_len=10, n=2
    )
    w = build_workload(spec, max_model_len=512)
    path = write_workload(w, tmp_path / "sub" / "w.parquet")
    assert [p.name for p in path.parent.iterdir()] == ["w.parquet"]  # no temp file left behind
    meta = pq.read_schema(path).metadata
    assert meta[b"kvbench.schema_version"] == b"1"
    assert meta[b"kvbench.workload_id"].decode() == w.workload_id
    assert meta[b"kvbench.workload_spec"].decode() == spec.to_json()
    assert int(meta[b"kvbench.dropped"]) == w.dropped
    back = read_workload(path)
    assert back.workload_id == w.workload_id and back.dropped == w.dropped and back.spec_json == w.spec_json
    pd.testing.assert_frame_equal(back.requests, w.requests, check_exact=True)
    # A workload file is also a valid generic trace: same lengths and times, same id.
    replay = build_workload(
        WorkloadSpec(source="trace", path=str(path), arrival="trace", n=2, prefix_groups=3, prefix_len=10)
    )
    assert replay.workload_id == w.workload_id


def test_read_workload_refusals(tmp_path: Path) -> None:
    w = build_workload(WorkloadSpec(num_requests=4))
    path = write_workload(w, tmp_path / "w.parquet")
    table = pq.read_table(path)
    meta = dict(table.schema.metadata)

    newer = tmp_path / "newer.parquet"
    pq.write_table(table.replace_schema_metadata({**meta, b"kvbench.schema_version": b"2"}), newer)
    with pytest.raises(KvbenchError, match=r"newer\.parquet: schema version 2 is newer"):
        read_workload(newer)

    tampered = tmp_path / "tampered.parquet"
    frame = table.to_pandas()
    frame.loc[0, "prompt_len"] = 999
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False).replace_schema_metadata(meta), tampered)
    with pytest.raises(KvbenchError, match=r"tampered\.parquet: content does not match its id"):
        read_workload(tampered)

    plain = tmp_path / "plain.parquet"
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), plain)
    with pytest.raises(KvbenchError, match=r"plain\.parquet: not a kvbench workload file"):
        read_workload(plain)

    corrupt = tmp_path / "corrupt.parquet"
    corrupt.write_bytes(b"PAR1 nonsense")
    with pytest.raises(KvbenchError, match=r"corrupt\.parquet: not a readable Parquet file"):
        read_workload(corrupt)
    with pytest.raises(KvbenchError, match=r"nope\.parquet: no such file"):
        read_workload(tmp_path / "nope.parquet")


def test_summarize_exact() -> None:
    w = Workload.create(_frame(prefix_group=[0, 1, 0], prefix_len=[2, 2, 2]), "", 1)
    s = summarize(w, preset("tiny"), "fp16")
    assert s["num_requests"] == 3 and s["dropped"] == 1
    assert s["prompt_len"] == {"mean": 5.0, "p50": 5.0, "p90": 5.8, "p99": pytest.approx(5.98), "max": 6.0}
    assert s["arrival_span_s"] == 3.0
    assert s["rate_per_s"] == pytest.approx(2 / 3)
    assert s["burstiness_cv"] == pytest.approx(1 / 3)  # gaps 1, 2: std 0.5 / mean 1.5
    assert s["total_tokens"] == 5 + 7 + 9
    assert s["prefix_groups"] == 2
    assert (s["raw_kv_bytes_total"], s["raw_kv_bytes_largest_request"]) == (21 * 256, 9 * 256)
    batch = summarize(build_workload(WorkloadSpec(num_requests=2)))
    assert batch["rate_per_s"] is None and batch["burstiness_cv"] is None and "model" not in batch


# -- published length data as quantile tables (workloads.length_tables) ----------------------


def test_quantile_sources_give_the_paper_s_means_and_dependence() -> None:
    import numpy as np
    from kvbench.workloads.length_tables import TABLES, table_lengths, table_means

    paper = {"sharegpt-quantiles": (161.31, 337.99), "alpaca-quantiles": (19.31, 58.45)}
    for name, table in TABLES.items():
        prompts, outputs = table_lengths(np.random.default_rng(0), 200_000, table)
        assert prompts.min() >= 1 and outputs.min() >= 1
        for got, want in zip((prompts.mean(), outputs.mean()), paper[name]):
            assert abs(got / want - 1) < 0.01, (name, got, want)  # the data's means, sampled
        assert table_means(table)[0] == pytest.approx(paper[name][0], rel=0.005)
        rank = np.corrcoef(np.argsort(np.argsort(prompts)), np.argsort(np.argsort(outputs)))[0, 1]
        # The dependence the data has (ShareGPT +0.21, Alpaca -0.19), kept by the per-bin outputs.
        assert (rank > 0.1) if name.startswith("sharegpt") else (rank < -0.1), (name, rank)
    prompts, outputs = table_lengths(np.random.default_rng(1), 50_000, TABLES["sharegpt-quantiles"])
    assert (prompts + outputs).max() <= 2048  # the filter the paper's data passed
    assert np.median(prompts) == pytest.approx(35, abs=2)  # the data's median (a lognormal fit gives ~100)


def test_a_quantile_source_is_a_workload_source(tmp_path) -> None:
    from kvbench.harness.spec.workload_spec import WorkloadSpec
    from kvbench.workloads import build_workload

    spec = WorkloadSpec(source="sharegpt-quantiles", num_requests=500, seed=3)
    a, b = build_workload(spec, 2048), build_workload(spec, 2048)
    assert a.workload_id == b.workload_id and len(a.requests) == 500 and a.dropped == 0
    other = build_workload(spec.replace(seed=4), 2048)
    assert other.workload_id != a.workload_id
