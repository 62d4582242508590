"""Tensor and pipeline parallelism: KV geometry per rank, the budget per GPU, the run's identity,
``kvbench calc --tp``, and the roofline's per-rank terms plus all-reduces."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from kvbench.app.suite import parse_suite
from kvbench.harness.clock.clocks import (
    LINK_CALL_LATENCY_S,
    ParallelRooflineClock,
    RooflineClock,
)
from kvbench.harness.clock.model import GPU_PRESETS
from kvbench.harness.errors import KvbenchError
from kvbench.harness.spec.geometry import preset
from kvbench.harness.spec.specs import MemorySpec, ModelSpec, RunSpec, SchedulerSpec
from kvbench.harness.spec.workload_spec import WorkloadSpec
from kvbench.reports.divergence import first_divergence
from kvbench.runners.common import clock_for

from tests.conftest import AGREEMENT_COLUMNS, kvbench, needs_vllm, run_suite_text, suite_toml

GiB = 2**30


def spec(tp: int = 1, pp: int = 1, model: str = "opt-13b", **sched: object) -> RunSpec:
    return RunSpec(
        runner="sim",
        policy="paged",
        block_size=16,
        model=ModelSpec(preset=model),
        memory=MemorySpec(),
        workload=WorkloadSpec(),
        scheduler=SchedulerSpec(tensor_parallel_size=tp, pipeline_parallel_size=pp, **sched),  # type: ignore[arg-type]
    )


# -- geometry per rank -------------------------------------------------------------------------


def test_per_rank_kv_slots_match_the_papers_table_1() -> None:
    # Kwon et al. 2023, Table 1: KV memory and its maximum number of KV slots (tokens).
    # OPT-13B, 1 × A100-40GB, 12 GB of KV: 15.7K slots. 2 × 40 layers × 40 heads × 128 × 2 B.
    assert preset("opt-13b").kv_bytes_per_token("fp16") == 2 * 40 * 40 * 128 * 2 == 819_200
    assert 12 * GiB // 819_200 == 15_728  # 15.7K
    # OPT-175B, 8 × A100-80GB, 264 GB of KV: 60.1K slots. Per rank: 96 heads / 8 = 12, 96 layers.
    per_rank = preset("opt-175b").kv_bytes_per_token("fp16", 8)
    assert per_rank == 2 * 96 * 12 * 128 * 2 == 589_824
    assert (264 * GiB // 8) // per_rank == 60_074  # 60.1K: every rank holds every slot's slice
    # OPT-66B, 4 × A100-40GB, 21 GB of KV: 9.7K slots. Per rank: 72 heads / 4 = 18, 64 layers.
    per_rank = preset("opt-66b").kv_bytes_per_token("fp16", 4)
    assert per_rank == 2 * 64 * 18 * 128 * 2 == 589_824
    slots = (21 * GiB // 4) // per_rank
    assert slots == 9_557  # 9.6K: the table's "21 GB" is rounded (9.7K slots would be 21.3 GiB)
    assert abs(slots / 9_700 - 1) < 0.02


def test_kv_heads_fewer_than_ranks_are_replicated_and_pipeline_stages_round_up() -> None:
    g = preset("llama-3-70b")  # 64 heads, 8 KV heads, 80 layers
    assert g.kv_heads_per_rank(4) == 2 and g.kv_heads_per_rank(8) == 1 and g.kv_heads_per_rank(16) == 1
    assert g.kv_bytes_per_token("fp16", 16) == 2 * 80 * 1 * 128 * 2
    assert g.layers_per_stage(3) == 27  # 80 = 27 + 27 + 26: the largest stage binds
    assert g.kv_bytes_per_token("fp16", 2, 3) == 2 * 27 * 4 * 128 * 2
    g.check_parallel(16)  # 16 is a multiple of 8 KV heads: each replicated on 2 ranks
    with pytest.raises(KvbenchError, match="KV heads"):
        preset("qwen2.5-7b").check_parallel(7)  # 28 heads ÷ 7, but 4 KV heads neither divide nor replicate
    with pytest.raises(KvbenchError, match="attention heads"):
        preset("opt-66b").check_parallel(16)  # 72 heads
    with pytest.raises(KvbenchError, match="layers"):
        preset("tiny").check_parallel(1, 3)


def test_budget_is_per_gpu_and_spec_figures_are_one_ranks() -> None:
    s = spec(4, model="opt-66b").replace(memory=MemorySpec(kv_budget_bytes=21 * GiB // 4))
    assert s.kv_bytes_per_token == 589_824 and s.budget_positions == 9_557


def test_tp_times_pp_must_fit_the_stated_gpus() -> None:
    SchedulerSpec(tensor_parallel_size=4, pipeline_parallel_size=2, num_gpus=8)
    with pytest.raises(KvbenchError, match="more than num_gpus = 4"):
        SchedulerSpec(tensor_parallel_size=4, pipeline_parallel_size=2, num_gpus=4)
    for bad in (0, -1, True, 2.0):
        with pytest.raises(KvbenchError, match="tensor_parallel_size"):
            SchedulerSpec(tensor_parallel_size=bad)  # type: ignore[arg-type]


# -- identity ----------------------------------------------------------------------------------


def test_parallel_sizes_count_in_the_run_id_only_when_not_1() -> None:
    # At size 1 every earlier run id stands: tests/spec/test_identity.py pins them.
    base = spec()
    sched = base.canonical("w")["scheduler"]
    assert "tensor_parallel_size" not in sched and "pipeline_parallel_size" not in sched and "num_gpus" not in sched
    assert spec(2).run_id("w") != base.run_id("w") != spec(1, 2).run_id("w")
    assert spec(2).canonical("w")["scheduler"]["tensor_parallel_size"] == 2
    assert spec(2, num_gpus=8).run_id("w") == spec(2).run_id("w")  # a check, not a setting


def test_a_grid_axis_of_tensor_parallel_sizes(tmp_path: Path) -> None:
    def tp_suite(scheduler: dict[str, object] | None = None) -> str:
        return suite_toml(
            "tp",
            model={"preset": "opt-13b"},
            memory={"kv_budget": "4GiB"},
            scheduler=scheduler,
            workload={"source": "fixed", "prompt_len": 100, "output_len": 20, "num_requests": 30, "arrival": "batch"},
            parallel={"num_gpus": 4},
            grid={"runner": ["sim"], "policy": ["paged"], "tensor_parallel_size": [1, 2, 4]},
        )

    text = tp_suite()
    cells = [s for s, _ in parse_suite(text, str(tmp_path / "s.toml")).cells()]
    assert [s.scheduler.tensor_parallel_size for s in cells] == [1, 2, 4]
    assert [s.kv_bytes_per_token for s in cells] == [819_200, 409_600, 204_800]
    assert len({s.run_id("w") for s in cells}) == 3
    rows, _ = run_suite_text(tp_suite({"clock": "roofline"}), tmp_path)
    by_tp = {r["tensor_parallel_size"]: r for r in rows}
    assert set(by_tp) == {1, 2, 4} and all(r["status"] == "ok" for r in rows)
    assert by_tp[4]["kv_bytes_per_token"] == 204_800 and by_tp[4]["pipeline_parallel_size"] == 1
    assert by_tp[4]["budget_positions"] == 4 * GiB // 204_800
    assert "all-reduce" in by_tp[4]["clock_detail"] and "all-reduce" not in by_tp[1]["clock_detail"]


# -- kvbench calc ------------------------------------------------------------------------------


def _calc(*args: str) -> dict:
    proc = kvbench("calc", "--block-size", "16", "--tokens", "512", "--json", *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)[0]


def test_calc_per_rank_for_the_papers_large_models() -> None:
    # OPT-66B on 4 GPUs, 21 GiB of KV in all: 5.25 GiB per GPU.
    r = _calc("--model", "opt-66b", "--tp", "4", "--budget", "5.25GiB")
    # By hand: 2 × 64 layers × (72 / 4 = 18) heads × 128 × 2 B = 589,824 B per token per rank;
    # 5.25 GiB = 5,637,144,576 B ÷ 589,824 = 9,557 positions; contiguous at 2,048: 9,557 // 2,048 = 4;
    # paged: 9,557 // 16 = 597 blocks, a 512-token sequence takes 32: 597 // 32 = 18.
    assert (r["kv_bytes_per_token"], r["kv_heads_per_rank"], r["layers_per_rank"]) == (589_824, 18, 64)
    assert (r["budget_positions"], r["fit_contiguous_max"], r["fit_paged"]) == (9_557, 4, 18)
    # OPT-175B on 8 × A100-80GB, 264 GiB of KV in all: 33 GiB per GPU.
    r = _calc("--model", "opt-175b", "--tp", "8", "--budget", "33GiB")
    # 2 × 96 × (96 / 8 = 12) × 128 × 2 = 589,824 B; 33 GiB = 35,433,480,192 B → 60,074 positions;
    # contiguous: 60,074 // 2,048 = 29; paged: 60,074 // 16 = 3,754 blocks // 32 = 117.
    assert (r["kv_bytes_per_token"], r["kv_heads_per_rank"], r["layers_per_rank"]) == (589_824, 12, 96)
    assert (r["budget_positions"], r["fit_contiguous_max"], r["fit_paged"]) == (60_074, 29, 117)
    # Pipeline stages: 96 layers over 2 stages, 48 each; half the bytes per token again.
    r = _calc("--model", "opt-175b", "--tp", "8", "--pp", "2", "--budget", "33GiB")
    assert (r["kv_bytes_per_token"], r["layers_per_rank"]) == (294_912, 48)


def test_calc_text_says_per_rank_and_per_gpu() -> None:
    proc = kvbench(
        "calc", "--block-size", "16", "--tokens", "512", "--model", "opt-66b", "--tp", "4", "--budget", "5.25GiB"
    )
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[0]
    assert "589,824 B/token per rank (TP 4 × PP 1: 18 KV heads × 64 layers per rank)" in first
    assert "per GPU = 9,557 positions" in first


# -- the roofline ------------------------------------------------------------------------------


def test_roofline_at_tp_1_is_the_single_gpu_formula_bit_for_bit() -> None:
    g = preset("opt-13b")
    gpu = GPU_PRESETS["A100-40GB"]
    clock = clock_for(SchedulerSpec(clock="roofline", roofline_scale=1.5), g, g.kv_bytes_per_token("fp16"))
    assert type(clock) is RooflineClock
    bw, peak = gpu.bandwidth_bytes_s * gpu.bandwidth_efficiency, gpu.peak_flops * gpu.flops_efficiency
    for tokens, ctx, pairs in ((1, 100, 100), (2048, 40_000, 3_000_000), (7, 0, 0)):
        memory = (float(g.weight_bytes(2)) + ctx * float(g.kv_bytes_per_token("fp16"))) / bw
        compute = (
            tokens * (2.0 * g.num_params) + pairs * (4.0 * g.num_layers * g.num_attention_heads * g.head_dim)
        ) / peak
        assert clock.price(tokens, ctx, pairs, 1) == max(memory, compute) * 1.5


def _same_floats_as_price(clock: RooflineClock) -> None:
    """The fast path's arrays: the same floats as price, step by step."""
    rng = np.random.default_rng(0)
    t = rng.integers(0, 2048, 200)
    c = rng.integers(0, 100_000, 200)
    p = rng.integers(0, 10**7, 200)
    many = clock.step_times(t, c, p, 1)
    assert all(many[i] == clock.price(int(t[i]), int(c[i]), int(p[i]), 1) for i in range(200))
    assert (clock.step_times(7, c, p, 1) == np.array([clock.price(7, int(x), int(y), 1) for x, y in zip(c, p)])).all()


