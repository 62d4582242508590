"""Running a suite's cells: workloads built once, cells skipped when already on disk (and
recorded by the same code), failures isolated as rows, progress on stderr, local processes or Ray.

A cell that fails is a row; a fault of the environment (``StorageError``: the disk
full, the directory unwritable or gone) or an interrupt is not, because it says
nothing about the cell: it stops the sweep, with no row for the cell in flight, so
the same command run again later runs that cell.
"""

from __future__ import annotations

import dataclasses
import signal
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import TYPE_CHECKING

from ..harness.errors import KvbenchError
from ..harness.records.statuses import FAILURES
from ..harness.spec.units import format_bytes
from ..runners.base import Cell
from .cell import run_cell
from .resume import Resume, keep_workload, plan_resume
from .signals import raise_pending
from .suite import Suite

if TYPE_CHECKING:
    from ..harness.spec.specs import RunSpec
    from ..workloads.table import Workload


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A suite's cells with their workloads built in memory: everything validated, nothing written."""

    suite: Suite
    cells: list[Cell]
    workload_names: dict[str, str]  # the suite's workload name → its workload id (sim cells)


def prepare_cells(suite: Suite, out: Path, log: Callable[[str], None]) -> Prepared:
    """Expand the grid, validate every spec, build each distinct workload once, in memory, and
    plan each run once (cells that differ only in settings their run does not read are one run):
    a suite that is refused is refused here, before anything is written. Every key the suite
    states must be read by a cell it is given to (``app.key_use``)."""
    from ..workloads.reads import build_noting_reads
    from .key_use import KeyUse

    built: dict[tuple[str, int], tuple[Workload, frozenset[str]]] = {}
    cells: list[Cell] = []
    planned: set[str] = set()
    names: dict[str, str] = {}
    use = KeyUse()
    for spec, name, given in suite.planned():
        key = (spec.workload.to_json(), spec.memory.max_model_len)
        if key not in built:
            try:
                w, read = build_noting_reads(spec.workload, spec.memory.max_model_len)
            except KvbenchError as exc:
                msg = str(exc)
                raise KvbenchError(msg if msg.startswith(suite.path) else f"{suite.path}: {msg}") from None
            tag = f"{name} ({w.workload_id[:8]})" if suite.named_workloads else w.workload_id[:8]
            if w.dropped:
                log(
                    f"workload {tag}: dropped {w.dropped} request(s) longer than "
                    f"max_model_len {spec.memory.max_model_len}"
                )
            if w.raised:
                log(
                    f"workload {tag}: raised {w.raised} sampled prompt(s) to prefix_len + 1 = "
                    f"{spec.workload.prefix_len + 1} tokens (each request computes a token of its own)"
                )
            built[key] = (w, read)
        workload, read = built[key]
        use.note(spec, given, read)
        cell = Cell(spec=spec, workload=workload, out=out, workload_name=name if suite.named_workloads else None)
        if cell.run_id in planned:
            continue
        planned.add(cell.run_id)
        check_hash_blocks(spec, workload, suite.path)
        check_slo_clock(spec, suite)
        cells.append(cell)
        if spec.runner == "sim":
            names.setdefault(name, workload.workload_id)
    use.check(suite.path)
    check_attached_cells(cells, suite.path)
    return Prepared(suite, cells, names)


def check_attached_cells(cells: list[Cell], where: str) -> None:
    """Refuse two policies (or block sizes) measured against one running server: kvbench cannot
    choose the allocator of a server it did not start, so the serve cells attached to one URL
    name one policy and one block size, the server's own (``runners.serve``, attach mode)."""
    kinds: dict[str, set[tuple[str, int]]] = {}
    for cell in cells:
        url = getattr(cell.spec, "serve_url", None)
        if cell.spec.runner == "serve" and url:
            kinds.setdefault(str(url).rstrip("/"), set()).add((cell.spec.policy, cell.spec.block_size))
    for url, found in kinds.items():
        if len(found) > 1:
            named = ", ".join(f"{p} (block size {b})" for p, b in sorted(found))
            raise KvbenchError(
                f"{where}: [runners.serve] url {url}: {len(found)} policies against one server kvbench did not "
                f"start ({named}); it cannot choose that server's allocator, so an attached cell is what the "
                f"server runs: name its one policy and block size in [runners.serve]"
            )


def check_hash_blocks(spec: RunSpec, workload: Workload, where: str) -> None:
    """Refuse prefix caching over a hash-id trace whose hash blocks are not whole cache blocks:
    the trace says which of its blocks are shared, and a cache block straddling two of them
    would be shared only where both are, which is not what the trace describes."""
    if spec.policy != "paged-prefix" or workload.hash_ids is None:
        return
    hbs, bs = spec.workload.hash_block_size, spec.block_size
    if hbs % bs:
        raise KvbenchError(
            f"{where}: hash_block_size {hbs} is not a multiple of block_size {bs}: paged-prefix on a hash-id "
            f"trace needs each hash block to be whole cache blocks"
        )


