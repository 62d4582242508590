"""The tables clock: Vidur's measured tables read through one loader, the operation model fitted
on A100 and A40 only, each term labelled measured / fitted / rooflined, the CPU work per request
pinned to the table it came from, and bad tables or uncovered layouts said in one line."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from kvbench.app import cli
from kvbench.harness.clock.clocks import make_clock
from kvbench.harness.clock.gpu_tables import (
    FIT_GPUS,
    GEMM_OPS,
    OVERHEADS,
    TABLES_DIR,
    load_gpu_tables,
    shipped_tables,
)
from kvbench.harness.clock.model import GPU_PRESETS
from kvbench.harness.clock.op_model import GEMM_TILE_TOKENS, op_work, read_op_terms
from kvbench.harness.clock.tables_clock import (
    OP_TERMS_FILE,
    TablesClock,
    fit_shipped_op_terms,
    fitted_op_terms,
    layer_shape,
)
from kvbench.harness.errors import KvbenchError
from kvbench.harness.spec.geometry import PRESETS
from kvbench.reports.loading import load

ROOT = Path(__file__).resolve().parents[2]
HELD_OUT = ROOT / "benchmarks" / "data" / "vidur-h100"


def clock(model: str, gpu: str, tp: int = 1, pp: int = 1) -> TablesClock:
    g = PRESETS[model]
    return TablesClock(g, g.kv_bytes_per_token("fp16", tp, pp), GPU_PRESETS[gpu], 1.0, tp, pp)


def test_only_a100_and_a40_tables_ship_with_the_clock_and_the_h100_ones_are_held_out() -> None:
    assert sorted(p.name for p in TABLES_DIR.iterdir() if p.is_dir()) == sorted(FIT_GPUS) == ["a100", "a40"]
    assert (TABLES_DIR / "VIDUR-LICENSE.txt").read_text().startswith("MIT License")
    assert len(load_gpu_tables(HELD_OUT).ops) > 0 and (HELD_OUT / "VIDUR-LICENSE.txt").exists()
    for folder in FIT_GPUS:
        tables = shipped_tables(folder)
        assert tables.ops and tables.overheads is not None
        assert all(set(GEMM_OPS) <= set(t.times) for t in tables.ops)


def test_a_gemm_is_priced_in_whole_tiles_of_tokens_and_the_fitted_terms_say_so() -> None:
    shape = layer_shape(PRESETS["llama-2-7b"])
    assert shape is not None
    tokens = np.array([1, 63, 64, 65, 128, 129])
    weights = shape.hidden * shape.intermediate
    _, flops = op_work("mlp_down_proj", shape, 1, tokens, 64)
    assert (flops / (2.0 * weights)).tolist() == [64, 64, 64, 128, 128, 192]
    _, exact = op_work("mlp_down_proj", shape, 1, tokens)  # tile 1: the FLOPs the math needs
    assert (exact / (2.0 * weights)).tolist() == tokens.tolist()
    moved_tiled, _ = op_work("mlp_down_proj", shape, 1, tokens, 64)
    assert np.array_equal(moved_tiled, op_work("mlp_down_proj", shape, 1, tokens)[0])  # bytes are not tiled
    terms = fitted_op_terms()
    assert {terms[op].tile_tokens for op in GEMM_OPS} == {GEMM_TILE_TOKENS}
    assert {terms[op].tile_tokens for op in terms if op not in GEMM_OPS} == {1}


def test_the_shipped_operation_terms_are_a_fresh_fit_of_the_shipped_tables() -> None:
    """The clock reads its fitted terms from a file; it must hold what fitting the tables gives
    now (after a change to the tables or the model's form: python tools/fit_op_terms.py)."""
    shipped, fresh = fitted_op_terms(), fit_shipped_op_terms()
    assert shipped.keys() == fresh.keys()
    for op, terms in fresh.items():
        got, want = dataclasses.astuple(shipped[op]), dataclasses.astuple(terms)
        assert got == pytest.approx(want, rel=1e-9), f"{op}: run python tools/fit_op_terms.py"


def test_a_corrupt_terms_file_is_one_line_naming_it(tmp_path: Path) -> None:
    body = json.loads(OP_TERMS_FILE.read_text())
    path = tmp_path / "op_terms.json"
    cases = {
        "missing op": lambda b: b["terms"].pop("mlp_act"),
        "unknown term": lambda b: b["terms"]["emb"].update(speed=1.0),
        "not a number": lambda b: b["terms"]["add"].update(latency_s="fast"),
        "infinite": lambda b: b["terms"]["add"].update(bandwidth_efficiency=float("inf")),
        "fractional tile": lambda b: b["terms"]["mlp_up_proj"].update(tile_tokens=6.4),
    }
    for name, spoil in cases.items():
        broken = json.loads(json.dumps(body))
        spoil(broken)
        path.write_text(json.dumps(broken))
        with pytest.raises(KvbenchError, match=r"op_terms\.json: corrupt fitted operation terms \(") as err:
            read_op_terms(path)
        assert "\n" not in str(err.value), name
        assert name != "missing op" or "(mlp_act: expected the terms latency_s, " in str(err.value)
    path.write_bytes(b"\x00\xff{")
    with pytest.raises(KvbenchError, match=r"op_terms\.json: corrupt fitted operation terms \(not JSON"):
        read_op_terms(path)
    path.write_text("[]")
    with pytest.raises(KvbenchError, match=r"corrupt fitted operation terms \(no 'terms' object\)"):
        read_op_terms(path)
    with pytest.raises(KvbenchError, match=r"nowhere\.json: cannot read fitted operation terms"):
        read_op_terms(tmp_path / "nowhere.json")
    assert read_op_terms(OP_TERMS_FILE) == fitted_op_terms()


def test_terms_say_where_they_came_from() -> None:
    own = clock("llama-2-7b", "A100-80GB").sources()
    assert own["dense layers"].startswith("measured (a100/mlp meta-llama/Llama-2-7b-hf, TP 1)")
    assert own["attention"] == "rooflined" and own["CPU overheads"].startswith("measured (a100/cpu_overheads.csv")
    # An A100-40GB has less bandwidth than the A100-80GB Vidur profiled: fitted, not its tables.
    assert clock("llama-2-7b", "A100-40GB").sources()["dense layers"].startswith("fitted")
    tp = clock("opt-66b", "A100-40GB", tp=4).sources()
    assert tp["dense layers"].startswith("fitted") and tp["all-reduce"] == "measured (a100/all_reduce.csv, 4 GPUs)"
    # No host was profiled at TP 8: its CPU work is the nearest degree's (TP 4), whose work per step
    # is the largest, not a line through every degree's rows.
    tp8, tp4 = clock("opt-175b", "A100-80GB", tp=8), clock("opt-66b", "A100-40GB", tp=4)
    assert "every model at TP 4, the nearest profiled to TP 8" in tp8.sources()["CPU overheads"]
    assert tp8.overheads == dataclasses.replace(tp4.overheads, source=tp8.overheads.source)
    assert tp4.overheads.step_s > clock("opt-13b", "A100-40GB").overheads.step_s
    g = PRESETS["opt-13b"]
    scaled = TablesClock(g, g.kv_bytes_per_token("fp16"), GPU_PRESETS["A100-40GB"], 1.354)
    assert scaled.describe().startswith("tables on A100-40GB × 1.354 (roofline_scale, fitted): dense layers: fitted")
    h100 = clock("llama-2-7b", "H100")
    assert h100.sources()["CPU overheads"].startswith("none")
    assert h100.fallbacks() == [
        "tables clock: no CPU-overhead table for H100's host; its steps carry none, as on the roofline"
    ]


def test_a_layout_the_operation_model_lacks_falls_back_to_the_roofline_in_one_line() -> None:
    mla = clock("deepseek-v3", "A100-80GB")
    assert layer_shape(PRESETS["deepseek-v3"]) is None
    assert mla.sources()["dense layers"].startswith("rooflined")
    assert len(mla.fallbacks()) == 1 and "fall back to the roofline" in mla.fallbacks()[0]
    assert layer_shape(PRESETS["opt-13b"]).gated is False and layer_shape(PRESETS["llama-2-7b"]).gated is True


@pytest.mark.parametrize(
    "model,gpu,tp,pp",
    [
        ("llama-2-7b", "A100-80GB", 1, 1),
        ("opt-13b", "H100", 1, 1),
        ("opt-66b", "A100-40GB", 4, 2),
        ("deepseek-v3", "A40", 1, 1),
    ],
)
def test_step_times_are_price_bit_for_bit(model: str, gpu: str, tp: int, pp: int) -> None:
    c = clock(model, gpu, tp, pp)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 9000, 200)
    seqs = rng.integers(1, 600, 200)
    ctx = rng.integers(0, 400_000, 200)
    pairs = rng.integers(0, 4_000_000, 200)
    each = [c.price(int(t), int(x), int(p), int(s)) for t, x, p, s in zip(tokens, ctx, pairs, seqs)]
    assert c.step_times(tokens, ctx, pairs, seqs).tolist() == each
    assert c.step_times(5, ctx, pairs, 3).tolist() == [c.price(5, int(x), int(p), 3) for x, p in zip(ctx, pairs)]


