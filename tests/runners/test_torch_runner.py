"""The torch runner: a real decoder over a contiguous arena and a paged block pool.

Tolerance: logits are compared in fp32 with atol 1e-4. The two caches hold
bit-identical K/V; what differs between runs is only the batch composition
of each step (policies schedule differently), which moves fp32 matmul
rounding by ~1e-6. Greedy tokens must be identical.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from kvbench.app.suite import parse_suite
from kvbench.app.sweep import build_cells, run_cell
from kvbench.harness.errors import KvbenchError
from kvbench.harness.records import store
from kvbench.harness.records.recorder import MEASURED_FIELDS
from kvbench.harness.sim.sequence import Seq
from kvbench.runners import get_runner
from kvbench.runners.base import Cell
from kvbench.runners.torch.kv import ContiguousKVCache, PagedKVCache
from kvbench.runners.torch.runner import TorchExecutor, check_fits, run_torch

from tests.conftest import suite_toml

ATOL = 1e-4  # fp32 logits, see the module docstring


def torch_suite(
    policies: list[str],
    runners: tuple[str, ...] = ("torch",),
    block_sizes: tuple[int, ...] = (16,),
    budget: str = "64KiB",
    kv_dtype: str = "fp32",
    num_requests: int = 16,
    groups: int = 0,
    prefix_len: int = 0,
    n: int = 1,
    preemption: str = "recompute",
    preset: str = "tiny",
) -> str:
    """Uniform requests on a small model, on the CPU."""
    workload = {
        "source": "uniform",
        "num_requests": num_requests,
        "prompt_min": 8,
        "prompt_max": 40,
        "output_min": 4,
        "output_max": 20,
        "prefix_groups": groups,
        "prefix_len": prefix_len,
        "n": n,
        "seed": 3,
    }
    return suite_toml(
        "torch-test",
        model={"preset": preset, "kv_dtype": kv_dtype},
        memory={"kv_budget": budget, "max_model_len": 128},
        workload=workload,
        scheduler={"max_num_seqs": 32, "max_num_batched_tokens": 96, "preemption": preemption},
        run={"device": "cpu"},
        grid={"runner": list(runners), "policy": policies, "block_size": list(block_sizes)},
    )


def make_cells(out: Path, policies: list[str], **settings: Any) -> list[Cell]:
    """The cells of ``torch_suite(policies, **settings)``, to be written under ``out``."""
    text = torch_suite(policies, **settings)
    return build_cells(parse_suite(text, str(out / "suite.toml")), out, lambda msg: None)


def by_key(cells: list[Cell]) -> dict[tuple[str, str, int], Cell]:
    return {(c.spec.runner, c.spec.policy, c.spec.block_size): c for c in cells}


def steps_of(out: Path, row: dict) -> pd.DataFrame:
    return store.read_table(out, "steps", {row["run_id"]}).sort_values("step").reset_index(drop=True)


def assert_same_generation(a: TorchExecutor, b: TorchExecutor) -> None:
    out_a, out_b = a.outputs(), b.outputs()
    assert out_a.keys() == out_b.keys()
    for key in out_a:
        assert out_a[key] == out_b[key], key
    la, lb = a.sampled_logits(), b.sampled_logits()
    for key in la:
        torch.testing.assert_close(la[key], lb[key], atol=ATOL, rtol=0)


# -- shared runs (one module-wide: the whole file must stay fast on two cores) ------


@pytest.fixture(scope="module")
def tight(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A budget of 128 positions: contiguous runs few at once, paged preempts (recompute)."""
    out = tmp_path_factory.mktemp("tight")
    policies = ["contiguous-max", "contiguous-pow2", "contiguous-oracle", "paged", "paged-prefix"]
    cells = by_key(make_cells(out, policies, runners=("torch", "sim"), block_sizes=(1, 4, 16)))
    runs = {}
    for key, cell in cells.items():
        if key[0] == "torch":
            result, ex = run_torch(cell, record_logits=True)
            row = result.to_row()
        else:
            row, ex = run_cell(cell), None
        runs[key] = (row, ex)
    return {"out": out, "runs": runs, "cells": cells}


