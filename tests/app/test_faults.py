"""Faults and data safety, through the real CLI in subprocesses where it has one: what kvbench does
when its environment fails it (a full disk, an output it may not write, a read-only filesystem, a
signal mid-sweep, SIGKILL of the parent alone, its results directory removed, a second writer),
what it promises about the user's data at all times (it replaces only files it wrote, removes only
what its records say it wrote, follows no link planted at a temporary name, counts a run complete
only when its records are whole), and that the numbers it records and exports are the ones the
field's own tools give (issue #45's reproductions that are not bad input). Every one-line refusal
of a bad input, an incomplete results directory read included, is a row of ``test_bad_input.py``.

After a fault, kvbench must give one line on stderr naming the path and the cause, a non-zero
exit, no temporary file left, every completed run whole and readable, nothing that looks whole but
is not (``assert_whole``), and then, once the cause is gone, the same command must complete the
rest with records identical to an uninterrupted run's (``assert_same_records``).

The served runs here are the serve runner's attach mode against a stand-in server over real HTTP
(``tests/streamkit.py``, the ``served`` fixture), which streams chunks of several tokens on cue, as
vLLM's server does when its client falls behind."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from kvbench.app.suite import parse_suite
from kvbench.harness.errors import KvbenchError
from kvbench.harness.records import store
from kvbench.harness.records.atomic import replace_file
from kvbench.harness.records.goodput import judged_values, with_goodput
from kvbench.harness.records.lock import LOCK_NAME
from kvbench.harness.records.percentiles import percentile
from kvbench.harness.records.slo import parse_slo, slo_frame, write_slo
from kvbench.harness.records.slo_presets import PRESETS
from kvbench.harness.sim.latency import itl_summary
from kvbench.harness.sim.sequence import FINISHED, Seq
from kvbench.runners.serve.client import SampleResult
from kvbench.runners.serve.runner import _apply_client
from kvbench.workloads.traces import MAX_TRACE_S, read_trace

from tests.conftest import (
    DATA,
    ROOT,
    SERVED_CACHE_CONFIG,
    SMALL,
    assert_one_line_error,
    copy_of,
    import_holding_infinity,
    interactive_signals,
    kvbench,
    run_attached,
    serve_suite,
    suite_file,
    suite_toml,
    tree,
)
from tests.faultkit import DAMAGE, damage_run, kvbench_failing_at, read_log, tmpfs, tmpfs_unavailable

CELLS = 4  # the small suite's
# 3 cells of about a second each on two cores: long enough to signal one mid-flight (the
# roofline's efficiency factors made steps longer, so fewer steps: 1,500 requests got too quick).
SLOW = suite_toml(
    "slow",
    model={"preset": "llama-3-8b"},
    memory={"kv_budget": "1GiB", "max_model_len": 4096},
    workload={"source": "sharegpt", "num_requests": 5000, "arrival": "poisson", "rate": 4.0},
    scheduler={"clock": "roofline"},
    grid={"policy": ["contiguous-max", "contiguous-oracle", "paged"]},
)
SLOW_CELLS = 3
TOP_LEVEL = {LOCK_NAME, "kvbench.log", "runs", "steps", "requests", "workloads", "report", "reference.parquet"}
PNG_END = b"IEND\xaeB`\x82"
# Run columns that do not depend on the machine's speed or the moment: equal run for run.
STABLE = [
    "run_id",
    "status",
    "error",
    "policy",
    "block_size",
    "steps",
    "preemptions",
    "peak_running",
    "mean_running",
    "token_states_frac",
    "reservation_frac",
    "internal_frag_frac",
    "external_frag_frac",
    "workload_id",
    "num_requests",
    "tokens_per_s",
    "sim_time_s",
]
NO_TMPFS = tmpfs_unavailable()
DETAILED = DATA / "vllm_bench_serve_detailed.json"


# -- invariants --------------------------------------------------------------------------


def assert_whole(out: Path) -> set[str]:
    """Only whole things in ``out``: no temporary file, every run's three partitions readable and
    consistent, no partition without its run, whole workload files, a whole report or none.
    Returns the ids of the complete runs."""
    leftovers = [p for p in out.rglob("*") if p.name.startswith((".tmp-", ".report.tmp")) or p.name.endswith(".tmp")]
    assert not leftovers, leftovers
    assert {p.name for p in out.iterdir()} <= TOP_LEVEL, sorted(p.name for p in out.iterdir())
    ids = store.existing_run_ids(out)
    for table in ("runs", "steps", "requests"):
        d = out / table
        parts = sorted(d.iterdir()) if d.is_dir() else []
        assert {p.name.split("=", 1)[1] for p in parts} == ids, (table, parts)  # no orphan, none missing
        for p in parts:
            assert [f.name for f in p.iterdir()] == [store.PART], p
    if ids:
        runs = store.read_table(out, "runs")  # refuses a truncated or foreign file by name
        steps = store.read_table(out, "steps")
        requests = store.read_table(out, "requests")
        assert runs.run_id.is_unique and set(runs.run_id) == ids
        for r in runs.itertuples():
            assert (steps.run_id == r.run_id).sum() == r.steps, r.run_id
            assert (requests.run_id == r.run_id).sum() == r.num_requests, r.run_id
    for w in (out / "workloads").glob("*") if (out / "workloads").is_dir() else ():
        from kvbench.workloads import read_workload

        read_workload(w)  # checks content against its id
    report = out / "report"
    if report.exists():
        names = {p.name for p in report.iterdir()}
        assert {"index.html", "summary.md"} <= names, names
        page = (report / "index.html").read_text()
        assert page.rstrip().endswith("</html>")
        for png in report.glob("*.png"):
            assert png.read_bytes().endswith(PNG_END), png
            assert f'href="{png.name}"' in page
    return ids


def records(out: Path) -> dict[str, pd.DataFrame]:
    runs = store.read_table(out, "runs")[STABLE].sort_values("run_id").reset_index(drop=True)
    steps = store.read_table(out, "steps").sort_values(["run_id", "step"]).reset_index(drop=True)
    reqs = store.read_table(out, "requests").sort_values(["run_id", "request_id", "sample"]).reset_index(drop=True)
    return {"runs": runs, "steps": steps, "requests": reqs}


def assert_same_records(out: Path, reference: Path) -> None:
    """Resume exact: the same runs, steps and requests as one uninterrupted run."""
    got, want = records(out), records(reference)
    for table in want:
        pd.testing.assert_frame_equal(got[table], want[table], check_like=True, obj=table)
    assert sorted(p.name for p in (out / "workloads").iterdir()) == sorted(
        p.name for p in (reference / "workloads").iterdir()
    )


def complete_in_line(line: str, total: int) -> int:
    """The 'k of N cell(s) complete' count of a fault line (N checked); 0 when it stopped while
    writing the workloads, before the cells existed."""
    assert "run the same command to" in line, line
    if "stopped before any cell ran" in line:
        return 0
    m = re.search(r"(\d+) of (\d+) cell\(s\) complete in ", line)
    assert m, line
    assert int(m.group(2)) == total, line
    return int(m.group(1))


def the_line(proc: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    return lines[0]


# -- fixtures ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def suites(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("suites")
    paths = {"small": d / "small.toml", "slow": d / "slow.toml"}
    paths["small"].write_text(SMALL)
    paths["slow"].write_text(SLOW)
    return paths


@pytest.fixture(scope="module")
def reference(suites: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each suite run once, uninterrupted, by the same command the tests use."""
    refs = {}
    for name, suite in suites.items():
        out = tmp_path_factory.mktemp(f"ref-{name}") / "out"
        proc = kvbench("run", str(suite), "--out", str(out), "--quiet", "--no-report")
        assert proc.returncode == 0, proc.stderr
        refs[name] = out
    return refs