def test_rooflined_terms_are_the_roofline_clocks_own() -> None:
    """Attention's KV reads and an all-reduce without a table (H100) price as the roofline
    clock of the same model, GPU and parallel sizes prices them."""
    g = PRESETS["opt-175b"]
    kv = g.kv_bytes_per_token("fp16", 8)
    c = clock("opt-175b", "H100", tp=8)
    roof = make_clock("roofline", g, kv, "H100", None, 1.0, 8)
    assert c.all_reduce is None and c.sources()["all-reduce"] == "rooflined"
    # 1 and 64 tokens: both steps memory-bound on the roofline, where only the ring differs.
    ring = roof.price(64, 0, 0, 1) - roof.price(1, 0, 0, 1)
    reduces = c.all_reduces(np.array([1, 64]))
    assert reduces[1] - reduces[0] == pytest.approx(ring, rel=1e-9)
    # Two decode steps of one request whose context differs: the KV read is all that differs.
    big, bigger = 10**7, 2 * 10**7
    assert c.price(1, bigger, bigger, 1) - c.price(1, big, big, 1) == pytest.approx(
        roof.price(1, bigger, bigger, 1) - roof.price(1, big, big, 1), rel=1e-9
    )


def test_dense_layers_read_the_table_where_it_profiled_the_model() -> None:
    c = clock("llama-2-7b", "A100-80GB")
    table = c.table
    assert table is not None
    at = int(table.tokens[10])
    measured = sum(table.times[op][10] for op in table.times if op != "emb") * 32 + table.times["emb"][10]
    assert at > 1
    assert c._dense_of(np.array([at]))[0] == pytest.approx(measured, rel=1e-12)


