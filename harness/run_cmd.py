"""``kvbench run``: a suite's cells → records → summary table → report."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.errors import InfeasibleError, KvbenchError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "run", help="run a suite (the embedded default suite when none is given)",
        description="Run every cell of a suite, write Parquet records under --out, print a summary "
                    "table and write the report. Cells already present in --out are skipped.")
    p.add_argument("suite", nargs="?", help="suite TOML file (default: the embedded default suite)")
    p.add_argument("--out", type=Path, help="results directory (default: kvbench-results/<suite name>)")
    p.add_argument("--runner", action="append", metavar="R",
                   help="run only these runners of the suite (repeatable)")
    p.add_argument("--executor", choices=("local", "ray"), default="local")
    p.add_argument("--address", help="Ray cluster address (with --executor ray)")
    p.add_argument("--jobs", type=int, default=1, help="worker processes for the local executor")
    p.add_argument("--rerun", action="store_true", help="run cells again even when their records exist")
    p.add_argument("--quiet", action="store_true", help="no progress lines (for CI logs)")
    p.add_argument("--no-report", action="store_true", help="skip writing DIR/report")
    p.set_defaults(func=run)


def _available(runner: str) -> str | None:
    from runners import get_runner

    try:
        return get_runner(runner).unavailable()
    except KvbenchError as exc:
        return str(exc)


def run(args: argparse.Namespace) -> int:
    from harness import store
    from harness.suite import default_suite_path, load_suite
    from harness.sweep import build_cells, run_cells

    if args.jobs < 1:
        raise KvbenchError(f"--jobs must be at least 1, got {args.jobs}")
    suite = load_suite(args.suite or default_suite_path())
    out: Path = args.out or Path("kvbench-results") / suite.name
    if out.exists() and not out.is_dir():
        raise KvbenchError(f"--out {out}: exists and is not a directory")

    def log(msg: str) -> None:
        if not args.quiet:
            print(msg, file=sys.stderr)

    wanted = set(args.runner or suite.runners())
    unknown = wanted - set(suite.runners())
    if unknown:
        raise KvbenchError(f"--runner {', '.join(sorted(unknown))}: not in suite {suite.name!r} "
                           f"(it has: {', '.join(suite.runners())})")
    skipped: dict[str, str] = {}
    for runner in suite.runners():
        if runner in wanted and runner in suite.optional_runners:
            reason = _available(runner)
            if reason:
                skipped[runner] = reason
                wanted.discard(runner)
    for runner, reason in skipped.items():
        log(f"skipping optional runner {runner}: {reason}")

    out.mkdir(parents=True, exist_ok=True)
    store.clean_stale_temps(out)
    cells = [c for c in build_cells(suite, out, log) if c.spec.runner in wanted]
    existing = set() if args.rerun else store.existing_run_ids(out)
    todo = [c for c in cells if c.run_id not in existing]
    if len(todo) < len(cells):
        log(f"{len(cells) - len(todo)} of {len(cells)} cells already in {out}; skipping them (--rerun to force)")
    log(f"suite {suite.name}: running {len(todo)} cell(s) into {out}")
    rows = run_cells(todo, jobs=args.jobs, quiet=args.quiet, executor=args.executor, address=args.address)

    # The table is read back from disk: what is printed is what was recorded.
    from reports.console import render_rows

    ids = {c.run_id for c in cells}
    runs = store.read_table(out, "runs", ids)
    order = {c.run_id: i for i, c in enumerate(cells)}
    runs = runs.assign(_order=runs["run_id"].map(order)).sort_values("_order")
    print(render_rows(runs.to_dict("records")))

    if not args.no_report:
        try:
            from reports.html import write_report
        except ModuleNotFoundError:
            log("report: not built yet (reports.html missing)")
        else:
            path = write_report(out)
            print(f"report: {path}")

    # The verdict covers every cell of the suite, skipped (already recorded) ones included.
    statuses = runs["status"].tolist()
    failed = sum(s in ("failed", "oom") for s in statuses)
    infeasible = statuses.count("infeasible")
    print(f"{len(rows)} cell(s) run, {len(cells) - len(todo)} skipped, {failed} failed, "
          f"{infeasible} infeasible", file=sys.stderr)
    if failed:
        return 1
    if statuses and infeasible == len(statuses):
        first = runs.loc[runs["status"] == "infeasible", "error"].iloc[0]
        raise InfeasibleError(f"every cell is infeasible; first: {first}")
    return 0
