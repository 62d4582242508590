"""Property tests: random admit / grow / free / preempt sequences against every policy."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvbench.harness.policies.contiguous import ContiguousMax, ContiguousOracle, ContiguousPow2, ContiguousPolicy
from kvbench.harness.policies.paged import PagedPolicy, PagedPrefixPolicy, VirtualContiguousPolicy
from kvbench.harness.sequence import Seq

BUDGET = 600
MAX_LEN = 160


def make(name: str, block_size: int):
    return {
        "contiguous-max": lambda: ContiguousMax(BUDGET, MAX_LEN),
        "contiguous-pow2": lambda: ContiguousPow2(BUDGET, MAX_LEN),
        "contiguous-oracle": lambda: ContiguousOracle(BUDGET, MAX_LEN),
        "paged": lambda: PagedPolicy(BUDGET, block_size),
        "paged-prefix": lambda: PagedPrefixPolicy(BUDGET, block_size),
        "virtual-contiguous": lambda: VirtualContiguousPolicy(BUDGET, block_size),
    }[name]()


seq_strategy = st.tuples(
    st.integers(1, 100),  # prompt
    st.integers(1, 59),  # output (prompt + output ≤ MAX_LEN)
    st.integers(-1, 1),  # prefix group
    st.integers(0, 3),  # request id (samples of one request share a prompt)
)
op_strategy = st.tuples(st.sampled_from(["admit", "grow", "free"]), st.integers(0, 11), st.integers(1, 64))


def check(policy, live: list[Seq]) -> None:
    assert policy.allocated_positions + (policy.budget_positions - policy.allocated_positions) == policy.budget_positions
    assert 0 <= policy.allocated_positions <= policy.budget_positions
    if isinstance(policy, ContiguousPolicy):
        ranges = sorted((s.alloc_start, s.allocated) for s in live if s.allocated)
        ranges += policy.arena.free_ranges()
        ranges.sort()
        pos = 0
        for start, length in ranges:  # live ranges and free ranges tile the arena exactly
            assert start == pos and length > 0
            pos += length
        assert pos == policy.budget_positions
        assert policy.allocated_positions == sum(s.allocated for s in live)
        return
    refs: dict[int, int] = {}
    for s in live:
        assert len(set(s.blocks)) == len(s.blocks)  # a sequence never maps one block twice
        for b in s.blocks:
            refs[b] = refs.get(b, 0) + 1
    for b in range(policy.num_blocks):
        r = policy.ref.get(b, 0)
        assert r >= 0
        assert r == refs.get(b, 0)  # ref counts = live holders
        assert policy.is_free(b) == (r == 0)  # no block free while referenced
    assert policy.allocated_positions == len(refs) * policy.block_size  # shared blocks counted once
    assert policy.shared_excess_positions == sum(r - 1 for r in refs.values()) * policy.block_size


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy_name=st.sampled_from(["contiguous-max", "contiguous-pow2", "contiguous-oracle", "paged",
                                    "paged-prefix", "virtual-contiguous"]),
       block_size=st.sampled_from([1, 4, 16]),
       specs=st.lists(seq_strategy, min_size=1, max_size=12),
       ops=st.lists(op_strategy, max_size=80))
def test_random_operations_keep_every_invariant(policy_name, block_size, specs, ops):
    policy = make(policy_name, block_size)
    seqs = []
    for i, (p, o, g, rid) in enumerate(specs):
        prefix_len = min(48, p - 1) if g >= 0 and p > 1 else 0
        seqs.append(Seq(i, rid * 100 + i if g < 0 else rid, 0, p, o, 0.0, g if prefix_len else -1, prefix_len))
    live: list[Seq] = []
    for op, idx, amount in ops:
        seq = seqs[idx % len(seqs)]
        if op == "admit" and seq not in live:
            hit = policy.prefix_hit(seq)
            assert hit % max(policy.block_size, 1) == 0 and hit < seq.num_tokens
            n = min(amount, seq.num_tokens - hit)
            if policy.allocate(seq, hit + n, must_fit=seq.num_tokens):
                live.append(seq)
                _write(policy, seq, hit, hit + n)
        elif op == "grow" and seq in live:
            if seq.num_computed == seq.num_tokens:
                if seq.num_output + 1 >= seq.output_len:
                    continue  # would finish: a finished sequence is freed by "free"
                seq.num_output += 1
            n = min(amount, seq.num_tokens - seq.num_computed)
            before = seq.num_computed
            if policy.allocate(seq, before + n):
                _write(policy, seq, before, before + n)
        elif op == "free" and seq in live:  # finish or preempt: both release everything
            policy.free(seq)
            live.remove(seq)
            seq.num_computed = 0
        check(policy, live)
    for seq in list(live):
        policy.free(seq)
        live.remove(seq)
    check(policy, live)
    assert policy.allocated_positions == 0 and policy.internal_positions == 0


def _write(policy, seq: Seq, start: int, end: int) -> None:
    """Computing K/V for positions [start, end): never into a block another sequence reads."""
    assert seq.allocated >= end
    if isinstance(policy, PagedPolicy):
        for pos in range(start, end):
            assert policy.writable(seq, pos), (seq, pos)
    seq.num_computed = end
