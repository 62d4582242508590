"""sim against vLLM's scheduler with a CPU tier: vLLM's own ``OffloadingConnectorScheduler`` and
``CPUOffloadingManager`` (LRU, ARC), its worker half stood in for (``runners.vllm.offload``),
against ``harness.sim.offload`` — every step column (the CPU tier's included) and the whole
requests table identical.

The cases make every part of the connector work: a tier smaller than the work's blocks (CPU
evictions), a GPU budget that preempts (resumed requests load their blocks back), conversations
(each turn's earlier turns come back from the CPU tier once the GPU has evicted them), arrivals
on the roofline clock, and models of vLLM's KV cache groups: sliding windows beside full
attention (each group's blocks keyed, stored and loaded apart; a sliding group's only where a
lookup can end, and only its window loaded), MLA, and the hybrid manager off (one group).
"""

from __future__ import annotations

import random
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("vllm")

from kvbench.harness.records import store  # noqa: E402

from tests.agreekit import HYBRID_CASES, assert_agree, run_pair  # noqa: E402
from tests.conftest import ROOT  # noqa: E402

MOONCAKE = ROOT / "suites" / "data" / "mooncake-reuse.jsonl"
TIER_COLUMNS = ("cpu_blocks", "stored_blocks", "loaded_blocks", "load_waiting")


def trace(limit: int) -> str:
    return (
        f'source = "trace"\npath = "{MOONCAKE}"\nlimit = {limit}\nhash_block_size = 512\n'
        'arrival = "trace"\ntime_scale = 0.05'
    )


# Llama-3-8B at fp16: 2 MiB a 16-token block, so a 2 GiB tier holds 1,024 blocks.
CASES: dict[str, dict[str, object]] = {
    "lru-tier-evicts": dict(workload=trace(40), budget="1GiB", cpu_offload="2GiB", offload_policy="lru"),
    "arc-tier-evicts": dict(workload=trace(40), budget="1GiB", cpu_offload="2GiB", offload_policy="arc"),
    "preempting-loads-back": dict(
        workload=trace(60), budget="1GiB", cpu_offload="8GiB", offload_policy="lru", clock="roofline"
    ),
}


# Each turn's prompt holds its conversation so far; a GPU budget too small to keep it leaves the
# CPU tier to serve the earlier turns.
CONVERSATIONS: dict[str, object] = dict(
    workload='source = "sessions"\nnum_sessions = 16\nturns = 5\nthink_time_s = 0.5\nlengths = "uniform"\n'
    "prompt_min = 200\nprompt_max = 600\nmessage_min = 20\nmessage_max = 120\noutput_min = 10\n"
    'output_max = 80\narrival = "poisson"\nrate = 4.0\nseed = 3',
    budget="256MiB",
    cpu_offload="1GiB",
    offload_policy="arc",
    max_model_len=2048,
    max_num_seqs=16,
    max_num_batched_tokens=512,
)
SETTINGS: dict[str, object] = dict(
    max_model_len=8192, max_num_seqs=32, max_num_batched_tokens=2048, policy="paged-prefix"
)


# Models of KV cache groups (``tests.agreekit.HYBRID_CASES``) under a tier: (case, workload, GPU
# budget, tier, eviction policy). Shared prefixes past gpt-oss's 128-token window, and
# conversations, whose later turns end a lookup where an earlier turn's prompt ended.
SHARED_PREFIXES = (
    'source = "uniform"\nprompt_min = 100\nprompt_max = 400\noutput_min = 40\noutput_max = 200\n'
    'num_requests = 24\nn = 2\nprefix_groups = 4\nprefix_len = 192\narrival = "batch"\nseed = 3'
)
SESSIONS = (
    'source = "sessions"\nnum_sessions = 8\nturns = 4\nthink_time_s = 0.5\nlengths = "uniform"\n'
    "prompt_min = 100\nprompt_max = 300\nmessage_min = 20\nmessage_max = 80\noutput_min = 10\n"
    'output_max = 60\narrival = "poisson"\nrate = 4.0\nseed = 3'
)
GROUP_CASES: dict[str, tuple[str, str, str, str, str]] = {
    "gpt-oss-sliding": ("gpt-oss-20b-hybrid-on", SHARED_PREFIXES, "64MiB", "256MiB", "lru"),
    "gpt-oss-sliding-tier-evicts": ("gpt-oss-20b-hybrid-on", SHARED_PREFIXES, "64MiB", "16MiB", "arc"),
    "gemma3-like-sliding-conversations": ("gemma3-like-hybrid-on", SESSIONS, "1MiB", "1MiB", "lru"),
    "gpt-oss-one-group": ("gpt-oss-20b-hybrid-off", SHARED_PREFIXES, "64MiB", "256MiB", "arc"),
    "mla": ("mla-deepseek-v2-like", SHARED_PREFIXES, "2500KiB", "4MiB", "arc"),
}


def check(tmp_path: Path, **kw: object) -> tuple[dict, object, object]:
    settings = dict(SETTINGS, **kw)
    sim, vllm = run_pair(tmp_path, **settings)
    steps, reqs = assert_agree(tmp_path, sim, vllm)
    both = store.read_table(tmp_path, "steps", {sim["run_id"], vllm["run_id"]})
    a = both[both["run_id"] == sim["run_id"]][list(TIER_COLUMNS)].reset_index(drop=True)
    b = both[both["run_id"] == vllm["run_id"]][list(TIER_COLUMNS)].reset_index(drop=True)
    assert a.notna().all().all()
    assert a.equals(b)
    assert sim["offload_rules"] == vllm["offload_rules"]  # the rules of the vLLM installed here
    return sim, steps, reqs


