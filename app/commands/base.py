"""What a command module exposes (one ``Command``) and how the CLI adds it (``add_command``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from ...harness.errors import one_line


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (and exit 2), like every other error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {one_line(message)}\n")


@dataclass(frozen=True)
class Command:
    """One ``kvbench`` subcommand. ``configure`` adds its arguments; ``run`` does the work and
    returns the exit code. Heavy imports (pandas, torch, vllm) belong inside ``run``: the CLI
    imports every command to build its parser."""

    name: str
    help: str
    description: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def add_command(subparsers: argparse._SubParsersAction[Any], command: Command) -> None:
    parser = subparsers.add_parser(command.name, help=command.help, description=command.description)
    command.configure(parser)
    parser.set_defaults(func=command.run)
