"""The history page (``reports.history.page.render``) on a hand-built history: six nights (one
skipped), three cells (one failed on a night, one labelled with markup), three metrics, a step
and a regression. What it checks: the files, the order of the sections, the image maps (one area
per read night naming its night, commit and version, at the night's place in the PNG itself),
the skipped night and the notes, escaping; and, in headless Chromium when installed, that the
page's images load and it is no wider than a 1280 px window."""

from __future__ import annotations

import io
import math
import re
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from browserkit import WINDOW, needs_chromium, page_facts
from kvbench.reports.history.changes import DRIFT, EXACT, REGRESSION, STATUS, Change, Detection, Regressed
from kvbench.reports.history.graphs import REGRESSION_COLOR, palette
from kvbench.reports.history.nights import Night, Nights
from kvbench.reports.history.page import night_text, render, sparkline
from kvbench.reports.history.series import History
from matplotlib.colors import to_rgb
from matplotlib.image import imread

SKIPPED = 2  # the third night found has no runs/ table
FAILED_CELL, FAILED_NIGHT = 1, 3  # cell 1 failed on the fourth read night
STEP_NIGHT = 3  # cell 0's tokens_per_s falls 20% from the fourth read night
LABELS = ("sim/paged b16", "sim/contiguous-max <b16> & co", "vllm/paged b16")
METRICS = ("mean_running", "tokens_per_s", "preemptions")
NOTE = "1 cell(s) ran on one night only and are not followed"


def make_history(changes: bool = True) -> tuple[History, Detection]:
    """Six nights (one skipped), three cells, three metrics; with ``changes``, a step and a regression."""
    start = datetime(2026, 12, 1, 2, 15, tzinfo=UTC)
    nights = tuple(
        Night(
            name=f"{start + timedelta(days=i):%Y%m%dT%H%M%SZ}-c{i}abcdef",
            time=start + timedelta(days=i),
            commit=f"c{i}abcdef",
            version="" if i == SKIPPED else f"0.9.{i}",
            runs=0 if i == SKIPPED else 3,
            skipped="no runs/ table (the night's run did not complete)" if i == SKIPPED else None,
        )
        for i in range(6)
    )
    read = [n for n in nights if n.skipped is None]
    cells = pd.DataFrame(
        {
            "cell_id": [0, 1, 2],
            "cell": list(LABELS),
            "runner": ["sim", "sim", "vllm"],
            "policy": ["paged", "contiguous-max", "paged"],
            "block_size": [16, 16, 16],
            "clock": ["steps", "steps", "measured"],
            "nights": [5, 4, 5],
        }
    )
    status, points = [], []
    for c in range(3):
        for i, night in enumerate(read):
            ok = not (c == FAILED_CELL and i == FAILED_NIGHT)
            status.append((c, night.name, "ok" if ok else "failed", "" if ok else "CUDA out of memory"))
            if not ok:
                continue
            tps = 1000.0 * (c + 1) * (0.8 if c == 0 and i >= STEP_NIGHT and changes else 1.0) + (
                5.0 * i if c == 2 else 0
            )
            for metric, value in (("mean_running", 8.0 + c), ("tokens_per_s", tps), ("preemptions", 3.0 * (i == 4))):
                points.append((c, metric, night.name, i, value, metric == "tokens_per_s" and c == 2))
    history = History(
        Nights(Path("/nights"), nights, pd.DataFrame(), None),
        cells,
        pd.DataFrame(status, columns=["cell_id", "night", "status", "error"]),
        pd.DataFrame(points, columns=["cell_id", "metric", "night", "night_index", "value", "timed"]),
        (NOTE,),
    )
    fits = pd.DataFrame(
        [(2, "tokens_per_s", i, 3000.0 + 5.0 * i) for i in range(len(read))],
        columns=["cell_id", "metric", "night_index", "fit"],
    )
    step = Change(
        cell_id=0,
        cell=LABELS[0],
        runner="sim",
        policy="paged",
        block_size=16,
        metric="tokens_per_s",
        kind=EXACT,
        direction=REGRESSION,
        first_night=read[STEP_NIGHT].name,
        commit=read[STEP_NIGHT].commit,
        previous_night=read[STEP_NIGHT - 1].name,
        previous_commit=read[STEP_NIGHT - 1].commit,
        last_night=read[STEP_NIGHT].name,
        before=1000.0,
        after=800.0,
        ratio=0.8,
        noise=None,
    )
    regressed = Regressed(
        0, LABELS[0], "tokens_per_s", read[0].name, read[-1].name, 1000.0, 800.0, 0.8, step.first_night
    )
    detection = Detection(
        changes=(step,) if changes else (),
        fits=fits,
        reference_night=read[0].name,
        latest_night=read[-1].name,
        regressed=(regressed,) if changes else (),
        tolerance=0.05,
    )
    return history, detection