def _overhead_line(path: Path, model: str, tp: int) -> tuple[float, float]:
    """The least-squares line of the table's CPU work (ms → s) against batch size, from the CSV."""
    rows = pd.read_csv(path)
    rows = rows[(rows["model"] == model) & (rows["tensor_parallel"] == tp)]
    per_request, step = np.polyfit(rows["batch_size"], rows[list(OVERHEADS)].sum(axis=1) / 1e3, 1)
    return step, per_request


def test_the_per_request_overhead_is_the_tables_and_shows_in_short_request_batches(tmp_path: Path) -> None:
    step_s, per_request_s = _overhead_line(TABLES_DIR / "a100" / "cpu_overheads.csv", "meta-llama/Llama-2-7b-hf", 1)
    c = clock("llama-2-7b", "A100-80GB")
    assert c.overheads is not None
    assert (c.overheads.step_s, c.overheads.per_request_s) == pytest.approx((step_s, per_request_s), rel=1e-9)
    assert 20e-6 < per_request_s < 80e-6  # tens of µs a request, as Vidur measured on its host
    suite = tmp_path / "short.toml"
    suite.write_text(
        'name = "short"\n[model]\npreset = "llama-2-7b"\n[memory]\nkv_budget = "8GiB"\nmax_model_len = 256\n'
        '[workloads.short]\nsource = "fixed"\nnum_requests = 600\nprompt_len = 8\noutput_len = 16\narrival = "batch"\n'
        '[scheduler]\nmax_num_seqs = 256\nclock = "tables"\ngpu = "A100-80GB"\n'
        '[grid]\nrunner = ["sim"]\npolicy = ["paged"]\nblock_size = [16]\n'
    )
    out = tmp_path / "out"
    assert cli.main(["run", str(suite), "--out", str(out), "--quiet", "--no-report"]) == 0
    steps = load(out).steps.set_index("step")
    # The first wave: step 0 prefills 256 prompts of 8, steps 1-15 decode all 256 at once, each
    # request's context after step j being 8 + j.
    assert (steps.loc[1:15, "scheduled_tokens"] == 256).all() and (steps.loc[1:15, "running"] == 256).all()
    bare = clock("llama-2-7b", "A100-80GB")
    bare.overheads = None  # the same clock without its CPU work
    bare._cpu = np.zeros(0)
    for j in range(1, 16):
        ctx = 256 * (8 + j)
        extra = steps.loc[j, "dt_s"] - bare.price(256, ctx, ctx, 256)
        assert extra == pytest.approx(step_s + per_request_s * 256, rel=1e-6)
    # The per-request part is most of a short-request step's CPU work, and a third of the step.
    assert per_request_s * 256 > 5 * step_s
    assert per_request_s * 256 > 0.3 * steps.loc[1, "dt_s"]


