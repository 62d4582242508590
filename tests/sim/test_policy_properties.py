"""Property tests: random admit / grow / free / preempt sequences against every policy, and
random allocate / free sequences against the buddy arena."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kvbench.harness.sim.block_keys import BlockKeys
from kvbench.harness.sim.policies.arena import Arena, BuddyArena, top_blocks
from kvbench.harness.sim.policies.contiguous import ContiguousMax, ContiguousOracle, ContiguousPolicy, ContiguousPow2
from kvbench.harness.sim.policies.counting_prefix import CountingPrefixPolicy
from kvbench.harness.sim.policies.paged import (
    CountingPagedPolicy,
    PagedPolicy,
    PagedPrefixPolicy,
    VirtualContiguousPolicy,
)
from kvbench.harness.sim.policies.shared_prefix import SharedPrefixPolicy
from kvbench.harness.sim.sequence import Seq

BUDGET = 600
MAX_LEN = 160


def make(name: str, block_size: int, arena: str = "first-fit"):
    return {
        "contiguous-max": lambda: ContiguousMax(BUDGET, MAX_LEN, arena),
        "contiguous-pow2": lambda: ContiguousPow2(BUDGET, MAX_LEN, arena),
        "contiguous-oracle": lambda: ContiguousOracle(BUDGET, MAX_LEN, arena),
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
    assert (
        policy.allocated_positions + (policy.budget_positions - policy.allocated_positions) == policy.budget_positions
    )
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
        assert policy.allocated_positions + policy.arena.free_total == policy.budget_positions
        # What each request holds is what the arena took: its reservation, or the 2^k block around it.
        for s in live:
            assert s.allocated == policy.arena.footprint(policy.reservation(s)) >= policy.reservation(s)
        assert all(s.rounding == s.allocated - policy.reservation(s) for s in live)
        assert policy.internal_positions == sum(max(0, s.allocated - s.final_len) for s in live)
        if isinstance(policy.arena, BuddyArena):
            assert policy.arena.live_blocks() == sorted((s.alloc_start, s.allocated) for s in live)
        else:
            assert all(s.rounding == 0 for s in live)
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
@given(
    policy_name=st.sampled_from(
        ["contiguous-max", "contiguous-pow2", "contiguous-oracle", "paged", "paged-prefix", "virtual-contiguous"]
    ),
    block_size=st.sampled_from([1, 4, 16]),
    arena=st.sampled_from(["first-fit", "buddy"]),
    specs=st.lists(seq_strategy, min_size=1, max_size=12),
    ops=st.lists(op_strategy, max_size=80),
)
def test_random_operations_keep_every_invariant(policy_name, block_size, arena, specs, ops):
    policy = make(policy_name, block_size, arena)
    seqs = []
    for i, (p, o, g, rid) in enumerate(specs):
        prefix_len = min(48, p - 1) if g >= 0 and p > 1 else 0
        seqs.append(Seq(i, rid * 100 + i if g < 0 else rid, 0, p, o, 0.0, g if prefix_len else -1, prefix_len))
    keys = BlockKeys(policy.block_size)
    for seq in seqs:
        seq.block_keys = keys.chain(_tokens(seq))
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
    if isinstance(policy, ContiguousPolicy):
        whole = top_blocks(BUDGET) if arena == "buddy" else [(0, BUDGET)]
        assert policy.arena.free_ranges() == whole  # everything freed: coalesced back to the start


def _tokens(seq: Seq) -> np.ndarray:
    """Token ids with the workload's structure: a group's prefix, the request's prompt (shared by
    its samples), then the sequence's own output."""
    shared = seq.prefix_len if seq.prefix_group >= 0 else 0
    group = [(seq.prefix_group + 1) * 10_000 + j for j in range(shared)]
    prompt = [(seq.request_id + 1) * 1_000_000 + j for j in range(shared, seq.prompt_len)]
    output = [-(seq.index + 1) * 1_000 - j for j in range(seq.output_len)]
    return np.array(group + prompt + output, dtype=np.int64)


