"""``kvbench run``: a suite's cells → records → summary table → report."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import signal
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING

from ...harness.clock.tables_clock import TablesClock
from ...harness.errors import InfeasibleError, Interrupted, KvbenchError, StorageError, storage_error
from ...harness.files import kind
from ...harness.records.lock import ResultsLock
from ...harness.records.safe_paths import check_results_layout, nonempty_path, nonempty_text
from ...harness.records.statuses import FAILURES, INFEASIBLE
from ..signals import raise_pending
from ..third_party import Redirect, open_results_log, to_log
from .base import Command

if TYPE_CHECKING:
    from ...harness.spec.specs import RunSpec
    from ...runners.base import Cell
    from ..suite import Suite
    from ..sweep import Prepared


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "suite",
        nargs="?",
        type=nonempty_text,
        help="suite TOML file, or the name of a shipped suite such as "
        "paper-block-size (default: the embedded default suite)",
    )
    p.add_argument("--out", type=nonempty_path, help="results directory (default: kvbench-results/<suite name>)")
    p.add_argument("--runner", action="append", metavar="R", help="run only these runners of the suite (repeatable)")
    p.add_argument("--executor", choices=("local", "ray"), default="local")
    p.add_argument("--address", help="Ray cluster address (with --executor ray)")
    p.add_argument(
        "--jobs", type=int, default=1, help="worker processes for the local executor (at most one per cell to run)"
    )
    p.add_argument("--rerun", action="store_true", help="run cells again even when their records exist")
    p.add_argument(
        "--keep-stale",
        action="store_true",
        help="keep cells recorded by other kvbench code (another code_digest) instead of running them again",
    )
    p.add_argument("--quiet", action="store_true", help="no progress lines (for CI logs)")
    p.add_argument(
        "--verbose",
        action="store_true",
        help="let other libraries' warnings and log lines (vLLM, torch) reach the console; "
        "without it they go to DIR/kvbench.log",
    )
    p.add_argument("--no-report", action="store_true", help="skip writing DIR/report")
    p.add_argument(
        "--clock-profile",
        type=nonempty_path,
        metavar="FILE.json",
        help='the profile for cells on clock = "profile" (instead of the suite\'s clock_profile); '
        "made by `kvbench calibrate`",
    )


RESULTS_ROOT = Path("kvbench-results")


def results_dir(args: argparse.Namespace, suite_name: str) -> Path:
    """--out, or kvbench-results/<suite name>; the suite's name is one path component
    (``harness.spec.names``), and this checks again that it cannot land elsewhere."""
    if args.out is not None:
        return args.out
    out = RESULTS_ROOT / suite_name
    # Lexical, not resolved: a user's own symlink kvbench-results/<name> → a bigger disk is fine.
    if out.parent != RESULTS_ROOT or out.name != suite_name or suite_name == "..":
        raise KvbenchError(f"suite name {suite_name!r} would put results outside {RESULTS_ROOT}/")
    return out


def check_results_path(out: Path) -> None:
    """``out`` is a directory or nothing yet (checked first, before any workload is built)."""
    if os.path.lexists(out) and not out.is_dir():
        raise KvbenchError(f"--out {out}: exists and is {kind(os.lstat(out).st_mode)}, not a directory")


def create_results_dir(out: Path) -> None:
    check_results_path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise storage_error(out, exc, "cannot create the results directory") from None


def run(args: argparse.Namespace) -> int:
    if args.jobs < 1:
        raise KvbenchError(f"--jobs must be at least 1, got {args.jobs}")
    if args.rerun and args.keep_stale:
        raise KvbenchError("--rerun runs every cell again and --keep-stale keeps some: give one of them")
    if args.address is not None and args.executor != "ray":
        raise KvbenchError("--address names a Ray cluster: give it with --executor ray")
    # What other libraries print (Ray, torch and vLLM as the runners are probed and run) goes to
    # DIR/kvbench.log from before the first of them is imported: into ``earlier`` until the run
    # creates DIR, into DIR/kvbench.log after (``Redirect.switch``). kvbench's own lines keep the console.
    with tempfile.TemporaryFile() as earlier, contextlib.nullcontext() if args.verbose else to_log(earlier) as redirect:
        return _run(args, earlier, redirect)


def _run(args: argparse.Namespace, earlier: IO[bytes], redirect: Redirect | None) -> int:
    from ..suite import default_suite_path, load_suite

    if args.executor == "ray":
        from ..ray_executor import check_ray

        check_ray(args.address)  # before anything is written: an address where nothing answers
    suite = load_suite(args.suite or default_suite_path())
    if args.clock_profile is not None:
        from ...harness.clock.profile import load_profile

        load_profile(args.clock_profile)  # missing or corrupt: one line now
        suite = dataclasses.replace(
            suite, settings={**suite.settings, "clock_profile": str(args.clock_profile.resolve())}
        )
        if not any(spec.scheduler.clock == "profile" for spec, _ in suite.cells()):
            raise KvbenchError(
                f'--clock-profile: no cell of suite {suite.name!r} runs on clock = "profile" '
                "(set it in [scheduler] or [runners.NAME])"
            )
    out = results_dir(args, suite.name)
    check_results_path(out)

    def log(msg: str) -> None:
        if not args.quiet:
            print(msg, file=sys.stderr)

    wanted = set(args.runner or suite.runners())
    unknown = wanted - set(suite.runners())
    if unknown:
        raise KvbenchError(
            f"--runner {', '.join(sorted(unknown))}: not in suite {suite.name!r} (it has: {', '.join(suite.runners())})"
        )
    return _probe_and_run(args, suite, out, wanted, log, earlier, redirect)


def tables_fallbacks(specs: list[RunSpec]) -> list[str]:
    """One line for each term a tables-clock cell takes from the roofline (or goes without), once."""
    from ...runners.common import clock_for

    lines: dict[str, None] = {}
    for spec in specs:
        if spec.scheduler.clock == "tables":
            clock = clock_for(spec.scheduler, spec.geometry, spec.kv_bytes_per_token)
            lines.update(dict.fromkeys(clock.fallbacks() if isinstance(clock, TablesClock) else []))
    return list(lines)


def _probe_and_run(
    args: argparse.Namespace,
    suite: Suite,
    out: Path,
    wanted: set[str],
    log: Callable[[str], None],
    earlier: IO[bytes],
    redirect: Redirect | None,
) -> int:
    """Probe the optional runners (probing one imports its library: what it prints is kept in
    ``earlier`` for DIR/kvbench.log), validate everything, then create the results directory and run."""
    from ...runners import availability

    skipped: dict[str, str] = {}
    for runner in suite.runners():
        if runner in wanted and runner in suite.optional_runners:
            reason = availability(runner)
            if reason:
                skipped[runner] = reason
                wanted.discard(runner)
    for runner, reason in skipped.items():
        log(f"skipping optional runner {runner}: {reason}")

    # Everything that can refuse the suite does so here, before anything is created: every
    # spec validated and every workload built, in memory.
    from ..sweep import prepare_cells

    prepared = prepare_cells(suite, out, log)
    prepared = dataclasses.replace(prepared, cells=[c for c in prepared.cells if c.spec.runner in wanted])
    from ...runners import cell_skip

    # Cells a runner available here still cannot run (a CPU tier in vLLM's engine on its CPU build):
    # an optional runner's are skipped, a required runner's refused before anything is written.
    kept, tier_skips = [], Counter[tuple[str, str]]()
    for c in prepared.cells:
        why = cell_skip(c.spec)
        if why is None:
            kept.append(c)
        elif c.spec.runner in suite.optional_runners:
            tier_skips[(c.spec.runner, why)] += 1
        else:
            raise KvbenchError(f"runner {c.spec.runner} with a CPU tier: {why}")
    for (runner, why), count in sorted(tier_skips.items()):
        log(f"skipping {count} cell{'s' if count > 1 else ''} of optional runner {runner} with a CPU tier: {why}")
    prepared = dataclasses.replace(prepared, cells=kept)
    for line in tables_fallbacks([c.spec for c in prepared.cells]):
        log(line)
    if any(c.spec.runner == "serve" and c.spec.serve_url for c in prepared.cells):
        from ...runners.serve.runner import check_attached_servers

        check_attached_servers(prepared.cells)  # a server that runs another policy: refused, nothing written
    check_results_layout(out)
    if not args.no_report:
        from ...reports.report_files import check_replaceable

        try:  # now, not after the sweep: a foreign report/ is refused whole
            check_replaceable(out / "report")
        except KvbenchError as exc:
            raise KvbenchError(f"{exc}, or run with --no-report") from None
    made = [d for d in (out, *out.parents) if not os.path.lexists(d)]  # what this run creates, innermost first
    create_results_dir(out)
    try:
        before = {p.name for p in out.iterdir()}
    except OSError as exc:
        raise storage_error(out, exc, "cannot read") from None
    with ResultsLock(out, "run") as lock:
        try:
            check_results_layout(out)  # again, now that no other kvbench process writes here
            return _run_locked(args, prepared, out, lock, log, earlier, redirect)
        except KvbenchError as exc:
            if not isinstance(exc, StorageError):
                discard_if_untouched(out, before, made, lock)
            raise


def discard_if_untouched(out: Path, before: set[str], made: list[Path], lock: ResultsLock) -> None:
    """A refused run removes exactly what it created, when it wrote nothing else: the lock file
    (if it made it), and the results directory with the parents it made for it. Done while the
    lock is held, so no other kvbench process can have locked the file being removed; one that
    has since put anything there keeps the directory (``rmdir`` fails). A directory removed or
    replaced under the run is no longer ours: it is left as it is."""
    if not lock.still_ours():
        return
    try:
        if {p.name for p in out.iterdir()} - before != ({lock.path.name} if lock.created else set()):
            return  # records were written: they stay
        if lock.created:
            lock.path.unlink()
        for d in made:
            d.rmdir()
    except OSError:
        pass  # removed since, or another process is writing there now: not ours to remove


def _run_locked(
    args: argparse.Namespace,
    prepared: Prepared,
    out: Path,
    lock: ResultsLock,
    log: Callable[[str], None],
    earlier: IO[bytes],
    redirect: Redirect | None,
) -> int:
    """The run proper, while this process alone writes ``out``. An interrupt or a fault of the
    environment leaves only whole runs behind and says how many cells are complete."""
    from ...harness.records import store
    from ...reports.console import summary
    from ..sweep import SweepOptions, SweepState, plan_sweep, run_sweep

    suite = prepared.suite
    options = SweepOptions(
        jobs=args.jobs,
        quiet=args.quiet,
        executor=args.executor,
        address=args.address,
        rerun=args.rerun,
        keep_stale=args.keep_stale,
    )
    store.clean_stale_temps(out)
    state = SweepState()
    output = contextlib.ExitStack()
    try:
        plan = plan_sweep(prepared, out, options, log)
        if redirect is not None:  # from here on other libraries print into DIR/kvbench.log
            redirect.switch(output.enter_context(open_results_log(out, earlier)))
        rows = run_sweep(prepared, plan, out, options, lock.check, log, state)
        text, runs = summary(out, suite.name, [c.run_id for c in prepared.cells], bool(suite.reference), suite.slo, log)
        print(text, end="")
        raise_pending()  # an interrupt a finalizer swallowed after the last cell
        if not args.no_report:
            state.stage = "writing the report"
            from ...reports.html import write_report

            print(f"report: {write_report(out)}")
    except KeyboardInterrupt as exc:
        store.clean_stale_temps(out)
        signum = getattr(exc, "signum", signal.SIGINT)
        raise Interrupted(
            signum, f"interrupted by {signal.Signals(signum).name}: {_progress(out, state.cells, state.stage)}"
        ) from None
    except StorageError as exc:
        store.clean_stale_temps(out)
        if not lock.still_ours():
            raise StorageError(
                f"{out}: the results directory was removed or replaced during the run; the same command starts again"
            ) from None
        raise StorageError(f"{exc}; {_progress(out, state.cells, state.stage)} once the cause is fixed") from None
    finally:
        output.close()

    # The verdict covers every cell of the suite, skipped (already recorded) ones included.
    statuses = runs["status"].tolist()
    failed = sum(s in FAILURES for s in statuses)
    infeasible = statuses.count(INFEASIBLE)
    print(
        f"{len(rows)} cell(s) run, {len(prepared.cells) - len(plan.todo)} skipped, {failed} failed, "
        f"{infeasible} infeasible",
        file=sys.stderr,
    )
    if failed:
        return 1
    if statuses and infeasible == len(statuses):
        first = runs.loc[runs["status"] == INFEASIBLE, "error"].iloc[0]
        raise InfeasibleError(f"every cell is infeasible; first: {first}")
    return 0


def _progress(out: Path, cells: list[Cell], stage: str) -> str:
    """How far the run got, and how to finish it: the end of the one line an interrupted or
    faulted run prints."""
    from ...harness.records import store

    if not cells:
        return f"stopped {stage}; run the same command to start"
    try:
        done = len(store.complete_run_ids(out) & {c.run_id for c in cells})
    except StorageError:
        return f"cannot tell how many of {len(cells)} cell(s) are complete in {out}; run the same command to resume"
    if stage == "writing the report":
        return (
            f"all {len(cells)} cell(s) are recorded in {out}; `kvbench report {out}` (or the same command) "
            f"writes the report"
        )
    return f"{done} of {len(cells)} cell(s) complete in {out}; run the same command to resume"


COMMAND = Command(
    "run",
    help="run a suite (the embedded default suite when none is given)",
    description="Run every cell of a suite, write Parquet records under --out, print a summary "
    "table and write the report. Cells already present in --out are skipped, unless "
    "other kvbench code recorded them (see --keep-stale).",
    configure=configure,
    run=run,
)
