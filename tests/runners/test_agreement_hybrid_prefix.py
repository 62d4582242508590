"""Prefix caching over vLLM's KV cache groups: sim against vLLM's own scheduler.

kvbench's ``GroupedPrefixPolicy`` against vLLM 0.32's ``HybridKVCacheCoordinator`` (one group:
``UnitaryKVCacheCoordinator``) on a shared-prefix workload (prefix groups and parallel samples):
every step column, the whole requests table and every KV cache group row identical, for an
interleaved sliding/full model (gpt-oss's 1:1, Gemma-3's 5:1) with the hybrid manager on and off
and an MLA model, each under a budget that preempts and evicts cached blocks. With the hybrid
manager on a sliding group caches only the blocks a later lookup can end on, so the same work hits
less than with it off. State layers are refused (``RunSpec``): vLLM caches them in its Mamba
"align" mode, which kvbench does not mirror.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("vllm")

from kvbench.harness.errors import KvbenchError  # noqa: E402
from kvbench.harness.records import store  # noqa: E402
from kvbench.harness.spec.specs import MemorySpec, ModelSpec, RunSpec, SchedulerSpec  # noqa: E402
from kvbench.harness.spec.workload_spec import WorkloadSpec  # noqa: E402

from tests.agreekit import HYBRID_CASES, assert_agree, run_hybrid_case  # noqa: E402

# Four prefix groups of 192 tokens (past gpt-oss's 128-token window) and two samples per request:
# full groups hit the shared prefix and the whole prompt; sliding groups hit where a request cached
# the window's blocks (the prompt's end, the shared prefix's junction).
WORKLOAD = (
    'source = "uniform"\nprompt_min = 100\nprompt_max = 400\noutput_min = 40\noutput_max = 200\n'
    'num_requests = 24\nn = 2\nprefix_groups = 4\nprefix_len = 192\narrival = "batch"\nseed = 3'
)


CASES = {k: v for k, v in HYBRID_CASES.items() if not k.startswith("state-")}  # state layers: refused (below)


def run_case(tmp_path: Path, case: str) -> tuple[dict, dict]:
    return run_hybrid_case(tmp_path, case, WORKLOAD, policy="paged-prefix")


def group_table(tmp_path: Path, run_id: str) -> pd.DataFrame:
    t = store.read_table(tmp_path, "kv_groups", {run_id}).drop(columns=["run_id"])
    return t.sort_values(["step", "group"]).reset_index(drop=True)


@pytest.mark.parametrize("case", list(CASES))
def test_prefix_caching_over_kv_cache_groups_agrees_step_for_step(tmp_path: Path, case: str) -> None:
    sim, vllm = run_case(tmp_path, case)
    steps, reqs = assert_agree(tmp_path, sim, vllm)
    # The interesting regime: hits, preemptions, cached blocks evicted, shared blocks held at once.
    assert sim["preemptions"] > 0 and steps["evicted_blocks"].sum() > 0
    assert steps["prefix_hit_tokens"].sum() > 0 and steps["recomputed_hit_tokens"].sum() > 0
    assert (reqs["prefix_hit_tokens"] > 0).sum() > len(reqs) // 3
    for key in ("prefix_hit_rate", "recomputed_hit_tokens", "kv_groups", "hybrid_kv"):
        assert sim[key] == vllm[key], key
    ga, gb = group_table(tmp_path, sim["run_id"]), group_table(tmp_path, vllm["run_id"])
    pd.testing.assert_frame_equal(ga, gb)
    # A block shared by several requests counts once: the groups' blocks are the pool's in use.
    per_step = ga.groupby("step")["allocated_blocks"].sum().to_numpy()
    assert (per_step == steps.sort_values("step")["allocated_blocks"].to_numpy()).all()
    assert (steps["reserved_positions"] >= 0).all()


def test_the_hybrid_manager_caches_sliding_groups_sparsely_so_the_same_work_hits_less(tmp_path: Path) -> None:
    """Hybrid off, every layer is full attention and every full block is cached; hybrid on, a sliding
    group caches only the window's blocks at the places a lookup can end, so hits are rarer."""
    on, _ = run_case(tmp_path / "on", "gpt-oss-20b-hybrid-on")
    off, _ = run_case(tmp_path / "off", "gpt-oss-20b-hybrid-off")
    assert 0 < on["prefix_hit_rate"] < off["prefix_hit_rate"]


def test_prefix_caching_on_state_layers_is_refused_in_one_line() -> None:
    model = ModelSpec(preset="qwen3-next-80b", kv_dtype="bf16")
    cell = dict(runner="sim", block_size=16, model=model, memory=MemorySpec(), workload=WorkloadSpec())
    with pytest.raises(KvbenchError, match=r"qwen3-next.*paged-prefix on gdn layers is not modelled.*policy paged"):
        RunSpec(policy="paged-prefix", scheduler=SchedulerSpec(), **cell)  # type: ignore[arg-type]
    RunSpec(policy="paged", scheduler=SchedulerSpec(), **cell)  # type: ignore[arg-type]  # paged runs it
