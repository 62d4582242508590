"""``kvbench history DIR``: every night of a nightly results directory on one page, and the changes."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ...harness.errors import KvbenchError
from ...harness.records.safe_paths import nonempty_path, output_file
from .base import Command
from .compare import DEFAULT_TOLERANCE

if TYPE_CHECKING:
    from ...reports.history.changes import Change, Detection, Regressed
    from ...reports.history.series import History


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "dir",
        type=nonempty_path,
        metavar="DIR",
        help="where .ci/nightly keeps the nights (its --results; one DIR/<UTC time>-<sha>/ per night)",
    )
    p.add_argument("--json", type=nonempty_path, metavar="FILE", help="also write the changes found as a JSON list")
    p.add_argument(
        "--gate",
        action="store_true",
        help="exit 1 when the latest night is worse than the last accepted night (DIR/accepted; else the "
        "first night) beyond the tolerance, on the fitted series: a step or a drift counts, a blip does not",
    )
    p.add_argument(
        "--tolerance",
        type=float,
        default=DEFAULT_TOLERANCE,
        metavar="F",
        help=f"smallest change reported and gated (0.02 = 2%%; waste shares in points); default {DEFAULT_TOLERANCE}",
    )
    p.add_argument("--quiet", action="store_true", help="print only the page's path (and the gate's line)")


def _pct(ratio: float) -> str:
    return f"{100 * (ratio - 1):+.1f}%" if math.isfinite(ratio) else ("from 0" if ratio == math.inf else "-")


def describe(c: Change) -> str:
    """One change in one line."""
    where = f"{c.cell} · {c.metric}"
    since = f"{c.previous_commit}..{c.commit}" if c.previous_commit else c.commit
    if c.kind == "status":
        now = "back to ok" if c.direction == "improvement" else "no longer ok"
        return f"status   {where}: {now} at {c.first_night} ({since})"
    if c.kind == "exact":  # deterministic: a change of the code (or the work), never noise
        size = f"{_pct(c.ratio)} ({c.direction})"
        return f"exact    {where}: changed at commit {c.commit}, {size}, {c.first_night} ({since})"
    size = f"{_pct(c.ratio)} over the nights to {c.last_night}" if c.kind == "drift" else _pct(c.ratio)
    noise = f"noise ±{100 * c.noise:.1f}%" if c.noise is not None else "noise not estimated"
    return f"{c.kind:<8} {where}: {size} ({c.direction}) at {c.first_night} ({since}), {noise}"


def describe_regressed(r: Regressed) -> str:
    if r.metric == "status":
        return f"{r.cell}: {r.detail}" + (f" since {r.since}" if r.since else "")
    return f"{r.cell} · {r.metric}: {r.reference:.4g} → {r.latest:.4g} ({_pct(r.ratio)})" + (
        f" since {r.since}" if r.since else ""
    )


def summary(history: History, detection: Detection) -> list[str]:
    read, skipped = history.nights.read, history.nights.skipped
    lines = [f"{len(read)} night(s) read ({read[0].name} → {read[-1].name}), {len(history.cells)} cell(s) followed"]
    lines += [f"skipped {n.name}: {n.skipped}" for n in skipped]
    lines += [f"note: {note}" for note in history.notes]
    regressions = sum(c.direction == "regression" for c in detection.changes)
    lines.append(f"{len(detection.changes)} change(s) found ({regressions} for the worse):")
    lines += [f"  {describe(c)}" for c in detection.changes]
    return lines


def history(args: argparse.Namespace) -> int:
    tol = args.tolerance
    if not (tol >= 0 and tol < float("inf")):
        raise KvbenchError(f"--tolerance must be a non-negative number, got {tol}")
    if args.json is not None:
        output_file(args.json, "--json")  # refused before anything is read or written
    root: Path = args.dir  # read_nights refuses a path that is not a folder of nights
    from ...reports.history.cache import CACHE_FILE, cache_bytes, load_cache
    from ...reports.history.changes import detect
    from ...reports.history.nights import read_nights
    from ...reports.history.output import PAGE_FOLDER, write_json, write_page
    from ...reports.history.page import render
    from ...reports.history.series import build_history
    from ...reports.report_files import check_replaceable

    check_replaceable(root / PAGE_FOLDER)  # before reading its cache: a folder kvbench wrote, as it wrote it
    say = (lambda _: None) if args.quiet else (lambda msg: print(f"kvbench history: {msg}", file=sys.stderr))
    nights = read_nights(root, say, load_cache(root / PAGE_FOLDER))
    built = build_history(nights)
    if built.cells.empty:
        raise KvbenchError(
            f"{root}: no cell ran on two of its {len(nights.read)} nights: nothing to follow across nights"
        )
    say(f"finding changes in {len(built.points)} values of {len(built.cells)} cell(s)")
    detection = detect(built, tol)
    say("drawing the page")
    files = {**render(built, detection), CACHE_FILE: cache_bytes(nights)}
    page = write_page(root, files)
    if args.json is not None:
        write_json(args.json, detection)
    if not args.quiet:
        print("\n".join(summary(built, detection)))
    print(page)
    if args.gate:
        if detection.regressed:
            worst = "; ".join(describe_regressed(r) for r in detection.regressed)
            print(
                f"kvbench history: {detection.latest_night} regressed against {detection.reference_night} "
                f"in {len(detection.regressed)} series: {worst}",
                file=sys.stderr,
            )
            return 1
        if detection.latest_night == detection.reference_night:
            said = (
                f"{detection.latest_night} is the reference night (the first, or the last accepted): nothing to judge"
            )
        else:
            said = (
                f"{detection.latest_night} is not worse than {detection.reference_night} beyond {tol:g} "
                "in any followed series"
            )
        print(f"kvbench history: gate passed: {said}", file=sys.stderr)
    return 0


COMMAND = Command(
    "history",
    help="every night of a nightly results directory on one page; the changes found; --gate",
    description="Read every night under DIR (as .ci/nightly writes them), match their cells as `kvbench "
    "compare` does, find where each metric changed (deterministic metrics exactly; timed ones by "
    "penalised step and drift fitting against their noise) and write DIR/history/index.html with one "
    "graph per metric. --json FILE writes the changes; --gate exits 1 when the latest night regressed "
    "against the last accepted one.",
    configure=configure,
    run=history,
)
