"""The report's "Hybrid KV cache manager" table: waste by kind on hand-made records, and the
table from a real run of the manager on and off (sim on a Gemma-3-like model)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd
import pytest
from kvbench.app.cell import run_cell
from kvbench.app.suite import load_suite, parse_suite
from kvbench.app.sweep import keep_inputs, prepare_cells
from kvbench.reports import display
from kvbench.reports.contents import report_tables
from kvbench.reports.hybrid import hybrid_table, waste_by_kind
from kvbench.reports.labels import figure_label
from kvbench.reports.loading import load

from tests.conftest import DATA, ROOT, one_workload_suite, run_suite_text


def test_waste_by_kind_is_time_weighted_over_the_budget() -> None:
    # One block id = 100 B, budget 1,000 B; two steps of 1 s and 3 s.
    runs = pd.DataFrame({"run_id": ["r"], "kv_bytes_per_block": [100], "budget_bytes": [1000]})
    steps = pd.DataFrame({"run_id": ["r", "r"], "step": [0, 1], "dt_s": [1.0, 3.0]})
    groups = pd.DataFrame(
        {
            "run_id": ["r"] * 4,
            "step": [0, 0, 1, 1],
            "group": [0, 1, 0, 1],
            "kind": ["sliding", "full", "sliding", "full"],
            "allocated_blocks": [2, 1, 4, 3],
            "used_bytes": [150, 100, 250, 290],
        }
    )
    out = waste_by_kind(runs, steps, groups).set_index("kind")
    # sliding: held (200·1 + 400·3) / (4 s · 1,000 B) = 0.35; waste (50·1 + 150·3) / 4,000 = 0.125
    assert out.loc["sliding", "held_frac"] == pytest.approx(0.35)
    assert out.loc["sliding", "waste_frac"] == pytest.approx(0.125)
    # full: held (100 + 900) / 4,000 = 0.25; waste (0 + 10·3) / 4,000 = 0.0075
    assert out.loc["full", "waste_frac"] == pytest.approx(0.0075)


def gemma3_suite(name: str, budget: str, output: tuple[int, int], requests: int, policies: str) -> str:
    """A suite of a Gemma-3-like model on sim, the hybrid manager on and off."""
    return one_workload_suite(
        name=name,
        preset="tiny",
        model_extra=f'config = "{DATA / "models" / "tiny-gemma3" / "config.json"}"\n',
        kv_dtype="bf16",
        workload=f'source = "uniform"\nprompt_min = 100\nprompt_max = 400\noutput_min = {output[0]}\n'
        f'output_max = {output[1]}\nnum_requests = {requests}\narrival = "batch"\nseed = 3',
        budget=budget,
        max_model_len=1024,
        max_num_seqs=64,
        max_num_batched_tokens=256,
        runners='["sim"]',
        policies=policies,
        block_size=16,
    ).replace("block_size = [16]\n", "block_size = [16]\nhybrid_kv = [true, false]\n")


def test_the_report_sets_the_manager_on_against_off(tmp_path: Path) -> None:
    text = gemma3_suite("hybrid-report", "2MiB", (200, 600), 30, '["paged"]')
    rows, _ = run_suite_text(text, tmp_path)
    assert {r["hybrid_kv"] for r in rows} == {True, False} and all(r["status"] == "ok" for r in rows)
    records = load(tmp_path)
    table = hybrid_table(records.runs, records.steps, records.kv_groups)
    (row,) = table.to_dict("records")
    on = next(r for r in rows if r["hybrid_kv"])
    off = next(r for r in rows if not r["hybrid_kv"])
    assert (row["peak_running_on"], row["peak_running_off"]) == (on["peak_running"], off["peak_running"])
    assert (row["preemptions_on"], row["preemptions_off"]) == (on["preemptions"], off["preemptions"])
    assert row["mean_running_on"] > row["mean_running_off"]  # the manager frees what left the windows
    assert row["waste_off"].startswith("full ") and "sliding" in row["waste_on"]
    tables = report_tables(records.runs, steps=records.steps, kv_groups=records.kv_groups)
    assert len(tables.hybrid) == 1


def test_paging_over_contiguous_comes_from_the_records_manager_on_and_off(tmp_path: Path) -> None:
    text = gemma3_suite("hybrid-paging", "4MiB", (50, 200), 20, '["paged", "contiguous-max"]')
    rows, _ = run_suite_text(text, tmp_path)
    assert len(rows) == 4 and all(r["status"] == "ok" for r in rows)
    records = load(tmp_path)
    table = hybrid_table(records.runs, records.steps, records.kv_groups).set_index("policy")
    assert list(table.index) == ["contiguous-max", "paged"]

    def speed(policy: str, on: bool) -> float:
        return next(r["tokens_per_s"] for r in rows if r["policy"] == policy and r["hybrid_kv"] == on)

    paged = table.loc["paged"]
    assert paged["contiguous"] == "contiguous-max"
    assert paged["paging_on"] == pytest.approx(speed("paged", True) / speed("contiguous-max", True))
    assert paged["paging_off"] == pytest.approx(speed("paged", False) / speed("contiguous-max", False))
    assert paged["paging_on"] > 1 and paged["paging_off"] > 1
    assert pd.isna(table.loc["contiguous-max", "paging_on"])  # a contiguous pair is not set against itself
    # The manager on bounds contiguous-max's sliding runs by the window: more requests run at once.
    assert table.loc["contiguous-max", "peak_running_on"] > table.loc["contiguous-max", "peak_running_off"]


def test_the_shipped_hybrid_models_suite_sets_each_model_on_against_off() -> None:
    path = ROOT / "suites" / "hybrid-models.toml"
    suite = parse_suite(path.read_text(encoding="utf-8"), str(path))
    cells = [spec for spec, _ in suite.cells()]
    models = {spec.geometry.name for spec in cells}
    assert models == {"gpt-oss-20b", "gemma-3-27b", "deepseek-v3"}
    for model in models:
        for runner in ("sim", "vllm-sched"):
            for policy in ("paged", "contiguous-max"):
                mine = [s for s in cells if s.geometry.name == model and s.runner == runner and s.policy == policy]
                assert {s.hybrid_kv for s in mine} == {True, False} and {s.block_size for s in mine} == {16}


def test_the_default_suite_sets_gpt_oss_20b_on_against_off_beside_its_cells_of_before() -> None:
    path = ROOT / "suites" / "default.toml"
    text = path.read_text(encoding="utf-8")
    cells = [spec for spec, _ in parse_suite(text, str(path)).cells()]
    hybrid = [s for s in cells if s.geometry.name == "gpt-oss-20b"]
    assert {(s.runner, s.policy, s.block_size, s.hybrid_kv) for s in hybrid} == {
        (runner, "paged", 16, on) for runner in ("sim", "vllm-sched") for on in (True, False)
    }
    # The suite before its [grids.hybrid]: the same cells, so the same run ids (a resumed run keeps them).
    before, grids = text.split("\n[grids.hybrid]\n")
    assert not any(line.startswith("[") for line in grids.splitlines())  # the hybrid grid is the last table
    old = [spec for spec, _ in parse_suite(before, str(path)).cells()]
    assert len(old) == 30 and old == [s for s in cells if s not in hybrid]


def test_the_default_suites_budget_is_one_where_the_manager_matters(tmp_path: Path) -> None:
    """The default suite's gpt-oss-20b pair on sim: memory binds at its budget, so with the manager
    on more requests run at once and fewer are preempted, as the report's table shows."""
    prepared = prepare_cells(load_suite("default"), tmp_path, lambda msg: None)
    cells = [c for c in prepared.cells if c.spec.runner == "sim" and c.spec.geometry.name == "gpt-oss-20b"]
    keep_inputs(dataclasses.replace(prepared, cells=cells), tmp_path)
    assert all(run_cell(c)["status"] == "ok" for c in cells)
    records = load(tmp_path)
    (row,) = report_tables(records.runs, steps=records.steps, kv_groups=records.kv_groups).hybrid.to_dict("records")
    assert row["peak_running_on"] > row["peak_running_off"] and row["mean_running_on"] > row["mean_running_off"] * 1.2
    assert row["preemptions_on"] < row["preemptions_off"] and row["tokens_per_s_ratio"] > 1.2