def _write(policy, seq: Seq, start: int, end: int) -> None:
    """Computing K/V for positions [start, end): never into a block another sequence reads."""
    assert seq.allocated >= end
    if isinstance(policy, PagedPolicy):
        for pos in range(start, end):
            assert policy.writable(seq, pos), (seq, pos)
    seq.num_computed = end


# Sequences that share nothing, on a budget that refuses and evicts or not.
UNSHARED_CASES = dict(
    block_size=st.sampled_from([1, 4, 16]),
    budget=st.sampled_from([96, 200, BUDGET]),
    swap=st.booleans(),
    specs=st.lists(st.tuples(st.integers(1, 100), st.integers(1, 59)), min_size=1, max_size=12),
    ops=st.lists(op_strategy, min_size=20, max_size=150),
)


def _unshared_twins(specs: list[tuple[int, int]]) -> list[list[Seq]]:
    return [[Seq(k, k, 0, p, o, 0.0) for k, (p, o) in enumerate(specs)] for _ in range(2)]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**UNSHARED_CASES)
def test_counting_prefix_caching_is_the_block_table_where_nothing_is_shared(block_size, budget, swap, specs, ops):
    """Prefix caching as counts (``CountingPrefixPolicy``) answers every call as the block table
    does — hits, fits, evictions, free blocks, internal fragmentation — on sequences that share
    nothing, driven as the scheduler drives them: a sequence is freed only between steps (its
    computed tokens short of its known ones), a preempted one is re-admitted on its cached
    blocks (recompute) or with its computed tokens (swap)."""
    twins = _unshared_twins(specs)
    _drive_twins(PagedPrefixPolicy(budget, block_size), CountingPrefixPolicy(budget, block_size), twins, swap, ops)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**UNSHARED_CASES)
def test_block_counts_are_the_block_table(block_size, budget, swap, specs, ops):
    """``paged`` as block counts (``CountingPagedPolicy``, the fast path's) answers every call as
    the block table does, its admission floor included."""
    twins = _unshared_twins(specs)
    _drive_twins(PagedPolicy(budget, block_size), CountingPagedPolicy(budget, block_size), twins, swap, ops)


# Sequences that share blocks (a group's prefix, a request's samples), on a budget that evicts or not.
SHARED_CASES = dict(
    block_size=st.sampled_from([1, 4, 16]),
    budget=st.sampled_from([96, 200, BUDGET]),
    swap=st.booleans(),
    specs=st.lists(seq_strategy, min_size=2, max_size=12),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**SHARED_CASES, ops=st.lists(op_strategy, min_size=20, max_size=300))
def test_shared_prefix_caching_is_the_block_table(block_size, budget, swap, specs, ops):
    """Prefix caching as counts and content keys (``SharedPrefixPolicy``) answers every call as
    the block table does on sequences that share blocks (a group's prefix, a request's samples):
    hits on blocks other sequences hold or freed, the LRU's evictions, shared positions, reuse
    distances, free and cached blocks, driven as the scheduler drives them."""
    twins = _shared_twins(specs)
    _drive_twins(PagedPrefixPolicy(budget, block_size), SharedPrefixPolicy(budget, block_size), twins, swap, ops)


