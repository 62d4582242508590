"""User-facing errors.

Anything raised as a ``KvbenchError`` is printed by the CLI as one line on
stderr with a non-zero exit code; anything else is a bug and keeps its
traceback. ``Interrupted`` (SIGINT, SIGTERM) is not an error: the CLI prints
its message and exits 128 + the signal number, as a shell reports a signal.
"""

from __future__ import annotations

import errno as _errno
import os
import signal


class KvbenchError(Exception):
    """Bad input or an impossible request, explained in one line."""

    exit_code = 2


class InfeasibleError(KvbenchError):
    """The work cannot fit the KV budget under any allocation policy."""

    exit_code = 3


class StorageError(KvbenchError):
    """The environment refused a write or read of the results (disk full, no permission, the
    directory gone). Not a property of the cell being run: the sweep stops rather than record
    the cell as failed, so that rerunning the same command once the cause is gone runs it."""

    exit_code = 74  # EX_IOERR in sysexits.h: an input/output error


class ResultsBusy(KvbenchError):
    """Another kvbench process is writing the same results directory."""

    exit_code = 75  # EX_TEMPFAIL in sysexits.h: try again later


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM, raised wherever the program was so that the same cleanup runs for both.

    A ``KeyboardInterrupt`` so that every ``except Exception`` (a runner isolating a failing
    cell, say) lets it through, as it does Ctrl-C.
    """

    def __init__(self, signum: int = signal.SIGINT, message: str | None = None) -> None:
        super().__init__(signum)
        self.signum = int(signum)
        self.message = message

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def one_line(message: str) -> str:
    """Collapse a message to a single line (errors must never span lines). Control characters
    that are not whitespace (a NUL from a suite's string, say) are shown escaped, not sent raw
    to the terminal."""
    text = " ".join(str(message).split())
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def os_cause(exc: BaseException) -> str:
    """The cause of an ``OSError`` in a few words: 'No space left on device', not pyarrow's
    'Error writing bytes to file. Detail: [errno 28] ...'."""
    code = getattr(exc, "errno", None)
    if isinstance(code, int) and code in _errno.errorcode:
        return os.strerror(code)
    lines = str(exc).splitlines()
    return one_line(lines[0]) if lines else type(exc).__name__


def storage_error(path: object, exc: BaseException, doing: str = "cannot write") -> StorageError:
    """``PATH: cannot write (No space left on device)``: the path and the cause, nothing else."""
    return StorageError(f"{path}: {doing} ({os_cause(exc)})")
