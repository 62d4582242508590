"""The fast path over vLLM's KV cache groups is the reference scheduler, record for record.

Models whose layers are not all full attention run ``paged`` on the fast path with
``CountingGroupedPolicy``: byte-identical steps, requests and KV cache group tables to the
reference scheduler (``GroupedPagedPolicy``) on seeded variants of the hybrid agreement cases
(gpt-oss's 1:1 and Gemma-3's 5:1 sliding/full interleave with the hybrid manager on and off,
an MLA model, state layers of two kinds, Llama-4's chunked local attention), each under a
budget that preempts; the same for ``paged-prefix`` (``CountingGroupedPrefixPolicy`` against
``GroupedPrefixPolicy``) where requests share prompts and prefixes; and the counting policy against
``GroupedPagedPolicy`` under the same random operations, where it calls ``allocate`` only at the
acts it names (``reach``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from kvbench.app.suite import parse_suite
from kvbench.app.sweep import build_cells
from kvbench.harness.records import store
from kvbench.harness.sim.policies.counting_grouped import CountingGroupedPolicy
from kvbench.harness.sim.policies.grouped import GroupedPagedPolicy
from kvbench.harness.sim.sequence import Seq
from kvbench.runners.base import Cell
from kvbench.runners.sim import SimRunner

from tests.conftest import DATA, suite_toml


def config(path: Path) -> str:
    return f'config = "{path}"\n'


def chunked_config(where: Path) -> Path:
    """Llama-4 Scout's config with 8 layers and chunks of 96 tokens: chunk ends inside a short run."""
    text = json.loads((DATA / "models" / "llama-4-scout-17b-16e-instruct" / "config.json").read_text())
    text["text_config"].update(attention_chunk_size=96, num_hidden_layers=8)
    path = where / "llama-4-chunk96.json"
    path.write_text(json.dumps(text))
    return path


def model_lines(case: str, where: Path) -> str:
    name, extra, _ = CASES[case]
    if not name:
        return extra
    path = chunked_config(where) if name == "chunk96" else DATA / "models" / name / "config.json"
    return config(path) + extra


# (test data config or "chunk96" (``chunked_config``), other [model] lines, KV budget) per
# case; each budget preempts under the variants' workloads.
CASES: dict[str, tuple[str, str, str]] = {
    "gpt-oss-hybrid-on": ("", "hybrid_kv = true\n", "64MiB"),
    "gpt-oss-hybrid-off": ("", "hybrid_kv = false\n", "64MiB"),
    "gemma3-hybrid-on": ("tiny-gemma3", "hybrid_kv = true\n", "1MiB"),
    "gemma3-hybrid-off": ("tiny-gemma3", "hybrid_kv = false\n", "2MiB"),
    "mla": ("tiny-dsv2", "", "2500KiB"),
    "state-gdn": ("tiny-qwen3next", "", "1200KiB"),
    "state-mamba2": ("tiny-granite4h", "", "3MiB"),
    "chunked": ("chunk96", "", "30MiB"),
}


def _variant(case: str, seed: int, where: Path, budget: str | None = None, policy: str = "paged") -> str:
    rng = np.random.default_rng([seed, *case.encode()])
    prompt_min = int(rng.integers(20, 200))
    output_min = int(rng.integers(50, 250))
    poisson = bool(rng.integers(0, 2))
    workload = {
        "source": "uniform",
        "prompt_min": prompt_min,
        "prompt_max": prompt_min + int(rng.integers(0, 300)),
        "output_min": output_min,
        "output_max": output_min + int(rng.integers(0, 350)),
        "num_requests": int(rng.integers(20, 40)),
        "arrival": "poisson" if poisson else "batch",
        "rate": 40.0 if poisson else None,
        "seed": seed,
    }
    if policy == "paged-prefix":  # two samples a request, and prefixes shared between requests
        workload.update(n=2, prefix_groups=4, prefix_len=96)
    scheduler = {
        "max_num_seqs": int(rng.integers(8, 65)),
        "max_num_batched_tokens": int(rng.choice([128, 256, 512])),
        "preemption": "recompute",  # vLLM preempts KV cache groups by recompute only
        # The default clock, whose steps only count, and a clock that prices each step's work.
        "clock": "roofline" if seed == 3 else "steps",
    }
    return suite_toml(
        "fast-hybrid",
        # a case's config is its model (a preset beside it would be read by no cell); gpt-oss-20b otherwise
        model=("" if CASES[case][0] else 'preset = "gpt-oss-20b"\n') + 'kv_dtype = "bf16"\n' + model_lines(case, where),
        memory={"kv_budget": budget or CASES[case][2], "max_model_len": 1024},
        workload=workload,
        scheduler=scheduler,
        grid={"runner": ["sim"], "policy": [policy], "block_size": [16]},
    )


