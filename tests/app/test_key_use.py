"""Every key of a suite is used or refused (``app.key_use``), table by table.

- Each workload source, arrival and length family: every key its build reads changes the
  workload it builds (the records' workload id), and every other workload key, written in its
  table, is refused in one line that names the key, the table and whose key it is.
- Each runner table: a key the runner's cells do not read is refused; one they read is in
  their specs.
- The cases seen through the CLI: one line, exit 2, nothing written. Cells that collapse to
  one run are planned once, and the summary counts runs as recorded.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd
import pytest
from kvbench.app.key_use import unread
from kvbench.app.suite import parse_suite
from kvbench.app.sweep import prepare_cells
from kvbench.harness.errors import KvbenchError
from kvbench.harness.spec.capabilities import RUNNER_NAMES
from kvbench.harness.spec.workload_spec import FIELD_KINDS, WorkloadSpec
from kvbench.workloads.reads import build_noting_reads, kind_settings, reads_by_kind

from tests.conftest import assert_one_line_error, kvbench, suite_file, suite_toml

KINDS = sorted(reads_by_kind())
# What says which fields are read, and what names the file: not settings a value of changes.
DISCRIMINATORS = ("source", "arrival", "lengths", "path")


def _trace_files(folder: Path) -> dict[str, str]:
    """Files of 12 requests of varied lengths, in each file source's form."""
    rows = [
        {
            "timestamp": 100 * i,
            "input_length": 512 * i + 40 + 37 * i,
            "output_length": 5 + 3 * i,
            "hash_ids": list(range(i + 1)),
        }
        for i in range(12)
    ]
    trace = folder / "t.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    chats = [
        {
            "id": str(i),
            "conversations": [
                {"from": "human", "value": "w " * (20 + 5 * i)},
                {"from": "gpt", "value": "a " * (2 + i)},
            ],
        }
        for i in range(12)
    ]
    sharegpt = folder / "s.json"
    sharegpt.write_text(json.dumps(chats))
    return {"trace": str(trace), "sharegpt-json": str(sharegpt)}


def _base(kind: tuple[str, str, str], files: dict[str, str]) -> dict[str, object]:
    """A small workload of ``kind`` with only the keys its build reads (and its source and arrival)."""
    read = reads_by_kind()[kind]
    return {k: v for k, v in kind_settings(kind, files, 12).items() if k in read or k in ("source", "arrival")}


def _other_value(key: str, spec: WorkloadSpec) -> list[object]:
    """Values of ``key`` other than ``spec``'s, each valid beside the rest of it."""
    kind, _ = FIELD_KINDS[key]
    value = getattr(spec, key)
    if key in ("prefix_groups", "prefix_len"):
        return [2]
    if key in ("limit", "max_prompt_len", "max_output_len"):
        return [6, 30]
    if kind == "int":
        return [(value or 0) + 3, 2]
    return [(value or 1.0) * 1.7, 0.5]


def _workload_id(settings: dict[str, object]) -> str:
    workload, _ = build_noting_reads(WorkloadSpec(**settings))
    return workload.workload_id


def _draws_nothing(kind: tuple[str, str, str]) -> bool:
    """Whether a workload of ``kind`` draws nothing at random, so its seed (read to seed the
    streams) changes nothing: fixed lengths or a file's, sent at once or at the file's times."""
    source, arrival, lengths = kind
    fixed = source in ("fixed", "trace", "sharegpt-json") or (source == "sessions" and lengths == "fixed")
    return fixed and arrival in ("batch", "trace")


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: "-".join(k))
def test_every_key_a_workload_reads_changes_what_it_builds(kind, tmp_path):
    files = _trace_files(tmp_path)
    base = _base(kind, files)
    before = _workload_id(base)
    for key in sorted(reads_by_kind()[kind]):
        if key in DISCRIMINATORS or key == "duration_s":  # duration_s: a rate arrival's, checked below
            continue
        if key == "seed" and _draws_nothing(kind):
            continue
        if key == "hash_block_size":  # the tokens a hash id stands for: the runner's token content reads it
            continue
        if kind[0] == "trace" and key in ("prefix_groups", "prefix_len"):
            continue  # a hash-id trace says which prompts share tokens: other prefixes are refused there
        changed = []
        for value in _other_value(key, WorkloadSpec(**base)):
            extra: dict[str, object] = {key: value}
            if key == "prefix_len":
                extra["prefix_groups"] = 2
            if key == "prefix_groups":
                extra["prefix_len"] = 2
            try:
                changed.append(_workload_id({**base, **extra}) != before)
            except KvbenchError:
                continue
        assert any(changed), f"{kind}: {key} is read but no value of it changes the workload"


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: "-".join(k))
def test_every_workload_key_a_kind_does_not_read_is_refused(kind, tmp_path):
    """Each workload key the kind's build does not read, written in its [workload] table, is
    refused in one line naming the table and the key (derived from the build, not a list)."""
    files = _trace_files(tmp_path)
    base = _base(kind, files)
    foreign = [k for k in FIELD_KINDS if k not in reads_by_kind()[kind] and k not in ("source", "arrival")]
    assert foreign or kind[0] == "sessions"
    for key in foreign:
        value = {"path": files["trace"], "lengths": "uniform"}.get(key)
        if value is None:
            value = _other_value(key, WorkloadSpec())[0]
        workload = {**base, key: value}
        text = suite_toml(
            model={"preset": "opt-13b"},
            memory={"kv_budget": "2GiB"},
            workload=workload,
            grid={"runner": ["sim"], "policy": ["paged"]},
        )
        with pytest.raises(KvbenchError) as info:
            prepare_cells(parse_suite(text, str(tmp_path / "s.toml")), tmp_path / "out", lambda m: None)
        message = str(info.value)
        assert "\n" not in message
        assert key in message, message
        if "not read by any cell" in message:  # else the spec refused the combination itself
            assert f"[workload] {key} is not read" in message, message


