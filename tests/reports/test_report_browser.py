"""The report page in a real headless Chromium: every figure loads from disk, no console errors, and at
a laptop's 1280 × 800 window the findings are on the first screen and nothing scrolls sideways.

Chromium comes from ``browserkit``; without it the test is skipped.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from browserkit import WINDOW, body_facts, chromium, needs_chromium
from conftest import kvbench, suite_toml
from reportkit import write_golden

FIGURES = 7  # the golden records hold what every figure needs

pytestmark = needs_chromium


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from kvbench.reports.html import write_report

    return write_report(write_golden(tmp_path_factory.mktemp("browser") / "results"))


@pytest.fixture(scope="module")
def real_page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real `kvbench run` of a small suite: sim, two contiguous baselines and paged at two block sizes,
    on two workloads (two comparison groups), its report written as the run writes it."""
    root = tmp_path_factory.mktemp("real")
    short = {"source": "fixed", "prompt_len": 64, "output_len": 32, "num_requests": 24, "arrival": "batch"}
    mixed = {"source": "uniform", "prompt_min": 16, "prompt_max": 400, "output_min": 16, "output_max": 200}
    suite = root / "suite.toml"
    suite.write_text(
        suite_toml(
            "browser",
            model={"preset": "opt-13b", "kv_dtype": "fp16"},
            memory={"kv_budget": "1GiB", "max_model_len": 1024},
            workloads={"short": short, "mixed": {**mixed, "num_requests": 24, "arrival": "batch", "seed": 0}},
            grid={
                "runner": ["sim"],
                "policy": ["contiguous-max", "contiguous-oracle", "paged"],
                "block_size": [16, 32],
            },
        )
    )
    done = kvbench("run", suite, "--out", root / "out", "--quiet")
    assert done.returncode == 0, done.stderr
    return root / "out" / "report" / "index.html"


def console_messages(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


def test_every_image_loads_without_console_errors(page: Path, tmp_path: Path) -> None:
    done = chromium(tmp_path / "profile", "--virtual-time-budget=5000", "--dump-dom", page.as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    body = re.search(r"<body[^>]*>", dom)
    assert body, dom[:500]
    assert 'data-images-loaded="true"' in body.group(0), body.group(0)
    assert f'data-image-count="{FIGURES}"' in body.group(0), body.group(0)
    assert len(re.findall(r"<img ", dom)) == FIGURES
    assert console_messages(done.stderr) == []


def test_screenshot_shows_the_page(page: Path, tmp_path: Path) -> None:
    shot = tmp_path / "shot.png"
    done = chromium(
        tmp_path / "profile",
        f"--screenshot={shot}",
        "--window-size=1280,4000",
        "--hide-scrollbars",
        "--virtual-time-budget=5000",
        page.as_uri(),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 50_000
    assert console_messages(done.stderr) == []


@pytest.mark.parametrize("records", ["golden", "real"])
def test_the_first_screen_holds_the_findings_and_nothing_scrolls_sideways(
    records: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    page = request.getfixturevalue("page" if records == "golden" else "real_page")
    facts = body_facts(tmp_path / "profile", page)
    assert int(facts["viewport-width"]) == WINDOW[0], facts
    assert 0 < int(facts["findings-top"]) < WINDOW[1], facts  # the answer is on the first screen
    assert int(facts["scroll-width"]) <= int(facts["viewport-width"]), facts  # no sideways scrolling
    assert int(facts["tables-overflowing"]) == 0, facts  # no table runs past the page's content box
    assert 0 < int(facts["widest-table"]) <= int(facts["content-width"]) < WINDOW[0], facts
    text = page.read_text()
    assert text.index('id="findings"') < text.index('id="figures"') < text.index('id="group-1"')
    if records == "real":  # two groups, each paged set against both contiguous baselines the run recorded
        from kvbench.reports.contents import report_tables
        from kvbench.reports.loading import load

        cells = report_tables(load(page.parents[1]).runs).cells
        assert text.count('class="finding"') == cells["group"].nunique() == 2
        for _, sub in cells.groupby("group"):
            paged = sub[(sub["policy"] == "paged") & (sub["block_size"] == 16)].iloc[0]
            base = sub[sub["policy"] == "contiguous-max"].iloc[0]
            x = paged["mean_running"] / base["mean_running"]
            assert f"ran <strong>{x:.2f}×</strong> the mean concurrency of contiguous-max" in text
        assert text.count("Against contiguous-oracle") == 2
