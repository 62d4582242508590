"""``kvbench diverge DIR RUN_A RUN_B``: the first step where two runs' records differ."""

from __future__ import annotations

import argparse
from pathlib import Path

from ...harness.errors import KvbenchError
from ...harness.records.safe_paths import check_records, nonempty_path
from ...harness.records.statuses import OK
from .base import Command

# What must match for a step-by-step comparison to mean anything: the work (harness.spec.identity),
# and the block size, since blocks are what the steps count.
STEP_KEYS: tuple[str, ...] = ("block_size",)


def configure(p: argparse.ArgumentParser) -> None:
    from ...reports.divergence import DEFAULT_COLUMNS

    p.add_argument("dir", type=nonempty_path, help="results directory")
    p.add_argument("run_a", help="run id (or a unique prefix of one)")
    p.add_argument("run_b", help="run id (or a unique prefix of one)")
    p.add_argument(
        "--columns",
        nargs="+",
        metavar="COL",
        default=list(DEFAULT_COLUMNS),
        help=f"steps columns to compare (default: {' '.join(DEFAULT_COLUMNS)}); commas also separate",
    )


def _resolve(out: Path, ids: set[str], given: str) -> str:
    if given in ids:
        return given
    matches = sorted(i for i in ids if i.startswith(given))
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise KvbenchError(f"{out}: no run {given!r}")
    raise KvbenchError(f"{out}: run id prefix {given!r} is ambiguous ({', '.join(matches[:4])}...)")


def run(args: argparse.Namespace) -> int:
    from ...harness.records import store
    from ...harness.records.schema import STEPS
    from ...reports.divergence import first_divergence
    from ...reports.labels import with_keys, work_differences

    out: Path = args.dir
    if not out.is_dir():
        raise KvbenchError(f"{out}: no such results directory")
    columns = [c for item in args.columns for c in item.split(",") if c]
    unknown = [c for c in columns if c not in STEPS.names or c in ("step",)]
    if unknown or not columns:
        raise KvbenchError(
            f"--columns: unknown steps column(s) {', '.join(unknown) or '(none given)'} "
            f"(known: {', '.join(n for n in STEPS.names if n != 'step')})"
        )
    check_records(out)  # run ids are not read through a link into another directory
    ids = store.existing_run_ids(out)
    run_a, run_b = _resolve(out, ids, args.run_a), _resolve(out, ids, args.run_b)
    store.check_complete(out, {run_a, run_b})  # 0 steps against 800 would be no comparison
    steps = store.read_table(out, "steps", {run_a, run_b})
    a = steps[steps["run_id"] == run_a]
    b = steps[steps["run_id"] == run_b]
    runs = with_keys(store.read_table(out, "runs", {run_a, run_b})).set_index("run_id")

    def name(run_id: str) -> str:
        if run_id in runs.index:
            r = runs.loc[run_id]
            return f"{r['runner']}/{r['policy']}"
        return run_id[:8]

    na, nb = name(run_a), name(run_b)
    if na == nb:
        na, nb = f"{na} {run_a[:6]}", f"{nb} {run_b[:6]}"
    if run_a in runs.index and run_b in runs.index:
        # docs/design.md: never compare different work without saying so
        for difference in work_differences(runs.loc[run_a].to_dict(), runs.loc[run_b].to_dict(), STEP_KEYS):
            print(f"note: not the same work: {difference}")
        codes = [runs.loc[r, "code_digest"] for r in (run_a, run_b)]
        if codes[0] != codes[1]:
            print(f"note: not the same code: code_digest {codes[0] or 'not recorded'} vs {codes[1] or 'not recorded'}")
    for run_id in (run_a, run_b):
        if run_id in runs.index and runs.loc[run_id, "status"] != OK:
            print(
                f"note: run {run_id} ({name(run_id)}) has status {runs.loc[run_id, 'status']}: "
                f"{runs.loc[run_id, 'error']}"
            )
    d = first_divergence(a, b, columns)
    if d is None:
        print(f"identical over {len(a)} steps ({na} vs {nb}; compared: {', '.join(columns)})")
        return 0
    print(f"{na} ({run_a}) vs {nb} ({run_b})")
    print(d.describe(na, nb))
    return 1


COMMAND = Command(
    "diverge",
    help="first step where two runs' step records differ, and why",
    description="Compare two runs of one results directory step by step (e.g. sim/paged against "
    "vllm-sched/paged on the same workload and budget). Prints the first step where they "
    "differ in length or in the compared columns, with context; exits 1 when they differ.",
    configure=configure,
    run=run,
)