def test_a_key_read_by_some_cells_of_a_swept_source_is_used(tmp_path):
    """One [workload] table over [grid] source = [fixed, uniform]: prompt_len is fixed's and
    prompt_min uniform's; each is read by the cells of its source, so both are used."""
    text = suite_toml(
        model={"preset": "opt-13b"},
        memory={"kv_budget": "2GiB"},
        workload={"num_requests": 10, "prompt_len": 50, "prompt_min": 10, "prompt_max": 90},
        grid={"runner": ["sim"], "policy": ["paged"], "source": ["fixed", "uniform"]},
    )
    prepared = prepare_cells(parse_suite(text, str(tmp_path / "s.toml")), tmp_path / "out", lambda m: None)
    assert {c.spec.workload.source for c in prepared.cells} == {"fixed", "uniform"}


# -- runner tables ----------------------------------------------------------------------------------

RUNNER_KEYS = {"device": "cpu", "page_bytes": 4096, "arena": "buddy", "hybrid_kv": False, "gpu": "H100"}


@pytest.mark.parametrize("runner", [r for r in RUNNER_NAMES if r != "serve"])
@pytest.mark.parametrize("key", sorted(RUNNER_KEYS))
def test_a_runner_table_key_is_refused_where_its_cells_do_not_read_it(runner, key, tmp_path):
    text = suite_toml(
        model={"preset": "opt-13b"},
        memory={"kv_budget": "2GiB"},
        workload={"source": "fixed", "num_requests": 4, "prompt_len": 20, "output_len": 4},
        grid={"runner": [runner], "policy": ["paged"]},
        runners={runner: {key: RUNNER_KEYS[key]}},
    )
    suite = parse_suite(text, str(tmp_path / "s.toml"))
    spec = next(iter(suite.cells()))[0]
    if key in unread(spec):
        with pytest.raises(KvbenchError, match=rf"\[runners\.{runner}\] {key} is not read by any cell: "):
            prepare_cells(suite, tmp_path / "out", lambda m: None)
    else:
        (cell,) = prepare_cells(suite, tmp_path / "out", lambda m: None).cells
        stated = {**dataclasses.asdict(cell.spec), **dataclasses.asdict(cell.spec.scheduler)}
        assert stated[key] == RUNNER_KEYS[key]


def test_which_runners_read_a_device_is_what_the_records_say(tmp_path):
    """A device is read by the runners that place tensors (torch) and not by sim: the first runs
    with its device in its run row, the second is refused."""
    base = dict(
        model={"preset": "tiny"},
        memory={"kv_budget": "1MiB"},
        workload={"source": "fixed", "num_requests": 2, "prompt_len": 8, "output_len": 2},
    )
    ok = suite_file(tmp_path, suite_toml(**base, grid={"runner": ["torch"], "policy": ["paged"], "device": "cpu"}))
    proc = kvbench("run", ok, "--out", tmp_path / "ok", "--quiet", "--no-report")
    assert proc.returncode == 0, proc.stderr
    runs = pd.read_parquet(tmp_path / "ok" / "runs")
    assert json.loads(runs["spec_json"].iloc[0])["device"] == "cpu"
    bad = suite_file(
        tmp_path, suite_toml(**base, grid={"runner": ["sim"], "policy": ["paged"], "device": "cpu"}), "b.toml"
    )
    proc = kvbench("run", bad, "--out", tmp_path / "bad", "--quiet")
    assert_one_line_error(proc, "[grid] device is not read by any cell", "runner sim does not choose a device")
    assert not (tmp_path / "bad").exists()


# -- through the CLI: one line, exit 2, nothing written ----------------------------------------------

