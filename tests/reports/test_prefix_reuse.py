"""Prefix reuse as production has it: content-addressed blocks, conversations, and the records
that say how much of a hit rate is real (``sim``; ``tests/runners/test_agreement.py`` pins ``sim`` to
vLLM's scheduler on the same cases)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from kvbench.harness.records import store
from kvbench.harness.sim.block_keys import BlockKeys

from tests.conftest import assert_one_line_error, kvbench, one_workload_suite, run_suite_text

CONVERSATIONS = (
    'source = "sessions"\nnum_sessions = {sessions}\nturns = 8\nthink_time_s = 1.0\nlengths = "uniform"\n'
    "prompt_min = 100\nprompt_max = 300\nmessage_min = 20\nmessage_max = 80\noutput_min = 20\n"
    'output_max = 120\narrival = "poisson"\nrate = 2.0\nseed = 5'
)


def run_conversations(out: Path, budget: str, sessions: int) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    text = one_workload_suite(
        preset="llama-3-8b",
        max_model_len=4096,
        block_size=16,
        budget=budget,
        max_num_seqs=32,
        max_num_batched_tokens=512,
        runners='["sim"]',
        policy="paged-prefix",
        workload=CONVERSATIONS.format(sessions=sessions),
    )
    (row,), steps = run_suite_text(text, out)
    assert row["status"] == "ok", row["error"]
    reqs = store.read_table(out, "requests", {row["run_id"]}).sort_values(["session_id", "turn"])
    return row, steps[row["run_id"]], reqs.reset_index(drop=True)


def reusable(reqs: pd.DataFrame) -> pd.Series:
    """Per turn, the tokens its prompt shares with the conversation's previous turn (that turn's
    prompt and answer), whole blocks of 16 only: what a cache holding them would hit."""
    prev = reqs.groupby("session_id")["prompt_len"].shift(1) + reqs.groupby("session_id")["output_len"].shift(1)
    return (prev.fillna(0) // 16 * 16).astype(int)


def test_a_conversation_the_budget_holds_hits_more_every_turn(tmp_path: Path) -> None:
    row, steps, reqs = run_conversations(tmp_path, "4GiB", sessions=1)
    hits = reqs["prefix_hit_tokens"].to_numpy()
    assert len(reqs) == 8 and hits[0] == 0
    assert (np.diff(hits) > 0).all(), hits  # turn by turn, the conversation so far is reused
    # Every turn reuses everything the previous one left in whole blocks but the block holding
    # the previous answer's last token, whose K/V is never computed (and at least one of its
    # own tokens is always computed).
    assert ((reusable(reqs) - hits)[1:] <= 16).all()
    assert row["evictions"] == 0 and row["recomputed_hit_tokens"] == 0
    assert (
        row["session_hit_rate_mean"]
        == row["session_hit_rate_min"]
        == pytest.approx(hits.sum() / reqs["prompt_len"].sum())
    )
    assert row["reuse_distance_p50_steps"] > 0  # a turn's blocks waited in the free queue for the next


def test_conversations_the_budget_cannot_hold_are_recomputed_not_hit(tmp_path: Path) -> None:
    roomy, _, roomy_reqs = run_conversations(tmp_path / "roomy", "4GiB", sessions=12)
    tight, steps, reqs = run_conversations(tmp_path / "tight", "160MiB", sessions=12)
    assert tight["evictions"] > 0 and steps["evicted_blocks"].sum() == tight["evictions"]
    # Evicted turns are computed again: more computed tokens for the same work, fewer hits.
    assert tight["computed_tokens"] > roomy["computed_tokens"]
    assert reqs["prefix_hit_tokens"].sum() < roomy_reqs["prefix_hit_tokens"].sum()
    # A hit is only ever the conversation's own earlier tokens, never a recomputation after a
    # preemption (those are counted apart) …
    assert (reqs["prefix_hit_tokens"] <= reusable(reqs)).all()
    assert tight["preemptions"] > 0 and tight["recomputed_hit_tokens"] > 0
    assert reqs["recomputed_hit_tokens"].sum() == tight["recomputed_hit_tokens"] == steps["recomputed_hit_tokens"].sum()
    # … and the hit rate is first-admission hits over prompt tokens.
    assert tight["prefix_hit_rate"] == pytest.approx(reqs["prefix_hit_tokens"].sum() / reqs["prompt_len"].sum())
    assert tight["session_hit_rate_min"] <= tight["session_hit_rate_mean"] < roomy["session_hit_rate_mean"]


def test_a_turn_arrives_after_the_previous_answer_plus_think_time(tmp_path: Path) -> None:
    _, _, reqs = run_conversations(tmp_path, "4GiB", sessions=3)
    for _, conv in reqs.groupby("session_id"):
        conv = conv.sort_values("turn")
        gaps = conv["arrival_s"].to_numpy()[1:] - conv["finished_s"].to_numpy()[:-1]
        np.testing.assert_allclose(gaps, 1.0)  # think_time_s after the answer's last token


def test_block_keys_are_content_chained() -> None:
    keys = BlockKeys(2)
    a = keys.chain(np.array([5, 6, 7, 8, 9]))
    b = keys.chain(np.array([5, 6, 7, 9, 9]))
    c = keys.chain(np.array([1, 1, 7, 8]))
    assert len(a) == 2 and a[0] == b[0] and a[1] != b[1]  # equal tokens so far, equal key
    assert c[1] != a[1]  # the same block after a different prefix is different content
    assert keys.chain(np.array([5, 6, 7, 8])) == a and len(keys) == 5


@pytest.mark.parametrize("policy", ["paged-prefix", "paged"])
def test_a_hash_block_that_is_not_whole_cache_blocks_is_refused_for_prefix_caching(tmp_path: Path, policy: str) -> None:
    """Hash blocks of 24 tokens over cache blocks of 16: a cache block would straddle two hash
    ids, which is not the sharing the trace describes. Prefix caching refuses it (one line,
    nothing written); without prefix caching the hash ids only say what the prompts hold."""
    trace = tmp_path / "t.jsonl"
    rows = [
        {"timestamp": 0, "input_length": 40, "output_length": 5, "hash_ids": [1, 2]},
        {"timestamp": 10, "input_length": 30, "output_length": 5, "hash_ids": [1, 3]},
    ]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    suite = tmp_path / "s.toml"
    suite.write_text(
        one_workload_suite(
            preset="llama-3-8b",
            max_model_len=256,
            block_size=16,
            budget="64MiB",
            max_num_seqs=8,
            max_num_batched_tokens=256,
            runners='["sim"]',
            policy=policy,
            workload=f'source = "trace"\npath = "{trace}"\nhash_block_size = 24\narrival = "trace"',
        )
    )
    out = tmp_path / "out"
    proc = kvbench("run", str(suite), "--out", str(out), "--quiet", "--no-report")
    if policy == "paged":
        assert proc.returncode == 0, proc.stderr
        return
    assert_one_line_error(proc, "hash_block_size 24 is not a multiple of block_size 16")
    assert not out.exists() or not any(out.iterdir())