@pytest.fixture(scope="module")
def shared_prefix(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Two prefix groups of 24 tokens and two samples a request."""
    out = tmp_path_factory.mktemp("prefix")
    cells = by_key(
        make_cells(
            out,
            ["contiguous-oracle", "paged-prefix"],
            block_sizes=(4, 16),
            budget="128KiB",
            num_requests=12,
            groups=2,
            prefix_len=24,
            n=2,
        )
    )
    runs = {}
    for key, cell in cells.items():
        result, ex = run_torch(cell, record_logits=True)
        runs[key] = (result.row, ex)
    return {"out": out, "runs": runs}


# -- correctness --------------------------------------------------------------------


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_paged_cache_generates_what_the_contiguous_cache_does(tight: dict, block_size: int) -> None:
    contiguous = tight["runs"][("torch", "contiguous-oracle", 1)]
    paged = tight["runs"][("torch", "paged", block_size)]
    assert contiguous[0]["status"] == paged[0]["status"] == "ok"
    assert_same_generation(contiguous[1], paged[1])
    # every sample produced all its tokens
    assert sum(map(len, paged[1].outputs().values())) == paged[0]["generated_tokens"]


def test_recompute_preemption_recomputes_prompt_and_generated_tokens(tight: dict) -> None:
    row, ex = tight["runs"][("torch", "paged", 16)]
    assert row["preemptions"] > 0  # the tight budget forces recompute preemptions
    assert_same_generation(tight["runs"][("torch", "contiguous-max", 1)][1], ex)


def test_every_policy_generates_the_same_tokens(tight: dict) -> None:
    ref = tight["runs"][("torch", "contiguous-oracle", 1)][1]
    for (runner, policy, bs), (row, ex) in tight["runs"].items():
        if runner == "torch":
            assert row["status"] == "ok", (policy, bs, row["error"])
            assert_same_generation(ref, ex)


@pytest.mark.parametrize("block_size", [4, 16])
def test_prefix_cache_hits_reuse_cached_kv(shared_prefix: dict, block_size: int) -> None:
    c_row, contiguous = shared_prefix["runs"][("torch", "contiguous-oracle", 1)]
    p_row, paged = shared_prefix["runs"][("torch", "paged-prefix", block_size)]
    assert p_row["prefix_hit_rate"] > 0.3
    assert p_row["computed_tokens"] < c_row["computed_tokens"]  # hits were read, not recomputed
    assert_same_generation(contiguous, paged)


def test_prompt_tokens_agree_with_the_policy_block_keys(shared_prefix: dict) -> None:
    """Group members share their prefix tokens; samples of a request share the prompt."""
    ex = shared_prefix["runs"][("torch", "paged-prefix", 16)][1]
    seqs = list(ex.seqs.values())
    prompt = {s.index: ex.tokens[s.index][: s.prompt_len] for s in seqs}
    for a in seqs:
        for b in seqs:
            if a.prefix_group == b.prefix_group >= 0:
                np.testing.assert_array_equal(prompt[a.index][: a.prefix_len], prompt[b.index][: b.prefix_len])
            if a.request_id == b.request_id:
                np.testing.assert_array_equal(prompt[a.index], prompt[b.index])
            elif a.prefix_group != b.prefix_group:
                assert not np.array_equal(prompt[a.index][:8], prompt[b.index][:8])


def test_cached_decoding_matches_the_model_without_a_cache(tight: dict, shared_prefix: dict) -> None:
    """Both caches against plain causal attention over the whole sequence (no cache at all)."""
    for ex in (
        tight["runs"][("torch", "contiguous-pow2", 1)][1],
        tight["runs"][("torch", "paged", 4)][1],
        shared_prefix["runs"][("torch", "paged-prefix", 16)][1],
    ):
        logits = ex.sampled_logits()
        for s in list(ex.seqs.values())[:4]:
            ids = ex.tokens[s.index][: ex.length[s.index]].tolist()
            ref = ex.model.reference_logits(ids[:-1])[s.prompt_len - 1 :]
            assert ref.argmax(-1).tolist() == ids[s.prompt_len :]
            torch.testing.assert_close(logits[(s.request_id, s.sample)], ref, atol=ATOL, rtol=0)


def test_swap_preemption_restores_kv(tmp_path: Path) -> None:
    cells = by_key(make_cells(tmp_path, ["contiguous-oracle", "paged"], preemption="swap"))
    c_run, contiguous = run_torch(cells[("torch", "contiguous-oracle", 1)], record_logits=True)
    p_run, paged = run_torch(cells[("torch", "paged", 16)], record_logits=True)
    assert p_run.row["preemptions"] > 0
    assert p_run.row["computed_tokens"] == c_run.row["computed_tokens"]  # swapped K/V is not recomputed
    assert_same_generation(contiguous, paged)


def test_batched_decode_agrees_with_per_sequence_attention(tmp_path: Path) -> None:
    cell = by_key(make_cells(tmp_path, ["paged"], num_requests=8))[("torch", "paged", 16)]
    _, batched = run_torch(cell, record_logits=True)
    _, per_seq = run_torch(cell, record_logits=True, batch_decode=False)
    assert_same_generation(batched, per_seq)


def test_token_ids_ignore_global_random_state(tmp_path: Path) -> None:
    cell = by_key(make_cells(tmp_path, ["paged"], num_requests=6))[("torch", "paged", 16)]
    _, first = run_torch(cell)
    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    torch.rand(7)
    _, second = run_torch(cell)
    assert first.outputs() == second.outputs()


@pytest.mark.parametrize("kv_dtype,element_bytes", [("bf16", 2), ("fp16", 2), ("fp8", 1)])
def test_low_precision_caches_run(tmp_path: Path, kv_dtype: str, element_bytes: int) -> None:
    cells = by_key(
        make_cells(tmp_path, ["contiguous-oracle", "paged"], kv_dtype=kv_dtype, budget="32KiB", num_requests=6)
    )
    for cell in cells.values():
        result, ex = run_torch(cell)
        assert result.status == "ok", result.error
        row = result.row
        assert ex.cache.bytes_per_position == 2 * 2 * 2 * 16 * element_bytes == row["kv_bytes_per_token"]
        assert row["generated_tokens"] == sum(map(len, ex.outputs().values()))


# -- consistency with sim -------------------------------------------------------------

ALLOCATION_COLUMNS_EXCLUDED = {*MEASURED_FIELDS, "run_id"}  # what only a measuring runner records


def test_sim_and_torch_make_identical_allocation_decisions(tight: dict) -> None:
    out = tight["out"]
    compared = 0
    for (runner, policy, bs), (row, _) in tight["runs"].items():
        if runner != "torch":
            continue
        sim_row = tight["runs"][("sim", policy, bs)][0]
        t, s = steps_of(out, row), steps_of(out, sim_row)
        columns = [c for c in s.columns if c not in ALLOCATION_COLUMNS_EXCLUDED]
        assert len(t) == len(s) > 0
        pd.testing.assert_frame_equal(t[columns], s[columns], check_dtype=False)
        assert s["step_wall_s"].isna().all() and t["step_wall_s"].notna().all()
        assert s["kv_bytes_allocated"].isna().all() and t["kv_bytes_allocated"].notna().all()
        for col in ("steps", "preemptions", "evictions", "generated_tokens", "tokens_per_s", "peak_running"):
            assert row[col] == sim_row[col], col
        compared += 1
    assert compared == 9  # 3 contiguous + paged and paged-prefix at 3 block sizes


# -- memory -----------------------------------------------------------------------------


def test_kv_bytes_follow_blocks_for_paged_and_reservations_for_contiguous(tight: dict) -> None:
    out = tight["out"]
    for (runner, policy, bs), (row, ex) in tight["runs"].items():
        if runner != "torch":
            continue
        steps = steps_of(out, row)
        bpp = row["kv_bytes_per_token"]
        positions = steps["kv_bytes_allocated"] // bpp
        assert (steps["kv_bytes_allocated"] % bpp == 0).all()
        # both: the bytes back exactly the positions the policy allocated
        assert (positions == steps["allocated_positions"]).all(), policy
        assert row["peak_kv_bytes_allocated"] == steps["kv_bytes_allocated"].max()
        assert row["peak_kv_bytes_allocated"] <= ex.cache.nbytes <= row["budget_bytes"]
        slack = positions - steps["used_positions"]
        if policy.startswith("paged"):
            # whole blocks on demand: at most one partly filled block per running request
            assert (slack <= steps["running"] * (bs - 1)).all(), policy
            assert (steps["kv_bytes_allocated"] % ex.cache.bytes_per_block == 0).all()
        else:
            # reservations: the not-yet-used and never-used positions are backed too
            assert (slack == steps["reserved_positions"] + steps["internal_frag_positions"]).all()
    # the contrast the runner exists to measure: contiguous-max backs far more than it uses
    steps = steps_of(out, tight["runs"][("torch", "contiguous-max", 1)][0])
    assert ((steps["kv_bytes_allocated"] // 512 - steps["used_positions"]) > steps["running"] * 15).any()


def test_paged_cache_slots_by_hand() -> None:
    """Block size 4, blocks [5, 2]: positions 0-3 in block 5, 4-6 in block 2."""
    cache = PagedKVCache(
        num_layers=1,
        num_blocks=8,
        block_size=4,
        kv_heads=1,
        head_dim=2,
        dtype=torch.float32,
        device=torch.device("cpu"),
    )
    seq = Seq(0, 0, 0, prompt_len=7, output_len=1, arrival_s=0.0)
    seq.blocks = [5, 2]
    assert cache.slots(seq, 0, 7) == [20, 21, 22, 23, 8, 9, 10]
    assert cache.allocated_bytes([seq]) == 2 * 4 * cache.bytes_per_position
    # the worked example's 35-token sequence at block size 16: 3 blocks, 48 positions backed
    big = PagedKVCache(1, 4, 16, 1, 2, torch.float32, torch.device("cpu"))
    s35 = Seq(1, 1, 0, prompt_len=35, output_len=1, arrival_s=0.0)
    s35.blocks = [0, 1, 2]
    assert big.allocated_bytes([s35]) == 48 * big.bytes_per_position


def test_contiguous_cache_reads_the_reserved_range() -> None:
    cache = ContiguousKVCache(
        num_layers=1, num_positions=32, kv_heads=1, head_dim=2, dtype=torch.float32, device=torch.device("cpu")
    )
    seq = Seq(0, 0, 0, prompt_len=5, output_len=3, arrival_s=0.0)
    seq.alloc_start, seq.allocated = 10, 8
    assert cache.slots(seq, 2, 5) == [12, 13, 14]
    k = torch.arange(5, dtype=torch.float32).repeat_interleave(2).view(5, 1, 2)
    cache.write(0, torch.tensor(cache.slots(seq, 0, 5)), k, -k)
    (ctx,) = cache.contexts(0, cache.plan_reads([(seq, 5)]))
    assert torch.equal(ctx[0], k) and torch.equal(ctx[1], -k)
    assert ctx.data_ptr() == cache.arena[0, 0, 10].data_ptr()  # a view of the arena, not a copy
    assert cache.allocated_bytes([seq]) == 8 * cache.bytes_per_position
    with pytest.raises(AssertionError):
        cache.slots(seq, 0, 9)  # beyond the reservation


# -- out of memory ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [
        MemoryError(),
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate"),
        RuntimeError("DefaultCPUAllocator: not enough memory: you tried to allocate; out of memory"),
    ],
)
def test_out_of_memory_during_the_run_is_an_oom_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: BaseException
) -> None:
    cell = by_key(make_cells(tmp_path, ["paged"], num_requests=4))[("torch", "paged", 16)]

    def boom(self, plan):  # type: ignore[no-untyped-def]
        if plan.step == 3:
            raise error
        return original(self, plan)

    original = TorchExecutor.execute
    monkeypatch.setattr(TorchExecutor, "execute", boom)
    row = run_cell(cell)
    assert row["status"] == "oom" and "out of memory" in row["error"]
    runs = store.read_table(tmp_path, "runs", {cell.run_id})
    assert list(runs["status"]) == ["oom"] and list(runs["device"]) == ["cpu"]
    assert store.read_table(tmp_path, "steps", {cell.run_id}).empty


def test_other_errors_are_not_mistaken_for_oom(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cell = by_key(make_cells(tmp_path, ["paged"], num_requests=4))[("torch", "paged", 16)]
    monkeypatch.setattr(TorchExecutor, "execute", lambda self, plan: (_ for _ in ()).throw(RuntimeError("shape")))
    row = run_cell(cell)
    assert row["status"] == "failed" and "shape" in row["error"]


def test_a_geometry_too_large_is_refused_up_front(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("kvbench.runners.torch.runner.available_bytes", lambda device: 8 * 2**30)
    text = torch_suite(["paged"], budget="1GiB", kv_dtype="fp16", num_requests=2, preset="llama-3-8b")
    (cell,) = build_cells(parse_suite(text, str(tmp_path / "s.toml")), tmp_path, lambda m: None)
    built = []
    monkeypatch.setattr("kvbench.runners.torch.runner.DecoderModel", lambda *a, **k: built.append(1))
    with pytest.raises(KvbenchError) as info:
        check_fits(cell.spec, torch.device("cpu"))
    message = str(info.value)
    assert "needs" in message and "usable" in message and "layers would fit" in message
    needed = int(message.split("needs ")[1].split(" B")[0].replace(",", ""))
    assert needed > 8 * 2**30 + 2**30  # weights (8B params at fp32) + the 1 GiB cache
    row = run_cell(cell)
    assert row["status"] == "failed" and "needs" in row["error"] and not built


def test_unsupported_kv_dtype_is_a_clear_failure(tmp_path: Path) -> None:
    (cell,) = make_cells(tmp_path, ["paged"], kv_dtype="int8", num_requests=2)
    row = run_cell(cell)
    assert row["status"] == "failed" and "int8" in row["error"]


# -- the runner as the sweep sees it ------------------------------------------------------


def test_runner_row(tight: dict) -> None:
    runner = get_runner("torch")
    assert runner.name == "torch" and runner.unavailable() is None
    out = tight["out"]
    for (r, policy, _bs), (row, _ex) in tight["runs"].items():
        if r != "torch":
            continue
        runs = store.read_table(out, "runs", {row["run_id"]})
        assert list(runs["device"]) == ["cpu"]
        backend = "torch-gather" if policy.startswith("paged") else "torch-contiguous"
        assert list(runs["attention_backend"]) == [backend]
        wall = steps_of(out, row)["step_wall_s"].sum()
        assert runs["wall_tokens_per_s"].iloc[0] == pytest.approx(row["generated_tokens"] / wall, rel=1e-9)
        assert runs["tokens_per_s"].iloc[0] == pytest.approx(row["generated_tokens"] / row["steps"])


def test_kvbench_run_through_the_sweep(tmp_path: Path) -> None:
    (cell,) = make_cells(tmp_path, ["paged-prefix"], num_requests=4, groups=1, prefix_len=16)
    row = run_cell(cell)
    assert row["status"] == "ok" and row["runner"] == "torch" and row["prefix_hit_rate"] > 0


def test_scale_layers_keeps_the_preset_but_its_depth() -> None:
    from kvbench.harness.spec.geometry import preset
    from kvbench.runners.torch.model import param_count, scale_layers

    g = preset("llama-3-8b")
    small = scale_layers(g, 2)
    assert small.num_layers == 2 and small.hidden_size == g.hidden_size and small.num_kv_heads == g.num_kv_heads
    assert small.kv_bytes_per_token("fp16") * 16 == g.kv_bytes_per_token("fp16")
    assert small.num_params == param_count(small)
    from kvbench.runners.torch.model import DecoderModel

    tiny = preset("tiny")
    model = DecoderModel(tiny, dtype=torch.float32, max_positions=8)
    assert model.weight_bytes == param_count(tiny) * 4  # what the up-front memory check counts
