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
import importlib.util
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
    for name, commands in COMMAND_MODULES.items():
        try:
            module = importlib.import_module(name, __package__)
        except ModuleNotFoundError as exc:
            if exc.name != importlib.util.resolve_name(name, __package__):
                raise
            for command in commands:  # not built yet: say so instead of pretending
                stub = subparsers.add_parser(command, help="(not built yet)")
                stub.add_argument("args", nargs=argparse.REMAINDER)
                stub.set_defaults(func=_not_built(command))
            continue
        module.register(subparsers)
    return parser


def _not_built(command: str):  # type: ignore[no-untyped-def]
    def run(args: argparse.Namespace) -> int:
        raise KvbenchError(f"'kvbench {command}' is not built yet in this version")

    return run


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        with sigterm_as_interrupt():
            return int(args.func(args) or 0)
    except KvbenchError as exc:
        print(f"kvbench {args.command}: error: {one_line(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM as harness.signals raises it
        message = getattr(exc, "message", None) or f"interrupted by {getattr(exc, 'signal_name', 'SIGINT')}"
        print(f"kvbench {args.command}: {one_line(message)}", file=sys.stderr)
        return getattr(exc, "exit_code", 130)
    except BrokenPipeError:
        return 0


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
