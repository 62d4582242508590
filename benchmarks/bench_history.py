"""Benchmark of ``kvbench history``: a year of nights, and how well its change detection sees.

**Scale** (``--parts s``): one real ``kvbench run`` (sim and the torch runner) is copied into
``--nights`` nights of ``--cells`` cells each (its run rows repeated at several KV budgets, each a
cell of its own; ±3% noise on the timed columns; the steps and requests partitions linked), then
``kvbench history DIR --json`` runs on them as a user runs it: cold (every night from its files),
again (every night from the cache in ``DIR/history``), and as a nightly job calls it (one new
night). Prints each call's wall time and peak memory, and the phases in process. Goal: 365 nights
× 50 cells in under 10 s, memory bounded.

**Detection** (``--parts d``): the method on seeded series of 30 nights (300 each): a +5% step at
night 20, a -0.5%-a-night drift, noise alone; uniform ±3% noise and Gaussian σ 3%. Prints how often
the step is found at night 20 ± 1, the drift is found as a drift, and noise alone yields a change.
Deterministic: the same numbers every run.

Not a test (pytest does not collect ``benchmarks/``). From the repository root:

    .venv/bin/python benchmarks/bench_history.py [--parts sd] [--nights 365] [--cells 50] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
GOAL_S = 10.0
TIMED = ("wall_tokens_per_s", "mean_step_wall_s")

SUITE = """name = "bench-history"
[model]
preset = "tiny"
kv_dtype = "fp32"
[memory]
kv_budget = "64KiB"
max_model_len = 128
[workload]
source = "uniform"
num_requests = 16
prompt_min = 8
prompt_max = 40
output_min = 4
output_max = 20
arrival = "batch"
seed = 3
[grid]
runner = ["sim", "torch"]
policy = ["contiguous-max", "paged"]
block_size = [16, 32]
"""


def kvbench(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvbench.app.cli", *map(str, args)], cwd=ROOT, capture_output=True, text=True
    )


def make_year(root: Path, nights: int, cells: int) -> None:
    """``nights`` nights of ``cells`` cells each under ``root``, from one real run."""
    records = root / "records"
    root.mkdir(parents=True, exist_ok=True)
    (root / "suite.toml").write_text(SUITE)
    done = kvbench("run", root / "suite.toml", "--out", records, "--quiet")
    if done.returncode != 0:
        sys.exit(f"bench_history: kvbench run failed: {done.stderr.strip()}")
    tables = [pq.read_table(p) for p in sorted((records / "runs").glob("run_id=*/part-0.parquet"))]
    steps = next((records / "steps").glob("run_id=*/part-0.parquet"))
    requests = next((records / "requests").glob("run_id=*/part-0.parquet"))
    rows = [r for t in tables for r in t.to_pylist()]
    schema = tables[0].schema
    rng = random.Random(0)
    start = datetime(2026, 1, 1, 2, 15, tzinfo=UTC)
    for k in range(nights):
        when = start + timedelta(days=k)
        night = root / "nights" / f"{when.strftime('%Y%m%dT%H%M%SZ')}-{rng.getrandbits(28):07x}"
        for c in range(cells):
            base = rows[c % len(rows)]
            row = dict(base, budget_bytes=base["budget_bytes"] * (1 + c // len(rows)), started_at=when)
            for m in TIMED:
                if row.get(m) is not None:
                    row[m] *= 1 + rng.uniform(-0.03, 0.03)
            rid = f"{c:04d}"
            for table, src in (("steps", steps), ("requests", requests)):
                (night / table / f"run_id={rid}").mkdir(parents=True)
                os.link(src, night / table / f"run_id={rid}" / "part-0.parquet")
            (night / "runs" / f"run_id={rid}").mkdir(parents=True)
            pq.write_table(
                pa.Table.from_pylist([row], schema=schema), night / "runs" / f"run_id={rid}" / "part-0.parquet"
            )


def timed_history(nights_dir: Path, json_out: Path) -> tuple[float, float, str]:
    """``kvbench history`` run as a user runs it: (wall seconds, its peak memory in MiB, its stderr)."""
    probe = (
        "import resource, subprocess, sys; "
        "done = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
        "sys.stderr.write(done.stderr); "
        "print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    cmd = [sys.executable, "-m", "kvbench.app.cli", "history", str(nights_dir), "--json", str(json_out)]
    t = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", probe, *cmd], cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t
    rc, peak_kib = done.stdout.split()
    if rc != "0":
        sys.exit(f"bench_history: kvbench history failed: {done.stderr.strip()}")
    return wall, int(peak_kib) / 1024, done.stderr


def scale(args: argparse.Namespace) -> None:
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-history-"))
    nights_dir = root / "nights"
    if not nights_dir.is_dir():
        print(f"making {args.nights} nights × {args.cells} cells under {root} ...", flush=True)
        t = time.perf_counter()
        make_year(root, args.nights, args.cells)
        print(f"  made in {time.perf_counter() - t:.1f} s")
    shutil.rmtree(nights_dir / "history", ignore_errors=True)
    shutil.rmtree(nights_dir / "29991231T000000Z-fffffff", ignore_errors=True)
    print(f"kvbench history on {args.nights} nights × {args.cells} cells (goal: under {GOAL_S:.0f} s):")
    print("| call | wall | peak memory |")
    print("|---|---|---|")
    cold = timed_history(nights_dir, root / "changes.json")
    print(f"| cold: every night from its files | {cold[0]:.1f} s | {cold[1]:.0f} MiB |")
    warm = timed_history(nights_dir, root / "changes.json")
    print(f"| again: every night from the cache | {warm[0]:.1f} s | {warm[1]:.0f} MiB |")
    last = sorted(p for p in nights_dir.iterdir() if p.name[0].isdigit())[-1]
    shutil.copytree(last, nights_dir / "29991231T000000Z-fffffff", symlinks=True)  # tonight
    tonight = timed_history(nights_dir, root / "changes.json")
    print(f"| the nightly case: one new night, the rest from the cache | {tonight[0]:.1f} s | {tonight[1]:.0f} MiB |")
    shutil.rmtree(nights_dir / "29991231T000000Z-fffffff")
    in_process(nights_dir)
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)


def in_process(nights_dir: Path) -> None:
    """The same work in this process, phase by phase."""
    from kvbench.reports.history.cache import load_cache
    from kvbench.reports.history.changes import detect
    from kvbench.reports.history.nights import read_nights
    from kvbench.reports.history.page import render
    from kvbench.reports.history.series import build_history

    t0 = time.perf_counter()
    nights = read_nights(nights_dir, cached=load_cache(nights_dir / "history"))
    t1 = time.perf_counter()
    built = build_history(nights)
    t2 = time.perf_counter()
    found = detect(built, 0.02)
    t3 = time.perf_counter()
    files = render(built, found)
    t4 = time.perf_counter()
    print(
        f"  phases (in process, from the cache): read {t1 - t0:.2f} s, match cells {t2 - t1:.2f} s, "
        f"detect {t3 - t2:.2f} s, draw {t4 - t3:.2f} s ({len(files) - 1} graphs); "
        f"{len(built.points):,} values, {len(found.changes)} changes"
    )


def detection(_: argparse.Namespace) -> None:
    from kvbench.reports.compare import change
    from kvbench.reports.history.changes import fitted, noise_scale, segment

    def found(y: np.ndarray, stretches: list) -> list[tuple[str, int]]:
        f, out = fitted(y, stretches), []
        for k, st in enumerate(stretches):
            if k and abs(change("x", np.exp(f[st.start - 1]), np.exp(f[st.start]))) > 0.02:
                out.append(("step", st.start))
            if st.line and abs(change("x", np.exp(f[st.start]), np.exp(f[st.stop - 1]))) > 0.02:
                out.append(("drift", st.start))
        return out

    n, trials = 30, 300
    print(f"detection on {trials} seeded series of {n} nights each (tolerance 2%):")
    print(
        "| noise | step +5% at night 20 found at 20 ± 1 | drift -0.5%/night found as a drift | noise alone: a change |"
    )
    print("|---|---|---|---|")
    for label in ("uniform ±3%", "Gaussian σ 3%"):
        rng = np.random.default_rng(1)
        uniform = label.startswith("uniform")

        def draw(rng: np.random.Generator = rng, uniform: bool = uniform) -> np.ndarray:
            return rng.uniform(-0.03, 0.03, n) if uniform else rng.normal(0, 0.03, n)

        x = np.arange(n)
        cases = {
            "step": [np.log1p(draw()) + np.where(x >= 20, np.log(1.05), 0.0) for _ in range(trials)],
            "drift": [np.log1p(draw()) + x * np.log(0.995) for _ in range(trials)],
            "noise": [np.log1p(draw()) for _ in range(trials)],
        }
        rates = {}
        for name, series in cases.items():
            ys = np.vstack(series)
            sig = np.array([noise_scale(y) for y in ys])
            seen = [found(y, s) for y, s in zip(ys, segment(ys, sig))]
            if name == "step":
                rates[name] = np.mean([any(k == "step" and abs(at - 20) <= 1 for k, at in f) for f in seen])
            elif name == "drift":
                rates[name] = np.mean([any(k == "drift" for k, _ in f) for f in seen])
            else:
                rates[name] = np.mean([bool(f) for f in seen])
        print(f"| {label} | {rates['step']:.1%} | {rates['drift']:.1%} | {rates['noise']:.1%} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", default="sd", help="s: scale, d: detection (default both)")
    p.add_argument("--nights", type=int, default=365)
    p.add_argument("--cells", type=int, default=50)
    p.add_argument("--keep", metavar="DIR", help="make the nights in DIR and keep them (reused when there)")
    args = p.parse_args()
    if "s" in args.parts:
        scale(args)
    if "d" in args.parts:
        detection(args)


if __name__ == "__main__":
    main()
