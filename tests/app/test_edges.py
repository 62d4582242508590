"""Honest numbers at the edges: each reproduction of issue #45 that is not a plain bad input
(those are rows of ``test_bad_input.py``), through the real CLI where it has one. A refusal that
needs a live server or a served run is checked here for its one line, its exit code and an
unchanged tree; a corrected number against the value the field's own tool gives.

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

from tests.conftest import DATA, ROOT, assert_one_line_error, kvbench, serve_suite, tree

DETAILED = DATA / "vllm_bench_serve_detailed.json"
REFUSED = 2  # bad input


def refused(proc: subprocess.CompletedProcess[str], root: Path, before: dict[str, tuple], *needles: str) -> None:
    assert_one_line_error(proc, *needles)
    assert proc.returncode == REFUSED, proc.stderr
    assert tree(root) == before, "a refused command changed files it did not write"


# -- 1, 2: files kvbench did not write ---------------------------------------------------------


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


# -- 4: an empty path names nothing ------------------------------------------------------------


# -- 6, 8, 9, 10: import validates every field ------------------------------------------------


def _doc() -> dict[str, Any]:
    return json.loads(DETAILED.read_text())


# -- 7: Mooncake JSONL -------------------------------------------------------------------------

MOONCAKE_ROW = {"timestamp": 0, "input_length": 33, "output_length": 4, "hash_ids": [1]}


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


def test_compare_names_what_an_imported_cell_does_not_record(imported: Path, tmp_path: Path) -> None:
    base = tmp_path / "base"
    proc = kvbench("run", "example", "--out", str(base), "--quiet", "--no-report", timeout=600)
    assert proc.returncode == 0, proc.stderr
    proc = kvbench("compare", str(base), str(imported))
    assert "nan" not in proc.stdout and "not recorded" in proc.stdout, proc.stdout


# -- 5, 14, 16, 20: a served engine --------------------------------------------------------------

PAGED_16 = {"block_size": "16", "enable_prefix_caching": "False", "num_gpu_blocks": "512"}
# The stream: chunks at 0.10 s (1 token), 0.15 s (2) and 0.20 s (2).
CHUNKS = ((0.10, 1), (0.15, 2), (0.20, 2))


def _serve(tmp_path: Path, url: str) -> tuple[Path, subprocess.CompletedProcess[str]]:
    suite = tmp_path / "serve.toml"
    suite.write_text(serve_suite(url))
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


def test_a_policy_the_attached_server_does_not_run_is_refused(tmp_path: Path) -> None:
    pytest.importorskip("aiohttp")
    script = Script(chunks=CHUNKS, cache_config=PAGED_16)
    with stand_in_server(script) as url:
        suite = tmp_path / "serve.toml"
        suite.write_text(serve_suite(url, ["contiguous-max"]))
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
    roofline = serve_suite("http://127.0.0.1:9", scheduler={"clock": "roofline"})
    (spec, _), *_ = parse_suite(roofline, str(tmp_path / "s.toml")).cells()
    assert spec.scheduler.clock == "measured"  # the suite's roofline is for its other runners
    with pytest.raises(KvbenchError, match='serve runner runs on clock = "measured" only'):
        list(parse_suite(serve_suite("http://127.0.0.1:9", clock="steps"), str(tmp_path / "s.toml")).cells())


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
