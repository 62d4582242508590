"""User-facing errors.

Anything raised as a ``KvbenchError`` is printed by the CLI as one line on
stderr with a non-zero exit code; anything else is a bug and keeps its
traceback.
"""

from __future__ import annotations


class KvbenchError(Exception):
    """Bad input or an impossible request, explained in one line."""

    exit_code = 2


class InfeasibleError(KvbenchError):
    """The work cannot fit the KV budget under any allocation policy."""

    exit_code = 3


def one_line(message: str) -> str:
    """Collapse a message to a single line (errors must never span lines)."""
    return " ".join(str(message).split())
