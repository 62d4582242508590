"""``.ci/nightly``: the nightly job as users run it (here without its install step, on a sim suite).

Night 1 has no baseline and becomes it; night 2 on the same code passes the
gate; a baseline that was better than tonight (its records edited the way a
real regression would show) fails the gate with exit 1, keeps the baseline,
and ``--accept`` moves it. After the gate the job runs the long paper checks (the tests
marked ``nightly``, which the default test command leaves out; here a stand-in folder of
tests): night 1's pass, night 2's fail and fail the night.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

from tests.conftest import ROOT, suite_toml

NIGHTLY = ROOT / ".ci" / "nightly"

SUITE = suite_toml(
    "nightly-test",
    model={"preset": "llama-3-8b"},
    memory={"kv_budget": "1GiB", "max_model_len": 2048},
    workload={"source": "sharegpt", "num_requests": 60, "arrival": "batch"},
    grid={"runner": ["sim"], "policy": ["contiguous-max", "paged"], "block_size": [16]},
)


def nightly(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}", **(env or {}))
    return subprocess.run(
        ["bash", str(NIGHTLY), "--no-install", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=600
    )


def improve_baseline(night: Path) -> None:
    """Make the baseline's paged cell hold twice the requests it did: tonight then reads as a regression."""
    for path in (night / "runs").rglob("*.parquet"):
        table = pq.read_table(path)
        rows = table.to_pylist()
        for row in rows:
            if row["policy"] == "paged":
                row["mean_running"] = row["mean_running"] * 2
        pq.write_table(type(table).from_pylist(rows, schema=table.schema), path)


CHECKS = """
import pytest


@pytest.mark.nightly
def test_a_long_check():
    assert {ok}


def test_a_ci_test_the_night_leaves_out():
    assert False
"""


def test_nightly_gates_on_the_previous_night_then_runs_the_long_checks(tmp_path: Path) -> None:
    suite = tmp_path / "nightly.toml"
    suite.write_text(SUITE)
    results = tmp_path / "nights"
    checks = tmp_path / "checks"  # stands in for the repository's tests marked nightly
    checks.mkdir()
    (checks / "pytest.ini").write_text("[pytest]\nmarkers =\n    nightly: long\n")
    with_checks = {"KVBENCH_NIGHTLY_TESTS": str(checks)}

    (checks / "test_long.py").write_text(CHECKS.format(ok=True))
    first = nightly(str(suite), "--results", str(results), cwd=tmp_path, env=with_checks)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "first night" in first.stdout and "the long checks passed" in first.stdout
    assert "no regression across the nights" in first.stdout  # the history of one night: its page
    assert (results / "history" / "index.html").is_file()
    baseline = (results / "latest").resolve()
    assert (baseline / "runs").is_dir()
    assert "1 passed, 1 deselected" in (baseline / "checks.log").read_text()  # only the nightly-marked test

    (checks / "test_long.py").write_text(CHECKS.format(ok=False))
    second = nightly(str(suite), "--results", str(results), cwd=tmp_path, env=with_checks)
    # The gate passes (the same code) and tonight becomes the baseline; the failed check fails the night.
    assert second.returncode == 1, second.stdout + second.stderr
    assert "gate passed" in second.stdout and "THE LONG CHECKS FAILED" in second.stdout
    tonight = (results / "latest").resolve()
    assert tonight != baseline and (tonight / "compare.md").is_file()
    assert "no regression across the nights" in second.stdout and (tonight / "changes.json").is_file()
    assert "1 failed, 1 deselected" in (tonight / "checks.log").read_text()

    improve_baseline(tonight)
    improve_baseline(baseline)  # the first night, the history's reference while none is accepted
    third = nightly(str(suite), "--results", str(results), "--no-checks", cwd=tmp_path)
    assert third.returncode == 1, third.stdout + third.stderr
    assert "REGRESSION against" in third.stdout and "mean_running" in third.stdout
    assert "REGRESSION across the nights" in third.stdout and "regressed against" in third.stderr
    assert "long checks" not in third.stdout  # --no-checks
    assert (results / "latest").resolve() == tonight  # a failing night does not become the baseline

    accepted = nightly(str(suite), "--results", str(results), "--accept", "--no-checks", cwd=tmp_path)
    assert accepted.returncode == 1
    assert (results / "latest").resolve() != tonight
    # Accepted: the history's gate now judges against tonight.
    assert (results / "accepted").read_text().split() == [(results / "latest").resolve().name]
    assert "no regression across the nights" in accepted.stdout


def test_long_checks_that_cannot_run_are_one_line_and_none_found_is_said(tmp_path: Path) -> None:
    suite = tmp_path / "nightly.toml"
    suite.write_text(SUITE)
    results = str(tmp_path / "nights")
    missing = nightly(str(suite), "--results", results, cwd=tmp_path, env={"KVBENCH_NIGHTLY_TESTS": "/no/such/tests"})
    assert missing.returncode == 2, missing.stdout + missing.stderr
    lines = [line for line in missing.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0] == "nightly: the long checks: /no/such/tests: no such test file or folder", (
        missing.stderr
    )
    assert not (tmp_path / "nights").exists()  # refused before anything ran
    empty = tmp_path / "no-checks"
    empty.mkdir()
    (empty / "pytest.ini").write_text("[pytest]\nmarkers =\n    nightly: long\n")
    none = nightly(str(suite), "--results", results, cwd=tmp_path, env={"KVBENCH_NIGHTLY_TESTS": str(empty)})
    assert none.returncode == 0 and "no test marked nightly" in none.stdout, none.stdout + none.stderr


def test_nightly_bad_usage_is_one_line_and_exit_2(tmp_path: Path) -> None:
    for args in (["missing.toml"], ["--extra"], ["--bogus"], ["a.toml", "b.toml"]):
        if args == ["a.toml", "b.toml"]:
            (tmp_path / "a.toml").write_text(SUITE)
        proc = nightly(*args, cwd=tmp_path)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("nightly: "), (args, proc.stderr)


def test_the_default_test_command_leaves_the_long_checks_to_the_night() -> None:
    def collected(*args: str) -> set[str]:
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", "-n0", "-p", "no:cacheprovider", *args],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=300,
        )
        return {line for line in proc.stdout.splitlines() if "::" in line}

    capacity = "tests/reports/test_capacity.py"
    figure_12 = f"{capacity}::test_the_figure_12_suite_reproduces_the_papers_capacity_ranges"
    assert figure_12 in collected("-m", "nightly", capacity)
    default = collected(capacity)
    assert figure_12 not in default and default
