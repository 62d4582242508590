"""``GroupedPrefixPolicy``'s running totals are ``measure_shared``'s plain walk, step for step.

The policy keeps the step measures of prefix caching over KV cache groups as running totals
(``SharedTotals``); ``measure_shared`` walks every block of every request (what the vLLM runners
call). Both must give the same (used, internal) and the same per-group (blocks, used bytes) after
every step: under seeded random operations (shared prefixes, parallel samples, chunks, stalls,
preemptions and re-admissions, a pool small enough to evict) on every layout the policy takes,
and on the hybrid prefix-caching agreement workloads run by the reference scheduler. The
random operations also check that a lookup the policy remembers for a waiting request is what
a fresh lookup finds.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from kvbench.app.suite import parse_suite
from kvbench.app.sweep import build_cells
from kvbench.harness.sim.policies.grouped_prefix import GroupedPrefixPolicy
from kvbench.harness.sim.sequence import Seq
from kvbench.harness.spec.kv_shared_use import measure_shared
from kvbench.runners.sim import SimRunner

from tests.sim.test_fast_path_hybrid import _variant

LAYOUTS = ("gpt-oss-hybrid-on", "gpt-oss-hybrid-off", "gemma3-hybrid-on", "gemma3-hybrid-off", "mla")
MAX_LEN = 1024


def _plain(policy: GroupedPrefixPolicy) -> tuple[tuple[int, int], list[tuple[int, int]]]:
    """``measure_use`` and ``last_groups`` by the plain walk over the policy's tables."""
    requests = [(s.num_computed, s.final_len, policy.tables[i]) for i, s in policy.live.items()]
    used, internal, groups = measure_shared(policy.use, requests)
    return (used // policy.use.unit, internal // policy.use.unit), groups


def _seq(index: int, rng: np.random.Generator, families: list[list[int]]) -> Seq:
    """A request whose prompt starts with one of ``families``' shared blocks (or none)."""
    prompt = int(rng.integers(1, 500))
    seq = Seq(index, index, 0, prompt, int(rng.integers(1, MAX_LEN - prompt)), 0.0)
    family = families[int(rng.integers(0, len(families)))]
    shared = family[: int(rng.integers(0, len(family) + 1))]
    seq.block_keys = shared + [10**6 * (index + 1) + i for i in range(len(shared), MAX_LEN // 16 + 1)]
    return seq


def _step(policy: GroupedPrefixPolicy, seq: Seq, n: int) -> bool:
    """``seq`` computes ``n`` more tokens (its samples as it passes its prompt)."""
    target = min(seq.num_computed + n, seq.final_len - 1, MAX_LEN)
    if not policy.allocate(seq, target):
        return False
    seq.num_computed = target
    seq.num_output = max(seq.num_output, target - seq.prompt_len + 1)
    return True


def _admit(policy: GroupedPrefixPolicy, seq: Seq, rng: np.random.Generator) -> bool:
    """The scheduler's admission: the lookup (a remembered one is a fresh one's answer), then a
    chunk from the hit with vLLM's gate (a remembered refusal is a fresh one's answer). A
    request that does not fit stays waiting, or leaves."""
    seq.num_computed = 0
    hit = policy.prefix_hit(seq)
    assert policy.lookups[seq.index][2:] == policy._lookup(seq)[2:]
    target = hit + min(seq.num_tokens - hit, 1 + seq.index % 256)  # the same chunk when asked again
    if not policy.allocate(seq, target, must_fit=min(seq.num_tokens, MAX_LEN)):
        policy.refused.clear()
        assert not policy.allocate(seq, target, must_fit=min(seq.num_tokens, MAX_LEN))
        if rng.random() < 0.3:
            policy.free(seq)
        return False
    seq.num_computed = target
    return True


@pytest.mark.parametrize("seed", range(3))
def test_running_totals_are_the_plain_walk_under_random_operations(tmp_path: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for case in LAYOUTS:
        text = _variant(case, 0, tmp_path, budget="1GiB")
        (cell,) = build_cells(parse_suite(text, "p.toml"), tmp_path / case, lambda m: None)
        use = cell.spec.kv_use
        for fill in (0.03, 0.15):  # a pool that preempts and evicts often, and one that rarely does
            policy = GroupedPrefixPolicy(use, MAX_LEN)
            policy.num_blocks = policy._free = max(8, int(use.usable_blocks * fill))
            families = [[1000 * f + i for i in range(int(rng.integers(2, 20)))] for f in range(3)]
            live: list[Seq] = []
            waiting: list[Seq] = []
            for step in range(250):
                for seq in list(live):
                    u = rng.random()
                    if u < 0.05 or seq.num_computed >= seq.final_len - 1:  # finished or preempted
                        policy.free(seq)
                        live.remove(seq)
                        if u < 0.025:
                            waiting.append(seq)  # preempted: re-admitted from scratch
                        continue
                    if u < 0.1:
                        continue  # a short budget left it out of this step
                    if not _step(policy, seq, int(rng.integers(2, 60)) if u < 0.2 else 1):
                        policy.free(seq)
                        live.remove(seq)
                for k in range(int(rng.integers(0, 3))):
                    if waiting and rng.random() < 0.7:
                        seq = waiting.pop(0)  # the head of the queue, looked up again
                    else:
                        seq = _seq(step * 4 + k, rng, families)
                        if rng.random() < 0.3 and live:  # a parallel sample: a running request's prompt
                            twin = live[int(rng.integers(0, len(live)))]
                            seq.prompt_len = min(twin.prompt_len, seq.final_len - 1)
                            seq.block_keys = list(twin.block_keys)
                    if _admit(policy, seq, rng):
                        live.append(seq)
                    else:
                        waiting.insert(0, seq)
                assert (policy.measure_use(), policy.last_groups) == _plain(policy), (case, fill, step)
            for seq in live:
                policy.free(seq)
            assert policy.measure_use() == (0, 0) and policy.last_groups == [(0, 0)] * len(use.groups), case


PREFIX_WORKLOAD = {"n": 2, "prefix_groups": 4, "prefix_len": 192}


@pytest.mark.parametrize("case", LAYOUTS)
def test_running_totals_are_the_plain_walk_on_the_agreement_workloads(
    tmp_path: Path, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reference scheduler's runs of the prefix agreement workload (its budget preempts
    and evicts), every step's measure checked against the plain walk."""
    measure = GroupedPrefixPolicy.measure_use
    checked = []

    def checking(policy: GroupedPrefixPolicy) -> tuple[int, int]:
        out = measure(policy)
        assert (out, policy.last_groups) == _plain(policy), (case, len(checked))
        checked.append(out)
        return out

    monkeypatch.setattr(GroupedPrefixPolicy, "measure_use", checking)
    text = _variant(case, 1, tmp_path).replace('policy = ["paged"]', 'policy = ["paged-prefix"]')
    text = text.replace("[workload]\n", "[workload]\n" + "".join(f"{k} = {v}\n" for k, v in PREFIX_WORKLOAD.items()))
    (cell,) = build_cells(parse_suite(text, "p.toml"), tmp_path / "out", lambda m: None)
    row = SimRunner(reference=True).run(cell).row
    assert row["status"] == "ok", row["error"]
    assert len(checked) == row["steps"] and row["preemptions"] > 0 and row["prefix_hit_rate"] > 0
