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
    from ..harness.lock import ResultsLock
    from .html import write_report

    with ResultsLock(args.dir, "report"):  # not while a run writes the same directory
        print(write_report(args.dir))
    return 0


def _runs(path: Path, which: str) -> "pd.DataFrame":
    from ..harness.store import read_table

    if not path.exists():
        raise KvbenchError(f"{which} {path}: no such directory")
    if not path.is_dir():
        raise KvbenchError(f"{which} {path}: not a directory")
    if not (path / "runs").is_dir():
        raise KvbenchError(f"{which} {path}: no runs/ directory; not a kvbench results directory")
    runs = read_table(path, "runs")
    if runs.empty:
        raise KvbenchError(f"{which} {path}: holds no runs")
    return runs


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
