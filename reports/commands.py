"""``kvbench report DIR`` and ``kvbench compare BASE_DIR CAND_DIR`` (the nightly gate)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..harness.errors import KvbenchError

if TYPE_CHECKING:
    import pandas as pd

DEFAULT_TOLERANCE = 0.02


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "report", help="write DIR/report (index.html, summary.md, figures) from a results directory",
        description="Read the Parquet records under DIR and write DIR/report/index.html (self-contained), "
                    "DIR/report/summary.md and the figures as PNG files; print the page's path.")
    p.add_argument("dir", type=Path, metavar="DIR", help="results directory written by `kvbench run --out DIR`")
    p.set_defaults(func=report)

    c = subparsers.add_parser(
        "compare", help="compare two results directories cell by cell; exit 1 on a regression",
        description="Match the cells of BASE_DIR and CAND_DIR by what they measure and report each metric's "
                    "change. Exits 1 when a matched cell regresses beyond the tolerance (capacity or throughput "
                    "down, waste or preemptions up), 0 otherwise. Notes say when the two sides, or the runs "
                    "within one side, come from different kvbench code (code_digest).")
    c.add_argument("base", type=Path, metavar="BASE_DIR")
    c.add_argument("cand", type=Path, metavar="CAND_DIR")
    c.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE, metavar="F",
                   help="relative change allowed (0.02 = 2%%; for waste shares, points of the budget); "
                        f"default {DEFAULT_TOLERANCE}")
    c.add_argument("--format", choices=("md", "json"), default="md", help="output format (default md)")
    c.set_defaults(func=compare)


def report(args: argparse.Namespace) -> int:
    if not args.dir.is_dir():  # before the heavy imports: a typo answers at once
        raise KvbenchError(f"{args.dir}: no such results directory")
    # And before taking a lock: no lock file is left in a folder kvbench never wrote (one
    # holding the lock file already is a results directory, perhaps with a run starting there).
    if not ((args.dir / "runs").is_dir() or (args.dir / ".kvbench.lock").is_file()):
        raise KvbenchError(f"{args.dir}: no runs/ directory; not a kvbench results directory")
    from ..harness.records.lock import ResultsLock
    from ..harness.records.safe_paths import check_results_layout
    from .html import write_report
    from .report_files import check_replaceable

    from ..harness.records.store import check_complete

    check_results_layout(args.dir)
    check_replaceable(args.dir / "report")
    check_complete(args.dir)  # an incomplete run is named before anything, the lock included, is touched
    with ResultsLock(args.dir, "report"):  # not while a run writes the same directory
        print(write_report(args.dir))
    return 0


def _runs(path: Path, which: str) -> "pd.DataFrame":
    from ..harness.records.store import check_complete, read_table

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


def unmeasured(runs: "pd.DataFrame") -> str | None:
    """Why a side measured nothing (every run infeasible, failed or out of memory), or None."""
    if (runs["status"] == "ok").any():
        return None
    counts = runs["status"].value_counts()
    return ", ".join(f"{n} {status}" for status, n in counts.items())


def compare(args: argparse.Namespace) -> int:
    from .compare import BASE_ONLY, CAND_ONLY, code_notes, compare as diff, regressions, to_json, to_markdown

    tol = args.tolerance
    if not (tol >= 0 and tol < float("inf")):
        raise KvbenchError(f"--tolerance must be a non-negative number, got {tol}")
    base, cand = _runs(args.base, "BASE_DIR"), _runs(args.cand, "CAND_DIR")
    result = diff(base, cand, tol)
    notes = code_notes(base, cand)  # a note, not a failure: comparing code is what the gate is for
    print(to_json(result, tol, notes) if args.format == "json" else to_markdown(result, tol, notes), end="")
    reg = regressions(result)
    for runs, which, path in ((base, "BASE_DIR", args.base), (cand, "CAND_DIR", args.cand)):
        why = unmeasured(runs)
        if why is not None:
            # A gate that measured nothing must not pass: no run of this side has a number.
            print(f"kvbench compare: {which} {path} measured nothing (its {len(runs)} run(s): {why}); "
                  f"nothing was compared", file=sys.stderr)
            return 1
    if not (~result["verdict"].isin((BASE_ONLY, CAND_ONLY))).any():
        # A gate that compared nothing must not pass: the directories measure different cells.
        print("kvbench compare: no cell matched by spec; nothing was compared", file=sys.stderr)
        return 1
    if len(reg):
        worst = "; ".join(f"{cell} ({', '.join(sub['metric'].astype(str))})" for cell, sub in reg.groupby("cell", sort=False))
        print(f"kvbench compare: regression beyond tolerance {tol:g} in {reg['cell'].nunique()} cell(s): {worst}",
              file=sys.stderr)
        return 1
    return 0