@pytest.mark.parametrize("case", sorted(CASES))
def test_offload_agrees_step_for_step(tmp_path: Path, case: str) -> None:
    sim, steps, reqs = check(tmp_path, **CASES[case])
    capacity = sim["cpu_blocks"]
    assert steps["loaded_blocks"].sum() > 0 and reqs["cpu_hit_tokens"].sum() > 0
    if case.endswith("tier-evicts"):
        # The tier fills and keeps storing: every later store evicts.
        assert steps["cpu_blocks"].max() == capacity < steps["stored_blocks"].sum()
    else:
        resumed = reqs[reqs["num_preemptions"] > 0]
        assert len(resumed) > 0 and (resumed["cpu_hit_tokens"] > 0).any()  # preempted, loaded back


def test_offload_agrees_on_conversations(tmp_path: Path) -> None:
    sim, steps, reqs = check(tmp_path, **CONVERSATIONS)
    later = reqs[reqs["turn"] > 0]
    assert (later["cpu_hit_tokens"] > 0).sum() > len(later) // 4


def group_rows(tmp_path: Path, run_id: str) -> pd.DataFrame:
    t = store.read_table(tmp_path, "kv_groups", {run_id}).drop(columns=["run_id"])
    return t.sort_values(["step", "group"]).reset_index(drop=True)


@pytest.mark.parametrize("case", list(GROUP_CASES))
def test_offload_over_kv_cache_groups_agrees_step_for_step(tmp_path: Path, case: str) -> None:
    model, workload, budget, tier, policy = GROUP_CASES[case]
    extra, _ = HYBRID_CASES[model]
    sim, steps, reqs = check(
        tmp_path,
        preset="gpt-oss-20b",  # a [model] config takes its place where the case gives one
        model_extra=extra,
        kv_dtype="bf16",
        workload=workload,
        budget=budget,
        max_model_len=1024,
        max_num_seqs=64,
        max_num_batched_tokens=256,
        cpu_offload=tier,
        offload_policy=policy,
    )
    a, b = (group_rows(tmp_path, rid) for rid in store.read_table(tmp_path, "runs")["run_id"])
    assert a.equals(b)  # every KV cache group's row, step by step
    loaded, hit_blocks = steps["loaded_blocks"].sum(), reqs["cpu_hit_tokens"].sum() // 16
    assert hit_blocks > 0
    if "sliding" in case:
        # Loads fill the sliding groups' windows beside the full groups' blocks.
        assert loaded > hit_blocks
    if case.endswith("tier-evicts"):
        assert steps["cpu_blocks"].max() == sim["cpu_blocks"] < steps["stored_blocks"].sum()


def random_case(seed: int) -> dict[str, object]:
    """Settings drawn at random: shared-prefix samples or conversations, small GPU budgets and
    tiers (a tier so small that stores are refused included), block sizes 8 to 32, either clock."""
    r = random.Random(seed)
    if r.random() < 0.5:
        workload = (
            f'source = "uniform"\nprompt_min = 16\nprompt_max = {r.randint(100, 700)}\noutput_min = 1\n'
            f"output_max = {r.randint(20, 200)}\nnum_requests = {r.randint(20, 60)}\nn = {r.randint(1, 3)}\n"
            f"prefix_groups = {r.randint(1, 5)}\nprefix_len = {r.choice([16, 64, 200])}\n"
            f'arrival = "batch"\nseed = {seed}'
        )
    else:
        workload = (
            f'source = "sessions"\nnum_sessions = {r.randint(4, 12)}\nturns = {r.randint(2, 5)}\nthink_time_s = 0.5\n'
            'lengths = "uniform"\nprompt_min = 50\nprompt_max = 400\nmessage_min = 10\nmessage_max = 80\n'
            f'output_min = 5\noutput_max = 60\narrival = "poisson"\nrate = 4.0\nseed = {seed}'
        )
    return dict(
        workload=workload,
        budget=r.choice(["64MiB", "128MiB", "256MiB"]),
        max_model_len=2048,
        max_num_seqs=r.choice([4, 16, 32]),
        max_num_batched_tokens=r.choice([64, 256, 2048]),
        clock=r.choice(["steps", "roofline"]),
        block_size=r.choice([8, 16, 32]),
        cpu_offload=r.choice(["16MiB", "64MiB", "256MiB"]),
        offload_policy=r.choice(["lru", "arc"]),
    )


@pytest.mark.parametrize("seed", [0, 2, 6, 7])  # seeds whose runs load from the tier
def test_offload_agrees_on_random_settings(tmp_path: Path, seed: int) -> None:
    _, steps, _ = check(tmp_path, **random_case(seed))
    assert steps["loaded_blocks"].sum() > 0


def test_engine_cells_with_a_tier_are_skipped_on_the_cpu_build() -> None:
    """vLLM's engine on its CPU build cannot run the connector's worker half: an optional
    runner's cells with a tier are skipped with vLLM's reason (``kvbench run`` says so)."""
    from kvbench.harness.spec.specs import MemorySpec
    from kvbench.runners import cell_skip
    from kvbench.runners.vllm import build

    from tests.conftest import run_spec

    installed = build.installed_build()
    if installed is None or installed.device != "cpu":
        pytest.skip("vLLM's CPU build only")
    tier = MemorySpec(cpu_offload_bytes=2**30)
    why = cell_skip(run_spec(runner="vllm", policy="paged-prefix", memory=tier))
    assert why is not None and "CUDA or XPU" in why and "\n" not in why
    assert cell_skip(run_spec(runner="vllm", policy="paged-prefix")) is None
    assert cell_skip(run_spec(runner="vllm-sched", policy="paged-prefix", memory=tier)) is None
