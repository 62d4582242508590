"""The decomposition naive = allocation × runtime, on hand-made runs tables with exact answers."""

from __future__ import annotations

import math

import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st
from kvbench.reports.decomposition import METRICS, decompose
from reportkit import W1, W2, run, runs_frame


def row(table: pd.DataFrame, metric: str, baseline: str | None = "contiguous-max", **keys: object) -> dict:
    sel = table[table["metric"] == metric]
    sel = sel[sel["baseline"].isna()] if baseline is None else sel[sel["baseline"] == baseline]
    for k, v in keys.items():
        sel = sel[sel[k] == v]
    (found,) = sel.to_dict("records")
    return found


def torch_1_5x_vllm_3x() -> list[dict]:
    """Wall tokens/s: torch/paged is 1.5× torch/contiguous-max, vllm/paged 3× torch/paged: naive 4.5×."""
    return [
        run("torch", "contiguous-max", tokens_per_s=100.0, wall_tokens_per_s=80.0, mean_running=2.0, peak_running=2),
        run(
            "torch",
            "paged",
            16,
            tokens_per_s=150.0,
            wall_tokens_per_s=120.0,
            mean_running=4.0,
            peak_running=8,
            preemptions=5,
        ),
        run(
            "vllm",
            "paged",
            16,
            tokens_per_s=300.0,
            wall_tokens_per_s=360.0,
            mean_running=5.0,
            peak_running=8,
            preemptions=2,
        ),
        run("sim", "contiguous-max", mean_running=2.0, peak_running=2, preemptions=0),
        run("sim", "paged", 16, mean_running=4.5, peak_running=9, preemptions=4),
        run("vllm-sched", "paged", 16, mean_running=4.5, peak_running=9, preemptions=4),
    ]


def test_torch_1_5x_times_vllm_2x_is_naive_3x() -> None:
    table = decompose(runs_frame(torch_1_5x_vllm_3x()))
    assert len(table) == len(METRICS)
    wall = row(table, "wall_tokens_per_s")
    assert (wall["torch_contiguous"], wall["torch_paged"], wall["vllm_paged"]) == (80.0, 120.0, 360.0)
    assert (wall["allocation"], wall["runtime"], wall["naive"]) == (1.5, 3.0, 4.5)
    cap = row(table, "mean_running")
    assert (cap["allocation"], cap["runtime"], cap["naive"]) == (2.0, 1.25, 2.5)
    assert row(table, "peak_running")["runtime"] == 1.0


def test_tokens_per_s_decomposes_on_kvbench_clock_too() -> None:
    # Every runner's tokens_per_s is on kvbench's clock: all three factors are defined.
    tps = row(decompose(runs_frame(torch_1_5x_vllm_3x())), "tokens_per_s")
    assert (tps["torch_contiguous"], tps["torch_paged"], tps["vllm_paged"]) == (100.0, 150.0, 300.0)
    assert (tps["allocation"], tps["runtime"], tps["naive"]) == (1.5, 2.0, 3.0)


def test_runtime_free_figures_sit_beside_capacity_only() -> None:
    table = decompose(runs_frame(torch_1_5x_vllm_3x()))
    cap = row(table, "mean_running")
    assert (cap["sim_contiguous"], cap["sim_paged"], cap["sim_allocation"]) == (2.0, 4.5, 2.25)
    assert (cap["sim_paged_preemptions"], cap["sim_contiguous_preemptions"]) == (4.0, 0.0)
    assert (cap["vllm_sched_paged"], cap["vllm_sched_paged_preemptions"]) == (4.5, 4.0)
    assert (cap["torch_paged_preemptions"], cap["vllm_paged_preemptions"]) == (5.0, 2.0)
    assert math.isnan(row(table, "tokens_per_s")["sim_allocation"])  # sim's clock is not a runtime
    assert cap["warning"] is None


