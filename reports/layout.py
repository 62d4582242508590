"""Fitting a table to the page: a section's columns as one or more tables that each fit a 1280 px
window.

A table wider than a laptop screen scrolls sideways and hides the columns that answer. So each
table is laid out for a 1280 px window: key columns whose value is the same in every row are
said once above it, and the remaining columns are split into narrower tables at the named sets
(then wherever the estimated width runs out), each repeating the key columns. The estimate is
deliberately coarse; tests/reports/test_report_browser.py measures the real page in Chromium.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pandas as pd

from .display import TEXT_KINDS, Column, ColumnSet, fmt

TABLE_PX = 1200  # a table's width budget: a 1280 px window's content (1233 px beside a scroll bar) less a margin
HEAD_CHAR_PX = 8.8  # a character of a header (bold, 0.85em system-ui)
BODY_CHAR_PX = 7.4  # a character of a cell (0.85em system-ui, digits and words)
CELL_PAD_PX = 15  # 7 px of padding either side and a border
HEADER_CHARS = 9  # headers wrap at spaces where the table is tight: counted at about this many characters
LONG_TEXT = 28  # a text cell longer than this wraps (html: class "long"), at a minimum width of
LONG_TEXT_CHARS = 22  # … about this many characters (12em)
NOTE_CHARS = 29  # a note column's minimum width (td.note: 16em)
# Headers that only mean something beside the column before them ("peak running on | off").
GLUED_HEADERS = ("off", "min", "max", "(lowest)", "")


@dataclasses.dataclass(frozen=True)
class Part:
    """One table of a laid-out section: a title (empty for a section shown whole) and its columns."""

    title: str
    columns: tuple[Column, ...]


@dataclasses.dataclass(frozen=True)
class Layout:
    """A section's tables: ``fixed`` are (header, value) of the key columns constant over its rows."""

    fixed: tuple[tuple[str, str], ...]
    parts: tuple[Part, ...]


def is_long(kind: str, value: str) -> bool:
    """A text cell long enough to be allowed to wrap."""
    return kind in TEXT_KINDS and kind != "note" and len(value) > LONG_TEXT


def column_px(column: Column, values: Sequence[str]) -> float:
    """The estimated width of a column whose cells read ``values``, its header wrapped where it can be."""
    _, header, kind = column
    words = [len(w) for w in header.split()] or [0]
    head = max(max(words), min(len(header), HEADER_CHARS)) * HEAD_CHAR_PX
    if kind == "note":
        body = NOTE_CHARS
    elif any(is_long(kind, v) for v in values):
        body = LONG_TEXT_CHARS
    else:
        body = max((len(v) for v in values), default=0)
    return max(head, body * BODY_CHAR_PX) + CELL_PAD_PX


def layout(
    columns: Sequence[Column],
    table: pd.DataFrame,
    keys: Sequence[str] = (),
    sets: Sequence[ColumnSet] = (),
    split: bool = False,
    once: Sequence[str] = (),
) -> Layout:
    """``columns`` of ``table`` as one or more tables that each fit ``TABLE_PX``.

    ``keys`` identify a row: in a table of two or more rows, those with one value throughout go to
    ``fixed``; the others lead every part. Columns in ``once`` go to ``fixed`` on the same terms but
    otherwise stay where they are. The remaining columns are split at ``sets`` (always with
    ``split``, else only when they do not fit together; columns in no set form a last one), and a
    set that still does not fit is cut where the width runs out (never before a glued header)."""
    records = table.to_dict("records")
    text = {c[0]: [fmt(c[2], r.get(c[0]), r) for r in records] for c in columns}
    fixed: list[tuple[str, str]] = []
    shown: list[Column] = []
    for col in columns:
        values = set(text[col[0]])
        if (col[0] in keys or col[0] in once) and len(records) > 1 and len(values) == 1:
            value = values.pop()
            if value != "-":  # a missing value said once says nothing
                fixed.append((col[1] or col[0], value))
            continue
        shown.append(col)
    lead = [c for c in shown if c[0] in keys]
    rest = [c for c in shown if c[0] not in keys]
    px = {c[0]: column_px(c, text[c[0]]) for c in shown}
    room = TABLE_PX - sum(px[c[0]] for c in lead)
    named = {k for _, members in sets for k in members}
    groups = [(title, [c for c in rest if c[0] in members]) for title, members in sets]
    groups.append(("", [c for c in rest if c[0] not in named]))
    groups = [(title, cols) for title, cols in groups if cols]
    if not split and sum(px[c[0]] for c in rest) <= room:
        groups = [("", rest)]
    parts: list[Part] = []
    for title, cols in groups:
        chunk: list[Column] = []
        used = 0.0
        for col in cols:
            if chunk and used + px[col[0]] > room and col[1] not in GLUED_HEADERS:
                parts.append(Part(title, (*lead, *chunk)))
                chunk, used = [], 0.0
            chunk.append(col)
            used += px[col[0]]
        parts.append(Part(title, (*lead, *chunk)))
    return Layout(tuple(fixed), tuple(parts) or (Part("", tuple(lead)),))


def fixed_text(fixed: Sequence[tuple[str, str]]) -> str:
    """'Every row: runner sim · status ok' (empty when nothing is fixed)."""
    return "Every row: " + " · ".join(f"{h} {v}" for h, v in fixed) + "." if fixed else ""
