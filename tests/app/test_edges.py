"""Honest numbers at the edges: each reproduction of issue #45, through the real CLI where it has
one. A refusal is checked for its one line (naming the input), its exit code and an unchanged tree
(every entry under the test's folder, links and FIFOs included, before and after); a corrected
number against the value the field's own tool gives.

The served runs here are the serve runner's attach mode against a stand-in server over real HTTP
(``tests/streamkit.py``), which streams chunks of several tokens on cue, as vLLM's server does
when its client falls behind."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from kvbench.app.suite import parse_suite
from kvbench.harness.errors import KvbenchError
from kvbench.harness.records import store
from kvbench.harness.records.atomic import replace_file
from kvbench.harness.records.goodput import judged_values, with_goodput
from kvbench.harness.records.percentiles import percentile
from kvbench.harness.records.slo import parse_slo, slo_frame, write_slo
from kvbench.harness.records.slo_presets import PRESETS
from kvbench.harness.sim.latency import itl_summary
from kvbench.harness.sim.sequence import FINISHED, Seq
from kvbench.runners.serve.client import SampleResult
from kvbench.runners.serve.runner import _apply_client
from kvbench.workloads.traces import MAX_TRACE_S, read_trace
from streamkit import Script, stand_in_server

from tests.conftest import DATA, ROOT, assert_one_line_error, kvbench, special, tree

DETAILED = DATA / "vllm_bench_serve_detailed.json"
REFUSED = 2  # bad input


def refused(proc: subprocess.CompletedProcess[str], root: Path, before: dict[str, tuple], *needles: str) -> None:
    assert_one_line_error(proc, *needles)
    assert proc.returncode == REFUSED, proc.stderr
    assert tree(root) == before, "a refused command changed files it did not write"


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``R`` of the issue: a results directory with one ok run, imported from vllm bench serve."""
    out = tmp_path_factory.mktemp("imported") / "R"
    proc = kvbench("import", str(DETAILED), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    return out


# -- 1, 2: files kvbench did not write ---------------------------------------------------------


@pytest.mark.parametrize("kind", ["fifo", "link-to-file", "link-to-directory", "dangling-link"])
def test_export_refuses_an_out_that_is_not_a_regular_file(imported: Path, tmp_path: Path, kind: str) -> None:
    target = tmp_path / "link.json"
    special(kind, target, tmp_path / "elsewhere")
    before = tree(tmp_path)
    proc = kvbench("export", str(imported), "--format", "vllm-bench", "--out", str(target))
    refused(proc, tmp_path, before, str(target), "FIFO" if kind == "fifo" else "symbolic link")


def test_export_never_follows_a_link_planted_at_a_temporary_name(imported: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "p.txt").write_text("the user's")
    (tmp_path / ".x.json.tmp").symlink_to(other / "p.txt")  # a fixed name a writer might pick
    before = tree(tmp_path)
    proc = kvbench("export", str(imported), "--format", "vllm-bench", "--out", str(tmp_path / "x.json"))
    assert proc.returncode == 0, proc.stderr
    after = tree(tmp_path)
    assert {k: v for k, v in after.items() if k != "x.json"} == before
    assert after["x.json"][0] == "file" and json.loads((tmp_path / "x.json").read_text())["completed"] == 12


def test_a_temporary_file_is_made_exclusively_and_skips_a_planted_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The names mkstemp would draw, made predictable: the first is taken by a link, which must be
    # neither written through nor removed; the next name is used.
    names = iter(["planted", "fresh"])
    monkeypatch.setattr(tempfile, "_get_candidate_names", lambda: names)
    (tmp_path / "secret").write_text("the user's")
    (tmp_path / ".out.json.planted.tmp").symlink_to(tmp_path / "secret")
    with replace_file(tmp_path / "out.json", "--out") as fh:
        fh.write(b"{}")
    assert (tmp_path / "secret").read_text() == "the user's"
    assert os.readlink(tmp_path / ".out.json.planted.tmp") == str(tmp_path / "secret")
    assert (tmp_path / "out.json").read_bytes() == b"{}" and not (tmp_path / ".out.json.fresh.tmp").exists()


def test_the_store_never_follows_a_link_at_a_fixed_temporary_name(tmp_path: Path) -> None:
    (tmp_path / "secret").write_text("the user's")
    (tmp_path / ".slo.parquet.tmp").symlink_to(tmp_path / "secret")
    write_slo(tmp_path, "s", parse_slo({"bounds": [{"metric": "ttft", "percentile": 99, "max_s": 1.0}]}, "s.toml"))
    assert (tmp_path / "secret").read_text() == "the user's" and (tmp_path / ".slo.parquet.tmp").is_symlink()
    assert pq.read_table(tmp_path / "slo.parquet").num_rows == 1


# -- 3: kvbench import FIFO --------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
def test_import_refuses_what_is_not_a_regular_file(tmp_path: Path, kind: str) -> None:
    if kind == "device":
        path = Path("/dev/zero")  # never ends
    else:
        path = tmp_path / "result.json"
        special(kind, path, tmp_path / "elsewhere")
    before = tree(tmp_path)
    proc = kvbench("import", str(path), "--out", str(tmp_path / "R"), timeout=60)
    words = {"fifo": "FIFO", "device": "character device", "directory": "directory"}[kind]
    refused(proc, tmp_path, before, str(path), words)


# -- 4: an empty path names nothing ------------------------------------------------------------

EMPTY_PATHS = {
    "report": ["report", ""],
    "export_dir": ["export", "", "--format", "vllm-bench", "--out", "x.json"],
    "import_file": ["import", ""],
    "import_like": ["import", str(DETAILED), "--like", ""],
    "compare": ["compare", "", "."],
    "diverge": ["diverge", "", "a", "b"],
    "calibrate": ["calibrate", "", "--out", "p.json"],
    "run_suite": ["run", ""],
    "run_clock_profile": ["run", "example", "--clock-profile", ""],
    "fit_roofline": ["fit-roofline", "", "--target", "1"],
    "workload_show": ["workload", "show", ""],
    "workload_make_suite": ["workload", "make", "--suite", "", "--out", "w.parquet"],
    "calc_model": ["calc", "--block-size", "16", "--tokens", "5", "--model", ""],
}


@pytest.mark.parametrize("case", EMPTY_PATHS)
def test_an_empty_path_is_refused_in_one_line(tmp_path: Path, case: str) -> None:
    before = tree(tmp_path)
    proc = kvbench(*EMPTY_PATHS[case], cwd=tmp_path, timeout=60)
    refused(proc, tmp_path, before, "an empty path names nothing")


# -- 6, 8, 9, 10: import validates every field ------------------------------------------------


def _doc() -> dict[str, Any]:
    return json.loads(DETAILED.read_text())


def _set(key: str, value: Any) -> Any:
    return lambda d: d.update({key: value})


def _entry(key: str, i: int, value: Any) -> Any:
    return lambda d: d[key].__setitem__(i, value)


BAD_IMPORTS: dict[str, tuple[Any, tuple[str, ...]]] = {
    # case: (edit of the fixture, words of the one line)
    "nan_statistic": (_set("mean_ttft_ms", math.nan), ("mean_ttft_ms", "finite", "nan")),
    "infinite_statistic": (_set("p99_ttft_ms", math.inf), ("p99_ttft_ms", "finite", "inf")),
    "negative_statistic": (_set("median_ttft_ms", -5), ("median_ttft_ms", ">= 0", "-5")),
    "string_statistic": (_set("mean_itl_ms", "4.6"), ("mean_itl_ms", "must be a number", "'4.6'")),
    "negative_input_len": (_entry("input_lens", 0, -4), ("input_lens[0] (request 0)", ">= 1", "-4")),
    "bool_output_len": (_entry("output_lens", 0, True), ("output_lens[0] (request 0)", "whole number", "True")),
    "fractional_input_len": (_entry("input_lens", 3, 24.9), ("input_lens[3] (request 3)", "whole number", "24.9")),
    "string_ttft": (_entry("ttfts", 0, "0.1"), ("ttfts[0] (request 0)", "must be a number", "'0.1'")),
    "negative_ttft": (_entry("ttfts", 1, -0.2), ("ttfts[1] (request 1)", ">= 0", "-0.2")),
    "latency_below_ttft": (_entry("latencies", 2, 0.001), ("latencies[2] (request 2)", "shorter than its TTFT")),
    "latency_beyond_duration": (_entry("latencies", 2, 99.0), ("latencies[2] (request 2)", "longer than", "duration")),
    "subnormal_duration": (_set("duration", 5e-324), ("duration", "5e-324", "infinite")),
    "nan_ttft_entry": (_entry("ttfts", 0, math.nan), ("ttfts[0] (request 0)", "finite", "nan")),
    "infinite_latency_entry": (_entry("latencies", 0, math.inf), ("latencies[0] (request 0)", "finite", "inf")),
    "nan_itl_gap": (lambda d: d["itls"][4].__setitem__(2, math.nan), ("itls[4] (request 4)[2]", "finite")),
    "completed_beyond_int64": (_set("completed", 10**30), ("completed", "int64")),
    "output_tokens_beyond_int64": (_set("total_output_tokens", 2**63 + 5), ("total_output_tokens", "int64")),
    "list_lengths_differ": (lambda d: d["ttfts"].pop(), ("ttfts holds 11 entries", "input_lens 12")),
    "model_id_not_a_string": (_set("model_id", ["a"]), ("model_id", "must be a string")),
}


@pytest.mark.parametrize("case", BAD_IMPORTS)
def test_a_bad_field_in_an_imported_result_is_one_line_and_leaves_nothing(tmp_path: Path, case: str) -> None:
    edit, words = BAD_IMPORTS[case]
    doc = _doc()
    edit(doc)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))  # Python's json writes NaN and Infinity as vLLM's json.dump does
    before = tree(tmp_path)
    proc = kvbench("import", str(bad), "--out", str(tmp_path / "R"))
    refused(proc, tmp_path, before, "bad.json", *words)


