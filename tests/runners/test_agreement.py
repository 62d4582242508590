"""sim against vLLM's own scheduler: step-for-step agreement on the same work.

The point of the simulator is to stand in for vLLM in large sweeps, so on the
same workload, precision and budget ``sim``/``paged`` and ``vllm-sched``/
``paged`` must produce the same number of steps, the same preemptions per
request, and the same allocated blocks, running and waiting counts on every
step. These cases assert more than that: every measured step column and the
whole requests table are identical. ``paged-prefix`` agrees exactly too at
block size 16 (see ``test_paged_prefix_agrees``), and so does every contiguous policy in
both arenas, reserved in whole blocks inside vLLM (``runners.vllm.contiguous``): the requests
table then also holds each reservation's first block and how many runs of consecutive block
ids vLLM really held (one, for every request).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("vllm")


from tests.agreekit import assert_agree, run_pair  # noqa: E402
from tests.conftest import DATA, ROOT  # noqa: E402

REUSE_COLUMNS = tuple(f"reuse_distance_{q}_{u}" for q in ("p50", "p90") for u in ("steps", "s"))
MOONCAKE = ROOT / "suites" / "data" / "mooncake-reuse.jsonl"
AZURE_SLICE = DATA / "azure-conv-slice.csv"


# Llama-3-8B at fp16: 128 KiB per token, so 1 GiB = 8,192 positions = 512 blocks of 16.
CASES: dict[str, dict[str, object]] = {
    "fixed-batch": dict(
        workload='source = "fixed"\nprompt_len = 200\noutput_len = 150\nnum_requests = 150\narrival = "batch"',
        budget="1GiB",
        max_num_seqs=64,
        max_num_batched_tokens=2048,
    ),
    "lognormal-poisson-roofline": dict(
        workload='source = "lognormal"\nprompt_mean = 250.0\noutput_mean = 120.0\nnum_requests = 150\n'
        'arrival = "poisson"\nrate = 30.0\nseed = 4',
        budget="1GiB",
        max_num_seqs=64,
        max_num_batched_tokens=512,
        clock="roofline",
    ),
    "azure-trace-slice": dict(
        workload=f'source = "trace"\npath = "{AZURE_SLICE}"\nlimit = 200\narrival = "trace"\ntime_scale = 0.02',
        budget="2GiB",
        max_num_seqs=128,
        max_num_batched_tokens=1024,
        clock="roofline",
    ),
    "tight-preempting": dict(
        workload='source = "lognormal"\nprompt_mean = 300.0\noutput_mean = 200.0\nnum_requests = 80\n'
        'arrival = "batch"\nseed = 5',
        budget="256MiB",
        max_num_seqs=32,
        max_num_batched_tokens=512,
        block_size=8,
    ),
    "chunked-prefill": dict(
        workload='source = "uniform"\nprompt_min = 100\nprompt_max = 700\noutput_min = 1\noutput_max = 100\n'
        'num_requests = 60\narrival = "batch"\nseed = 6',
        budget="256MiB",
        max_num_seqs=16,
        max_num_batched_tokens=32,
        block_size=32,
    ),
    "samples-and-prefix-groups": dict(
        workload='source = "uniform"\nprompt_min = 16\nprompt_max = 400\noutput_min = 1\noutput_max = 200\n'
        'num_requests = 60\nn = 3\nprefix_groups = 4\nprefix_len = 64\narrival = "batch"\nseed = 2',
        budget="512MiB",
        max_num_seqs=48,
        max_num_batched_tokens=256,
    ),
    "at-max-model-len": dict(
        workload='source = "fixed"\nprompt_len = 199\noutput_len = 57\nnum_requests = 40\nn = 2\n'
        'arrival = "batch"\nseed = 7',
        preset="tiny",
        budget="240KiB",
        max_model_len=256,
        max_num_seqs=16,
        max_num_batched_tokens=128,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_paged_agrees_step_for_step(tmp_path: Path, case: str) -> None:
    kw = dict(CASES[case])
    sim, vllm = run_pair(tmp_path, **kw)
    steps, reqs = assert_agree(tmp_path, sim, vllm)
    assert len(steps) > 50
    if case in ("tight-preempting", "fixed-batch", "chunked-prefill", "at-max-model-len"):
        assert sim["preemptions"] > 0  # the interesting regime is really exercised
    if case == "chunked-prefill":
        assert steps["scheduled_tokens"].max() == 32
        assert (reqs["prompt_len"] > 32).all()  # every prefill took several steps
    if case == "at-max-model-len":  # every sequence ends exactly at max_model_len
        assert ((reqs["prompt_len"] + reqs["output_len"]) == 256).all()


def test_paged_prefix_agrees(tmp_path: Path) -> None:
    """Prefix caching (hash-keyed full blocks, LRU eviction, ref counts) agrees exactly at block size 16,
    with shared prefixes, parallel samples and preemptions (a preempted request re-hits its own blocks)."""
    kw = dict(CASES["samples-and-prefix-groups"], policy="paged-prefix", budget="256MiB")
    sim, vllm = run_pair(tmp_path, **kw)
    steps, _ = assert_agree(tmp_path, sim, vllm)
    assert steps["prefix_hit_tokens"].sum() > 0 and steps["evicted_blocks"].sum() > 0
    assert steps["recomputed_hit_tokens"].sum() > 0 and steps["cached_free_blocks"].max() > 0
    assert sim["preemptions"] > 0
    for key in ("prefix_hit_rate", "recomputed_hit_tokens", *REUSE_COLUMNS):
        assert sim[key] == vllm[key], key
    assert sim["reuse_distance_p90_steps"] >= sim["reuse_distance_p50_steps"] > 0


def test_paged_prefix_shares_blocks_whose_tokens_coincide(tmp_path: Path) -> None:
    """Content, not identity: different random prompts (no prefix groups, one sample each) from
    the ``tiny`` preset's 256-token vocabulary coincide on whole blocks of one token; vLLM's
    hashes share those blocks, and so does kvbench's prefix cache, step for step."""
    kw = dict(
        CASES["at-max-model-len"],
        workload='source = "uniform"\nprompt_min = 8\nprompt_max = 120\noutput_min = 1\noutput_max = 60\n'
        'num_requests = 80\narrival = "batch"\nseed = 11',
        budget="512KiB",
        block_size=1,
        policy="paged-prefix",
    )
    sim, vllm = run_pair(tmp_path, **kw)
    steps, reqs = assert_agree(tmp_path, sim, vllm)
    assert (reqs["prefix_hit_tokens"] > 0).sum() >= 5  # first admissions hitting other requests' blocks
    assert steps["evicted_blocks"].sum() > 0


