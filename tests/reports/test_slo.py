"""Service levels as the field states them: tails on several latency metrics at once, per-request
goodput, presets by name; capacity at all the bounds with the one that binds; the runs table's
p50..p99, mean and std per metric; older result directories still read."""

from __future__ import annotations

import contextlib
import io
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kvbench.app import cli
from kvbench.app.suite import parse_suite
from kvbench.app.sweep import build_cells, run_cell
from kvbench.harness.errors import KvbenchError
from kvbench.harness.records import store
from kvbench.harness.records.goodput import request_met, with_goodput, within_slo
from kvbench.harness.records.schema import ADDED_LATENCY_COLUMNS, LATENCY_PREFIXES, LATENCY_STATS, SCHEMA_VERSION
from kvbench.harness.records.slo import SLO_SCHEMA, Bound, parse_slo, slo_frame
from kvbench.harness.records.slo_presets import PRESETS
from kvbench.harness.sim.latency import latency_summary
from kvbench.harness.sim.sequence import FINISHED, RUNNING, Seq
from kvbench.reports.capacity import capacity_table
from kvbench.reports.figures import goodput_curves, slo_latency
from kvbench.reports.loading import load
from kvbench.reports.tables import summary
from reportkit import run, runs_frame, workload

from tests.conftest import ROOT, assert_one_line_error, kvbench, one_workload_suite, tree

TWO_BOUNDS = (ROOT / "suites" / "slo-two-bounds.toml").read_text()
BOUNDS_TEXT = TWO_BOUNDS[TWO_BOUNDS.index("bounds = [") : TWO_BOUNDS.index("]\n", TWO_BOUNDS.index("bounds = [")) + 2]


# -- parsing and presets ----------------------------------------------------------------------


def test_bounds_a_preset_and_the_single_column_form_parse_to_bounds() -> None:
    slo = parse_slo(
        {
            "bounds": [
                {"metric": "ttft", "percentile": 99, "max_s": 2},
                {"metric": "e2e", "percentile": "mean", "max_s": 9},
            ],
            "goodput_floor": 0.9,
        },
        "s.toml",
    )
    assert [b.column for b in slo.bounds] == ["ttft_p99_s", "latency_mean_s"]
    assert slo.goodput_floor == 0.9 and slo.refine == 0 and slo.preset is None
    preset = parse_slo({"preset": "mlperf-llama2-70b-server", "refine": 2}, "s.toml")
    assert preset.bounds == (Bound("ttft", "p99", 2.0, "mlperf"), Bound("tpot", "p99", 0.2, "mlperf"))
    assert preset.refine == 2
    paper = parse_slo({"bounds": [{"metric": "normalized", "percentile": "mean", "max_s": 0.5}]}, "s.toml")
    assert paper.bounds == PRESETS["vllm-paper-normalized-latency"].bounds  # the paper suite's bound, by name
    with pytest.raises(
        KvbenchError, match=r'metric/bound: write bounds = \[\{metric = "normalized", percentile = "mean"'
    ):
        parse_slo({"metric": "normalized_latency_mean_s", "bound": 0.5}, "s.toml")
    frame = slo_frame(preset, "x")
    assert list(frame.columns) == SLO_SCHEMA.names and frame["metric"].tolist() == ["ttft_p99_s", "tpot_p99_s"]


def test_the_mlperf_presets_state_their_published_bounds_and_sources() -> None:
    as_ms = {name: {b.column: round(b.max_s * 1000) for b in p.bounds} for name, p in PRESETS.items()}
    assert as_ms["mlperf-llama2-70b-server"] == {"ttft_p99_s": 2000, "tpot_p99_s": 200}
    assert as_ms["mlperf-llama2-70b-interactive"] == {"ttft_p99_s": 450, "tpot_p99_s": 40}
    assert as_ms["mlperf-llama3.1-8b-server"] == {"ttft_p99_s": 2000, "tpot_p99_s": 100}
    assert all(p.source for p in PRESETS.values())


def suite_text(slo: str) -> str:
    return TWO_BOUNDS.replace(BOUNDS_TEXT, slo + "\n")


