"""The simulator: exact expectations on hand-made workloads, and invariants on every step."""

from __future__ import annotations

import numpy as np
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from kvbench.app.suite import parse_suite
from kvbench.app.sweep import build_cells
from kvbench.harness.clock.clocks import Clock
from kvbench.harness.records import store
from kvbench.harness.records.schema import RUNS, STEPS, VERSION_KEY
from kvbench.harness.sim.policies import make_policy
from kvbench.harness.sim.scheduler import Arrivals, Scheduler
from kvbench.harness.sim.sequence import FINISHED
from kvbench.runners.common import base_row, expand_seqs
from kvbench.runners.driver import drive
from kvbench.runners.sim import SimEngine

from tests.conftest import Section, run_suite_text, suite_toml


def opt13b(workload: Section, budget: str = "12GiB", **sections: Section) -> str:
    """OPT-13B in fp16 with the example suite's memory and scheduler, over ``workload``."""
    return suite_toml(
        model={"preset": "opt-13b", "kv_dtype": "fp16"},
        memory={"kv_budget": budget, "max_model_len": 2048},
        scheduler={"max_num_seqs": 256, "max_num_batched_tokens": 2048},
        workload=workload,
        **sections,
    )


ALL_POLICIES = ["contiguous-max", "contiguous-pow2", "contiguous-oracle", "paged", "paged-prefix", "virtual-contiguous"]


def test_seed_example_35_tokens_block_16(out):
    # One 35-token prompt in 16-token blocks: 3 blocks, 48 positions, 13 unused.
    rows, steps = run_suite_text(
        opt13b(
            {"source": "fixed", "prompt_len": 35, "output_len": 1, "num_requests": 1},
            grid={"policy": ["paged"], "block_size": [16]},
        ),
        out,
    )
    (row,) = rows
    s = steps[row["run_id"]].iloc[0]
    assert s.allocated_blocks == 3
    assert s.allocated_positions == 48
    assert s.used_positions == 35
    assert s.allocated_positions - s.used_positions == 13
    assert row["steps"] == 1 and row["status"] == "ok"


def test_opt13b_contiguous_max_runs_exactly_7(out):
    rows, _ = run_suite_text(
        opt13b(
            {"source": "fixed", "prompt_len": 100, "output_len": 100, "num_requests": 200},
            grid={"policy": ["contiguous-max", "contiguous-oracle", "contiguous-pow2"]},
        ),
        out,
    )
    by = {r["policy"]: r for r in rows}
    assert by["contiguous-max"]["budget_positions"] == 15728  # ⌊12 GiB / 800 KiB⌋
    assert by["contiguous-max"]["peak_running"] == 7  # ⌊15728 / 2048⌋
    assert by["contiguous-oracle"]["peak_running"] == 15728 // 200
    assert by["contiguous-pow2"]["peak_running"] == 15728 // (100 + 128)
    assert all(r["preemptions"] == 0 for r in rows)  # a reservation never grows past itself


WORKLOADS = {
    "fixed": 'source = "fixed"\nprompt_len = 300\noutput_len = 200\nnum_requests = 60\n',
    "lognormal": 'source = "lognormal"\nprompt_mean = 200.0\noutput_mean = 150.0\nnum_requests = 80\nseed = 3\n',
    "poisson": 'source = "sharegpt"\nnum_requests = 60\narrival = "poisson"\nrate = 0.5\nseed = 1\n',
    "prefix": 'source = "uniform"\nprompt_min = 50\nprompt_max = 400\noutput_min = 5\noutput_max = 100\n'
    "num_requests = 50\nprefix_groups = 3\nprefix_len = 40\nn = 2\n",
}


@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_invariants_every_step_every_policy(out, workload):
    # A tight budget (about 2,900 positions) so that paged preempts and contiguous queues.
    rows, steps = run_suite_text(
        opt13b(WORKLOADS[workload], "2300MiB", grid={"policy": ALL_POLICIES, "block_size": [16, 64]}),
        out,
    )
    assert len(rows) == 3 + 2 * 2 + 1  # contiguous and virtual policies ignore block_size
    for row in rows:
        assert_step_invariants(row, steps[row["run_id"]])


def assert_step_invariants(row: dict, s) -> None:
    """The README's measurement definitions, on every step of one run."""
    assert row["status"] == "ok", row["error"]
    budget = row["budget_positions"]
    assert (s.allocated_positions + s.free_positions == budget).all()
    assert (s.used_positions <= s.allocated_positions).all()
    assert (s.external_frag_positions <= s.free_positions).all()
    assert (s.reserved_positions >= 0).all() and (s.internal_frag_positions >= 0).all()
    assert (s.used_positions + s.reserved_positions + s.internal_frag_positions == s.allocated_positions).all()
    assert (s.external_frag_positions[s.waiting == 0] == 0).all()
    if row["policy"] == "paged":
        # Paging wastes at most one partial block per live request.
        waste = s.allocated_positions - s.used_positions
        assert (waste <= s.running * (row["block_size"] - 1)).all()
    fracs = sum(row[k] for k in ("token_states_frac", "reservation_frac", "internal_frag_frac", "free_frac"))
    assert fracs == pytest.approx(1.0)