def test_a_corrupt_table_is_one_line_naming_its_file(tmp_path: Path) -> None:
    copy = tmp_path / "a100"
    shutil.copytree(TABLES_DIR / "a100", copy)
    load_gpu_tables.cache_clear()
    target = copy / "mlp" / "meta-llama__Llama-2-7b-hf.csv"
    lines = target.read_text().splitlines()
    fields = lines[3].split(",")
    fields[lines[0].split(",").index("mlp_up_proj")] = "-1"
    lines[3] = ",".join(fields)
    target.write_text("\n".join(lines) + "\n")
    with pytest.raises(KvbenchError, match=r"^.*meta-llama__Llama-2-7b-hf\.csv: corrupt GPU table") as err:
        load_gpu_tables(copy)
    assert (
        "\n" not in str(err.value) and "np." not in str(err.value) and "mlp_up_proj on line 4 is -1.0" in str(err.value)
    )
    target.write_text("n_head,n_kv_head\n1,2\n")
    load_gpu_tables.cache_clear()
    with pytest.raises(KvbenchError, match=r"corrupt GPU table \(no column 'n_embd'\)"):
        load_gpu_tables(copy)
    target.write_bytes(b"\x00\xff\x00garbage")
    load_gpu_tables.cache_clear()
    with pytest.raises(KvbenchError, match=r"meta-llama__Llama-2-7b-hf\.csv: corrupt GPU table"):
        load_gpu_tables(copy)
    load_gpu_tables.cache_clear()


def test_kvbench_run_says_each_fallback_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    suite = tmp_path / "h100.toml"
    suite.write_text(
        'name = "h100"\n[model]\npreset = "llama-2-7b"\n[memory]\nkv_budget = "4GiB"\nmax_model_len = 256\n'
        '[workloads.w]\nsource = "fixed"\nnum_requests = 8\nprompt_len = 8\noutput_len = 4\narrival = "batch"\n'
        '[scheduler]\nclock = "tables"\ngpu = "H100"\n'
        '[grid]\nrunner = ["sim"]\npolicy = ["paged", "contiguous-max"]\nblock_size = [16]\n'
    )
    assert cli.main(["run", str(suite), "--out", str(tmp_path / "out"), "--no-report"]) == 0
    err = capsys.readouterr().err
    assert err.count("no CPU-overhead table for H100's host") == 1
    detail = load(tmp_path / "out").runs["clock_detail"]
    assert detail.str.startswith("tables on H100: dense layers: fitted").all()