@pytest.fixture(scope="module")
def built() -> tuple[History, Detection, dict[str, bytes]]:
    history, detection = make_history()
    return history, detection, render(history, detection)


def page_of(files: dict[str, bytes]) -> str:
    return files["index.html"].decode("utf-8")


def maps(text: str) -> dict[str, list[tuple[tuple[int, ...], str]]]:
    """map name → its areas' (coords, title)."""
    found = {}
    for name, body in re.findall(r'<map name="([^"]+)">(.*?)</map>', text, re.S):
        areas = re.findall(r'<area shape="rect" coords="([\d,]+)"[^>]*title="([^"]*)"', body)
        found[name] = [(tuple(int(v) for v in coords.split(",")), title) for coords, title in areas]
    return found


def unescape(text: str) -> str:
    import html

    return html.unescape(text)


def test_render_returns_the_page_and_one_png_per_metric(built: tuple[History, Detection, dict[str, bytes]]) -> None:
    _, _, files = built
    assert set(files) == {"index.html", *(f"{m}.png" for m in METRICS)}
    for name in METRICS:
        png = files[f"{name}.png"]
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        image = imread(io.BytesIO(png), format="png")
        assert 0 < image.shape[1] <= 1200
        assert f'width="{image.shape[1]}" height="{image.shape[0]}"' in page_of(files)
    assert "<script" not in page_of(files) and "http" not in page_of(files)  # self-contained, no script


def test_a_metric_without_points_has_no_graph() -> None:
    history, detection = make_history()
    points = history.points[history.points["metric"] != "preemptions"]
    files = render(History(history.nights, history.cells, history.status, points, history.notes), detection)
    assert "preemptions.png" not in files and "tokens_per_s.png" in files
    assert 'id="graph-preemptions"' not in page_of(files)


def test_the_gate_and_the_changes_come_before_the_graphs(built: tuple[History, Detection, dict[str, bytes]]) -> None:
    history, detection, files = built
    text = page_of(files)
    read = history.nights.read
    assert text.index('id="gate"') < text.index('id="changes"') < text.index("<img")
    gate = text[text.index('id="gate"') : text.index('id="changes"')]
    assert f"1 regression(s) tonight against {read[0].name}" in gate
    assert "1000 → 800" in gate and "-20.0%" in gate and f"since {read[STEP_NIGHT].name}" in gate
    changes = text[text.index('id="changes"') : text.index('id="graphs"')]
    assert f"{read[STEP_NIGHT - 1].commit}..{read[STEP_NIGHT].commit}" in changes
    assert f"{read[STEP_NIGHT].name} ({read[STEP_NIGHT].commit})" in changes
    assert ">exact<" in changes and ">regression<" in changes and "-20.0%" in changes
    assert "tolerance of 5%" in text and f"against <b>{read[0].name}</b>" in text


def test_without_changes_the_page_says_so() -> None:
    history, detection = make_history(changes=False)
    text = page_of(render(history, detection))
    assert "No change found" in text and "No regression tonight" in text
    assert "regression(s) tonight" not in text


