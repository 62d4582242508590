"""The contiguous policies' reservation per KV cache group (``contiguous.group_blocks``,
``place_runs``) and ``GroupedContiguousPolicy``'s accounting, on real config.json layouts."""

from __future__ import annotations

from kvbench.harness.sim.policies.arena import Arena, BuddyArena
from kvbench.harness.sim.policies.contiguous import RESERVATIONS, group_blocks, place_runs
from kvbench.harness.sim.policies.grouped_contiguous import GroupedContiguousPolicy
from kvbench.harness.sim.sequence import Seq
from kvbench.harness.spec.geometry import from_config_json
from kvbench.harness.spec.kv_layout import kv_layout
from kvbench.harness.spec.kv_use import KVUse

from tests.conftest import DATA

MODELS = DATA / "models"


def layout(model: str, hybrid: bool = True, max_model_len: int = 4096):
    g = from_config_json(MODELS / model / "config.json")
    return g, kv_layout(g, "bf16", 16, max_model_len=max_model_len, hybrid=hybrid, max_num_batched_tokens=512)


def test_full_groups_take_the_reservation_and_sliding_groups_their_window() -> None:
    _, on = layout("gpt-oss-20b")
    assert [g.kind for g in on.groups] == ["sliding", "full"]
    # Sliding window 128, 512 tokens per step: vLLM's cap ⌈(127 + 512) ÷ 16⌉ + 1 = 41 blocks.
    assert on.groups[0].admission_blocks == 41
    assert group_blocks(on.groups, 4096) == (41, 256)  # contiguous-max at max_model_len 4096
    assert group_blocks(on.groups, 300) == (19, 19)  # fewer than the window's bound where R needs fewer
    # The hybrid manager off: one group, every layer sized as full attention: the plain rule.
    _, off = layout("gpt-oss-20b", hybrid=False)
    assert len(off.groups) == 1 and group_blocks(off.groups, 300) == (19,)


def test_a_state_group_reserves_one_block_and_mla_its_latent_blocks() -> None:
    _, state = layout("tiny-qwen3next")
    kinds = [g.kind for g in state.groups]
    blocks = group_blocks(state.groups, RESERVATIONS["contiguous-max"](100, 50, 4096))
    assert [n for k, n in zip(kinds, blocks) if k != "full"] == [1] * (len(kinds) - 1)
    attention = next(g for g in state.groups if g.kind == "full")
    assert blocks[kinds.index("full")] == -(-4096 // attention.block_size)
    _, mla = layout("tiny-dsv2")
    assert [g.kind for g in mla.groups] == ["mla"] and group_blocks(mla.groups, 150) == (10,)


def test_runs_are_placed_whole_or_not_at_all() -> None:
    arena = Arena(100)
    assert place_runs(arena, [60, 30]) == [(0, 60), (60, 30)]
    assert place_runs(arena, [5, 20]) is None  # the 5 would fit, the 20 not: nothing kept
    assert arena.free_ranges() == [(90, 10)]
    buddy = BuddyArena(128)
    assert place_runs(buddy, [33, 9]) == [(0, 64), (64, 16)]  # each run rounded to its power of two


def test_the_policy_holds_whole_runs_and_counts_the_rest_as_reserved_or_external() -> None:
    g, lay = layout("gpt-oss-20b")
    budget = 300 * lay.bytes_per_block  # 299 usable block ids (one is vLLM's null block)
    use = KVUse.build(g, lay, "bf16", budget, g.kv_bytes_per_token("bf16"))
    policy = GroupedContiguousPolicy(use, 4096, "contiguous-oracle")
    a, b, c = (Seq(i, i, 0, 1000, 500, 0.0) for i in range(3))  # R = 1500: 41 + 94 blocks each
    assert policy.allocate(a, 256) and policy.allocate(b, 256)
    assert policy.allocated_blocks() == 2 * (41 + 94) and a.block_runs == 1  # a's two runs adjoin
    assert not policy.can_allocate(c, 256) and not policy.allocate(c, 256)  # 29 blocks free
    assert policy.allocated_blocks() == 270
    # While c waits: the budget no block covers, plus the free blocks no run of c fits in.
    free_blocks = use.usable_blocks - 270
    assert free_blocks < 41
    expected = policy.budget_positions - use.usable_positions + use.positions(free_blocks)
    assert policy.external_frag(c) == expected
    a.num_computed = 256
    used, internal = policy.measure_use()
    assert used > 0 and policy.last_groups[0][0] == 41 * 2 and policy.last_groups[1][0] == 94 * 2
    policy.free(a)
    assert policy.allocate(c, 256) and c.first_block == 0  # a's runs, reused by first-fit
