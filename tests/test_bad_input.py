"""The bad-input corpus: every subcommand, run as a real subprocess, must answer bad
input with one clear line on stderr naming the input and the problem, a non-zero exit,
no traceback, and no output that looks complete."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import ROOT, assert_one_line_error, kvbench

EXAMPLE = (ROOT / "suites" / "example.toml").read_text()


def suite_with(tmp_path: Path, old: str, new: str) -> str:
    assert old in EXAMPLE, old
    p = tmp_path / "suite.toml"
    p.write_text(EXAMPLE.replace(old, new, 1))
    return str(p)


SUITE_EDITS = {
    # (old text, new text): (expected words in the error line)
    "typo_in_scheduler_key": (("max_num_seqs", "max_num_seq"), ("suite.toml", "max_num_seq")),
    "typo_in_workload_key": (("num_requests = 200", "num_request = 200"), ("suite.toml", "num_request")),
    "typo_in_grid_key": (("block_size = [16]", "blocksize = [16]"), ("suite.toml", "blocksize")),
    "unknown_top_level_key": (('name = "example"', 'name = "example"\ncolour = "red"'), ("colour",)),
    "text_for_an_integer": (("num_requests = 200", 'num_requests = "ten"'), ("num_requests", "ten")),
    "bool_for_an_integer": (("num_requests = 200", "num_requests = true"), ("num_requests",)),
    "zero_requests": (("num_requests = 200", "num_requests = 0"), ("num_requests",)),
    "negative_prompt": (("prompt_len = 100", "prompt_len = -5"), ("prompt_len",)),
    "block_size_zero": (("block_size = [16]", "block_size = [0]"), ("block_size",)),
    "block_size_absurd": (("block_size = [16]", "block_size = [1000000000]"), ("block_size",)),
    "budget_zero": (('"12GiB"', '"0B"'), ("kv_budget",)),
    "budget_petabytes": (('"12GiB"', '"5PB"'), ("kv_budget",)),
    "budget_unparsable": (('"12GiB"', '"12 parsecs"'), ("kv_budget", "parsecs")),
    "max_model_len_zero": (("max_model_len = 2048", "max_model_len = 0"), ("max_model_len",)),
    "max_num_seqs_negative": (("max_num_seqs = 256", "max_num_seqs = -1"), ("max_num_seqs",)),
    "unknown_policy": (('"paged"]', '"pagd"]'), ("pagd", "contiguous-max")),
    "unknown_runner": (('runner = ["sim"]', 'runner = ["simm"]'), ("simm", "vllm-sched")),
    "unknown_preset": (('preset = "opt-13b"', 'preset = "gpt-5"'), ("gpt-5", "llama-3-8b")),
    "unknown_dtype": (('kv_dtype = "fp16"', 'kv_dtype = "fp4"'), ("fp4", "fp8")),
    "unknown_source": (('source = "fixed"', 'source = "fixd"'), ("fixd",)),
    "unknown_arrival": (('arrival = "batch"', 'arrival = "sometimes"'), ("sometimes",)),
    "poisson_without_rate": (('arrival = "batch"', 'arrival = "poisson"'), ("rate",)),
    "every_request_too_long": (("prompt_len = 100", "prompt_len = 5000"), ("suite.toml", "max_model_len")),
    "empty_grid_list": (('runner = ["sim"]', "runner = []"), ("runner",)),
    "grid_names_missing_workload": (('runner = ["sim"]', 'runner = ["sim"]\nworkload = ["nope"]'), ("nope",)),
    "malformed_toml": (("[memory]", "[memory"), ("suite.toml", "TOML")),
    "trace_file_missing": (('source = "fixed"', 'source = "trace"\npath = "/nonexistent/trace.csv"'),
                           ("/nonexistent/trace.csv",)),
}


@pytest.mark.parametrize("case", list(SUITE_EDITS))
def test_bad_suite(tmp_path, case):
    (old, new), needles = SUITE_EDITS[case]
    out = tmp_path / "out"
    proc = kvbench("run", suite_with(tmp_path, old, new), "--out", str(out), "--quiet")
    assert_one_line_error(proc, *needles)
    assert not (out / "runs").exists()  # nothing that looks like a result


TRACES = {
    "missing_columns": ("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.68,374\n", ("GeneratedTokens",)),
    "nan_length": ("prompt_len,output_len\n10,5\nnan,3\n", ("prompt_len",)),
    "text_length": ("prompt_len,output_len\n10,5\nabc,3\n", ("prompt_len",)),
    "zero_length": ("prompt_len,output_len\n10,0\n", ("output_len",)),
    "empty": ("prompt_len,output_len\n", ("empty",)),
    "unsorted_times": ("prompt_len,output_len,arrival_s\n10,5,2.0\n10,5,1.0\n", ("arrival",)),
    "duplicate_ids": ("request_id,prompt_len,output_len\n1,10,5\n1,10,5\n", ("request_id",)),
    "azure_bad_timestamp": ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,10,5\n", ("TIMESTAMP",)),
}


@pytest.mark.parametrize("case", list(TRACES))
def test_bad_trace(tmp_path, case):
    text, needles = TRACES[case]
    trace = tmp_path / "trace.csv"
    trace.write_text(text)
    arrival = "trace" if case in ("unsorted_times", "azure_bad_timestamp") else "batch"
    suite = suite_with(tmp_path, 'source = "fixed"', f'source = "trace"\npath = "{trace}"')
    Path(suite).write_text(Path(suite).read_text().replace('arrival = "batch"', f'arrival = "{arrival}"'))
    proc = kvbench("run", suite, "--out", str(tmp_path / "out"), "--quiet")
    assert_one_line_error(proc, "trace.csv", *needles)


CALC = {
    "block_size_zero": (["--block-size", "0", "--tokens", "35"], ("block-size",)),
    "tokens_negative": (["--block-size", "16", "--tokens", "-1"], ("tokens",)),
    "tokens_text": (["--block-size", "16", "--tokens", "many"], ("tokens",)),
    "unknown_model": (["--block-size", "16", "--tokens", "35", "--model", "gpt-5", "--budget", "1GiB"], ("gpt-5",)),
    "bad_budget": (["--block-size", "16", "--tokens", "35", "--model", "opt-13b", "--budget", "lots"], ("lots",)),
    "budget_without_model": (["--block-size", "16", "--tokens", "35", "--budget", "1GiB"], ("--model",)),
    "unknown_dtype": (["--block-size", "16", "--tokens", "35", "--model", "opt-13b", "--budget", "1GiB",
                       "--kv-dtype", "fp5"], ("fp5",)),
    "missing_workload": (["--block-size", "16", "--tokens", "35", "--model", "opt-13b", "--budget", "1GiB",
                          "--workload", "/nonexistent.parquet"], ("/nonexistent.parquet",)),
}


@pytest.mark.parametrize("case", list(CALC))
def test_bad_calc(case):
    args, needles = CALC[case]
    assert_one_line_error(kvbench("calc", *args), *needles)


def test_calc_rejects_a_malformed_config_json(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text('{"num_hidden_layers": 2')
    proc = kvbench("calc", "--block-size", "16", "--tokens", "3", "--model", str(cfg), "--budget", "1GiB")
    assert_one_line_error(proc, "config.json", "malformed JSON")
    cfg.write_text('{"num_hidden_layers": 2}')
    proc = kvbench("calc", "--block-size", "16", "--tokens", "3", "--model", str(cfg), "--budget", "1GiB")
    assert_one_line_error(proc, "config.json", "num_attention_heads")


def test_missing_and_non_suite_paths(tmp_path):
    assert_one_line_error(kvbench("run", str(tmp_path / "nope.toml")), "nope.toml", "no such")
    assert_one_line_error(kvbench("run", str(tmp_path)), "directory")
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    assert_one_line_error(kvbench("run", str(binary)), "binary.toml")
    out_file = tmp_path / "file"
    out_file.write_text("x")
    assert_one_line_error(kvbench("run", str(ROOT / "suites" / "example.toml"), "--out", str(out_file)), "not a directory")


@pytest.mark.parametrize("args", [["frobnicate"], ["run", "--jobs", "0"], ["workload", "show"],
                                  ["workload", "show", "/nonexistent.parquet"]])
def test_bad_command_lines(args):
    assert_one_line_error(kvbench(*args))


def test_workload_show_names_a_corrupt_file(tmp_path):
    bad = tmp_path / "w.parquet"
    bad.write_bytes(b"PAR1 this is not parquet")
    assert_one_line_error(kvbench("workload", "show", str(bad)), "w.parquet")


def test_a_workload_that_cannot_fit_is_infeasible_with_bytes_and_levers(tmp_path):
    out = tmp_path / "out"
    proc = kvbench("run", suite_with(tmp_path, '"12GiB"', '"10MiB"'), "--out", str(out), "--quiet", "--no-report")
    assert proc.returncode == 3
    last = proc.stderr.strip().splitlines()[-1]
    assert "infeasible" in last and "MiB" in last and "fewer KV heads" in last and "Traceback" not in proc.stderr
    assert "infeasible" in proc.stdout  # the rows are recorded and shown
