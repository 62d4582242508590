"""The ``kvbench`` command line.

Each subcommand lives in the module that owns its work; that module exposes
``register(subparsers)``, which adds its parser and sets ``func`` (a callable
taking the parsed ``argparse.Namespace`` and returning an exit code). This
file only wires them together and turns ``KvbenchError`` into one line on
stderr.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

from harness import __version__
from harness.errors import KvbenchError, one_line

# Modules that register subcommands, in help order. Importing them must stay
# cheap: heavy imports (torch, vllm) happen inside the command functions.
COMMAND_MODULES: tuple[str, ...] = (
    "harness.run_cmd",
    "harness.calc",
    "workloads.commands",
    "reports.commands",
    "reports.diverge_cmd",
    "harness.doctor",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvbench",
        description="Measure what paged KV allocation changes against contiguous allocation, on the same work.",
    )
    parser.add_argument("--version", action="version", version=f"kvbench {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue  # a subcommand whose module is not built yet
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except KvbenchError as exc:
        print(f"kvbench {args.command}: error: {one_line(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"kvbench {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
