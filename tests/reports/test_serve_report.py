"""The report's check of a served engine: the step rows kvbench's scheduler wrote inside the
server against the server's /metrics scrape (``reports.serve_check``).

Hand-made tables whose answers are known by hand (no vLLM needed), then the same records as
real Parquet partitions through ``reports.loading.load`` and the written report: a results
directory with a metrics table gets the section, one without it reports as before.

The run: 160 positions of blocks of 16, so 10 usable blocks. Its steps, and the state after
each (what vLLM's statistics report: a finished request has left and freed its blocks):

    step  t_s   dt_s  running waiting finished preempted blocks   after: running waiting blocks
    0     0.00  0.10  2       1       0        0         4               2       1       4
    1     0.10  0.10  2       1       1        0         5               1       1       ≤ 5
    2     0.30  0.10  1       1       0        1         3               1       1       3
    3     0.40  0.10  2       0       0        0         6               2       0       6
    4     0.50  0.10  2       0       2        0         6               0       0       0
"""

from __future__ import annotations

import math
from html import escape
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
from kvbench.harness.records import store
from kvbench.harness.records.schema import METRICS, STEPS
from kvbench.reports.contents import report_tables
from kvbench.reports.loading import load
from kvbench.reports.serve_check import ATTACHED_NOTE, serve_check
from kvbench.runners.serve.runner import ATTACH_DETAIL
from reportkit import run, runs_frame, write_records

SECTION = "Server: steps against /metrics"
USABLE = 10
STEP_ROWS = [  # t_s, dt_s, running, waiting, finished, preempted, allocated_blocks
    (0.00, 0.10, 2, 1, 0, 0, 4),
    (0.10, 0.10, 2, 1, 1, 0, 5),
    (0.30, 0.10, 1, 1, 0, 1, 3),
    (0.40, 0.10, 2, 0, 0, 0, 6),
    (0.50, 0.10, 2, 0, 2, 0, 6),
]
# t_s, blocks read, running, waiting, preemptions counted: each the state after the step before it.
SCRAPES = [
    (0.05, 0, 0, 0, 0),  # step 0 in flight: nothing reported yet
    (0.20, 3, 1, 1, 0),  # step 1 ended at 0.20 exactly; its finished request has left (not 2 running)
    (0.45, 3, 1, 1, 0),  # after step 2; the preemption is counted when the request next returns a token
    (0.70, 0, 0, 0, 1),  # after the replay
]


def serve_run(**extra: Any) -> dict[str, Any]:
    values = {
        "budget_positions": USABLE * 16,
        "clock": "measured",
        "clock_detail": "measured: each step's wall time",
        "preemptions": 1,
        "steps": len(STEP_ROWS),
        "peak_running": 2,
        "mean_running": 1.5,
    }
    return run("serve", "paged", 16, **{**values, **extra})


def steps_table(rows: list[tuple[float, ...]] = STEP_ROWS) -> pd.DataFrame:
    cols: dict[str, list[Any]] = {name: [0] * len(rows) for name in STEPS.names}
    for name in ("kv_bytes_allocated", "step_wall_s", "scheduled_seqs", "context_tokens", "attention_pairs"):
        cols[name] = [None] * len(rows)
    cols["step"] = list(range(len(rows)))
    names = ("t_s", "dt_s", "running", "waiting", "finished", "preempted", "allocated_blocks")
    for i, name in enumerate(names):
        cols[name] = [r[i] for r in rows]
    return pd.DataFrame(cols)


def metrics_table(rows: list[tuple[float, ...]] = SCRAPES, usable: int = USABLE) -> pd.DataFrame:
    cols: dict[str, list[float | None]] = {
        "t_s": [r[0] for r in rows],
        "kv_cache_usage_frac": [r[1] / usable for r in rows],
        "num_requests_running": [float(r[2]) for r in rows],
        "num_requests_waiting": [float(r[3]) for r in rows],
        "num_preemptions": [float(r[4]) for r in rows],
        "prefix_cache_queries": [0.0] * len(rows),
        "prefix_cache_hits": [0.0] * len(rows),
    }
    for name in METRICS.names:  # the families a server without a CPU tier does not export: null
        cols.setdefault(name, [None] * len(rows))
    return pd.DataFrame(cols)


