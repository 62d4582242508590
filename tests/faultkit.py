"""Environment faults for the fault tests: a real small tmpfs where this machine lets us mount
one, and otherwise the thinnest seam that stands in for a full disk.

The seam (``python -m tests.faultkit FAIL_AT MODE LOG -- <kvbench args>``) runs the real CLI
in its own process after patching the few calls through which kvbench writes file contents
(pyarrow's ``ParquetWriter`` and ``Path.write_bytes``/``write_text``). Each call counts as a
write; the FAIL_AT-th fails with ENOSPC after leaving a truncated file behind, as a real full
disk does, and so does every later one (MODE ``full``: a disk that stays full) or none (MODE
``once``: space freed a moment later, another process's file deleted, say). FAIL_AT 0 fails
nothing and only logs each write (its number, what and where) to LOG, so a test can aim.

``damage_run`` leaves one run's records incomplete, as a crash or a hand's edit would: what the
readers must refuse by name (``test_bad_input.py``) and a rerun must redo (``test_faults.py``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PAGE = 4096


# -- a real small filesystem ---------------------------------------------------------


def _run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True)


def tmpfs_unavailable() -> str | None:
    """Why a tmpfs cannot be mounted here (None when it can): needs root and a kernel and
    container that allow mount(2)."""
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    probe = Path(f"/tmp/kvbench-tmpfs-probe-{uuid.uuid4().hex[:8]}")
    probe.mkdir()
    try:
        proc = _run("mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(probe))
        if proc.returncode != 0:
            return f"mount -t tmpfs failed here: {proc.stderr.strip() or proc.returncode}"
        _run("umount", str(probe))
        return None
    except FileNotFoundError:
        return "no mount command"
    finally:
        probe.rmdir()


class Tmpfs:
    """A tmpfs of a chosen size mounted at ``path``; ``resize`` is how a test frees the disk."""

    def __init__(self, path: Path, size_bytes: int) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        proc = _run("mount", "-t", "tmpfs", "-o", f"size={_pages(size_bytes)}", "tmpfs", str(path))
        assert proc.returncode == 0, proc.stderr
        os.chmod(path, 0o755)

    def resize(self, size_bytes: int) -> None:
        proc = _run("mount", "-o", f"remount,size={_pages(size_bytes)}", str(self.path))
        assert proc.returncode == 0, proc.stderr

    def read_only(self, on: bool) -> None:
        proc = _run("mount", "-o", f"remount,{'ro' if on else 'rw'}", str(self.path))
        assert proc.returncode == 0, proc.stderr

    def used_bytes(self) -> int:
        st = os.statvfs(self.path)
        return (st.f_blocks - st.f_bfree) * st.f_frsize

    def unmount(self) -> None:
        _run("umount", "-l", str(self.path))


def _pages(size_bytes: int) -> int:
    return max(PAGE, -(-size_bytes // PAGE) * PAGE)


@contextlib.contextmanager
def tmpfs(path: Path, size_bytes: int) -> Iterator[Tmpfs]:
    fs = Tmpfs(path, size_bytes)
    try:
        yield fs
    finally:
        fs.unmount()


# -- records left incomplete ------------------------------------------------------------------

# How a run's records can be incomplete: a partition or its file missing, another run's file in its
# place (of another length: the run row's count tells them apart), a file cut short.
DAMAGE = ["steps-missing", "requests-missing", "steps-file-missing", "steps-of-another-run", "steps-truncated"]


def damage_run(out: Path, how: str) -> str:
    """Make the second run of results directory ``out`` incomplete in the way ``how`` (one of
    ``DAMAGE``) names; return its run id."""
    # imported here, not at the top: the seam's process (main) loads kvbench only once its writers are patched
    import pyarrow.parquet as pq
    from kvbench.harness.records.store import PART

    runs = sorted(p.name.split("=", 1)[1] for p in (out / "runs").glob("run_id=*"))
    victim = runs[1]
    steps = out / "steps" / f"run_id={victim}" / PART
    if how == "steps-missing":
        shutil.rmtree(steps.parent)
    elif how == "requests-missing":
        shutil.rmtree(out / "requests" / f"run_id={victim}")
    elif how == "steps-file-missing":
        steps.unlink()
    elif how == "steps-of-another-run":
        rows = {r: pq.read_metadata(out / "steps" / f"run_id={r}" / PART).num_rows for r in runs}
        source = next(r for r in runs if rows[r] != rows[victim])
        shutil.copy(out / "steps" / f"run_id={source}" / PART, steps)
    elif how == "steps-truncated":
        steps.write_bytes(steps.read_bytes()[:100])
    else:
        raise AssertionError(how)
    return victim


# -- the seam: a writer that fails on the Nth write ------------------------------------


def kvbench_failing_at(
    fail_at: int, log: Path, *args: str, once: bool = False, timeout: float = 300
) -> subprocess.CompletedProcess:
    """The real CLI in a subprocess whose FAIL_AT-th write (and every later one, unless ``once``)
    fails with ENOSPC."""
    env = dict(os.environ)
    mode = "once" if once else "full"
    return subprocess.run(
        [sys.executable, "-m", "tests.faultkit", str(fail_at), mode, str(log), "--", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=timeout,
    )


def read_log(log: Path) -> list[tuple[int, str, str]]:
    """(number, what, path) of every write a FAIL_AT 0 run made, in order."""
    rows = []
    for line in log.read_text().splitlines():
        n, what, path = line.split("\t", 2)
        rows.append((int(n), what, path))
    return rows


class _DiskFull:
    def __init__(self, fail_at: int, once: bool, log: Path) -> None:
        self.fail_at, self.once, self.log, self.count = fail_at, once, log, 0

    def write(self, what: str, where: object, truncate: Callable[[], None] | None = None) -> None:
        """Count one write; fail it (after ``truncate`` leaves a partial file) once the disk is 'full'."""
        self.count += 1
        with self.log.open("a") as f:
            f.write(f"{self.count}\t{what}\t{where}\n")
        if self.fail_at and (self.count == self.fail_at or (self.count > self.fail_at and not self.once)):
            if truncate is not None:
                truncate()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(where))


def _path_of(where: Any) -> Any:
    """Where a write goes: a path as given, or the path of an open file (Linux's /proc), so that a
    file written through its descriptor is named by its folder as one written by path is."""
    if hasattr(where, "fileno"):
        try:
            return os.readlink(f"/proc/self/fd/{where.fileno()}")
        except (OSError, ValueError):
            pass
    return where


def _install(disk: _DiskFull) -> None:
    import pyarrow.parquet as pq

    writer = pq.ParquetWriter
    real_init, real_write, real_close = writer.__init__, writer.write_table, writer.close

    def partial(where: Any) -> Callable[[], None]:
        def leave() -> None:  # what a full disk leaves: the file begun, not finished
            if isinstance(where, (str, os.PathLike)):
                with open(where, "wb") as f:
                    f.write(b"PAR1\x15\x00")
            elif hasattr(where, "write"):  # a file kvbench opened (harness.records.atomic)
                where.write(b"PAR1\x15\x00")
                where.flush()

        return leave

    def init(self: Any, where: Any, *args: Any, **kwargs: Any) -> None:
        self._fault_where = _path_of(where)
        disk.write("parquet-open", self._fault_where, partial(where))
        real_init(self, where, *args, **kwargs)

    def write_table(self: Any, *args: Any, **kwargs: Any) -> None:
        disk.write("parquet-write", getattr(self, "_fault_where", "?"))
        real_write(self, *args, **kwargs)

    def close(self: Any) -> None:
        if getattr(self, "_fault_failed", False):
            # As Arrow's own writer: once a close has failed, the writer counts as closed and
            # a second close (pyarrow's __del__, a context manager's exit) does nothing.
            self.is_open = False
            return
        if getattr(self, "is_open", True):  # close() of a closed writer writes nothing
            try:
                disk.write("parquet-close", getattr(self, "_fault_where", "?"))
            except OSError:
                self._fault_failed = True
                raise
        real_close(self)

    writer.__init__, writer.write_table, writer.close = init, write_table, close

    real_bytes, real_text = Path.write_bytes, Path.write_text

    def write_bytes(self: Path, data: bytes) -> int:
        disk.write("file", self, lambda: real_bytes(self, data[: len(data) // 2]))
        return real_bytes(self, data)

    def write_text(self: Path, data: str, *args: Any, **kwargs: Any) -> int:
        disk.write("file", self, lambda: real_text(self, data[: len(data) // 2], *args, **kwargs))
        return real_text(self, data, *args, **kwargs)

    Path.write_bytes, Path.write_text = write_bytes, write_text  # type: ignore[method-assign]


def main(argv: list[str]) -> int:
    fail_at, mode, log, sep, *args = argv
    assert sep == "--" and mode in ("full", "once"), argv
    _install(_DiskFull(int(fail_at), mode == "once", Path(log)))
    from kvbench.app.cli import main as cli

    return cli(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
