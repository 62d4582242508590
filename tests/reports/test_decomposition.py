"""The decomposition naive = allocation × runtime, on hand-made runs tables with exact answers."""

from __future__ import annotations

import math

import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st
from kvbench.harness.spec.capabilities import is_contiguous
from kvbench.reports.decomposition import METRICS, contiguous_block, decompose, gap_sentence
from reportkit import W1, W2, run, runs_frame


def row(table: pd.DataFrame, metric: str, baseline: str | None = "contiguous-max", **keys: object) -> dict:
    sel = table[table["metric"] == metric]
    sel = sel[sel["baseline"].isna()] if baseline is None else sel[sel["baseline"] == baseline]
    for k, v in keys.items():
        sel = sel[sel[k] == v]
    (found,) = sel.to_dict("records")
    return found


def block_run(runner: str, policy: str, block_size: int, **kw: object) -> dict:
    """A contiguous run that reserves whole blocks of ``block_size`` (``contiguous_unit = "block"``)."""
    r = run(runner, policy, **kw)  # type: ignore[arg-type]
    return dict(r, block_size=block_size, run_id=r["run_id"].replace("-1-", f"-{block_size}-", 1))


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
    assert math.isnan(tps["allocation_gap"])  # no vllm/contiguous run: nothing filled in
    assert math.isclose(tps["naive"], vllm / contiguous, rel_tol=1e-12)


# -- the allocation effect inside vLLM, and how far it is from torch's --------------------------


def both_runtimes(vllm_contiguous_wall: float = 120.0) -> list[dict]:
    """torch's allocation factor 1.5× (wall tokens/s); vllm/contiguous-max in blocks of 16 beside vllm/paged 360."""
    return torch_1_5x_vllm_3x() + [
        block_run(
            "vllm",
            "contiguous-max",
            16,
            tokens_per_s=200.0,
            wall_tokens_per_s=vllm_contiguous_wall,
            mean_running=2.5,
            peak_running=2,
            preemptions=1,
        )
    ]


def test_vllm_allocation_is_vllm_paged_over_vllm_contiguous_and_the_gap_its_ratio_to_torchs() -> None:
    table = decompose(runs_frame(both_runtimes()))
    assert len(table) == len(METRICS)  # one baseline: the same contiguous-max for both runtimes
    wall = row(table, "wall_tokens_per_s")
    assert (wall["vllm_contiguous"], wall["vllm_paged"]) == (120.0, 360.0)
    assert (wall["allocation"], wall["vllm_allocation"], wall["allocation_gap"]) == (1.5, 3.0, 2.0)
    assert (wall["allocation"], wall["runtime"], wall["naive"]) == (1.5, 3.0, 4.5)  # naive: still torch's
    cap = row(table, "mean_running")
    assert (cap["vllm_allocation"], cap["allocation_gap"]) == (2.0, 1.0)
    assert row(table, "peak_running")["vllm_allocation"] == 4.0
    assert (cap["vllm_contiguous_preemptions"], cap["torch_contiguous_preemptions"]) == (1.0, 0.0)


def test_missing_vllm_contiguous_leaves_vllm_allocation_and_gap_nan() -> None:
    wall = row(decompose(runs_frame(torch_1_5x_vllm_3x())), "wall_tokens_per_s")
    assert wall["allocation"] == 1.5 and wall["vllm_paged"] == 360.0
    assert math.isnan(wall["vllm_contiguous"]) and math.isnan(wall["vllm_allocation"])
    assert math.isnan(wall["allocation_gap"]) and math.isnan(wall["vllm_contiguous_preemptions"])
    assert wall["torch_contiguous_unit"] == "position" and wall["vllm_contiguous_unit"] is None


def test_failed_vllm_contiguous_counts_as_missing() -> None:
    rows = [
        dict(r, status="failed") if r["runner"] == "vllm" and r["policy"] != "paged" else r for r in both_runtimes()
    ]
    assert math.isnan(row(decompose(runs_frame(rows)), "wall_tokens_per_s")["allocation_gap"])


def test_missing_torch_contiguous_keeps_vllms_allocation_effect() -> None:
    # The baselines are the contiguous policies of torch or vllm: vllm's alone still gives a row set.
    rows = [r for r in both_runtimes() if not (r["runner"] == "torch" and r["policy"] == "contiguous-max")]
    wall = row(decompose(runs_frame(rows)), "wall_tokens_per_s")
    assert wall["vllm_allocation"] == 3.0 and wall["runtime"] == 3.0
    assert math.isnan(wall["allocation"]) and math.isnan(wall["allocation_gap"]) and math.isnan(wall["naive"])


