"""Pure helpers that pick what each figure shows, and the arithmetic the last-block-waste figure draws.

``cells`` is the per-cell table of ``reports.tables.summary``.
"""

from __future__ import annotations

import dataclasses
import textwrap
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from ..harness.spec.capabilities import BLOCK_TABLE_POLICIES, PAGE_SIZED_POLICIES
from ..harness.spec.units import format_bytes
from .labels import CELL_KEYS, GROUP_KEYS, figure_label, scheduler_settings

MAX_GROUP_PANELS = 6
MAX_TIMELINES = 9
PREFERRED_BLOCK = 16  # paged cells at several block sizes: timelines and sweeps show the one nearest this
WASTE_BLOCKS = (8, 16, 32)
MAX_PLOT_POINTS = 4000


def first_groups(cells: pd.DataFrame) -> tuple[list[tuple[int, pd.DataFrame]], int]:
    """The first ``MAX_GROUP_PANELS`` comparison groups (in table order) and how many are left out."""
    groups = list(cells.groupby("group", sort=True))
    return groups[:MAX_GROUP_PANELS], max(0, len(groups) - MAX_GROUP_PANELS)


def block_rank(block_size: Any) -> tuple[float, float]:
    """How near a block size is to ``PREFERRED_BLOCK`` (by factors of two; the smaller first on a tie)."""
    b = float(block_size) if block_size is not None and block_size == block_size else 1.0
    return abs(float(np.log2(max(b, 1.0))) - float(np.log2(PREFERRED_BLOCK))), b


def preferred_block(blocks: Sequence[Any]) -> int | None:
    """Of ``blocks``, the one a figure or a sentence speaks of (``block_rank``); None for none."""
    sizes = {int(b) for b in blocks if b is not None and b == b}
    return min(sizes, key=block_rank) if sizes else None


def one_block_size(cells: pd.DataFrame) -> pd.DataFrame:
    """Per (group, runner, policy), only the block size nearest ``PREFERRED_BLOCK`` (``block_rank``)."""
    if cells.empty:
        return cells
    ranked = cells.assign(_d=cells["block_size"].map(block_rank)).sort_values("_d", kind="stable")
    keep = ranked.drop_duplicates(["group", "runner", "policy"]).index
    return cells.loc[cells.index.isin(keep)]


def primary_group(cells: pd.DataFrame, steps: pd.DataFrame) -> int | None:
    """The comparison group with the most ok cells that have step records; on a tie, the one under
    the most memory pressure (least free budget on average), then the first."""
    if cells.empty or steps.empty:
        return None
    have = set(steps["run_id"].unique())
    ok = cells[(cells["ok"] > 0) & cells["run_id"].isin(have)]
    if ok.empty:
        return None
    stats = ok.groupby("group").agg(n=("run_id", "size"), free=("free_frac", "mean")).reset_index()
    stats = stats.sort_values(["n", "free", "group"], ascending=[False, True, True], na_position="last")
    return int(stats["group"].iloc[0])