BAD_SLO = {
    "unknown_metric": ('bounds = [{metric = "ttfb", percentile = 99, max_s = 2.0}]', ("ttfb", "ttft, tpot")),
    "unknown_percentile": ('bounds = [{metric = "ttft", percentile = 98, max_s = 2.0}]', ("percentile", "98")),
    "negative_bound": ('bounds = [{metric = "tpot", percentile = 99, max_s = -0.2}]', ("max_s", "-0.2")),
    "zero_bound": ('bounds = [{metric = "tpot", percentile = 99, max_s = 0}]', ("max_s",)),
    "infinite_bound": ('bounds = [{metric = "tpot", percentile = 99, max_s = inf}]', ("max_s", "inf")),
    "unknown_preset": ('preset = "mlperf-gpt-5"', ("mlperf-gpt-5", "mlperf-llama2-70b-server")),
    "preset_and_bounds": (
        'preset = "mlperf-llama2-70b-server"\n' + BOUNDS_TEXT.strip(),
        ("bounds", "preset", "together"),
    ),
    "itl_on_sim": ('bounds = [{metric = "itl", percentile = 99, max_s = 0.1}]', ("itl", "sim", "per-token")),
    "floor_over_one": (BOUNDS_TEXT.strip() + "\ngoodput_floor = 90", ("goodput_floor", "90")),
    "bound_twice": (
        'bounds = [{metric = "ttft", percentile = 99, max_s = 2.0}, {metric = "ttft", percentile = 99, max_s = 3.0}]',
        ("ttft_p99_s", "twice"),
    ),
    "unknown_bound_key": ('bounds = [{metric = "ttft", percentile = 99, max_ms = 2000}]', ("max_ms",)),
}


@pytest.mark.parametrize("case", list(BAD_SLO))
def test_bad_slo_is_one_line_and_writes_nothing(tmp_path: Path, case: str) -> None:
    slo, needles = BAD_SLO[case]
    suite = tmp_path / "bad.toml"
    suite.write_text(suite_text(slo))
    before = tree(tmp_path)
    assert_one_line_error(kvbench("run", str(suite), "--out", str(tmp_path / "out"), "--quiet"), *needles)
    assert tree(tmp_path) == before


def test_an_itl_bound_is_refused_before_anything_runs() -> None:
    with pytest.raises(KvbenchError, match="itl"):
        parse_suite(suite_text('bounds = [{metric = "itl", percentile = 99, max_s = 0.1}]'), "s.toml")


# -- the runs table's latency columns ---------------------------------------------------------


def _seqs(rng: np.random.Generator, n: int) -> list[Seq]:
    seqs = []
    for i in range(n):
        s = Seq(i, i, 0, 10, int(rng.integers(1, 50)), float(rng.uniform(0, 100)))
        s.first_token_s = s.arrival_s + float(rng.exponential(2.0))
        s.num_output = s.output_len
        s.finished_s = s.first_token_s + (s.num_output - 1) * float(rng.uniform(0.01, 0.2))
        s.status = FINISHED if rng.random() < 0.9 else RUNNING
        seqs.append(s)
    return seqs


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 300))
def test_latency_percentiles_agree_with_numpy(seed: int, n: int) -> None:
    rng = np.random.default_rng(seed)
    seqs = _seqs(rng, n)
    times = {s.index: np.sort(rng.uniform(s.first_token_s, s.finished_s, s.num_output)) for s in seqs}
    got = latency_summary(seqs, times)
    done = [s for s in seqs if s.status == FINISHED]
    arrays = {
        "ttft": np.array([s.first_token_s - s.arrival_s for s in done]),
        "tpot": np.array([(s.finished_s - s.first_token_s) / (s.num_output - 1) for s in done if s.num_output > 1]),
        "itl": np.concatenate([np.diff(times[s.index]) for s in done]) if done else np.array([]),
        "latency": np.array([s.finished_s - s.arrival_s for s in done]),
        "normalized_latency": np.array([(s.finished_s - s.arrival_s) / s.num_output for s in done]),
    }
    for prefix in LATENCY_PREFIXES:
        values = arrays[prefix]
        for stat in LATENCY_STATS:
            col = f"{prefix}_{stat}_s"
            if not len(values):
                assert got[col] is None, col
                continue
            want = {"mean": np.mean, "std": np.std}.get(stat, lambda v, q=stat: np.percentile(v, float(q[1:])))(values)
            assert got[col] == pytest.approx(float(want), rel=1e-12, abs=1e-15), col
    assert all(v is None for k, v in latency_summary(seqs).items() if k.startswith("itl_"))  # no token times: null


