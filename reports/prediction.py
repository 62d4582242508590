"""Predicted vs measured: a sim run on a profile clock beside an engine run of the same work.

Pairs every ok ``sim`` run whose clock is ``profile`` with the ok ``torch``/``vllm``
runs on the ``measured`` clock that did the same work (same workload, model, KV
precision, budget, max_model_len, policy, block size and scheduler limits). For each
pair it gives:

- total time: sim's ``sim_time_s`` (predicted) against the engine's (measured: the sum
  of its step times, plus idle gaps to arrivals);
- per-step error: the profile's price of each *measured* engine step (from the step's
  recorded work) against its measured time, median and p90 of |predicted − measured| ÷
  measured. On arrivals that all come at once sim's schedule is the engine's, step for
  step, so this is sim's own per-step error; under Poisson arrivals the schedules part
  (time decides who has arrived), and pricing the engine's own steps keeps the error a
  property of the clock, not of which steps happened;
- TTFT and end-to-end latency p50/p90, predicted and measured.

``prediction_drift`` splits the step-sum error into the machine (per round) and the model (per
workload) (docs/clock.md, "What the error is made of").

Several engine repeats give one row each in ``prediction_table``; ``prediction_summary``
sets the prediction beside their median, with their range: an engine's own run-to-run
spread on a shared CPU (±10–15% here) is as large as the errors in question, so a single
measurement cannot judge a prediction.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd

from ..harness.clock.fit import DISTURBED_RATIO, DISTURBED_WARN, FEATURES, disturbed_share, error_stats, predict
from ..harness.clock.profile import parse_profile
from ..harness.errors import KvbenchError
from ..harness.records.schema import OK
from ..harness.spec import identity
from ..harness.spec.capabilities import MEASURING_RUNNERS
from .labels import with_keys

# A sim run and an engine run pair when they did the same work (harness.spec.identity) with the same
# policy and block size; their clocks differ by design (a profile beside a measured one), so the
# scheduler is compared by its scheduling settings alone.
PAIR_CELL: tuple[str, ...] = ("policy", "block_size")
PAIR_KEY = "_pair"
LATENCY_PAIRS: tuple[str, ...] = ("ttft_p50_s", "ttft_p90_s", "latency_p50_s", "latency_p90_s")


def _with_pair_key(runs: pd.DataFrame) -> pd.DataFrame:
    keyed = with_keys(runs)
    work = [c for c in identity.WORK_COLUMNS if c != "scheduler"]
    runs = runs.copy()
    runs[PAIR_KEY] = [
        identity.canonical_json(
            {
                **{c: str(r[c]) for c in work},  # equality is all a key needs
                "scheduling": identity.scheduling_part(json.loads(r["scheduler"])),
            }
        )
        for r in keyed.to_dict("records")
    ]
    return runs


def _rel(predicted: float, measured: float) -> float:
    return predicted / measured - 1.0 if measured and measured == measured and predicted == predicted else float("nan")


def prediction_table(runs: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """One row per (sim profile run, measured engine run) pair; empty when there is none."""
    ok = runs[runs["status"] == OK]
    sims = ok[(ok["runner"] == "sim") & (ok["clock"] == "profile")]
    engines = ok[ok["runner"].isin(MEASURING_RUNNERS) & (ok["clock"] == "measured")]
    if sims.empty or engines.empty:
        return pd.DataFrame()
    # sim is deterministic: its repeats of one work on one profile are one prediction, set beside
    # every engine repeat once (a suite repeats its engine cells to measure them, and sim's with them).
    sims = (
        _with_pair_key(sims)
        .sort_values("repeat", kind="stable")
        .drop_duplicates([PAIR_KEY, *PAIR_CELL, "clock_profile"])
    )
    engines = _with_pair_key(engines)
    pairs = sims.merge(engines, on=[PAIR_KEY, *PAIR_CELL], suffixes=("_sim", "_eng"))
    rows = []
    for r in pairs.to_dict("records"):
        profile = _profile(r.get("clock_profile_sim"))
        eng_steps = steps[steps["run_id"] == r["run_id_eng"]].dropna(subset=["step_wall_s", *FEATURES])
        per_step = None
        disturbed = float("nan")
        if profile is not None and len(eng_steps):
            priced, measured = predict(profile.terms, eng_steps), eng_steps["step_wall_s"].to_numpy(np.float64)
            per_step = error_stats(priced, measured)
            disturbed = disturbed_share(priced, measured)
        row = {
            "workload": r.get("workload_sim", r["workload_id_sim"]),
            "policy": r["policy"],
            "engine": r["runner_eng"],
            "repeat": r.get("repeat_eng"),
            "run_id_sim": r["run_id_sim"],
            "run_id_eng": r["run_id_eng"],
            "measured_total_s": r["sim_time_s_eng"],
            "predicted_total_s": r["sim_time_s_sim"],
            "total_err": _rel(r["sim_time_s_sim"], r["sim_time_s_eng"]),
            "steps_measured": r["steps_eng"],
            "steps_predicted": r["steps_sim"],
            "step_median_err": per_step.median_abs if per_step else float("nan"),
            "step_sum_err": per_step.total if per_step else float("nan"),
            "disturbed_frac": disturbed,
            "step_p90_err": per_step.p90_abs if per_step else float("nan"),
        }
        for key in LATENCY_PAIRS:
            row[f"{key}_measured"] = r.get(f"{key}_eng")
            row[f"{key}_predicted"] = r.get(f"{key}_sim")
            row[f"{key}_err"] = _rel(r.get(f"{key}_sim", float("nan")), r.get(f"{key}_eng", float("nan")))
        rows.append(row)
    return (
        pd.DataFrame(rows).sort_values(["workload", "policy", "engine", "repeat"], kind="stable").reset_index(drop=True)
    )


def prediction_summary(table: pd.DataFrame) -> pd.DataFrame:
    """One row per (workload, policy, engine): the prediction against the median of the engine's
    repeats (errors are predicted ÷ median − 1), the repeats' range, and the per-step errors'
    medians over repeats."""
    if table.empty:
        return pd.DataFrame()
    rows = []
    for (workload, policy, engine), g in table.groupby(["workload", "policy", "engine"], sort=True):
        measured = g["measured_total_s"].astype(float)
        predicted = float(g["predicted_total_s"].iloc[0])
        row = {
            "workload": workload,
            "policy": policy,
            "engine": engine,
            "repeats": len(g),
            "measured_total_s": float(measured.median()),
            "measured_min_s": float(measured.min()),
            "measured_max_s": float(measured.max()),
            "predicted_total_s": predicted,
            "total_err": _rel(predicted, float(measured.median())),
            "step_median_err": float(g["step_median_err"].median()),
            "step_p90_err": float(g["step_p90_err"].median()),
            "step_sum_err": float(g["step_sum_err"].median()),
            "disturbed_frac": float(g["disturbed_frac"].max()),
        }
        for key in LATENCY_PAIRS:
            m = pd.to_numeric(g[f"{key}_measured"], errors="coerce").median()
            row[f"{key}_err"] = _rel(float(g[f"{key}_predicted"].iloc[0]), float(m))
        rows.append(row)
    return pd.DataFrame(rows)


def disturbed_warning(summary: pd.DataFrame) -> str | None:
    """One line when an engine run being predicted was itself slowed by something else: over
    ``DISTURBED_WARN`` of its steps took more than ``DISTURBED_RATIO`` × their price. Its measured
    times are then not the engine's alone, and neither are the errors beside them."""
    if summary.empty or "disturbed_frac" not in summary:
        return None
    bad = summary[summary["disturbed_frac"] > DISTURBED_WARN]
    if bad.empty:
        return None
    return (
        f"predicted vs measured: {len(bad)} workload(s) had an engine run with over {DISTURBED_WARN:.0%} of "
        f"its steps at more than {DISTURBED_RATIO:g}x their price (up to {bad['disturbed_frac'].max():.1%}): "
        f"another process was probably using the cores, so those measured "
        f"times and their errors are not the engine's alone"
    )


