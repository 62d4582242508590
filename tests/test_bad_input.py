"""The bad-input corpus: every subcommand, run as a real subprocess, must answer bad
input with one clear line on stderr naming the input and the problem, a non-zero exit,
no traceback, and no output that looks complete."""

from __future__ import annotations

import json
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
    "roofline_scale_below_one": (("max_num_batched_tokens = 2048", 'max_num_batched_tokens = 2048\nclock = "roofline"\n'
                                 "roofline_scale = 0.5"), ("roofline_scale", "0.5")),
    "roofline_scale_text": (("max_num_batched_tokens = 2048", 'max_num_batched_tokens = 2048\nclock = "roofline"\n'
                            'roofline_scale = "fast"'), ("roofline_scale", "fast")),
    "roofline_scale_without_roofline": (("max_num_batched_tokens = 2048",
                                         "max_num_batched_tokens = 2048\nroofline_scale = 2.0"),
                                        ("roofline_scale", "roofline")),
    "reference_basis_unknown": (("block_size = [16]", 'block_size = [16]\n[[reference]]\nitem = "x"\npolicy = "paged"\n'
                                 'metric = "mean_running"\npublished = 1.0\nsource = "s"\nbasis = "guessed"'),
                                ("basis", "guessed")),
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


def test_a_named_workload_error_names_its_table(tmp_path):
    p = tmp_path / "suite.toml"
    p.write_text(EXAMPLE.replace("[workload]", "[workloads.chat]", 1).replace("num_requests = 200", "num_requests = 0", 1))
    proc = kvbench("run", str(p), "--out", str(tmp_path / "out"), "--quiet")
    assert_one_line_error(proc, "suite.toml", "[workloads.chat]", "num_requests")
    assert "[workload] " not in proc.stderr


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


FIT_ROOFLINE = {
    # (arguments after `kvbench fit-roofline`): (expected words in the error line)
    "not_a_roofline_suite": (["example", "--target", "5"], ("roofline",)),
    "unknown_metric": (["paper-batched-requests", "--workload", "sharegpt", "--metric", "speed", "--target", "5"],
                       ("speed",)),
    "ambiguous_workload": (["paper-batched-requests", "--target", "5"], ("--workload", "sharegpt")),
    "unknown_workload": (["paper-batched-requests", "--workload", "dolly", "--target", "5"], ("dolly", "sharegpt")),
    "no_such_policy": (["paper-batched-requests", "--workload", "sharegpt", "--policy", "paged-prefix",
                        "--target", "5"], ("paged-prefix",)),
    # Memory-bound: no slowing of the clock takes Orca (Max) to 100 requests at once.
    "unreachable_target": (["paper-batched-requests", "--workload", "sharegpt", "--policy", "contiguous-max",
                            "--target", "100", "--max-scale", "2"], ("100", "outside")),
}


@pytest.mark.parametrize("case", list(FIT_ROOFLINE))
def test_bad_fit_roofline(case):
    args, needles = FIT_ROOFLINE[case]
    assert_one_line_error(kvbench("fit-roofline", *args), *needles)


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


# -- names that would become paths -------------------------------------------------------------

ESCAPING_NAMES = {
    "parent": "../../escape",
    "absolute": "/tmp/kvbench-escape",
    "separator": "a/b",
    "backslash": "..\\..\\escape",
    "dot": ".",
    "dotdot": "..",
    "hidden": ".kvbench.lock",
    "nul": "a\x00b",
    "newline": "a\nb",
    "very_long": "x" * 300,
    "empty_after_strip": " ",
}


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("case", list(ESCAPING_NAMES))
def test_a_suite_name_never_becomes_a_path(tmp_path, case):
    name = ESCAPING_NAMES[case]
    cwd = tmp_path / "a" / "b" / "c"
    cwd.mkdir(parents=True)
    suite = cwd / "suite.toml"
    suite.write_text(EXAMPLE.replace('name = "example"', f"name = {json.dumps(name)}"))  # JSON strings are TOML strings
    before = _tree(tmp_path)
    proc = kvbench("run", str(suite), "--quiet", "--no-report", cwd=cwd)  # the default output directory
    assert_one_line_error(proc, "suite.toml", "name", "cannot name a results directory")
    assert "\x00" not in proc.stderr
    assert proc.returncode == 2
    assert _tree(tmp_path) == before  # nothing written anywhere
    assert not Path("/tmp/kvbench-escape").exists()


def test_a_suite_named_by_its_file_name_is_checked_too(tmp_path):
    suite = tmp_path / ".hidden.toml"
    suite.write_text(EXAMPLE.replace('name = "example"\n', ""))
    assert_one_line_error(kvbench("run", str(suite), "--quiet", cwd=tmp_path), "'.hidden'", "set name")