# -- goodput ------------------------------------------------------------------------------------


def _requests(rng: np.random.Generator, run_id: str, n: int) -> pd.DataFrame:
    seqs = _seqs(rng, n)
    return pd.DataFrame(
        {
            "run_id": run_id,
            "arrival_s": [s.arrival_s for s in seqs],
            "first_token_s": [s.first_token_s if s.status == FINISHED else None for s in seqs],
            "finished_s": [s.finished_s if s.status == FINISHED else None for s in seqs],
            "output_len": [s.output_len for s in seqs],
            "status": ["finished" if s.status == FINISHED else "unfinished" for s in seqs],
        }
    )


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 200), ttft=st.floats(0.01, 10), tpot=st.floats(0.005, 1))
def test_goodput_never_exceeds_throughput(seed: int, n: int, ttft: float, tpot: float) -> None:
    rng = np.random.default_rng(seed)
    requests = _requests(rng, "r", n)
    last = float(pd.to_numeric(requests["finished_s"]).max())
    duration = (last if last == last else 1.0) + float(rng.uniform(0.01, 5))  # the run drains after its last finish
    runs = pd.DataFrame({"run_id": ["r"], "suite": ["s"], "sim_time_s": [duration], "num_requests": [n]})
    slo = slo_frame(
        parse_slo(
            {
                "bounds": [
                    {"metric": "ttft", "percentile": 99, "max_s": ttft},
                    {"metric": "tpot", "percentile": 99, "max_s": tpot},
                ]
            },
            "s",
        ),
        "s",
    )
    row = with_goodput(runs, requests, slo).iloc[0]
    finished = int((requests["status"] == "finished").sum())
    assert row["goodput_rps"] <= finished / duration + 1e-12 <= n / duration + 1e-12
    assert 0.0 <= row["slo_met_frac"] <= finished / n
    met = request_met(requests, [("ttft_p99_s", ttft), ("tpot_p99_s", tpot)])
    assert row["goodput_rps"] == pytest.approx(sum(bool(m) for m in met) / duration)


def test_a_request_is_good_when_each_of_its_own_values_is_within_every_bound() -> None:
    requests = pd.DataFrame(
        {
            "arrival_s": [0.0, 0.0, 0.0, 0.0],
            "first_token_s": [1.0, 3.0, 1.0, 1.0],
            "finished_s": [2.0, 4.0, 11.0, None],
            "output_len": [11, 11, 11, 11],
            "status": ["finished", "finished", "finished", "unfinished"],
        }
    )
    met = request_met(requests, [("ttft_p99_s", 2.0), ("tpot_p50_s", 0.5)])
    assert met.tolist() == [True, False, False, False]  # ttft 3 > 2; tpot 1 > 0.5; unfinished
    assert request_met(requests, [("itl_p99_s", 1.0)]).isna().all()  # no per-token times: not judged


# -- capacity at several bounds -------------------------------------------------------------------


def sweep(policy: str, points: dict[float, tuple[float, float]]) -> list[dict]:
    return [
        run(
            "sim",
            policy,
            wl=workload(f"w{int(rate * 100):04d}{'0' * 12}", rate=rate),
            ttft_p99_s=t,
            tpot_p99_s=p,
            sim_time_s=100.0,
            goodput_rps=rate * 0.9,
        )
        for rate, (t, p) in points.items()
    ]


SLO = pd.DataFrame(
    [
        {"suite": "golden", "metric": "ttft_p99_s", "bound": 2.0},
        {"suite": "golden", "metric": "tpot_p99_s", "bound": 0.2},
    ]
)


