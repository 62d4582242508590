"""Other libraries' output during a run goes to a log file; the console shows kvbench's own lines.

vLLM, torch and their dependencies print while they import and run: Python warnings,
log records, and lines that C++ code writes straight to file descriptor 2 (torch's NUMA
binding notice). Within ``to_log(file)`` descriptors 1 and 2 point at ``file``, Python
warnings and log records are written there too, and ``sys.stdout``/``sys.stderr`` are
duplicates of the console's descriptors taken before, so every line kvbench prints (progress,
tables, its one-line errors) still reaches the console. A module imported for the first time
within the block runs its top-level code with ``sys.stdout``/``sys.stderr`` on descriptors 1
and 2 instead (``_ImportsToLog``): what a library prints as it imports, and the logging
handlers it makes then on ``sys.stderr`` (torch makes its own, which writes its deprecation
warnings and "No CUDA runtime is found" later), go to the file as well. ``kvbench run`` keeps
the file as ``DIR/kvbench.log``; with ``--verbose`` nothing is redirected.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import logging
import os
import shutil
import sys
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import IO, Any, TextIO

LOG_NAME = "kvbench.log"


@contextlib.contextmanager
def to_log(file: IO[bytes]) -> Iterator[None]:
    """Send descriptors 1 and 2, Python warnings and log records to ``file`` (a binary file
    open for writing) within the block; kvbench's streams keep the console."""
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()  # type: ignore[union-attr]
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
    imports = _ImportsToLog()
    try:
        os.dup2(file.fileno(), 1)
        os.dup2(file.fileno(), 2)
        sys.stdout, sys.stderr = console
        warnings.showwarning = _to(log)
        root.addHandler(handler)
        sys.meta_path.insert(0, imports)
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(imports)
        if not user_set:
            os.environ.pop("VLLM_CONFIGURE_LOGGING", None)  # as it was before the block
        root.removeHandler(handler)
        warnings.showwarning = show
        for stream in (*console, log, sys.__stdout__, sys.__stderr__):
            with contextlib.suppress(OSError, ValueError, AttributeError):
                stream.flush()  # type: ignore[union-attr]
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


class _ImportsToLog(importlib.abc.MetaPathFinder):
    """Installed by ``to_log``: a top-level module imported for the first time (``torch``,
    ``vllm``; not kvbench's own) runs its top-level code, and so everything it imports, with
    ``sys.stdout``/``sys.stderr`` on descriptors 1 and 2 (``sys.__stdout__``, ``sys.__stderr__``),
    which point at the log while the block lasts. It finds nothing itself: it asks the finders
    after it and wraps the loader of what they find for the one call."""

    def __init__(self) -> None:
        self._finding = False

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if path is not None or self._finding or fullname.partition(".")[0] == "kvbench":
            return None  # a submodule (its package's import covers it), or kvbench's: found as usual
        self._finding = True
        try:
            spec = None
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None)
                if finder is not self and find is not None:
                    spec = find(fullname, path, target)
                    if spec is not None:
                        break
        finally:
            self._finding = False
        if spec is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _LoaderToLog(spec.loader)
        return spec


class _LoaderToLog:
    """A module's own loader, its ``exec_module`` run with ``sys.stdout``/``sys.stderr`` on the
    process's descriptors 1 and 2; the module's ``__loader__`` is its own loader again after."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        saved = sys.stdout, sys.stderr
        if sys.__stdout__ is not None and sys.__stderr__ is not None:
            sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
        try:
            self._loader.exec_module(module)
        finally:
            sys.stdout, sys.stderr = saved
            module.__loader__ = self._loader
            if module.__spec__ is not None:
                module.__spec__.loader = self._loader

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)
