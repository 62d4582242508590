"""Faults of the environment, driven through the real CLI in subprocesses: a full disk (a real
small tmpfs where this machine can mount one; everywhere, a writer that fails on the Nth
write), an output that cannot be created or written (as an unprivileged user, and a
read-only filesystem), SIGTERM and SIGINT mid-sweep, SIGKILL of the parent alone, the
results directory removed mid-run, and a second run on the same directory.

Each must give one line on stderr naming the path and the cause, a non-zero exit, no
temporary file left, every completed run whole and readable, nothing that looks whole but
is not, and then, once the cause is gone, the same command must complete the rest with
records identical to an uninterrupted run's (``assert_same_records``)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import pytest
from kvbench.harness.records import store
from kvbench.harness.records.lock import LOCK_NAME

from tests.conftest import ROOT, SMALL, assert_one_line_error, kvbench, suite_toml
from tests.faultkit import kvbench_failing_at, read_log, tmpfs, tmpfs_unavailable

CELLS = 4
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
def suites(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("suites")
    paths = {"small": d / "small.toml", "slow": d / "slow.toml"}
    paths["small"].write_text(SMALL)
    paths["slow"].write_text(SLOW)
    return paths


@pytest.fixture(scope="module")
def reference(suites, tmp_path_factory) -> dict[str, Path]:
    """Each suite run once, uninterrupted, by the same command the tests use."""
    refs = {}
    for name, suite in suites.items():
        out = tmp_path_factory.mktemp(f"ref-{name}") / "out"
        proc = kvbench("run", str(suite), "--out", str(out), "--quiet", "--no-report")
        assert proc.returncode == 0, proc.stderr
        refs[name] = out
    return refs


@pytest.fixture(scope="module")
def write_log(suites, tmp_path_factory) -> list[tuple[int, str, str]]:
    """Every write of an uninterrupted run of the small suite's records, in order (the report's
    writes come next)."""
    d = tmp_path_factory.mktemp("count")
    proc = kvbench_failing_at(
        0, d / "log", "run", str(suites["small"]), "--out", str(d / "out"), "--quiet", "--no-report"
    )
    assert proc.returncode == 0, proc.stderr
    return read_log(d / "log")


# -- disk full: a writer that fails on the Nth write (runs everywhere) -----------------------


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
def test_disk_full_at_the_nth_write_then_resume(case, suites, reference, write_log, tmp_path):
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


def test_a_write_that_fails_once_stops_the_sweep_and_is_not_a_failed_row(suites, reference, write_log, tmp_path):
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


# -- disk full: a real small filesystem --------------------------------------------------------


@pytest.fixture(scope="module")
def sizes(suites, tmp_path_factory) -> dict[str, int]:
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
def test_disk_full_on_a_real_tmpfs_then_resume(room, suites, reference, sizes, tmp_path):
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
def test_read_only_filesystem_keeps_completed_runs_then_resume(suites, reference, tmp_path):
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
def test_unwritable_output_as_an_unprivileged_user():
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


# -- signals --------------------------------------------------------------------------------------


def _interactive_signals() -> None:
    # What a terminal's child gets: SIGINT at its default. A test runner started in the
    # background of a non-interactive shell (`cmd &`) ignores SIGINT, an ignored disposition
    # survives exec, and Python then installs no Ctrl-C handler: the Ctrl-C cases would test
    # the launcher, not kvbench.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


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
        preexec_fn=_interactive_signals,
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
def test_signal_mid_sweep_stops_cleanly_then_resume(sig, jobs, group, suites, reference, tmp_path):
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
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":  # fields after the name: state, ppid, pgrp, session
            pids.append(int(stat.parent.name))
    return pids


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigkill_of_the_parent_alone_leaves_no_worker_and_no_lock(suites, reference, tmp_path):
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


def test_results_directory_removed_mid_run(suites, reference, tmp_path):
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


# -- two runs on one directory: the second is refused --------------------------------------------


def test_a_second_run_on_the_same_directory_is_refused(suites, reference, tmp_path):
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
