"""The served engine checked against itself: the step rows kvbench's scheduler wrote inside the
server (``runners.serve.scheduler``) against the server's own Prometheus ``/metrics``, scraped
from outside while the workload replayed (the ``metrics`` table).

Both are timed from the start of the replay. vLLM reports its statistics at the end of a step,
after its finished requests freed their blocks, and a step row is read right after
``schedule()``; so each scrape is compared with the state *after* the last step that ended at or
before it, and one answered late may read a later step's (docs/records.md, "A served engine's
/metrics", says how each side is timed and read, and the verdicts). Attached runs
(``[runners.serve] url``) have no steps: they get a row that says so, with the scrape count only.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import pandas as pd

from .display import format_time

SERVE_RUNNER = "serve"
ATTACHED_PREFIX = "attached"  # runners.serve.runner.ATTACH_DETAIL begins so
ATTACHED_NOTE = (
    "attached to a running server: no steps, as allocation is not visible from outside a server; "
    "only the client's timings and the /metrics scrape are recorded"
)
NO_STEPS_NOTE = "no step rows: nothing to check the scrape against"
LABEL_COLUMNS: tuple[str, ...] = ("workload", "runner", "policy", "block_size", "rate")
COLUMNS: tuple[str, ...] = (
    "run_id",
    *LABEL_COLUMNS,
    "scrapes",
    "idle_scrapes",
    "blocks_exact",
    "blocks_agree_frac",
    "blocks_max_diff",
    "running_agree_frac",
    "waiting_agree_frac",
    "preemptions_lag_max",
    "preemptions_steps",
    "preemptions_metrics",
    "preemptions_run",
    "verdict",
    "note",
)
# Usage × usable blocks is a whole number up to float rounding; further off, the pool is not the
# one the run row describes.
BLOCK_TOLERANCE = 0.01


def is_attached(run: Any) -> bool:
    """A serve run against a server kvbench did not start (no steps, allocation null)."""
    detail = run.get("clock_detail")
    return isinstance(detail, str) and detail.startswith(ATTACHED_PREFIX)


def usable_blocks(run: Any) -> int | None:
    """The pool's usable blocks: the budget's whole blocks (None when the row does not say)."""
    positions, block = _num(run.get("budget_positions")), _num(run.get("block_size"))
    if not (positions > 0 and block > 0):
        return None
    return int(positions) // int(block)


def serve_check(runs: pd.DataFrame, steps: pd.DataFrame | None, metrics: pd.DataFrame | None) -> pd.DataFrame:
    """One row per serve run that has scrapes, or was attached (module docstring); empty without one."""
    if runs.empty or "runner" not in runs or not (runs["runner"] == SERVE_RUNNER).any():
        return pd.DataFrame(columns=list(COLUMNS))
    metrics = metrics if metrics is not None else pd.DataFrame()
    steps = steps if steps is not None else pd.DataFrame()
    scrapes_by_run = dict(tuple(metrics.groupby("run_id", sort=False))) if len(metrics) else {}
    steps_by_run = dict(tuple(steps.groupby("run_id", sort=False))) if len(steps) else {}
    rows = []
    for run in runs[runs["runner"] == SERVE_RUNNER].to_dict("records"):
        scrapes = scrapes_by_run.get(run["run_id"])
        attached = is_attached(run)
        if scrapes is None and not attached:
            continue  # no scrape: a run that did not start (infeasible, a failed start)
        scrapes = scrapes if scrapes is not None else pd.DataFrame(columns=["t_s"])
        row: dict[str, Any] = {c: run.get(c) for c in ("run_id", *LABEL_COLUMNS)}
        row["scrapes"] = len(scrapes)
        row["preemptions_metrics"] = _last(scrapes, "num_preemptions")
        if attached:
            rows.append({**row, "verdict": "attached", "note": ATTACHED_NOTE})
            continue
        run_steps = steps_by_run.get(run["run_id"])
        if run_steps is None or run_steps.empty:
            rows.append({**row, "verdict": "no steps", "note": NO_STEPS_NOTE})
            continue
        rows.append({**row, **compare(run_steps, scrapes, usable_blocks(run), _num(run.get("preemptions")))})
    out = pd.DataFrame(rows, columns=list(COLUMNS))
    keys = [c for c in ("workload", "policy", "block_size", "rate", "run_id") if c in out]
    return out.sort_values(keys, na_position="last", kind="stable").reset_index(drop=True)


@dataclasses.dataclass(frozen=True)
class StepStates:
    """The server's state after each step (index ``j + 1``; index 0 is before the first step: all
    0), and when each step began and ended (``start``/``end``, step ``j`` at ``j``)."""

    start: np.ndarray
    end: np.ndarray
    running: np.ndarray  # the row's running − finished
    waiting: np.ndarray
    blocks: np.ndarray  # allocated blocks; NaN where the step rows only bound them
    bound: np.ndarray  # the row's allocated blocks: the most the state can hold
    preempted: np.ndarray  # cumulative

    @staticmethod
    def of(steps: pd.DataFrame) -> StepStates:
        s = steps.sort_values("t_s", kind="stable")

        def col(name: str) -> np.ndarray:
            values = pd.to_numeric(s[name], errors="coerce").fillna(0).to_numpy(float)
            return np.concatenate([[0.0], values])

        start = s["t_s"].to_numpy(float)
        finished = col("finished")
        running = col("running") - finished
        allocated = col("allocated_blocks")
        return StepStates(
            start=start,
            end=np.maximum.accumulate(start + s["dt_s"].to_numpy(float)),
            running=running,
            waiting=col("waiting"),
            blocks=np.where(running == 0, 0.0, np.where(finished == 0, allocated, np.nan)),
            bound=allocated,
            preempted=np.cumsum(col("preempted")),
        )

    def before(self, at: np.ndarray) -> np.ndarray:
        """The state index of the last step that ended at or before each time (0: none had)."""
        return np.searchsorted(self.end, at, side="right")


@dataclasses.dataclass(frozen=True)
class Readings:
    """What the scrapes read: allocated blocks (usage × usable), running, waiting (NaN: not exported)."""

    blocks: np.ndarray
    running: np.ndarray
    waiting: np.ndarray

    def blocks_match(self, i: int, states: StepStates, j: int) -> bool:
        b = self.blocks[i]
        if math.isnan(b):
            return True
        if abs(b - round(b)) > BLOCK_TOLERANCE:
            return False
        if math.isnan(states.blocks[j]):
            return -BLOCK_TOLERANCE <= b <= states.bound[j] + BLOCK_TOLERANCE
        return round(b) == states.blocks[j]

    def matches(self, i: int, states: StepStates, j: int) -> bool:
        """Whether scrape ``i`` reads state ``j`` (a measure the server does not export: any)."""
        r, w = self.running[i], self.waiting[i]
        return (
            self.blocks_match(i, states, j)
            and (math.isnan(r) or r == states.running[j])
            and (math.isnan(w) or w == states.waiting[j])
        )


def compare(steps: pd.DataFrame, scrapes: pd.DataFrame, usable: int | None, run_preemptions: float) -> dict[str, Any]:
    """The comparison columns and verdict of one run (``COLUMNS`` from ``idle_scrapes`` on)."""
    m = scrapes.sort_values("t_s", kind="stable")
    at = m["t_s"].to_numpy(float)
    n = len(m)
    states = StepStates.of(steps)

    def gauge(name: str) -> np.ndarray:
        return pd.to_numeric(m[name], errors="coerce").to_numpy(float) if name in m else np.full(n, np.nan)

    usage = gauge("kv_cache_usage_frac")
    seen = Readings(
        usage * usable if usable is not None else np.full(n, np.nan),
        gauge("num_requests_running"),
        gauge("num_requests_waiting"),
    )
    counter = gauge("num_preemptions")
    k = states.before(at)
    in_flight = (k < len(states.start)) & (states.start[np.minimum(k, len(states.start) - 1)] <= at)
    idle = (states.running[k] == 0) & (states.waiting[k] == 0) & ~in_flight

    has_blocks = ~np.isnan(seen.blocks)
    exact = has_blocks & ~np.isnan(states.blocks[k])
    diff = np.where(exact, np.abs(np.round(seen.blocks) - np.nan_to_num(states.blocks[k])), np.nan)
    blocks_ok = np.array([seen.blocks_match(i, states, int(k[i])) for i in range(n)], dtype=bool)
    steps_total = float(states.preempted[-1])
    final_counter = counter[-1] if n else math.nan
    out: dict[str, Any] = {
        "idle_scrapes": int(idle.sum()),
        "blocks_exact": int(exact.sum()),
        "blocks_agree_frac": _share(blocks_ok, has_blocks),
        "blocks_max_diff": _nanmax(diff),
        "running_agree_frac": _share(seen.running == states.running[k], ~np.isnan(seen.running)),
        "waiting_agree_frac": _share(seen.waiting == states.waiting[k], ~np.isnan(seen.waiting)),
        "preemptions_lag_max": _nanmax(states.preempted[k] - counter),
        "preemptions_steps": steps_total,
        "preemptions_run": run_preemptions,
    }

    # A scrape that does not read the state after the step before it may have been answered
    # late: it then reads the state after a later step, one that ended before the next scrape
    # was sent (the scraper waits for each answer before it sends the next).
    later = np.append(states.before(at[1:]), len(states.end)) if n else np.array([], dtype=int)
    late: list[float] = []
    unexplained: list[int] = []
    for i in range(n):
        if seen.matches(i, states, int(k[i])):
            continue
        j = next((j for j in range(int(k[i]) + 1, int(later[i]) + 1) if seen.matches(i, states, j)), None)
        if j is None or i == n - 1:
            unexplained.append(i)
        else:
            late.append(float(states.end[j - 1] - at[i]))

    problems = []
    if usable is None and has_blocks.any():
        problems.append("the run row gives no budget in blocks, so kv_cache_usage_frac is not compared")
    off_grid = np.flatnonzero(has_blocks & (np.abs(seen.blocks - np.round(seen.blocks)) > BLOCK_TOLERANCE))
    if len(off_grid):
        i = int(off_grid[0])
        problems.append(
            f"usage × {usable} usable blocks is {seen.blocks[i]:.3f} at {at[i]:.2f} s, not a whole number of "
            "blocks: the server's pool is not the run's budget"
        )
    if n and not math.isnan(final_counter) and final_counter != steps_total:
        problems.append(f"/metrics counted {final_counter:g} preemptions at the end, the steps {steps_total:g}")
    if not math.isnan(run_preemptions) and run_preemptions != steps_total:
        problems.append(f"the run row has {run_preemptions:g} preemptions, the steps {steps_total:g}")
    for i in unexplained:
        label = "the last scrape" if i == n - 1 else "a scrape"
        problems.append(
            f"{label} ({at[i]:.2f} s) {_reading(i, seen, states, int(k[i]))}, and no later step before the next "
            "scrape left that state"
        )
    if problems:
        return {**out, "verdict": "differ", "note": "; ".join(dict.fromkeys(problems))}
    if not late:
        return {**out, "verdict": "agree", "note": f"every scrape ({n}) reads the state after the step before it"}
    return {
        **out,
        "verdict": "agree (some answered late)",
        "note": (
            f"{n - len(late)} of {n} scrapes read the state after the step before them; {len(late)} "
            f"answered late read it after a later step, which ended at most {format_time(max(late))} after "
            "the scrape began (the engine stepped on)"
        ),
    }


def _reading(i: int, seen: Readings, states: StepStates, j: int) -> str:
    expected = states.blocks[j]
    blocks_text = _g(expected) if not math.isnan(expected) else f"≤ {_g(states.bound[j])}"
    return (
        f"reads {_g(seen.blocks[i])} blocks, {_g(seen.running[i])} running, {_g(seen.waiting[i])} waiting; "
        f"the steps before it {blocks_text}, {_g(states.running[j])}, {_g(states.waiting[j])}"
    )


def _share(ok: np.ndarray, counted: np.ndarray) -> float:
    n = int(counted.sum())
    return float((ok & counted).sum()) / n if n else math.nan


def _nanmax(values: np.ndarray) -> float:
    return float(np.nanmax(values)) if (~np.isnan(values)).any() else math.nan


def _last(frame: pd.DataFrame, name: str) -> float:
    if name not in frame or frame.empty:
        return math.nan
    values = pd.to_numeric(frame.sort_values("t_s", kind="stable")[name], errors="coerce")
    return float(values.iloc[-1])


def _num(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _g(value: float) -> str:
    return "?" if value is None or math.isnan(value) else f"{value:.3g}"
