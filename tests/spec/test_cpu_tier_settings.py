"""A CPU tier of KV memory (``[memory] cpu_offload``, ``offload_policy``: vLLM's native KV
offloading), as settings: what a suite takes and refuses (one line through the CLI, nothing
written), the tier's capacity in blocks as vLLM counts it, what it adds to a run's identity (and
that every run id without a tier stays what it was), and its columns in the records, written and
read back, and read as null from files written before them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from kvbench.app.suite import parse_suite
from kvbench.app.sweep import build_cells
from kvbench.harness.errors import KvbenchError
from kvbench.harness.records import store
from kvbench.harness.records.recorder import RunRecorder
from kvbench.harness.records.schema import CPU_TIER_STEP_COLUMNS, REQUESTS, RUNS, STEPS, StepRow
from kvbench.harness.sim import bulk_rows
from kvbench.harness.spec import identity
from kvbench.harness.spec.cpu_tier import PAGE_BYTES, cpu_block_bytes, cpu_tier_blocks, parse_cpu_offload
from kvbench.harness.spec.specs import OFFLOAD_POLICIES, MemorySpec, ModelSpec, RunSpec
from kvbench.reports.compare import BASE_ONLY, CAND_ONLY, SAME, compare
from kvbench.reports.history.nights import COLUMNS as HISTORY_COLUMNS
from kvbench.reports.labels import with_keys
from kvbench.runners.base import Cell
from kvbench.runners.common import base_row, expand_seqs, requests_columns
from reportkit import run as run_row

from tests.conftest import assert_one_line_error, kvbench, run_spec, run_suite_text, suite_toml, tree

GiB = 2**30
MiB = 2**20
REFUSED = 2
WID = "w0123456789abcdef"


spec = run_spec


def tier(cpu: int = 16 * GiB, policy: str = "lru", **changes: object) -> RunSpec:
    """A paged-prefix cell of OPT-13B (fp16) with a CPU tier."""
    return spec(policy="paged-prefix", memory=MemorySpec(cpu_offload_bytes=cpu, offload_policy=policy), **changes)


def tier_suite(
    memory: dict[str, object] | None = None,
    grid: dict[str, object] | None = None,
    model: dict[str, object] | None = None,
    **sections: object,
) -> str:
    """Six short requests on the tiny model (256 B of KV a token: a 16-token block is one 4,096-B
    page), paged-prefix on sim, with a 1 MiB CPU tier unless ``memory`` says otherwise (a key set
    to None is left out)."""
    return suite_toml(
        "tier",
        model={"preset": "tiny", **(model or {})},
        memory={"kv_budget": "64KiB", "max_model_len": 256, "cpu_offload": "1MiB", **(memory or {})},
        workload={
            "source": "fixed",
            "prompt_len": 40,
            "output_len": 8,
            "num_requests": 6,
            "arrival": "batch",
            "prefix_groups": 2,
            "prefix_len": 32,
        },
        grid={"runner": ["sim"], "policy": ["paged-prefix"], "block_size": [16], **(grid or {})},
        **sections,  # type: ignore[arg-type]
    )


# -- the tier's capacity -------------------------------------------------------------------------


def test_cpu_tier_blocks_is_vllms_count_of_page_rounded_blocks() -> None:
    assert PAGE_BYTES == 4096
    assert cpu_block_bytes(4096) == 4096 and cpu_block_bytes(4097) == 8192 and cpu_block_bytes(1) == 4096
    assert cpu_tier_blocks(16 * GiB, 13_107_200) == 1310  # 17,179,869,184 // 13,107,200 (3,200 pages exactly)
    assert cpu_tier_blocks(MiB, 7680) == 128  # 7,680 B rounds up to 8,192: 128 blocks, not 136
    assert cpu_tier_blocks(4095, 4096) == 0 and cpu_tier_blocks(4096, 4096) == 1 and cpu_tier_blocks(0, 4096) == 0
    with pytest.raises(ValueError):
        cpu_tier_blocks(MiB, 0)


def test_run_spec_cpu_blocks_by_hand() -> None:
    # OPT-13B, fp16: K = 2 (K and V) × 40 layers × 40 KV heads × 128 × 2 B = 819,200 B a token;
    # a 16-token block is 13,107,200 B = 3,200 pages of 4,096 B exactly; 16 GiB = 17,179,869,184 B
    # holds ⌊17,179,869,184 ÷ 13,107,200⌋ = 1,310 blocks (1,310.72).
    cell = tier()
    assert cell.kv_bytes_per_token == 819_200
    assert cell.cpu_blocks == 1310
    assert cell.replace(block_size=32).cpu_blocks == 655  # 26,214,400 B a block
    # llama-mini: 2 × 3 layers × 2 KV heads × 64 × 2 B = 1,536 B a token; a 5-token block is 7,680 B,
    # stored as 2 pages = 8,192 B: 1 MiB holds 1,048,576 ÷ 8,192 = 128 blocks.
    mini = tier(MiB, model=ModelSpec(preset="llama-mini"), block_size=5)
    assert mini.kv_bytes_per_token == 1536 and mini.cpu_blocks == 128
    assert spec().cpu_blocks == 0  # no tier


def test_a_tier_over_kv_cache_groups_counts_one_groups_blocks() -> None:
    # gpt-oss-20b, bf16: 24 layers of 8 KV heads × 64 × 2 (K and V) × 2 B = 2,048 B a layer a token. With
    # vLLM's hybrid manager its 12 sliding and 12 full layers are two groups over one pool, whose block
    # is one group's: 12 × 2,048 × 16 = 393,216 B (96 pages), and each group stores its own chunks, so
    # 16 GiB holds ⌊17,179,869,184 ÷ 393,216⌋ = 43,690 blocks. Off, one group of every layer: 21,845.
    oss = tier(model=ModelSpec(preset="gpt-oss-20b", kv_dtype="bf16"), block_size=16)
    assert oss.block_bytes == 393_216 and oss.cpu_blocks == 43_690
    assert oss.replace(hybrid_kv=False).cpu_blocks == 21_845  # the same as a model of one group
    # The capacity vLLM's own connector computes is held against this at every vllm-sched start
    # (tests/runners/test_agreement_offload.py, "over KV cache groups").


def test_calc_counts_a_tier_over_kv_cache_groups() -> None:
    args = ("calc", "--block-size", "16", "--tokens", "512", "--model", "gpt-oss-20b", "--budget", "8GiB")
    proc = kvbench(*args, "--kv-dtype", "bf16", "--cpu-offload", "16GiB", "--json")
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)[0]
    assert (r["cpu_block_bytes"], r["cpu_blocks"], r["cpu_groups"], r["cpu_tokens"]) == (393_216, 43_690, 2, 349_520)


# -- identity ------------------------------------------------------------------------------------


def test_run_ids_without_a_tier_are_unchanged() -> None:
    # The ids test_identity pins, and the same cells with an eviction policy but no tier.
    assert spec().run_id(WID) == "a57e87f0cad95ffd"
    assert spec(memory=MemorySpec(offload_policy="arc")).run_id(WID) == "a57e87f0cad95ffd"
    assert spec(policy="virtual-contiguous", page_bytes=2**20, repeat=2).run_id(WID) == "ea89075f6496de83"
    canon = spec(memory=MemorySpec(cpu_offload_bytes=0, offload_policy="arc")).canonical(WID)
    assert "cpu_offload_bytes" not in canon and "offload_policy" not in canon


def test_a_tier_and_its_policy_are_cell_keys_counted_only_with_a_tier() -> None:
    assert ("cpu_offload_bytes", "CPU tier") in [(k.column, k.label) for k in identity.CELL]
    assert ("offload_policy", "CPU tier policy") in [(k.column, k.label) for k in identity.CELL]
    lru, arc, big = tier(), tier(policy="arc"), tier(32 * GiB)
    assert lru.canonical(WID)["cpu_offload_bytes"] == 16 * GiB and lru.canonical(WID)["offload_policy"] == "lru"
    assert len({c.run_id(WID) for c in (lru, arc, big, spec(policy="paged-prefix"))}) == 4
    # A row: 0 bytes and a null policy, or nulls from before the columns, are not counted.
    assert identity.key_value("cpu_offload_bytes", "sim", "paged-prefix", 0) is None
    assert identity.key_value("cpu_offload_bytes", "sim", "paged-prefix", None) is None
    assert identity.key_value("offload_policy", "sim", "paged-prefix", None) is None
    assert identity.key_value("offload_policy", "sim", "paged-prefix", "arc") == "arc"


def test_compare_pairs_rows_without_a_tier_with_rows_from_before_the_columns() -> None:
    old = run_row("sim", "paged-prefix", mean_running=2.0)  # cpu columns null, as in older files
    new = dict(old, cpu_offload_bytes=0, offload_policy=None, cpu_blocks=0)
    tiered = dict(old, cpu_offload_bytes=16 * GiB, offload_policy="lru", cpu_blocks=1310, run_id=old["run_id"] + "t")
    assert set(compare(pd.DataFrame([old]), pd.DataFrame([new]), 0.02)["verdict"]) == {SAME}
    assert set(compare(pd.DataFrame([old]), pd.DataFrame([tiered]), 0.02)["verdict"]) == {BASE_ONLY, CAND_ONLY}
    keyed = with_keys(pd.DataFrame([old, new, tiered]))
    assert list(keyed["cpu_offload_bytes"]) == [None, None, 16 * GiB]
    assert list(keyed["offload_policy"]) == [None, None, "lru"]
    # history reads every run-row column of the cell identity
    assert {"cpu_offload_bytes", "offload_policy"} <= set(HISTORY_COLUMNS)


# -- suites --------------------------------------------------------------------------------------


def cells_of(text: str, tmp_path: Path) -> list[RunSpec]:
    return [s for s, _ in parse_suite(text, str(tmp_path / "suite.toml")).cells()]


def test_a_grid_over_the_tier_and_its_policy(tmp_path: Path) -> None:
    text = tier_suite(
        memory={"cpu_offload": None}, grid={"cpu_offload": ["0", "1MiB", 0], "offload_policy": ["lru", "arc"]}
    )
    cells = cells_of(text, tmp_path)
    # 3 sizes × 2 policies planned; the two "no tier" sizes and both policies without a tier are one cell
    assert [(c.memory.cpu_offload_bytes, c.memory.offload_policy) for c in cells] == [
        (0, "lru"),
        (MiB, "lru"),
        (MiB, "arc"),
    ]
    assert [c.cpu_blocks for c in cells] == [0, 256, 256]  # 1 MiB ÷ 4,096 B (a 16-token block of tiny)
    # The cell without a tier is the cell of a suite that never names one: the same run id.
    (plain,) = cells_of(tier_suite(memory={"cpu_offload": None}), tmp_path)
    assert plain == cells[0] and plain.run_id(WID) == cells[0].run_id(WID)
    assert len({c.run_id(WID) for c in cells}) == 3


def test_size_strings_a_tier_takes() -> None:
    assert parse_cpu_offload("16GiB") == 16 * GiB
    assert parse_cpu_offload("40GB") == 40 * 10**9
    assert parse_cpu_offload(4096) == 4096
    assert parse_cpu_offload(0) == parse_cpu_offload("0") == parse_cpu_offload("0GiB") == parse_cpu_offload(0.0) == 0
    for bad in (-1, "-1GiB", "nan", "abc", True, 1.5, math.nan, math.inf, "1e400", "0 parsecs", None, [1]):
        with pytest.raises(KvbenchError):
            parse_cpu_offload(bad)


# Each refusal: (the suite, words its one line holds).
REFUSALS: dict[str, tuple[str, tuple[str, ...]]] = {
    "negative_size": (tier_suite({"cpu_offload": "-1GiB"}), ("cpu_offload", "negative", "-1GiB")),
    "negative_bytes": (tier_suite({"cpu_offload": -5}), ("cpu_offload", "negative", "-5")),
    "nan_string": (tier_suite({"cpu_offload": "nan"}), ("cpu_offload", "'nan'")),
    "nan": (tier_suite({"cpu_offload": math.nan}), ("cpu_offload", "nan")),
    "infinite": (tier_suite({"cpu_offload": math.inf}), ("cpu_offload", "inf")),
    "past_any_size": (tier_suite({"cpu_offload": "1e400"}), ("cpu_offload", "1e400")),
    "boolean": (tier_suite({"cpu_offload": True}), ("cpu_offload", "True")),
    "not_a_size": (tier_suite({"cpu_offload": "abc"}), ("cpu_offload", "'abc'")),
    "fractional_bytes": (tier_suite({"cpu_offload": 1.5}), ("cpu_offload", "1.5")),
    "unknown_unit": (tier_suite({"cpu_offload": "0 parsecs"}), ("cpu_offload", "parsecs")),
    "absurdly_large": (tier_suite({"cpu_offload": "5PB"}), ("cpu_offload", "absurdly large")),
    "a_list_in_memory": (tier_suite({"cpu_offload": ["0", "1MiB"]}), ("[memory] cpu_offload", "one value", "[grid]")),
    "unknown_offload_policy": (tier_suite({"offload_policy": "fifo"}), ("offload_policy", "'fifo'", "lru, arc")),
    "unknown_offload_policy_in_grid": (
        tier_suite(grid={"offload_policy": ["lru", "lfu"]}),
        ("offload_policy", "'lfu'", "lru, arc"),
    ),
    "offload_policy_without_any_tier": (
        tier_suite({"cpu_offload": None, "offload_policy": "arc"}),
        ("[memory] offload_policy", "not read by any cell", "no CPU tier"),
    ),
    "a_tier_holding_no_block": (
        tier_suite({"cpu_offload": "4095"}),
        ("cpu_offload 4,095 B", "holds no block", "16 tokens is 4,096 B"),
    ),
    "policy_without_prefix_caching": (
        tier_suite(grid={"policy": ["paged"]}),
        ("cpu_offload 1.0 MiB", "prefix-cache hashes", '"paged-prefix"', "policy is paged"),
    ),
    "contiguous_policy": (
        tier_suite(grid={"policy": ["contiguous-max"]}),
        ('"paged-prefix"', "policy is contiguous-max"),
    ),
    "torch": (
        tier_suite(grid={"runner": ["torch"]}, run={"device": "cpu"}),
        ("runner torch", "does not host a CPU tier", "sim, vllm-sched, vllm, serve"),
    ),
    "swap_preemption": (tier_suite(scheduler={"preemption": "swap"}), ('preemption "swap"', 'preemption "recompute"')),
    "state_layers": (  # prefix caching (which a tier needs) does not run on them
        tier_suite(model={"preset": "qwen3-next-80b", "kv_dtype": "bf16"}),
        ("qwen3-next", "paged-prefix on gdn layers is not modelled"),
    ),
    "vllm_on_cpu": (
        tier_suite(grid={"runner": ["vllm"]}, run={"device": "cpu"}),
        ("runner vllm on device cpu", "CPUOffloadingSpec.get_worker", "CUDA or XPU", "vllm-sched"),
    ),
    "tensor_parallel": (
        tier_suite(parallel={"tensor_parallel_size": 2}),
        ("tensor_parallel_size 2", "one rank"),
    ),
    "pipeline_parallel": (
        tier_suite(parallel={"pipeline_parallel_size": 2}),
        ("pipeline_parallel_size 2", "one rank"),
    ),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_a_refused_tier_is_one_line_and_writes_nothing(tmp_path: Path, case: str) -> None:
    text, needles = REFUSALS[case]
    (tmp_path / "suite.toml").write_text(text, encoding="utf-8")
    before = tree(tmp_path)
    proc = kvbench("run", tmp_path / "suite.toml", "--out", tmp_path / "out", "--quiet", cwd=tmp_path)
    assert_one_line_error(proc, "suite.toml", *needles)
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    assert proc.returncode == REFUSED, proc.stderr
    assert tree(tmp_path) == before, "a refused suite changed the tree"


def test_offload_policy_is_read_where_some_cell_has_a_tier(tmp_path: Path) -> None:
    """Swept beside cells without a tier (which ignore it), the eviction policy is used."""
    from kvbench.app.sweep import prepare_cells

    text = tier_suite({"cpu_offload": None, "offload_policy": "arc"}, grid={"cpu_offload": ["0", "1MiB"]})
    suite = parse_suite(text, str(tmp_path / "suite.toml"))
    (tmp_path / "out").mkdir()
    cells = prepare_cells(suite, tmp_path / "out", lambda m: None).cells
    policies = sorted((c.spec.memory.cpu_offload_bytes, c.spec.memory.offload_policy) for c in cells)
    assert policies == [(0, "lru"), (MiB, "arc")]


# -- records -------------------------------------------------------------------------------------


def tier_cell(out: Path, text: str | None = None) -> Cell:
    (cell,) = build_cells(parse_suite(text or tier_suite(), str(out / "suite.toml")), out, lambda m: None)
    return cell


def test_the_new_columns_are_written_and_read_back(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    cell = tier_cell(out)
    recorder = RunRecorder(out, cell.run_id, cell.spec.budget_positions)
    zeros = [0] * 17
    recorder.add_step(StepRow(0, 0.0, 1.0, *zeros, None, None, None, None, None, 3, 1, 2, 1))
    recorder.add_step(StepRow(1, 1.0, 1.0, *zeros, None, None, None, None, None))  # a row that gives none
    recorder.add_step_rows(bulk_rows.step_rows(2, np.array([2.0, 3.0, 4.0]), 2, {}))  # the fast path's bulk rows
    seqs = expand_seqs(cell)
    requests = requests_columns(seqs, {seqs[0].index: 32})
    row = base_row(cell, "sim")
    row.update(status="ok")
    recorder.finish(requests, row)

    run = store.read_table(out, "runs").iloc[0]
    assert (run["cpu_offload_bytes"], run["offload_policy"], run["cpu_blocks"]) == (MiB, "lru", 256)
    steps = store.read_table(out, "steps").sort_values("step")
    first = steps.iloc[0]
    assert [first[c] for c in CPU_TIER_STEP_COLUMNS] == [3, 1, 2, 1]
    assert steps.iloc[1:][list(CPU_TIER_STEP_COLUMNS)].isna().all().all()
    written = pq.read_schema(next((out / "steps").glob("run_id=*/part-0.parquet")))
    assert [written.field(c).type for c in CPU_TIER_STEP_COLUMNS] == [pa.int64(), pa.int64(), pa.int64(), pa.int32()]
    hits = store.read_table(out, "requests").sort_values(["request_id", "sample"])["cpu_hit_tokens"].tolist()
    assert hits == [32] + [0] * (len(seqs) - 1)
    assert requests_columns(seqs)["cpu_hit_tokens"] == [None] * len(seqs)  # no tier: null


def test_a_run_without_a_tier_records_its_columns_as_0_and_null(tmp_path: Path) -> None:
    """Through the whole sim runner (its bulk rows included): runs 0 / null / 0; steps and requests null."""
    out = tmp_path / "out"
    out.mkdir()
    (row,), _ = run_suite_text(tier_suite({"cpu_offload": None}), out)
    assert row["status"] == "ok", row["error"]
    assert (row["cpu_offload_bytes"], row["offload_policy"], row["cpu_blocks"]) == (0, None, 0)
    steps = store.read_table(out, "steps")
    assert len(steps) and steps[list(CPU_TIER_STEP_COLUMNS)].isna().all().all()
    assert store.read_table(out, "requests")["cpu_hit_tokens"].isna().all()


def test_files_written_before_the_columns_read_them_as_null(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    row = run_row("sim", "paged-prefix")
    rid = row.pop("run_id")
    row.update(steps_rows=1, requests_rows=1)
    old = {
        "runs": (RUNS, ("cpu_offload_bytes", "offload_policy", "cpu_blocks"), {k: [v] for k, v in row.items()}),
        "steps": (STEPS, CPU_TIER_STEP_COLUMNS, {n: [0] for n in STEPS.names}),
        "requests": (REQUESTS, ("cpu_hit_tokens",), {n: [None] for n in REQUESTS.names}),
    }
    for table, (schema, added, values) in old.items():
        before = pa.schema([f for f in schema if f.name not in added])
        data = pa.Table.from_pydict({f.name: values[f.name] for f in before}, schema=before)
        store.write_partition(out, table, rid, data)
        assert not set(added) & set(pq.read_schema(store.partition_dir(out, table, rid) / store.PART).names)
    store.check_complete(out)
    runs = store.read_table(out, "runs")
    assert runs[["cpu_offload_bytes", "offload_policy", "cpu_blocks"]].isna().all().all()
    assert store.read_table(out, "steps")[list(CPU_TIER_STEP_COLUMNS)].isna().all().all()
    assert store.read_table(out, "requests")["cpu_hit_tokens"].isna().all()
    keyed = with_keys(runs)
    assert keyed["cpu_offload_bytes"].tolist() == [None] and keyed["offload_policy"].tolist() == [None]


# -- kvbench calc --------------------------------------------------------------------------------


def test_calc_counts_the_blocks_a_cpu_tier_holds() -> None:
    args = ("calc", "--block-size", "16", "--tokens", "512", "--model", "opt-13b", "--budget", "12GiB")
    proc = kvbench(*args, "--cpu-offload", "16GiB", "--json")
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)[0]
    # 819,200 B a token × 16 = 13,107,200 B a block (whole pages); 16 GiB holds 1,310 of them.
    assert (r["cpu_offload_bytes"], r["cpu_block_bytes"], r["cpu_blocks"], r["cpu_tokens"]) == (
        16 * GiB,
        13_107_200,
        1310,
        1310 * 16,
    )
    text = kvbench(*args, "--cpu-offload", "16GiB")
    assert text.returncode == 0, text.stderr
    assert "CPU tier 16.0 GiB: 1,310 blocks of 16 tokens (13,107,200 B each" in text.stdout
    assert "= 20,960 tokens" in text.stdout
    # tiny at block size 3: 768 B a block, stored as one 4,096-B page: 1 MiB holds 256
    tiny = kvbench("calc", "--block-size", "3", "--tokens", "5", "--model", "tiny", "--budget", "1MiB")
    assert tiny.returncode == 0 and "CPU tier" not in tiny.stdout
    tiny = kvbench(
        "calc", "--block-size", "3", "--tokens", "5", "--model", "tiny", "--budget", "1MiB", "--cpu-offload", "1MiB"
    )
    assert "CPU tier 1.0 MiB: 256 blocks of 3 tokens (4,096 B each" in tiny.stdout, tiny.stderr


@pytest.mark.parametrize(
    "size, needles",
    [
        ("abc", ("--cpu-offload", "'abc'")),
        ("-1GiB", ("--cpu-offload", "negative")),
        ("nan", ("--cpu-offload", "'nan'")),
        ("0", ("--cpu-offload 0", "no CPU tier")),
    ],
)
def test_calc_refuses_a_bad_cpu_tier_size_in_one_line(size: str, needles: tuple[str, ...]) -> None:
    proc = kvbench(
        "calc",
        "--block-size",
        "16",
        "--tokens",
        "35",
        "--model",
        "opt-13b",
        "--budget",
        "1GiB",
        f"--cpu-offload={size}",
    )
    assert_one_line_error(proc, "kvbench calc: error:", *needles)
    assert proc.returncode == REFUSED


def test_offload_policies() -> None:
    assert OFFLOAD_POLICIES == ("lru", "arc")
    assert MemorySpec().offload_policy == "lru" and MemorySpec().cpu_offload_bytes == 0
    with pytest.raises(KvbenchError, match="unknown offload_policy 'fifo'"):
        MemorySpec(offload_policy="fifo")
    with pytest.raises(KvbenchError, match="cpu_offload"):
        MemorySpec(cpu_offload_bytes=-1)
