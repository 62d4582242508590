"""``kvbench fit-roofline SUITE``: fit the roofline clock's one factor to a number an engine reports.

A roofline prices a step at the fastest the hardware allows; a real engine is slower
(kernel launch gaps, the layers outside the GEMMs, the engine's own CPU work). When a paper
reports a number that depends on time — the vLLM paper's mean batch of OPT-13B at
2 requests/s — kvbench can fit one factor, ``[scheduler] roofline_scale`` (every step time ×
the factor), so that sim reproduces that number for one cell, and then let every other cell
be a prediction on the same clock. One number, one factor, one cell: never a factor per row.

The fit is a bisection on the factor over sim runs of the chosen cell (the fast path, in a
temporary directory); the metric must move monotonically with the factor between the bounds
(a slower clock queues more requests: mean running, latency and TTFT grow). It prints every
trial, the fitted factor (4 significant digits) and the line to put in the suite.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ...harness.errors import KvbenchError
from ...harness.records.safe_paths import nonempty_text
from ...harness.records.statuses import OK
from ...harness.spec.specs import GPU_CLOCKS
from .base import Command

if TYPE_CHECKING:  # runners.base loads pandas: not while the CLI builds its parser
    from ...runners.base import Cell

TOLERANCE = 0.002  # relative: stop when the metric is within 0.2% of the target
MAX_TRIALS = 40


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "suite", type=nonempty_text, help='suite TOML file (clock = "roofline"), or the name of a shipped suite'
    )
    p.add_argument("--workload", default=None, help="the suite's workload name (needed when it has several)")
    p.add_argument("--policy", default="paged", help="policy of the cell (default: paged)")
    p.add_argument(
        "--block-size", type=int, default=None, help="block size of the cell (needed when it sweeps several)"
    )
    p.add_argument("--metric", default="mean_running", help="runs-table column to match (default: mean_running)")
    p.add_argument("--target", type=float, required=True, help="the reported value of METRIC")
    p.add_argument("--max-scale", type=float, default=16.0, help="upper bound of the search (default: 16)")


def choose_cell(
    cells: list[Cell], workload: str | None, names: dict[str, str], policy: str, block_size: int | None, where: str
) -> Cell:
    """The one sim cell the options name; a one-line error listing the choices otherwise."""
    sims = [c for c in cells if c.spec.runner == "sim"]
    if workload is not None:
        if workload not in names:
            raise KvbenchError(f"{where}: no workload {workload!r} (has {', '.join(names)})")
        sims = [c for c in sims if c.workload.workload_id == names[workload]]
    sims = [c for c in sims if c.spec.policy == policy and (block_size is None or c.spec.block_size == block_size)]
    if len(sims) != 1:
        what = f"policy {policy}" + (f", block size {block_size}" if block_size is not None else "")
        hint = (
            "; choose with --workload and --block-size"
            if sims
            else "; the suite's sim policies: "
            + ", ".join(sorted({c.spec.policy for c in cells if c.spec.runner == "sim"}))
        )
        raise KvbenchError(
            f"{where}: {len(sims)} sim cell(s) with {what}"
            + (f" on {workload}" if workload else "")
            + f": fit-roofline needs exactly one{hint}"
        )
    cell = sims[0]
    if cell.spec.scheduler.clock not in GPU_CLOCKS:
        raise KvbenchError(
            f"{where}: the cell's clock is {cell.spec.scheduler.clock!r}; fit-roofline fits a GPU "
            'clock\'s scale: set [scheduler] clock = "roofline" or "tables"'
        )
    return cell


def metric_at(cell: Cell, scale: float, metric: str) -> float:
    """sim's ``metric`` on ``cell`` with every roofline step time × ``scale``."""
    from ...runners.base import Cell
    from ...runners.sim import SimRunner

    scheduler = dataclasses.replace(cell.spec.scheduler, roofline_scale=scale)
    with tempfile.TemporaryDirectory(prefix="kvbench-fit-") as tmp:
        result = SimRunner().run(
            Cell(spec=cell.spec.replace(scheduler=scheduler), workload=cell.workload, out=Path(tmp))
        )
    row = result.row
    if row.get("status") != OK:
        raise KvbenchError(f"sim at roofline_scale {scale:g}: {row.get('status')} ({row.get('error')})")
    value = row.get(metric)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value:
        raise KvbenchError(f"sim's {metric} is {value!r}, not a number: choose a numeric runs column")
    return float(value)