def test_missing_vllm_leaves_runtime_and_naive_nan() -> None:
    rows = [r for r in torch_1_5x_vllm_3x() if r["runner"] != "vllm"]
    tps = row(decompose(runs_frame(rows)), "wall_tokens_per_s")
    assert tps["allocation"] == 1.5
    assert math.isnan(tps["runtime"]) and math.isnan(tps["naive"]) and math.isnan(tps["vllm_paged"])


def test_missing_torch_contiguous_keeps_the_runtime_effect() -> None:
    rows = [r for r in torch_1_5x_vllm_3x() if not (r["runner"] == "torch" and r["policy"] == "contiguous-max")]
    tps = row(decompose(runs_frame(rows)), "wall_tokens_per_s", baseline=None)
    assert tps["runtime"] == 3.0
    assert math.isnan(tps["allocation"]) and math.isnan(tps["naive"])


def test_failed_run_counts_as_missing() -> None:
    rows = [dict(r, status="failed") if r["runner"] == "vllm" else r for r in torch_1_5x_vllm_3x()]
    assert math.isnan(row(decompose(runs_frame(rows)), "wall_tokens_per_s")["runtime"])


def test_sim_only_records_have_no_rows() -> None:
    rows = [r for r in torch_1_5x_vllm_3x() if r["runner"] in ("sim", "vllm-sched")]
    assert decompose(runs_frame(rows)).empty


def test_one_row_set_per_workload_and_contiguous_baseline() -> None:
    rows = torch_1_5x_vllm_3x() + [
        run("torch", "contiguous-oracle", tokens_per_s=120.0),
        run("torch", "contiguous-max", wl=W2, tokens_per_s=10.0),
        run("torch", "paged", 16, wl=W2, tokens_per_s=40.0),
    ]
    table = decompose(runs_frame(rows))
    assert len(table) == 3 * len(METRICS)
    assert row(table, "tokens_per_s", "contiguous-oracle")["allocation"] == 1.25
    assert row(table, "tokens_per_s", workload_id=W2["workload_id"])["allocation"] == 4.0
    assert row(table, "tokens_per_s", workload_id=W1["workload_id"])["allocation"] == 1.5


def test_paged_block_sizes_are_never_mixed() -> None:
    rows = torch_1_5x_vllm_3x() + [run("torch", "paged", 32, tokens_per_s=140.0)]
    table = decompose(runs_frame(rows))
    b32 = row(table, "tokens_per_s", block_size=32)
    assert b32["torch_paged"] == 140.0 and math.isnan(b32["vllm_paged"])  # vllm ran block 16 only
    assert row(table, "mean_running", block_size=16)["runtime"] == 1.25


def test_repetitions_count_as_their_median() -> None:
    rows = [r for r in torch_1_5x_vllm_3x() if r["runner"] != "vllm"]
    rows += [run("vllm", "paged", 16, repeat=i, wall_tokens_per_s=v) for i, v in enumerate((120.0, 240.0, 900.0))]
    assert row(decompose(runs_frame(rows)), "wall_tokens_per_s")["runtime"] == 2.0


def test_different_models_are_flagged() -> None:
    rows = [dict(r, model="tiny") if r["runner"] == "torch" else r for r in torch_1_5x_vllm_3x()]
    warning = row(decompose(runs_frame(rows)), "tokens_per_s")["warning"]
    assert warning and "differ in model" in warning


@settings(max_examples=60, deadline=None)
@given(st.floats(1e-3, 1e6), st.floats(1e-3, 1e6), st.floats(1e-3, 1e6))
def test_product_identity_holds_exactly(contiguous: float, paged: float, vllm: float) -> None:
    rows = [
        run("torch", "contiguous-max", wall_tokens_per_s=contiguous),
        run("torch", "paged", 16, wall_tokens_per_s=paged),
        run("vllm", "paged", 16, wall_tokens_per_s=vllm),
    ]
    tps = row(decompose(pd.DataFrame(rows)), "wall_tokens_per_s")
    assert tps["naive"] == tps["allocation"] * tps["runtime"]
    assert math.isclose(tps["naive"], vllm / contiguous, rel_tol=1e-12)