def _run_both(tmp_path: Path, text: str) -> tuple[dict, dict, Cell]:
    fast, ref = tmp_path / "fast", tmp_path / "ref"
    ref.mkdir()
    (cell,) = build_cells(parse_suite(text, "fast-hybrid.toml"), fast, lambda m: None)
    a = SimRunner().run(cell).row
    b = SimRunner(reference=True).run(Cell(spec=cell.spec, workload=cell.workload, out=ref)).row
    return a, b, cell


def _part(out: Path, table: str, run_id: str) -> bytes:
    return (store.partition_dir(out, table, run_id) / store.PART).read_bytes()


def _same_records(tmp_path: Path, case: str, policy: str) -> list[dict]:
    """The fast path and the reference on seeded variants of ``case``: byte-identical tables;
    the reference's run rows."""
    rows = []
    for seed in (1, 2, 3):
        (tmp_path / str(seed)).mkdir()
        text = _variant(case, seed, tmp_path / str(seed), policy=policy)
        a, b, cell = _run_both(tmp_path / str(seed), text)
        assert a["status"] == b["status"] == "ok", (a["error"], b["error"])
        for table in ("steps", "requests", "kv_groups"):
            fast = _part(tmp_path / str(seed) / "fast", table, cell.run_id)
            assert fast == _part(tmp_path / str(seed) / "ref", table, cell.run_id), (case, seed, table)
        rows.append(b)
    return rows


@pytest.mark.parametrize("case", list(CASES))
def test_fast_path_on_kv_cache_groups_is_the_reference_byte_for_byte(tmp_path: Path, case: str) -> None:
    rows = _same_records(tmp_path, case, "paged")
    assert sum(r["preemptions"] for r in rows) > 0  # the budget really preempts


PREFIX_CASES = ["gpt-oss-hybrid-on", "gpt-oss-hybrid-off", "gemma3-hybrid-on", "gemma3-hybrid-off", "mla"]


@pytest.mark.parametrize("case", PREFIX_CASES)
def test_fast_path_with_prefix_caching_on_kv_cache_groups_is_the_reference_byte_for_byte(
    tmp_path: Path, case: str
) -> None:
    """``paged-prefix`` over the groups (``CountingGroupedPrefixPolicy`` on the fast path against
    ``GroupedPrefixPolicy`` on the reference), where samples share a prompt and requests share
    prefixes: hits, evictions and preemptions (recompute: a request hits its own freed blocks)."""
    rows = _same_records(tmp_path, case, "paged-prefix")
    # The budget preempts, the cache evicts, and every variant hits.
    assert sum(r["preemptions"] for r in rows) > 0 and sum(r["evictions"] for r in rows) > 0
    assert all(r["prefix_hit_rate"] > 0.3 for r in rows)


def conversations(hybrid: bool, budget: str) -> str:
    """Multi-turn sessions of uniform lengths on gpt-oss-20b, ``paged-prefix`` on sim."""
    return suite_toml(
        "fast-hybrid-conversations",
        model={"preset": "gpt-oss-20b", "kv_dtype": "bf16", "hybrid_kv": hybrid},
        memory={"kv_budget": budget, "max_model_len": 2048},
        workload={
            "source": "sessions",
            "num_sessions": 24,
            "turns": 6,
            "think_time_s": 0.5,
            "lengths": "uniform",
            "prompt_min": 50,
            "prompt_max": 300,
            "message_min": 10,
            "message_max": 100,
            "output_min": 20,
            "output_max": 200,
            "arrival": "poisson",
            "rate": 4.0,
            "seed": 7,
        },
        scheduler={"max_num_seqs": 32, "max_num_batched_tokens": 256, "clock": "roofline"},
        grid={"runner": ["sim"], "policy": ["paged-prefix"], "block_size": [16]},
    )