CLI_CASES = {
    "uniform-with-fixed-lengths": (
        {"source": "uniform", "num_requests": 10, "prompt_len": [16, 400]},
        ("[workload] prompt_len is not read", 'source "uniform" does not read it', "prompt_min and prompt_max"),
    ),
    "sessions-with-a-path": ({"source": "sessions", "path": "x.jsonl"}, ("[workload] path is not read", "trace")),
    "fixed-with-uniform-bounds": (
        {"source": "fixed", "prompt_min": 4},
        ("[workload] prompt_min is not read", 'source "fixed"', "prompt_len instead"),
    ),
    "batch-with-a-rate": ({"source": "fixed", "rate": 2.0}, ('arrival "batch" does not read it', "poisson")),
    "file-source-with-a-request-count": (
        {"source": "trace", "path": "{trace}", "num_requests": 5},
        ("[workload] num_requests is not read", 'source "trace"'),
    ),
    "sessions-of-uniform-lengths-with-a-fixed-message": (
        {"source": "sessions", "lengths": "uniform", "message_len": 30},
        ('lengths "uniform" does not read it', "length families that do: fixed", "message_min and message_max"),
    ),
    "non-sessions-with-a-turn-count": ({"source": "uniform", "turns": 3}, ("[workload] turns is not read", "sessions")),
}


@pytest.mark.parametrize("case", sorted(CLI_CASES))
def test_a_key_no_cell_reads_is_refused_through_the_cli(case, tmp_path):
    workload, needles = CLI_CASES[case]
    files = _trace_files(tmp_path)
    workload = {k: v.format(trace=files["trace"]) if isinstance(v, str) else v for k, v in workload.items()}
    text = suite_toml(
        model={"preset": "opt-13b"}, memory={"kv_budget": "2GiB"}, workload=workload, grid={"runner": ["sim"]}
    )
    proc = kvbench("run", suite_file(tmp_path, text), "--out", tmp_path / "out", "--quiet")
    assert_one_line_error(proc, *needles)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("table", ["model", "memory", "scheduler", "parallel", "run"])
def test_a_list_where_one_value_belongs_is_refused_not_swept(table, tmp_path):
    key, values = {
        "model": ("kv_dtype", ["fp16", "fp8"]),
        "memory": ("kv_budget", ["1GiB", "2GiB"]),
        "scheduler": ("max_num_seqs", [8, 16]),
        "parallel": ("tensor_parallel_size", [1, 2]),
        "run": ("block_size", [16, 32]),
    }[table]
    sections: dict[str, object] = {
        "model": {"preset": "opt-13b"},
        "memory": {"kv_budget": "2GiB"},
        "workload": {"source": "fixed", "num_requests": 4},
    }
    sections[table] = {**dict(sections.get(table, {})), key: values}  # type: ignore[arg-type]
    text = suite_toml(**sections, grid={"runner": ["sim"]})  # type: ignore[arg-type]
    proc = kvbench("run", suite_file(tmp_path, text), "--out", tmp_path / "out", "--quiet")
    assert_one_line_error(proc, f"[{table}] {key} must be one value, not a list", f"{key} = [...] in [grid]")
    assert not (tmp_path / "out").exists()


def test_cells_that_are_one_run_are_planned_and_counted_once(tmp_path):
    """hybrid_kv over two models, one of them all full attention: its two cells are one run
    (the manager changes nothing there), so 3 runs are planned, run, counted and recorded."""
    text = suite_toml(
        memory={"kv_budget": "1GiB", "max_model_len": 1024},
        workload={"source": "fixed", "num_requests": 6, "prompt_len": 40, "output_len": 4},
        grid='runner = ["sim"]\npolicy = ["paged"]\nhybrid_kv = [true, false]\n'
        'together = [{ preset = "gpt-oss-20b", kv_dtype = "bf16" }, { preset = "opt-13b" }]',
    )
    path = suite_file(tmp_path, text)
    assert len(list(parse_suite(text, str(path)).planned())) == 4
    proc = kvbench("run", path, "--out", tmp_path / "out", "--no-report")
    assert proc.returncode == 0, proc.stderr
    assert "3 cell(s) run, 0 skipped" in proc.stderr
    assert proc.stderr.count("ok in") == 3, proc.stderr
    assert len(pd.read_parquet(tmp_path / "out" / "runs")) == 3


def test_workload_make_refuses_a_flag_its_source_does_not_read(tmp_path):
    """``kvbench workload make`` holds its flags to the same rule: read by the build, or refused."""
    out = tmp_path / "w.parquet"
    proc = kvbench("workload", "make", "--out", out, "--source", "uniform", "--prompt-len", "400", timeout=60)
    assert_one_line_error(proc, "--prompt-len is not read", 'source "uniform"', "prompt_min and prompt_max")
    assert not out.exists()
    proc = kvbench("workload", "make", "--out", out, "--source", "uniform", "--prompt-max", "40", timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert pd.read_parquet(out)["prompt_len"].max() <= 40  # the flag read is the flag used
