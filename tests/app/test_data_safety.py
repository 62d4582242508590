"""Data safety, through the real CLI: kvbench replaces only files it wrote (a regular file it
replaces stays readable), removes only what its own records say it wrote, counts a run
complete only when its records are whole, and stops cleanly on Ctrl-C at any moment. Its
refusals of outputs it will not write and of results directories it did not write (links,
foreign reports) are rows of ``test_bad_input.py``.

A refusal here is checked for: a non-zero exit, one line, no traceback, and an unchanged tree
(a listing of every entry under the test's folder, device nodes, FIFOs and links included,
before and after)."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from kvbench.harness.records import store

from tests.conftest import ROOT, assert_one_line_error, copy_of, kvbench, suite_file, tree

CELLS = 4


def run_ok(suite: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    proc = kvbench("run", suite, "--out", out, "--quiet", *extra)
    assert proc.returncode == 0, proc.stderr
    return proc


def refused_and_unchanged(
    proc: subprocess.CompletedProcess[str], root: Path, before: dict[str, tuple], *needles: str
) -> None:
    assert_one_line_error(proc, *needles)
    assert tree(root) == before, "a refused command changed the tree"


def test_workload_make_replaces_a_regular_file_and_leaves_it_readable(tmp_path):
    target = tmp_path / "w.parquet"
    target.write_bytes(b"old")
    proc = kvbench("workload", "make", "--out", target, "--num-requests", "5", timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert pq.read_table(target).num_rows == 5
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o666 & ~_umask()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.parquet"]  # no temporary file left


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# -- inside a results directory: real folders only, foreign files never removed -------------------


def test_a_report_kvbench_wrote_is_replaced(recorded, tmp_path):
    # One without its manifest is refused: test_bad_input.py, results-report-without-its-manifest.
    _, out = copy_of(recorded, tmp_path)
    assert (out / "report" / ".kvbench-report.json").is_file()
    proc = kvbench("report", out)
    assert proc.returncode == 0, proc.stderr
    assert (out / "report" / ".kvbench-report.json").is_file()
    assert not [p for p in out.iterdir() if p.name.startswith(".report")]


def test_an_orphan_partition_holding_foreign_files_is_left_alone(recorded, tmp_path):
    suite, out = copy_of(recorded, tmp_path)
    orphan = out / "steps" / "run_id=0000000000000000"
    orphan.mkdir()
    (orphan / "notes.txt").write_text("mine")
    kvbench_made = out / "steps" / "run_id=1111111111111111"
    shutil.copytree(sorted((out / "steps").glob("run_id=*"))[1], kvbench_made)
    run_ok(suite, out, "--no-report")
    assert (orphan / "notes.txt").read_text() == "mine"
    assert not kvbench_made.exists()  # an orphan as kvbench writes one is cleaned


# -- completeness from the records ---------------------------------------------------------------


def _damage(out: Path, how: str) -> str:
    runs = sorted(p.name.split("=", 1)[1] for p in (out / "runs").glob("run_id=*"))
    victim = runs[1]
    if how == "steps-missing":
        shutil.rmtree(out / "steps" / f"run_id={victim}")
    elif how == "requests-missing":
        shutil.rmtree(out / "requests" / f"run_id={victim}")
    elif how == "steps-file-missing":
        (out / "steps" / f"run_id={victim}" / store.PART).unlink()
    elif how == "steps-of-another-run":  # one of another length: the run row's count tells them apart
        rows = {r: pq.read_metadata(out / "steps" / f"run_id={r}" / store.PART).num_rows for r in runs}
        source = next(r for r in runs if rows[r] != rows[victim])
        shutil.copy(out / "steps" / f"run_id={source}" / store.PART, out / "steps" / f"run_id={victim}" / store.PART)
    elif how == "steps-truncated":
        path = out / "steps" / f"run_id={victim}" / store.PART
        path.write_bytes(path.read_bytes()[:100])
    return victim


DAMAGE = ["steps-missing", "requests-missing", "steps-file-missing", "steps-of-another-run", "steps-truncated"]


@pytest.mark.parametrize("how", DAMAGE)
def test_an_incomplete_run_is_named_by_readers_and_run_again(recorded, tmp_path, how):
    suite, out = copy_of(recorded, tmp_path)
    base = copy_of(recorded, tmp_path, "base")[1]
    victim = _damage(out, how)
    before = tree(tmp_path)
    for proc in (kvbench("report", out), kvbench("compare", base, out), kvbench("diverge", out, victim, victim)):
        refused_and_unchanged(proc, tmp_path, before, victim, "incomplete")
    proc = kvbench("run", suite, "--out", out, "--no-report")
    assert proc.returncode == 0, proc.stderr
    assert "incomplete records" in proc.stderr and "1 cell(s) run, 3 skipped" in proc.stderr
    assert store.incomplete_runs(out) == {}
    assert kvbench("compare", base, out).returncode == 0


def test_a_run_row_records_its_partitions_row_counts(recorded):
    _, out = recorded
    runs = store.read_table(out, "runs")
    for row in runs.to_dict("records"):
        steps = pq.read_metadata(out / "steps" / f"run_id={row['run_id']}" / store.PART).num_rows
        requests = pq.read_metadata(out / "requests" / f"run_id={row['run_id']}" / store.PART).num_rows
        assert (row["steps_rows"], row["requests_rows"]) == (steps, requests)
        assert steps == row["steps"] and requests == 20


# -- refusals create nothing ----------------------------------------------------------------------


# -- options that do not apply, and bounded waits -----------------------------------------------


def test_jobs_beyond_the_cells_are_capped_and_said(tmp_path):
    suite = suite_file(tmp_path)
    proc = kvbench("run", suite, "--out", tmp_path / "out", "--no-report", "--jobs", "1000")
    assert proc.returncode == 0, proc.stderr
    assert f"--jobs 1000: {CELLS} cell(s) to run, so {CELLS} worker process(es)" in proc.stderr


# -- interrupts at any moment ----------------------------------------------------------------------


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
def test_ctrl_c_at_any_moment_is_one_line_and_exit_130(recorded, tmp_path, command, delay):
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


def test_an_interrupt_a_finalizer_drops_is_kept_and_not_printed(monkeypatch):
    """A signal landing in a finalizer (a weakref callback of the import system, a ``__del__``): Python
    drops the exception; kvbench keeps it for the next cell boundary and hands it to no printer. Other
    dropped exceptions reach the hook that was there before (Python's own prints them)."""
    import gc

    from kvbench.app import signals
    from kvbench.harness.errors import Interrupted

    seen: list[BaseException] = []
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


# -- what kvbench asks of the user's checkout ------------------------------------------------------


def test_git_is_asked_without_taking_the_index_lock(monkeypatch):
    from kvbench.harness.records import provenance

    seen: list[dict[str, str]] = []

    def fake_run(cmd, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(kwargs.get("env") or {})
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(provenance.subprocess, "run", fake_run)
    monkeypatch.setattr(provenance, "_REPO", ROOT)
    if not (ROOT / ".git").exists():
        pytest.skip("not a clone")
    provenance._git("status", "--porcelain")
    assert seen and seen[0].get("GIT_OPTIONAL_LOCKS") == "0"


def test_workload_files_in_a_results_directory_are_as_readable_as_the_records(recorded):
    _, out = recorded
    modes = {stat.S_IMODE(os.stat(p).st_mode) for p in (out / "workloads").glob("*.parquet")}
    runs_mode = stat.S_IMODE(os.stat(next((out / "runs").glob("run_id=*/part-0.parquet"))).st_mode)
    assert modes == {runs_mode}


def test_a_results_directory_with_every_run_complete_reads_as_before(recorded):
    _, out = recorded
    assert store.complete_run_ids(out) == store.existing_run_ids(out)
    assert len(pd.read_parquet(out / "runs")) == CELLS
