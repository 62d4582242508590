"""``kvbench report DIR``: the report of a results directory."""

from __future__ import annotations

import argparse

from ...harness.errors import KvbenchError
from ...harness.records.safe_paths import nonempty_path
from .base import Command


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "dir", type=nonempty_path, metavar="DIR", help="results directory written by `kvbench run --out DIR`"
    )


def report(args: argparse.Namespace) -> int:
    if not args.dir.is_dir():  # before the heavy imports: a typo answers at once
        raise KvbenchError(f"{args.dir}: no such results directory")
    # And before taking a lock: no lock file is left in a folder kvbench never wrote (one
    # holding the lock file already is a results directory, perhaps with a run starting there).
    if not ((args.dir / "runs").is_dir() or (args.dir / ".kvbench.lock").is_file()):
        raise KvbenchError(f"{args.dir}: no runs/ directory; not a kvbench results directory")
    from ...harness.records.lock import ResultsLock
    from ...harness.records.safe_paths import check_results_layout
    from ...harness.records.store import check_complete
    from ...reports.html import write_report
    from ...reports.report_files import check_replaceable

    check_results_layout(args.dir)
    check_replaceable(args.dir / "report")
    check_complete(args.dir)  # an incomplete run is named before anything, the lock included, is touched
    with ResultsLock(args.dir, "report"):  # not while a run writes the same directory
        print(write_report(args.dir))
    return 0


COMMAND = Command(
    "report",
    help="write DIR/report (index.html, summary.md, figures) from a results directory",
    description="Read the Parquet records under DIR and write DIR/report/index.html (self-contained), "
    "DIR/report/summary.md and the figures as PNG files; print the page's path.",
    configure=configure,
    run=report,
)