def many_cells(count: int) -> tuple[History, Detection]:
    """The six nights with ``count`` cells of one metric, a drift of cell 0 and cell 1 failing tonight."""
    history, detection = make_history()
    read = history.nights.read
    cells = pd.DataFrame(
        {
            "cell_id": range(count),
            "cell": [f"sim/paged b{16 * (c + 1)}" for c in range(count)],
            "runner": "sim",
            "policy": "paged",
            "block_size": [16 * (c + 1) for c in range(count)],
            "clock": "steps",
            "nights": len(read),
        }
    )
    tonight = len(read) - 1
    points = pd.DataFrame(
        [
            (c, "mean_running", n.name, i, 8.0 + c + (0.5 * i if c == 0 else 0.0), False)
            for c in range(count)
            for i, n in enumerate(read)
            if not (c == 1 and i == tonight)
        ],
        columns=["cell_id", "metric", "night", "night_index", "value", "timed"],
    )
    status = pd.DataFrame(
        [
            (c, n.name, "failed" if (c == 1 and i == tonight) else "ok", "")
            for c in range(count)
            for i, n in enumerate(read)
        ],
        columns=["cell_id", "night", "status", "error"],
    )
    drift = replace(
        detection.changes[0],
        metric="mean_running",
        kind=DRIFT,
        first_night=read[1].name,
        last_night=read[4].name,
        direction="improvement",
        ratio=1.25,
        noise=0.004,
    )
    stopped = Regressed(1, "sim/paged b32", STATUS, read[0].name, read[-1].name, math.nan, math.nan, math.nan, None)
    history = History(history.nights, cells, status, points, ())
    return history, replace(detection, changes=(drift,), fits=detection.fits.iloc[:0], regressed=(stopped,))


def test_with_more_than_12_cells_the_page_lists_the_colours() -> None:
    history, detection = many_cells(14)
    text = unescape(page_of(render(history, detection)))
    key = text[text.index('<div id="colours">') : text.index("<figure")]  # once, before the first graph
    assert key.count('<span class="sw"') == 14 and "sim/paged b224" in key
    figure = text[text.index('id="graph-mean_running"') : text.index("</figure>")]
    assert '<span class="sw"' not in figure and 'href="#colours"' in figure
    assert "+25.0%) over 4 nights through " + history.nights.read[4].name in text and "±0.4%" in text
    assert "sim/paged b32</b>: ran ok on " + history.nights.read[0].name + ", failed tonight" in text
    few = unescape(page_of(render(*many_cells(12))))
    assert '<ul class="key">' not in few and 'id="colours"' not in few  # the PNG's legend names them


def test_a_history_without_points_has_no_graph() -> None:
    history, detection = make_history()
    empty = History(history.nights, history.cells, history.status, history.points.iloc[:0], history.notes)
    files = render(empty, replace(detection, changes=(), regressed=(), fits=detection.fits.iloc[:0]))
    assert set(files) == {"index.html"} and "No metric has a value" in page_of(files)


def test_each_map_has_an_area_per_read_night_naming_it(built: tuple[History, Detection, dict[str, bytes]]) -> None:
    history, _, files = built
    text = page_of(files)
    found = maps(text)
    assert set(found) == {f"map-{m}" for m in METRICS}
    read = history.nights.read
    for name, areas in found.items():
        assert f'usemap="#{name}"' in text
        assert [unescape(t) for _, t in areas] == [night_text(n) for n in read]
        assert "commit c1abcdef · kvbench 0.9.1" in unescape(areas[1][1])
        lefts = [c[0] for c, _ in areas]
        assert lefts == sorted(lefts) and all(c[0] < c[2] and c[1] < c[3] for c, _ in areas)
    assert not any(history.nights.nights[SKIPPED].name in t for a in found.values() for _, t in a)


