"""Reading the user's input files: regular files only, of a bounded size, as UTF-8.

A path naming a device (``/dev/zero`` never ends), a FIFO (opening it waits for a writer)
or a directory is a mistake, not an input; so is a file far larger than its kind can be.
Both are refused with one line before anything is read. A missing file is left to the
caller (``FileNotFoundError`` propagates), which knows where such a file comes from.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import KvbenchError, os_cause

MIB = 2**20
GIB = 2**30
# A suite is a page of settings; a megabyte of TOML is not one.
MAX_SUITE_BYTES = 1 * MIB


def kind(mode: int) -> str:
    """What a file system entry is, in words, from its ``st_mode``."""
    for test, name in (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "a special file"


def check_regular_input(path: str | Path, what: str, cap_bytes: int, where: str | None = None) -> int:
    """The size of ``path`` if it is a regular file of at most ``cap_bytes``; else a one-line error
    (starting with ``where``, the path by default). For files another library opens (pandas,
    pyarrow): they must never be handed a device or a FIFO."""
    where = where or str(path)
    try:
        st = os.stat(path)  # stat, unlike open, never blocks on a FIFO
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        raise KvbenchError(f"{where}: cannot read {what} ({_cause(exc)})") from None
    _check_stat(where, st, what, cap_bytes)
    return st.st_size


def read_bytes_capped(path: str | Path, what: str, cap_bytes: int, where: str | None = None) -> bytes:
    """The bytes of a regular file of at most ``cap_bytes``; a one-line error otherwise."""
    where = where or str(path)
    check_regular_input(path, what, cap_bytes, where)
    try:
        # O_NONBLOCK: were the path swapped for a FIFO since the check, open still returns.
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise KvbenchError(f"{where}: cannot read {what} ({_cause(exc)})") from None
    with os.fdopen(fd, "rb") as fh:
        try:
            _check_stat(where, os.fstat(fd), what, cap_bytes)  # the file opened, not the one stat-ed
            data = fh.read(cap_bytes + 1)  # + 1: a file that grew past the cap is still caught
        except OSError as exc:
            raise KvbenchError(f"{where}: cannot read {what} ({_cause(exc)})") from None
    if len(data) > cap_bytes:
        raise KvbenchError(f"{where}: is more than the {cap_bytes:,}-byte limit for {_a(what)}")
    return data


def read_text_capped(path: str | Path, what: str, cap_bytes: int, where: str | None = None) -> str:
    """The UTF-8 text of a regular file of at most ``cap_bytes``, whatever the locale."""
    where = where or str(path)
    return decode_utf8(read_bytes_capped(path, what, cap_bytes, where), where, what)


def decode_utf8(data: bytes, where: str, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise KvbenchError(
            f"{where}: {what} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start:,})"
        ) from None


def _check_stat(where: str, st: os.stat_result, what: str, cap_bytes: int) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise KvbenchError(f"{where}: is {kind(st.st_mode)}, not a regular file: {_a(what)} must be a regular file")
    if st.st_size > cap_bytes:
        raise KvbenchError(f"{where}: is {st.st_size:,} bytes, more than the {cap_bytes:,}-byte limit for {_a(what)}")


def _a(what: str) -> str:
    return ("an " if what[:1].lower() in "aeiou" else "a ") + what


def _cause(exc: BaseException) -> str:
    return os_cause(exc) if isinstance(exc, OSError) else str(exc)