def check(
    row: dict[str, Any], steps: pd.DataFrame | None = None, metrics: pd.DataFrame | None = None
) -> dict[str, Any]:
    rid = row["run_id"]
    st = (steps if steps is not None else steps_table()).assign(run_id=rid)
    mt = (metrics if metrics is not None else metrics_table()).assign(run_id=rid)
    table = serve_check(runs_frame([row]), st, mt)
    assert len(table) == 1
    return table.iloc[0].to_dict()


def test_each_scrape_reads_the_state_after_the_step_before_it() -> None:
    got = check(serve_run())
    assert got["verdict"] == "agree", got["note"]
    assert got["scrapes"] == 4
    assert got["running_agree_frac"] == got["waiting_agree_frac"] == got["blocks_agree_frac"] == 1.0
    # Known exactly: before any step (0), after step 2 (3) and after the last (0); after step 1 only bounded.
    assert got["blocks_exact"] == 3 and got["blocks_max_diff"] == 0
    assert got["idle_scrapes"] == 1  # only the last: steps were in flight at 0.05 and 0.45
    assert got["preemptions_lag_max"] == 1  # at 0.45 the steps had counted one, /metrics not yet
    assert got["preemptions_steps"] == got["preemptions_metrics"] == got["preemptions_run"] == 1


def test_the_row_before_its_outputs_is_not_what_vllm_reports() -> None:
    # A scrape read as the step row itself (2 running, 5 blocks after step 1) is a state that no
    # step left: the comparison is with the state after the outputs, and says so when it is not.
    scrapes = list(SCRAPES)
    scrapes[1] = (0.20, 5, 2, 1, 0)
    got = check(serve_run(), metrics=metrics_table(scrapes))
    assert got["verdict"] == "differ"
    assert "a scrape (0.20 s) reads 5 blocks, 2 running, 1 waiting; the steps before it ≤ 5, 1, 1" in got["note"]
    assert got["running_agree_frac"] == 0.75


def test_a_scrape_answered_late_reads_a_later_step() -> None:
    scrapes = list(SCRAPES)
    scrapes[2] = (0.45, 6, 2, 0, 0)  # the state after step 3, which ended at 0.50, before the next scrape
    got = check(serve_run(), metrics=metrics_table(scrapes))
    assert got["verdict"] == "agree (some answered late)", got["note"]
    assert "3 of 4 scrapes read the state after the step before them" in got["note"]
    assert "1 answered late read it after a later step, which ended at most 50 ms after the scrape began" in got["note"]
    assert got["running_agree_frac"] == 0.75 and got["blocks_max_diff"] == 3


def test_a_later_state_after_the_next_scrape_began_is_not_a_late_answer() -> None:
    # The scraper waits for each answer: scrape 1 (0.20) cannot read the state after step 3 (ended 0.50),
    # which ended after scrape 2 began (0.45).
    scrapes = list(SCRAPES)
    scrapes[1] = (0.20, 6, 2, 0, 0)
    got = check(serve_run(), metrics=metrics_table(scrapes))
    assert got["verdict"] == "differ" and "a scrape (0.20 s)" in got["note"]


def test_preemption_totals_that_differ_are_named() -> None:
    scrapes = list(SCRAPES)
    scrapes[3] = (0.70, 0, 0, 0, 0)
    got = check(serve_run(preemptions=2), metrics=metrics_table(scrapes))
    assert got["verdict"] == "differ"
    assert "/metrics counted 0 preemptions at the end, the steps 1" in got["note"]
    assert "the run row has 2 preemptions, the steps 1" in got["note"]


def test_the_last_scrape_must_read_the_final_state() -> None:
    scrapes = list(SCRAPES)
    scrapes[3] = (0.70, 0, 1, 0, 1)
    got = check(serve_run(), metrics=metrics_table(scrapes))
    assert got["verdict"] == "differ" and "the last scrape (0.70 s) reads 0 blocks, 1 running" in got["note"]