DRIFT_KEY: tuple[str, ...] = ("workload", "policy", "engine")


@dataclasses.dataclass(frozen=True)
class Drift:
    """``prediction_drift``'s two tables: ``rounds`` (repeat, workloads, phase: the median
    step-sum error of that repeat's runs) and ``workloads`` (workload, policy, engine, rounds,
    step_sum_err: the median over rounds, offset: the median over rounds of step-sum error less its
    round's phase)."""

    rounds: pd.DataFrame
    workloads: pd.DataFrame


def prediction_drift(table: pd.DataFrame) -> Drift:
    """The step-sum errors of ``prediction_table`` split into a phase per round (what the machine
    did) and an offset per workload (what the model does); see the module's docstring. Rows
    without a per-step error (no profile, no measured steps) take no part."""
    empty = Drift(
        pd.DataFrame(columns=["repeat", "workloads", "phase"]),
        pd.DataFrame(columns=[*DRIFT_KEY, "rounds", "step_sum_err", "offset"]),
    )
    t = table.dropna(subset=["step_sum_err"]) if "step_sum_err" in table else table
    if t.empty:
        return empty
    t = t.assign(repeat=t["repeat"].fillna(-1).astype(int))
    rounds = t.groupby("repeat", sort=True)["step_sum_err"].agg(workloads="size", phase="median").reset_index()
    t = t.merge(rounds[["repeat", "phase"]], on="repeat")
    t = t.assign(offset=t["step_sum_err"] - t["phase"])
    workloads = (
        t.groupby(list(DRIFT_KEY), sort=True)
        .agg(rounds=("repeat", "size"), step_sum_err=("step_sum_err", "median"), offset=("offset", "median"))
        .reset_index()
    )
    return Drift(rounds, workloads)


def _profile(text: object):  # type: ignore[no-untyped-def]
    if not isinstance(text, str) or not text:
        return None
    try:
        return parse_profile(text.encode(), "the run's clock profile")
    except KvbenchError:
        return None
