"""The history page's graphs: one PNG per metric, every followed cell a line across the nights.

Cells measure on different scales (a sim cell's tokens/s against an engine's), so each line is
the cell's value ÷ its own median of that metric over the nights: 1 is the cell's usual level and
a step of 10% reads as 1.1 whatever the cell. A cell whose median is 0 (no preemptions on most
nights, a share that is usually nil) has no such scale; it is drawn as 1 + value ÷ its largest
|value|, so it sits on 1 where it is 0 and rises at most to 2, and the caption names it.

Nights where a cell ran but not ok are an ``x`` at the foot of the axes in the cell's colour;
each change of the metric is a dashed vertical line at its first night (a drift, a shaded span to
its last night), red for a regression and green for an improvement; a timed series' fit is a thin
dashed line. Each graph also returns, for the page's image map, every night's column in PNG
pixels, computed from the axes' own transform at the fixed size and dpi the PNG is saved at.
"""

from __future__ import annotations

import io
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.collections import Collection, LineCollection, PolyCollection
from matplotlib.colors import to_hex
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from ...harness.records.schema import OK
from ..compare import HIGHER_BETTER, METRICS
from .changes import DRIFT, REGRESSION, Change, Detection
from .nights import Night
from .series import History

DPI = 96
SIZE = (12.0, 4.5)  # inches: 1152 × 432 px at DPI, under the page's 1200 px
LEGEND_MAX = 12  # more cells than this: no legend in the PNG, the page lists the colours
MAX_TICKS = 12
LABEL_CHARS = 46  # a legend entry's length; the page holds the whole label
REGRESSION_COLOR = "#c00000"
IMPROVEMENT_COLOR = "#008a00"
MIN_SPAN = 0.1  # the y axis shows at least ±5% around the lines
FAIL_Y = 0.03  # the failure marks' height, as a fraction of the axes
# With a legend the axes leave its column on the right; without, they take the width.
MARGINS = {"left": 0.055, "top": 0.9, "bottom": 0.13}
RIGHT_WITH_LEGEND = 0.72
RIGHT_ALONE = 0.985


@dataclass(frozen=True)
class Graph:
    """One metric's PNG and what the page needs beside it.

    ``columns``: one (left, top, right, bottom) rectangle in PNG pixels per read night, in night
    order, spanning the plot area's height; ``cells``: the cell ids drawn (with ``colors``);
    ``offset``: the cells drawn as 1 + value ÷ largest |value| (their median is 0)."""

    metric: str
    title: str
    png: bytes
    width: int
    height: int
    columns: tuple[tuple[int, int, int, int], ...]
    cells: tuple[int, ...]
    offset: tuple[int, ...]
    legend: bool
    timed: str  # "timed", "deterministic" or "timed for N of M cells"


def palette(cell_ids: Sequence[int]) -> dict[int, str]:
    """A colour per cell, the same on every graph and in the page's keys: tab10 while it lasts,
    then the 60 colours of tab20, tab20b and tab20c (repeating beyond)."""
    names = ("tab10",) if len(cell_ids) <= 10 else ("tab20", "tab20b", "tab20c")
    colors = [to_hex(colormaps[name](i)) for name in names for i in range(colormaps[name].N)]
    return {int(c): colors[i % len(colors)] for i, c in enumerate(sorted(cell_ids))}


def night_label(night: Night) -> str:
    """A tick's text: "MM-DD sha7"."""
    return f"{night.time:%m-%d} {night.commit[:7]}"


def tick_positions(n: int) -> list[int]:
    """At most ``MAX_TICKS`` night indexes, evenly spaced from the first night."""
    step = max(1, math.ceil(n / MAX_TICKS))
    return list(range(0, n, step))


