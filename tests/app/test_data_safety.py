"""Data safety, through the real CLI: kvbench writes only regular files it creates inside the
results directory (or the one --out FILE named, when absent or a regular file), removes only
what its own records say it wrote, never through a symbolic link, counts a run complete only
when its records are whole, refuses before it creates anything, and stops cleanly on Ctrl-C
at any moment.

Every refusal is checked for: a non-zero exit, one line, no traceback, and an unchanged tree
(a listing of every entry under the test's folder, device nodes, FIFOs and links included,
before and after: nothing outside the results directory touched, nothing left by the
refusal, no data of another directory changed)."""

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
from kvbench.harness.records.lock import LOCK_NAME

from tests.conftest import ROOT, assert_one_line_error, kvbench, special, tree

EXAMPLE = (ROOT / "suites" / "example.toml").read_text(encoding="utf-8")
SMALL = EXAMPLE.replace("num_requests = 200", "num_requests = 20")  # 4 sim cells, well under a second each
CELLS = 4


def suite_file(folder: Path, text: str = SMALL, name: str = "suite.toml") -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def run_ok(suite: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    proc = kvbench("run", suite, "--out", out, "--quiet", *extra)
    assert proc.returncode == 0, proc.stderr
    return proc


def refused_and_unchanged(
    proc: subprocess.CompletedProcess[str], root: Path, before: dict[str, tuple], *needles: str
) -> None:
    assert_one_line_error(proc, *needles)
    assert tree(root) == before, "a refused command changed the tree"


OUT_FILE_KINDS = ["fifo", "device", "directory", "link-to-file", "link-to-directory", "dangling-link"]


@pytest.mark.parametrize("kind", OUT_FILE_KINDS)
def test_workload_make_writes_no_special_file(tmp_path, kind):
    target = tmp_path / "w.parquet"
    special(kind, target, tmp_path / "elsewhere")
    before = tree(tmp_path)
    proc = kvbench("workload", "make", "--out", target, "--num-requests", "5", timeout=60)
    refused_and_unchanged(proc, tmp_path, before, str(target), "kvbench writes only regular files")


@pytest.mark.parametrize("kind", ["fifo", "device", "directory", "link-to-file"])
def test_calibrate_writes_no_special_file(tmp_path, kind):
    target = tmp_path / "profile.json"
    special(kind, target, tmp_path / "elsewhere")
    (tmp_path / "results").mkdir()
    before = tree(tmp_path)
    proc = kvbench("calibrate", tmp_path / "results", "--out", target, timeout=60)
    refused_and_unchanged(proc, tmp_path, before, str(target), "kvbench writes only regular files")


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


@pytest.mark.parametrize(
    "command",
    [
        ["workload", "make", "--num-requests", "5", "--out", ""],
        ["run", "suites/example.toml", "--quiet", "--out", ""],
        ["calibrate", ".", "--out", ""],
    ],
)
def test_an_empty_out_names_nothing(tmp_path, command):
    shutil.copy(ROOT / "suites" / "example.toml", tmp_path / "example.toml")
    command = [c.replace("suites/example.toml", str(tmp_path / "example.toml")) for c in command]
    before = tree(tmp_path)
    proc = kvbench(*command, cwd=tmp_path, timeout=60)
    refused_and_unchanged(proc, tmp_path, before, "--out", "empty path")


@pytest.mark.parametrize("kind", ["fifo", "device", "link-to-file"])
def test_run_out_that_is_not_a_directory_is_refused(tmp_path, kind):
    suite = suite_file(tmp_path)
    out = tmp_path / "out"
    special(kind, out, tmp_path / "elsewhere")
    before = tree(tmp_path)
    proc = kvbench("run", suite, "--out", out, "--quiet", timeout=60)
    refused_and_unchanged(proc, tmp_path, before, str(out), "not a directory")


# -- inside a results directory: real folders only, foreign files never removed -------------------


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> tuple[Path, Path]:
    """A results directory of the small suite, with its report (made once, copied per test)."""
    root = tmp_path_factory.mktemp("recorded")
    suite = suite_file(root)
    run_ok(suite, root / "out")
    return suite, root / "out"


def copy_of(recorded: tuple[Path, Path], tmp_path: Path, name: str = "out") -> tuple[Path, Path]:
    suite, out = recorded
    dest = tmp_path / name
    shutil.copytree(out, dest, symlinks=True)
    return suite_file(tmp_path), dest


@pytest.mark.parametrize("how", ["own-file", "changed-summary", "subfolder", "link"])
def test_a_foreign_report_folder_is_refused_not_deleted(recorded, tmp_path, how):
    suite, out = copy_of(recorded, tmp_path)
    report = out / "report"
    if how == "own-file":
        (report / "notes.txt").write_text("the user's notes")
    elif how == "changed-summary":
        (report / "summary.md").write_text("edited by hand", encoding="utf-8")
    elif how == "subfolder":
        (report / "drafts").mkdir()
    else:
        shutil.rmtree(report)
        (tmp_path / "mine").mkdir()
        (tmp_path / "mine" / "index.html").write_text("<p>mine</p>")
        report.symlink_to(tmp_path / "mine", target_is_directory=True)
    before = tree(tmp_path)
    for proc in (kvbench("run", suite, "--out", out, "--quiet", "--rerun", timeout=120), kvbench("report", out)):
        refused_and_unchanged(proc, tmp_path, before, str(report))


def test_a_report_kvbench_wrote_is_replaced_and_one_without_its_manifest_is_not(recorded, tmp_path):
    _, out = copy_of(recorded, tmp_path)
    assert (out / "report" / ".kvbench-report.json").is_file()
    proc = kvbench("report", out)
    assert proc.returncode == 0, proc.stderr
    assert not [p for p in out.iterdir() if p.name.startswith(".report")]
    (out / "report" / ".kvbench-report.json").unlink()  # nothing says these files are kvbench's
    before = tree(tmp_path)
    refused_and_unchanged(kvbench("report", out), tmp_path, before, str(out / "report"))


LINKED = [
    "runs",
    "steps",
    "requests",
    "workloads",
    "steps/run_id=*",
    "requests/run_id=*",
    LOCK_NAME,
    "reference.parquet",
]


@pytest.mark.parametrize("what", LINKED)
def test_a_symlink_inside_a_results_directory_is_refused(recorded, tmp_path, what):
    """A folder or file of DIR linked into another results directory: kvbench neither writes
    nor removes through it (the other directory's records stay byte for byte)."""
    suite, out = copy_of(recorded, tmp_path)
    _, other = copy_of(recorded, tmp_path, "other")
    if what.endswith("*"):
        table = what.split("/")[0]
        victim = sorted((out / table).glob("run_id=*"))[0]
        target = other / table / victim.name
    else:
        victim, target = out / what, other / what
        if what == "reference.parquet":
            target.write_bytes(b"the other directory's file")
    if victim.is_dir() and not victim.is_symlink():
        shutil.rmtree(victim)
    elif os.path.lexists(victim):
        victim.unlink()
    victim.symlink_to(target, target_is_directory=target.is_dir())
    if what in ("steps", "requests"):
        # an orphan in the other directory: a run into out must not clean it through the link
        shutil.rmtree(sorted((other / "runs").glob("run_id=*"))[0])
    before = tree(tmp_path)
    proc = kvbench("run", suite, "--out", out, "--quiet", "--rerun", timeout=120)
    refused_and_unchanged(proc, tmp_path, before, "symbolic link")


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

REFUSED_GRIDS = {
    "block_size_of_two_types": ("block_size = [16]", 'block_size = [16, "16"]'),
    "an_infinite_rate": ('arrival = "batch"', 'arrival = "poisson"\nrate = [1.0, inf]'),
}


@pytest.mark.parametrize("case", ["block_size_of_two_types", "an_infinite_rate", "a_later_workload_refused"])
@pytest.mark.parametrize("existing", [False, True])
def test_a_refused_grid_creates_nothing(tmp_path, case, existing):
    if case == "a_later_workload_refused":  # the first workload builds, the second cannot
        text = SMALL.replace("[workload]", "[workloads.a]").replace(
            "[scheduler]",
            '[workloads.b]\nsource = "fixed"\nprompt_len = 5000\noutput_len = 10\nnum_requests = 3\n[scheduler]',
        )
    else:
        old, new = REFUSED_GRIDS[case]
        text = SMALL.replace(old, new)
    suite = suite_file(tmp_path, text)
    out = tmp_path / "out"
    if existing:
        out.mkdir()
    before = tree(tmp_path)
    proc = kvbench("run", suite, "--out", out, "--quiet")
    refused_and_unchanged(proc, tmp_path, before, "suite.toml")


def test_reading_commands_leave_nothing_in_a_folder_that_is_not_a_results_directory(tmp_path):
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "cat.jpg").write_bytes(b"\xff\xd8")
    before = tree(tmp_path)
    for proc in (kvbench("report", folder), kvbench("compare", folder, folder), kvbench("diverge", folder, "a", "b")):
        refused_and_unchanged(proc, tmp_path, before, str(folder))


