"""The full vLLM engine on a model of KV cache groups, against sim.

A Gemma-3-style model (five sliding-window layers of window 64 to one full-attention layer,
``tests/data/models/tiny-gemma3``) loads from its own config.json with dummy weights and
generates; what its scheduler decides agrees with ``sim`` on every step column, the whole
requests table and every KV cache group row, under a budget that preempts. Layer kinds the CPU
build does not run for kvbench are a one-line refusal naming vLLM's reason, before any engine
starts (``docs/runners.md``).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from kvbench.app.suite import parse_suite
from kvbench.app.sweep import build_cells, run_cell
from kvbench.harness.records import store

from tests.conftest import DATA, one_workload_suite
from tests.enginekit import BUILD, needs_engine

pytestmark = needs_engine

WORKLOAD = (
    'source = "uniform"\nprompt_min = 60\nprompt_max = 200\noutput_min = 60\noutput_max = 200\n'
    'num_requests = 12\narrival = "batch"\nseed = 3'
)


def suite(
    tmp_path: Path, model: str, runners: str, budget: str, block_size: int = 32, policy: str = "paged"
) -> list[dict]:
    text = one_workload_suite(
        policy=policy,
        name="engine-hybrid",
        preset="tiny",  # the config below takes its place
        model_extra=f'config = "{DATA / "models" / model / "config.json"}"\n',
        kv_dtype="bf16",
        workload=WORKLOAD,
        budget=budget,
        max_model_len=512,
        max_num_seqs=16,
        max_num_batched_tokens=128,
        runners=runners,
        block_size=block_size,
    )
    cells = build_cells(parse_suite(text, str(tmp_path / "engine-hybrid.toml")), tmp_path, lambda m: None)
    return [run_cell(c) for c in cells]


@pytest.mark.skipif(BUILD is None or BUILD.device != "cpu", reason="checks the CPU build's engine")
def test_the_engine_on_a_gemma3_like_hybrid_agrees_with_sim(tmp_path: Path) -> None:
    from tests.agreekit import assert_agree

    rows = {r["runner"]: r for r in suite(tmp_path, "tiny-gemma3", '["sim", "vllm"]', "480KiB")}
    sim, vllm = rows["sim"], rows["vllm"]
    assert vllm["status"] == "ok", vllm["error"]
    steps, _ = assert_agree(tmp_path, sim, vllm)
    assert sim["preemptions"] > 0 and len(steps) > 100
    groups = store.read_table(tmp_path, "kv_groups", {sim["run_id"], vllm["run_id"]})

    def table(run_id: str) -> pd.DataFrame:
        return groups[groups["run_id"] == run_id].drop(columns=["run_id"]).sort_values(["step", "group"])

    pd.testing.assert_frame_equal(
        table(sim["run_id"]).reset_index(drop=True), table(vllm["run_id"]).reset_index(drop=True)
    )
    assert vllm["kv_groups"] == "sliding×1 w64 b32 | " * 5 + "full×1 b32"
    assert steps["kv_bytes_allocated"].isna().all()  # sim's; the engine's are its blocks' bytes
    engine_steps = store.read_table(tmp_path, "steps", {vllm["run_id"]})
    per_block = vllm["kv_bytes_per_block"]
    assert (engine_steps["kv_bytes_allocated"] == engine_steps["allocated_blocks"] * per_block).all()


@pytest.mark.skipif(BUILD is None or BUILD.device != "cpu", reason="checks the CPU build's engine")
@pytest.mark.parametrize(
    ("model", "block_size", "reason"),
    [
        ("tiny-dsv2", 32, "CPU MLA backend requires block_size=16"),
        ("tiny-qwen3next", 32, "raises the attention block size beside a state"),
    ],
)
def test_a_layer_kind_the_cpu_build_does_not_run_is_a_one_line_failed_row(
    tmp_path: Path, model: str, block_size: int, reason: str
) -> None:
    (row,) = suite(tmp_path, model, '["vllm"]', "4MiB", block_size)
    assert row["status"] == "failed" and reason in row["error"] and "\n" not in row["error"]
    assert row["steps"] == 0


def test_prefix_caching_over_kv_cache_groups_on_the_engine_is_a_one_line_failed_row(tmp_path: Path) -> None:
    (row,) = suite(tmp_path, "tiny-gemma3", '["vllm"]', "4MiB", policy="paged-prefix")
    assert row["status"] == "failed" and "paged-prefix on model" in row["error"] and "\n" not in row["error"]
    assert row["steps"] == 0