def test_a_refused_head_asked_again_after_evictions_loses_the_evicted_hits():
    """A head refused for memory is asked for its hits again at each finish; blocks evicted in
    between (here by a decoder's growth) are no longer hits, as in the block table."""
    specs = [(40, 5, 0, 0), (80, 5, 0, 1), (56, 20, -1, 2)]  # 0 and 1 share 9 blocks of 4 tokens
    twins = [
        [
            Seq(i, rid if g >= 0 else rid * 100 + i, 0, p, o, 0.0, g, min(48, p - 1) if g >= 0 else 0)
            for i, (p, o, g, rid) in enumerate(specs)
        ]
        for _ in range(2)
    ]
    ops = [
        ("admit", 0, 40),
        ("free", 0, 1),
        ("admit", 2, 56),
        ("admit", 1, 80),
        *[("grow", 2, 1)] * 5,
        ("admit", 1, 80),
    ]
    table, counts = PagedPrefixPolicy(96, 4), SharedPrefixPolicy(96, 4)
    _drive_twins(table, counts, twins, False, ops)
    assert counts.evictions == 2 and counts.prefix_hit(twins[1][1]) == 8 * 4


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    **SHARED_CASES,
    ops=st.lists(
        st.tuples(st.sampled_from(["admit", "grow", "free", "take"]), st.integers(0, 11), st.integers(1, 64)),
        min_size=20,
        max_size=300,
    ),
)
def test_shared_prefix_chains_are_its_handles(block_size, budget, swap, specs, ops):
    """``CachedChains`` (runs and chains, while no content is cached twice) answers every call as
    ``CachedBlocks`` (a handle per block) does, the stretch's ``take`` of a decoder's blocks too,
    and so does the policy once it has moved from one to the other."""
    twins = _shared_twins(specs)
    handles, chains = SharedPrefixPolicy(budget, block_size), SharedPrefixPolicy(budget, block_size)
    handles._to_blocks()
    _drive_twins(handles, chains, twins, swap, ops)
    if chains.chains is not None:  # the LRU holds only runs with free blocks left, and all of them
        runs = chains.chains.lru
        assert all(run.live for run in runs) and sum(run.live for run in runs) == chains.cached_free_blocks()


def _shared_twins(specs) -> list[list[Seq]]:
    """Two copies of the sequences ``seq_strategy`` describes: a group's prefix, a request's samples."""
    twins = []
    for _ in range(2):
        seqs = []
        for i, (p, o, g, rid) in enumerate(specs):
            prefix_len = min(48, p - 1) if g >= 0 and p > 1 else 0
            seqs.append(Seq(i, rid * 100 + i if g < 0 else rid, 0, p, o, 0.0, g if prefix_len else -1, prefix_len))
        twins.append(seqs)
    return twins


def test_shared_prefixes_taken_in_turn_stay_in_chains():
    """Requests sharing a prefix, each admitted while the others run or after they freed it, with
    evictions between: no content is cached twice, so the policy keeps its chains and runs."""
    specs = [(40, 5, 0, 0), (80, 5, 0, 1), (40, 5, 0, 2), (30, 3, -1, 3)]  # 0, 1, 2 share 9 blocks of 4
    twins = _shared_twins(specs)
    ops = [
        ("admit", 0, 40),
        ("admit", 2, 40),  # its hits are held by 0
        ("free", 0, 1),
        ("admit", 3, 30),
        ("free", 2, 1),
        ("free", 3, 1),
        ("admit", 1, 80),  # hits in the LRU, evicting what 0, 2 and 3 computed past the prefix
        ("free", 1, 1),
        ("admit", 0, 40),
    ]
    table, counts = PagedPrefixPolicy(96, 4), SharedPrefixPolicy(96, 4)
    _drive_twins(table, counts, twins, False, ops)
    assert counts.chains is not None and counts.evictions > 0 and counts.ledger.steps


@pytest.mark.parametrize(
    "specs, ops",
    [
        # two requests computing one prefix at once, the first in chunks
        ([(40, 5, 0, 0), (80, 5, 0, 1), (40, 5, 0, 2)], [("admit", 0, 8), ("admit", 1, 80), ("grow", 0, 32)]),
        # two samples of one prompt of whole blocks: the second's hits stop a block short of it
        ([(40, 5, 0, 0), (40, 5, 0, 0), (40, 5, 0, 2)], [("admit", 0, 40), ("admit", 1, 40)]),
    ],
)
def test_content_cached_twice_moves_the_policy_to_handles(specs, ops):
    """Content cached twice moves the policy to ``CachedBlocks``, and it keeps answering as the
    block table."""
    twins = _shared_twins(specs)
    ops = [*ops, ("free", 1, 1), ("admit", 2, 40), ("free", 0, 1)]
    table, counts = PagedPrefixPolicy(BUDGET, 4), SharedPrefixPolicy(BUDGET, 4)
    _drive_twins(table, counts, twins, False, ops)
    assert counts.chains is None