def test_capacity_meets_every_bound_and_names_the_one_that_binds() -> None:
    rows = (
        sweep("paged", {1: (0.1, 0.05), 2: (0.5, 0.1), 4: (1.0, 0.5), 8: (9.0, 0.9)})  # tpot fails first
        + sweep("contiguous-max", {1: (0.5, 0.05), 2: (3.0, 0.1), 4: (9.0, 0.1)})  # ttft fails first
        + sweep("contiguous-oracle", {1: (0.1, 0.05), 2: (0.2, 0.15)})  # never over: least slack, tpot 0.75
    )
    table = capacity_table(runs_frame(rows), SLO).set_index("policy")
    assert table.loc["paged", "capacity_rps"] == 2 and table.loc["paged", "binding"] == "tpot_p99_s ≤ 0.2"
    assert (
        table.loc["contiguous-max", "capacity_rps"] == 1 and table.loc["contiguous-max", "binding"] == "ttft_p99_s ≤ 2"
    )
    assert table.loc["contiguous-oracle", "status"] == "at or above the highest rate"
    assert table.loc["contiguous-oracle", "binding"] == "tpot_p99_s ≤ 0.2"
    assert table.loc["paged", "goodput_at_capacity_rps"] == pytest.approx(1.8)
    assert table.loc["paged", "slo"] == "ttft_p99_s ≤ 2, tpot_p99_s ≤ 0.2"
    # A goodput floor is one more bound: the share of requests within every bound.
    runs = runs_frame(rows).assign(slo_met_frac=lambda f: np.where(f["rate"] >= 2, 0.5, 1.0))
    floored = capacity_table(runs, SLO.assign(goodput_floor=0.9)).set_index("policy")
    assert floored.loc["paged", "capacity_rps"] == 1 and floored.loc["paged", "binding"] == "slo_met_frac ≥ 0.9"


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    loosen=st.tuples(st.floats(1.0, 4.0), st.floats(1.0, 4.0)),
    floor=st.one_of(st.none(), st.floats(0.1, 1.0)),
)
def test_capacity_at_a_looser_bound_is_never_lower(seed: int, loosen: tuple[float, float], floor: float | None) -> None:
    rng = np.random.default_rng(seed)
    rows = []
    for policy in ("paged", "contiguous-max"):
        for rate in (0.5, 1.0, 2.0, 4.0, 8.0):
            for repeat in range(int(rng.integers(1, 3))):
                r = run(
                    "sim",
                    policy,
                    repeat=repeat,
                    wl=workload(f"w{int(rate * 100):04d}{'0' * 12}", rate=rate),
                    ttft_p99_s=float(rng.exponential(2.0)) if rng.random() > 0.05 else None,
                    tpot_p99_s=float(rng.exponential(0.2)),
                )
                r["slo_met_frac"] = float(rng.uniform())
                rows.append(r)
    runs = runs_frame(rows)
    tight = SLO.assign(goodput_floor=floor)
    loose = pd.DataFrame(
        [
            {"suite": "golden", "metric": "ttft_p99_s", "bound": 2.0 * loosen[0]},
            {"suite": "golden", "metric": "tpot_p99_s", "bound": 0.2 * loosen[1]},
        ]
    ).assign(goodput_floor=None if floor is None else floor * rng.uniform(0.5, 1.0))
    a = capacity_table(runs, tight).set_index("policy")["capacity_rps"].fillna(-math.inf)
    b = capacity_table(runs, loose).set_index("policy")["capacity_rps"].fillna(-math.inf)
    assert (b >= a).all(), (a, b)


def test_within_slo_reads_missing_values_as_over() -> None:
    bounds = [("ttft_p99_s", 2.0)]
    assert within_slo({"ttft_p99_s": 2.0}, bounds, None)
    assert not within_slo({"ttft_p99_s": math.nan}, bounds, None)
    assert not within_slo({"ttft_p99_s": 1.0}, bounds, 0.9)  # a floor with no share measured
    assert within_slo({"ttft_p99_s": 1.0, "slo_met_frac": 0.95}, bounds, 0.9)


def test_the_slo_figures_draw_percentiles_with_bounds_and_goodput() -> None:
    rows = [
        dict(r, clock="roofline", mean_running=1.0, tokens_per_s=1.0)
        for r in sweep("paged", {1: (0.1, 0.05), 2: (0.5, 0.1), 4: (1.0, 0.5)})
    ]
    cells = summary(runs_frame(rows))
    assert slo_latency(cells, SLO).figure is not None
    assert goodput_curves(cells, SLO).figure is not None
    assert slo_latency(cells, None).figure is None and "no [slo]" in slo_latency(cells, None).note


