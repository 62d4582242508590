"""Other libraries' output during a run goes to a log file; the console shows kvbench's own lines.

vLLM, torch and their dependencies print while they import and run: Python warnings,
log records, and lines that C++ code writes straight to file descriptor 2 (torch's NUMA
binding notice). Within ``to_log(file)`` descriptors 1 and 2 point at ``file``, Python
warnings and log records are written there too, and ``sys.stdout``/``sys.stderr`` are
duplicates of the console's descriptors taken before, so every line kvbench prints (progress,
tables, its one-line errors) still reaches the console. A module imported for the first time
within the block (a package or any of its submodules, also one imported lazily long after its
package, as vLLM imports most of itself) runs its top-level code with ``sys.stdout``/``sys.stderr``
on descriptors 1 and 2 instead (``_ImportsToLog``): what a library prints as it imports, and the
logging handlers it makes then on ``sys.stderr``, go to the file as well. A handler that looks up
``sys.stderr`` each time it writes instead (torch 2.14's, which writes its deprecation warnings
and "No CUDA runtime is found") writes to the file while the block lasts (``_Handlers``).
``kvbench run`` keeps the file as ``DIR/kvbench.log``, from before its first import of a library
on (``Redirect.switch``: a temporary file first, copied into the log once the results directory
exists); with ``--verbose`` nothing is redirected.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.machinery
import inspect
import logging
import os
import shutil
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import IO, Any, TextIO

LOG_NAME = "kvbench.log"


@contextlib.contextmanager
def to_log(file: IO[bytes]) -> Iterator[Redirect]:
    """Send descriptors 1 and 2, Python warnings and log records to ``file`` (a binary file
    open for writing) within the block; kvbench's streams keep the console. The block's
    ``Redirect`` sends what follows to another file (``switch``)."""
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()  # type: ignore[union-attr]
    saved = (os.dup(1), os.dup(2))
    streams = (sys.stdout, sys.stderr)
    console = tuple(_console(stream, fd, copy) for stream, fd, copy in zip(streams, (1, 2), saved))
    redirect = Redirect(file)
    show = warnings.showwarning
    handler = redirect.handler
    root = logging.getLogger()
    # vLLM would otherwise give its loggers a handler of their own on the console's stdout.
    user_set = "VLLM_CONFIGURE_LOGGING" in os.environ
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    handlers = _Handlers(redirect, handler, [(s, fd) for s, fd, was in zip(console, (1, 2), streams) if s is not was])
    imports = _ImportsToLog(handlers.retarget)
    try:
        os.dup2(file.fileno(), 1)
        os.dup2(file.fileno(), 2)
        sys.stdout, sys.stderr = console
        warnings.showwarning = _to(redirect)
        root.addHandler(handler)
        handlers.retarget()  # those of libraries imported before the block
        sys.meta_path.insert(0, imports)
        yield redirect
    finally:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(imports)
        handlers.restore()
        if not user_set:
            os.environ.pop("VLLM_CONFIGURE_LOGGING", None)  # as it was before the block
        root.removeHandler(handler)
        warnings.showwarning = show
        for stream in (*console, redirect.log, sys.__stdout__, sys.__stderr__):
            with contextlib.suppress(OSError, ValueError, AttributeError):
                stream.flush()  # type: ignore[union-attr]
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        sys.stdout, sys.stderr = streams
        for stream in (*console, redirect.log):
            if stream not in streams:
                with contextlib.suppress(OSError, ValueError):
                    stream.close()
        for fd in saved:
            with contextlib.suppress(OSError):
                os.close(fd)


class Redirect:
    """A ``to_log`` block's file: ``log``, a text stream on it, and ``handler``, the root
    logger's handler that writes log records there."""

    def __init__(self, file: IO[bytes]) -> None:
        self.log = _log_stream(file)
        self.handler = _BestEffortHandler(self.log)
        self.handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))

    def switch(self, file: IO[bytes]) -> None:
        """From now on descriptors 1 and 2, warnings and log records go to ``file`` instead (the
        results directory's log, once the run has made it, with the first file's content copied
        in: ``open_results_log``). What ``sys.__stdout__`` holds unwritten goes to ``file``."""
        os.dup2(file.fileno(), 1)
        os.dup2(file.fileno(), 2)
        old, self.log = self.log, _log_stream(file)
        self.handler.setStream(self.log)
        with contextlib.suppress(OSError, ValueError):
            old.close()


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


def _log_stream(file: IO[bytes]) -> TextIO:
    """A text stream of its own on ``file`` (a duplicate of its descriptor), line by line."""
    return open(os.dup(file.fileno()), "w", encoding="utf-8", errors="backslashreplace", buffering=1)


