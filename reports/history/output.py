"""What ``kvbench history`` writes: the page folder ``DIR/history/`` (replaced whole, as a report
is: ``report_files``) and the changes as JSON."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path

from ...harness.records.atomic import write_bytes
from ..compare import json_value
from ..report_files import write_folder
from .changes import Detection

PAGE_FOLDER = "history"


def write_page(root: Path, files: Mapping[str, bytes]) -> Path:
    """``root/history/`` holding ``files`` (and a manifest), swapped in whole; its index.html's path."""
    dest = root / PAGE_FOLDER
    write_folder(dest, files, ".history.tmp-")
    return dest / "index.html"


def changes_json(detection: Detection) -> str:
    """The changes as a JSON list, one object per change (``Change``'s fields; ``ratio`` is
    after ÷ before, null where it has none, such as a status change), each with
    ``regressed_tonight``: whether the gate counts it tonight."""
    tonight = {(r.cell_id, r.metric) for r in detection.regressed}
    rows = [
        {
            **{k: json_value(v) for k, v in asdict(c).items()},
            "commit_range": f"{c.previous_commit}..{c.commit}" if c.previous_commit else c.commit,
            "regressed_tonight": (c.cell_id, c.metric) in tonight,
        }
        for c in detection.changes
    ]
    return json.dumps(rows, indent=2, ensure_ascii=False) + "\n"


def write_json(path: Path, detection: Detection) -> None:
    write_bytes(path, changes_json(detection).encode("utf-8"), "--json")