@pytest.fixture(scope="module")
def write_log(suites: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> list[tuple[int, str, str]]:
    """Every write of an uninterrupted run of the small suite's records, in order (the report's
    writes come next)."""
    d = tmp_path_factory.mktemp("count")
    proc = kvbench_failing_at(
        0, d / "log", "run", str(suites["small"]), "--out", str(d / "out"), "--quiet", "--no-report"
    )
    assert proc.returncode == 0, proc.stderr
    return read_log(d / "log")


# -- a full disk: the runs whose writes landed stay whole, the same command does the rest -----------


def _nth(log: list[tuple[int, str, str]], what: str, where: str, k: int = 0) -> int:
    hits = [n for n, w, path in log if w == what and f"/{where}/" in path]
    return hits[k]


NTH = {
    # case: (which write fails, given the log; whether the report is asked for)
    "workload file": (lambda log: _nth(log, "parquet-open", "workloads"), False),
    "first steps batch": (lambda log: _nth(log, "parquet-write", "steps"), False),
    "closing the first run row": (lambda log: _nth(log, "parquet-close", "runs"), False),
    "second run's requests": (lambda log: _nth(log, "parquet-write", "requests", 1), False),
    "first report figure": (lambda log: len(log) + 1, True),
}


@pytest.mark.parametrize("case", list(NTH))
def test_disk_full_at_the_nth_write_then_resume(
    case: str,
    suites: dict[str, Path],
    reference: dict[str, Path],
    write_log: list[tuple[int, str, str]],
    tmp_path: Path,
) -> None:
    # A writer that fails on the Nth write: runs everywhere.
    pick, report = NTH[case]
    fail_at = pick(write_log)
    out = tmp_path / "out"
    args = ["run", str(suites["small"]), "--out", str(out), "--quiet", *([] if report else ["--no-report"])]
    proc = kvbench_failing_at(fail_at, tmp_path / "log", *args)
    line = the_line(proc)
    assert proc.returncode == 74, line
    assert "No space left on device" in line and str(out) in line, line
    runs_before = sum(1 for n, w, p in write_log if n < fail_at and w == "parquet-close" and "/runs/" in p)
    ids = assert_whole(out)
    assert len(ids) == runs_before  # every run whose writes all landed is there, no other
    if report:
        assert f"all {CELLS} cell(s) are recorded" in line and "kvbench report" in line
        assert not (out / "report").exists()
    else:
        assert complete_in_line(line, CELLS) == runs_before
    # The disk has room again: the same command completes the rest, exactly.
    again = kvbench(*args)
    assert again.returncode == 0, again.stderr
    assert len(assert_whole(out)) == CELLS
    assert_same_records(out, reference["small"])
    if report:
        assert (out / "report" / "index.html").is_file()


def test_a_write_that_fails_once_stops_the_sweep_and_is_not_a_failed_row(
    suites: dict[str, Path], reference: dict[str, Path], write_log: list[tuple[int, str, str]], tmp_path: Path
) -> None:
    # The second run's steps cannot be written, but the disk has room again a moment later. The
    # cell must not be recorded as 'failed' (a rerun would skip it, and the failure says nothing
    # about the cell): the sweep stops there, and the same command runs it.
    fail_at = _nth(write_log, "parquet-write", "steps", 1)
    out = tmp_path / "out"
    args = ["run", str(suites["small"]), "--out", str(out), "--quiet", "--no-report"]
    proc = kvbench_failing_at(fail_at, tmp_path / "log", *args, once=True)
    line = the_line(proc)
    assert proc.returncode == 74 and "No space left on device" in line, line
    assert complete_in_line(line, CELLS) == len(assert_whole(out)) == 1
    assert set(store.read_table(out, "runs").status) == {"ok"}
    assert kvbench(*args).returncode == 0
    assert_same_records(out, reference["small"])


@pytest.fixture(scope="module")
def sizes(suites: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:
    """Bytes a tmpfs holds after the small suite's records, and after its report too."""
    if NO_TMPFS:
        pytest.skip(NO_TMPFS)
    with tmpfs(tmp_path_factory.mktemp("measure") / "fs", 64 * 2**20) as fs:
        out = fs.path / "out"
        assert kvbench("run", str(suites["small"]), "--out", str(out), "--quiet", "--no-report").returncode == 0
        records_bytes = fs.used_bytes()
        assert kvbench("report", str(out)).returncode == 0
        return {"records": records_bytes, "all": fs.used_bytes()}


@pytest.mark.skipif(bool(NO_TMPFS), reason=f"no tmpfs here ({NO_TMPFS}); the Nth-write tests stand in")
@pytest.mark.parametrize("room", [0.0, 0.3, 0.6, 0.9, "report"])
def test_disk_full_on_a_real_tmpfs_then_resume(
    room: float | str, suites: dict[str, Path], reference: dict[str, Path], sizes: dict[str, int], tmp_path: Path
) -> None:
    report = room == "report"
    size = (sizes["records"] + (sizes["all"] - sizes["records"]) // 2) if report else int(room * sizes["records"])
    args = ["run", str(suites["small"]), "--out"]
    with tmpfs(tmp_path / "fs", size) as fs:
        out = fs.path / "out"
        args += [str(out), "--quiet", *([] if report else ["--no-report"])]
        proc = kvbench(*args)
        line = the_line(proc)
        assert proc.returncode == 74, line
        assert "No space left on device" in line and str(out) in line, line
        ids = assert_whole(out)
        if report:
            assert len(ids) == CELLS and f"all {CELLS} cell(s) are recorded" in line
        else:
            assert complete_in_line(line, CELLS) == len(ids) < CELLS
        if room == 0.0:
            assert "workloads/" in line  # the first thing written
        fs.resize(64 * 2**20)
        again = kvbench(*args)
        assert again.returncode == 0, again.stderr
        assert len(assert_whole(out)) == CELLS
        assert_same_records(out, reference["small"])


@pytest.mark.skipif(bool(NO_TMPFS), reason=f"no tmpfs here ({NO_TMPFS})")
def test_read_only_filesystem_keeps_completed_runs_then_resume(
    suites: dict[str, Path], reference: dict[str, Path], tmp_path: Path
) -> None:
    half = tmp_path / "half.toml"  # the same cells' first half: same run ids (the suite name is not in them)
    half.write_text(
        SMALL.replace(
            '"contiguous-max", "contiguous-pow2", "contiguous-oracle", "paged"', '"contiguous-max", "contiguous-pow2"'
        )
    )
    with tmpfs(tmp_path / "fs", 16 * 2**20) as fs:
        out = fs.path / "out"
        assert kvbench("run", str(half), "--out", str(out), "--quiet", "--no-report").returncode == 0
        fs.read_only(True)
        args = ["run", str(suites["small"]), "--out", str(out), "--quiet", "--no-report"]
        proc = kvbench(*args)
        line = the_line(proc)
        assert proc.returncode == 74 and "Read-only file system" in line and str(out) in line, line
        assert len(assert_whole(out)) == 2
        fs.read_only(False)
        assert kvbench(*args).returncode == 0
        assert len(assert_whole(out)) == CELLS
        assert_same_records(out, reference["small"])


# -- an output that cannot be created or written ------------------------------------------------


def _as_nobody() -> list[str] | None:
    """A command prefix that runs as an unprivileged user, or None when this machine cannot."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        return None
    prefix = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
    probe = subprocess.run(
        [*prefix, sys.executable, "-c", "import kvbench.app.cli, pyarrow"],
        capture_output=True,
        cwd=ROOT,
        env=dict(os.environ),
    )
    return prefix if probe.returncode == 0 else None


NOBODY = _as_nobody()


@pytest.mark.skipif(
    NOBODY is None,
    reason="needs root, setpriv and a Python the user 'nobody' can run, "
    "to drop to an unprivileged user (root ignores permissions)",
)
def test_unwritable_output_as_an_unprivileged_user() -> None:
    assert NOBODY is not None
    # Not under pytest's tmp_path: its parents are private to root, and 'nobody' must reach the suite.
    base = Path(tempfile.mkdtemp(prefix="kvbench-perm-"))
    try:
        os.chmod(base, 0o755)  # root's: nobody can read it, not write it
        suite = base / "small.toml"
        suite.write_text(SMALL)
        done = base / "done"
        assert kvbench("run", str(suite), "--out", str(done), "--quiet", "--no-report").returncode == 0
        before = {p: p.read_bytes() for p in done.rglob("*") if p.is_file()}
        (base / "empty").mkdir()
        env = dict(os.environ)
        for out in (base / "new", base / "empty", done, base / "new" / "deeper"):
            proc = subprocess.run(
                [*NOBODY, sys.executable, "-m", "kvbench.app.cli", "run", str(suite), "--out", str(out), "--quiet"],
                capture_output=True,
                text=True,
                cwd=ROOT,
                env=env,
            )
            assert_one_line_error(proc, str(out), "Permission denied")
            assert proc.returncode == 74
        assert not (base / "new").exists() and not any((base / "empty").iterdir())
        assert {p: p.read_bytes() for p in done.rglob("*") if p.is_file()} == before  # untouched
    finally:
        shutil.rmtree(base)


# -- signals: one line, a clean stop, and the same command does the rest ---------------------------


def _handles_sigterm(pid: int) -> bool:
    """Whether the process has entered kvbench's main (it catches SIGTERM from then on)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = int(next(line.split()[1] for line in text.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(caught & (1 << (signal.SIGTERM - 1)))


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc to see when main has started")
@pytest.mark.parametrize("command", ["run", "report"])
@pytest.mark.parametrize("delay", [0.0, 0.05, 0.2, 0.5])
def test_ctrl_c_at_any_moment_is_one_line_and_exit_130(
    recorded: tuple[Path, Path], tmp_path: Path, command: str, delay: float
) -> None:
    suite, out = copy_of(recorded, tmp_path)
    args = ["run", suite, "--out", tmp_path / "fresh", "--quiet"] if command == "run" else ["report", out]
    env = dict(os.environ)
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvbench.app.cli", *map(str, args)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=interactive_signals,
    )
    deadline = time.monotonic() + 30
    while not _handles_sigterm(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    if proc.returncode == 0:
        pytest.skip("finished before the interrupt arrived")
    assert proc.returncode == 130, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "interrupted by SIGINT" in lines[0] and "Traceback" not in err, err
    assert not [p for p in tmp_path.rglob(".*tmp*")], "a temporary file was left"


def test_an_interrupt_inside_an_extensions_import_is_the_interrupt(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C while the parser imports the commands can land inside numpy's import, which then fails
    with an ImportError raised while handling the interrupt (a run of the test above saw it): still
    one line and exit 130. An ImportError of its own is not taken for one."""
    from kvbench.app import cli
    from kvbench.harness.errors import Interrupted

    def interrupted_import(name: str, package: str | None = None) -> object:
        try:
            raise Interrupted(signal.SIGINT)
        except Interrupted:
            raise ImportError("numpy._core.multiarray failed to import") from None

    def broken_import(name: str, package: str | None = None) -> object:
        raise ImportError("no module named numpy")

    monkeypatch.setattr(cli.importlib, "import_module", interrupted_import)
    assert cli.main(["run"]) == 130
    err = capsys.readouterr().err
    assert err.splitlines() == ["kvbench: interrupted by SIGINT"], err
    monkeypatch.setattr(cli.importlib, "import_module", broken_import)
    with pytest.raises(ImportError, match="no module named numpy"):
        cli.main(["run"])


def test_an_interrupt_a_finalizer_drops_is_kept_and_not_printed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A signal landing in a finalizer (a weakref callback of the import system, a ``__del__``): Python
    drops the exception; kvbench keeps it for the next cell boundary and hands it to no printer. Other
    dropped exceptions reach the hook that was there before (Python's own prints them)."""
    import gc

    from kvbench.app import signals
    from kvbench.harness.errors import Interrupted

    seen: list[BaseException | None] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u.exc_value))

    class SignalInFinalizer:
        def __del__(self) -> None:
            signals._raise_interrupted(signal.SIGINT, None)  # what the handler does when SIGINT lands here

    class FaultInFinalizer:
        def __del__(self) -> None:
            raise ValueError("a finalizer's own fault")

    with signals.sigterm_as_interrupt():
        SignalInFinalizer()
        gc.collect()
        assert seen == []
        with pytest.raises(Interrupted):
            signals.raise_pending()
        signals.raise_pending()  # raised once: a later sweep in this process starts without it
        FaultInFinalizer()
        gc.collect()
    assert [type(e) for e in seen] == [ValueError]


def _start(suite: Path, out: Path, *extra: str) -> subprocess.Popen:
    env = dict(os.environ)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvbench.app.cli",
            "run",
            str(suite),
            "--out",
            str(out),
            "--quiet",
            "--no-report",
            *extra,
        ],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=interactive_signals,
    )


