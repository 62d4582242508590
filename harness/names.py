"""Names that become paths: a suite's name names its default results directory.

Text from a suite file must never choose where kvbench writes outside the
directory the user chose, so a name that becomes a path component is refused
unless it is one plain component: no separator, no NUL or control character,
not ``.``/``..``, not dot-prefixed (kvbench's own temporary and lock files are),
and short enough for every filesystem. Workload names, runner overrides and
reference labels never reach the file system (workload files are named by their
content hash), so they are not restricted.
"""

from __future__ import annotations

from .errors import KvbenchError

# Filesystems cap a component at 255 bytes (beyond it: "File name too long" at the first
# write); a suite name a third of that long is already a mistake, not a name.
MAX_NAME_BYTES = 100


def path_component(name: str, what: str) -> str:
    """``name`` if it is safe as one path component; else a one-line error saying why."""
    problem = _problem(name)
    if problem:
        shown = name if len(name) <= 60 else name[:57] + "..."
        raise KvbenchError(f"{what} {shown!r} cannot name a results directory: {problem}")
    return name


def _problem(name: str) -> str | None:
    if not name:
        return "it is empty"
    if "\x00" in name:
        return "it holds a NUL character"
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return "it holds a control character"
    if "/" in name or "\\" in name:
        return "it holds a path separator ('/' or '\\'); give a plain name"
    if name in (".", ".."):
        return "it is a relative path"
    if name.startswith("."):
        return "it starts with '.' (kvbench's own temporary files do)"
    if name != name.strip():
        return "it starts or ends with whitespace"
    if len(name.encode("utf-8")) > MAX_NAME_BYTES:
        return f"it is {len(name.encode('utf-8'))} bytes long (at most {MAX_NAME_BYTES})"
    return None

