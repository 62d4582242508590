"""Corrupt and future files are refused by name; the suite and trace readers are fuzzed:
whatever the input, they return a result or raise KvbenchError, never anything else."""

from __future__ import annotations

import tomllib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kvbench.app.suite import parse_suite
from kvbench.harness.errors import KvbenchError
from kvbench.harness.records import store
from kvbench.harness.records.schema import SCHEMA_VERSION, STEPS, VERSION_KEY
from kvbench.harness.spec.workload_spec import WorkloadSpec

from tests.conftest import ROOT, run_suite_text

EXAMPLE = (ROOT / "suites" / "example.toml").read_text()


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("results")
    rows, _ = run_suite_text(EXAMPLE.replace("num_requests = 200", "num_requests = 20"), out)
    return out, rows


def test_truncated_parquet_is_reported_by_name(results, tmp_path):
    out, rows = results
    victim = store.partition_dir(out, "steps", rows[0]["run_id"]) / store.PART
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2])
    try:
        with pytest.raises(KvbenchError, match=str(victim).replace("=", ".")):
            store.read_table(out, "steps")
    finally:
        victim.write_bytes(data)
    assert len(store.read_table(out, "steps", {rows[0]["run_id"]})) > 0


def test_newer_schema_version_is_refused_with_both_versions(tmp_path):
    d = store.partition_dir(tmp_path, "steps", "abc")
    d.mkdir(parents=True)
    table = pa.Table.from_pylist([], schema=STEPS).replace_schema_metadata({VERSION_KEY: b"99"})
    pq.write_table(table, d / store.PART)
    with pytest.raises(KvbenchError, match=f"version 99.*up to {SCHEMA_VERSION}"):
        store.read_table(tmp_path, "steps")


def test_a_partition_without_its_file_is_not_a_run(tmp_path):
    (tmp_path / "runs" / "run_id=deadbeef").mkdir(parents=True)
    (tmp_path / "runs" / ".tmp-run_id=cafe-1").mkdir(parents=True)
    assert store.existing_run_ids(tmp_path) == set()


# -- fuzzing -----------------------------------------------------------------------

toml_scalars = st.one_of(
    st.integers(-(10**12), 10**12),
    st.floats(allow_nan=True),
    st.text(max_size=12),
    st.booleans(),
    st.lists(st.integers(-5, 5000), max_size=3),
)
SECTIONS = {
    "model": ["preset", "config", "kv_dtype", "colour"],
    "memory": ["kv_budget", "max_model_len"],
    "workload": [
        "source",
        "num_requests",
        "prompt_len",
        "output_len",
        "arrival",
        "rate",
        "path",
        "seed",
        "n",
        "prefix_groups",
        "prefix_len",
        "sigma",
        "prompt_mean",
    ],
    "scheduler": ["max_num_seqs", "max_num_batched_tokens", "preemption", "clock", "gpu"],
    "grid": ["runner", "policy", "block_size", "rate", "kv_dtype"],
}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(
        st.sampled_from(list(SECTIONS)),
        st.dictionaries(st.sampled_from(sorted({k for ks in SECTIONS.values() for k in ks})), toml_scalars, max_size=4),
        max_size=5,
    )
)
def test_fuzzed_suites_give_cells_or_one_kvbench_error(doc):
    base = tomllib.loads(EXAMPLE)
    for section, table in doc.items():
        base.setdefault(section, {}).update(table)
    text = "\n".join(_toml(base))
    try:
        suite = parse_suite(text, "fuzz.toml")
        for spec, _ in suite.cells():
            spec.run_id("x")
    except KvbenchError as exc:
        assert "\n" not in str(exc)


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=300))
def test_fuzzed_toml_text_never_crashes_the_parser(text):
    try:
        parse_suite(text, "fuzz.toml")
    except KvbenchError:
        pass


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    header=st.sampled_from(
        [
            "prompt_len,output_len",
            "prompt_len,output_len,arrival_s",
            "TIMESTAMP,ContextTokens,GeneratedTokens",
            "request_id,prompt_len,output_len",
            "a,b",
        ]
    ),
    rows=st.lists(
        st.lists(
            st.one_of(
                st.integers(-3, 3000),
                st.floats(allow_nan=True, allow_infinity=True),
                st.text(alphabet="0123456789.-: abcxT", max_size=8),
            ),
            min_size=0,
            max_size=4,
        ),
        max_size=6,
    ),
)
def test_fuzzed_traces_give_a_workload_or_one_kvbench_error(tmp_path, header, rows):
    from kvbench.workloads import build_workload

    path = tmp_path / "trace.csv"
    path.write_text(header + "\n" + "\n".join(",".join(str(v) for v in r) for r in rows) + "\n")
    for arrival in ("batch", "trace"):
        try:
            w = build_workload(WorkloadSpec(source="trace", path=str(path), arrival=arrival), 4096)
        except KvbenchError as exc:
            assert "\n" not in str(exc)
        else:
            df = w.requests
            assert (df.prompt_len >= 1).all() and (df.output_len >= 1).all() and df.arrival_s.is_monotonic_increasing


def _toml(doc: dict) -> list[str]:
    lines = []
    for key, value in doc.items():
        if not isinstance(value, dict):
            lines.append(f"{key} = {_value(value)}")
    for key, value in doc.items():
        if isinstance(value, dict):
            lines.append(f"[{key}]")
            lines.extend(f"{k} = {_value(v)}" for k, v in value.items())
    return lines


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if v != v else ("inf" if v == float("inf") else "-inf" if v == float("-inf") else repr(v))
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    return str(v)