def timeline_cells(cells: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """The cells whose step records figures 3 and 4 draw: the primary group, one block size per policy."""
    group = primary_group(cells, steps)
    if group is None:
        return cells.iloc[0:0]
    have = set(steps["run_id"].unique())
    sub = cells[(cells["group"] == group) & (cells["ok"] > 0) & cells["run_id"].isin(have)]
    return one_block_size(sub).head(MAX_TIMELINES)


def selection_note(cells: pd.DataFrame, picked: pd.DataFrame) -> str:
    """Which runs a per-group figure shows, and what it leaves out."""
    group = picked["group"].iloc[0]
    in_group = cells[(cells["group"] == group) & (cells["ok"] > 0)]
    notes = [f"Comparison group: {picked['group_label'].iloc[0]}."]
    if len(in_group) > len(picked):
        notes.append(
            f"Shown: {len(picked)} of its {len(in_group)} ok runs (paged policies at the block size "
            f"nearest {PREFERRED_BLOCK}; the block-size-ablation figure covers the others)."
        )
    others = cells["group"].nunique() - 1
    if others:
        notes.append(f"{others} other comparison group(s) are in the tables only.")
    notes.append("Time series from the first ok repetition of each cell.")
    return " ".join(notes)


def thin(steps: pd.DataFrame, max_points: int = MAX_PLOT_POINTS) -> pd.DataFrame:
    """Every k-th step (and the last), so a long run plots quickly; the shape is kept."""
    if len(steps) <= max_points:
        return steps
    k = -(-len(steps) // max_points)
    return pd.concat([steps.iloc[::k], steps.iloc[[-1]]])


def rate_families(cells: pd.DataFrame) -> list[pd.DataFrame]:
    """Ok cells grouped by everything but the workload's rate; only groups run at two or more rates."""
    ok = cells[(cells["ok"] > 0) & cells["rate"].notna()]
    keys = ["family", "model", "kv_dtype", "budget_bytes", "max_model_len", "scheduler"]
    out = []
    for _, fam in ok.groupby(keys, sort=False):
        if fam["rate"].nunique() >= 2:
            out.append(one_block_size(fam))
    return out


def block_size_lines(cells: pd.DataFrame) -> list[pd.DataFrame]:
    """Per (group, runner, paged policy): its cells when run at two or more block sizes, by block size.
    ``paged`` only when it has such lines (``paged-prefix`` and others otherwise), to keep the figure legible."""
    ok = cells[(cells["ok"] > 0) & cells["policy"].isin(("paged", "paged-prefix"))]
    lines = [
        sub.sort_values("block_size")
        for _, sub in ok.groupby(["group", "runner", "policy"], sort=True)
        if sub["block_size"].nunique() >= 2
    ]
    plain = [line for line in lines if line["policy"].iloc[0] == "paged"]
    return (plain or lines)[:10]


# -- last-block waste: arithmetic over lengths ------------------------------------------


def unused_fraction(lengths: np.ndarray, block_size: int) -> np.ndarray:
    """Unused share of the positions paged allocation holds for a sequence of each length:
    (⌈L/B⌉·B − L) / (⌈L/B⌉·B). 35 tokens at block 16: (48 − 35) / 48 = 13/48."""
    lengths = np.asarray(lengths, dtype=np.int64)
    allocated = -(-lengths // block_size) * block_size
    return (allocated - lengths) / allocated


def recorded_waste(lengths: np.ndarray, sizes: list[int]) -> list[tuple[int, float]]:
    """Per block size: Σ unused / Σ allocated positions over the given final lengths."""
    out = []
    for bs in sizes:
        allocated = -(-lengths // bs) * bs
        out.append((bs, float((allocated - lengths).sum() / allocated.sum())))
    return out


def final_lengths(runs: pd.DataFrame, requests: pd.DataFrame) -> np.ndarray:
    """prompt + output of every request of each distinct workload (one run's requests per workload)."""
    if requests.empty or runs.empty:
        return np.array([], dtype=np.int64)
    have = set(requests["run_id"].unique())
    firsts = runs[runs["run_id"].isin(have)].drop_duplicates("workload_id")["run_id"]
    req = requests[requests["run_id"].isin(set(firsts))]
    return (req["prompt_len"] + req["output_len"]).to_numpy(dtype=np.int64)


def workload_count(runs: pd.DataFrame, requests: pd.DataFrame) -> int:
    if requests.empty:
        return 0
    return int(runs[runs["run_id"].isin(set(requests["run_id"]))]["workload_id"].nunique())


def waste_block_sizes(runs: pd.DataFrame) -> list[int]:
    """8, 16, 32 and every paged block size in the records (up to 256)."""
    paged = runs.loc[runs["policy"].isin(("paged", "paged-prefix")), "block_size"] if len(runs) else []
    return sorted(set(WASTE_BLOCKS) | {int(b) for b in paged if 1 < int(b) <= 256})


# -- swept curves: metrics against each numeric swept axis --------------------------------

MIN_CURVE_POINTS = 3  # two points make a segment, not a curve: the rate-sweep figure and the tables cover those
MAX_CURVE_LINES = 10  # per panel; more and colours and markers stop being tellable apart
MAX_CURVE_CONTEXTS = 4  # workloads (or budgets …) overlaid in one panel, one marker each
LOG_SPAN = 4.0  # a log x axis once the values span this factor (else a linear one reads better)
# What a line holds fixed besides its cell: the workload without its rate, and the rate.
# workload_id is left out of this set: it changes with the rate, and family + rate name it.
CONTEXT_KEYS: tuple[str, ...] = ("family", "rate") + tuple(k for k in GROUP_KEYS if k != "workload_id")


@dataclasses.dataclass(frozen=True)
class AxisSpec:
    """A numeric setting a suite may sweep, and how to read it."""

    column: str
    label: str
    unit: str
    policies: tuple[str, ...] | None  # only these policies vary along it (None: every one)


def _plain_number(v: float) -> str:
    return f"{v:g}"


def _int_number(v: float) -> str:
    return str(int(v))


def short_bytes(v: float) -> str:
    """'4 GiB' rather than '4.0 GiB': tick labels sit close together."""
    return format_bytes(v).replace(".0 ", " ")


AXIS_SPECS: tuple[AxisSpec, ...] = (
    AxisSpec("rate", "request rate", "req/s", None),
    AxisSpec("budget_bytes", "KV budget", "bytes", None),
    AxisSpec("max_model_len", "max_model_len", "tokens", None),
    # Contiguous cells carry block size 1: the block size means nothing to them.
    AxisSpec("block_size", "block size", "tokens/block", BLOCK_TABLE_POLICIES),
    AxisSpec("page_bytes", "page size", "bytes", PAGE_SIZED_POLICIES),
)
TICK_FORMATS: dict[str, Callable[[float], str]] = {
    "rate": _plain_number,
    "budget_bytes": short_bytes,
    "max_model_len": _int_number,
    "block_size": _int_number,
    "page_bytes": short_bytes,
}


@dataclasses.dataclass(frozen=True, eq=False)
class SweptAxis:
    """One swept axis: the cells that agree on everything else, as lines sorted by the axis."""

    column: str
    label: str
    unit: str
    log: bool  # a log scale suits these values
    lines: tuple[pd.DataFrame, ...]  # each: ≥ MIN_CURVE_POINTS cells, one per value, sorted by ``column``

    @property
    def values(self) -> list[float]:
        """Every value any line takes, sorted."""
        return sorted({float(v) for line in self.lines for v in line[self.column]})

    def tick_label(self, value: float) -> str:
        return TICK_FORMATS.get(self.column, _plain_number)(value)

    def axis_title(self) -> str:
        unit = "" if self.unit == "bytes" else f", {self.unit}"  # byte ticks carry their unit
        return f"{self.label}{unit}" + (" (log)" if self.log else "")


def _line_keys(cells: pd.DataFrame, axis: str) -> list[str]:
    """Everything a line holds fixed: the context and the cell keys, less the axis itself."""
    drop = {axis, "workload_id"} if axis == "rate" else {axis}
    return [k for k in dict.fromkeys(CONTEXT_KEYS + ("workload_id",) + CELL_KEYS) if k in cells and k not in drop]


def _key_text(frame: pd.DataFrame, keys: list[str]) -> pd.Series:
    """One string per row naming its values of ``keys``; null spelt one way (None, NaN, NaT
    all read as missing), so rows that lack a key still group together."""
    parts = [frame[k].map(_hashable) for k in keys]
    if not parts:
        return pd.Series([""] * len(frame), index=frame.index)
    text = parts[0]
    for p in parts[1:]:
        text = text + "\x1f" + p
    return text


def axis_lines(cells: pd.DataFrame, spec: AxisSpec) -> list[pd.DataFrame]:
    """The lines of one axis: ok cells of its policies that agree on every other key and
    take ``MIN_CURVE_POINTS`` or more distinct positive values of it, each sorted by it."""
    if cells.empty or spec.column not in cells:
        return []
    values = pd.to_numeric(cells[spec.column], errors="coerce")
    ok = cells[(cells["ok"] > 0) & (values > 0)]
    if spec.policies is not None:
        ok = ok[ok["policy"].isin(spec.policies)]
    if ok.empty:
        return []
    ok = ok.assign(**{spec.column: pd.to_numeric(ok[spec.column], errors="coerce").astype(float)})
    key = _key_text(ok, _line_keys(ok, spec.column))
    lines = []
    for _, line in ok.groupby(key, sort=False):
        # One cell per value: summary's cells are unique by their keys, so a repeat here could only
        # come from a key this table lacks; a line cannot go back on itself either way.
        line = line.drop_duplicates(spec.column).sort_values(spec.column, kind="stable")
        if len(line) >= MIN_CURVE_POINTS:
            lines.append(line)
    return lines


def swept_axes(cells: pd.DataFrame, specs: tuple[AxisSpec, ...] = AXIS_SPECS) -> list[SweptAxis]:
    """Every axis of ``specs`` some line sweeps over ``MIN_CURVE_POINTS`` or more values, in ``specs`` order."""
    out = []
    for spec in specs:
        lines = axis_lines(cells, spec)
        if not lines:
            continue
        xs = [float(v) for line in lines for v in line[spec.column]]
        # All five are set in doublings or decades when swept widely: log spaces those evenly.
        log = max(xs) / min(xs) >= LOG_SPAN
        out.append(SweptAxis(spec.column, spec.label, spec.unit, log, tuple(lines)))
    return out


def _cell_part(line: pd.DataFrame) -> tuple[str, ...]:
    """The line's cell keys but the block size, nulls spelt one way (NaN never equals NaN)."""
    r = line.iloc[0]
    return tuple(_hashable(r.get(k)) for k in ("runner", "policy", "device", "page_bytes", "arena"))


def _hashable(value: Any) -> str:
    return "-" if value is None or value != value else str(value)


@dataclasses.dataclass(frozen=True)
class Readable:
    """The lines one row of the swept-curves figure draws, and what it leaves to the tables."""

    lines: list[pd.DataFrame]
    left_lines: int  # lines of contexts not drawn (the block sizes not drawn are not counted)
    left_contexts: int


def readable_lines(
    axis: SweptAxis, max_lines: int = MAX_CURVE_LINES, max_contexts: int = MAX_CURVE_CONTEXTS
) -> Readable:
    """The lines a row of panels draws. Off the block-size axis, paged policies keep only the
    block size nearest ``PREFERRED_BLOCK`` (one line per runner and policy, as the rate-sweep figure); then
    whole contexts (workload, budget …, in table order) are kept while they fit in ``max_lines``
    and ``max_contexts``, so a context is never drawn with some of its policies missing."""
    lines = list(axis.lines)
    if axis.column != "block_size":
        best: dict[tuple[str, tuple[str, ...]], pd.DataFrame] = {}
        for line in lines:
            key = (_context_of(line, axis.column), _cell_part(line))
            held = best.get(key)
            if held is None or block_rank(line.iloc[0]["block_size"]) < block_rank(held.iloc[0]["block_size"]):
                best[key] = line
        chosen = {id(b) for b in best.values()}
        lines = [line for line in lines if id(line) in chosen]
    contexts = _by_context(lines, axis.column)
    shown: list[pd.DataFrame] = []
    kept = 0
    for ctx in contexts:
        if kept == max_contexts or len(shown) + len(ctx) > max_lines:
            if not shown:  # one context alone has too many lines: its first ones
                shown, kept = ctx[:max_lines], 1
            break
        shown += ctx
        kept += 1
    return Readable(shown, len(lines) - len(shown), len(contexts) - kept)


def _context_of(line: pd.DataFrame, axis: str) -> str:
    keys = [k for k in CONTEXT_KEYS if k in line and k != axis]
    return str(_key_text(line.iloc[:1], keys).iloc[0])


def _by_context(lines: list[pd.DataFrame], axis: str) -> list[list[pd.DataFrame]]:
    groups: dict[str, list[pd.DataFrame]] = {}
    for line in lines:
        groups.setdefault(_context_of(line, axis), []).append(line)
    return list(groups.values())


def _context_words(key: str, value: Any, others: list[Any]) -> str:
    """How a line's context names one key that differs among the lines drawn together."""
    if key == "family":  # the workload label less the parts every line shares ('poisson', say)
        shared = set.intersection(*(set(str(o).split(", ")) for o in others))
        return ", ".join(p for p in str(value).split(", ") if p not in shared) or str(value)
    if key == "rate":
        return f"{float(value):g} req/s" if value is not None and value == value else "no rate"
    if key == "budget_bytes":
        return f"budget {short_bytes(float(value))}"
    if key == "kv_dtype":
        return f"KV {value}"
    if key == "max_model_len":
        return f"max_model_len {int(value)}"
    if key == "scheduler":
        mine, theirs = scheduler_settings(value), [scheduler_settings(o) for o in others]
        differ = [k for k in sorted(mine) if any(t.get(k) != mine.get(k) for t in theirs)]
        return ", ".join(f"{k} {mine.get(k)}" for k in differ) or "scheduler"
    return str(value)


def context_labels(lines: list[pd.DataFrame], axis: str, width: int = 44) -> list[str]:
    """Per line, what tells it from the other lines drawn with it besides its runner and
    policy: the context keys that differ among them ('alpaca, 200 req · budget 4 GiB'),
    each line's shortened to ``width``; "" for every line when they share one context."""
    firsts = [line.iloc[0].to_dict() for line in lines]
    for r in firsts:  # the workload by its label: the spec JSON of ``family`` is unreadable
        r["family"] = r.get("family_label", r.get("family"))
    keys = [k for k in CONTEXT_KEYS if k != axis and all(k in r for r in firsts)]
    varying = [k for k in keys if len({_hashable(r.get(k)) for r in firsts}) > 1]
    out = []
    for r in firsts:
        words = " · ".join(_context_words(k, r.get(k), [o.get(k) for o in firsts]) for k in varying)
        out.append(textwrap.shorten(words, width, placeholder="…") if words else "")
    return out


def series_label(row: dict[str, Any], multi_runner: bool, with_block: bool) -> str:
    """'paged b16', 'sim/contiguous-max'; without the block size where a row draws it on x."""
    return figure_label(row if with_block else {**row, "block_size": 1}, with_runner=multi_runner)


def held_fixed(lines: list[pd.DataFrame], axis: str) -> str:
    """What every line drawn against ``axis`` shares, in words: the heading of its row
    ('sharegpt, 398 req, poisson · 2 req/s · opt-13b, KV fp16 · budget 12 GiB · max_model_len 2048')."""
    firsts = [line.iloc[0].to_dict() for line in lines]
    for r in firsts:
        r["family"] = r.get("family_label", r.get("family"))
    words = []
    for key in ("family", "rate", "model", "kv_dtype", "budget_bytes", "max_model_len"):
        values = {_hashable(r.get(key)) for r in firsts}
        if key == axis or key not in firsts[0] or len(values) != 1 or values == {"-"}:
            continue
        value = firsts[0][key]
        words.append(str(value) if key == "model" else _context_words(key, value, [value]))
    return " · ".join(words)
