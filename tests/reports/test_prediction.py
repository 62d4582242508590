"""``prediction_drift``: the step-sum errors split into a phase per round and an offset per workload."""

from __future__ import annotations

import itertools
import math

import pandas as pd
import pytest
from kvbench.reports.prediction import prediction_drift

PHASES = {0: 0.12, 1: -0.15, 2: 0.03}  # the machine: faster or slower than the profile, per round
OFFSETS = {"a": -0.10, "b": 0.0, "c": 0.08}  # the model: its own error per workload (median 0)


def table(phases: dict[int, float], offsets: dict[str, float]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"workload": w, "policy": "paged", "engine": "vllm", "repeat": r, "step_sum_err": p + o}
            for (r, p), (w, o) in itertools.product(phases.items(), offsets.items())
        ]
    )


def test_phase_and_offset_are_recovered_when_the_model_is_centred():
    drift = prediction_drift(table(PHASES, OFFSETS))
    assert drift.rounds["phase"].tolist() == pytest.approx(list(PHASES.values()))
    assert drift.rounds["workloads"].tolist() == [3, 3, 3]
    got = dict(zip(drift.workloads["workload"], drift.workloads["offset"]))
    assert got == pytest.approx(OFFSETS)
    # The step-sum error per workload is the median over rounds, phases included.
    assert dict(zip(drift.workloads["workload"], drift.workloads["step_sum_err"])) == pytest.approx(
        {w: o + 0.03 for w, o in OFFSETS.items()}
    )


def test_a_model_biased_on_every_workload_reads_as_the_machine():
    # A bias common to every workload cannot be told from the machine's phase: the split says so by
    # putting it in the phase, and the offsets stay relative.
    drift = prediction_drift(table(PHASES, {w: o + 0.05 for w, o in OFFSETS.items()}))
    assert drift.rounds["phase"].tolist() == pytest.approx([p + 0.05 for p in PHASES.values()])
    assert drift.workloads["offset"].tolist() == pytest.approx(list(OFFSETS.values()))


def test_rows_without_a_step_error_take_no_part_and_nothing_gives_empty_tables():
    t = table(PHASES, OFFSETS)
    t.loc[len(t)] = {"workload": "d", "policy": "paged", "engine": "vllm", "repeat": 0, "step_sum_err": math.nan}
    drift = prediction_drift(t)
    assert "d" not in set(drift.workloads["workload"])
    for empty in (pd.DataFrame(), t[t["workload"] == "d"]):
        d = prediction_drift(empty)
        assert d.rounds.empty and d.workloads.empty and "phase" in d.rounds.columns


def test_policies_keep_their_own_offsets_and_share_the_rounds():
    a, b = table(PHASES, OFFSETS), table(PHASES, {w: o + 0.2 for w, o in OFFSETS.items()})
    drift = prediction_drift(pd.concat([a, b.assign(policy="paged-prefix")], ignore_index=True))
    assert drift.rounds["workloads"].tolist() == [6, 6, 6] and len(drift.workloads) == 6
    offsets = drift.workloads.set_index(["workload", "policy"])["offset"]
    assert offsets[("a", "paged-prefix")] - offsets[("a", "paged")] == pytest.approx(0.2)


def test_a_disturbed_engine_run_is_warned_about_in_one_line():
    import numpy as np
    from kvbench.harness.clock.fit import disturbed_share
    from kvbench.reports.prediction import disturbed_warning

    priced = np.full(200, 0.01)
    measured = priced * np.where(np.arange(200) < 5, 4.0, 1.1)  # 5 of 200 steps over 3x their price
    assert disturbed_share(priced, measured) == 0.025 and disturbed_share(priced[:0], measured[:0]) == 0.0
    quiet = pd.DataFrame({"workload": ["a", "b"], "disturbed_frac": [0.0, 0.002]})
    assert disturbed_warning(quiet) is None and disturbed_warning(pd.DataFrame()) is None
    line = disturbed_warning(quiet.assign(disturbed_frac=[0.025, 0.002]))
    assert line is not None and "\n" not in line
    assert "1 workload(s)" in line and "up to 2.5%" in line and "another process" in line
