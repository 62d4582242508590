"""Workloads: request lengths, arrival times and prefix groups, and their files.

A workload is a table of requests (see ``workloads.table.COLUMNS``, and
``OPTIONAL_COLUMNS`` for hash-id traces and conversations) identified
by a content hash, ``workload_id``: the one thing every compared run must
share. Build one from a ``WorkloadSpec`` with ``build_workload``, store it with
``write_workload`` and load it with ``read_workload``; ``Content`` says which token
ids each request's prompt (and each conversation turn's answer) holds.

Importing this package stays cheap (no numpy/pandas) so the CLI can register
its parsers quickly; the heavy names are loaded on first use.
"""

from __future__ import annotations

from typing import Any

from ..harness.spec.workload_spec import ARRIVALS, SOURCES, WorkloadSpec

__all__ = [
    "ARRIVALS",
    "SOURCES",
    "COLUMNS",
    "OPTIONAL_COLUMNS",
    "Content",
    "Sessions",
    "Workload",
    "WorkloadSpec",
    "build_workload",
    "read_workload",
    "write_workload",
]

_LAZY = {
    "COLUMNS": ".table",
    "OPTIONAL_COLUMNS": ".table",
    "Sessions": ".table",
    "Content": ".content",
    "Workload": ".table",
    "read_workload": ".table",
    "write_workload": ".table",
    "build_workload": ".build",
}


def __getattr__(name: str) -> Any:
    # PEP 562 lazy attributes: numpy/pandas load only when a caller needs them.
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'workloads' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module, __name__), name)