def test_workload_names_that_look_like_paths_stay_inside_the_results_directory(tmp_path):
    # Workload names never reach the file system (workload files are named by content hash):
    # they are accepted, and every file lands under kvbench-results/<suite name>/.
    cwd = tmp_path / "a" / "b"
    cwd.mkdir(parents=True)
    names = ["../../escape", "/tmp/kvbench-escape-w", "a\x00b", "y" * 300]
    tables = "".join(f"[workloads.{json.dumps(n)}]\nsource = \"fixed\"\nprompt_len = {10 + i}\noutput_len = 10\n"
                     f"num_requests = 5\n" for i, n in enumerate(names))
    suite = cwd / "suite.toml"
    suite.write_text('name = "paths"\n[model]\npreset = "tiny"\n[memory]\nkv_budget = "1MiB"\n' + tables)
    proc = kvbench("run", str(suite), "--quiet", "--no-report", cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    written = _tree(tmp_path) - {"a", "a/b", "a/b/suite.toml"}
    assert written and all(p.startswith("a/b/kvbench-results") for p in written), sorted(written)
    assert len(list((cwd / "kvbench-results" / "paths" / "workloads").iterdir())) == len(names)
    assert not Path("/tmp/kvbench-escape-w").exists()


# -- model configs that cannot be right ----------------------------------------------------------

LLAMA_CONFIG = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 256,
                "intermediate_size": 512, "vocab_size": 1000}
BAD_CONFIGS = {
    # changes to a valid config: words the one line must hold
    "head_size_not_integral": ({"hidden_size": 250}, ("hidden_size 250", "num_attention_heads 4", "62.5", "head_dim")),
    "kv_heads_not_dividing": ({"num_key_value_heads": 3}, ("num_attention_heads (4)", "num_kv_heads (3)")),
    "more_kv_heads_than_heads": ({"num_key_value_heads": 8}, ("num_kv_heads (8)",)),
    "zero_kv_heads": ({"num_key_value_heads": 0}, ("num_kv_heads", "positive")),
    "zero_layers": ({"num_hidden_layers": 0}, ("num_layers", "positive")),
    "zero_head_dim": ({"head_dim": 0}, ("head_dim", "positive")),
    "negative_heads": ({"num_attention_heads": -4}, ("num_attention_heads",)),
    "fractional_hidden": ({"hidden_size": 256.5}, ("hidden_size", "integer")),
    "layers_absurd": ({"num_hidden_layers": 100_000}, ("num_layers", "100000", "at most 1,024")),
    "head_dim_absurd": ({"head_dim": 65_536}, ("head_dim", "at most")),
    "vocab_absurd": ({"vocab_size": 10**10}, ("vocab_size", "at most")),
    "hidden_absurd": ({"hidden_size": 2**24, "head_dim": 64}, ("hidden_size", "at most")),
}


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_an_inconsistent_model_config_is_refused(tmp_path, case):
    changes, needles = BAD_CONFIGS[case]
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({**LLAMA_CONFIG, **changes}))
    proc = kvbench("calc", "--block-size", "16", "--tokens", "35", "--model", str(cfg), "--budget", "1GiB")
    assert_one_line_error(proc, str(cfg), *needles)


def test_a_suite_with_an_inconsistent_config_is_refused_before_any_run(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({**LLAMA_CONFIG, "hidden_size": 250}))
    suite = suite_with(tmp_path, 'preset = "opt-13b"', f'config = "{cfg}"')
    out = tmp_path / "out"
    proc = kvbench("run", suite, "--out", str(out), "--quiet")
    assert_one_line_error(proc, "suite.toml", str(cfg), "62.5")
    assert not out.exists()
    # The default place, kvbench-results/<suite>: the parent the run made for it goes too.
    proc = kvbench("run", suite, "--quiet", cwd=tmp_path)
    assert_one_line_error(proc, "suite.toml", str(cfg), "62.5")
    assert not (tmp_path / "kvbench-results").exists()


def test_an_explicit_head_dim_is_honoured(tmp_path):
    # hidden 250 over 4 heads has no integral head size, but a config may say its head_dim (as
    # Gemma's and Qwen3's do, with heads × head_dim ≠ hidden): KV bytes follow head_dim.
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({**LLAMA_CONFIG, "hidden_size": 250, "head_dim": 96}))
    proc = kvbench("calc", "--block-size", "16", "--tokens", "35", "--model", str(cfg), "--budget", "1GiB", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)[0]["kv_bytes_per_token"] == 2 * 2 * 2 * 96 * 2  # K,V × layers × KV heads × 96 × fp16