@pytest.mark.parametrize(("hybrid", "budget"), [(True, "512MiB"), (False, "400MiB")])
def test_fast_path_with_prefix_caching_on_conversations_is_the_reference_byte_for_byte(
    tmp_path: Path, hybrid: bool, budget: str
) -> None:
    """Conversations over the groups: a turn arrives when the one before it finishes (inside a
    stretch) and hits that turn's blocks."""
    a, b, cell = _run_both(tmp_path, conversations(hybrid, budget))
    assert a["status"] == b["status"] == "ok", (a["error"], b["error"])
    for table in ("steps", "requests", "kv_groups"):
        assert _part(tmp_path / "fast", table, cell.run_id) == _part(tmp_path / "ref", table, cell.run_id), table
    assert b["evictions"] > 0 and b["prefix_hit_rate"] > 0.05


# -- the counting policy against the block tables, operation for operation -------------------


def _layouts(where: Path) -> list[tuple[str, Cell]]:
    out = []
    for case in (
        "gpt-oss-hybrid-on",
        "gemma3-hybrid-on",
        "gemma3-hybrid-off",
        "state-gdn",
        "state-mamba2",
        "chunked",
        "mla",
    ):
        text = _variant(case, 0, where, budget="1GiB")
        (cell,) = build_cells(parse_suite(text, "p.toml"), where / case, lambda m: None)
        out.append((case, cell))
    return out


def test_twin_groups_are_the_groups_of_one_arithmetic(tmp_path: Path) -> None:
    """Gemma-3's five sliding groups are one twin set, its full group another; state groups of
    one kind are twins, the full-attention group beside them is not."""
    twins = {
        case: [w.members for w in CountingGroupedPolicy(cell.spec.kv_use, 1024).twins]
        for case, cell in _layouts(tmp_path)
    }
    assert twins["gemma3-hybrid-on"] == [(0, 1, 2, 3, 4), (5,)]
    assert twins["gpt-oss-hybrid-on"] == [(0,), (1,)]
    assert twins["state-gdn"] == [(0, 1, 2), (3,)]
    assert twins["mla"] == [(0,)]


def _state(policy: GroupedPagedPolicy, seqs: list[Seq]) -> tuple[object, ...]:
    return (
        policy.allocated_blocks(),
        policy.allocated_positions,
        [(s.allocated, s.peak_allocated, s.group_tables) for s in seqs],
    )