CONTIGUOUS = '["contiguous-max", "contiguous-pow2", "contiguous-oracle"]'


@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_invariants_every_step_buddy_arena(out, workload):
    rows, steps = run_suite_text(
        opt13b(
            WORKLOADS[workload],
            "2300MiB",
            grid={
                "policy": ["contiguous-max", "contiguous-pow2", "contiguous-oracle", "paged"],
                "arena": ["first-fit", "buddy"],
            },
        ),
        out,
    )
    # The arena varies the contiguous cells only: paged runs once, and records no arena.
    assert sorted((r["policy"], str(r["arena"])) for r in rows) == sorted(
        [(p, a) for p in ("contiguous-max", "contiguous-pow2", "contiguous-oracle") for a in ("first-fit", "buddy")]
        + [("paged", "None")]
    )
    by = {(r["policy"], r["arena"]): r for r in rows}
    for row in rows:
        assert_step_invariants(row, steps[row["run_id"]])
    # max_model_len 2048 is a power of two: buddy takes what first-fit takes, step for step.
    a, b = (steps[by[("contiguous-max", arena)]["run_id"]].drop(columns="run_id") for arena in ("first-fit", "buddy"))
    assert a.equals(b)
    # Oracle reserves exactly F: under buddy, every allocation beyond F is the 2^k rounding.
    ff, bd = (steps[by[("contiguous-oracle", arena)]["run_id"]] for arena in ("first-fit", "buddy"))
    assert (ff.internal_frag_positions == 0).all() and (bd.internal_frag_positions > 0).any()


def test_buddy_arena_rounds_each_reservation_to_a_power_of_two(out):
    rows, steps = run_suite_text(
        opt13b(
            {"source": "fixed", "prompt_len": 100, "output_len": 100, "num_requests": 200},
            run={"arena": "buddy"},
            grid={"policy": ["contiguous-max", "contiguous-oracle", "contiguous-pow2", "paged"]},
        ),
        out,
    )
    by = {r["policy"]: r for r in rows}
    assert {p: r["arena"] for p, r in by.items()} == {
        "contiguous-max": "buddy",
        "contiguous-oracle": "buddy",
        "contiguous-pow2": "buddy",
        "paged": None,
    }
    # 15,728 positions = 8192 + 4096 + 2048 + 1024 + 256 + 64 + 32 + 16: 61 blocks of 256 (200 and
    # 228 both round to 256), 7 of 2048 (as first-fit: 2048 is a power of two).
    assert by["contiguous-oracle"]["peak_running"] == by["contiguous-pow2"]["peak_running"] == 61
    assert by["contiguous-max"]["peak_running"] == 7
    s = steps[by["contiguous-oracle"]["run_id"]]
    full = s[s.running == 61].iloc[0]
    assert full.allocated_positions == 61 * 256 and full.internal_frag_positions == 61 * (256 - 200)
    assert full.free_positions == 15728 - 61 * 256 == 112
    # Nothing left can hold a 256-block: every free position is external to the waiting head.
    assert full.waiting > 0 and full.external_frag_positions == full.free_positions


