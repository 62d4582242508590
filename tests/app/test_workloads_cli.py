"""``kvbench workload make|show`` end to end, as a user runs them."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import kvbench, suite_toml

ROOT = Path(__file__).parents[2]
AZURE_SLICE = Path(__file__).parents[1] / "data" / "azure-conv-slice.csv"


def fields(stdout: str) -> dict[str, str]:
    return dict(line.split(None, 1) for line in stdout.splitlines() if line.strip())


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
        suite_toml(
            None,
            model={"preset": "opt-13b"},
            memory={"kv_budget": "12GiB", "max_model_len": 512},
            workload={"source": "trace", "path": str(AZURE_SLICE), "limit": 100, "arrival": "trace"},
            grid={"policy": ["paged"]},
        )
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
