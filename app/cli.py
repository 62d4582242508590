"""The ``kvbench`` command line.

Each subcommand lives in the module that owns its work; that module exposes
``register(subparsers)``, which adds its parser and sets ``func`` (a callable
taking the parsed ``argparse.Namespace`` and returning an exit code). This
file only wires them together, turns ``KvbenchError`` into one line on
stderr, and turns SIGTERM into the same clean stop as Ctrl-C (exit 128 + signal).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import NoReturn, Sequence

from ..harness import __version__
from ..harness.errors import KvbenchError, one_line
from .signals import sigterm_as_interrupt

# Modules that register subcommands (relative to this package), in help order. Importing them must stay
# cheap: heavy imports (torch, vllm) happen inside the command functions.
COMMAND_MODULES: dict[str, tuple[str, ...]] = {
    ".run_cmd": ("run",),
    ".calc": ("calc",),
    "..workloads.commands": ("workload",),
    "..reports.commands": ("report", "compare"),
    "..reports.diverge_cmd": ("diverge",),
    "..reports.calibrate_cmd": ("calibrate",),
    ".fit_roofline": ("fit-roofline",),
    ".doctor": ("doctor",),
}


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (and exit 2), like every other error."""

    def error(self, message: str) -> "NoReturn":
        self.exit(2, f"{self.prog}: error: {one_line(message)}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="kvbench",
        description="Measure what paged KV allocation changes against contiguous allocation, on the same work.",
    )
    parser.add_argument("--version", action="version", version=f"kvbench {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name, __package__).register(subparsers)
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
        message = getattr(exc, "message", None) or f"interrupted by {getattr(exc, 'signal_name', 'SIGINT')}"
        print(f"{command}: {one_line(message)}", file=sys.stderr)
        return getattr(exc, "exit_code", 130)
    except BrokenPipeError:
        return 0


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