def test_roofline_with_tp_adds_two_ring_all_reduces_per_layer_with_their_call_latency() -> None:
    g = preset("opt-66b")
    sched = SchedulerSpec(clock="roofline", tensor_parallel_size=4)
    kv = g.kv_bytes_per_token("fp16", 4)
    clock = clock_for(sched, g, kv)
    assert isinstance(clock, ParallelRooflineClock)
    gpu = GPU_PRESETS["A100-40GB"]
    bw, peak = gpu.bandwidth_bytes_s * gpu.bandwidth_efficiency, gpu.peak_flops * gpu.flops_efficiency
    tokens, ctx, pairs = 512, 50_000, 1_000_000
    memory = (g.weight_bytes(2) / 4 + ctx * kv) / bw
    compute = (tokens * 2.0 * g.num_params / 4 + pairs * 4.0 * 64 * 18 * 128) / peak
    # 2 per layer × 64 layers, each 2 × 3/4 × 512 tokens × 9,216 × 2 B over 300 GB/s (NVLink 3, one
    # way), and 10 µs per call.
    comm = 2 * 64 * (2 * 3 / 4 * tokens * 9216 * 2) / 300e9 + 2 * 64 * 10e-6
    assert LINK_CALL_LATENCY_S == 10e-6
    assert clock.price(tokens, ctx, pairs, 8) == pytest.approx(max(memory, compute) + comm, rel=1e-12)
    _same_floats_as_price(clock)