def _wait_for_runs(proc: subprocess.Popen, out: Path, n: int) -> None:
    deadline = time.monotonic() + 120
    while len(store.existing_run_ids(out)) < n:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < deadline
        time.sleep(0.01)


@pytest.mark.parametrize(
    "sig,jobs,group",
    [(signal.SIGTERM, 1, False), (signal.SIGTERM, 2, False), (signal.SIGINT, 2, True)],
    ids=["sigterm", "sigterm-jobs2", "ctrl-c-jobs2"],
)
def test_signal_mid_sweep_stops_cleanly_then_resume(
    sig: signal.Signals, jobs: int, group: bool, suites: dict[str, Path], reference: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    proc = _start(suites["slow"], out, "--jobs", str(jobs))
    _wait_for_runs(proc, out, 1)
    # A scheduler signals the process; Ctrl-C signals its whole process group (the workers too).
    os.killpg(proc.pid, sig) if group else proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, err
    line = the_line(subprocess.CompletedProcess(proc.args, proc.returncode, "", err))
    name = signal.Signals(sig).name
    assert line.startswith(f"kvbench run: interrupted by {name}: ") and "run the same command to resume" in line
    ids = assert_whole(out)
    assert complete_in_line(line, SLOW_CELLS) == len(ids) >= 1
    again = kvbench("run", str(suites["slow"]), "--out", str(out), "--quiet", "--no-report")
    assert again.returncode == 0, again.stderr
    assert len(assert_whole(out)) == SLOW_CELLS
    assert_same_records(out, reference["slow"])


def _session(sid: int) -> list[int]:
    """Pids of the live (not zombie) processes in session ``sid``."""
    pids = []
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_file.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":  # fields after the name: state, ppid, pgrp, session
            pids.append(int(stat_file.parent.name))
    return pids


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigkill_of_the_parent_alone_leaves_no_worker_and_no_lock(
    suites: dict[str, Path], reference: dict[str, Path], tmp_path: Path
) -> None:
    # The OOM killer picks one process: the --jobs workers must not outlive it, writing on
    # without the lock (and then waiting forever for work), and the next run must not be refused.
    out = tmp_path / "out"
    proc = _start(suites["slow"], out, "--jobs", "2")
    _wait_for_runs(proc, out, 1)
    assert len(_session(proc.pid)) == 3  # the parent and its two workers
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 20
    try:
        while _session(proc.pid):
            assert time.monotonic() < deadline, f"workers outlived their parent: {_session(proc.pid)}"
            time.sleep(0.05)
    finally:
        for pid in _session(proc.pid):  # this test's own processes, if it failed
            os.kill(pid, signal.SIGKILL)
    again = kvbench("run", str(suites["slow"]), "--out", str(out), "--quiet", "--no-report")
    assert again.returncode == 0, again.stderr
    assert len(assert_whole(out)) == SLOW_CELLS
    assert_same_records(out, reference["slow"])


# -- the results directory removed mid-run, or in use by another writer ----------------------------


def test_results_directory_removed_mid_run(suites: dict[str, Path], reference: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = _start(suites["slow"], out)
    _wait_for_runs(proc, out, 1)
    # rm -rf, made atomic so the test cannot race the writer: out vanishes at once, then goes.
    os.rename(out, tmp_path / "gone")
    shutil.rmtree(tmp_path / "gone")
    _, err = proc.communicate(timeout=60)
    line = the_line(subprocess.CompletedProcess(proc.args, proc.returncode, "", err))
    assert proc.returncode == 74 and f"{out}: the results directory was removed" in line, line
    assert not out.exists()  # not quietly recreated, half empty
    again = kvbench("run", str(suites["slow"]), "--out", str(out), "--quiet", "--no-report")
    assert again.returncode == 0, again.stderr
    assert_same_records(out, reference["slow"])


def test_a_second_run_on_the_same_directory_is_refused(
    suites: dict[str, Path], reference: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    first = _start(suites["slow"], out)
    deadline = time.monotonic() + 60
    while not ((out / LOCK_NAME).is_file() and (out / LOCK_NAME).read_text().startswith(f"{first.pid} ")):
        assert first.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    os.kill(first.pid, signal.SIGSTOP)  # holds the lock, mid-run, for as long as the test needs
    try:
        second = kvbench("run", str(suites["slow"]), "--out", str(out), "--quiet", "--no-report")
        assert_one_line_error(second, str(out), "in use by another kvbench process", f"pid {first.pid}")
        assert second.returncode == 75
        report = kvbench("report", str(out))
        assert_one_line_error(report, str(out), "in use")
    finally:
        os.kill(first.pid, signal.SIGCONT)
    _, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    assert len(assert_whole(out)) == SLOW_CELLS  # each cell once, every file whole
    assert_same_records(out, reference["slow"])
    after = kvbench("run", str(suites["slow"]), "--out", str(out), "--no-report")
    assert after.returncode == 0 and f"{SLOW_CELLS} of {SLOW_CELLS} cells already in" in after.stderr


# -- a run counts only when its records are whole ------------------------------------------------
# (The readers' one-line refusal of an incomplete run: the results-incomplete-* rows of test_bad_input.py.)


@pytest.mark.parametrize("how", DAMAGE)
def test_an_incomplete_run_is_run_again(recorded: tuple[Path, Path], tmp_path: Path, how: str) -> None:
    suite, out = copy_of(recorded, tmp_path)
    base = copy_of(recorded, tmp_path, "base")[1]
    damage_run(out, how)
    proc = kvbench("run", suite, "--out", out, "--no-report")
    assert proc.returncode == 0, proc.stderr
    assert "incomplete records" in proc.stderr and "1 cell(s) run, 3 skipped" in proc.stderr
    assert store.incomplete_runs(out) == {}
    assert kvbench("compare", base, out).returncode == 0


def test_a_run_row_records_its_partitions_row_counts(recorded: tuple[Path, Path]) -> None:
    _, out = recorded
    runs = store.read_table(out, "runs")
    for row in runs.to_dict("records"):
        steps = pq.read_metadata(out / "steps" / f"run_id={row['run_id']}" / store.PART).num_rows
        requests = pq.read_metadata(out / "requests" / f"run_id={row['run_id']}" / store.PART).num_rows
        assert (row["steps_rows"], row["requests_rows"]) == (steps, requests)
        assert steps == row["steps"] and requests == 20


def test_a_results_directory_with_every_run_complete_reads_as_before(recorded: tuple[Path, Path]) -> None:
    _, out = recorded
    assert store.complete_run_ids(out) == store.existing_run_ids(out)
    assert len(pd.read_parquet(out / "runs")) == CELLS


# -- what kvbench replaces or removes: only what it wrote, never through a planted link ----------
# (Its refusals of outputs it will not write, and of results directories it did not write: the
# out-* and results-* rows of test_bad_input.py.)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_workload_make_replaces_a_regular_file_and_leaves_it_readable(tmp_path: Path) -> None:
    target = tmp_path / "w.parquet"
    target.write_bytes(b"old")
    proc = kvbench("workload", "make", "--out", target, "--num-requests", "5", timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert pq.read_table(target).num_rows == 5
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o666 & ~_umask()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.parquet"]  # no temporary file left


def test_a_report_kvbench_wrote_is_replaced(recorded: tuple[Path, Path], tmp_path: Path) -> None:
    # One without its manifest is refused: test_bad_input.py, results-report-without-its-manifest.
    _, out = copy_of(recorded, tmp_path)
    assert (out / "report" / ".kvbench-report.json").is_file()
    proc = kvbench("report", out)
    assert proc.returncode == 0, proc.stderr
    assert (out / "report" / ".kvbench-report.json").is_file()
    assert not [p for p in out.iterdir() if p.name.startswith(".report")]


def test_an_orphan_partition_holding_foreign_files_is_left_alone(recorded: tuple[Path, Path], tmp_path: Path) -> None:
    suite, out = copy_of(recorded, tmp_path)
    orphan = out / "steps" / "run_id=0000000000000000"
    orphan.mkdir()
    (orphan / "notes.txt").write_text("mine")
    kvbench_made = out / "steps" / "run_id=1111111111111111"
    shutil.copytree(sorted((out / "steps").glob("run_id=*"))[1], kvbench_made)
    proc = kvbench("run", suite, "--out", out, "--quiet", "--no-report")
    assert proc.returncode == 0, proc.stderr
    assert (orphan / "notes.txt").read_text() == "mine"
    assert not kvbench_made.exists()  # an orphan as kvbench writes one is cleaned


def test_export_never_follows_a_link_planted_at_a_temporary_name(imported: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "p.txt").write_text("the user's")
    (tmp_path / ".x.json.tmp").symlink_to(other / "p.txt")  # a fixed name a writer might pick
    before = tree(tmp_path)
    proc = kvbench("export", str(imported), "--format", "vllm-bench", "--out", str(tmp_path / "x.json"))
    assert proc.returncode == 0, proc.stderr
    after = tree(tmp_path)
    assert {k: v for k, v in after.items() if k != "x.json"} == before
    assert after["x.json"][0] == "file" and json.loads((tmp_path / "x.json").read_text())["completed"] == 12


def test_a_temporary_file_is_made_exclusively_and_skips_a_planted_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The names mkstemp would draw, made predictable: the first is taken by a link, which must be
    # neither written through nor removed; the next name is used.
    names = iter(["planted", "fresh"])
    monkeypatch.setattr(tempfile, "_get_candidate_names", lambda: names)
    (tmp_path / "secret").write_text("the user's")
    (tmp_path / ".out.json.planted.tmp").symlink_to(tmp_path / "secret")
    with replace_file(tmp_path / "out.json", "--out") as fh:
        fh.write(b"{}")
    assert (tmp_path / "secret").read_text() == "the user's"
    assert os.readlink(tmp_path / ".out.json.planted.tmp") == str(tmp_path / "secret")
    assert (tmp_path / "out.json").read_bytes() == b"{}" and not (tmp_path / ".out.json.fresh.tmp").exists()


def test_the_store_never_follows_a_link_at_a_fixed_temporary_name(tmp_path: Path) -> None:
    (tmp_path / "secret").write_text("the user's")
    (tmp_path / ".slo.parquet.tmp").symlink_to(tmp_path / "secret")
    write_slo(tmp_path, "s", parse_slo({"bounds": [{"metric": "ttft", "percentile": 99, "max_s": 1.0}]}, "s.toml"))
    assert (tmp_path / "secret").read_text() == "the user's" and (tmp_path / ".slo.parquet.tmp").is_symlink()
    assert pq.read_table(tmp_path / "slo.parquet").num_rows == 1


def test_workload_files_in_a_results_directory_are_as_readable_as_the_records(recorded: tuple[Path, Path]) -> None:
    _, out = recorded
    modes = {stat.S_IMODE(os.stat(p).st_mode) for p in (out / "workloads").glob("*.parquet")}
    runs_mode = stat.S_IMODE(os.stat(next((out / "runs").glob("run_id=*/part-0.parquet"))).st_mode)
    assert modes == {runs_mode}


# -- what kvbench asks of the user's checkout ------------------------------------------------------


def test_git_is_asked_without_taking_the_index_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvbench.harness.records import provenance

    seen: list[dict[str, str]] = []

    def fake_run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        seen.append(kwargs.get("env") or {})
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(provenance.subprocess, "run", fake_run)
    monkeypatch.setattr(provenance, "_REPO", ROOT)
    if not (ROOT / ".git").exists():
        pytest.skip("not a clone")
    provenance._git("status", "--porcelain")
    assert seen and seen[0].get("GIT_OPTIONAL_LOCKS") == "0"


# -- options that do not apply: capped and said, not refused --------------------------------------


def test_jobs_beyond_the_cells_are_capped_and_said(tmp_path: Path) -> None:
    suite = suite_file(tmp_path)
    proc = kvbench("run", suite, "--out", tmp_path / "out", "--no-report", "--jobs", "1000")
    assert proc.returncode == 0, proc.stderr
    assert f"--jobs 1000: {CELLS} cell(s) to run, so {CELLS} worker process(es)" in proc.stderr


# -- honest numbers (issue #45): what the field's own tool gives -------------------------------------


def test_trace_times_up_to_the_bound_are_read_and_csv_numbers_stay_text(tmp_path: Path) -> None:
    # Mooncake JSONL (timestamps in ms) up to the bound; past it is a row of test_bad_input.py.
    row = {"timestamp": 0, "input_length": 33, "output_length": 4, "hash_ids": [1]}
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in (row, {**row, "timestamp": MAX_TRACE_S * 1000})))
    assert read_trace(trace).arrival_s[-1] == MAX_TRACE_S
    csv = tmp_path / "t.csv"
    csv.write_text("prompt_len,output_len,arrival_s\n 12 ,3, 0.5\n")
    data = read_trace(csv)
    assert data.prompt_len.tolist() == [12] and data.arrival_s.tolist() == [0.5]


def test_mlperf_takes_the_sorted_sample_at_n_times_q_where_linear_interpolates() -> None:
    # The case: 60 requests, second-largest TTFT 1.0 s, largest 2.5 s.
    ttft = np.array([0.5] * 58 + [1.0, 2.5])
    assert percentile(ttft, 99) == pytest.approx(1.615)  # numpy's linear: passes a 2 s bound
    assert percentile(ttft, 99, "mlperf") == 2.5  # LoadGen: sample_latencies[int(60 * 0.99)] = [59]
    assert np.percentile(ttft, 99) == percentile(ttft, 99)
    # ⌊n·q⌋ exactly: 100 samples, p99 is index 99; p50 index 50 (the upper middle, no averaging).
    hundred = np.arange(100.0)
    assert percentile(hundred, 99, "mlperf") == 99.0 and percentile(hundred, 50, "mlperf") == 50.0
    with pytest.raises(ValueError):
        percentile(hundred, 99, "nearest")


def test_the_mlperf_presets_are_judged_by_loadgen_percentile_and_include_the_llama3_1_ones() -> None:
    assert {p.name for p in PRESETS.values()} >= {"mlperf-llama3.1-405b-server", "mlperf-llama3.1-8b-interactive"}
    as_ms = {n: {b.column: round(b.max_s * 1000) for b in p.bounds} for n, p in PRESETS.items()}
    assert as_ms["mlperf-llama3.1-405b-server"] == {"ttft_p99_s": 6000, "tpot_p99_s": 175}
    assert as_ms["mlperf-llama3.1-8b-interactive"] == {"ttft_p99_s": 500, "tpot_p99_s": 30}
    for p in PRESETS.values():
        assert all(b.method == ("mlperf" if p.name.startswith("mlperf-") else "linear") for b in p.bounds)


def _sixty_requests(run_id: str, last_ttft: float) -> pd.DataFrame:
    first = [0.5] * 58 + [1.0, last_ttft]
    return pd.DataFrame(
        {
            "run_id": run_id,
            "request_id": range(60),
            "status": "finished",
            "arrival_s": 0.0,
            "first_token_s": first,
            "finished_s": [f + 0.3 for f in first],
            "output_len": 4,
            "token_times_s": [None] * 60,
        }
    )


def test_a_run_under_an_mlperf_preset_is_judged_on_loadgen_p99() -> None:
    slo = parse_slo({"preset": "mlperf-llama2-70b-server"}, "s.toml")
    requests = _sixty_requests("r1", 2.5)
    runs = pd.DataFrame({"run_id": ["r1"], "suite": ["s"], "sim_time_s": [10.0], "ttft_p99_s": [1.615]})
    judged = with_goodput(runs, requests, slo_frame(slo, "s"))
    assert judged.loc[0, "ttft_p99_s"] == 1.615  # the runs table's linear column, as recorded
    assert judged.loc[0, "ttft_p99_s@mlperf"] == 2.5 > 2.0  # over the bound: not within the SLO
    assert judged_values(requests, "tpot_p99_s@mlperf") == pytest.approx(0.1)


def test_export_of_a_run_holding_infinity_as_pytorch_records_writes_inf(tmp_path: Path) -> None:
    # vLLM's InfEncoder writes "inf" in the PyTorch records: the same here. (vllm-bench, which
    # cannot hold it, refuses: test_bad_input.py, export-vllm_bench-a_run_holding_infinity.)
    import_holding_infinity(tmp_path / "R")
    proc = kvbench("export", tmp_path / "R", "--format", "pytorch-oss", "--out", tmp_path / "x.json")
    assert proc.returncode == 0, proc.stderr
    records = json.loads((tmp_path / "x.json").read_text())
    values = {r["metric"]["name"]: r["metric"]["benchmark_values"] for r in records}
    assert values["p99_ttft_ms"] == ["inf"]


def test_compare_names_what_an_imported_cell_does_not_record(imported: Path, tmp_path: Path) -> None:
    base = tmp_path / "base"
    proc = kvbench("run", "example", "--out", str(base), "--quiet", "--no-report", timeout=600)
    assert proc.returncode == 0, proc.stderr
    proc = kvbench("compare", str(base), str(imported))
    assert "nan" not in proc.stdout and "not recorded" in proc.stdout, proc.stdout


def test_itl_is_one_gap_per_streamed_chunk_as_vllm_bench_serve_measures_it() -> None:
    seqs = [Seq(0, 0, 0, 8, 5, 0.0)]
    result = SampleResult(0, 0, sent_s=0.0, chunk_times=[0.10, 0.15, 0.20], chunk_tokens=[1, 2, 2], end_s=0.20)
    result.status = "finished"
    times = _apply_client(seqs, [result])
    assert seqs[0].num_output == 5 and seqs[0].status == FINISHED
    itl = itl_summary(seqs, times)
    assert itl["itl_p50_s"] == pytest.approx(0.05) and itl["itl_mean_s"] == pytest.approx(0.05)  # not 0.025


def test_a_served_run_records_each_chunk_and_exports_vllm_s_itls(served: Path, tmp_path: Path) -> None:
    (rid,) = store.existing_run_ids(served)
    run = store.read_table(served, "runs").iloc[0]
    requests = store.read_table(served, "requests", {rid})
    assert [list(c) for c in requests["token_counts"]] == [[1, 2, 2]] * 3
    assert all(len(t) == 3 for t in requests["token_times_s"])
    assert run["itl_p50_s"] == pytest.approx(0.05, abs=0.02) and run["itl_mean_s"] == pytest.approx(0.05, abs=0.02)
    assert run["clock"] == "measured"  # the suite named no clock: a served engine takes the measured one
    proc = kvbench("export", str(served), "--format", "vllm-bench", "--out", str(tmp_path / "x.json"))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "x.json").read_text())
    assert [len(gaps) for gaps in doc["itls"]] == [2, 2, 2]  # one per chunk after the first, not 4
    assert doc["median_itl_ms"] == pytest.approx(50, abs=20)
    assert doc["max_output_tokens_per_s"] == 9  # 3 requests × 3 chunks in the first second, as vLLM counts
    assert doc["output_lens"] == [5, 5, 5]


