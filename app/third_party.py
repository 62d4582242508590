"""Other libraries' output during a run goes to a log file; the console shows kvbench's own lines.

vLLM, torch and their dependencies print while they import and run: Python warnings,
log records, and lines that C++ code writes straight to file descriptor 2 (torch's NUMA
binding notice). Within ``to_log(file)`` descriptors 1 and 2 point at ``file``, Python
warnings and log records are written there too, and ``sys.stdout``/``sys.stderr`` are
duplicates of the console's descriptors taken before, so every line kvbench prints (progress,
tables, its one-line errors) still reaches the console. ``kvbench run`` keeps the file as
``DIR/kvbench.log``; with ``--verbose`` nothing is redirected.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, TextIO

LOG_NAME = "kvbench.log"


@contextlib.contextmanager
def to_log(file: IO[bytes]) -> Iterator[None]:
    """Send descriptors 1 and 2, Python warnings and log records to ``file`` (a binary file
    open for writing) within the block; kvbench's streams keep the console."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    saved = (os.dup(1), os.dup(2))
    streams = (sys.stdout, sys.stderr)
    console = tuple(_console(stream, fd, copy) for stream, fd, copy in zip(streams, (1, 2), saved))
    log = open(os.dup(file.fileno()), "w", encoding="utf-8", errors="backslashreplace", buffering=1)
    show = warnings.showwarning
    handler = _BestEffortHandler(log)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))
    root = logging.getLogger()
    # vLLM would otherwise give its loggers a handler of their own on the console's stdout.
    user_set = "VLLM_CONFIGURE_LOGGING" in os.environ
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    try:
        os.dup2(file.fileno(), 1)
        os.dup2(file.fileno(), 2)
        sys.stdout, sys.stderr = console
        warnings.showwarning = _to(log)
        root.addHandler(handler)
        yield
    finally:
        if not user_set:
            os.environ.pop("VLLM_CONFIGURE_LOGGING", None)  # as it was before the block
        root.removeHandler(handler)
        warnings.showwarning = show
        for stream in (*console, log):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        sys.stdout, sys.stderr = streams
        for stream in (*console, log):
            if stream not in streams:
                with contextlib.suppress(OSError, ValueError):
                    stream.close()
        for fd in saved:
            with contextlib.suppress(OSError):
                os.close(fd)


def open_results_log(out: Path, earlier: IO[bytes] | None = None) -> IO[bytes]:
    """``DIR/kvbench.log``, opened for appending (never through a link), with what was captured
    before the results directory existed (``earlier``) copied in first."""
    fd = os.open(out / LOG_NAME, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    log = os.fdopen(fd, "ab", buffering=0)
    if earlier is not None:
        earlier.flush()
        earlier.seek(0)
        shutil.copyfileobj(earlier, log)
    return log


def _console(stream: TextIO, fd: int, copy: int) -> TextIO:
    """What kvbench writes through instead of ``stream`` while ``fd`` points at the log: a
    stream on ``copy`` (the console's descriptor, duplicated) when ``stream`` writes to ``fd``;
    else ``stream`` itself (a stream of the caller's, such as a test's capture)."""
    try:
        writes_to_fd = stream.fileno() == fd
    except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation is an OSError
        writes_to_fd = False
    return _reopen(os.dup(copy), stream) if writes_to_fd else stream


def _reopen(fd: int, like: TextIO) -> TextIO:
    """A text stream on ``fd`` that writes as ``like`` does (its encoding), line by line."""
    return open(
        fd,
        "w",
        encoding=getattr(like, "encoding", None) or "utf-8",
        errors=getattr(like, "errors", None) or "backslashreplace",
        buffering=1,
    )


class _BestEffortHandler(logging.StreamHandler[TextIO]):
    """The log is best effort: a record that cannot be written (a full disk) is dropped, never
    reported on the console, where it would break kvbench's one line."""

    def handleError(self, record: logging.LogRecord) -> None:
        pass


def _to(log: TextIO) -> Any:
    def showwarning(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        with contextlib.suppress(OSError, ValueError):  # best effort, as log records are
            log.write(warnings.formatwarning(message, category, filename, lineno, line))

    return showwarning