def test_opt_175b_tp8_decode_pays_its_all_reduce_calls() -> None:
    # 96 layers × 2 all-reduces = 192 calls × 10 µs = 1.92 ms on top of the bandwidth terms: about
    # 6% of a decode step of 8 requests at 1,000 tokens of context on A100-80GB (33 ms).
    g = preset("opt-175b")
    kv = g.kv_bytes_per_token("fp16", 8)
    with_calls = clock_for(SchedulerSpec(clock="roofline", gpu="A100-80GB", tensor_parallel_size=8), g, kv)
    assert isinstance(with_calls, ParallelRooflineClock)
    step = with_calls.price(8, 8_000, 8_000, 8)
    calls = 2 * g.num_layers * LINK_CALL_LATENCY_S
    assert g.num_layers == 96 and calls == pytest.approx(1.92e-3)
    assert 0.05 < calls / step < 0.07


def test_roofline_with_pp_sums_the_stages_and_sends_between_them() -> None:
    # llama-3-8b: 32 layers. PP 4: stages of 8 layers, one batch through all four in turn.
    g = preset("llama-3-8b")
    one = clock_for(SchedulerSpec(clock="roofline"), g, g.kv_bytes_per_token("fp16"))
    pp = clock_for(SchedulerSpec(clock="roofline", pipeline_parallel_size=4), g, g.kv_bytes_per_token("fp16", 1, 4))
    assert type(one) is RooflineClock and isinstance(pp, ParallelRooflineClock)
    tokens, ctx, pairs = 256, 40_000, 800_000
    # Every term of a stage is a quarter of the whole model's, so the four stages sum to it: the
    # one-GPU step, plus 3 sends of 256 tokens × 4,096 × 2 B over 300 GB/s and 10 µs each.
    sends = 3 * (tokens * 4096 * 2 / 300e9 + 10e-6)
    assert pp.price(tokens, ctx, pairs, 8) == pytest.approx(one.price(tokens, ctx, pairs, 8) + sends, rel=1e-12)
    # Uneven stages (30 layers over PP 4: 8, 8, 7, 7) sum to the layers, not 4 × the largest.
    g30 = dataclasses.replace(g, num_layers=30)
    one30 = clock_for(SchedulerSpec(clock="roofline"), g30, g30.kv_bytes_per_token("fp16"))
    pp30 = clock_for(
        SchedulerSpec(clock="roofline", pipeline_parallel_size=4), g30, g30.kv_bytes_per_token("fp16", 1, 4)
    )
    assert pp30.price(tokens, ctx, pairs, 8) == pytest.approx(one30.price(tokens, ctx, pairs, 8) + sends, rel=1e-9)
    _same_floats_as_price(pp)
    both = clock_for(
        SchedulerSpec(clock="roofline", tensor_parallel_size=2, pipeline_parallel_size=2, num_gpus=4),
        g,
        g.kv_bytes_per_token("fp16", 2, 2),
    )
    assert isinstance(both, ParallelRooflineClock)
    _same_floats_as_price(both)