def test_a_stream_that_is_not_completion_chunks_is_a_failed_row_naming_the_server(tmp_path: Path) -> None:
    pytest.importorskip("aiohttp")
    from tests.streamkit import Script, stand_in_server  # aiohttp at import

    with stand_in_server(Script(raw=b"[1, 2]", cache_config=SERVED_CACHE_CONFIG)) as url:
        out, proc = run_attached(tmp_path, url)
    assert proc.returncode == 1, proc.stderr  # a failed cell: recorded, and the run says so
    row = store.read_table(out, "runs").iloc[0]
    assert row["status"] == "failed"
    assert f"{url} streamed a message that is not a completion chunk" in row["error"]
    assert "AttributeError" not in row["error"] and "\n" not in row["error"]


def test_a_serve_cell_takes_the_measured_clock_and_refuses_another(tmp_path: Path) -> None:
    roofline = serve_suite("http://127.0.0.1:9", scheduler={"clock": "roofline"})
    (spec, _), *_ = parse_suite(roofline, str(tmp_path / "s.toml")).cells()
    assert spec.scheduler.clock == "measured"  # the suite's roofline is for its other runners
    with pytest.raises(KvbenchError, match='serve runner runs on clock = "measured" only'):
        list(parse_suite(serve_suite("http://127.0.0.1:9", clock="steps"), str(tmp_path / "s.toml")).cells())