def _drive_twins(table, counts, twins: list[list[Seq]], swap: bool, ops) -> None:
    """The same operations on ``table`` (the block table) and ``counts``, each on its own copy of
    the sequences: every answer and every total must agree."""
    keys = BlockKeys(table.block_size)
    for a, b in zip(*twins):
        a.block_keys = b.block_keys = keys.chain(_tokens(a))
    specs = twins[0]
    live: set[int] = set()
    done: set[int] = set()

    def both(call):
        a, b = call(table, twins[0]), call(counts, twins[1])
        assert a == b
        return a

    for op, idx, amount in ops:
        i = idx % len(specs)
        if i in done:
            continue
        if op == "admit" and i not in live:
            # Asked first whether it fits (a stretch's refused head, asked again at each finish), then admitted.
            _, fits = both(
                lambda pol, ss: (pol.prefix_hit(ss[i]), pol.can_allocate(ss[i], ss[i].num_tokens, ss[i].num_tokens))
            )
            # The counts' admission floor (a counted stretch's refusal without asking) never refuses
            # what the block table admits.
            if counts.admission_floor(twins[1][i], twins[1][i].num_tokens) > counts.free_blocks():
                assert not fits
            hit = both(lambda pol, ss: pol.prefix_hit(ss[i]))
            computed = twins[0][i].num_computed + hit
            n = min(amount, twins[0][i].num_tokens - computed)
            if both(lambda pol, ss: pol.allocate(ss[i], computed + n, must_fit=ss[i].num_tokens)):
                live.add(i)
                for ss in twins:
                    ss[i].num_computed = computed + n
        elif op == "grow" and i in live:
            if twins[0][i].num_computed == twins[0][i].num_tokens:
                if twins[0][i].num_output + 1 >= twins[0][i].output_len:
                    continue  # it would finish: a finished sequence is freed by "free"
                for ss in twins:
                    ss[i].num_output += 1  # the step samples a token
            n = min(amount, twins[0][i].num_tokens - twins[0][i].num_computed)
            if both(lambda pol, ss: pol.allocate(ss[i], ss[i].num_computed + n)):
                for ss in twins:
                    ss[i].num_computed += n
        elif op == "take" and i in live:  # a decoder's crossings in a stretch: the caller grows it
            n = min(amount, table.free_blocks())
            both(lambda pol, ss: pol.take(n))
            for ss in twins:
                ss[i].allocated += n * table.block_size
        elif op == "free" and i in live:
            if twins[0][i].num_computed == twins[0][i].num_tokens:  # the step ends: a token, or the end
                for ss in twins:
                    ss[i].num_output += 1
                if twins[0][i].num_output >= twins[0][i].output_len:
                    done.add(i)
            both(lambda pol, ss: pol.free(ss[i]))
            live.discard(i)
            if not swap:
                for ss in twins:
                    ss[i].num_computed = 0
        both(
            lambda pol, ss: (
                pol.free_blocks(),
                pol.cached_free_blocks(),
                pol.ledger.steps if hasattr(pol, "ledger") else [],  # no caching: no reuse distances
                pol.evictions,
                pol.internal_positions,
                pol.allocated_positions,
                pol.shared_excess_positions,
                [s.allocated for s in ss],
                # copy-on-write: which blocks of the running sequences others hold too
                [pol.writable(ss[j], pos) for j in sorted(live) for pos in range(0, ss[j].allocated, pol.block_size)],
            )
        )


# -- the buddy arena on its own --------------------------------------------------------------