def check_slo_clock(spec: RunSpec, suite: Suite) -> None:
    """Refuse an [slo] over cells on the steps clock: its bounds are seconds, and there a time is a
    count of scheduler steps (max_s = 2.0 would silently mean 2 steps)."""
    if suite.slo is not None and spec.scheduler.clock == "steps":
        raise KvbenchError(
            f"{suite.path}: [slo] bounds latency in seconds, but runner {spec.runner}'s cells run on the steps "
            'clock, where a time is a count of scheduler steps: give them a clock of seconds (clock = "roofline", '
            '"profile" or "measured")'
        )


def keep_inputs(prepared: Prepared, out: Path) -> None:
    """Write what the cells run on beside their records: each workload once (DIR/workloads),
    and the suite's published reference values and SLO."""
    suite = prepared.suite
    for workload in {c.workload.workload_id: c.workload for c in prepared.cells}.values():
        keep_workload(workload, out)
    if suite.reference:
        from ..harness.records.reference import write_references

        write_references(out, suite.name, [dict(r) for r in suite.reference], prepared.workload_names)
    if suite.slo is not None:
        from ..harness.records.slo import write_slo

        write_slo(out, suite.name, suite.slo)


def build_cells(suite: Suite, out: Path, log: Callable[[str], None]) -> list[Cell]:
    """``prepare_cells`` then ``keep_inputs``: the cells, with their inputs written to ``out``."""
    prepared = prepare_cells(suite, out, log)
    keep_inputs(prepared, out)
    return prepared.cells


class Progress:
    """Cells done / failed / remaining with an ETA, on one live line (or a line each off a TTY)."""

    def __init__(self, total: int, quiet: bool) -> None:
        self.total, self.quiet = total, quiet
        self.done = self.failed = 0
        self.t0 = time.monotonic()
        self.live = sys.stderr.isatty()

    def update(self, row: dict[str, object], label: str) -> None:
        self.done += 1
        if row.get("status") in FAILURES:
            self.failed += 1
        if self.quiet:
            return
        elapsed = time.monotonic() - self.t0
        eta = elapsed / self.done * (self.total - self.done)
        line = (
            f"[{self.done}/{self.total}] failed {self.failed}  remaining {self.total - self.done}  "
            f"eta {eta:.0f}s  | {label}: {row.get('status')} in {row.get('wall_s') or 0:.2f}s"
        )
        if self.live:
            sys.stderr.write("\r\033[K" + line)
            if self.done == self.total:
                sys.stderr.write("\n")
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()


def label(cell: Cell) -> str:
    """'sim paged bs=16 opt-13b fp16 sharegpt' ('… cpu=16.0 GiB/lru' with a CPU tier): what a
    progress line names."""
    spec = cell.spec
    bs = "" if spec.block_size == 1 else f" bs={spec.block_size}"
    workload = f" {cell.workload_name}" if cell.workload_name else ""
    memory = spec.memory
    tier = f" cpu={format_bytes(memory.cpu_offload_bytes)}/{memory.offload_policy}" if memory.cpu_offload_bytes else ""
    return f"{spec.runner} {spec.policy}{bs} {spec.model.preset or 'config'} {spec.model.kv_dtype}{tier}{workload}"


def run_cells(
    cells: Iterable[Cell],
    jobs: int = 1,
    quiet: bool = False,
    executor: str = "local",
    address: str | None = None,
    check: Callable[[], None] | None = None,
) -> list[dict[str, object]]:
    """Run the cells and return their rows. ``check`` (when given) runs before each cell
    starts and after each one ends; whatever it raises stops the sweep, as an interrupt does."""
    cells = list(cells)
    given = check

    def check_now() -> None:
        raise_pending()  # an interrupt swallowed by a finalizer still stops the sweep here
        if given is not None:
            given()

    progress = Progress(len(cells), quiet)
    rows: list[dict[str, object]] = []
    if executor == "ray":
        from .ray_executor import run_on_ray

        check_now()
        for cell, row in run_on_ray(cells, address):
            rows.append(row)
            progress.update(row, label(cell))
            check_now()
        return rows
    if jobs <= 1:
        if not quiet:
            cells = [dataclasses.replace(c, progress=True) for c in cells]
        for cell in cells:
            check_now()
            row = run_cell(cell)
            rows.append(row)
            progress.update(row, label(cell))
        check_now()
        return rows
    check_now()
    pool = ProcessPoolExecutor(max_workers=jobs, initializer=_worker_signals)
    try:
        futures = {pool.submit(run_cell, cell): cell for cell in cells}
        for fut in as_completed(futures):
            row = fut.result()
            rows.append(row)
            progress.update(row, label(futures[fut]))
            check_now()
    except BaseException:
        _stop(pool)
        raise
    pool.shutdown()
    return rows


