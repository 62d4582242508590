"""Budgets bounded by what a runner can hold, in blocks (``capabilities.BlockBound``).

A runner that makes something for every block of the budget (vLLM's block pool on vllm-sched,
the simulator's prefix cache) refuses a budget of more blocks than its bound, in one line and
before anything is written; a budget of exactly the bound is accepted. A runner or policy that
only counts blocks runs any budget. The refusals happen while the suite is read, before any
runner is loaded, so the vllm-sched cases need no vLLM and run everywhere.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kvbench.app.cell import run_cell
from kvbench.app.suite import parse_suite
from kvbench.app.sweep import build_cells
from kvbench.harness.errors import KvbenchError
from kvbench.harness.spec.capabilities import RUNNER_FACTS, SIM_MAX_BLOCKS, VLLM_SCHED_MAX_BLOCKS, block_bound
from kvbench.harness.spec.specs import MemorySpec, ModelSpec, RunSpec, SchedulerSpec
from kvbench.harness.spec.workload_spec import WorkloadSpec
from kvbench.runners.sim import SimRunner

from tests.conftest import assert_one_line_error, kvbench, suite_toml, tree

PIB = 2**50  # the largest kv_budget a suite may state
REFUSED = 2
WORKLOAD = {
    "source": "fixed",
    "prompt_len": 100,
    "output_len": 20,
    "num_requests": 4,
    "prefix_groups": 2,
    "prefix_len": 64,
    "arrival": "batch",
    "seed": 0,
}


def suite_text(runner: str, policy: str, preset: str, budget: str = "1PiB") -> str:
    return suite_toml(
        "bounds",
        model={"preset": preset},
        memory={"kv_budget": budget, "max_model_len": 2048},
        workload=WORKLOAD,
        grid={"runner": [runner], "policy": [policy], "block_size": [16]},
    )


def spec(runner: str, policy: str, preset: str, budget: int) -> RunSpec:
    return RunSpec(runner, policy, 16, ModelSpec(preset), MemorySpec(budget), WorkloadSpec(), SchedulerSpec())


def block_bytes(runner: str, policy: str, preset: str) -> int:
    """One block's bytes of the budget, as ``RunSpec.pool_blocks`` counts blocks."""
    s = spec(runner, policy, preset, 2**30)
    return 16 * s.kv_bytes_per_token if s.geometry.is_uniform_full else s.layout.bytes_per_block


# runner, policy, model, the runner's bound, the blocks 1 PiB holds there, what the line names
REFUSALS = [
    ("vllm-sched", "paged", "opt-13b", VLLM_SCHED_MAX_BLOCKS, 85_899_345, "more than vllm-sched can hold"),
    ("vllm-sched", "paged", "llama-3-8b", VLLM_SCHED_MAX_BLOCKS, 536_870_912, "more than vllm-sched can hold"),
    ("vllm-sched", "paged", "gpt-oss-20b", VLLM_SCHED_MAX_BLOCKS, 2_863_311_530, "more than vllm-sched can hold"),
    ("sim", "paged-prefix", "gpt-oss-20b", SIM_MAX_BLOCKS, 2_863_311_530, "more than sim's paged-prefix can hold"),
    ("sim", "paged-prefix", "opt-13b", SIM_MAX_BLOCKS, 85_899_345, "more than sim's paged-prefix can hold"),
]
IDS = [f"{r}-{p}-{m}" for r, p, m, *_ in REFUSALS]


@pytest.mark.parametrize("runner, policy, preset, bound, blocks, who", REFUSALS, ids=IDS)
def test_a_budget_past_the_bound_is_refused_in_one_line_with_nothing_written(
    tmp_path: Path, runner: str, policy: str, preset: str, bound: int, blocks: int, who: str
) -> None:
    (tmp_path / "suite.toml").write_text(suite_text(runner, policy, preset), encoding="utf-8")
    before = tree(tmp_path)
    proc = kvbench("run", "suite.toml", "--out", "results", "--quiet", cwd=tmp_path, timeout=60)
    assert proc.returncode == REFUSED, proc.stderr
    assert_one_line_error(proc, "suite.toml: kv_budget", f"holds {blocks:,} blocks of 16 tokens", who)
    assert f"at most {bound:,} blocks" in proc.stderr
    assert not (tmp_path / "results").exists()
    assert tree(tmp_path) == before


@pytest.mark.parametrize("runner, policy, preset, bound, blocks, who", REFUSALS, ids=IDS)
def test_a_budget_of_the_bound_is_accepted_and_one_block_more_refused(
    runner: str, policy: str, preset: str, bound: int, blocks: int, who: str
) -> None:
    per_block = block_bytes(runner, policy, preset)
    at = spec(runner, policy, preset, bound * per_block)
    assert at.pool_blocks[0] == bound
    with pytest.raises(KvbenchError, match=f"holds {bound + 1:,} blocks"):
        spec(runner, policy, preset, (bound + 1) * per_block)


def test_every_bound_is_declared_once_beside_the_runner() -> None:
    assert RUNNER_FACTS["vllm-sched"].block_bound is not None
    assert set(RUNNER_FACTS["vllm-sched"].block_bound.policies) == set(RUNNER_FACTS["vllm-sched"].policies)
    for policy in ("paged", "contiguous-max", "contiguous-oracle", "virtual-contiguous"):
        assert block_bound("sim", policy) is None, policy  # counts, not a slot per block
    for runner in ("torch", "vllm", "serve"):  # a block there is real KV memory: the device bounds it
        assert RUNNER_FACTS[runner].block_bound is None, runner
    assert VLLM_SCHED_MAX_BLOCKS <= SIM_MAX_BLOCKS  # what vllm-sched runs, sim runs beside it


@pytest.mark.parametrize("preset", ["opt-13b", "gpt-oss-20b"])
@pytest.mark.parametrize("policy", ["paged", "contiguous-max"])
def test_sim_policies_that_count_run_a_petabyte(tmp_path: Path, preset: str, policy: str) -> None:
    suite = parse_suite(suite_text("sim", policy, preset), str(tmp_path / "suite.toml"))
    (cell,) = build_cells(suite, tmp_path / "results", lambda msg: None)
    row = run_cell(cell)
    assert row["status"] == "ok", row.get("error")
    assert row["budget_positions"] == PIB // cell.spec.kv_bytes_per_token


def test_a_real_memory_error_is_still_an_oom_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    suite = parse_suite(suite_text("sim", "paged", "opt-13b", budget="1GiB"), str(tmp_path / "suite.toml"))
    (cell,) = build_cells(suite, tmp_path / "results", lambda msg: None)

    def out_of_memory(self: SimRunner, cell: object) -> None:
        raise MemoryError

    monkeypatch.setattr(SimRunner, "run", out_of_memory)
    row = run_cell(cell)
    assert row["status"] == "oom" and row["error"] == "out of host memory"