def test_the_report_names_the_manager_setting_where_it_varies() -> None:
    # The geometric-mean table keeps a model's cells with the manager on and off apart, as the group
    # tables do; the figures label them.
    frame = pd.DataFrame(
        {
            "runner": ["sim"] * 3,
            "policy": ["paged"] * 3,
            "block_size": [16] * 3,
            "hybrid_kv": [True, False, None],
            "mean_running_x": [float("nan"), float("nan"), 2.0],
        }
    )
    columns = display.visible(display.GEOMEAN_COLUMNS, frame, {"sim"})
    assert [row[3] for row in display.rows(columns, frame)] == ["on", "off", "-"]
    assert "hybrid_kv" not in {key for key, _, _ in display.visible(display.GEOMEAN_COLUMNS, frame[2:], {"sim"})}
    row = {"runner": "sim", "policy": "paged", "block_size": 16}
    assert figure_label({**row, "hybrid_kv": False}) == "sim/paged b16 hybrid off"
    assert figure_label({**row, "hybrid_kv": None}) == figure_label(row) == "sim/paged b16"


def test_the_console_table_shows_the_hybrid_manager_where_it_varies() -> None:
    from kvbench.reports.console import render_rows

    base = {"model": "gpt-oss-20b", "workload_id": "w", "kv_dtype": "bf16", "budget_bytes": 1, "runner": "sim"}
    base |= {"policy": "paged", "block_size": 16, "status": "ok"}
    text = render_rows([base | {"hybrid_kv": True, "steps": 5}, base | {"hybrid_kv": False, "steps": 9}])
    header, on, off = text.splitlines()[1:4]
    assert "hybrid" in header.split() and on.split()[3:5] == ["on", "-"] and off.split()[3] == "off"
    assert "hybrid" not in render_rows([base | {"hybrid_kv": None}, base]).split()
