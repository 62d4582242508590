"""The bad-input corpus: every subcommand, run as a real subprocess, must answer bad
input with one clear line on stderr naming the input and the problem, a non-zero exit,
no traceback, and no output that looks complete."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, assert_one_line_error, kvbench, tree

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
    "roofline_scale_below_one": (
        ("max_num_batched_tokens = 2048", 'max_num_batched_tokens = 2048\nclock = "roofline"\nroofline_scale = 0.5'),
        ("roofline_scale", "0.5"),
    ),
    "roofline_scale_text": (
        ("max_num_batched_tokens = 2048", 'max_num_batched_tokens = 2048\nclock = "roofline"\nroofline_scale = "fast"'),
        ("roofline_scale", "fast"),
    ),
    "roofline_scale_without_roofline": (
        ("max_num_batched_tokens = 2048", "max_num_batched_tokens = 2048\nroofline_scale = 2.0"),
        ("roofline_scale", "roofline"),
    ),
    "reference_basis_unknown": (
        (
            "block_size = [16]",
            'block_size = [16]\n[[reference]]\nitem = "x"\npolicy = "paged"\n'
            'metric = "mean_running"\npublished = 1.0\nsource = "s"\nbasis = "guessed"',
        ),
        ("basis", "guessed"),
    ),
    "contiguous_unit_unknown": (
        ('runner = ["sim"]', 'runner = ["sim"]\ncontiguous_unit = "page"'),
        ("contiguous_unit", "page", "position, block"),
    ),
    "vllm_reserving_token_positions": (
        ('runner = ["sim"]', 'runner = ["sim", "vllm-sched"]\ncontiguous_unit = "position"'),
        ("vllm-sched", "whole blocks only"),
    ),
    "trace_file_missing": (
        ('source = "fixed"', 'source = "trace"\npath = "/nonexistent/trace.csv"'),
        ("/nonexistent/trace.csv",),
    ),
    "tp_not_dividing_heads": (
        ("[grid]", "[parallel]\ntensor_parallel_size = 3\n[grid]"),
        ("suite.toml", "tensor_parallel_size 3", "40 attention heads"),
    ),
    "tp_grid_axis_not_dividing_heads": (
        ('runner = ["sim"]', 'runner = ["sim"]\ntensor_parallel_size = [1, 2, 3]'),
        ("suite.toml", "tensor_parallel_size 3"),
    ),
    "tp_times_pp_over_num_gpus": (
        ("[grid]", "[parallel]\ntensor_parallel_size = 4\npipeline_parallel_size = 2\nnum_gpus = 4\n[grid]"),
        ("suite.toml", "= 8 GPUs", "num_gpus = 4"),
    ),
    "tp_zero": (("[grid]", "[parallel]\ntensor_parallel_size = 0\n[grid]"), ("tensor_parallel_size", "0")),
    "pp_negative": (("[grid]", "[parallel]\npipeline_parallel_size = -2\n[grid]"), ("pipeline_parallel_size", "-2")),
    "pp_over_layers": (("[grid]", "[parallel]\npipeline_parallel_size = 41\n[grid]"), ("41", "40 layers")),
    "together_key_typo": (
        ('runner = ["sim"]', 'runner = ["sim"]\ntogether = [{ presett = "opt-66b" }]'),
        ("suite.toml", "presett", "together #1"),
    ),
    "together_holding_a_list": (
        ('runner = ["sim"]', 'runner = ["sim"]\ntogether = [{ tensor_parallel_size = [1, 2] }]'),
        ("together #1", "tensor_parallel_size", "one value"),
    ),
    "together_and_an_axis": (
        ('runner = ["sim"]', 'runner = ["sim"]\ntogether = [{ block_size = 32 }]'),
        ("block_size", "in one place"),
    ),
    "together_not_a_table": (('runner = ["sim"]', 'runner = ["sim"]\ntogether = [4]'), ("together #1", "table")),
    "together_pairing_a_tp_that_does_not_divide": (
        ('runner = ["sim"]', 'runner = ["sim"]\ntogether = [{ preset = "opt-66b", tensor_parallel_size = 5 }]'),
        ("tensor_parallel_size 5", "72 attention heads"),
    ),
    "parallel_key_typo": (("[grid]", "[parallel]\ntensor_parallel = 2\n[grid]"), ("tensor_parallel", "[parallel]")),
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
    p.write_text(
        EXAMPLE.replace("[workload]", "[workloads.chat]", 1).replace("num_requests = 200", "num_requests = 0", 1)
    )
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
    "unknown_dtype": (
        ["--block-size", "16", "--tokens", "35", "--model", "opt-13b", "--budget", "1GiB", "--kv-dtype", "fp5"],
        ("fp5",),
    ),
    "tp_not_dividing_heads": (
        ["--block-size", "16", "--tokens", "35", "--model", "opt-66b", "--budget", "5GiB", "--tp", "5"],
        ("tensor_parallel_size 5", "72 attention heads"),
    ),
    "tp_zero": (
        ["--block-size", "16", "--tokens", "35", "--model", "opt-66b", "--budget", "5GiB", "--tp", "0"],
        ("--tp",),
    ),
    "pp_negative": (
        ["--block-size", "16", "--tokens", "35", "--model", "opt-66b", "--budget", "5GiB", "--pp", "-1"],
        ("--pp",),
    ),
    "tp_without_model": (["--block-size", "16", "--tokens", "35", "--tp", "2"], ("--tp", "--model")),
    "missing_workload": (
        [
            "--block-size",
            "16",
            "--tokens",
            "35",
            "--model",
            "opt-13b",
            "--budget",
            "1GiB",
            "--workload",
            "/nonexistent.parquet",
        ],
        ("/nonexistent.parquet",),
    ),
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
    assert_one_line_error(
        kvbench("run", str(ROOT / "suites" / "example.toml"), "--out", str(out_file)), "not a directory"
    )


@pytest.mark.parametrize(
    "args", [["frobnicate"], ["run", "--jobs", "0"], ["workload", "show"], ["workload", "show", "/nonexistent.parquet"]]
)
def test_bad_command_lines(args):
    assert_one_line_error(kvbench(*args))


FIT_ROOFLINE = {
    # (arguments after `kvbench fit-roofline`): (expected words in the error line)
    "not_a_roofline_suite": (["example", "--target", "5"], ("roofline",)),
    "unknown_metric": (
        ["paper-batched-requests", "--workload", "sharegpt", "--metric", "speed", "--target", "5"],
        ("speed",),
    ),
    "ambiguous_workload": (["paper-batched-requests", "--target", "5"], ("--workload", "sharegpt")),
    "unknown_workload": (["paper-batched-requests", "--workload", "dolly", "--target", "5"], ("dolly", "sharegpt")),
    "no_such_policy": (
        ["paper-batched-requests", "--workload", "sharegpt", "--policy", "paged-prefix", "--target", "5"],
        ("paged-prefix",),
    ),
    # Memory-bound: no slowing of the clock takes Orca (Max) to 100 requests at once.
    "unreachable_target": (
        [
            "paper-batched-requests",
            "--workload",
            "sharegpt",
            "--policy",
            "contiguous-max",
            "--target",
            "100",
            "--max-scale",
            "2",
        ],
        ("100", "outside"),
    ),
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
    tables = "".join(
        f'[workloads.{json.dumps(n)}]\nsource = "fixed"\nprompt_len = {10 + i}\noutput_len = 10\nnum_requests = 5\n'
        for i, n in enumerate(names)
    )
    suite = cwd / "suite.toml"
    suite.write_text('name = "paths"\n[model]\npreset = "tiny"\n[memory]\nkv_budget = "1MiB"\n' + tables)
    proc = kvbench("run", str(suite), "--quiet", "--no-report", cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    written = _tree(tmp_path) - {"a", "a/b", "a/b/suite.toml"}
    assert written and all(p.startswith("a/b/kvbench-results") for p in written), sorted(written)
    assert len(list((cwd / "kvbench-results" / "paths" / "workloads").iterdir())) == len(names)
    assert not Path("/tmp/kvbench-escape-w").exists()


# -- model configs that cannot be right ----------------------------------------------------------

LLAMA_CONFIG = {
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_size": 256,
    "intermediate_size": 512,
    "vocab_size": 1000,
}
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


# -- refused before anything is written ----------------------------------------------------------


def grid_of(key: str, count: int) -> str:
    return f"{key} = [{', '.join(str(i) for i in range(count))}]"


REFUSED_SUITES = {
    # (old text, new text): (expected words in the error line)
    "requests_absurd": (("num_requests = 200", "num_requests = 1000000000000"), ("num_requests", "10,000,000")),
    "requests_one_over": (("num_requests = 200", "num_requests = 10000001"), ("num_requests", "10,000,000")),
    "rate_times_duration": (
        ('arrival = "batch"', 'arrival = "poisson"\nrate = 1e6\nduration_s = 1e6'),
        ("rate * duration_s", "10,000,000"),
    ),
    "rate_times_duration_overflows": (
        ('arrival = "batch"', 'arrival = "gamma"\nrate = 1e300\nduration_s = 1e300'),
        ("rate * duration_s", "inf", "10,000,000"),
    ),
    "trace_limit_absurd": (
        ('source = "fixed"', 'source = "trace"\npath = "/nonexistent/t.csv"\nlimit = 100000000000'),
        ("limit", "10,000,000"),
    ),
    "repeats_absurd": (('name = "example"', 'name = "example"\nrepeats = 100000000'), ("repeats", "1,000")),
    "repeats_one_over": (('name = "example"', 'name = "example"\nrepeats = 1001'), ("repeats", "1,000")),
    "grid_product": (
        ("block_size = [16]", f"{grid_of('block_size', 64)}\n{grid_of('seed', 500)}"),
        ("128,000 cells", "100,000"),
    ),
    "grid_product_astronomical": (
        (
            "block_size = [16]",
            "\n".join(
                grid_of(k, 100)
                for k in (
                    "block_size",
                    "seed",
                    "n",
                    "max_num_seqs",
                    "max_num_batched_tokens",
                    "output_len",
                    "prompt_len",
                    "max_model_len",
                )
            ),
        ),
        ("about 10^16 cells", "100,000"),
    ),
    "grid_times_repeats": (
        ("block_size = [16]", f"block_size = [16]\n{grid_of('seed', 100)}"),
        ("400,000 cells", "100,000"),
        'name = "example"\nrepeats = 1000',
    ),
    "runner_override_product": (
        ("block_size = [16]", f"{grid_of('block_size', 100)}\n[runners.sim]\n{grid_of('seed', 1000)}"),
        ("400,000 cells",),
    ),
    "unknown_runner_table": (
        ("block_size = [16]", 'block_size = [16]\n[runners.simm]\npolicy = ["paged"]'),
        ("[runners.simm]", "'simm'", "vllm-sched"),
    ),
    "runner_table_capitalised": (
        ("block_size = [16]", "block_size = [16]\n[runners.Sim]\nmax_num_seqs = 8"),
        ("[runners.Sim]", "known: sim"),
    ),
    "runner_table_underscore": (
        ("block_size = [16]", 'block_size = [16]\n[runners.vllm_sched]\npolicy = ["paged"]'),
        ("[runners.vllm_sched]", "vllm-sched"),
    ),
    "runner_table_not_run": (
        ("block_size = [16]", 'block_size = [16]\n[runners.vllm]\npolicy = ["paged"]'),
        ("[runners.vllm]", "configures runner vllm", "does not run", "it runs: sim"),
    ),
    "runner_override_empty_list": (
        ("block_size = [16]", "block_size = [16]\n[runners.sim]\npolicy = []"),
        ("[runners.sim]", "policy", "empty list"),
    ),
    "runner_override_empty_block_sizes": (
        ("block_size = [16]", "block_size = [16]\n[runners.sim]\nblock_size = []"),
        ("[runners.sim]", "block_size", "empty list"),
    ),
    "runner_override_undefined_workload": (
        ("block_size = [16]", 'block_size = [16]\n[runners.sim]\nworkload = ["nope"]'),
        ("[runners.sim]", "'nope'", "not defined"),
    ),
    "optional_runners_a_string": (
        ('name = "example"', 'name = "example"\noptional_runners = "vllm"'),
        ("optional_runners", "list of runner names"),
    ),
    "optional_runner_typo": (
        ('name = "example"', 'name = "example"\noptional_runners = ["vlm"]'),
        ("optional_runners", "'vlm'", "vllm-sched"),
    ),
    "prefix_as_long_as_the_prompt": (
        ("seed = 0", "seed = 0\nprefix_groups = 2\nprefix_len = 100"),
        ("prefix_len (100) must be below prompt_len (100)", "a token of its own"),
    ),
    "prefix_longer_than_the_prompt": (
        ("seed = 0", "seed = 0\nprefix_groups = 2\nprefix_len = 150"),
        ("prefix_len (150) must be below prompt_len (100)",),
    ),
    "config_is_a_device": (('preset = "opt-13b"', 'config = "/dev/zero"'), ("/dev/zero", "not a regular file")),
    "hybrid_kv_off_with_state_layers": (
        (
            'policy = ["contiguous-max", "contiguous-pow2", "contiguous-oracle", "paged"]',
            'policy = ["paged"]\n[runners.sim]\npreset = "qwen3-next-80b"\nhybrid_kv = false',
        ),
        ("qwen3-next-80b", "Failed to promote local KV cache specs to one unified type"),
    ),
    "hybrid_kv_not_a_bool": (
        ('preset = "opt-13b"', 'preset = "gpt-oss-20b"\nhybrid_kv = "off"'),
        ("hybrid_kv", "'off'"),
    ),
    "a_hybrid_model_on_a_positions_unit_contiguous_policy": (
        (
            'policy = ["contiguous-max", "contiguous-pow2", "contiguous-oracle", "paged"]',
            'policy = ["contiguous-max"]\n[runners.sim]\npreset = "gpt-oss-20b"\ncontiguous_unit = "position"',
        ),
        ("KV cache groups reserves whole blocks of each group", 'contiguous_unit = "block"'),
    ),
    "profile_is_a_device": (
        (
            "max_num_batched_tokens = 2048",
            'max_num_batched_tokens = 2048\nclock = "profile"\nclock_profile = "/dev/urandom"',
        ),
        ("/dev/urandom", "not a regular file"),
    ),
    "trace_is_a_device": (
        ('source = "fixed"', 'source = "trace"\npath = "/dev/zero"'),
        ("trace /dev/zero", "not a regular file"),
    ),
    "sharegpt_json_is_a_device": (
        ('source = "fixed"', 'source = "sharegpt-json"\npath = "/dev/zero"'),
        ("/dev/zero", "not a regular file"),
    ),
}


@pytest.mark.parametrize("case", list(REFUSED_SUITES))
def test_a_refused_suite_writes_nothing(tmp_path, case):
    (old, new), needles, *top = REFUSED_SUITES[case]
    suite = suite_with(tmp_path, old, new)
    if top:
        Path(suite).write_text(Path(suite).read_text().replace('name = "example"', top[0], 1))
    out = tmp_path / "out"
    before = tree(tmp_path)
    proc = kvbench("run", suite, "--out", str(out), "--quiet", "--no-report")
    assert_one_line_error(proc, *needles)
    assert proc.returncode == 2
    assert tree(tmp_path) == before  # nothing written, nothing else touched


def test_every_shipped_suite_passes_the_limits_and_the_name_rule():
    from kvbench.app.suite import MAX_CELLS, count_cells, load_suite, shipped_suites

    for name in shipped_suites():
        suite = load_suite(name)  # every shipped suite (and its name) passes the rules
        assert count_cells(suite) <= MAX_CELLS
        if "profile" not in suite.settings.get("clock", ""):  # a profile clock needs its calibration first
            assert len(list(suite.cells())) <= count_cells(suite)  # cells() drops duplicates


def test_count_cells_counts_what_the_grid_expands_to():
    """count_cells restates Suite.cells' expansion without expanding: pinned to it on a suite
    with every kind of axis (grid, runner overrides as lists and scalars, workload sweeps,
    repeats) and no duplicate cell."""
    from kvbench.app.suite import count_cells, parse_suite

    text = EXAMPLE.replace("[workload]", "[workloads.a]").replace("num_requests = 200", "num_requests = [10, 20]")
    text = text.replace(
        "[scheduler]",
        '[workloads.b]\nsource = "fixed"\nprompt_len = 8\noutput_len = 8\nnum_requests = 5\n[scheduler]',
    )
    text = text.replace('name = "example"', 'name = "example"\nrepeats = 2')
    text = text.replace('runner = ["sim"]', 'runner = ["sim", "vllm-sched"]')
    text += '[runners.vllm-sched]\npolicy = "paged"\nworkload = ["b"]\nblock_size = [16, 32]\n'
    suite = parse_suite(text, "count.toml")
    assert count_cells(suite) == len(list(suite.cells())) == 4 * (2 + 1) * 2 + 1 * 2 * 1 * 2


def test_a_shipped_suites_name_is_not_hidden_by_its_results_directory(tmp_path):
    # `kvbench run example --out example` makes the directory `example`: the same command again
    # still means the shipped suite, and finds its cells recorded.
    for _ in range(2):
        proc = kvbench("run", "example", "--out", "example", "--no-report", "--quiet", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
    assert "0 cell(s) run, 4 skipped" in proc.stderr
    # A regular file by a shipped suite's name is the suite it holds.
    (tmp_path / "example").rename(tmp_path / "results")
    (tmp_path / "example").write_text(EXAMPLE.replace("num_requests = 200", "num_requests = 0"))
    assert_one_line_error(kvbench("run", "example", "--out", "o", "--quiet", cwd=tmp_path), "num_requests")


# -- files that are not files --------------------------------------------------------------------

NOT_FILES = ["/dev/zero", "/dev/null", "/dev/urandom", "fifo", "directory"]


def _not_a_file(tmp_path: Path, kind: str, name: str = "input.json") -> str:
    if kind == "fifo":
        path = tmp_path / name
        os.mkfifo(path)
        return str(path)
    if kind == "directory":
        path = tmp_path / name
        path.mkdir()
        return str(path)
    return kind


@pytest.mark.parametrize("kind", NOT_FILES)
def test_a_suite_path_that_is_not_a_file(tmp_path, kind):
    path = _not_a_file(tmp_path, kind, "suite.toml")
    out = tmp_path / "out"
    proc = kvbench("run", path, "--out", str(out), "--quiet", timeout=60)  # a FIFO must not block
    assert_one_line_error(proc, path, "directory" if kind == "directory" else "not a regular file")
    assert not out.exists()
    assert_one_line_error(kvbench("fit-roofline", path, "--target", "5", timeout=60), path)


@pytest.mark.parametrize("kind", NOT_FILES)
def test_a_model_config_that_is_not_a_file(tmp_path, kind):
    path = _not_a_file(tmp_path, kind, "model.json")
    if kind == "directory":  # a model directory: its config.json is read
        os.mkfifo(Path(path) / "config.json")
    proc = kvbench("calc", "--block-size", "16", "--tokens", "3", "--model", path, "--budget", "1GiB", timeout=60)
    assert_one_line_error(proc, path, "not a regular file")


@pytest.mark.parametrize("kind", NOT_FILES)
def test_a_clock_profile_that_is_not_a_file(tmp_path, kind):
    path = _not_a_file(tmp_path, kind, "profile.json")
    suite = suite_with(tmp_path, "max_num_batched_tokens = 2048", 'max_num_batched_tokens = 2048\nclock = "profile"')
    out = tmp_path / "out"
    proc = kvbench("run", suite, "--clock-profile", path, "--out", str(out), "--quiet", timeout=60)
    assert_one_line_error(proc, path, "directory" if kind == "directory" else "not a regular file")
    assert not out.exists()


@pytest.mark.parametrize("kind", NOT_FILES)
def test_a_trace_that_is_not_a_file(tmp_path, kind):
    path = _not_a_file(tmp_path, kind, "trace.csv")
    out = tmp_path / "out"
    proc = kvbench(
        "run",
        suite_with(tmp_path, 'source = "fixed"', f'source = "trace"\npath = "{path}"'),
        "--out",
        str(out),
        "--quiet",
        timeout=60,
    )
    assert_one_line_error(proc, f"trace {path}", "not a regular file")
    assert not out.exists()


def test_workload_show_config_that_is_not_a_file(tmp_path):
    w = tmp_path / "w.parquet"
    assert kvbench("workload", "make", "--out", str(w), "--num-requests", "3").returncode == 0
    for kind in NOT_FILES:
        path = _not_a_file(tmp_path, kind, f"{kind.strip('/').replace('/', '-')}.json")
        if kind == "directory":  # a model directory: its config.json is read
            os.mkfifo(Path(path) / "config.json")
        assert_one_line_error(
            kvbench("workload", "show", str(w), "--config", path, timeout=60), path, "not a regular file"
        )


def test_workload_make_refuses_an_absurd_count(tmp_path):
    out = tmp_path / "x.parquet"
    proc = kvbench("workload", "make", "--out", str(out), "--num-requests", "1000000000000")
    assert_one_line_error(proc, "num_requests", "10,000,000")
    assert not out.exists()
    proc = kvbench(
        "workload", "make", "--out", str(out), "--arrival", "poisson", "--rate", "1e6", "--duration-s", "1e6"
    )
    assert_one_line_error(proc, "rate * duration_s", "10,000,000")
    assert not out.exists()


def test_a_request_count_at_the_limit_is_accepted():
    from kvbench.harness.spec.workload_spec import MAX_REQUESTS, WorkloadSpec

    WorkloadSpec(num_requests=MAX_REQUESTS)
    WorkloadSpec(arrival="poisson", rate=1000.0, duration_s=MAX_REQUESTS / 1000)
    WorkloadSpec(source="trace", path="t.csv", limit=MAX_REQUESTS)


OVERSIZED = {
    # what, the limit's bytes, how to use the file
    "suite": (2**20, lambda p, tmp: kvbench("run", str(p), "--out", str(tmp / "out"), "--quiet")),
    "config": (
        16 * 2**20,
        lambda p, tmp: kvbench("calc", "--block-size", "16", "--tokens", "3", "--model", str(p), "--budget", "1GiB"),
    ),
}


@pytest.mark.parametrize("case", list(OVERSIZED))
def test_an_oversized_input_is_refused_with_its_limit(tmp_path, case):
    limit, use = OVERSIZED[case]
    path = tmp_path / ("suite.toml" if case == "suite" else "config.json")
    with path.open("wb") as fh:
        fh.truncate(limit + 1)  # sparse: no disk used
    proc = use(path, tmp_path)
    assert_one_line_error(proc, str(path), f"{limit + 1:,} bytes", f"{limit:,}-byte limit")
    assert not (tmp_path / "out").exists()


# -- whatever the locale -------------------------------------------------------------------------


def c_locale(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """The real CLI under the C locale, UTF-8 mode off: the default encoding is ASCII."""
    env = dict(os.environ, LC_ALL="C", LANG="C", PYTHONUTF8="0")
    env.pop("PYTHONIOENCODING", None)
    return subprocess.run(
        [sys.executable, "-m", "kvbench.app.cli", *args],
        capture_output=True,
        text=True,
        encoding="utf-8",
        errors="replace",
        cwd=cwd,
        env=env,
        timeout=300,
    )


def test_utf8_inputs_under_the_c_locale(tmp_path):
    suite = tmp_path / "suite.toml"
    suite.write_text(
        EXAMPLE.replace('name = "example"', 'name = "example"\ndescription = "café, 東京"'), encoding="utf-8"
    )
    proc = c_locale("run", str(suite), "--out", "out", "--quiet", "--no-report", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({**LLAMA_CONFIG, "_name_or_path": "modèle"}, ensure_ascii=False), encoding="utf-8")
    proc = c_locale(
        "calc", "--block-size", "16", "--tokens", "3", "--model", str(cfg), "--budget", "1GiB", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr


def test_a_suite_that_is_not_utf8_says_so(tmp_path):
    suite = tmp_path / "suite.toml"
    suite.write_bytes(
        EXAMPLE.replace('name = "example"', 'name = "example"\ndescription = "caf\xe9"').encode("latin-1")
    )
    assert_one_line_error(kvbench("run", str(suite), "--quiet"), "suite.toml", "not UTF-8", "0xe9")


# -- names ---------------------------------------------------------------------------------------

UNSAFE_NAMES = {
    # name: the character the error names, escaped
    "a\x85b": "'\\x85'",
    "line\u2028sep": "'\\u2028'",
    "invoice\u202eexe.toml": "'\\u202e'",
    "zero\u200bwidth": "'\\u200b'",
    "café": "'\\xe9'",
    "my suite": "' '",
    "a:b": "':'",
    "tab\tname": "'\\t'",
}


@pytest.mark.parametrize("name", list(UNSAFE_NAMES))
def test_a_suite_name_is_plain_ascii(tmp_path, name):
    suite = tmp_path / "suite.toml"
    suite.write_text(EXAMPLE.replace('name = "example"', f"name = {json.dumps(name)}"))
    before = _tree(tmp_path)
    proc = kvbench("run", str(suite), "--quiet", "--no-report", cwd=tmp_path)
    assert_one_line_error(proc, "cannot name a results directory", UNSAFE_NAMES[name], "ASCII letters, digits")
    if not (name.isascii() and name.isprintable()):
        assert name not in proc.stderr  # shown escaped, never raw
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("name", ["-rf", "+x", "_private"])
def test_a_suite_name_starts_with_a_letter_or_digit(tmp_path, name):
    suite = tmp_path / "suite.toml"
    suite.write_text(EXAMPLE.replace('name = "example"', f"name = {json.dumps(name)}"))
    assert_one_line_error(kvbench("run", str(suite), "--quiet", cwd=tmp_path), "starts with", "letter or digit")


def test_plain_names_pass():
    from kvbench.harness.spec.names import MAX_NAME_BYTES, path_component

    for name in ("example", "paper-block-size", "run_2.1+fp8", "1x", "x" * MAX_NAME_BYTES):
        assert path_component(name, "name") == name


# -- clock profiles that price nothing -----------------------------------------------------------

PROFILE = ROOT / "tests" / "data" / "profile-opt-13b-fp16-b16.json"
TERMS = ("step_s", "per_token_s", "per_seq_s", "per_context_token_s", "per_attention_pair_s")
DEGENERATE_TERMS = {
    "all_zero": ({t: 0.0 for t in TERMS}, ("costs 0 s", "1e-06 s minimum")),
    "subnormal": ({**{t: 0.0 for t in TERMS}, "step_s": 5e-324}, ("costs 4.94e-324 s", "1e-06 s minimum")),
    "just_below": ({**{t: 0.0 for t in TERMS}, "step_s": 5e-7, "per_token_s": 4e-7}, ("9e-07 s",)),
    "nan": ({"step_s": float("nan")}, ("corrupt clock profile", "step_s")),
    "infinite": ({"per_token_s": float("inf")}, ("corrupt clock profile", "per_token_s")),
}


def _profile(tmp_path: Path, terms: dict[str, float]) -> Path:
    doc = json.loads(PROFILE.read_text())
    doc["terms"].update(terms)
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(doc))  # NaN and Infinity as Python's json writes them
    return path


@pytest.mark.parametrize("case", list(DEGENERATE_TERMS))
def test_a_profile_whose_steps_cost_nothing_is_refused(tmp_path, case):
    terms, needles = DEGENERATE_TERMS[case]
    profile = _profile(tmp_path, terms)
    suite = suite_with(tmp_path, "max_num_batched_tokens = 2048", 'max_num_batched_tokens = 2048\nclock = "profile"')
    out = tmp_path / "out"
    proc = kvbench("run", suite, "--clock-profile", str(profile), "--out", str(out), "--quiet")
    assert_one_line_error(proc, str(profile), *needles)
    assert not out.exists()


def test_a_profile_with_some_zero_terms_is_accepted(tmp_path):
    # A fit constrains terms to >= 0 and may well give 0 for some: only the whole step matters.
    profile = _profile(tmp_path, {"per_seq_s": 0.0, "per_context_token_s": 0.0, "per_attention_pair_s": 0.0})
    suite = suite_with(tmp_path, "max_num_batched_tokens = 2048", 'max_num_batched_tokens = 2048\nclock = "profile"')
    proc = kvbench(
        "run", suite, "--clock-profile", str(profile), "--out", str(tmp_path / "out"), "--quiet", "--no-report"
    )
    assert proc.returncode == 0, proc.stderr


def test_no_profile_is_written_whose_steps_cost_nothing():
    from kvbench.harness.clock.model import ClockTerms
    from kvbench.harness.clock.profile import profile_document
    from kvbench.harness.errors import KvbenchError
    from kvbench.harness.spec.geometry import preset

    with pytest.raises(KvbenchError, match="1e-06 s minimum"):
        profile_document(ClockTerms(0.0, 0.0, 0.0, 0.0, 0.0), preset("opt-13b"), "fp16", 16, {}, {}, {}, {})


# -- traces that say one thing twice; lengths the user wrote -------------------------------------

AMBIGUOUS_TRACES = {
    "csv_duplicate_column": (
        "trace.csv",
        "prompt_len,output_len,prompt_len\n10,5,20\n",
        ("'prompt_len'", "more than once"),
    ),
    "csv_duplicate_after_spaces": (
        "trace.csv",
        "prompt_len, output_len, output_len\n10,5,20\n",
        ("'output_len'", "more than once"),
    ),
    "csv_duplicate_azure_column": (
        "trace.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens,ContextTokens\n2023-11-16 18:15:46.68,374,44,3\n",
        ("'ContextTokens'",),
    ),
    "csv_both_schemes": (
        "trace.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens,prompt_len,output_len\n2023-11-16 18:15:46.68,374,44,10,5\n",
        ("ContextTokens", "prompt_len", "keep one scheme"),
    ),
    "csv_azure_with_arrival_s": (
        "trace.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens,arrival_s\n2023-11-16 18:15:46.68,374,44,0.5\n",
        ("arrival_s", "keep one scheme"),
    ),
    "jsonl_duplicate_key": (
        "trace.jsonl",
        '{"prompt_len": 10, "output_len": 5, "prompt_len": 20}\n',
        ("line 1", "'prompt_len'", "more than once"),
    ),
    "jsonl_both_schemes": (
        "trace.jsonl",
        '{"ContextTokens": 10, "GeneratedTokens": 5, "TIMESTAMP": "2023-11-16", "output_len": 5}\n',
        ("output_len", "keep one scheme"),
    ),
}


@pytest.mark.parametrize("case", list(AMBIGUOUS_TRACES))
def test_an_ambiguous_trace_is_refused(tmp_path, case):
    name, text, needles = AMBIGUOUS_TRACES[case]
    trace = tmp_path / name
    trace.write_text(text)
    out = tmp_path / "out"
    proc = kvbench(
        "run",
        suite_with(tmp_path, 'source = "fixed"', f'source = "trace"\npath = "{trace}"'),
        "--out",
        str(out),
        "--quiet",
    )
    assert_one_line_error(proc, name, *needles)
    assert not out.exists()


def test_a_parquet_trace_with_a_duplicate_column_is_refused(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    trace = tmp_path / "trace.parquet"
    pq.write_table(
        pa.Table.from_arrays(
            [pa.array([10]), pa.array([5]), pa.array([20])], names=["prompt_len", "output_len", "prompt_len"]
        ),
        trace,
    )
    proc = kvbench(
        "run",
        suite_with(tmp_path, 'source = "fixed"', f'source = "trace"\npath = "{trace}"'),
        "--out",
        str(tmp_path / "out"),
        "--quiet",
    )
    assert_one_line_error(proc, "trace.parquet", "'prompt_len'", "more than once")


def test_trace_prompts_not_longer_than_the_prefix_are_refused(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("prompt_len,output_len\n10,5\n200,5\n20,5\n21,5\n")
    suite = suite_with(
        tmp_path, 'source = "fixed"', f'source = "trace"\npath = "{trace}"\nprefix_groups = 2\nprefix_len = 20'
    )
    out = tmp_path / "out"
    proc = kvbench("run", suite, "--out", str(out), "--quiet")
    assert_one_line_error(proc, "trace.csv", "2 of the 4 prompts", "prefix_len (20)")
    assert not out.exists()
    trace.write_text("prompt_len,output_len\n21,5\n200,5\n")  # all longer: accepted, lengths as written
    proc = kvbench("run", suite, "--out", str(out), "--quiet", "--no-report")
    assert proc.returncode == 0, proc.stderr
