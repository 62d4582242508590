"""Writing a file or a folder whole: a temporary made exclusively beside the target, renamed over it.

Every file kvbench writes goes through ``replace_file`` (or ``write_bytes``): the target is
checked first (``safe_paths.output_file``: absent or a regular file, never a link, a FIFO, a
device, a socket or a folder), the content goes to a temporary file that ``tempfile.mkstemp``
creates in the target's folder under a random name with ``O_CREAT | O_EXCL | O_NOFOLLOW``, and
the temporary file is renamed over the target. So a reader sees the old file or the whole new
one, a write that fails leaves neither half a file nor the temporary one, and a link planted at
any name kvbench might use is never followed: an existing name makes the exclusive create fail
and another random name is drawn. Temporary folders (a run's partitions, a report) are made the
same way by ``temp_folder`` (``tempfile.mkdtemp``: ``mkdir`` fails on any existing name).

Temporary names start with a dot and end in ``.tmp`` (files) or carry the prefix the caller
gives (folders), so ``store.clean_stale_temps`` can find what a killed process left.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from ..errors import StorageError, os_cause
from .safe_paths import output_file


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def replace_file(path: Path, what: str) -> Iterator[IO[bytes]]:
    """A binary file to write ``path``'s new content into; on leaving the block without an error
    it replaces ``path`` whole. ``what`` names the file in a refusal (``--out``, ``workload``).
    The folder must exist. Refused before anything is created: a target that is not absent or a
    regular file. A write the environment refuses is a ``StorageError`` naming ``path``."""
    output_file(path, what)
    tmp: str | None = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise StorageError(f"{path}: cannot write ({os_cause(exc)})") from None
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; kvbench's files are as readable as any
        with os.fdopen(fd, "wb") as fh:
            yield fh
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise StorageError(f"{path}: cannot write ({os_cause(exc)})") from None
    finally:  # an error or an interrupt: the temporary file goes too
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def write_bytes(path: Path, data: bytes, what: str) -> None:
    """``path`` replaced whole by ``data`` (``replace_file``)."""
    with replace_file(path, what) as fh:
        fh.write(data)


def temp_folder(parent: Path, prefix: str) -> Path:
    """A new, empty folder in ``parent`` under ``prefix`` + a random suffix, made exclusively."""
    try:
        folder = tempfile.mkdtemp(prefix=prefix, dir=parent)
        os.chmod(folder, 0o777 & ~_umask())  # mkdtemp makes 0700; records are as readable as any folder
        return Path(folder)
    except OSError as exc:
        raise StorageError(f"{parent}: cannot create a folder ({os_cause(exc)})") from None