@needs_vllm
def test_vllm_sched_allocates_one_ranks_kv_as_sim_does(tmp_path: Path) -> None:
    text = suite_toml(
        "tp2",
        model={"preset": "llama-mini", "kv_dtype": "bf16"},
        memory={"kv_budget": "600KiB", "max_model_len": 1024},
        workload={"source": "fixed", "prompt_len": 200, "output_len": 40, "num_requests": 12, "arrival": "batch"},
        scheduler={"max_num_seqs": 16, "max_num_batched_tokens": 256, "clock": "roofline"},
        parallel={"tensor_parallel_size": 2},
        grid={"runner": ["sim", "vllm-sched"], "policy": ["paged"], "block_size": [32]},
    )
    rows, steps = run_suite_text(text, tmp_path)
    sim, vs = sorted(rows, key=lambda r: r["runner"])
    assert (sim["runner"], vs["runner"]) == ("sim", "vllm-sched")
    # llama-mini: 3 layers, 2 KV heads ÷ 2 ranks = 1, head size 64, bf16: 768 B per token per rank.
    assert sim["kv_bytes_per_token"] == vs["kv_bytes_per_token"] == 2 * 3 * 1 * 64 * 2
    assert sim["status"] == vs["status"] == "ok" and sim["peak_running"] < 12  # the budget binds
    d = first_divergence(steps[sim["run_id"]], steps[vs["run_id"]], AGREEMENT_COLUMNS)
    assert d is None, d.describe("sim", "vllm-sched")


def test_grid_together_pairs_a_model_with_its_gpus_and_budget(tmp_path: Path) -> None:
    # The paper suite's axis: each model with its own parallel size, budget and GPU, not a product.
    from kvbench.app.suite import load_suite

    suite = load_suite("paper-serving-curves")
    setups = {
        (s.model.preset, s.scheduler.tensor_parallel_size, s.scheduler.gpu, s.budget_positions)
        for s, _ in suite.cells()
    }
    assert setups == {
        ("opt-13b", 1, "A100-40GB", 15_728),  # Table 1: 15.7K slots
        ("opt-66b", 4, "A100-40GB", 9_557),  # 9.7K in the table (its 21 GB rounded)
        ("opt-175b", 8, "A100-80GB", 60_074),  # 60.1K
    }
    # The OPT-13B cells are the cells the suite had before it held three models: same run ids.
    old = parse_suite(Path(suite.path).read_text().split("together = [")[0], suite.path)  # no together axis
    ids = {s.run_id("w") for s, _ in old.cells()}
    assert ids == {s.run_id("w") for s, _ in suite.cells() if s.model.preset == "opt-13b"}
