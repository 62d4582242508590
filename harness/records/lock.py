"""One writer per results directory: an advisory lock on ``DIR/.kvbench.lock``.

Two ``kvbench run`` processes on one directory would each clean the other's
temporary partitions on start and race to publish the same cells; the second
one is refused instead, with a line naming the directory and the holder's pid.
The lock is ``flock(2)``: the kernel drops it when its holder exits, however it
exits (SIGKILL included), so a stale lock cannot outlive a dead run. It is
advisory and local: on a network filesystem that does not pass flock on, two
machines are not kept apart (the Ray executor's workers write through the
driver's lock, which they do not need to take).

The lock file also tells whether the directory is still the one locked: if it
is removed (``rm -rf DIR`` mid-run) or replaced, ``check`` says so.
"""

from __future__ import annotations

import datetime as _dt
import errno
import fcntl
import os
import stat
from pathlib import Path
from types import TracebackType

from ..errors import KvbenchError, ResultsBusy, StorageError, storage_error

LOCK_NAME = ".kvbench.lock"

# Lock descriptors this process holds. A forked child (a --jobs worker) shares the lock with
# its parent; it closes its copies at once, so that the lock lives exactly as long as the
# process that took it, not as long as a worker that outlived it.
_HELD: set[int] = set()


def _close_in_child() -> None:
    for fd in _HELD:
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()


os.register_at_fork(after_in_child=_close_in_child)


class ResultsLock:
    """Held for as long as a command writes ``out``; ``out`` must exist."""

    def __init__(self, out: Path, command: str) -> None:
        self.out = Path(out)
        self.path = self.out / LOCK_NAME
        self.command = command
        self._fd: int | None = None
        self.created = False  # whether this process created the lock file (a refusal removes it again)

    def acquire(self) -> None:
        self.created = not os.path.lexists(self.path)
        try:
            # O_NOFOLLOW: a link planted at the lock's name must not take the truncation below elsewhere.
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise KvbenchError(
                    f"{self.path}: is a symbolic link, where kvbench keeps its lock file; "
                    f"remove it or choose another --out"
                ) from None
            raise storage_error(self.out, exc) from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise KvbenchError(
                f"{self.path}: is not a regular file, where kvbench keeps its lock file; "
                f"remove it or choose another --out"
            )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            also = " or choose another --out" if self.command == "run" else ""
            raise ResultsBusy(
                f"{self.out}: in use by another kvbench process{holder}; wait for it to end{also}"
            ) from None
        except OSError as exc:
            os.close(fd)
            raise storage_error(self.path, exc, "cannot lock") from None
        stamp = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()} kvbench {self.command} since {stamp}\n".encode())
        except OSError as exc:
            os.close(fd)  # closing drops the lock
            raise storage_error(self.path, exc) from None
        self._fd = fd
        _HELD.add(fd)

    def still_ours(self) -> bool:
        """Whether ``DIR/.kvbench.lock`` is still the file this process locked (the directory
        was neither removed nor replaced under it)."""
        if self._fd is None:
            return False
        try:
            mine, there = os.fstat(self._fd), os.stat(self.path)
        except OSError:
            return False
        return (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino)

    def check(self) -> None:
        """Raise ``StorageError`` when the results directory was removed or replaced mid-run."""
        if not self.still_ours():
            raise StorageError(
                f"{self.out}: the results directory was removed or replaced while kvbench was writing it"
            )

    def release(self) -> None:
        # The lock file stays: removing it would let a third process lock a new file while a
        # second still waits on the old one.
        if self._fd is not None:
            _HELD.discard(self._fd)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> ResultsLock:
        self.acquire()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    """`` (pid 123, kvbench run since …)`` from the lock file, or nothing if it cannot be read."""
    try:
        text = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
    except OSError:
        return ""
    pid, _, rest = text.partition(" ")
    return f" (pid {pid}, {rest})" if pid.isdigit() and rest else ""