def test_an_area_centres_on_its_night_in_the_png(built: tuple[History, Detection, dict[str, bytes]]) -> None:
    """The step's dashed line is drawn at its night's x and the failure × at its night: both are
    found in the PNG's pixels, and the areas of those nights are centred on them; the areas' top
    and bottom are the axes' frame lines."""
    _, _, files = built
    image = imread(io.BytesIO(files["tokens_per_s.png"]), format="png")[:, :, :3]
    areas = [c for c, _ in maps(page_of(files))["map-tokens_per_s"]]
    left, top, right, bottom = areas[0][0], areas[0][1], areas[-1][2], areas[0][3]
    r, g, b = image[..., 0], image[..., 1], image[..., 2]
    # The change line is #c00000 over white: red above equal green and blue, in proportion to cover.
    red = np.where(np.abs(g - b) < 0.05, np.clip(r - g, 0, None), 0.0)
    line_r, line_g, line_b = to_rgb(REGRESSION_COLOR)
    assert line_g == line_b < line_r
    profile = red[top + 2 : bottom - 2, left:right].sum(axis=0)
    peak = int(np.argmax(profile))
    window = np.arange(max(peak - 4, 0), min(peak + 5, len(profile)))
    line_x = left + float((profile[window] * window).sum() / profile[window].sum())
    x0, _, x1, _ = areas[STEP_NIGHT]
    assert abs((x0 + x1) / 2 - line_x) <= 1.5, (areas, line_x)
    # The failure × in the failed cell's colour, at the foot of the axes.
    color = np.array(to_rgb(palette([0, 1, 2])[FAILED_CELL]))
    near = np.linalg.norm(image - color, axis=2) < 0.25
    rows = near[bottom - 25 : bottom, left:right]
    cols = np.flatnonzero(rows.any(axis=0))
    assert len(cols), "no failure mark found at the foot of the axes"
    x0, _, x1, _ = areas[FAILED_NIGHT]
    assert abs((x0 + x1) / 2 - (left + cols.mean())) <= 1.5
    # The frame: the darkest rows near the areas' top and bottom are the axes' spines.
    dark = 1 - image[:, left + 5 : right - 5].mean(axis=(1, 2))
    for edge in (top, bottom):
        assert abs(int(np.argmax(dark[edge - 3 : edge + 4])) - 3) <= 1, edge


def test_skipped_nights_and_notes_are_named(built: tuple[History, Detection, dict[str, bytes]]) -> None:
    history, _, files = built
    text = unescape(page_of(files))
    skipped = history.nights.nights[SKIPPED]
    notes = text[text.index('id="notes"') : text.index('id="graphs"')]
    assert f"Skipped night {skipped.name}: {skipped.skipped}" in re.sub(r"<[^>]+>", "", notes)
    assert NOTE in notes
    nights = text[text.index('id="nights"') :]
    assert all(n.name in nights for n in history.nights.nights) and "0.9.5" in nights


def test_labels_are_escaped(built: tuple[History, Detection, dict[str, bytes]]) -> None:
    text = page_of(built[2])
    assert "sim/contiguous-max &lt;b16&gt; &amp; co" in text
    assert "<b16>" not in text


def test_the_index_of_cells_has_sparklines_and_tonights_status(
    built: tuple[History, Detection, dict[str, bytes]],
) -> None:
    text = page_of(built[2])
    cells = text[text.index('id="cells"') : text.index('id="nights"')]
    assert cells.count("<tr><td") == 3
    assert cells.count("<polyline") == 3 * 3  # tokens/s, mean running and preemptions, per cell
    assert ">ok<" in cells and "reservation" not in cells  # a headline metric no cell measured has no column


def test_a_sparkline_holds_at_most_120_points() -> None:
    x = np.arange(365, dtype=float)
    svg = sparkline(x, np.sin(x / 20), 365, "a year")
    points = re.search(r'points="([^"]*)"', svg)
    assert points and 1 < len(points.group(1).split()) <= 120
    xs = [float(p.split(",")[0]) for p in points.group(1).split()]
    assert xs == sorted(xs) and 0 <= xs[0] < xs[-1] <= 110


# A probe for the browser test only (the page itself runs no script): facts on <body data-…>.
@needs_chromium
def test_in_a_browser_the_graphs_load_and_nothing_scrolls_sideways(
    built: tuple[History, Detection, dict[str, bytes]], tmp_path: Path
) -> None:
    _, _, files = built
    site = tmp_path / "history"
    site.mkdir()
    for name, data in files.items():
        (site / name).write_bytes(data)
    facts = page_facts(tmp_path / "profile", site / "index.html")
    assert facts["images-loaded"] == "yes", facts
    assert int(facts["image-count"]) == len(METRICS) == len([n for n in files if n.endswith(".png")])
    assert int(facts["viewport-width"]) <= WINDOW[0], facts
    assert int(facts["scroll-width"]) <= int(facts["viewport-width"]), facts
