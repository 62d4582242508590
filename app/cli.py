"""The ``kvbench`` command line.

Each subcommand is a module of ``app/commands`` exposing a ``Command``; ``add_command``
adds its parser and sets ``func`` (its ``run``: the parsed ``argparse.Namespace`` in, an
exit code out). This file only wires them together, turns ``KvbenchError`` into one line on
stderr, and turns SIGTERM into the same clean stop as Ctrl-C (exit 128 + signal).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from ..harness import __version__
from ..harness.errors import KvbenchError, one_line
from .commands import MODULES
from .commands.base import Command, OneLineParser, add_command
from .signals import sigterm_as_interrupt


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="kvbench",
        description="Measure what paged KV allocation changes against contiguous allocation, on the same work.",
    )
    parser.add_argument("--version", action="version", version=f"kvbench {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in MODULES:  # imported here, inside main's interrupt handling
        command: Command = importlib.import_module(f".commands.{name}", __package__).COMMAND
        add_command(subparsers, command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    command = "kvbench"
    try:
        # Parsing imports the command modules: an interrupt there is a clean stop too.
        with sigterm_as_interrupt():
            parser = build_parser()
            args = parser.parse_args(argv)
            command = f"kvbench {args.command}" if getattr(args, "command", None) else command
            if not getattr(args, "func", None):
                parser.print_help(sys.stderr)
                return 2
            return int(args.func(args) or 0)
    except KvbenchError as exc:
        print(f"{command}: error: {one_line(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM as harness.signals raises it
        return stopped(command, exc)
    except ImportError as exc:
        # An interrupt that lands inside an extension's import (numpy's, while the parser imports
        # the commands) surfaces as that import's ImportError: it is still the interrupt.
        interrupt = interrupt_inside(exc)
        if interrupt is None:
            raise
        return stopped(command, interrupt)
    except BrokenPipeError:
        return 0


def stopped(command: str, exc: KeyboardInterrupt) -> int:
    """Say in one line that a signal stopped ``command``; its exit code (128 + the signal)."""
    message = getattr(exc, "message", None) or f"interrupted by {getattr(exc, 'signal_name', 'SIGINT')}"
    print(f"{command}: {one_line(message)}", file=sys.stderr)
    return int(getattr(exc, "exit_code", 130))


def interrupt_inside(exc: BaseException) -> KeyboardInterrupt | None:
    """The interrupt an exception was raised while handling (its context or cause), if any."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        if isinstance(link, KeyboardInterrupt):
            return link
        seen.add(id(link))
        link = link.__cause__ or link.__context__
    return None


def entry() -> None:
    try:
        code = main()
    except KeyboardInterrupt:  # between main's handlers (a second Ctrl-C while reporting the first)
        code = 130
    if code >= 128:
        # Stopped by a signal, and cleaned up. Exit with the code said, now: an interrupt that
        # landed inside an extension's import can leave CPython's "unhandled Ctrl-C" flag set,
        # and a normal exit would then kill the process with SIGINT instead.
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