@pytest.mark.parametrize("seed", range(4))
def test_counting_grouped_policy_is_the_block_tables_under_random_operations(tmp_path: Path, seed: int) -> None:
    """Each step every request holding blocks computes one token (the reference calls
    ``allocate``; the counting policy only at the acts it named, by ``act`` where
    ``acts_need`` says it fits), a chunk, or nothing (then ``resync``), or is freed; new
    requests are admitted with vLLM's gate. Every step's measures, group rows, free blocks
    and tables must agree."""
    rng = np.random.default_rng(seed)
    for case, cell in _layouts(tmp_path):
        use = cell.spec.kv_use
        for fill in (0.02, 0.1):  # a pool that preempts often, and one that rarely does
            budget_blocks = max(4, int(use.usable_blocks * fill))
            ref = GroupedPagedPolicy(use, 1024)
            cnt = CountingGroupedPolicy(use, 1024)
            ref.num_blocks = cnt.num_blocks = budget_blocks
            ref._free = cnt._free = budget_blocks
            twins: list[tuple[Seq, Seq]] = []
            live: list[tuple[Seq, Seq]] = []
            for step in range(300):
                stalled = False
                for r, c in list(live):
                    u = rng.random()
                    if u < 0.04:  # finished or preempted
                        ref.free(r)
                        cnt.free(c)
                        live.remove((r, c))
                        continue
                    if u < 0.08:
                        stalled = True  # a short budget left it out of this step
                        continue
                    n = int(rng.integers(2, 60)) if u < 0.15 else 1
                    target = min(r.num_computed + n, 1023)
                    free = cnt.free_blocks()
                    ok = ref.allocate(r, target)
                    if n == 1 and target > cnt.reach(c) and cnt.acts_need([c])[0] <= free:
                        net = cnt.acts_need([c])[1]
                        cnt.act(c)  # a decoder's act, known to fit, as a stretch takes it
                        assert ok and cnt.free_blocks() == free - net, (case, step)
                    elif n > 1 or target > cnt.reach(c):
                        assert ok == cnt.allocate(c, target), (case, step)
                    else:
                        assert ok, (case, step)  # between acts nothing is asked
                    if not ok:
                        ref.free(r)
                        cnt.free(c)
                        live.remove((r, c))
                        continue
                    r.num_computed = c.num_computed = target
                if rng.random() < 0.5:
                    i = len(twins)
                    prompt = int(rng.integers(1, 600))
                    output = int(rng.integers(1, 1024 - prompt))
                    r, c = Seq(i, i, 0, prompt, output, 0.0), Seq(i, i, 0, prompt, output, 0.0)
                    chunk = min(prompt, int(rng.integers(1, 257)))
                    ok = ref.allocate(r, chunk, must_fit=prompt)
                    assert ok == cnt.allocate(c, chunk, must_fit=prompt), (case, step)
                    if ok:
                        r.num_computed = c.num_computed = chunk
                        twins.append((r, c))
                        live.append((r, c))
                if stalled:
                    cnt.resync()
                assert ref.measure_use() == cnt.measure_use(), (case, step)
                assert ref.last_groups == cnt.last_groups, (case, step)
                assert _state(ref, [r for r, _ in live]) == _state(cnt, [c for _, c in live]), (case, step)


@pytest.mark.parametrize("seed", range(2))
def test_an_act_between_bends_is_the_act_that_draws_every_line(tmp_path: Path, seed: int) -> None:
    """Short of a bend ``act`` moves only blocks and internal bytes in the totals; ``_line``
    draws every line again. Decoders computing one token a step, each acting where its reach
    says, against the same acts each followed by ``_line``: the same reach, totals, free blocks
    and tables after every step, on every layout."""
    rng = np.random.default_rng(seed)
    for case, cell in _layouts(tmp_path):
        quick, drawn = CountingGroupedPolicy(cell.spec.kv_use, 1024), CountingGroupedPolicy(cell.spec.kv_use, 1024)
        pairs: list[tuple[Seq, Seq]] = []
        for i in range(12):
            prompt = int(rng.integers(1, 500))
            output = int(rng.integers(2, 1024 - prompt))
            a, b = Seq(i, i, 0, prompt, output, 0.0), Seq(i, i, 0, prompt, output, 0.0)
            assert quick.allocate(a, prompt) and drawn.allocate(b, prompt), case
            a.num_computed = b.num_computed = prompt
            pairs.append((a, b))
        acts = 0
        for step in range(1, 700):  # the lines were drawn for step 1
            quick.steps = drawn.steps = step
            for a, b in pairs:
                if a.num_computed >= a.final_len - 1:
                    continue  # finished
                if a.num_computed == quick.reach(a):  # the step computes past its reach: it acts
                    drawn.act(b)
                    assert quick.act(a) == drawn._line(b, b.num_computed + 1), (case, step)
                    acts += 1
                a.num_computed += 1
                b.num_computed += 1
            assert quick.totals() == drawn.totals(), (case, step)
            assert quick.free_blocks() == drawn.free_blocks(), (case, step)
            assert [(a.allocated, a.group_tables) for a, _ in pairs] == [
                (b.allocated, b.group_tables) for _, b in pairs
            ], (case, step)
        assert acts >= len(pairs), case  # each decoder acted
