"""The vLLM paper's §6.2 batched-requests comparison from suites/paper-batched-requests.toml:
one clock factor fitted to vLLM's published mean batch on ShareGPT, the Orca ratios predicted
on that clock within 15% of the published ones, the table marked fitted or
predicted, and ``kvbench fit-roofline`` finding the shipped factor again."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest
from kvbench.app import cli
from kvbench.reports.loading import load
from kvbench.reports.tables import published_vs_reproduced

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "suites" / "paper-batched-requests.toml"


@pytest.fixture(scope="module")
def run_output(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """``kvbench run`` on the shipped suite, as a user runs it: (its stdout, the results directory)."""
    out = tmp_path_factory.mktemp("sec62")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert cli.main(["run", "paper-batched-requests", "--out", str(out), "--quiet", "--no-report"]) == 0
    return printed.getvalue(), out


@pytest.fixture(scope="module")
def table(run_output):  # type: ignore[no-untyped-def]
    records = load(run_output[1])
    assert (records.runs["status"] == "ok").all() and len(records.runs) == 8
    return published_vs_reproduced(records.reference, records.runs)


def test_kvbench_run_prints_published_vs_reproduced(run_output, table) -> None:  # type: ignore[no-untyped-def]
    printed = run_output[0]
    assert "published vs reproduced" in printed
    for item, basis in zip(table["item"], table["basis"]):
        line = next(x for x in printed.splitlines() if item in x)
        assert basis in line  # every row says whether a clock was fitted to it


def test_fitted_row_reproduces_and_predicted_ratios_are_within_15_percent(table) -> None:  # type: ignore[no-untyped-def]
    sharegpt = table[table["item"].str.contains("ShareGPT")]
    assert len(sharegpt) == 3 and sharegpt["reproduced"].notna().all()
    fitted = sharegpt[sharegpt["basis"] == "fitted"]
    assert len(fitted) == 1 and fitted["metric"].iloc[0] == "mean_running"
    # The shipped factor still fits (a change to sim's schedule or clock would show here first).
    assert fitted["reproduced"].iloc[0] == pytest.approx(30.42, rel=0.01)
    predicted = sharegpt[sharegpt["basis"] == "predicted"]
    assert len(predicted) == 2 and predicted["metric"].str.contains("÷").all()
    err = (predicted["reproduced"] / predicted["published"] - 1).abs()
    assert (err <= 0.15).all(), predicted[["item", "published", "reproduced"]].to_string()


def test_fit_roofline_finds_the_shipped_factor(capsys) -> None:  # type: ignore[no-untyped-def]
    shipped = float(re.search(r"^roofline_scale = ([0-9.]+)", SUITE.read_text(), re.M).group(1))
    assert cli.main(["fit-roofline", str(SUITE), "--workload", "sharegpt", "--target", "30.42"]) == 0
    out = capsys.readouterr().out
    fitted = float(re.search(r"fitted: roofline_scale = ([0-9.]+)", out).group(1))
    assert fitted == pytest.approx(shipped, rel=0.005)
    assert "put in the suite's [scheduler]: roofline_scale =" in out