def test_import_then_export_of_a_result_with_multi_token_chunks_keeps_its_itls(tmp_path: Path) -> None:
    """A real result whose stream merged tokens: the fixture with each request's chunks 3..6 and
    7..10 merged (their ITLs summed into one), as vLLM's client records a chunk of several tokens."""
    doc = json.loads(DETAILED.read_text())
    for i, gaps in enumerate(doc["itls"]):
        merged = gaps[:3] + [sum(gaps[3:6])] + gaps[6:7] + [sum(gaps[7:10])] + gaps[10:]
        doc["itls"][i] = merged
    every = [g for gaps in doc["itls"] for g in gaps]
    for statistic, value in (("mean", np.mean(every)), ("median", np.median(every)), ("std", np.std(every))):
        doc[f"{statistic}_itl_ms"] = value * 1000
    for p in (50, 90, 95, 99):
        doc[f"p{p}_itl_ms"] = np.percentile(every, p) * 1000
    doc.pop("max_output_tokens_per_s")
    src = tmp_path / "merged.json"
    src.write_text(json.dumps(doc))
    proc = kvbench("import", str(src), "--out", str(tmp_path / "R"))
    assert proc.returncode == 0, proc.stderr
    proc = kvbench("export", str(tmp_path / "R"), "--format", "vllm-bench", "--out", str(tmp_path / "again.json"))
    assert proc.returncode == 0, proc.stderr
    again = json.loads((tmp_path / "again.json").read_text())
    assert [len(g) for g in again["itls"]] == [7] * 12  # 12 tokens in 8 chunks: 7 gaps, not 11
    for mine, theirs in zip(again["itls"], doc["itls"]):
        assert mine == pytest.approx(theirs, rel=1e-9, abs=1e-12)
    for key in ("mean_itl_ms", "median_itl_ms", "std_itl_ms", "p50_itl_ms", "p90_itl_ms", "p95_itl_ms", "p99_itl_ms"):
        assert again[key] == pytest.approx(doc[key], rel=1e-9), key
    first = json.loads(DETAILED.read_text())
    assert again["output_lens"] == first["output_lens"] and again["ttfts"] == pytest.approx(first["ttfts"])