def test_paged_prefix_agrees_on_a_hash_id_trace(tmp_path: Path) -> None:
    """A Mooncake-form trace (hash ids of 512-token blocks, heavy reuse, no declared groups) under
    memory pressure: cached blocks are hit across requests, evicted, and hit again."""
    kw = dict(
        workload=f'source = "trace"\npath = "{MOONCAKE}"\nlimit = 60\nhash_block_size = 512\n'
        'arrival = "trace"\ntime_scale = 0.05',
        budget="1GiB",
        max_model_len=8192,
        max_num_seqs=32,
        max_num_batched_tokens=2048,
        policy="paged-prefix",
        clock="roofline",
    )
    sim, vllm = run_pair(tmp_path, **kw)
    steps, reqs = assert_agree(tmp_path, sim, vllm)
    for key in REUSE_COLUMNS:
        assert sim[key] == vllm[key], key
    assert sim["prefix_hit_rate"] > 0.3 and steps["evicted_blocks"].sum() > 0
    assert (reqs["prefix_hit_tokens"] > 0).sum() > len(reqs) // 2


@pytest.mark.parametrize("budget", ["2GiB", "96MiB"])
def test_paged_prefix_agrees_on_conversations(tmp_path: Path, budget: str) -> None:
    """Multi-turn conversations, each turn released when the previous answer ends (a closed loop
    on the run's clock): every turn's prompt holds the conversation so far, so its blocks hit
    the earlier turns' — unless memory pressure has evicted them (the smaller budget)."""
    kw = dict(
        workload='source = "sessions"\nnum_sessions = 12\nturns = 6\nthink_time_s = 0.5\nlengths = "uniform"\n'
        "prompt_min = 60\nprompt_max = 300\nmessage_min = 10\nmessage_max = 60\noutput_min = 10\n"
        'output_max = 80\narrival = "poisson"\nrate = 4.0\nseed = 3',
        budget=budget,
        max_num_seqs=16,
        max_num_batched_tokens=512,
        policy="paged-prefix",
    )
    sim, vllm = run_pair(tmp_path, **kw)
    steps, reqs = assert_agree(tmp_path, sim, vllm)
    for key in ("session_hit_rate_mean", "session_hit_rate_min", *REUSE_COLUMNS):
        assert sim[key] == vllm[key], key
    later = reqs[reqs["turn"] > 0]
    assert len(later) > 0 and reqs["session_id"].notna().all()
    if budget == "2GiB":
        assert (later["prefix_hit_tokens"] > 0).all()  # every later turn reuses its conversation
    else:
        assert steps["evicted_blocks"].sum() > 0