# -- options that do not apply, and bounded waits -----------------------------------------------


def test_address_without_ray_is_refused(tmp_path):
    suite = suite_file(tmp_path)
    before = tree(tmp_path)
    proc = kvbench("run", suite, "--out", tmp_path / "out", "--address", "127.0.0.1:6379", timeout=60)
    refused_and_unchanged(proc, tmp_path, before, "--address", "--executor ray")


def test_an_unreachable_ray_address_fails_at_once(tmp_path):
    suite = suite_file(tmp_path)
    before = tree(tmp_path)
    start = time.monotonic()
    proc = kvbench(
        "run", suite, "--out", tmp_path / "out", "--executor", "ray", "--address", "127.0.0.1:1", timeout=120
    )
    assert time.monotonic() - start < 60
    if "Ray is not installed" in proc.stderr:
        refused_and_unchanged(proc, tmp_path, before, "Ray is not installed")
    else:
        refused_and_unchanged(proc, tmp_path, before, "cannot start or reach Ray at 127.0.0.1:1")


def test_jobs_beyond_the_cells_are_capped_and_said(tmp_path):
    suite = suite_file(tmp_path)
    proc = kvbench("run", suite, "--out", tmp_path / "out", "--no-report", "--jobs", "1000")
    assert proc.returncode == 0, proc.stderr
    assert f"--jobs 1000: {CELLS} cell(s) to run, so {CELLS} worker process(es)" in proc.stderr


def test_compare_fails_when_one_side_measured_nothing(tmp_path):
    infeasible = SMALL.replace('"12GiB"', '"1MiB"')
    suite = suite_file(tmp_path, infeasible)
    proc = kvbench("run", suite, "--out", tmp_path / "none", "--quiet", "--no-report")
    assert proc.returncode == 3, proc.stderr  # every cell infeasible
    proc = kvbench("compare", tmp_path / "none", tmp_path / "none")
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "measured nothing" in lines[0] and "4 infeasible" in lines[0], proc.stderr


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