def test_contiguous_baseline_prefers_the_paged_block_size_and_never_pools_the_two_forms() -> None:
    rows = [
        run("torch", "contiguous-max", wall_tokens_per_s=60.0),  # token positions
        block_run("torch", "contiguous-max", 16, wall_tokens_per_s=80.0),  # whole blocks of 16
        run("torch", "paged", 16, wall_tokens_per_s=120.0),
        run("torch", "paged", 32, wall_tokens_per_s=90.0),
    ]
    table = decompose(runs_frame(rows))
    b16 = row(table, "wall_tokens_per_s", block_size=16)
    assert (b16["torch_contiguous"], b16["allocation"], b16["torch_contiguous_unit"]) == (80.0, 1.5, "block")
    b32 = row(table, "wall_tokens_per_s", block_size=32)  # no block-32 contiguous run: token positions
    assert (b32["torch_contiguous"], b32["allocation"], b32["torch_contiguous_unit"]) == (60.0, 1.5, "position")


def test_contiguous_block_rule() -> None:
    records = [
        {"runner": "torch", "policy": "contiguous-max", "block_size": 1, "status": "ok"},
        {"runner": "torch", "policy": "contiguous-max", "block_size": 32, "status": "ok"},
        {"runner": "vllm", "policy": "contiguous-max", "block_size": 32, "status": "ok"},
        {"runner": "vllm", "policy": "contiguous-max", "block_size": 16, "status": "failed"},
    ]
    assert contiguous_block(records, "torch", "contiguous-max", 32) == 32
    assert contiguous_block(records, "torch", "contiguous-max", 16) == 1
    assert contiguous_block(records, "torch", "contiguous-max", None) == 1
    assert contiguous_block(records, "vllm", "contiguous-max", 16) is None  # its block-16 run failed, no positions
    assert contiguous_block(records, "vllm", "contiguous-oracle", 32) is None


def test_a_vllm_contiguous_run_of_another_block_size_is_not_matched() -> None:
    rows = torch_1_5x_vllm_3x() + [block_run("vllm", "contiguous-max", 32, wall_tokens_per_s=100.0)]
    table = decompose(runs_frame(rows))
    b16 = row(table, "wall_tokens_per_s", block_size=16)
    assert math.isnan(b16["vllm_contiguous"]) and math.isnan(b16["allocation_gap"])
    b32 = row(table, "wall_tokens_per_s", block_size=32)  # shown at its own block size, paged n/a there
    assert b32["vllm_contiguous"] == 100.0 and math.isnan(b32["vllm_paged"]) and math.isnan(b32["vllm_allocation"])


def test_different_contiguous_units_are_flagged_and_the_same_are_not() -> None:
    mixed = row(decompose(runs_frame(both_runtimes())), "wall_tokens_per_s")
    assert (mixed["torch_contiguous_unit"], mixed["vllm_contiguous_unit"]) == ("position", "block")
    assert "different units" in mixed["warning"] and "torch in token positions" in mixed["warning"]
    assert "vllm in blocks of 16" in mixed["warning"]
    rows = [r for r in both_runtimes() if not (is_contiguous(r["policy"]) and r["runner"] != "vllm")] + [
        block_run("torch", "contiguous-max", 16, wall_tokens_per_s=80.0),
        block_run("sim", "contiguous-max", 16, mean_running=2.0),
    ]
    same = row(decompose(runs_frame(rows)), "wall_tokens_per_s")
    assert (same["torch_contiguous_unit"], same["vllm_contiguous_unit"], same["sim_contiguous_unit"]) == ("block",) * 3
    assert same["warning"] is None and same["allocation_gap"] == 2.0


def test_gap_sentence_is_made_of_the_rows_numbers() -> None:
    table = decompose(runs_frame(both_runtimes()))
    text = gap_sentence(table)
    # vllm ÷ torch: tokens_per_s 1.5 / 1.5, wall 3 / 1.5, mean running 2 / 2, peak running 4 / 4.
    assert "over 4 row(s): tokens_per_s 1.00×, wall_tokens_per_s 2.00×, mean_running 1.00×, peak_running 1.00×" in text
    assert "furthest apart: wall_tokens_per_s against contiguous-max at block 16" in text
    assert "1.50× in torch and 3.00× in vLLM (+100%)" in text
    assert text.endswith(".") and "n/a" not in text
    closer = gap_sentence(decompose(runs_frame(both_runtimes(vllm_contiguous_wall=240.0))))
    assert "wall_tokens_per_s 1.00×" in closer  # the sentence follows the numbers


def test_gap_sentence_counts_rows_with_one_factor_and_says_n_a_without_any() -> None:
    rows = both_runtimes() + [run("torch", "contiguous-oracle", wall_tokens_per_s=100.0)]
    assert "n/a in the other 4 row(s)" in gap_sentence(decompose(runs_frame(rows)))
    none = gap_sentence(decompose(runs_frame(torch_1_5x_vllm_3x())))
    assert "n/a in every row" in none and "×" not in none
    assert gap_sentence(decompose(runs_frame([run("sim", "paged", 16)]))) == ""


def test_a_workload_is_named_in_the_gap_sentence_only_when_there_are_several() -> None:
    rows = both_runtimes() + [dict(r, workload_id=W2["workload_id"]) for r in both_runtimes(240.0)]
    text = gap_sentence(decompose(runs_frame(rows)))
    assert "over 8 row(s)" in text and "wall_tokens_per_s 1.00×–2.00×" in text
    assert f"({W1['workload_id'][:8]}, fp16)" in text
