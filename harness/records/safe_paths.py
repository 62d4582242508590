"""Where kvbench may write, and what it may remove.

The rule: kvbench writes only regular files it creates inside the results
directory, or the one ``--out FILE`` the user named, which must be absent or a
regular file (never a device node, a FIFO, a folder or a symbolic link, which a
temporary-file-and-rename write would replace). It removes only what its own
records say it wrote, never through a symbolic link, and never a folder holding
files it did not write. The checks here refuse, in one line, before anything
is written.
"""

from __future__ import annotations

import argparse
import os
import stat
from pathlib import Path

from ..errors import KvbenchError
from ..files import kind

# The folders kvbench makes inside a results directory besides one per declared table (see
# ``own_folders``): the workloads a run saved (``workloads.table``) and the report.
OTHER_FOLDERS: tuple[str, ...] = ("workloads", "report")
# The single files it keeps at a results directory's top level.
OWN_FILES: tuple[str, ...] = ("reference.parquet", "slo.parquet", ".kvbench.lock", "kvbench.log")


def table_folders() -> tuple[str, ...]:
    """The folder of each declared table (``schema.TABLES``), each holding ``run_id=`` partitions:
    a table added there is guarded here with no edit."""
    from .schema import TABLES  # here, not at the top: every command imports this module, pyarrow is heavy

    return tuple(TABLES)


def own_folders() -> tuple[str, ...]:
    """Every folder kvbench makes inside a results directory: one per declared table, and
    ``OTHER_FOLDERS``. The one list the guards against links (and ``import``'s cleanup) use."""
    return (*table_folders(), *OTHER_FOLDERS)


def nonempty_text(text: str) -> str:
    """argparse ``type=`` for an argument naming a file or a shipped name (a suite, a model): an
    empty string names nothing (it is neither the current directory nor the default)."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path names nothing; give a file or directory name")
    return text


def nonempty_path(text: str) -> Path:
    """argparse ``type=`` for every path argument: an empty string is not the current directory."""
    return Path(nonempty_text(text))


def _mode(path: Path) -> int | None:
    """``path``'s ``st_mode``, not following a link; None when nothing is there."""
    try:
        return os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None  # absent (a parent that is not a folder is refused where it is made)
    except OSError as exc:
        raise KvbenchError(f"{path}: cannot inspect ({exc.strerror or exc})") from None


def output_file(path: Path, what: str) -> Path:
    """``path`` if kvbench may write the file there: absent, or a regular file (replaced whole).
    Refused: a symbolic link, a directory, a device node, a FIFO, a socket."""
    mode = _mode(path)
    if mode is not None and not stat.S_ISREG(mode):
        raise KvbenchError(
            f"{what} {path}: is {kind(mode)}; kvbench writes only regular files: "
            f"name a new file or an existing regular file"
        )
    return path


def own_folder(path: Path) -> None:
    """Refuse a folder of a results directory that kvbench would write into (or remove from)
    but that is not a real directory: a symbolic link would take its writes and removals
    into another directory."""
    mode = _mode(path)
    if mode is None or stat.S_ISDIR(mode):
        return
    if stat.S_ISLNK(mode):
        raise KvbenchError(
            f"{path}: is a symbolic link; kvbench writes and removes only inside real folders "
            f"of a results directory: replace the link with a folder or choose another --out"
        )
    raise KvbenchError(
        f"{path}: is {kind(mode)}, where kvbench keeps a folder of its records; move it away or choose another --out"
    )


def own_file(path: Path) -> None:
    """Refuse a top-level file kvbench rewrites (the lock, the log, the reference and SLO
    tables) that is not a regular file."""
    mode = _mode(path)
    if mode is not None and not stat.S_ISREG(mode):
        raise KvbenchError(
            f"{path}: is {kind(mode)}, where kvbench keeps a file of its own; move it away or choose another --out"
        )


def check_table(out: Path, table: str) -> None:
    """Before reading or writing ``table`` of ``out``: its folder is real (or absent) and none of
    its ``run_id=`` partitions is a symbolic link, so nothing is read from, written to or
    removed from another directory through one."""
    folder = out / table
    own_folder(folder)
    if not folder.is_dir():
        return
    try:
        entries = list(os.scandir(folder))
    except OSError as exc:
        raise KvbenchError(f"{folder}: cannot list ({exc.strerror or exc})") from None
    for entry in entries:
        if entry.name.startswith("run_id=") and entry.is_symlink():
            raise KvbenchError(
                f"{folder / entry.name}: is a symbolic link; kvbench reads, writes and removes "
                f"only partitions it made: move it away or choose another directory"
            )


def check_records(out: Path) -> None:
    """Before reading ``out``'s records: ``check_table`` for every declared table."""
    for table in table_folders():
        check_table(out, table)


def check_results_layout(out: Path) -> None:
    """Before writing ``out``: every folder and file kvbench keeps there is real (no symbolic
    link, no device), and so is every run partition of every table, so no write or removal
    leaves ``out``."""
    if not out.is_dir():
        return  # absent (created later), or not a directory (refused where it would be created)
    for name in own_folders():
        own_folder(out / name)
    for name in OWN_FILES:
        own_file(out / name)
    check_records(out)


def is_own_partition(path: Path, part: str) -> bool:
    """Whether ``path`` is a partition folder as kvbench writes one: a real directory holding
    the one regular file ``part`` (what may be removed as an orphan)."""
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return False
        entries = list(os.scandir(path))
    except OSError:
        return False
    return all(e.name == part and e.is_file(follow_symlinks=False) for e in entries)
