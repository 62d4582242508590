"""A CPU tier's quiet steps taken at once (``harness.sim.offload.quiet``) against the same run
step by step: every step row and every request identical, on the offload agreement cases
(a tier that evicts, a preempting budget on the roofline clock, conversations) and seeded
random settings, with quiet steps taken in each."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from kvbench.app.suite import parse_suite
from kvbench.app.sweep import build_cells, run_cell
from kvbench.harness.records import store
from kvbench.harness.records.recorder import RunRecorder
from kvbench.harness.sim.offload import quiet
from kvbench.harness.sim.offload.scheduler import OffloadScheduler

from tests.conftest import one_workload_suite
from tests.runners.test_agreement_offload import CASES, CONVERSATIONS, SETTINGS, random_case


def run_sim(out: Path, taken: list[int], **kw: object) -> dict:
    """The sim cell of ``kw`` (the agreement tests' settings), its quiet steps counted in ``taken``."""
    settings = dict(SETTINGS, **kw)
    for key, value in (("preset", "llama-3-8b"), ("block_size", 16), ("clock", "steps"), ("arena", "first-fit")):
        settings.setdefault(key, value)
    out.mkdir()
    text = one_workload_suite(name="quiet", runners='["sim"]', **settings)
    (cell,) = build_cells(parse_suite(text, str(out / "quiet.toml")), out, lambda m: None)
    original = quiet.run

    def counted(sched: OffloadScheduler, recorder: RunRecorder) -> int:
        k = original(sched, recorder)
        taken.append(k)
        return k

    quiet.run = counted  # type: ignore[assignment]
    try:
        row = run_cell(cell)
    finally:
        quiet.run = original  # type: ignore[assignment]
    assert row["status"] == "ok", row.get("error")
    return row


def tables(out: Path, row: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    steps = store.read_table(out, "steps", {row["run_id"]}).sort_values("step").reset_index(drop=True)
    reqs = store.read_table(out, "requests", {row["run_id"]})
    reqs = reqs.drop(columns=["token_times_s"]).sort_values(["request_id", "sample"]).reset_index(drop=True)
    return steps, reqs


CASE_SETTINGS = {**CASES, "conversations": CONVERSATIONS, **{f"random-{s}": random_case(s) for s in (0, 2, 6, 7)}}


@pytest.mark.parametrize("case", list(CASE_SETTINGS))
def test_quiet_steps_taken_at_once_are_the_steps_one_by_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    kw = CASE_SETTINGS[case]
    taken: list[int] = []
    fast = run_sim(tmp_path / "at-once", taken, **kw)
    assert sum(taken) > 0  # quiet steps were taken at once
    monkeypatch.setattr(quiet, "run", lambda sched, recorder: 0)  # every step one by one
    plain = run_sim(tmp_path / "one-by-one", [], **kw)
    a_steps, a_reqs = tables(tmp_path / "at-once", fast)
    b_steps, b_reqs = tables(tmp_path / "one-by-one", plain)
    pd.testing.assert_frame_equal(a_steps.drop(columns=["run_id"]), b_steps.drop(columns=["run_id"]))
    pd.testing.assert_frame_equal(a_reqs.drop(columns=["run_id"]), b_reqs.drop(columns=["run_id"]))
    for key in ("steps", "computed_tokens", "preemptions", "tokens_per_s", "ttft_p50_s", "cpu_blocks"):
        assert fast[key] == plain[key], key


@pytest.mark.parametrize("case", ["preempting-loads-back", "random-7"])
def test_a_step_handed_back_to_the_engine_is_the_step_one_by_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    """Where the head's repeated attempt would do something, the quiet run stops after the step's
    allocations and the engine takes the step: every such step handed back gives the same records."""
    kw = CASE_SETTINGS[case]
    asked: list[bool] = []

    def does_something(self: OffloadScheduler, budget: int) -> bool:
        asked.append(True)
        return False

    monkeypatch.setattr(OffloadScheduler, "attempt_fails", does_something)
    taken: list[int] = []
    handed = run_sim(tmp_path / "handed-back", taken, **kw)
    assert asked and sum(taken) > 0
    monkeypatch.setattr(quiet, "run", lambda sched, recorder: 0)
    plain = run_sim(tmp_path / "one-by-one", [], **kw)
    for a, b in zip(tables(tmp_path / "handed-back", handed), tables(tmp_path / "one-by-one", plain)):
        pd.testing.assert_frame_equal(a.drop(columns=["run_id"]), b.drop(columns=["run_id"]))


@pytest.mark.parametrize("case", ["preempting-loads-back", "conversations", "random-6"])
def test_attempt_fails_says_what_the_attempt_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    """``attempt_fails`` (what the quiet steps ask) against ``admit_waiting`` on the same state, at
    every step's admission: it says the attempt fails exactly where the attempt admits, loads and
    skips nothing (where the head's own load landed it says only that it may not fail)."""
    seen: list[tuple[bool, bool, bool]] = []
    admit = OffloadScheduler.admit_waiting

    def checked(self: OffloadScheduler, budget: int, scheduled: list) -> tuple[int, int, int]:
        queue = self.holding if self.holding else self.waiting
        landed = bool(queue) and queue[0].index in self.loading
        predicted = self.attempt_fails(budget)  # its lookups are the attempt's own: repeated, the same
        out = admit(self, budget, scheduled)
        seen.append((predicted, self._attempted, landed))
        return out

    monkeypatch.setattr(OffloadScheduler, "admit_waiting", checked)
    monkeypatch.setattr(quiet, "run", lambda sched, recorder: 0)
    run_sim(tmp_path / "checked", [], **CASE_SETTINGS[case])
    assert any(p for p, _, _ in seen) and any(not p for p, _, _ in seen)
    for predicted, failed, landed in seen:
        assert predicted == failed or (landed and not predicted), (predicted, failed, landed)
