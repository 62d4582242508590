"""``kvbench workload make|show`` end to end, as a user runs them."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import kvbench

ROOT = Path(__file__).parents[2]
AZURE_SLICE = Path(__file__).parents[1] / "data" / "azure-conv-slice.csv"


def fields(stdout: str) -> dict[str, str]:
    return dict(line.split(None, 1) for line in stdout.splitlines() if line.strip())


def assert_one_line_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_make_then_show(tmp_path: Path) -> None:
    out = tmp_path / "w.parquet"
    made = kvbench(
        "workload",
        "make",
        "--out",
        out,
        "--source",
        "uniform",
        "--num-requests",
        "20",
        "--prompt-max",
        "64",
        "--arrival",
        "poisson",
        "--rate",
        "4",
        "--seed",
        "3",
    )
    assert made.returncode == 0, made.stderr
    info = fields(made.stdout)
    assert info["requests"] == "20" and info["dropped"] == "0" and len(info["workload_id"]) == 16
    assert made.stderr == ""

    shown = kvbench("workload", "show", out, "--json", "--model", "tiny")
    assert shown.returncode == 0, shown.stderr
    summary = json.loads(shown.stdout)
    assert summary["workload_id"] == info["workload_id"]
    assert summary["num_requests"] == 20 and summary["prompt_len"]["max"] <= 64
    assert summary["kv_bytes_per_token"] == 256

    text = kvbench("workload", "show", out)
    assert text.returncode == 0, text.stderr
    assert info["workload_id"] in text.stdout and "p99" in text.stdout and "burstiness" in text.stdout


def test_make_from_suite_drops_and_flags_override(tmp_path: Path) -> None:
    suite = tmp_path / "suite.toml"
    suite.write_text(
        '[model]\npreset = "opt-13b"\n\n[memory]\nkv_budget = "12GiB"\nmax_model_len = 512\n\n'
        f'[workload]\nsource = "trace"\npath = "{AZURE_SLICE}"\nlimit = 100\narrival = "trace"\n\n'
        '[grid]\npolicy = ["paged"]\n'
    )
    result = kvbench("workload", "make", "--suite", suite, "--out", tmp_path / "w.parquet")
    assert result.returncode == 0, result.stderr
    info = fields(result.stdout)
    dropped = int(info["dropped"])
    assert 0 < dropped < 100 and int(info["requests"]) == 100 - dropped
    note = result.stderr.splitlines()
    assert len(note) == 1 and f"dropped {dropped} of 100" in note[0] and "max_model_len 512" in note[0]

    wider = kvbench(
        "workload",
        "make",
        "--suite",
        suite,
        "--out",
        tmp_path / "w2.parquet",
        "--max-model-len",
        "100000",
        "--limit",
        "10",
    )
    assert wider.returncode == 0, wider.stderr
    assert fields(wider.stdout)["requests"] == "10" and wider.stderr == ""


@pytest.mark.parametrize(
    ("suite_text", "needles"),
    [
        ('[workload]\nsource = "fixed"\nnum_requests = \n', ("suite.toml: malformed TOML", "line 3")),
        ("[workload]\nprompt_lenn = 3\n", ("suite.toml: unknown key 'prompt_lenn' in [workload]",)),
        ('[workload]\nnum_requests = "ten"\n', ("suite.toml: [workload] num_requests must be an integer, got 'ten'",)),
        ('[workload]\nsource = "trace"\npath = "no/such.csv"\n', ("trace no/such.csv: no such file",)),
        (
            "[workload]\nprompt_len = 4000\n[memory]\nmax_model_len = 2048\n",
            ("all 100 requests exceed max_model_len 2048",),
        ),
    ],
)
def test_make_bad_suites(tmp_path: Path, suite_text: str, needles: tuple[str, ...]) -> None:
    suite = tmp_path / "suite.toml"
    suite.write_text(suite_text)
    result = kvbench("workload", "make", "--suite", suite, "--out", tmp_path / "w.parquet", cwd=tmp_path)
    assert_one_line_error(result, *needles)
    assert not (tmp_path / "w.parquet").exists()


def test_bad_flags_and_files(tmp_path: Path) -> None:
    assert_one_line_error(
        kvbench("workload", "make", "--out", tmp_path / "w.parquet", "--num-requests", "ten"), "--num-requests", "'ten'"
    )
    assert_one_line_error(
        kvbench("workload", "make", "--out", tmp_path / "w.parquet", "--arrival", "poisson"),
        "arrival 'poisson' needs rate > 0",
    )
    assert_one_line_error(kvbench("workload", "show", tmp_path / "missing.parquet"), "missing.parquet: no such file")
    junk = tmp_path / "junk.parquet"
    junk.write_text("not parquet")
    assert_one_line_error(kvbench("workload", "show", junk), "junk.parquet: not a readable Parquet file")
