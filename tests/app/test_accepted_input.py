"""Inputs at the edges that ``test_bad_input.py`` refuses, accepted: the limits themselves, names
and encodings kvbench takes, configs and profiles that are unusual but right, and the one
outcome that is not bad input (a workload that fits nowhere is recorded as infeasible)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import DATA, EXAMPLE, LLAMA_CONFIG, assert_one_line_error, kvbench, suite_file, suite_toml


def test_a_workload_that_cannot_fit_is_infeasible_with_bytes_and_levers(tmp_path):
    suite = suite_file(tmp_path, EXAMPLE.replace('"12GiB"', '"10MiB"'))
    proc = kvbench("run", suite, "--out", tmp_path / "out", "--quiet", "--no-report")
    assert proc.returncode == 3
    last = proc.stderr.strip().splitlines()[-1]
    assert "infeasible" in last and "MiB" in last and "fewer KV heads" in last and "Traceback" not in proc.stderr
    assert "infeasible" in proc.stdout  # the rows are recorded and shown


# -- names -----------------------------------------------------------------------------------------


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_workload_names_that_look_like_paths_stay_inside_the_results_directory(tmp_path):
    # Workload names never reach the file system (workload files are named by content hash):
    # they are accepted, and every file lands under kvbench-results/<suite name>/.
    cwd = tmp_path / "a" / "b"
    cwd.mkdir(parents=True)
    names = ["../../escape", "/tmp/kvbench-escape-w", "a\x00b", "y" * 300]
    workloads = {  # each name quoted (JSON's escapes are TOML's): a bare key holds none of these
        json.dumps(n): {"source": "fixed", "prompt_len": 10 + i, "output_len": 10, "num_requests": 5}
        for i, n in enumerate(names)
    }
    suite = cwd / "suite.toml"
    suite.write_text(suite_toml("paths", model={"preset": "tiny"}, memory={"kv_budget": "1MiB"}, workloads=workloads))
    proc = kvbench("run", str(suite), "--quiet", "--no-report", cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    written = _tree(tmp_path) - {"a", "a/b", "a/b/suite.toml"}
    assert written and all(p.startswith("a/b/kvbench-results") for p in written), sorted(written)
    assert len(list((cwd / "kvbench-results" / "paths" / "workloads").iterdir())) == len(names)
    assert not Path("/tmp/kvbench-escape-w").exists()


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


def test_plain_names_pass():
    from kvbench.harness.spec.names import MAX_NAME_BYTES, path_component

    for name in ("example", "paper-block-size", "run_2.1+fp8", "1x", "x" * MAX_NAME_BYTES):
        assert path_component(name, "name") == name


# -- limits ----------------------------------------------------------------------------------------


def test_a_request_count_at_the_limit_is_accepted():
    from kvbench.harness.spec.workload_spec import MAX_REQUESTS, WorkloadSpec

    WorkloadSpec(num_requests=MAX_REQUESTS)
    WorkloadSpec(arrival="poisson", rate=1000.0, duration_s=MAX_REQUESTS / 1000)
    WorkloadSpec(source="trace", path="t.csv", limit=MAX_REQUESTS)


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
    # One workload named without a list is that workload alone, as a list of one is.
    one = parse_suite(text.replace('workload = ["b"]', 'workload = "b"'), "count.toml")
    assert list(one.cells()) == list(suite.cells()) and count_cells(one) == count_cells(suite)


# -- configs, profiles, traces ---------------------------------------------------------------------


def test_a_grid_of_its_own_adds_its_cells_and_leaves_the_others_as_they_were():
    """[grids.NAME]: cells over the suite's tables with its own settings and axes, neither [grid]'s
    axes nor [runners.*] applied; [grid]'s cells (and run ids) are those of the suite without it,
    and a cell both grids hold is run once."""
    from kvbench.app.suite import count_cells, parse_suite

    fixed = {"source": "fixed", "prompt_len": 100, "output_len": 100, "num_requests": 20}
    base = dict(
        model={"preset": "opt-13b"},
        memory={"kv_budget": "12GiB", "max_model_len": 2048},
        workloads={"a": fixed, "b": {**fixed, "prompt_len": 8}},
        grid={"runner": ["sim", "vllm-sched"], "policy": ["contiguous-max", "paged"], "block_size": [16, 32]},
        runners={"vllm-sched": {"policy": "paged", "block_size": [16], "max_num_seqs": 8}},
    )
    hybrid = {"runner": ["sim", "vllm-sched"], "preset": "gpt-oss-20b", "kv_budget": "1GiB", "workload": "a"}
    hybrid |= {"num_requests": 10, "hybrid_kv": [True, False]}
    without = parse_suite(suite_toml("g", **base), "g.toml")  # type: ignore[arg-type]
    suite = parse_suite(suite_toml("g", **base, grids={"hybrid": hybrid}), "g.toml")  # type: ignore[arg-type]
    old, cells = list(without.cells()), list(suite.cells())
    assert cells[: len(old)] == old and suite.runners() == ("sim", "vllm-sched")
    new = [spec for spec, _ in cells[len(old) :]]
    assert {(s.runner, s.policy, s.block_size, s.hybrid_kv) for s in new} == {
        (r, "paged", 16, on) for r in ("sim", "vllm-sched") for on in (True, False)
    }
    assert all(s.model.preset == "gpt-oss-20b" and s.memory.kv_budget_bytes == 2**30 for s in new)
    assert {s.workload.num_requests for s in new} == {10} and {w for _, w in cells[len(old) :]} == {"a"}
    assert {s.scheduler.max_num_seqs for s in new} == {256}  # [runners.vllm-sched] is [grid]'s alone
    assert count_cells(suite) - count_cells(without) == len(new)
    again = parse_suite(
        suite_toml("g", **base, grids={"hybrid": hybrid, "same": {"workload": "a"}}),  # type: ignore[arg-type]
        "g.toml",
    )
    assert list(again.cells()) == cells  # sim paged 16 on workload a: already a cell of [grid]


def test_an_explicit_head_dim_is_honoured(tmp_path):
    # hidden 250 over 4 heads has no integral head size, but a config may say its head_dim (as
    # Gemma's and Qwen3's do, with heads × head_dim ≠ hidden): KV bytes follow head_dim.
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({**LLAMA_CONFIG, "hidden_size": 250, "head_dim": 96}))
    proc = kvbench("calc", "--block-size", "16", "--tokens", "35", "--model", str(cfg), "--budget", "1GiB", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)[0]["kv_bytes_per_token"] == 2 * 2 * 2 * 96 * 2  # K,V × layers × KV heads × 96 × fp16


def test_a_profile_with_some_zero_terms_is_accepted(tmp_path):
    # A fit constrains terms to >= 0 and may well give 0 for some: only the whole step matters.
    doc = json.loads((DATA / "profile-opt-13b-fp16-b16.json").read_text())
    doc["terms"].update({"per_seq_s": 0.0, "per_context_token_s": 0.0, "per_attention_pair_s": 0.0})
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(doc))
    text = EXAMPLE.replace("max_num_batched_tokens = 2048", 'max_num_batched_tokens = 2048\nclock = "profile"')
    proc = kvbench(
        "run",
        suite_file(tmp_path, text),
        "--clock-profile",
        profile,
        "--out",
        tmp_path / "out",
        "--quiet",
        "--no-report",
    )
    assert proc.returncode == 0, proc.stderr


def test_no_profile_is_written_whose_steps_cost_nothing():
    from kvbench.harness.clock.model import ClockTerms
    from kvbench.harness.clock.profile import profile_document
    from kvbench.harness.errors import KvbenchError
    from kvbench.harness.spec.geometry import preset

    with pytest.raises(KvbenchError, match="1e-06 s minimum"):
        profile_document(ClockTerms(0.0, 0.0, 0.0, 0.0, 0.0), preset("opt-13b"), "fp16", 16, {}, {}, {}, {})


def test_trace_prompts_all_longer_than_the_prefix_are_read_as_written(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("prompt_len,output_len\n21,5\n200,5\n")
    text = EXAMPLE.replace(
        'source = "fixed"', f'source = "trace"\npath = "{trace}"\nprefix_groups = 2\nprefix_len = 20'
    )
    for fixed in ("prompt_len = 100\n", "output_len = 100\n", "num_requests = 200\n"):  # the trace gives them
        text = text.replace(fixed, "")
    proc = kvbench("run", suite_file(tmp_path, text), "--out", tmp_path / "out", "--quiet", "--no-report")
    assert proc.returncode == 0, proc.stderr


# -- whatever the locale ---------------------------------------------------------------------------


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
    suite_file(tmp_path, EXAMPLE.replace('name = "example"', 'name = "example"\ndescription = "café, 東京"'))
    proc = c_locale("run", "suite.toml", "--out", "out", "--quiet", "--no-report", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({**LLAMA_CONFIG, "_name_or_path": "modèle"}, ensure_ascii=False), encoding="utf-8")
    proc = c_locale(
        "calc", "--block-size", "16", "--tokens", "3", "--model", str(cfg), "--budget", "1GiB", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