def png_size(png: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk: the size the file really has."""
    width, height = struct.unpack(">II", png[16:24])
    return int(width), int(height)


def night_columns(ax: Axes, n: int, height: int) -> tuple[tuple[int, int, int, int], ...]:
    """Each night's column of the plot area in PNG pixels (y counted from the top). Display
    coordinates are pixels from the figure's bottom left at its dpi, which the PNG is saved at."""
    edges = np.arange(n + 1) - 0.5
    xs = ax.transData.transform(np.column_stack((edges, np.zeros(n + 1))))[:, 0]
    (_, bottom), (_, top) = ax.transAxes.transform([(0.0, 0.0), (1.0, 1.0)])
    top_px, bottom_px = int(round(height - top)), int(round(height - bottom))
    lefts = np.rint(xs).astype(int)
    return tuple((int(lefts[i]), top_px, int(lefts[i + 1]), bottom_px) for i in range(n))


def scaled(points: pd.DataFrame) -> tuple[pd.DataFrame, dict[int, tuple[float, bool]]]:
    """One metric's points with ``y``, each value ÷ its cell's median (see the module's note for a
    median of 0), and each cell's (scale, offset) to put its fit on the same axis."""
    med = points.groupby("cell_id")["value"].median().abs()
    top = points["value"].abs().groupby(points["cell_id"]).max()
    scales: dict[int, tuple[float, bool]] = {}
    for cell_id, m in med.items():
        if m > 0 and math.isfinite(m):
            scales[int(cell_id)] = (float(m), False)
        else:
            t = float(top.get(cell_id, 0.0))
            scales[int(cell_id)] = (t if t > 0 and math.isfinite(t) else 1.0, True)
    return points.assign(y=apply_scale(points["cell_id"], points["value"], scales)), scales


def apply_scale(cell_ids: pd.Series, values: pd.Series, scales: dict[int, tuple[float, bool]]) -> np.ndarray:
    """``values`` on the graph's axis: ÷ their cell's scale, plus 1 for a cell drawn offset."""
    ids = np.array(sorted(scales), dtype=np.int64)
    scale = np.array([scales[int(c)][0] for c in ids])
    offset = np.array([1.0 if scales[int(c)][1] else 0.0 for c in ids])
    at = np.searchsorted(ids, cell_ids.to_numpy(np.int64))
    return offset[at] + values.to_numpy(float) / scale[at]


def series_segments(frame: pd.DataFrame, y: str) -> tuple[list[np.ndarray], list[int]]:
    """One polyline per cell through its nights (``frame`` sorted by cell, then night)."""
    if not len(frame):
        return [], []
    cells = frame["cell_id"].to_numpy()
    xy = np.column_stack((frame["night_index"].to_numpy(float), frame[y].to_numpy(float)))
    cuts = np.flatnonzero(np.diff(cells)) + 1
    starts = np.concatenate(([0], cuts))
    return list(np.split(xy, cuts)), [int(cells[s]) for s in starts]


def corners(frame: pd.DataFrame, y: str) -> pd.DataFrame:
    """The rows of a piecewise-linear series (sorted by cell, then night) where it bends or a cell
    begins or ends: the same line with a few vertices (a level fit of a year is two), so its dashes
    cost nothing to draw."""
    if len(frame) < 3:
        return frame
    cells = frame["cell_id"].to_numpy()
    x = frame["night_index"].to_numpy(float)
    v = frame[y].to_numpy(float)
    slope = np.diff(v) / np.where(np.diff(x) == 0, 1.0, np.diff(x))
    bend = ~np.isclose(slope[1:], slope[:-1], rtol=1e-9, atol=1e-12)
    edge = (cells[1:-1] != cells[:-2]) | (cells[1:-1] != cells[2:])
    keep = np.concatenate(([True], bend | edge, [True]))
    return frame[keep]


def timed_word(points: pd.DataFrame) -> str:
    """Whether the metric is timed (noisy) on this graph's cells, deterministic, or mixed."""
    per_cell = points.groupby("cell_id")["timed"].any()
    timed, total = int(per_cell.sum()), len(per_cell)
    if timed == total:
        return "timed"
    return "deterministic" if timed == 0 else f"timed for {timed} of {total} cells"


def title_of(metric: str, timed: str) -> str:
    better = "higher is better" if metric in HIGHER_BETTER else "lower is better"
    kind = {
        "timed": "timed: noisy from night to night",
        "deterministic": "deterministic: any move is a change",
    }.get(timed, f"{timed}, deterministic for the rest")
    return f"{metric} ({kind}; {better})"


def metric_order(points: pd.DataFrame) -> list[str]:
    """The metrics with at least one point: ``compare.METRICS``' order, then any others by name."""
    present = set(points["metric"].unique()) if len(points) else set()
    return [m for m in METRICS if m in present] + sorted(present - set(METRICS))


def change_marks(ax: Axes, changes: Sequence[Change], index: dict[str, int]) -> list[Collection]:
    """A dashed line at each change's first night; a drift, a span from first to last night."""
    lines, line_colors, spans, span_colors = [], [], [], []
    for c in changes:
        if c.first_night not in index:
            continue
        color = REGRESSION_COLOR if c.direction == REGRESSION else IMPROVEMENT_COLOR
        x0 = index[c.first_night]
        if c.kind == DRIFT and c.last_night in index:
            x1 = index[c.last_night]
            spans.append([(x0, 0.0), (x1, 0.0), (x1, 1.0), (x0, 1.0)])
            span_colors.append(color)
        lines.append([(x0, 0.0), (x0, 1.0)])
        line_colors.append(color)
    trans = ax.get_xaxis_transform()  # x in nights, y in the axes' height
    out: list[Collection] = []
    if spans:
        out.append(PolyCollection(spans, facecolors=span_colors, alpha=0.12, linewidths=0, transform=trans))
    if lines:
        out.append(
            LineCollection(lines, colors=line_colors, linestyles="--", linewidths=1.1, transform=trans, zorder=1)
        )
    return out


class Frame:
    """One figure reused for every metric's graph: the axes, the night axis and the labels are laid
    out once (the nights are the same on every graph); each graph adds its artists, is saved, and
    takes them off again."""

    def __init__(self, nights: Sequence[Night]) -> None:
        self.nights = list(nights)
        self.figure = Figure(figsize=SIZE, dpi=DPI)
        self.ax = ax = self.figure.add_subplot()
        n = len(self.nights)
        ax.set_xlim(-0.5, n - 0.5)
        ticks = tick_positions(n)
        ax.set_xticks(ticks)
        ax.set_xticklabels([night_label(self.nights[i]) for i in ticks], fontsize=7)
        ax.tick_params(axis="y", labelsize=7)
        ax.grid(axis="y", color="#e6e6e6", linewidth=0.6)
        ax.axhline(1.0, color="#999999", linewidth=0.6, zorder=1)
        ax.set_ylabel("value ÷ the cell's median over the nights", fontsize=7.5)
        ax.set_xlabel("night (UTC date, commit)", fontsize=7.5)
        # A figure text, not the axes' title: the axes would measure every label to place it.
        self.title = self.figure.text(MARGINS["left"], 0.935, "", fontsize=9.5, ha="left", va="bottom")
        self.index = {night.name: i for i, night in enumerate(self.nights)}

    def close(self) -> None:
        """Drop every artist (the figure belongs to no pyplot registry: nothing else holds it)."""
        self.figure.clear()


def draw_graph(
    frame: Frame,
    metric: str,
    points: pd.DataFrame,
    fits: pd.DataFrame,
    failures: pd.DataFrame,
    changes: Sequence[Change],
    labels: dict[int, str],
    colors: dict[int, str],
) -> Graph:
    """One metric's graph on ``frame``. ``points``/``fits`` are that metric's rows; ``failures``:
    (cell_id, night_index) of nights a cell ran but not ok, over every cell (those drawn here are
    kept)."""
    ax, fig = frame.ax, frame.figure
    points = points.sort_values(["cell_id", "night_index"], kind="stable")
    points, scales = scaled(points)
    cells = sorted(scales)
    offset = tuple(c for c in cells if scales[c][1])
    timed = timed_word(points)
    legend = len(cells) <= LEGEND_MAX
    fig.subplots_adjust(right=RIGHT_WITH_LEGEND if legend else RIGHT_ALONE, **MARGINS)
    added: list[Collection] = []
    segments, owners = series_segments(corners(points, "y"), "y")
    added.append(LineCollection(segments, colors=[colors[c] for c in owners], linewidths=1.0, zorder=3))
    if len(fits):
        fits = fits[fits["cell_id"].isin(scales)].sort_values(["cell_id", "night_index"], kind="stable")
        fits = corners(fits.assign(y=apply_scale(fits["cell_id"], fits["fit"], scales)), "y")
        segments, owners = series_segments(fits, "y")
        added.append(
            LineCollection(
                segments, colors=[colors[c] for c in owners], linewidths=0.7, linestyles="--", alpha=0.7, zorder=2
            )
        )
    added += change_marks(ax, changes, frame.index)
    for artist in added:
        ax.add_collection(artist, autolim=False)
    failed = failures[failures["cell_id"].isin(scales)]
    if len(failed):
        added.append(
            ax.scatter(
                failed["night_index"].to_numpy(float),
                np.full(len(failed), FAIL_Y),
                marker="x",
                s=22,
                linewidths=1.2,
                c=[colors[int(c)] for c in failed["cell_id"]],
                transform=ax.get_xaxis_transform(),
                zorder=4,
                clip_on=False,
            )
        )
    ax.set_ylim(*y_limits(points["y"].to_numpy(float)))
    title = title_of(metric, timed)
    frame.title.set_text(title)
    if legend:
        handles = [Line2D([], [], color=colors[c], linewidth=1.5) for c in cells]
        names = [shorten(labels.get(c, str(c)) + (" (0-median)" if c in offset else "")) for c in cells]
        ax.legend(handles, names, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
    buf = io.BytesIO()
    # The figure's own dpi and no tight bbox, so the PNG's pixels are where the transforms say;
    # light compression: at the default level, encoding a year of noisy lines takes as long as drawing them.
    fig.savefig(buf, format="png", dpi=DPI, pil_kwargs={"compress_level": 2})
    png = buf.getvalue()
    width, height = png_size(png)
    columns = night_columns(ax, len(frame.nights), height)
    for artist in added:
        artist.remove()
    shown = ax.get_legend()
    if shown is not None:
        shown.remove()
    return Graph(metric, title, png, width, height, columns, tuple(cells), offset, legend, timed)


def y_limits(ys: np.ndarray) -> tuple[float, float]:
    """The lines' range with 1 in it, padded, and a strip at the foot for the failure marks."""
    finite = ys[np.isfinite(ys)]
    low, high = (float(finite.min()), float(finite.max())) if len(finite) else (0.0, 2.0)
    low, high = min(low, 1.0), max(high, 1.0)
    if high - low < MIN_SPAN:  # flat lines: a readable band around them, not ticks in the fourth decimal
        middle = (high + low) / 2
        low, high = middle - MIN_SPAN / 2, middle + MIN_SPAN / 2
    pad = (high - low) * 0.08
    return low - pad - (high - low + 2 * pad) * FAIL_Y * 2, high + pad


def shorten(label: str) -> str:
    return label if len(label) <= LABEL_CHARS else label[: LABEL_CHARS - 1] + "…"


def failure_marks(history: History) -> pd.DataFrame:
    """(cell_id, night_index) of each night a cell ran and was not ok."""
    status = history.status
    if not len(status):
        return pd.DataFrame({"cell_id": [], "night_index": []})
    bad = status[status["status"] != OK]
    marks = pd.DataFrame({"cell_id": bad["cell_id"].astype(int), "night_index": bad["night"].map(history.night_index)})
    return marks.dropna().astype({"night_index": int})


def draw_all(history: History, detection: Detection, labels: dict[int, str], colors: dict[int, str]) -> list[Graph]:
    """A graph per metric with at least one point, in ``metric_order``; each cell by its label and
    colour (``palette``), the same as the page's."""
    points = history.points
    if not len(points):
        return []
    failures = failure_marks(history)
    by_metric = dict(tuple(points.groupby("metric", sort=False)))
    fits = detection.fits
    fits_by = dict(tuple(fits.groupby("metric", sort=False))) if len(fits) else {}
    changes: dict[str, list[Change]] = {}
    for c in detection.changes:
        changes.setdefault(c.metric, []).append(c)
    no_fits = pd.DataFrame({"cell_id": [], "night_index": [], "fit": []})
    frame = Frame(history.nights.read)
    try:
        return [
            draw_graph(frame, m, by_metric[m], fits_by.get(m, no_fits), failures, changes.get(m, []), labels, colors)
            for m in metric_order(points)
        ]
    finally:
        frame.close()