def test_a_summary_with_a_nan_latency_is_refused(tmp_path: Path) -> None:
    doc = json.loads((DATA / "vllm_bench_serve_summary.json").read_text())
    doc["latencies"] = [0.1, math.nan]
    (tmp_path / "s.json").write_text(json.dumps(doc))
    before = tree(tmp_path)
    proc = kvbench("import", str(tmp_path / "s.json"), "--out", str(tmp_path / "R"))
    refused(proc, tmp_path, before, "latencies[1] (request 1)", "finite")


# -- 7: Mooncake JSONL -------------------------------------------------------------------------

MOONCAKE_ROW = {"timestamp": 0, "input_length": 33, "output_length": 4, "hash_ids": [1]}
BAD_MOONCAKE = {
    "string_timestamp": ({"timestamp": "100"}, ("line 2", "timestamp", "'100'")),
    "string_input_length": ({"input_length": "33"}, ("line 2", "input_length", "'33' is not a number")),
    "string_output_length": ({"output_length": "4"}, ("line 2", "output_length", "'4' is not a number")),
    "timestamp_beyond_the_bound": ({"timestamp": 1e300}, ("line 2", "timestamp", "136 years")),
}


@pytest.mark.parametrize("case", BAD_MOONCAKE)
def test_a_mooncake_trace_holds_numbers_where_numbers_belong(tmp_path: Path, case: str) -> None:
    change, words = BAD_MOONCAKE[case]
    rows = [MOONCAKE_ROW, {**MOONCAKE_ROW, "timestamp": 10, **change}]
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    before = tree(tmp_path)
    proc = kvbench(
        "workload", "make", "--source", "trace", "--path", str(trace), "--hash-block-size", "512",
        "--out", str(tmp_path / "w.parquet"),
    )  # fmt: skip
    refused(proc, tmp_path, before, str(trace), *words)


