"""sim against vLLM's own scheduler on models whose layers are not all full attention.

vLLM's KV cache groups (one block table per group per request, one shared block pool, blocks
that leave a sliding window freed at the next step) against kvbench's ``GroupedPagedPolicy``:
every step column, the whole requests table and every KV cache group row identical, with the
hybrid manager on and off, for an interleaved sliding/full model (gpt-oss's 1:1, Gemma-3's 5:1),
an MLA model and a model with state layers (Qwen3-Next's gated delta net), each under a budget
that preempts; and the contiguous policies, a run of block ids per group per request
(``GroupedContiguousPolicy`` against ``runners.vllm.grouped_contiguous``). The vLLM scheduler's
KV cache config is built from every layer's spec by vLLM's own grouping (``runners.vllm.kv_specs``),
on either build (0.32 CPU, 0.33 CUDA).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("vllm")

from kvbench.harness.records import store  # noqa: E402

from tests.agreekit import HYBRID_CASES, assert_agree, run_hybrid_case  # noqa: E402

# Long decodes beside short prompts: sliding layers free what leaves their window while the full
# layers grow, so running requests outgrow the pool and preempt.
WORKLOAD = (
    'source = "uniform"\nprompt_min = 100\nprompt_max = 400\noutput_min = 200\noutput_max = 600\n'
    'num_requests = 30\narrival = "batch"\nseed = 3'
)


CASES = HYBRID_CASES


def run_case(tmp_path: Path, case: str) -> tuple[dict, dict]:
    return run_hybrid_case(tmp_path, case, WORKLOAD)


@pytest.mark.parametrize("case", list(CASES))
def test_kv_cache_groups_agree_step_for_step(tmp_path: Path, case: str) -> None:
    sim, vllm = run_case(tmp_path, case)
    steps, _ = assert_agree(tmp_path, sim, vllm)
    assert sim["preemptions"] > 0 and len(steps) > 200  # the interesting regime is really exercised
    ga = assert_groups_agree(tmp_path, sim, vllm, steps)
    if "sliding" in sim["kv_groups"] and sim["hybrid_kv"]:  # blocks left the window: the table kept them as null
        full = ga[ga["kind"] == "full"]["allocated_blocks"].max()
        assert ga[ga["kind"] == "sliding"]["allocated_blocks"].max() < full


# Contiguous reservations per KV cache group (case, policy, budget, arena): budgets where the
# reservations hold requests back (several run, others wait), a buddy arena once.
CONTIGUOUS = [
    ("gpt-oss-20b-hybrid-on", "contiguous-max", "256MiB", "first-fit"),
    ("gpt-oss-20b-hybrid-on", "contiguous-oracle", "256MiB", "first-fit"),
    ("gpt-oss-20b-hybrid-off", "contiguous-max", "256MiB", "first-fit"),
    ("gemma3-like-hybrid-on", "contiguous-oracle", "4MiB", "first-fit"),
    ("gemma3-like-hybrid-on", "contiguous-max", "4MiB", "buddy"),
    ("mla-deepseek-v2-like", "contiguous-max", "10MiB", "first-fit"),
    ("state-qwen3-next-like", "contiguous-oracle", "5MiB", "first-fit"),
]


@pytest.mark.parametrize(("case", "policy", "budget", "arena"), CONTIGUOUS)
def test_contiguous_runs_per_kv_cache_group_agree_step_for_step(
    tmp_path: Path, case: str, policy: str, budget: str, arena: str
) -> None:
    """vLLM's own managers inside one run per group per request (a sliding group's a ring):
    the same steps, requests and group rows as the simulator's ``GroupedContiguousPolicy``."""
    sim, vllm = run_hybrid_case(tmp_path, case, WORKLOAD, policy, budget, arena)
    steps, requests = assert_agree(tmp_path, sim, vllm)
    assert sim["preemptions"] == 0 and sim["peak_running"] > 1  # whole reservations: growth never fails
    assert (steps["waiting"] > 0).sum() > 100 and steps["external_frag_positions"].max() > 0  # admission held back
    ga = assert_groups_agree(tmp_path, sim, vllm, steps)
    assert requests["kv_block_runs"].between(1, sim["kv_groups"].count("|") + 1).all()
    if "sliding" in sim["kv_groups"] and sim["hybrid_kv"]:  # a ring bounded by the window, not the sequence
        ring = ga[ga["kind"] == "sliding"]["allocated_blocks"].max()
        assert ring < ga[ga["kind"] == "full"]["allocated_blocks"].max()


def assert_groups_agree(tmp_path: Path, sim: dict, vllm: dict, steps: pd.DataFrame) -> pd.DataFrame:
    """Both runs' ``kv_groups`` rows identical, a row per step and group, summing to the step's
    blocks in use (no block is shared without caching); the simulator's rows."""
    assert sim["hybrid_kv"] == vllm["hybrid_kv"] and sim["kv_groups"] == vllm["kv_groups"]
    groups = store.read_table(tmp_path, "kv_groups", {sim["run_id"], vllm["run_id"]})

    def table(run_id: str) -> pd.DataFrame:
        t = groups[groups["run_id"] == run_id].drop(columns=["run_id"])
        return t.sort_values(["step", "group"]).reset_index(drop=True)

    ga, gb = table(sim["run_id"]), table(vllm["run_id"])
    assert len(ga) == len(steps) * sim["kv_groups"].count("|") + len(steps)
    pd.testing.assert_frame_equal(ga, gb)
    per_step = ga.groupby("step")["allocated_blocks"].sum().to_numpy()
    assert (per_step == steps.sort_values("step")["allocated_blocks"].to_numpy()).all()
    return ga
