"""``kvbench compare``: the nightly gate. Inputs are named for what they show."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from conftest import kvbench
from kvbench.reports.compare import (
    BASE_ONLY,
    CAND_ONLY,
    IMPROVEMENT,
    NOISE,
    REGRESSION,
    SAME,
    TOO_FEW,
    WITHIN,
    compare,
    to_json,
    to_markdown,
)
from reportkit import W2, run, write_records

TOL = 0.02


def base_rows() -> list[dict]:
    return [
        run("sim", "contiguous-max", mean_running=2.0, peak_running=2, tokens_per_s=10.0, wall_tokens_per_s=1e6),
        run(
            "sim",
            "paged",
            16,
            mean_running=4.0,
            peak_running=6,
            tokens_per_s=20.0,
            preemptions=3,
            wall_tokens_per_s=1e6,
        ),
    ]


def changed(rows: list[dict], policy: str, **metrics: object) -> list[dict]:
    return [dict(r, **metrics) if r["policy"] == policy else r for r in rows]


def verdicts(base: list[dict], cand: list[dict], metric: str | None = None) -> dict[str, str]:
    result = compare(pd.DataFrame(base), pd.DataFrame(cand), TOL)
    if metric is not None:
        result = result[result["metric"] == metric]
    return dict(zip(result["cell"], result["verdict"]))


# -- the pure comparison ---------------------------------------------------------------


def test_identical_cells_are_the_same() -> None:
    result = compare(pd.DataFrame(base_rows()), pd.DataFrame(base_rows()), TOL)
    judged = result[result["metric"] != "wall_tokens_per_s"]
    assert set(judged["verdict"]) == {SAME}


def test_paged_10_percent_less_capacity_regresses() -> None:
    cand = changed(base_rows(), "paged", mean_running=3.6)
    assert verdicts(base_rows(), cand, "mean_running") == {"sim/contiguous-max": SAME, "sim/paged b16": REGRESSION}


def test_paged_1_percent_less_capacity_is_within_tolerance() -> None:
    cand = changed(base_rows(), "paged", mean_running=3.96)
    assert verdicts(base_rows(), cand, "mean_running")["sim/paged b16"] == WITHIN


def test_paged_10_percent_more_throughput_improves() -> None:
    cand = changed(base_rows(), "paged", tokens_per_s=22.0)
    assert verdicts(base_rows(), cand, "tokens_per_s")["sim/paged b16"] == IMPROVEMENT


def test_waste_is_judged_in_points_of_the_budget() -> None:
    base = changed(base_rows(), "paged", internal_frag_frac=0.001)
    three_points = changed(base, "paged", internal_frag_frac=0.031)  # +3 points: beyond 2
    one_point = changed(base, "paged", internal_frag_frac=0.011)  # 11× relative, but only +1 point
    assert verdicts(base, three_points, "internal_frag_frac")["sim/paged b16"] == REGRESSION
    assert verdicts(base, one_point, "internal_frag_frac")["sim/paged b16"] == WITHIN


def test_first_preemption_is_a_regression() -> None:
    cand = changed(base_rows(), "contiguous-max", preemptions=1)
    assert verdicts(base_rows(), cand, "preemptions")["sim/contiguous-max"] == REGRESSION


def test_cell_that_fails_in_the_candidate_regresses() -> None:
    cand = changed(base_rows(), "paged", status="failed", error="livelock")
    result = compare(pd.DataFrame(base_rows()), pd.DataFrame(cand), TOL)
    row = result[result["cell"] == "sim/paged b16"].iloc[0]
    assert row["metric"] == "status" and row["verdict"] == REGRESSION and "livelock" in row["detail"]


def test_infeasible_on_both_sides_is_the_same() -> None:
    rows = [run("sim", "contiguous-max", status="infeasible", error="too big")]
    assert verdicts(rows, rows) == {"sim/contiguous-max": SAME}


def test_cells_match_by_spec_not_by_suite_run_id_or_provenance() -> None:
    cand = [
        dict(
            r,
            suite="renamed",
            run_id=r["run_id"] + "x",
            git_sha="f" * 40,
            host="other",
            repeat=5,
            spec_json=r["spec_json"].replace('"suite": "golden"', '"suite": "renamed"'),
        )
        for r in base_rows()
    ]
    result = compare(pd.DataFrame(base_rows()), pd.DataFrame(cand), TOL)
    assert set(result["cell"]) == {"sim/contiguous-max", "sim/paged b16"}
    assert set(result["verdict"]) == {SAME, TOO_FEW}  # TOO_FEW: sim's wall_tokens_per_s, one run a side


def test_one_sided_cells_are_listed() -> None:
    base = base_rows() + [run("sim", "paged", 32, mean_running=3.0)]
    cand = base_rows() + [run("sim", "paged", 16, wl=W2, mean_running=3.0)]
    result = compare(pd.DataFrame(base), pd.DataFrame(cand), TOL)
    sided = dict(zip(result["cell"], result["verdict"]))
    assert sided["sim/paged b32 · workload w1111111"] == BASE_ONLY
    assert sided["sim/paged b16 · workload w2222222"] == CAND_ONLY
    md = to_markdown(result, TOL)
    assert "only in base: `sim/paged b32 · workload w1111111`" in md
    assert "only in candidate: `sim/paged b16 · workload w2222222`" in md


def timed(runner: str, values: list[float]) -> list[dict]:
    return [
        run(
            runner,
            "paged",
            16,
            repeat=i,
            mean_running=4.0,
            tokens_per_s=v,
            wall_tokens_per_s=v,
            mean_step_wall_s=1.0 / v,
        )
        for i, v in enumerate(values)
    ]


def test_timed_metrics_with_two_repetitions_are_not_judged() -> None:
    result = compare(pd.DataFrame(timed("vllm", [100.0, 101.0])), pd.DataFrame(timed("vllm", [50.0, 51.0])), TOL)
    by_metric = dict(zip(result["metric"], result["verdict"]))
    assert by_metric["wall_tokens_per_s"] == TOO_FEW
    assert by_metric["mean_step_wall_s"] == TOO_FEW
    # tokens_per_s is on kvbench's deterministic clock in every runner: judged without repetitions.
    assert by_metric["tokens_per_s"] == REGRESSION
    assert by_metric["mean_running"] == SAME
    assert "too few repetitions to judge" in to_markdown(result, TOL)


def test_timed_2x_slower_beyond_the_spread_regresses() -> None:
    result = compare(
        pd.DataFrame(timed("torch", [100.0, 101.0, 99.0])), pd.DataFrame(timed("torch", [50.0, 51.0, 49.0])), TOL
    )
    by_metric = dict(zip(result["metric"], result["verdict"]))
    assert by_metric["wall_tokens_per_s"] == REGRESSION
    assert by_metric["mean_step_wall_s"] == REGRESSION


def test_timed_5_percent_slower_inside_the_spread_is_noise() -> None:
    result = compare(
        pd.DataFrame(timed("torch", [100.0, 80.0, 120.0])), pd.DataFrame(timed("torch", [95.0, 76.0, 114.0])), TOL
    )
    assert dict(zip(result["metric"], result["verdict"]))["wall_tokens_per_s"] == NOISE


def test_sim_throughput_is_simulated_so_judged_without_repetitions() -> None:
    cand = changed(base_rows(), "paged", tokens_per_s=10.0)
    assert verdicts(base_rows(), cand, "tokens_per_s")["sim/paged b16"] == REGRESSION


def test_torch_tokens_per_s_runs_on_kvbench_clock_so_is_judged_but_its_wall_speed_is_timed() -> None:
    result = compare(pd.DataFrame(timed("torch", [100.0])), pd.DataFrame(timed("torch", [50.0])), TOL)
    by_metric = dict(zip(result["metric"], result["verdict"]))
    assert by_metric["tokens_per_s"] == REGRESSION
    assert by_metric["wall_tokens_per_s"] == TOO_FEW


def test_simulated_latency_up_is_a_regression_and_down_an_improvement() -> None:
    base = changed(base_rows(), "paged", ttft_p90_s=1.0, latency_p50_s=10.0)
    cand = changed(base_rows(), "paged", ttft_p90_s=1.5, latency_p50_s=9.0)
    assert verdicts(base, cand, "ttft_p90_s")["sim/paged b16"] == REGRESSION
    assert verdicts(base, cand, "latency_p50_s")["sim/paged b16"] == IMPROVEMENT


def test_an_engine_on_the_measured_clock_has_its_throughput_and_latency_judged_as_timed() -> None:
    def measured(values: list[float]) -> list[dict]:
        return [dict(r, clock="measured", latency_p90_s=1000.0 / r["tokens_per_s"]) for r in timed("vllm", values)]

    few = compare(pd.DataFrame(measured([100.0, 101.0])), pd.DataFrame(measured([50.0, 51.0])), TOL)
    by_metric = dict(zip(few["metric"], few["verdict"]))
    assert by_metric["tokens_per_s"] == by_metric["latency_p90_s"] == TOO_FEW  # noisy: needs repetitions
    apart = compare(pd.DataFrame(measured([100.0, 101.0, 99.0])), pd.DataFrame(measured([50.0, 51.0, 49.0])), TOL)
    by_metric = dict(zip(apart["metric"], apart["verdict"]))
    assert by_metric["tokens_per_s"] == by_metric["latency_p90_s"] == REGRESSION  # beyond tolerance and spread


def test_json_renderer_round_trips() -> None:
    cand = changed(base_rows(), "paged", mean_running=1.0)
    doc = json.loads(to_json(compare(pd.DataFrame(base_rows()), pd.DataFrame(cand), TOL), TOL))
    assert doc["regressed_cells"] == ["sim/paged b16"] and doc["matched_cells"] == 2
    assert {r["verdict"] for r in doc["rows"]} >= {REGRESSION, SAME}


# -- the real command line ------------------------------------------------------------------


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path, Path]:
    base = write_records(tmp_path / "base", base_rows())
    same = write_records(tmp_path / "same", base_rows())
    worse = write_records(tmp_path / "worse", changed(base_rows(), "paged", mean_running=3.0, preemptions=9))
    return base, same, worse


def test_cli_identical_dirs_exit_0(dirs: tuple[Path, Path, Path]) -> None:
    base, same, _ = dirs
    done = kvbench("compare", base, same)
    assert done.returncode == 0, done.stderr
    assert "No regression beyond tolerance 0.02 in 2 matched cell(s)" in done.stdout
    assert "too few repetitions to judge" in done.stdout  # sim's wall_tokens_per_s, one run per side


def test_cli_worse_cell_exits_1_and_is_named(dirs: tuple[Path, Path, Path]) -> None:
    base, _, worse = dirs
    done = kvbench("compare", base, worse)
    assert done.returncode == 1
    assert "sim/paged b16" in done.stdout and "1 of 2 matched cell(s) regressed" in done.stdout
    assert done.stderr.count("\n") == 1 and "sim/paged b16 (mean_running, preemptions)" in done.stderr
    loose = kvbench("compare", base, worse, "--tolerance", "10", "--format", "json")
    assert loose.returncode == 0, loose.stderr
    assert json.loads(loose.stdout)["regressed_cells"] == []


def test_cli_bad_dirs_are_one_line_errors(dirs: tuple[Path, Path, Path], tmp_path: Path) -> None:
    base, _, _ = dirs
    (tmp_path / "empty").mkdir()
    for args, needle in (
        ((base, tmp_path / "nope"), "CAND_DIR"),
        ((tmp_path / "empty", base), "no runs/ directory"),
        ((base, base, "--tolerance", "-1"), "--tolerance"),
    ):
        done = kvbench("compare", *args)
        assert done.returncode == 2, done.stdout
        assert len(done.stderr.splitlines()) == 1 and needle in done.stderr and "Traceback" not in done.stderr


def test_cli_no_matched_cell_exits_1(dirs: tuple[Path, Path, Path], tmp_path: Path) -> None:
    base, _, _ = dirs
    other = write_records(tmp_path / "other", [dict(r, workload_id="someotherwork") for r in base_rows()])
    done = kvbench("compare", base, other)
    assert done.returncode == 1
    assert "no cell matched" in done.stderr and "Traceback" not in done.stderr
