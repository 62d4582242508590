"""What a resumable sweep finds in its results directory and keeps there: which cells are
already recorded (by this code, whole) and so skipped, and each workload written once."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from ..runners.base import Cell

if TYPE_CHECKING:
    from ..workloads.table import Workload


def keep_workload(workload: Workload, out: Path) -> None:
    """Write the workload to ``out/workloads/<id>.parquet`` once (its id is its content)."""
    from ..workloads import write_workload

    path = out / "workloads" / f"{workload.workload_id}.parquet"
    if not path.exists():
        write_workload(workload, path)


@dataclasses.dataclass(frozen=True)
class Resume:
    """Which cells a run runs, and why the others are not run."""

    todo: list[Cell]  # the rest are recorded by this code (or kept as asked): skipped
    stale_rerun: int  # recorded by other code (or by a kvbench that did not say which): run again
    stale_kept: int  # recorded by other code, kept as asked (--keep-stale)
    incomplete: dict[str, str] = dataclasses.field(default_factory=dict)  # run id → what is missing: run again


def plan_resume(
    cells: list[Cell], out: Path, rerun: bool = False, keep_stale: bool = False, code: str | None = None
) -> Resume:
    """Skip the cells already recorded in ``out`` by this code (``code``: the current
    ``code_digest`` by default); run the rest. A cell recorded by other code is run again, its
    partitions replaced as ``--rerun`` replaces them, unless ``keep_stale``; so is a cell whose
    records are not whole (``store.incomplete_runs``)."""
    from ..harness.records import store
    from ..harness.records.code_identity import code_digest

    if rerun:
        return Resume(list(cells), 0, 0)
    # Whole runs only: a run whose steps or requests partition is missing or short is run again.
    present = store.existing_run_ids(out) & {c.run_id for c in cells}
    incomplete = store.incomplete_runs(out, present)
    on_disk = present - set(incomplete)
    recorded_by: dict[str, object] = {}
    if on_disk:
        runs = store.read_table(out, "runs", on_disk)
        recorded_by = dict(zip(runs["run_id"], runs["code_digest"]))
    current = code or code_digest()
    stale = {rid for rid in on_disk if recorded_by.get(rid) != current}
    skip = on_disk if keep_stale else on_disk - stale
    todo = [c for c in cells if c.run_id not in skip]
    return Resume(todo, 0 if keep_stale else len(stale), len(stale) if keep_stale else 0, incomplete)
