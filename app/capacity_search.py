"""Refining each policy's capacity by bisection between the rates a suite swept.

A sweep brackets a line's capacity between its highest rate within the SLO (every bound
holds) and the next swept rate (``reports.capacity``). With ``[slo] refine = N``, ``kvbench run``
then runs N more rounds: each line still bracketed gets one run at the bracket's
geometric middle (rounded to 3 significant digits, so a resumed run finds the
same cells), recorded like any cell; the capacity is recomputed from the records
and the bracket halves (in log rate). Every number stays one derived from runs on
disk: the refined capacity is simply the capacity over more points.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

from ..harness.records.statuses import OK
from ..reports.suite_tables import capacities, suite_runs
from ..runners.base import Cell
from .suite import Suite


def middle(lo: float, hi: float) -> float:
    """The geometric middle of (lo, hi), to 3 significant digits."""
    return float(f"{math.sqrt(lo * hi):.3g}")


def cell_at_rate(cell: Cell, rate: float, out: Path) -> Cell:
    """``cell`` with its workload's arrival rate changed (the workload built and written once), named as
    the suite names it."""
    from ..workloads import build_workload
    from .resume import keep_workload

    spec = cell.spec.replace(workload=cell.spec.workload.replace(rate=rate))
    workload = build_workload(spec.workload, spec.memory.max_model_len)
    keep_workload(workload, out)
    return Cell(spec=spec, workload=workload, out=out, workload_name=cell.workload_name)


def refine(
    suite: Suite, out: Path, cells: Sequence[Cell], run: Callable[[list[Cell]], object], log: Callable[[str], None]
) -> int:
    """Bisect, ``suite.slo.refine`` times, every line whose capacity the suite's own rates bracket;
    the number of cells run. Deterministic: the brackets start from the suite's swept rates (never
    from earlier refinements), so running the suite again finds the same middles recorded and
    runs nothing."""
    from ..harness.records.goodput import within_slo
    from ..harness.records.slo import judged_bounds
    from .resume import plan_resume

    assert suite.slo is not None
    bounds = judged_bounds(suite.slo)
    by_id = {c.run_id: c for c in cells}
    swept = capacities(out, suite.name, suite.slo, ids=set(by_id))  # the suite's own points only
    brackets = [
        (by_id[r["run_id"]], float(r["capacity_rps"]), float(r["next_rps"]))
        for r in swept.to_dict("records")
        if r["status"] == "within the sweep" and r["run_id"] in by_id
    ]
    ran = 0
    for step in range(suite.slo.refine):
        trials = [
            (cell_at_rate(t, middle(lo, hi), out), t, lo, hi) for t, lo, hi in brackets if lo < middle(lo, hi) < hi
        ]  # else as narrow as 3 digits write
        if not trials:
            break
        todo = plan_resume([c for c, *_ in trials], out).todo
        log(
            f"capacity: bisection step {step + 1} of {suite.slo.refine}: {len(trials)} line(s) at "
            f"{', '.join(f'{c.spec.workload.rate:g}' for c, *_ in trials)} req/s ({len(todo)} to run)"
        )
        if todo:
            run(todo)
            ran += len(todo)
        runs = suite_runs(out, suite.name, suite.slo, {c.run_id for c, *_ in trials}).set_index("run_id")
        within = {
            rid: r["status"] == OK and within_slo(r, bounds, suite.slo.goodput_floor)
            for rid, r in zip(runs.index, runs.to_dict("records"))
        }
        brackets = []
        for c, t, lo, hi in trials:
            ok = bool(within.get(c.run_id, False))  # a missing, failed or over-the-SLO run: over
            rate = c.spec.workload.rate
            assert rate is not None  # a line of a rate sweep
            brackets.append((t, rate, hi) if ok else (t, lo, rate))
    return ran
