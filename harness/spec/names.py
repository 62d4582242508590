"""Names that become paths: a suite's name names its default results directory.

Text from a suite file must never choose where kvbench writes outside the
directory the user chose, nor put on the user's terminal or file listings what
does not read as it is (a control character, a right-to-left override, a line
separator), so a name that becomes a path component is held to a conservative
set: ASCII letters, digits and ``._-+``, starting with a letter or digit (so
never ``.``/``..`` or dot-prefixed, as kvbench's own temporary and lock files
are), and short enough for every filesystem. Workload names, runner overrides
and reference labels never reach the file system (workload files are named by
their content hash), so they are not restricted.
"""

from __future__ import annotations

import string

from ..errors import KvbenchError

# Filesystems cap a component at 255 bytes (beyond it: "File name too long" at the first
# write); a suite name a third of that long is already a mistake, not a name.
MAX_NAME_BYTES = 100
NAME_FIRST = frozenset(string.ascii_letters + string.digits)
NAME_CHARS = NAME_FIRST | frozenset("._-+")
ALLOWED = "ASCII letters, digits and . _ - +, starting with a letter or digit"


def path_component(name: str, what: str) -> str:
    """``name`` if it is safe as one path component; else a one-line error saying why."""
    problem = _problem(name)
    if problem:
        shown = ascii(name if len(name) <= 60 else name[:57] + "...")  # escaped: never raw on a terminal
        raise KvbenchError(f"{what} {shown} cannot name a results directory: {problem}")
    return name


def _problem(name: str) -> str | None:
    if not name:
        return "it is empty"
    bad = next((c for c in name if c not in NAME_CHARS), None)
    if bad is not None:
        return f"it holds {ascii(bad)}, which a name cannot (allowed: {ALLOWED})"
    if name[0] not in NAME_FIRST:
        return f"it starts with {name[0]!r} (allowed: {ALLOWED})"
    if len(name) > MAX_NAME_BYTES:  # ASCII only by now: one byte a character
        return f"it is {len(name)} bytes long (at most {MAX_NAME_BYTES})"
    return None