class _BestEffortHandler(logging.StreamHandler[TextIO]):
    """The log is best effort: a record that cannot be written (a full disk) is dropped, never
    reported on the console, where it would break kvbench's one line."""

    def handleError(self, record: logging.LogRecord) -> None:
        pass


def _to(redirect: Redirect) -> Any:
    def showwarning(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        with contextlib.suppress(OSError, ValueError):  # best effort, as log records are
            redirect.log.write(warnings.formatwarning(message, category, filename, lineno, line))

    return showwarning


class _Handlers:
    """Libraries' logging handlers that would write to the console within a ``to_log`` block.

    ``retarget`` (when the block starts, and after each outermost import of a library) finds them
    among the handlers of every logger. One that looks up its stream each time it writes (a ``stream``
    property, as torch 2.14's ``_StderrHandler`` returns the current ``sys.stderr``: the console's,
    while the block lasts) writes its records to the block's log until ``restore``. One made on a
    console stream of the block (made while the block lasted, outside an import) is moved to
    the descriptor's own stream (``sys.__stderr__``), for good: that stream writes to the block's
    file now, to the console after, and the block's stream is closed when it ends."""

    def __init__(self, redirect: Redirect, own: logging.Handler, console: list[tuple[TextIO, int]]) -> None:
        self._redirect = redirect
        self._own = own
        self._console = console
        self._emits: dict[int, tuple[logging.Handler, Any]] = {}  # by id: a handler need not hash

    def retarget(self) -> None:
        loggers = [logging.getLogger(), *list(logging.Logger.manager.loggerDict.values())]
        for logger in loggers:
            for handler in list(getattr(logger, "handlers", ())):  # a PlaceHolder has none
                if handler is self._own or id(handler) in self._emits:
                    continue
                with contextlib.suppress(Exception):  # best effort: a handler it cannot read stays as it is
                    self._retarget(handler)

    def _retarget(self, handler: logging.Handler) -> None:
        if isinstance(inspect.getattr_static(handler, "stream", None), property):
            emit = functools.partial(self._emit, handler)
            handler.emit = emit  # type: ignore[method-assign]
            self._emits[id(handler)] = (handler, emit)
        elif isinstance(handler, logging.StreamHandler):
            fd = next((fd for stream, fd in self._console if handler.stream is stream), None)
            descriptor = {1: sys.__stdout__, 2: sys.__stderr__}.get(fd) if fd else None
            if descriptor is not None:
                handler.setStream(descriptor)

    def _emit(self, handler: logging.Handler, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):  # best effort, as log records are
            self._redirect.log.write(handler.format(record) + getattr(handler, "terminator", "\n"))

    def restore(self) -> None:
        for handler, emit in self._emits.values():
            if vars(handler).get("emit") is emit:
                del handler.emit
        self._emits.clear()


class _ImportsToLog(importlib.abc.MetaPathFinder):
    """Installed by ``to_log``: a module imported for the first time (``torch``, ``vllm``, any of
    their submodules; not kvbench's own) runs its top-level code, and so everything it imports,
    with ``sys.stdout``/``sys.stderr`` on descriptors 1 and 2 (``sys.__stdout__``,
    ``sys.__stderr__``), which point at the log while the block lasts. Submodules too: vLLM
    imports most of itself lazily (``vllm.ModelRegistry`` imports ``vllm.model_executor``, and torch
    modules that warn as they import) when kvbench first uses a name, after ``vllm`` itself is
    imported. It finds nothing itself: it asks the finders after it and wraps the loader of what
    they find for the one call. After each outermost such import, ``after`` runs (``_Handlers``)."""

    def __init__(self, after: Callable[[], None]) -> None:
        self._finding = False
        self.depth = 0  # wrapped imports under way (one inside another)
        self.after = after

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if self._finding or fullname.partition(".")[0] == "kvbench":
            return None  # kvbench's: found as usual
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
        spec.loader = _LoaderToLog(spec.loader, self)
        return spec


class _LoaderToLog:
    """A module's own loader, its ``exec_module`` run with ``sys.stdout``/``sys.stderr`` on the
    process's descriptors 1 and 2; the module's ``__loader__`` is its own loader from then on."""

    def __init__(self, loader: Any, finder: _ImportsToLog) -> None:
        self._loader = loader
        self._finder = finder

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # Its own loader first, before its code runs: what that code reads is the module's own,
        # and a module that turns itself into something else (torch's config modules refuse new
        # attributes once they are set up) is not touched after.
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        saved = sys.stdout, sys.stderr
        if sys.__stdout__ is not None and sys.__stderr__ is not None:
            sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
        self._finder.depth += 1
        try:
            self._loader.exec_module(module)
        finally:
            self._finder.depth -= 1
            sys.stdout, sys.stderr = saved
            if self._finder.depth == 0:
                with contextlib.suppress(Exception):  # best effort: never fails an import
                    self._finder.after()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)