def test_trace_times_up_to_the_bound_are_read_and_csv_numbers_stay_text(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    rows = [MOONCAKE_ROW, {**MOONCAKE_ROW, "timestamp": MAX_TRACE_S * 1000}]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert read_trace(trace).arrival_s[-1] == MAX_TRACE_S
    csv = tmp_path / "t.csv"
    csv.write_text("prompt_len,output_len,arrival_s\n 12 ,3, 0.5\n")
    data = read_trace(csv)
    assert data.prompt_len.tolist() == [12] and data.arrival_s.tolist() == [0.5]


# -- 11, 18: [slo] -----------------------------------------------------------------------------

SLO_SUITE = """
name = "slo"
[model]
preset = "opt-13b"
[memory]
kv_budget = "12GiB"
[workload]
source = "fixed"
num_requests = 4
prompt_len = 16
output_len = 4
arrival = "poisson"
rate = 1.0
[scheduler]
{clock}
[grid]
runner = ["sim"]
[slo]
{slo}
"""
BAD_SLO = {
    "preset_as_a_list": ('clock = "roofline"', 'preset = ["mlperf-llama2-70b-server"]', ("[slo] preset",)),
    "bound_metric_as_a_list": (
        'clock = "roofline"',
        'bounds = [{metric = ["ttft"], percentile = 99, max_s = 2.0}]',
        ("[slo] bound metric", "['ttft']"),
    ),
    "column_metric_as_a_list": ('clock = "roofline"', 'metric = ["ttft_p99_s"]\nbound = 1.0', ("[slo] metric",)),
    "on_the_steps_clock": ("", 'preset = "mlperf-llama2-70b-server"', ("[slo]", "steps clock", "count of scheduler")),
}


@pytest.mark.parametrize("case", BAD_SLO)
def test_a_bad_slo_is_refused_in_one_line_before_anything_is_written(tmp_path: Path, case: str) -> None:
    clock, slo, words = BAD_SLO[case]
    suite = tmp_path / "suite.toml"
    suite.write_text(SLO_SUITE.format(clock=clock, slo=slo))
    before = tree(tmp_path)
    proc = kvbench("run", str(suite), "--out", str(tmp_path / "out"), "--quiet", "--no-report")
    refused(proc, tmp_path, before, str(suite), *words)


# -- 17: percentiles by the method of the tool compared with ------------------------------------


def test_mlperf_takes_the_sorted_sample_at_n_times_q_where_linear_interpolates() -> None:
    # The case: 60 requests, second-largest TTFT 1.0 s, largest 2.5 s.
    ttft = np.array([0.5] * 58 + [1.0, 2.5])
    assert percentile(ttft, 99) == pytest.approx(1.615)  # numpy's linear: passes a 2 s bound
    assert percentile(ttft, 99, "mlperf") == 2.5  # LoadGen: sample_latencies[int(60 * 0.99)] = [59]
    assert np.percentile(ttft, 99) == percentile(ttft, 99)
    # ⌊n·q⌋ exactly: 100 samples, p99 is index 99; p50 index 50 (the upper middle, no averaging).
    hundred = np.arange(100.0)
    assert percentile(hundred, 99, "mlperf") == 99.0 and percentile(hundred, 50, "mlperf") == 50.0
    with pytest.raises(ValueError):
        percentile(hundred, 99, "nearest")


def test_the_mlperf_presets_are_judged_by_loadgen_percentile_and_include_the_llama3_1_ones() -> None:
    assert {p.name for p in PRESETS.values()} >= {"mlperf-llama3.1-405b-server", "mlperf-llama3.1-8b-interactive"}
    as_ms = {n: {b.column: round(b.max_s * 1000) for b in p.bounds} for n, p in PRESETS.items()}
    assert as_ms["mlperf-llama3.1-405b-server"] == {"ttft_p99_s": 6000, "tpot_p99_s": 175}
    assert as_ms["mlperf-llama3.1-8b-interactive"] == {"ttft_p99_s": 500, "tpot_p99_s": 30}
    for p in PRESETS.values():
        assert all(b.method == ("mlperf" if p.name.startswith("mlperf-") else "linear") for b in p.bounds)


def _sixty_requests(run_id: str, last_ttft: float) -> pd.DataFrame:
    first = [0.5] * 58 + [1.0, last_ttft]
    return pd.DataFrame(
        {
            "run_id": run_id,
            "request_id": range(60),
            "status": "finished",
            "arrival_s": 0.0,
            "first_token_s": first,
            "finished_s": [f + 0.3 for f in first],
            "output_len": 4,
            "token_times_s": [None] * 60,
        }
    )


def test_a_run_under_an_mlperf_preset_is_judged_on_loadgen_p99() -> None:
    slo = parse_slo({"preset": "mlperf-llama2-70b-server"}, "s.toml")
    requests = _sixty_requests("r1", 2.5)
    runs = pd.DataFrame({"run_id": ["r1"], "suite": ["s"], "sim_time_s": [10.0], "ttft_p99_s": [1.615]})
    judged = with_goodput(runs, requests, slo_frame(slo, "s"))
    assert judged.loc[0, "ttft_p99_s"] == 1.615  # the runs table's linear column, as recorded
    assert judged.loc[0, "ttft_p99_s@mlperf"] == 2.5 > 2.0  # over the bound: not within the SLO
    assert judged_values(requests, "tpot_p99_s@mlperf") == pytest.approx(0.1)


# -- 12: export of a run holding infinity -------------------------------------------------------


@pytest.mark.parametrize("fmt", ["vllm-bench", "pytorch-oss"])
def test_export_of_a_run_holding_infinity(imported: Path, tmp_path: Path, fmt: str) -> None:
    # A summary-only run whose statistic came in as infinity before import refused it.
    out = tmp_path / "R"
    proc = kvbench("import", str(DATA / "vllm_bench_serve_summary.json"), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    (rid,) = store.existing_run_ids(out)
    path = store.partition_dir(out, "runs", rid) / store.PART
    table = pq.read_table(path)
    frame = table.to_pandas()
    frame["ttft_p99_s"] = math.inf
    pq.write_table(table.from_pandas(frame, schema=table.schema, preserve_index=False), path)
    before = tree(tmp_path)
    proc = kvbench("export", str(out), "--format", fmt, "--out", str(tmp_path / "x.json"))
    if fmt == "vllm-bench":  # vLLM writes it with json.dump (Infinity, not JSON): refused
        refused(proc, tmp_path, before, "p99_ttft_ms is inf", "finite numbers")
    else:  # vLLM's InfEncoder writes "inf" in the PyTorch records: the same here
        assert proc.returncode == 0, proc.stderr
        records = json.loads((tmp_path / "x.json").read_text())
        values = {r["metric"]["name"]: r["metric"]["benchmark_values"] for r in records}
        assert values["p99_ttft_ms"] == ["inf"]


# -- 13, 15: messages ---------------------------------------------------------------------------


def test_report_refusing_a_foreign_file_does_not_suggest_an_option_it_lacks(imported: Path, tmp_path: Path) -> None:
    out = tmp_path / "R"
    subprocess.run(["cp", "-a", str(imported), str(out)], check=True)
    (out / "report").mkdir()
    (out / "report" / "notes.txt").write_text("mine")
    before = tree(tmp_path)
    proc = kvbench("report", str(out))
    refused(proc, tmp_path, before, "notes.txt", "move them away")
    assert "--no-report" not in proc.stderr


def test_compare_names_what_an_imported_cell_does_not_record(imported: Path, tmp_path: Path) -> None:
    base = tmp_path / "base"
    proc = kvbench("run", "example", "--out", str(base), "--quiet", "--no-report", timeout=600)
    assert proc.returncode == 0, proc.stderr
    proc = kvbench("compare", str(base), str(imported))
    assert "nan" not in proc.stdout and "not recorded" in proc.stdout, proc.stdout


# -- 5, 14, 16, 20: a served engine --------------------------------------------------------------

SERVE_SUITE = """
name = "served"
[model]
preset = "llama-mini"
kv_dtype = "bf16"
[memory]
kv_budget = "6MiB"
max_model_len = 1024
[workload]
source = "fixed"
prompt_len = 8
output_len = 5
num_requests = 3
arrival = "batch"
[grid]
runner = ["serve"]
policy = {policies}
block_size = [16]
[runners.serve]
url = "{url}"
request_timeout_s = 20
"""
PAGED_16 = {"block_size": "16", "enable_prefix_caching": "False", "num_gpu_blocks": "512"}
# The stream: chunks at 0.10 s (1 token), 0.15 s (2) and 0.20 s (2).
CHUNKS = ((0.10, 1), (0.15, 2), (0.20, 2))


def _serve(tmp_path: Path, url: str, policies: str = '["paged"]') -> tuple[Path, subprocess.CompletedProcess[str]]:
    suite = tmp_path / "serve.toml"
    suite.write_text(SERVE_SUITE.format(url=url, policies=policies))
    out = tmp_path / "out"
    return out, kvbench("run", str(suite), "--out", str(out), "--quiet", "--no-report", timeout=300)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One attach-mode serve run on the stand-in server streaming ``CHUNKS``."""
    pytest.importorskip("aiohttp")
    with stand_in_server(Script(chunks=CHUNKS, cache_config=PAGED_16)) as url:
        out, proc = _serve(tmp_path_factory.mktemp("served"), url)
    assert proc.returncode == 0, proc.stderr
    return out


def test_itl_is_one_gap_per_streamed_chunk_as_vllm_bench_serve_measures_it() -> None:
    seqs = [Seq(0, 0, 0, 8, 5, 0.0)]
    result = SampleResult(0, 0, sent_s=0.0, chunk_times=[0.10, 0.15, 0.20], chunk_tokens=[1, 2, 2], end_s=0.20)
    result.status = "finished"
    times = _apply_client(seqs, [result])
    assert seqs[0].num_output == 5 and seqs[0].status == FINISHED
    itl = itl_summary(seqs, times)
    assert itl["itl_p50_s"] == pytest.approx(0.05) and itl["itl_mean_s"] == pytest.approx(0.05)  # not 0.025


def test_a_served_run_records_each_chunk_and_exports_vllm_s_itls(served: Path, tmp_path: Path) -> None:
    (rid,) = store.existing_run_ids(served)
    run = store.read_table(served, "runs").iloc[0]
    requests = store.read_table(served, "requests", {rid})
    assert [list(c) for c in requests["token_counts"]] == [[1, 2, 2]] * 3
    assert all(len(t) == 3 for t in requests["token_times_s"])
    assert run["itl_p50_s"] == pytest.approx(0.05, abs=0.02) and run["itl_mean_s"] == pytest.approx(0.05, abs=0.02)
    assert run["clock"] == "measured"  # the suite named no clock: a served engine takes the measured one
    proc = kvbench("export", str(served), "--format", "vllm-bench", "--out", str(tmp_path / "x.json"))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "x.json").read_text())
    assert [len(gaps) for gaps in doc["itls"]] == [2, 2, 2]  # one per chunk after the first, not 4
    assert doc["median_itl_ms"] == pytest.approx(50, abs=20)
    assert doc["max_output_tokens_per_s"] == 9  # 3 requests × 3 chunks in the first second, as vLLM counts
    assert doc["output_lens"] == [5, 5, 5]


def test_two_policies_against_one_attached_server_are_refused(tmp_path: Path) -> None:
    url = "http://127.0.0.1:9"  # never asked: the suite is refused first
    suite = tmp_path / "serve.toml"
    suite.write_text(SERVE_SUITE.format(url=url, policies='["contiguous-max", "paged"]'))
    before = tree(tmp_path)
    proc = kvbench("run", str(suite), "--out", str(tmp_path / "out"), "--quiet", "--no-report")
    refused(proc, tmp_path, before, str(suite), "2 policies against one server", "contiguous-max", "paged")


def test_a_policy_the_attached_server_does_not_run_is_refused(tmp_path: Path) -> None:
    pytest.importorskip("aiohttp")
    script = Script(chunks=CHUNKS, cache_config=PAGED_16)
    with stand_in_server(script) as url:
        suite = tmp_path / "serve.toml"
        suite.write_text(SERVE_SUITE.format(url=url, policies='["contiguous-max"]'))
        before = tree(tmp_path)
        proc = kvbench("run", str(suite), "--out", str(tmp_path / "out"), "--quiet", "--no-report")
    refused(proc, tmp_path, before, url, "runs policy paged with block size 16", "not contiguous-max")
    assert script.requests == []  # nothing was sent


def test_a_stream_that_is_not_completion_chunks_is_a_failed_row_naming_the_server(tmp_path: Path) -> None:
    pytest.importorskip("aiohttp")
    with stand_in_server(Script(raw=b"[1, 2]", cache_config=PAGED_16)) as url:
        out, proc = _serve(tmp_path, url)
    assert proc.returncode == 1, proc.stderr  # a failed cell: recorded, and the run says so
    row = store.read_table(out, "runs").iloc[0]
    assert row["status"] == "failed"
    assert f"{url} streamed a message that is not a completion chunk" in row["error"]
    assert "AttributeError" not in row["error"] and "\n" not in row["error"]


def test_a_serve_cell_takes_the_measured_clock_and_refuses_another(tmp_path: Path) -> None:
    text = SERVE_SUITE.format(url="http://127.0.0.1:9", policies='["paged"]')
    roofline = text.replace('[grid]\nrunner = ["serve"]', '[scheduler]\nclock = "roofline"\n[grid]\nrunner = ["serve"]')
    (spec, _), *_ = parse_suite(roofline, str(tmp_path / "s.toml")).cells()
    assert spec.scheduler.clock == "measured"  # the suite's roofline is for its other runners
    with pytest.raises(KvbenchError, match='serve runner runs on clock = "measured" only'):
        list(parse_suite(text + 'clock = "steps"\n', str(tmp_path / "s.toml")).cells())


def test_import_with_like_refuses_a_bad_entry_in_one_line(served: Path, tmp_path: Path) -> None:
    doc = _doc()
    doc["input_lens"][0] = None
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    before = tree(tmp_path)
    proc = kvbench("import", str(tmp_path / "bad.json"), "--like", str(served), "--out", str(tmp_path / "R"))
    refused(proc, tmp_path, before, "input_lens[0] (request 0)", "None")


# -- 16: vllm bench serve → kvbench → vllm bench serve -------------------------------------------


def test_import_then_export_of_a_result_with_multi_token_chunks_keeps_its_itls(tmp_path: Path) -> None:
    """A real result whose stream merged tokens: the fixture with each request's chunks 3..6 and
    7..10 merged (their ITLs summed into one), as vLLM's client records a chunk of several tokens."""
    doc = _doc()
    for i, gaps in enumerate(doc["itls"]):
        merged = gaps[:3] + [sum(gaps[3:6])] + gaps[6:7] + [sum(gaps[7:10])] + gaps[10:]
        doc["itls"][i] = merged
    every = [g for gaps in doc["itls"] for g in gaps]
    for stat, value in (("mean", np.mean(every)), ("median", np.median(every)), ("std", np.std(every))):
        doc[f"{stat}_itl_ms"] = value * 1000
    for p in (50, 90, 95, 99):
        doc[f"p{p}_itl_ms"] = np.percentile(every, p) * 1000
    doc.pop("max_output_tokens_per_s")
    src = tmp_path / "merged.json"
    src.write_text(json.dumps(doc))
    proc = kvbench("import", str(src), "--out", str(tmp_path / "R"))
    assert proc.returncode == 0, proc.stderr
    proc = kvbench("export", str(tmp_path / "R"), "--format", "vllm-bench", "--out", str(tmp_path / "again.json"))
    assert proc.returncode == 0, proc.stderr
    again = json.loads((tmp_path / "again.json").read_text())
    assert [len(g) for g in again["itls"]] == [7] * 12  # 12 tokens in 8 chunks: 7 gaps, not 11
    for mine, theirs in zip(again["itls"], doc["itls"]):
        assert mine == pytest.approx(theirs, rel=1e-9, abs=1e-12)
    for key in ("mean_itl_ms", "median_itl_ms", "std_itl_ms", "p50_itl_ms", "p90_itl_ms", "p95_itl_ms", "p99_itl_ms"):
        assert again[key] == pytest.approx(doc[key], rel=1e-9), key
    first = _doc()
    assert again["output_lens"] == first["output_lens"] and again["ttfts"] == pytest.approx(first["ttfts"])


# -- 21: other libraries' import-time output under --quiet -------------------------------------

STAND_IN = textwrap.dedent("""
    import logging, os, sys
    os.write(2, b"fd 2 at import\\n")
    print("stdout at import")
    print("stderr at import", file=sys.stderr)
    _log = logging.getLogger("noisy_standin")
    _log.addHandler(logging.StreamHandler())  # bound to sys.stderr as it is now, as torch's is
    _log.propagate = False

    def later():
        _log.warning("a handler made at import, used later")
""")
SCRIPT = textwrap.dedent("""
    import sys
    from pathlib import Path
    from kvbench.app.third_party import open_results_log, to_log

    with open_results_log(Path(sys.argv[1])) as log, to_log(log):
        import noisy_standin
        noisy_standin.later()
        print("kvbench line", file=sys.stderr)
""")


def test_a_library_s_import_time_output_goes_to_the_log(tmp_path: Path) -> None:
    """A stand-in for torch under vLLM's CUDA build (not installable here): it writes to fd 2,
    prints to both streams and makes a logging handler on sys.stderr as it imports."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "noisy_standin.py").write_text(STAND_IN)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "lib"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, cwd=ROOT, env=env, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == ["kvbench line"] and proc.stdout == ""
    log = (tmp_path / "kvbench.log").read_text()
    for line in ("fd 2 at import", "stdout at import", "stderr at import", "a handler made at import, used later"):
        assert line in log, log


# -- 22: prefix caching is the policy, not a setting --------------------------------------------


def test_prefix_caching_asked_for_as_a_setting_is_refused_naming_its_policy(tmp_path: Path) -> None:
    suite = tmp_path / "suite.toml"
    text = (ROOT / "suites" / "example.toml").read_text()
    suite.write_text(text + '\n[runners.sim]\npolicy = ["contiguous-max"]\nenable_prefix_caching = true\n')
    before = tree(tmp_path)
    proc = kvbench("run", str(suite), "--out", str(tmp_path / "out"), "--quiet", "--no-report")
    refused(proc, tmp_path, before, "enable_prefix_caching", 'the policy "paged-prefix"')