def test_top_blocks_are_the_binary_decomposition_of_the_size() -> None:
    assert top_blocks(600) == [(0, 512), (512, 64), (576, 16), (592, 8)]
    assert top_blocks(1024) == [(0, 1024)] and top_blocks(1) == [(0, 1)] and top_blocks(0) == []
    for size in (3, 600, 2944, 15728, 2**20 - 1):
        blocks = top_blocks(size)
        assert sum(n for _, n in blocks) == size
        assert all(start % n == 0 for start, n in blocks)  # each aligned to its size: XOR finds buddies


def test_buddy_takes_the_smallest_block_and_coalesces() -> None:
    a = BuddyArena(600)
    assert a.footprint(100) == 128 and a.footprint(128) == 128 and a.footprint(1) == 1
    assert a.allocate(100) == 0  # 512 split: 0+128 taken, 128+128 and 256+256 free
    assert a.allocate(3) == 592  # the 8-block is the smallest that holds 4
    assert a.free_ranges() == [(128, 128), (256, 256), (512, 64), (576, 16), (596, 4)]
    assert a.free_total == 600 - 128 - 4 and a.largest_free() == 256
    assert a.free_smaller_than(100) == 64 + 16 + 4  # blocks under 128 cannot hold a 100-long request
    assert a.allocate(513) == -1  # no block of 1024 exists: the arena is not a power of two
    with pytest.raises(AssertionError):
        a.free(0, 64)  # the block at 0 is 128 long
    a.free(0, 100)
    a.free(592, 4)
    assert a.free_ranges() == top_blocks(600) and a.free_total == 600


arena_op = st.tuples(st.booleans(), st.integers(1, 300), st.integers(0, 10**6))


@settings(max_examples=200, deadline=None)
@given(size=st.integers(1, 2000), ops=st.lists(arena_op, max_size=120))
def test_buddy_arena_random_operations(size, ops) -> None:
    a = BuddyArena(size)
    live: dict[int, int] = {}  # start → requested length
    for is_alloc, length, pick in ops:
        if is_alloc or not live:
            largest = a.largest_free()
            start = a.allocate(length)
            assert (start >= 0) == (largest >= a.footprint(length))  # fails only when no block is big enough
            if start >= 0:
                assert start not in live and start % a.footprint(length) == 0
                live[start] = length
        else:
            start = sorted(live)[pick % len(live)]
            a.free(start, live.pop(start))
        taken = sorted((s, a.footprint(n)) for s, n in live.items())
        assert a.live_blocks() == taken
        for (s1, n1), (s2, _) in zip(taken, taken[1:]):
            assert s1 + n1 <= s2  # no two live blocks overlap
        tiles = sorted(taken + a.free_ranges())
        pos = 0
        for s, n in tiles:  # live and free blocks tile the arena exactly
            assert s == pos and n > 0 and n & (n - 1) == 0
            pos += n
        assert pos == size
        assert a.free_total + sum(n for _, n in taken) == size
        free = a.free_ranges()
        assert a.largest_free() == max((n for _, n in free), default=0)
        for probe in (1, 2, 7, 64, 100, 300):
            assert a.free_smaller_than(probe) == sum(n for _, n in free if n < a.footprint(probe))
        # Fully coalesced: no free block has its buddy free and whole (inside one top-level block).
        free_set = set(free)
        tops = set(top_blocks(size))
        for s, n in free:
            if (s, n) not in tops:
                assert (s ^ n, n) not in free_set
    for start in list(live):
        a.free(start, live.pop(start))
    assert a.free_ranges() == top_blocks(size) and a.free_total == size


def test_first_fit_and_buddy_share_one_interface() -> None:
    for cls in (Arena, BuddyArena):
        a = cls(100)
        start = a.allocate(10)
        assert start >= 0 and a.version > 0 and a.free_total == 100 - a.footprint(10)
        assert sum(n for _, n in a.free_ranges()) == a.free_total and a.largest_free() > 0
        assert a.free_smaller_than(1) == 0
        a.free(start, 10)
        assert a.free_total == 100
