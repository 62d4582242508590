"""Figure 8: the numeric swept axes found in the per-cell table, and the curves drawn along them.

The records are made by hand (``reportkit``) so every line and point is known; one test runs a
tiny real sweep through the simulator and the report, end to end.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from conftest import run_suite_text, suite_toml
from kvbench.reports import figdata, figures
from kvbench.reports.loading import load
from kvbench.reports.tables import summary
from reportkit import GIB, run, runs_frame, workload

RATES = (0.5, 1.0, 2.0, 4.0, 8.0)
POLICIES = ("contiguous-max", "contiguous-oracle", "paged")


def rate_workloads(rates: tuple[float, ...], prompt_len: int = 100) -> list[dict[str, Any]]:
    """One workload per rate, the same spec otherwise (so one family, as a suite's rate grid makes)."""
    return [workload(f"w{prompt_len:03d}{i:04d}{'r' * 9}", rate=r, prompt_len=prompt_len) for i, r in enumerate(rates)]


def rate_rows(rates: tuple[float, ...] = RATES, prompt_len: int = 100, **kw: Any) -> list[dict[str, Any]]:
    """A rate sweep where every metric is a known function of the rate and policy."""
    rows = []
    for wl in rate_workloads(rates, prompt_len):
        for k, policy in enumerate(POLICIES):
            r = wl["rate"]
            rows.append(
                run(
                    "sim",
                    policy,
                    16,
                    wl=wl,
                    mean_running=r * (k + 1),
                    tokens_per_s=10.0 * r * (k + 1),
                    token_states_frac=0.1 * (k + 1),
                    **kw,
                )
            )
    return rows


def cells_of(rows: list[dict[str, Any]]) -> pd.DataFrame:
    return summary(runs_frame(rows))


def axis_named(axes: list[figdata.SweptAxis], column: str) -> figdata.SweptAxis:
    (axis,) = [a for a in axes if a.column == column]
    return axis


# -- the axis finder ----------------------------------------------------------------------------


def test_a_rate_sweep_is_one_line_per_policy_sorted_by_rate() -> None:
    axes = figdata.swept_axes(cells_of(rate_rows()))
    assert [a.column for a in axes] == ["rate"]
    rate = axes[0]
    assert rate.log  # 0.5 to 8 spans 16×
    assert rate.values == list(RATES)
    assert sorted(line["policy"].iloc[0] for line in rate.lines) == sorted(POLICIES)
    for line in rate.lines:
        assert line["rate"].tolist() == list(RATES)
        assert line["policy"].nunique() == 1
        k = POLICIES.index(line["policy"].iloc[0])
        assert line["mean_running"].tolist() == [r * (k + 1) for r in RATES]


def test_two_rates_are_not_a_curve() -> None:
    assert figdata.swept_axes(cells_of(rate_rows((1.0, 4.0)))) == []


def test_a_budget_sweep_is_found_and_its_ticks_are_in_bytes() -> None:
    rows = [
        run("sim", policy, 16, budget_bytes=g * GIB, mean_running=float(g))
        for g in (4, 8, 12, 16)
        for policy in ("contiguous-max", "paged")
    ]
    axes = figdata.swept_axes(cells_of(rows))
    budget = axis_named(axes, "budget_bytes")
    assert len(budget.lines) == 2
    assert [line["budget_bytes"].tolist() for line in budget.lines] == [[g * GIB for g in (4, 8, 12, 16)]] * 2
    assert budget.log  # 4 to 16 GiB is 4×
    assert [budget.tick_label(v) for v in budget.values] == ["4 GiB", "8 GiB", "12 GiB", "16 GiB"]
    assert [a.column for a in axes] == ["budget_bytes"]


def test_a_narrow_sweep_gets_a_linear_axis() -> None:
    rows = [run("sim", "paged", 16, budget_bytes=g * GIB) for g in (8, 10, 12)]
    (budget,) = figdata.swept_axes(cells_of(rows))
    assert not budget.log  # 8 to 12 GiB is 1.5×


def test_only_cells_that_agree_on_everything_else_make_a_line() -> None:
    # Rates 0.5 and 1 at 1 GiB, rate 2 at 2 GiB: three rates, but no three at one budget.
    wls = rate_workloads((0.5, 1.0, 2.0))
    rows = [run("sim", "paged", 16, wl=wl, budget_bytes=(GIB if wl["rate"] < 2 else 2 * GIB)) for wl in wls]
    assert figdata.swept_axes(cells_of(rows)) == []


def test_contiguous_block_size_is_not_an_axis() -> None:
    rows = []
    for bs in (8, 16, 32):
        paged = run("sim", "paged", bs, mean_running=float(bs))
        # Contiguous reservations in whole blocks at several block sizes: not a block-table sweep.
        contiguous = run("sim", "contiguous-max", mean_running=1.0)
        contiguous.update(block_size=bs, run_id=f"{contiguous['run_id']}-b{bs}")
        rows += [paged, contiguous]
    cells = cells_of(rows)
    assert set(cells.loc[cells["policy"] == "contiguous-max", "block_size"]) == {8, 16, 32}
    block = axis_named(figdata.swept_axes(cells), "block_size")
    assert [line["policy"].iloc[0] for line in block.lines] == ["paged"]
    assert block.lines[0]["block_size"].tolist() == [8, 16, 32]


def test_failed_cells_are_not_points() -> None:
    rows = rate_rows((1.0, 2.0, 4.0))
    for r in rows:
        if r["rate"] == 4.0:
            r.update(status="failed", error="boom")
    assert figdata.swept_axes(cells_of(rows)) == []


def test_two_workloads_make_two_lines_per_policy_told_apart_in_their_labels() -> None:
    cells = cells_of(rate_rows() + rate_rows(prompt_len=50))
    rate = axis_named(figdata.swept_axes(cells), "rate")
    assert len(rate.lines) == 2 * len(POLICIES)
    shown = figdata.readable_lines(rate)
    contexts = figdata.context_labels(shown.lines, "rate")
    assert len(set(contexts)) == 2
    assert all("prompt 50" in c or "prompt 100" in c for c in contexts)
    assert all("poisson" not in c for c in contexts)  # what every line shares is left out
    series = [figdata.series_label(line.iloc[0].to_dict(), False, True) for line in shown.lines]
    assert len(set(zip(series, contexts))) == len(shown.lines)  # no two lines share a name


def test_many_workloads_are_capped_whole_and_counted() -> None:
    rows = [r for p in range(6) for r in rate_rows((1.0, 2.0, 4.0), prompt_len=10 + p)]
    rate = axis_named(figdata.swept_axes(cells_of(rows)), "rate")
    shown = figdata.readable_lines(rate)
    assert len(shown.lines) <= figdata.MAX_CURVE_LINES
    assert len(shown.lines) % len(POLICIES) == 0  # a workload is drawn with all its policies or not at all
    assert shown.left_lines == 6 * len(POLICIES) - len(shown.lines)
    assert shown.left_contexts == 6 - len(shown.lines) // len(POLICIES)


def test_paged_keeps_the_block_size_nearest_16_off_the_block_axis() -> None:
    rows = [run("sim", "paged", bs, wl=wl) for wl in rate_workloads((1.0, 2.0, 4.0)) for bs in (8, 16, 32)]
    axes = figdata.swept_axes(cells_of(rows))
    assert [a.column for a in axes] == ["rate", "block_size"]
    rate = axis_named(axes, "rate")
    assert len(rate.lines) == 3
    shown = figdata.readable_lines(rate)
    assert [int(line["block_size"].iloc[0]) for line in shown.lines] == [16]
    assert shown.left_lines == 0  # the other block sizes are drawn against block size, not left out
    assert len(figdata.readable_lines(axis_named(axes, "block_size")).lines) == 3  # one per rate


# -- the figure ---------------------------------------------------------------------------------


def panels_of(plot: figures.Plot) -> list[Any]:
    assert plot.figure is not None
    return [ax for ax in plot.figure.get_axes() if ax.get_visible()]


def test_a_rate_sweep_draws_one_line_per_policy_with_a_point_per_rate() -> None:
    plot = figures.swept_curves(cells_of(rate_rows()))
    axes = panels_of(plot)
    titles = [ax.get_title() for ax in axes]
    assert titles == ["mean running requests", "token states, % of KV budget", "throughput"]
    for ax in axes:
        lines = ax.get_lines()
        assert len(lines) == len(POLICIES)
        for line in lines:
            assert list(line.get_xdata()) == list(RATES)
        assert ax.get_xscale() == "log"
        assert [t.get_text() for t in ax.get_xticklabels()] == ["0.5", "1", "2", "4", "8"]
    running = {tuple(line.get_ydata()) for line in axes[0].get_lines()}
    assert running == {tuple(r * (k + 1) for r in RATES) for k in range(len(POLICIES))}
    token_states = {round(float(line.get_ydata()[0]), 6) for line in axes[1].get_lines()}
    assert token_states == {10.0, 20.0, 30.0}  # fractions drawn as % of the budget
    legend = plot.figure.legends[0]
    assert [t.get_text() for t in legend.get_texts()] == ["contiguous-max", "contiguous-oracle", "paged b16"]
    assert "request rate" in plot.note and "5 values" in plot.note


def test_normalized_latency_is_drawn_in_seconds_and_never_for_the_steps_clock() -> None:
    timed = cells_of(rate_rows(clock="roofline")).assign(normalized_latency_mean_s=0.1)
    axes = panels_of(figures.swept_curves(timed))
    (latency,) = [ax for ax in axes if ax.get_title().startswith("normalized latency")]
    assert len(latency.get_lines()) == len(POLICIES)
    assert "simulated s per output token" in latency.get_ylabel()
    stepped = cells_of(rate_rows()).assign(normalized_latency_mean_s=0.1)  # reportkit's clock: steps
    plot = figures.swept_curves(stepped)
    assert not [ax for ax in panels_of(plot) if ax.get_title().startswith("normalized latency")]
    assert "Normalized latency is not drawn" in plot.note


def test_budget_and_rate_sweeps_draw_a_row_each() -> None:
    rows = rate_rows() + [
        run("sim", p, 16, budget_bytes=g * GIB, mean_running=float(g), tokens_per_s=1.0)
        for g in (2, 4, 8)
        for p in POLICIES
    ]
    plot = figures.swept_curves(cells_of(rows))
    axes = panels_of(plot)
    assert len(axes) == 2 * 3
    assert [ax.get_xlabel() for ax in axes[::3]] == ["request rate, req/s (log)", "KV budget (log)"]
    assert [len(ax.get_lines()) for ax in axes] == [len(POLICIES)] * 6
    assert [t.get_text() for t in axes[3].get_xticklabels()] == ["2 GiB", "4 GiB", "8 GiB"]


def test_a_metric_without_values_says_so_instead_of_an_empty_panel() -> None:
    cells = cells_of(rate_rows())
    axes = panels_of(figures.swept_curves(cells.assign(tokens_per_s=float("nan"))))
    (tput,) = [ax for ax in axes if ax.get_title() == "throughput"]
    assert not tput.get_lines()
    assert [t.get_text() for t in tput.texts] == ["no values for these runs"]


def test_nothing_swept_is_no_figure_with_a_reason() -> None:
    plot = figures.swept_curves(cells_of([run("sim", p, 16) for p in POLICIES]))
    assert plot.figure is None
    assert "no numeric axis swept" in plot.note
    empty = figures.swept_curves(cells_of(rate_rows((1.0, 2.0))))
    assert empty.figure is None and "no numeric axis swept" in empty.note


def test_the_memory_breakdown_points_to_the_curves_only_when_there_are_some() -> None:
    swept = figures.memory_breakdown(cells_of(rate_rows()))
    assert "request rate is drawn as curves in the swept-curves figure" in swept.note
    flat = figures.memory_breakdown(cells_of([run("sim", p, 16) for p in POLICIES]))
    assert "swept-curves" not in flat.note


def test_figures_come_in_the_order_they_are_numbered() -> None:
    cells = cells_of(rate_rows())
    runs = runs_frame(rate_rows())
    plots = figures.all_plots(cells, runs, pd.DataFrame(), pd.DataFrame(), pd.DataFrame())
    assert [p.name for p in plots] == list(figures.FIGURES)
    assert [p.number for p in plots] == list(range(1, len(plots) + 1))
    assert plots[7].stem == "8-swept-curves"


def test_a_real_rate_sweep_draws_its_curves(tmp_path: Path) -> None:
    text = suite_toml(
        "curves",
        model={"preset": "opt-13b", "kv_dtype": "fp16"},
        memory={"kv_budget": "1GiB", "max_model_len": 512},
        workload={
            "source": "fixed",
            "prompt_len": 64,
            "output_len": 32,
            "num_requests": 30,
            "arrival": "poisson",
            "seed": 0,
        },
        scheduler={"max_num_seqs": 64, "max_num_batched_tokens": 512},
        grid={"runner": ["sim"], "rate": [1.0, 4.0, 16.0], "policy": ["contiguous-max", "paged"], "block_size": [16]},
    )
    out = tmp_path / "results"
    rows, _ = run_suite_text(text, out)
    assert all(r["status"] == "ok" for r in rows)
    plot = figures.swept_curves(summary(load(out).runs))
    axes = panels_of(plot)
    assert axes and all(len(ax.get_lines()) == 2 for ax in axes)
    assert all(list(line.get_xdata()) == [1.0, 4.0, 16.0] for ax in axes for line in ax.get_lines())


@pytest.mark.parametrize(
    "values, log, gap, kept",
    [
        ([1.0, 2.0, 4.0, 8.0], True, 0.1, [1.0, 2.0, 4.0, 8.0]),
        ([4.0, 8.0, 12.0, 16.0, 20.0, 24.0], True, 0.21, [4.0, 8.0, 12.0, 24.0]),
        ([1.0, 1.1, 1.2], False, 0.9, [1.0, 1.2]),
    ],
)
def test_crowded_tick_labels_are_thinned_keeping_both_ends(
    values: list[float], log: bool, gap: float, kept: list[float]
) -> None:
    assert figures._spaced_ticks(values, log, gap) == kept
