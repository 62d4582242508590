"""The report folder, ``DIR/report``: what kvbench wrote there, and when it may replace it.

A report is replaced whole by the next one. The folder may hold only what
kvbench wrote: a manifest (``.kvbench-report.json``) lists each file with its
SHA-256, and a folder holding anything else (a file of the user's, a file
changed since, a link, a subfolder) is refused in one line rather than deleted.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from ..harness.errors import KvbenchError, storage_error
from ..harness.records.atomic import temp_folder
from ..harness.records.safe_paths import own_folder

MANIFEST = ".kvbench-report.json"


def manifest_bytes(files: Mapping[str, bytes]) -> bytes:
    """The manifest of a report made of ``files`` (name → content)."""
    digests = {name: hashlib.sha256(data).hexdigest() for name, data in sorted(files.items())}
    return (json.dumps({"format": "kvbench-report", "files": digests}, indent=1) + "\n").encode("utf-8")


def foreign_entries(folder: Path) -> list[str]:
    """The entries of an existing report folder that kvbench did not write (or that changed
    since it wrote them), by name."""
    listed: dict[str, str] | None = None
    try:
        doc = json.loads((folder / MANIFEST).read_bytes().decode("utf-8"))
        files = doc.get("files") if isinstance(doc, dict) else None
        if isinstance(files, dict):
            listed = {str(k): str(v) for k, v in files.items()}
    except (OSError, ValueError):
        listed = None
    foreign = []
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        if entry.name == MANIFEST and listed is not None:
            continue
        if not entry.is_file(follow_symlinks=False) or listed is None:
            foreign.append(entry.name)
        elif listed.get(entry.name) != _sha256(Path(entry.path)):
            foreign.append(entry.name)
    return foreign


def check_replaceable(folder: Path) -> None:
    """Refuse, in one line, a report folder kvbench may not replace: a link, not a folder, or
    holding anything kvbench did not write."""
    own_folder(folder)
    if not folder.is_dir():
        return
    try:
        foreign = foreign_entries(folder)
    except OSError as exc:
        raise KvbenchError(f"{folder}: cannot list ({exc.strerror or exc})") from None
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise KvbenchError(
            f"{folder}: holds files kvbench did not write or that changed since ({shown}); "
            f"the report replaces this folder whole: move them away"
        )


def replace_report(tmp: Path, dest: Path) -> None:
    """Swap the finished report folder ``tmp`` in for ``dest``: the old one is moved aside, into a
    folder made for it under a random name (one ``harness.records.store.clean_stale_temps`` knows),
    before the new one takes its place, so an interrupt leaves one whole report, old or new."""
    check_replaceable(dest)
    aside = None
    if dest.is_dir():
        aside = temp_folder(dest.parent, ".report.tmp-old-")
        os.rename(dest, aside / dest.name)
    os.replace(tmp, dest)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def write_folder(dest: Path, files: Mapping[str, bytes], tmp_prefix: str) -> None:
    """``dest`` replaced whole by a folder holding ``files`` and their manifest. They are written
    into a new folder under a random name beside it (``tmp_prefix``; never a folder planted there)
    and swapped in (``replace_report``), so a full disk or an interrupt leaves the old folder or
    the new one, never half of one. Refused before anything is written: a ``dest`` kvbench may not
    replace (``check_replaceable``). A refused write is a ``StorageError`` naming the file."""
    check_replaceable(dest)
    everything = {**files, MANIFEST: manifest_bytes(files)}
    tmp = temp_folder(dest.parent, tmp_prefix)
    name = ""
    try:
        for name, data in everything.items():
            (tmp / name).write_bytes(data)
        name = ""
        replace_report(tmp, dest)
    except OSError as exc:
        raise storage_error(dest / name if name else dest, exc) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _sha256(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return ""