# -- end to end -------------------------------------------------------------------------------------


def _run(suite: Path, out: Path) -> str:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert cli.main(["run", str(suite), "--out", str(out), "--quiet", "--no-report"]) == 0
    return printed.getvalue()


@pytest.fixture(scope="module")
def two_bounds(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("slo") / "two-bounds"
    return out, _run(ROOT / "suites" / "slo-two-bounds.toml", out)


def test_a_two_bound_sweep_reports_capacity_binding_bound_and_goodput(two_bounds: tuple[Path, str]) -> None:
    out, printed = two_bounds
    assert "capacity at the SLO (ttft_p99_s ≤ 2, tpot_p99_s ≤ 0.2)" in printed and "goodput per run" in printed
    records = load(out)
    table = capacity_table(records.runs, records.slo)
    assert set(table["policy"]) == {"contiguous-max", "contiguous-oracle", "paged"}
    assert table["binding"].isin(["ttft_p99_s ≤ 2", "tpot_p99_s ≤ 0.2"]).all()
    assert (table["status"] == "within the sweep").all()
    ok = records.runs[records.runs["status"] == "ok"]
    assert ok["goodput_rps"].notna().all() and ok[["ttft_p99_s", "tpot_p99_s", "latency_std_s"]].notna().all().all()
    assert ok["itl_p99_s"].isna().all()  # sim records no per-token times
    assert records.requests["slo_met"].notna().all()


def test_a_preset_by_name_reads_its_bounds_by_mlperfs_percentile(tmp_path: Path, two_bounds: tuple[Path, str]) -> None:
    """The same bounds as the two-bound suite, judged by LoadGen's p99 (never below the linear
    one), so every capacity is at most the linear one's, read on the same runs."""
    out, _ = two_bounds
    suite = tmp_path / "preset.toml"
    suite.write_text(suite_text('preset = "mlperf-llama2-70b-server"'))
    printed = _run(suite, tmp_path / "preset")
    assert "capacity at the SLO (ttft_p99_s@mlperf ≤ 2, tpot_p99_s@mlperf ≤ 0.2)" in printed
    mine, theirs = load(tmp_path / "preset"), load(out)
    ok = mine.runs[mine.runs["status"] == "ok"]
    for metric in ("ttft", "tpot"):
        assert (ok[f"{metric}_p99_s@mlperf"] >= ok[f"{metric}_p99_s"]).all()
    by_mlperf = capacity_table(mine.runs, mine.slo).set_index("policy")["capacity_rps"]
    by_linear = capacity_table(theirs.runs, theirs.slo).set_index("policy")["capacity_rps"]
    assert set(by_mlperf.index) == set(by_linear.index)
    assert all(by_mlperf[p] <= by_linear[p] or math.isnan(by_mlperf[p]) for p in by_linear.index)
    assert set(mine.slo["preset"]) == {"mlperf-llama2-70b-server"} and set(mine.slo["percentile_method"]) == {"mlperf"}


def test_a_directory_written_before_the_new_columns_reads_them_as_null(
    tmp_path: Path, two_bounds: tuple[Path, str]
) -> None:
    out, _ = two_bounds
    old = tmp_path / "old"
    shutil.copytree(out, old)
    for part in (old / "runs").glob("run_id=*/part-0.parquet"):
        table = pq.read_table(part)
        pq.write_table(table.drop_columns(list(ADDED_LATENCY_COLUMNS)), part)
    # And the SLO file as it was: one metric and bound per suite, no floor, no preset.
    pq.write_table(
        pq.read_table(old / "slo.parquet")
        .select(["suite", "metric", "bound"])
        .slice(0, 1)
        .replace_schema_metadata({b"kvbench.schema_version": str(SCHEMA_VERSION).encode()}),
        old / "slo.parquet",
    )
    runs = store.read_table(old, "runs")
    assert runs["ttft_p99_s"].isna().all() and runs["ttft_p90_s"].notna().any()
    records = load(old)  # the report's reading: the new columns are null, nothing fails
    assert capacity_table(records.runs, records.slo).empty  # its one bound reads a column these runs lack
    proc = kvbench("compare", str(old), str(out))
    assert proc.returncode == 0, proc.stderr
    assert "Columns not compared" in proc.stdout and "ttft_p99_s" in proc.stdout and "tpot_p99_s" in proc.stdout


def test_the_vllm_scheduler_records_each_tokens_time_for_itl(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    suite = tmp_path / "itl.toml"
    text = suite_text(
        'bounds = [{metric = "ttft", percentile = 99, max_s = 2.0}, {metric = "itl", percentile = 99, max_s = 0.2}]'
    )
    text = text.replace("rate = [0.5, 1.0, 2.0, 4.0, 8.0]", "rate = [1.0, 2.0]").replace(
        "duration_s = 120", "duration_s = 15"
    )
    suite.write_text(text.replace('runner = ["sim"]', 'runner = ["vllm-sched"]').replace("refine = 2", "refine = 0"))
    printed = _run(suite, tmp_path / "out")
    assert "ttft_p99_s ≤ 2, itl_p99_s ≤ 0.2" in printed
    records = load(tmp_path / "out")
    for r in records.runs.to_dict("records"):
        mine = records.requests[
            (records.requests["run_id"] == r["run_id"]) & (records.requests["status"] == "finished")
        ]
        # Each request's gaps add up to its decode time: the pooled mean gap is Σ decode ÷ Σ gaps.
        gaps = (mine["output_len"] - 1).sum()
        assert r["itl_mean_s"] == pytest.approx((mine["finished_s"] - mine["first_token_s"]).sum() / gaps, rel=1e-9)
        assert r["itl_p50_s"] <= r["itl_p99_s"]
    assert records.requests["slo_met"].notna().all()  # judged on ttft; itl is a bound on the run's tail


def test_the_torch_runner_records_each_tokens_time_for_itl(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    text = one_workload_suite(
        runners='["torch"]',
        preset="llama-mini",
        kv_dtype="fp32",
        budget="1MiB",  # 341 positions: the 8 requests preempt each other
        max_model_len=256,
        max_num_seqs=8,
        max_num_batched_tokens=64,
        block_size=16,
        workload='source = "uniform"\nprompt_min = 8\nprompt_max = 60\noutput_min = 1\noutput_max = 40\n'
        'num_requests = 8\narrival = "batch"\nseed = 3',
    )
    (cell,) = build_cells(parse_suite(text, str(tmp_path / "t.toml")), tmp_path, lambda m: None)
    row = run_cell(cell)
    assert row["status"] == "ok", row.get("error")
    assert row["preemptions"] > 0  # a preempted request's gap spans its wait
    records = load(tmp_path)
    mine = records.requests[records.requests["status"] == "finished"]
    # Each request's gaps add up to its decode time: the pooled mean gap is Σ decode ÷ Σ gaps.
    gaps = (mine["output_len"] - 1).sum()
    assert row["itl_mean_s"] == pytest.approx((mine["finished_s"] - mine["first_token_s"]).sum() / gaps, rel=1e-9)
    assert row["itl_p50_s"] <= row["itl_p99_s"]


def test_an_older_slo_file_reads_and_keeps_its_rows_when_another_suite_writes(tmp_path: Path) -> None:
    import pyarrow as pa
    from kvbench.harness.records.slo import normalize_slo, write_slo

    old = pa.table({"suite": ["paper"], "metric": ["normalized_latency_mean_s"], "bound": [0.5]})
    pq.write_table(old.replace_schema_metadata({b"kvbench.schema_version": b"1"}), tmp_path / "slo.parquet")
    write_slo(tmp_path, "two", parse_slo({"preset": "mlperf-llama2-70b-interactive"}, "s"))
    rows = normalize_slo(pd.read_parquet(tmp_path / "slo.parquet")).set_index("metric")
    assert rows.loc["normalized_latency_mean_s", "suite"] == "paper" and math.isnan(
        rows.loc["normalized_latency_mean_s", "goodput_floor"]
    )
    assert (
        rows.loc["ttft_p99_s", "bound"] == 0.45 and rows.loc["tpot_p99_s", "preset"] == "mlperf-llama2-70b-interactive"
    )