def test_usage_of_another_pool_is_not_a_whole_number_of_blocks() -> None:
    # The same readings as fractions of 12 usable blocks, read against the run's 10.
    got = check(serve_run(), metrics=metrics_table(usable=12))
    assert got["verdict"] == "differ"
    assert "usage × 10 usable blocks is 2.500 at 0.20 s, not a whole number of blocks" in got["note"]


def test_a_family_the_server_does_not_export_is_left_out() -> None:
    metrics = metrics_table().assign(kv_cache_usage_frac=math.nan)
    got = check(serve_run(), metrics=metrics)
    assert got["verdict"] == "agree" and math.isnan(got["blocks_agree_frac"]) and got["blocks_exact"] == 0


def test_attached_runs_say_allocation_is_not_visible() -> None:
    row = run("serve", "paged", 16, clock="measured", clock_detail=ATTACH_DETAIL, steps_rows=0, preemptions=None)
    table = serve_check(runs_frame([row]), pd.DataFrame(), metrics_table().assign(run_id=row["run_id"]))
    got = table.iloc[0].to_dict()
    assert got["verdict"] == "attached" and got["note"] == ATTACHED_NOTE
    assert "allocation is not visible from outside a server" in got["note"]
    assert got["scrapes"] == 4 and got["preemptions_metrics"] == 1
    assert all(math.isnan(got[c]) for c in ("blocks_agree_frac", "running_agree_frac", "preemptions_steps"))


def test_no_serve_run_no_table() -> None:
    runs = runs_frame([run("sim", "paged", 16), run("vllm", "paged", 16)])
    assert serve_check(runs, pd.DataFrame(), None).empty
    assert report_tables(runs).serve_check.empty


# -- through Parquet and the written report ------------------------------------------------------


def write_serve_records(out: Path, rows: list[dict[str, Any]], steps: dict[str, pd.DataFrame]) -> Path:
    write_records(out, rows, steps=steps)
    for row in rows:
        frame = metrics_table()
        store.write_partition(
            out, "metrics", row["run_id"], pa.Table.from_pandas(frame, schema=METRICS, preserve_index=False)
        )
    return out


def test_results_without_metrics_load_and_report_as_before(tmp_path: Path) -> None:
    from kvbench.reports.html import write_report

    out = write_records(tmp_path / "r", [run("sim", "contiguous-max"), run("sim", "paged", 16)])
    assert not (out / "metrics").exists()
    assert load(out).metrics is None
    page = write_report(out).read_text()
    assert SECTION not in page and SECTION not in (out / "report" / "summary.md").read_text()


def test_the_report_shows_the_check(tmp_path: Path) -> None:
    from kvbench.reports.html import write_report

    row = serve_run()
    out = write_serve_records(tmp_path / "r", [row], {row["run_id"]: steps_table()})
    records = load(out)
    assert records.metrics is not None and list(records.metrics["t_s"]) == [s[0] for s in SCRAPES]
    page = write_report(out).read_text()
    md = (out / "report" / "summary.md").read_text()
    assert f"<h2>{SECTION}</h2>" in page and f"## {SECTION}" in md
    # two tables, each led by the run's workload, policy and block: the scrapes, then the preemption totals
    scrapes, preemptions = [ln for ln in md.splitlines() if ln.startswith("| fixed prompt")]
    assert "| paged | 16 | 4 | 1 | 3 | 100.0 | 0 | 100.0 | 100.0 | agree |" in scrapes
    assert "| paged | 16 | 1 | 1 | 1 | 1 | every scrape (4) reads the state after the step before it |" in preemptions


def test_the_report_says_why_an_attached_run_has_no_allocation(tmp_path: Path) -> None:
    from kvbench.reports import html, markdown

    row = serve_run(clock_detail=ATTACH_DETAIL, steps_rows=0, preemptions=None, peak_running=None)
    records = load(write_serve_records(tmp_path / "r", [row], {}))
    tables = report_tables(records.runs, steps=records.steps, metrics=records.metrics)
    md = markdown.render(records.runs, tables)
    line = next(ln for ln in md[md.index(SECTION) :].splitlines() if ln.startswith("| fixed prompt"))
    assert line.endswith(f"| 4 | 1 | attached | {ATTACHED_NOTE} |")  # only the columns an attached run has
    assert escape(ATTACHED_NOTE) in html.render(records.runs, tables, (), {})
