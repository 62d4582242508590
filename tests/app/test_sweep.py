"""Sweeps: resumable grids, kill-and-resume with real signals, the Ray executor, failure isolation."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest
from kvbench.app.suite import parse_suite
from kvbench.app.sweep import build_cells, run_cells
from kvbench.harness.records import store

from tests.conftest import kvbench, suite_toml


def grid_suite(rates: tuple[float, ...] = (2.0, 4.0, 8.0), **sections: object) -> str:
    """Three policies and paged at two block sizes, over a rate axis: the sweep the tests run."""
    grid = {
        "policy": ["contiguous-max", "contiguous-pow2", "contiguous-oracle", "paged"],
        "block_size": [16, 32],
        "rate": list(rates),
    }
    return suite_toml(
        "grid",
        model={"preset": "llama-3-8b"},
        memory={"kv_budget": "1GiB", "max_model_len": 4096},
        workload={"source": "sharegpt", "num_requests": 150, "arrival": "poisson", "rate": 4.0},
        scheduler={"clock": "roofline"},
        grid={**grid, **sections.pop("grid", {})},  # type: ignore[dict-item]
        **sections,  # type: ignore[arg-type]
    )


GRID = grid_suite()
CELLS = 3 * (3 + 2)


def _complete_runs(out) -> set[str]:
    """Run ids whose three partitions all read back (a run exists only when whole)."""
    ids = store.existing_run_ids(out)
    for rid in ids:
        for table in ("steps", "requests", "runs"):
            assert (store.partition_dir(out, table, rid) / store.PART).is_file(), (rid, table)
        store.read_table(out, "steps", {rid})
    return ids


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sigkill_mid_sweep_then_resume_gives_every_cell_exactly_once(tmp_path, seed):
    suite = tmp_path / "grid.toml"
    suite.write_text(GRID)
    out = tmp_path / "out"
    env = dict(os.environ)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvbench.app.cli",
            "run",
            str(suite),
            "--out",
            str(out),
            "--jobs",
            "2",
            "--quiet",
            "--no-report",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    target = random.Random(seed).randint(1, CELLS - 3)
    deadline = time.monotonic() + 120
    while len(store.existing_run_ids(out)) < target and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = _complete_runs(out)
    assert 0 < len(before) < CELLS
    done = kvbench("run", str(suite), "--out", str(out), "--quiet", "--no-report")
    assert done.returncode == 0, done.stderr
    after = _complete_runs(out)
    assert before < after and len(after) == CELLS
    runs = store.read_table(out, "runs")
    assert len(runs) == CELLS and runs.run_id.is_unique
    assert not list(out.glob("*/.tmp-*"))
    again = kvbench("run", str(suite), "--out", str(out), "--no-report")
    assert f"{CELLS} of {CELLS} cells already in" in again.stderr


def test_ray_executor_writes_the_same_records_as_local(tmp_path):
    pytest.importorskip("ray")
    suite = parse_suite(grid_suite(rates=(4.0,)), "grid.toml")
    local, remote = tmp_path / "local", tmp_path / "ray"
    run_cells(build_cells(suite, local, lambda m: None), quiet=True)
    run_cells(build_cells(suite, remote, lambda m: None), quiet=True, executor="ray")
    assert store.existing_run_ids(local) == store.existing_run_ids(remote)
    cols = ["run_id", "step", "allocated_blocks", "allocated_positions", "used_positions", "running", "waiting"]
    a = store.read_table(local, "steps")[cols].sort_values(["run_id", "step"]).reset_index(drop=True)
    b = store.read_table(remote, "steps")[cols].sort_values(["run_id", "step"]).reset_index(drop=True)
    assert a.equals(b)


def test_a_failing_cell_is_a_row_and_the_sweep_goes_on(tmp_path):
    suite = tmp_path / "s.toml"
    # vllm hosts no virtual-contiguous: its cells fail wherever they run (no vLLM, its CPU build, a GPU).
    grid = grid_suite(
        rates=(4.0,), grid={"runner": ["sim", "vllm"]}, runners={"vllm": {"policy": ["virtual-contiguous"]}}
    )
    suite.write_text(grid)
    proc = kvbench("run", str(suite), "--out", str(tmp_path / "o"), "--no-report", "--quiet")
    assert proc.returncode == 1
    runs = store.read_table(tmp_path / "o", "runs")
    assert set(runs[runs.runner == "sim"].status) == {"ok"}
    failed = runs[runs.runner == "vllm"]
    assert len(failed) >= 1 and set(failed.status) == {"failed"} and failed.error.str.len().min() > 0
    assert "failed" in proc.stderr.splitlines()[-1]