def _worker_signals() -> None:
    """In a worker process: the parent decides what an interrupt means. Ctrl-C reaches the
    whole process group; the parent stops the workers itself (``_stop``). And a worker must
    not outlive its parent (killed by SIGKILL or the OOM killer): it would keep writing the
    directory after the lock is gone, then wait forever for work, so on Linux it asks the
    kernel for SIGTERM when the parent dies."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        import ctypes
        import os

        parent = os.getppid()
        pr_set_pdeathsig = 1  # <linux/prctl.h>
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGTERM))
        if os.getppid() != parent:  # the parent died before the request: too late to be told
            os._exit(1)


def _stop(pool: ProcessPoolExecutor) -> None:
    """Abandon a sweep: drop the cells not started, end the ones in flight, wait for the workers.

    Waiting for the cells in flight could take hours, so the workers are terminated; what they
    leave (a temporary partition, steps without a run row) is removed by the caller's
    ``store.clean_stale_temps`` once they are gone. ``_processes`` is private, but stable since
    Python 3.2, and the only way before 3.14's ``terminate_workers`` to reach the workers."""
    processes = list(getattr(pool, "_processes", {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in processes:
        try:
            proc.terminate()
        except (OSError, ValueError):
            pass  # already gone
    for proc in processes:
        proc.join(timeout=30)


@dataclasses.dataclass(frozen=True)
class SweepOptions:
    """How ``kvbench run`` runs a sweep (its command-line options)."""

    jobs: int = 1
    quiet: bool = False
    executor: str = "local"
    address: str | None = None
    rerun: bool = False
    keep_stale: bool = False


@dataclasses.dataclass
class SweepState:
    """How far a sweep got: the end of the one line an interrupted or faulted run prints."""

    cells: list[Cell] = dataclasses.field(default_factory=list)
    stage: str = "before any cell ran"


def plan_sweep(prepared: Prepared, out: Path, options: SweepOptions, log: Callable[[str], None]) -> Resume:
    """Which cells to run (``plan_resume``), with the suite's inputs written to ``out`` and the
    reasons for running or keeping recorded cells said on stderr."""
    plan = plan_resume(prepared.cells, out, rerun=options.rerun, keep_stale=options.keep_stale)
    keep_inputs(prepared, out)
    if plan.incomplete:
        rid, why = next(iter(plan.incomplete.items()))
        print(
            f"{len(plan.incomplete)} cell(s) in {out} have incomplete records (run {rid}: {why}); running them again",
            file=sys.stderr,
        )
    # Not progress: these say what the results will mean, so they are printed even with --quiet.
    if plan.stale_rerun:
        print(
            f"{plan.stale_rerun} cell(s) in {out} were recorded by other kvbench code; running them "
            f"again (--keep-stale keeps them)",
            file=sys.stderr,
        )
    if plan.stale_kept:
        print(
            f"keeping {plan.stale_kept} cell(s) in {out} recorded by other kvbench code (--keep-stale); "
            f"the report says which runs come from which code",
            file=sys.stderr,
        )
    return plan


def run_sweep(
    prepared: Prepared,
    plan: Resume,
    out: Path,
    options: SweepOptions,
    check: Callable[[], None],
    log: Callable[[str], None],
    state: SweepState,
) -> list[dict[str, object]]:
    """Run the planned cells, then refine the capacities when the suite asks (``[slo] refine``);
    the rows of the planned cells. ``state`` follows the stages for the caller's error line."""
    cells, todo = prepared.cells, plan.todo
    state.cells = cells
    if len(todo) < len(cells):
        log(f"{len(cells) - len(todo)} of {len(cells)} cells already in {out}; skipping them (--rerun to force)")
    log(f"suite {prepared.suite.name}: running {len(todo)} cell(s) into {out}")
    jobs = options.jobs
    if options.executor == "local" and jobs > max(1, len(todo)):
        jobs = max(1, len(todo))
        log(f"--jobs {options.jobs}: {len(todo)} cell(s) to run, so {jobs} worker process(es)")

    def run(some: list[Cell], jobs: int) -> list[dict[str, object]]:
        return run_cells(
            some, jobs=jobs, quiet=options.quiet, executor=options.executor, address=options.address, check=check
        )

    rows = run(todo, jobs)
    suite = prepared.suite
    if suite.slo is not None and suite.slo.refine:
        from .capacity_search import refine

        state.stage = "refining the capacities"
        refine(suite, out, cells, lambda more: run(more, options.jobs), log)
    return rows
