"""``kvbench compare BASE_DIR CAND_DIR``: the nightly gate."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ...harness.errors import KvbenchError
from ...harness.records.safe_paths import nonempty_path
from ...harness.records.statuses import OK
from .base import Command

if TYPE_CHECKING:
    import pandas as pd

DEFAULT_TOLERANCE = 0.02


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("base", type=nonempty_path, metavar="BASE_DIR")
    p.add_argument("cand", type=nonempty_path, metavar="CAND_DIR")
    p.add_argument(
        "--tolerance",
        type=float,
        default=DEFAULT_TOLERANCE,
        metavar="F",
        help="relative change allowed (0.02 = 2%%; for waste shares, points of the budget); "
        f"default {DEFAULT_TOLERANCE}",
    )
    p.add_argument("--format", choices=("md", "json"), default="md", help="output format (default md)")


def _runs(path: Path, which: str) -> pd.DataFrame:
    from ...harness.records.store import check_complete, read_table

    if not path.exists():
        raise KvbenchError(f"{which} {path}: no such directory")
    if not path.is_dir():
        raise KvbenchError(f"{which} {path}: not a directory")
    if not (path / "runs").is_dir():
        raise KvbenchError(f"{which} {path}: no runs/ directory; not a kvbench results directory")
    check_complete(path)
    runs = read_table(path, "runs")
    if runs.empty:
        raise KvbenchError(f"{which} {path}: holds no runs")
    return runs


def unmeasured(runs: pd.DataFrame) -> str | None:
    """Why a side measured nothing (every run infeasible, failed or out of memory), or None."""
    if (runs["status"] == OK).any():
        return None
    counts = runs["status"].value_counts()
    return ", ".join(f"{n} {status}" for status, n in counts.items())


def compare(args: argparse.Namespace) -> int:
    from ...reports.compare import (
        BASE_ONLY,
        CAND_ONLY,
        code_notes,
        import_notes,
        regressions,
        to_json,
        to_markdown,
        unjudged_imported_cells,
    )
    from ...reports.compare import compare as diff

    tol = args.tolerance
    if not (tol >= 0 and tol < float("inf")):
        raise KvbenchError(f"--tolerance must be a non-negative number, got {tol}")
    base, cand = _runs(args.base, "BASE_DIR"), _runs(args.cand, "CAND_DIR")
    result = diff(base, cand, tol)
    notes = code_notes(base, cand)  # a note, not a failure: comparing code is what the gate is for
    notes += import_notes(base, cand)
    print(to_json(result, tol, notes) if args.format == "json" else to_markdown(result, tol, notes), end="")
    reg = regressions(result)
    for runs, which, path in ((base, "BASE_DIR", args.base), (cand, "CAND_DIR", args.cand)):
        why = unmeasured(runs)
        if why is not None:
            # A gate that measured nothing must not pass: no run of this side has a number.
            print(
                f"kvbench compare: {which} {path} measured nothing (its {len(runs)} run(s): {why}); "
                f"nothing was compared",
                file=sys.stderr,
            )
            return 1
    if not (~result["verdict"].isin((BASE_ONLY, CAND_ONLY))).any():
        # A gate that compared nothing must not pass: the directories measure different cells.
        print("kvbench compare: no cell matched by spec; nothing was compared", file=sys.stderr)
        return 1
    if len(reg):
        worst = "; ".join(
            f"{cell} ({', '.join(sub['metric'].astype(str))})" for cell, sub in reg.groupby("cell", sort=False)
        )
        print(
            f"kvbench compare: regression beyond tolerance {tol:g} in {reg['cell'].nunique()} cell(s): {worst}",
            file=sys.stderr,
        )
        return 1
    unjudged = unjudged_imported_cells(result)
    if unjudged:
        # An imported run lacks the allocation columns and its timed metrics need repetitions:
        # a cell where that left nothing judged must not pass as if it had been compared.
        print(
            f"kvbench compare: nothing judged in {len(unjudged)} cell(s) holding runs imported from "
            f"vllm bench serve ({'; '.join(unjudged)}): import at least 3 repetitions per side to judge "
            "their timed throughput and latency",
            file=sys.stderr,
        )
        return 1
    return 0


COMMAND = Command(
    "compare",
    help="compare two results directories cell by cell; exit 1 on a regression",
    description="Match the cells of BASE_DIR and CAND_DIR by what they measure and report each metric's "
    "change. Exits 1 when a matched cell regresses beyond the tolerance (capacity or throughput "
    "down, waste or preemptions up), 0 otherwise. Notes say when the two sides, or the runs "
    "within one side, come from different kvbench code (code_digest).",
    configure=configure,
    run=compare,
)