def test_unknown_arena_is_a_one_line_error(tmp_path, capsys):
    from kvbench.app.cli import main

    suite = tmp_path / "s.toml"
    suite.write_text(opt13b({"source": "fixed"}, run={"arena": "best-fit"}, grid={"policy": ["paged"]}))
    assert main(["run", str(suite), "--out", str(tmp_path / "out"), "--no-report", "--quiet"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "unknown arena 'best-fit' (known: first-fit, buddy)" in err[0]


@pytest.mark.parametrize(
    "policy", ["contiguous-max", "contiguous-pow2", "contiguous-oracle", "paged", "paged-prefix", "virtual-contiguous"]
)
def test_every_request_finishes_once_with_its_output_and_nothing_stays_allocated(tmp_path, policy):
    text = opt13b(WORKLOADS["prefix"], "2300MiB", grid={"policy": [policy], "block_size": [16]})
    (cell,) = build_cells(parse_suite(text, "t.toml"), tmp_path, lambda m: None)
    seqs = expand_seqs(cell)
    policy_obj = make_policy(cell.spec)
    arrivals = Arrivals(seqs)
    sched = Scheduler(arrivals, policy_obj, cell.spec.scheduler, cell.spec.memory.max_model_len, Clock())
    result = drive(cell, seqs, arrivals, SimEngine(sched), base_row(cell, "sim"))
    assert result.status == "ok", result.error
    steps = store.read_table(tmp_path, "steps", {cell.run_id})
    assert steps["finished"].sum() == len(seqs)  # each finished once
    assert all(s.status == FINISHED and s.num_output == s.output_len for s in seqs)
    assert policy_obj.allocated_positions == 0
    assert policy_obj.internal_positions == 0 and policy_obj.shared_excess_positions == 0
    assert sched.used_positions == 0


def test_prefix_caching_shares_blocks_and_counts_them_once(out):
    rows, steps = run_suite_text(
        opt13b(
            {
                "source": "fixed",
                "prompt_len": 200,
                "output_len": 20,
                "num_requests": 8,
                "prefix_groups": 1,
                "prefix_len": 160,
            },
            grid={"policy": ["paged", "paged-prefix"], "block_size": [16]},
        ),
        out,
    )
    by = {r["policy"]: r for r in rows}
    # 160 shared tokens = 10 full blocks; every request after the first hits them.
    assert by["paged-prefix"]["prefix_hit_rate"] > 0
    assert by["paged"]["prefix_hit_rate"] == 0
    prefix_steps, paged_steps = steps[by["paged-prefix"]["run_id"]], steps[by["paged"]["run_id"]]
    assert prefix_steps.allocated_blocks.max() < paged_steps.allocated_blocks.max()


def test_infeasible_request_is_a_row_with_bytes_and_levers(out):
    rows, steps = run_suite_text(
        opt13b(
            {"source": "fixed", "prompt_len": 200, "output_len": 100, "num_requests": 3},
            "100MiB",
            grid={"policy": ["paged", "contiguous-max"]},
        ),
        out,
    )
    for row in rows:
        assert row["status"] == "infeasible"
        assert "positions" in row["error"] and "MiB" in row["error"]
        assert "fewer KV heads" in row["error"] and "fp8" in row["error"]
        lever = "a max_model_len of at most" if row["policy"] == "contiguous-max" else "a smaller workload"
        assert lever in row["error"]
        assert steps[row["run_id"]].empty


def test_records_follow_the_parquet_contract(out):
    rows, _ = run_suite_text(opt13b(WORKLOADS["fixed"], grid={"policy": ["paged"]}), out)
    (row,) = rows
    for table, schema in (("steps", STEPS), ("runs", RUNS)):
        f = out / table / f"run_id={row['run_id']}" / "part-0.parquet"
        assert pq.read_metadata(f).metadata[VERSION_KEY] == b"1"
        assert set(schema.names) <= set(pq.read_schema(f).names)
    dataset = ds.dataset(out / "steps", partitioning="hive")
    assert set(dataset.to_table().column("run_id").to_pylist()) == {row["run_id"]}
    assert not list(out.glob("*/.tmp-*"))
    assert (out / "workloads" / f"{row['workload_id']}.parquet").is_file()


def test_same_spec_same_records_whatever_the_global_rng(out, tmp_path):
    text = opt13b(WORKLOADS["lognormal"], grid={"policy": ["paged"]})
    rows_a, steps_a = run_suite_text(text, tmp_path / "a")
    np.random.seed(12345)
    __import__("random").seed(999)
    rows_b, steps_b = run_suite_text(text, tmp_path / "b")
    assert rows_a[0]["run_id"] == rows_b[0]["run_id"]
    a, b = steps_a[rows_a[0]["run_id"]], steps_b[rows_b[0]["run_id"]]
    assert a.drop(columns=["run_id"]).equals(b.drop(columns=["run_id"]))


def test_gpu_presets_fold_measured_efficiency_into_the_roofline():
    import dataclasses

    from kvbench.harness.clock.clocks import RooflineClock
    from kvbench.harness.clock.model import GPU_PRESETS, GpuPreset
    from kvbench.harness.spec.geometry import preset

    g = preset("opt-13b")
    for gpu in GPU_PRESETS.values():
        assert 0.0 < gpu.bandwidth_efficiency <= 1.0 and 0.0 < gpu.flops_efficiency <= 1.0, gpu
        assert gpu.source and gpu.name in gpu.describe() and f"× {gpu.bandwidth_efficiency:.2f}" in gpu.describe()
        clock = RooflineClock(g, g.kv_bytes_per_token("fp16"), gpu)
        assert clock.parts.bandwidth_bytes_s == gpu.bandwidth_bytes_s * gpu.bandwidth_efficiency
        assert clock.parts.peak_flops_s == gpu.peak_flops * gpu.flops_efficiency
    # Measured factors slow the roofline down; the datasheet (factors 1) is the old price.
    a100 = GPU_PRESETS["A100-40GB"]
    datasheet = dataclasses.replace(a100, bandwidth_efficiency=1.0, flops_efficiency=1.0)
    assert RooflineClock(g, 819200, datasheet).parts.bandwidth_bytes_s == 1.555e12
    assert RooflineClock(g, 819200, a100).parts.bandwidth_bytes_s < 1.555e12
    for bad in (0.0, -0.5, 1.01, float("nan"), True):
        with pytest.raises(ValueError, match="bandwidth_efficiency"):
            GpuPreset("X", 1, 1e12, 1e14, bandwidth_efficiency=bad)