# Contiguous reservations: admission-limited work (a tight budget where a reservation
# refuses admission while paging would admit), chunked prefill (a 32-token step budget)
# and prompts that never chunk, and reservations wider than a block-table row (max_model_len
# 200 at block size 16: 13 entries; buddy rounds to 16 blocks).
CONTIGUOUS_CASES: dict[str, dict[str, object]] = {
    "tight-preempting": CASES["tight-preempting"],
    "chunked-prefill": CASES["chunked-prefill"],
    "fixed-batch": CASES["fixed-batch"],
    "beyond-table-width": dict(
        CASES["at-max-model-len"],
        workload='source = "uniform"\nprompt_min = 20\nprompt_max = 150\noutput_min = 1\noutput_max = 50\n'
        'num_requests = 40\nn = 2\narrival = "batch"\nseed = 7',
        max_model_len=200,
    ),
}
CONTIGUOUS = ("contiguous-max", "contiguous-pow2", "contiguous-oracle")


@pytest.mark.parametrize("arena", ["first-fit", "buddy"])
@pytest.mark.parametrize("policy", CONTIGUOUS)
@pytest.mark.parametrize("case", list(CONTIGUOUS_CASES))
def test_contiguous_agrees_step_for_step(tmp_path: Path, case: str, policy: str, arena: str) -> None:
    sim, vllm = run_pair(tmp_path, **dict(CONTIGUOUS_CASES[case], policy=policy, arena=arena))
    steps, reqs = assert_agree(tmp_path, sim, vllm)
    assert sim["preemptions"] == 0  # a whole reservation never runs short
    assert (reqs["kv_block_runs"] == 1).all()  # vLLM held one run of consecutive block ids per request
    assert reqs["kv_first_block"].notna().all()
    if case == "tight-preempting":  # admission-limited; reservations of several sizes leave holes
        assert steps["waiting"].max() > 0
        assert policy == "contiguous-max" or steps["external_frag_positions"].max() > 0
    if case == "beyond-table-width" and (arena == "buddy" or policy == "contiguous-max"):
        width = -(-200 // 16)
        assert (reqs["peak_allocated_positions"] // 16 >= width).any()


def test_contiguous_admits_fewer_than_paged_on_the_tight_budget(tmp_path: Path) -> None:
    """The regime the contiguous cases exercise: where vLLM's paged allocation admits more at once."""
    kw = CONTIGUOUS_CASES["tight-preempting"]
    contiguous, _ = run_pair(tmp_path / "c", **dict(kw, policy="contiguous-oracle"))
    paged, _ = run_pair(tmp_path / "p", **dict(kw, policy="paged"))
    assert paged["peak_running"] > contiguous["peak_running"]
