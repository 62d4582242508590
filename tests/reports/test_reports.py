"""Reports: summary tables (exact ratios and geometric means), figures, summary.md (golden), index.html.

Regenerate the golden file after an intended change with
``KVBENCH_UPDATE_GOLDEN=1 pytest tests/reports/test_reports.py`` and review its diff.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import kvbench
from kvbench.reports import figdata, figures
from kvbench.reports.decomposition import decompose
from kvbench.reports.tables import geomean, geometric_mean, mismatches, published_vs_reproduced, ratios, summary
from reportkit import GIB, W1, W2, golden_rows, run, runs_frame, workload, write_golden, write_records

GOLDEN = Path(__file__).parents[1] / "golden" / "summary.md"


@pytest.fixture(scope="module")
def golden_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from kvbench.reports.html import write_report

    out = write_golden(tmp_path_factory.mktemp("golden") / "results")
    write_report(out)
    return out


def cells_of(rows: list[dict]) -> pd.DataFrame:
    return summary(runs_frame(rows))


def ratio_of(table: pd.DataFrame, runner: str, policy: str, metric: str, block: int = 16) -> float:
    sel = table[(table["runner"] == runner) & (table["policy"] == policy)]
    if policy == "paged":
        sel = sel[sel["block_size"] == block]
    (value,) = sel[f"{metric}_x"].tolist()
    return value


# -- tables: ratios and geometric means ----------------------------------------------------


def test_paged_2x_capacity() -> None:
    rows = [
        run("sim", "contiguous-max", mean_running=2.0, peak_running=2, tokens_per_s=10.0),
        run("sim", "paged", 16, mean_running=4.0, peak_running=6, tokens_per_s=25.0),
    ]
    table = ratios(cells_of(rows))
    assert ratio_of(table, "sim", "paged", "mean_running") == 2.0
    assert ratio_of(table, "sim", "paged", "peak_running") == 3.0
    assert ratio_of(table, "sim", "paged", "tokens_per_s") == 2.5
    assert ratio_of(table, "sim", "contiguous-max", "mean_running") == 1.0


def test_paged_2x_and_8x_across_groups_is_4x_not_5x() -> None:
    w2 = workload("w2222222bbbbbbbb")
    rows = [
        run("sim", "contiguous-max", wl=W1, mean_running=1.0),
        run("sim", "paged", 16, wl=W1, mean_running=2.0),
        run("sim", "contiguous-max", wl=w2, mean_running=1.0),
        run("sim", "paged", 16, wl=w2, mean_running=8.0),
    ]
    geo = geomean(ratios(cells_of(rows)))
    paged = geo[geo["policy"] == "paged"].iloc[0]
    assert paged["mean_running_x"] == 4.0
    assert paged["mean_running_groups"] == 2


def test_the_geometric_means_name_the_arena_where_cells_differ_by_it() -> None:
    # contiguous-max placed first-fit and buddy are two cells: two rows, told apart by their arena
    # (first-fit, the default, reads "-" as in the cell tables).
    from kvbench.reports import display

    rows = [
        run("sim", "paged", 16, mean_running=4.0),
        run("sim", "contiguous-max", mean_running=2.0, arena="first-fit"),
        run("sim", "contiguous-max", mean_running=1.0, arena="buddy"),
    ]
    geo = geomean(ratios(cells_of(rows), baseline="paged"))
    columns = display.visible(display.GEOMEAN_COLUMNS, geo, {"sim"})
    shown = {tuple(r[:4]) for r in display.rows(columns, geo)}
    assert [key for key, _, _ in columns][:4] == ["runner", "policy", "block_size", "arena"]
    assert {("sim", "contiguous-max", "-", "-"), ("sim", "contiguous-max", "-", "buddy")} <= shown


def test_2x_faster_and_2x_slower_cancel() -> None:
    assert geometric_mean([2.0, 0.5]) == 1.0
    assert geometric_mean([3.0, 3.0, 3.0]) == pytest.approx(3.0, rel=1e-15)
    assert math.isnan(geometric_mean([]))
    assert geometric_mean([4.0, float("nan"), 0.0, float("inf")]) == 4.0  # only positive finite ratios count


def test_geometric_mean_survives_overflow() -> None:
    assert geometric_mean([1e200, 1e200, 1e-200]) == pytest.approx(
        1e200 ** (1 / 3) * 1e200 ** (1 / 3) * 1e-200 ** (1 / 3)
    )


def test_ratio_is_to_the_same_runners_baseline() -> None:
    rows = [
        run("sim", "contiguous-max", mean_running=1.0),
        run("torch", "contiguous-max", mean_running=4.0),
        run("torch", "paged", 16, mean_running=6.0),
    ]
    table = ratios(cells_of(rows))
    assert ratio_of(table, "torch", "paged", "mean_running") == 1.5


def test_missing_baseline_gives_nan_not_a_number() -> None:
    rows = [
        run("sim", "paged", 16, mean_running=6.0),
        run("vllm", "paged", 16, mean_running=6.0),
        run("vllm", "contiguous-max", status="failed", error="oom"),
    ]
    table = ratios(cells_of(rows))
    assert math.isnan(ratio_of(table, "sim", "paged", "mean_running"))
    assert math.isnan(ratio_of(table, "vllm", "paged", "mean_running"))


def test_repeats_collapse_to_their_median() -> None:
    rows = [run("torch", "paged", 16, repeat=i, tokens_per_s=v) for i, v in enumerate((1.0, 2.0, 10.0))]
    rows.append(run("torch", "paged", 16, repeat=3, status="failed", error="x"))
    (cell,) = cells_of(rows).to_dict("records")
    assert cell["tokens_per_s"] == 2.0 and cell["repeats"] == 4 and cell["ok"] == 3
    assert cell["status"] == "failed/ok"


def test_one_comparison_group_per_workload_precision_budget() -> None:
    rows = [
        run("sim", "paged", 16, wl=W1),
        run("sim", "paged", 16, wl=W2),
        run("sim", "paged", 16, kv_dtype="fp8"),
        run("sim", "paged", 16, budget_bytes=2 * GIB),
        run("sim", "paged", 32),
    ]
    assert cells_of(rows)["group"].nunique() == 4


def test_mismatches_name_what_differs() -> None:
    same = runs_frame([run("sim", "paged", 16), run("sim", "contiguous-max")])
    assert mismatches(same) == []
    mixed = runs_frame(
        [
            run("sim", "paged", 16),
            run("sim", "paged", 16, kv_dtype="fp8", budget_bytes=2 * GIB),
            run("sim", "paged", 16, wl=W2),
        ]
    )
    text = " | ".join(mismatches(mixed))
    assert "workload" in text and "KV precision" in text and "KV budget" in text and "model" not in text
    assert mismatches(mixed, allow=("workload_id", "kv_dtype", "budget_bytes")) == []


def test_published_vs_reproduced_matches_suite_policy_block_and_metric() -> None:
    runs = runs_frame([run("sim", "paged", 16, peak_running=7), run("sim", "contiguous-max", peak_running=2)])
    ref = pd.DataFrame(
        {
            "suite": ["golden", "golden", "golden"],
            "item": ["Fig 2", "Fig 2", "OPT-13B check"],
            "policy": ["paged", "paged", "contiguous-max"],
            "block_size": [16, 32, None],
            "metric": ["peak_running", "peak_running", "peak_running"],
            "published": [7.0, 5.0, 7.0],
            "source": ["paper"] * 3,
            "note": ["", "", "admits 7"],
        }
    )
    table = published_vs_reproduced(ref, runs)
    assert table["reproduced"].tolist()[0] == 7.0
    assert math.isnan(table["reproduced"].tolist()[1]) and table["problem"].tolist()[1] == "no matching ok run"
    assert table["reproduced"].tolist()[2] == 2.0 and table["published"].tolist()[2] == 7.0


# -- the last-block-waste figure's arithmetic -----------------------------------------------------------------


def test_seed_example_35_tokens_block_16_is_13_of_48() -> None:
    assert figdata.unused_fraction(np.array([35]), 16)[0] == 13 / 48
    assert figdata.unused_fraction(np.array([32, 33]), 16).tolist() == [0.0, 15 / 48]
    assert figdata.recorded_waste(np.array([35, 16]), [16]) == [(16, 13 / 64)]


# -- figures ----------------------------------------------------------------------------


def plots_for(rows: list[dict], steps: pd.DataFrame, requests: pd.DataFrame) -> dict[str, figures.Plot]:
    runs = runs_frame(rows)
    cells = ratios(summary(runs))
    return {p.stem: p for p in figures.all_plots(cells, runs, steps, requests, decompose(runs))}


def test_every_figure_renders_from_the_golden_records(golden_dir: Path) -> None:
    pngs = sorted(p.name for p in (golden_dir / "report").glob("*.png"))
    assert pngs == [
        "1-memory-breakdown.png",
        "2-last-block-waste.png",
        "3-allocation-over-time.png",
        "4-running-requests.png",
        "5-rate-sweep.png",
        "6-block-size-ablation.png",
        "7-decomposition.png",
    ]
    for name in pngs:
        assert (golden_dir / "report" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "name, reason",
    [
        ("1-memory-breakdown", "no ok run"),
        ("2-last-block-waste", "no requests"),
        ("3-allocation-over-time", "no ok run has step records"),
        ("4-running-requests", "no ok run has step records"),
        ("5-rate-sweep", "no request-rate sweep"),
        ("6-block-size-ablation", "no block-size sweep"),
        ("7-decomposition", "no torch or vllm runs"),
    ],
)
def test_each_figure_is_skipped_with_a_reason_when_its_data_is_absent(name: str, reason: str) -> None:
    rows = [run("sim", "paged", 16, status="failed", error="x")]
    plot = plots_for(rows, pd.DataFrame(), pd.DataFrame())[name]
    assert plot.figure is None
    assert reason in plot.note


def test_figures_drawn_only_from_what_the_records_hold() -> None:
    rows = [run("sim", "contiguous-max", mean_running=1.0), run("sim", "paged", 16, mean_running=2.0)]
    plots = plots_for(rows, pd.DataFrame(), pd.DataFrame())
    drawn = [n for n, p in plots.items() if p.figure is not None]
    assert drawn == ["1-memory-breakdown"]


# -- summary.md (golden) and index.html ---------------------------------------------------------


def test_summary_md_matches_golden(golden_dir: Path) -> None:
    text = (golden_dir / "report" / "summary.md").read_text()
    if os.environ.get("KVBENCH_UPDATE_GOLDEN") == "1":
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(text)
    assert GOLDEN.exists(), "no golden file yet: run with KVBENCH_UPDATE_GOLDEN=1"
    assert text == GOLDEN.read_text(), "summary.md changed; if intended, regenerate with KVBENCH_UPDATE_GOLDEN=1"


def test_summary_md_states_the_hand_computed_answers(golden_dir: Path) -> None:
    text = (golden_dir / "report" / "summary.md").read_text()
    # group W1, every run ok (said once above its tables): concurrency and throughput, then memory
    assert "Every row: status ok." in text
    assert "| sim | paged | 16 | 4.0 | 6 | 3 | 20.0 | - | 2.00× | 3.00× | 2.00× |" in text
    assert "| sim | paged | 16 | 80.0 | 2.0 | 1.0 | 0.0 |" in text
    # naive = allocation × runtime on tokens/s; no vllm/contiguous run: vLLM's allocation factor and the gap are "-"
    assert "| 3.00× | 1.50× | - | - | 2.00× |" in text
    assert "allocation_gap is n/a in every row" in text
    assert "boom: a runner bug" in text


def test_index_html_embeds_every_figure_and_flags_mismatches_in_red(tmp_path: Path) -> None:
    from kvbench.reports.html import write_report

    rows = [r for r in golden_rows() if r["workload_id"] == W1["workload_id"]]
    # torch ran another model than vllm: the decomposition compares runs that are not the same work.
    rows = [dict(r, model="tiny") if r["runner"] == "torch" else r for r in rows]
    out = write_records(tmp_path / "r", rows)
    page = write_report(out).read_text()
    assert page.count("<img ") == page.count('src="data:image/png;base64,') == 2
    assert 'class="warning"' in page and "differ in model" in page
    assert (out / "report" / "7-decomposition.png").read_bytes()[:4] == b"\x89PNG"
    assert not (out / "report" / "3-allocation-over-time.png").exists()  # no steps recorded: not drawn
    assert "not drawn" in page


def test_published_vs_reproduced_table_when_reference_exists(tmp_path: Path) -> None:
    from kvbench.reports.html import write_report

    out = write_records(tmp_path / "r", [run("sim", "contiguous-max", peak_running=7, mean_running=6.9)])
    pd.DataFrame(
        {
            "suite": ["golden"],
            "item": ["OPT-13B 12 GiB admits 7"],
            "policy": ["contiguous-max"],
            "block_size": [None],
            "metric": ["peak_running"],
            "published": [7.0],
            "source": ["vLLM paper §3"],
            "note": ["exactly 7 at once"],
        }
    ).to_parquet(out / "reference.parquet")
    page = write_report(out).read_text()
    md = (out / "report" / "summary.md").read_text()
    assert "Published vs reproduced" in page and "exactly 7 at once" in page
    # too wide for the page with both notes: the note follows in a second table led by the same keys
    keys = "| OPT-13B 12 GiB admits 7 | contiguous-max | - | peak_running |"
    assert f"{keys} 7 | 7 | predicted | sim | vLLM paper §3 |" in md
    assert f"{keys} exactly 7 at once |" in md


def test_bad_reference_file_is_a_warning_not_a_crash(tmp_path: Path) -> None:
    from kvbench.reports.html import write_report

    out = write_records(tmp_path / "r", [run("sim", "paged", 16)])
    pd.DataFrame({"item": ["x"]}).to_parquet(out / "reference.parquet")
    md = (write_report(out).parent / "summary.md").read_text()
    assert "published reference not shown" in md and "missing column(s)" in md


def test_report_cli_prints_the_page_path(tmp_path: Path) -> None:
    out = write_records(tmp_path / "r", [run("sim", "contiguous-max", mean_running=1.0)])
    done = kvbench("report", out)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(out / "report" / "index.html")
    missing = kvbench("report", tmp_path / "nope")
    assert missing.returncode == 2 and len(missing.stderr.splitlines()) == 1
    assert "no such results directory" in missing.stderr


def test_decomposition_caption_speaks_of_n_a_only_when_a_factor_is_missing() -> None:
    both = [
        run("torch", "contiguous-max", tokens_per_s=1.0, wall_tokens_per_s=80.0, mean_running=2.0, peak_running=2),
        run("torch", "paged", 16, tokens_per_s=2.0, wall_tokens_per_s=120.0, mean_running=4.0, peak_running=8),
        run("vllm", "paged", 16, tokens_per_s=2.0, wall_tokens_per_s=360.0, mean_running=4.0, peak_running=8),
    ]
    full = plots_for(both, pd.DataFrame(), pd.DataFrame())["7-decomposition"]
    assert full.figure is not None and "n/a" not in full.note
    assert "inside vLLM is not drawn: no vllm/contiguous-* run" in full.note
    no_engine = plots_for(both[:2], pd.DataFrame(), pd.DataFrame())["7-decomposition"]
    assert no_engine.figure is not None and "n/a: the runs for that factor are missing" in no_engine.note


def both_runtimes_rows() -> list[dict]:
    """torch's allocation factor 1.5× and vLLM's 3× in wall tokens/s, each runtime against contiguous-max."""
    vllm_contiguous = run("vllm", "contiguous-max", tokens_per_s=1.0, wall_tokens_per_s=120.0, mean_running=2.0)
    return [
        run("torch", "contiguous-max", tokens_per_s=1.0, wall_tokens_per_s=80.0, mean_running=2.0, peak_running=2),
        run("torch", "paged", 16, tokens_per_s=2.0, wall_tokens_per_s=120.0, mean_running=4.0, peak_running=8),
        dict(vllm_contiguous, block_size=16, run_id=vllm_contiguous["run_id"] + "-b16", peak_running=2),
        run("vllm", "paged", 16, tokens_per_s=2.0, wall_tokens_per_s=360.0, mean_running=4.0, peak_running=8),
    ]


def test_report_sets_the_allocation_factor_of_both_runtimes_side_by_side() -> None:
    from kvbench.reports import markdown
    from kvbench.reports.contents import report_tables

    runs = runs_frame(both_runtimes_rows())
    tables = report_tables(runs)
    md = markdown.render(runs, tables)
    assert "| torch allocation × | vllm allocation × | vllm ÷ torch allocation | runtime × |" in md
    assert "| wall_tokens_per_s | 4.50× | 1.50× | 3.00× | 2.00× | 3.00× |" in md
    assert "torch contiguous unit position · vllm contiguous unit block." in md  # the same in every row
    assert tables.decomposition_gap and tables.decomposition_gap in md
    assert "wall_tokens_per_s 2.00×" in tables.decomposition_gap
    assert any("different units" in w for w in tables.warnings)  # torch in positions, vllm in blocks


def test_decomposition_figure_draws_vllms_allocation_effect_where_measured() -> None:
    rows = both_runtimes_rows()
    plot = plots_for(rows, pd.DataFrame(), pd.DataFrame())["7-decomposition"]
    assert plot.figure is not None and "allocation effect measured inside vLLM" in plot.note
    assert "wall_tokens_per_s 2.00×" in plot.note
    vllm_only = plots_for(rows[2:], pd.DataFrame(), pd.DataFrame())["7-decomposition"]
    assert vllm_only.figure is not None and "n/a: the runs for that factor are missing" in vllm_only.note


def test_device_and_arena_columns_only_where_they_differ() -> None:
    from kvbench.reports.display import cell_columns

    base = {
        "runner": "torch",
        "policy": "contiguous-max",
        "block_size": 1,
        "status": "ok",
        "clock": "roofline",
        "token_states_frac": 0.5,
        "arena": None,
    }
    one = pd.DataFrame([{**base, "device": "cpu"}, {**base, "policy": "paged", "block_size": 16, "device": "cpu"}])
    both = pd.DataFrame(
        [{**base, "device": "cpu"}, {**base, "device": "cuda"}, {**base, "device": "cpu", "arena": "buddy"}]
    )
    keys = lambda t: [k for k, _, _ in cell_columns(t, {"torch"})]  # noqa: E731
    assert "device" not in keys(one) and "arena" not in keys(one)
    assert "device" in keys(both) and "arena" in keys(both)


def test_kvbench_run_prints_shares_off_by_points_and_ratios_off_by_percent() -> None:
    from kvbench.reports.console import render_reference

    table = pd.DataFrame(
        [
            {
                "item": "share",
                "metric": "token_states_frac",
                "published": 0.963,
                "reproduced": 0.926,
                "basis": "predicted",
                "runner": "sim",
                "problem": None,
            },
            {
                "item": "ratio",
                "metric": "mean_running ÷ contiguous-max",
                "published": 4.3,
                "reproduced": 4.41,
                "basis": "fitted",
                "runner": "sim",
                "problem": None,
            },
        ]
    )
    lines = render_reference(table).splitlines()
    assert "-3.7 pt" in next(x for x in lines if "share" in x and "0.963" in x)
    ratio = next(x for x in lines if x.strip().startswith("ratio"))
    assert "+2.6%" in ratio and "fitted" in ratio