def bisect(
    f: Callable[[float], float], target: float, lo: float, hi: float, log: Callable[[float, float], None]
) -> tuple[float, float]:
    """The scale in [lo, hi] where ``f`` crosses ``target`` (``f`` monotone there): (scale, f(scale))."""
    f_lo, f_hi = f(lo), f(hi)
    log(lo, f_lo)
    log(hi, f_hi)
    if (f_lo - target) * (f_hi - target) > 0:
        raise KvbenchError(
            f"the metric is {f_lo:.4g} at roofline_scale {lo:g} and {f_hi:.4g} at {hi:g}: the target "
            f"{target:g} is outside, so no slowing of the roofline reproduces it (raise --max-scale, or "
            "the number depends on something the clock does not: lengths, budget, policy)"
        )
    best = (lo, f_lo) if abs(f_lo - target) <= abs(f_hi - target) else (hi, f_hi)
    for _ in range(MAX_TRIALS):
        if abs(best[1] - target) <= TOLERANCE * abs(target) or hi / lo < 1.0001:
            break
        mid = math.sqrt(lo * hi)  # geometric: a factor, not an offset
        f_mid = f(mid)
        log(mid, f_mid)
        if abs(f_mid - target) < abs(best[1] - target):
            best = (mid, f_mid)
        if (f_mid - target) * (f_lo - target) > 0:
            lo, f_lo = mid, f_mid
        else:
            hi = mid
    return best


def run(args: argparse.Namespace) -> int:
    from ...harness.records.schema import RUNS
    from ..suite import load_suite
    from ..sweep import build_cells

    if args.metric not in RUNS.names:
        raise KvbenchError(f"--metric {args.metric!r} is not a runs column")
    if not (args.target == args.target and abs(args.target) < math.inf):
        raise KvbenchError(f"--target must be a finite number, got {args.target!r}")
    if not 1.0 < args.max_scale < math.inf:
        raise KvbenchError(f"--max-scale must be a number above 1, got {args.max_scale!r}")
    suite = load_suite(args.suite)
    names: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="kvbench-fit-") as tmp:
        cells = build_cells(suite, Path(tmp), lambda m: None)
        for c in cells:
            names.setdefault(c.workload_name or "default", c.workload.workload_id)
        if args.workload is None and len(names) > 1:
            raise KvbenchError(
                f"{suite.path}: has {len(names)} workloads ({', '.join(names)}): choose one with --workload"
            )
        cell = choose_cell(cells, args.workload, names, args.policy, args.block_size, suite.path)
        print(
            f"fitting roofline_scale so that sim's {args.metric} on {args.workload or next(iter(names))} "
            f"({cell.spec.policy}, block {cell.spec.block_size}) is {args.target:g}",
            flush=True,
        )

        def log(scale: float, value: float) -> None:
            print(f"  roofline_scale {scale:8.4f}  ->  {args.metric} {value:.4g}", flush=True)

        scale, _ = bisect(lambda s: metric_at(cell, s, args.metric), args.target, 1.0, args.max_scale, log)
        fitted = float(f"{scale:.4g}")
        value = metric_at(cell, fitted, args.metric)
    print(
        f"fitted: roofline_scale = {fitted:g} gives {args.metric} {value:.4g} (target {args.target:g}, "
        f"{value / args.target - 1:+.2%})"
    )
    print(
        f"put in the suite's [scheduler]: roofline_scale = {fitted:g}  # fitted: sim {args.policy} "
        f"{args.metric} = {args.target:g} (kvbench fit-roofline)"
    )
    return 0


COMMAND = Command(
    "fit-roofline",
    help="fit the roofline clock's scale so that one sim cell reproduces a reported number",
    description="Bisect [scheduler] roofline_scale (every roofline step time × the factor, ≥ 1) until sim's "
    "METRIC on one cell of SUITE equals TARGET; print the factor and the line to put in the suite. "
    "The other cells on that clock are then predictions.",
    configure=configure,
    run=run,
)
