"""Tables laid out for a 1280 px page (``reports.layout``): identity said once, wide sets split."""

from __future__ import annotations

import pandas as pd
from kvbench.reports import display, layout
from kvbench.reports.contents import report_tables
from reportkit import W1, golden_rows, runs_frame


def golden_group(workload_id: str) -> pd.DataFrame:
    cells = report_tables(runs_frame(golden_rows())).cells
    return cells[cells["workload_id"] == workload_id]


def keys(part: layout.Part) -> list[str]:
    return [k for k, _, _ in part.columns]


def estimated(part: layout.Part, frame: pd.DataFrame) -> float:
    rows = display.rows(part.columns, frame)
    return sum(layout.column_px(c, [r[i] for r in rows]) for i, c in enumerate(part.columns))


def test_a_groups_cells_split_into_concurrency_then_memory_each_led_by_the_varying_keys() -> None:
    sub = golden_group(W1["workload_id"])
    columns = display.cell_columns(sub, {"sim", "torch", "vllm"})
    lay = layout.layout(columns, sub, display.CELL_TABLE_KEYS, display.cell_sets(columns), split=True)
    assert lay.fixed == (("status", "ok"),)  # every run ok: said once, not in every row
    # the golden records hold no latencies: the second table is titled by what it holds
    assert [p.title for p in lay.parts] == ["Concurrency and throughput", "Memory (share of the KV budget)"]
    first, second = lay.parts
    assert keys(first)[:3] == keys(second)[:3] == ["runner", "policy", "block_size"]
    assert "mean_running_x" in keys(first) and "token_states_frac" in keys(second)
    # every column shown once, in one of the two tables (the keys in both)
    shown = [k for p in lay.parts for k in keys(p)[3:]]
    assert sorted(shown) == sorted(k for k, _, _ in columns if k not in ("runner", "policy", "block_size", "status"))
    assert all(estimated(p, sub) <= layout.TABLE_PX for p in lay.parts)


def test_a_table_that_fits_stays_whole_and_one_that_does_not_is_cut_within_its_width() -> None:
    frame = pd.DataFrame(
        [{"a": "x", **{f"m{i}": 1.0 for i in range(40)}}, {"a": "y", **{f"m{i}": 2.0 for i in range(40)}}]
    )
    narrow = [("a", "a", "text"), ("m0", "m0", "g"), ("m1", "m1", "g")]
    assert [keys(p) for p in layout.layout(narrow, frame, ("a",)).parts] == [["a", "m0", "m1"]]
    wide = [("a", "a", "text"), *((f"m{i}", f"metric number {i}", "g") for i in range(40))]
    parts = layout.layout(wide, frame, ("a",)).parts
    assert len(parts) > 2 and all(keys(p)[0] == "a" for p in parts)
    assert [k for p in parts for k in keys(p)[1:]] == [f"m{i}" for i in range(40)]  # in order, each once
    assert all(estimated(p, frame) <= layout.TABLE_PX for p in parts)


def test_a_glued_header_stays_beside_the_column_it_qualifies() -> None:
    frame = pd.DataFrame([{"a": "x", **{f"m{i}": 1.0 for i in range(30)}}] * 2)
    cols = [("a", "a", "text")]
    for i in range(0, 30, 2):
        cols += [(f"m{i}", f"a long metric header {i} on", "g"), (f"m{i + 1}", "off", "g")]
    for part in layout.layout(cols, frame).parts:
        assert part.columns[0][1] != "off" and part.columns[-1][1] == "off"


def test_constant_keys_are_said_once_only_where_two_rows_share_them() -> None:
    one = pd.DataFrame([{"runner": "sim", "v": 1.0}])
    cols = [("runner", "runner", "text"), ("v", "v", "g")]
    assert layout.layout(cols, one, ("runner",)).fixed == ()  # a single row keeps its names
    two = pd.DataFrame([{"runner": "sim", "v": 1.0}, {"runner": "sim", "v": 2.0}])
    lay = layout.layout(cols, two, ("runner",))
    assert lay.fixed == (("runner", "sim"),) and keys(lay.parts[0]) == ["v"]
    assert layout.fixed_text(lay.fixed) == "Every row: runner sim."


def test_long_text_wraps_and_is_estimated_at_its_wrapped_width() -> None:
    label = "fixed prompt 100 / output 100, 120 s of arrivals, poisson"
    assert layout.is_long("text", label) and not layout.is_long("note", label) and not layout.is_long("g", "1")
    col = ("workload", "workload", "text")
    assert layout.column_px(col, [label]) < len(label) * layout.BODY_CHAR_PX


def test_the_second_cell_table_is_titled_by_what_it_holds() -> None:
    memory, latency = ("token_states_frac", "token states %", "pct"), ("ttft_p50_s", "TTFT p50", "time")
    title = lambda cols: display.cell_sets(cols)[1][0]  # noqa: E731
    assert title([memory, latency]) == "Memory (share of the KV budget) and latency"
    assert title([memory]) == "Memory (share of the KV budget)" and title([latency]) == "Latency"