# -- other libraries' import-time output under --quiet: to the log, not the terminal ----------------

STAND_IN = textwrap.dedent("""
    import logging, os, sys
    os.write(2, b"fd 2 at import\\n")
    print("stdout at import")
    print("stderr at import", file=sys.stderr)
    _log = logging.getLogger("noisy_standin")
    _log.addHandler(logging.StreamHandler())  # bound to sys.stderr as it is now, as torch's is
    _log.propagate = False

    def later():
        _log.warning("a handler made at import, used later")
""")
SCRIPT = textwrap.dedent("""
    import sys
    from pathlib import Path
    from kvbench.app.third_party import open_results_log, to_log

    with open_results_log(Path(sys.argv[1])) as log, to_log(log):
        import noisy_standin
        noisy_standin.later()
        print("kvbench line", file=sys.stderr)
""")


def test_a_library_s_import_time_output_goes_to_the_log(tmp_path: Path) -> None:
    """A stand-in for torch under vLLM's CUDA build (not installable here): it writes to fd 2,
    prints to both streams and makes a logging handler on sys.stderr as it imports."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "noisy_standin.py").write_text(STAND_IN)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "lib"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, cwd=ROOT, env=env, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == ["kvbench line"] and proc.stdout == ""
    log = (tmp_path / "kvbench.log").read_text()
    for line in ("fd 2 at import", "stdout at import", "stderr at import", "a handler made at import, used later"):
        assert line in log, log
