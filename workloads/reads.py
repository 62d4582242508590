"""Which settings of a ``WorkloadSpec`` building its workload reads.

A suite's workload keys are used or refused by what the build reads (``app.key_use``), so
no list of "the keys of source X" is kept apart from the code that reads them: the build runs
on a ``ReadingSpec``, which notes every field read, a property's own reads included.
``readers`` asks the same of a small workload of every other source, arrival and length
family, to say where a key that one workload does not read belongs.
"""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path
from typing import Any, cast

from ..harness.spec.workload_spec import (
    ARRIVALS,
    FIELD_KINDS,
    FILE_SOURCES,
    LENGTH_FAMILIES,
    RATE_ARRIVALS,
    SOURCES,
    WorkloadSpec,
)
from .build import build_workload
from .table import Workload


class ReadingSpec:
    """A ``WorkloadSpec`` seen through: each field read is added to ``read``. A property runs
    on the view, so the fields it reads are noted too; a method (``to_json``, ``replace``) runs
    on the spec itself: identity is not use."""

    __slots__ = ("_spec", "read")

    def __init__(self, spec: WorkloadSpec) -> None:
        self._spec = spec
        self.read: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        found = getattr(type(self._spec), name, None)
        if isinstance(found, property) and found.fget is not None:
            return found.fget(self)
        if name in FIELD_KINDS:
            self.read.add(name)
        return getattr(self._spec, name)


def build_noting_reads(spec: WorkloadSpec, max_model_len: int | None = None) -> tuple[Workload, frozenset[str]]:
    """``build_workload(spec, max_model_len)`` and the fields of ``spec`` it read."""
    view = ReadingSpec(spec)
    workload = build_workload(cast(WorkloadSpec, view), max_model_len)
    return workload, frozenset(view.read)


Kind = tuple[str, str, str]  # (source, arrival, lengths): what decides which fields a build reads


@functools.cache
def reads_by_kind() -> dict[Kind, frozenset[str]]:
    """The fields a small workload of every valid (source, arrival, lengths) reads (lengths only
    varied for ``sessions``, the one source that reads it). File sources read a one-request
    file of their form, written to a temporary folder."""
    found: dict[Kind, frozenset[str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        files = _probe_files(Path(tmp))
        for source in SOURCES:
            for arrival in ARRIVALS:
                for lengths in LENGTH_FAMILIES if source == "sessions" else ("fixed",):
                    try:
                        _, read = build_noting_reads(WorkloadSpec(**kind_settings((source, arrival, lengths), files)))
                    except Exception:  # a combination the spec or the build refuses: no reader
                        continue
                    found[(source, arrival, lengths)] = read
    return found


def kind_settings(kind: Kind, files: dict[str, str], requests: int = 2) -> dict[str, Any]:
    """Settings of a small workload of ``kind``: ``requests`` requests (or conversations of two
    turns), a rate where the arrival needs one, and the file of ``files`` for a file source."""
    source, arrival, lengths = kind
    settings: dict[str, Any] = {"source": source, "arrival": arrival, "lengths": lengths}
    settings.update(num_requests=requests, num_sessions=requests, turns=2)
    if arrival in RATE_ARRIVALS:
        settings["rate"] = 1.0
    if source in FILE_SOURCES:
        settings["path"] = files[source]
    return settings


def _probe_files(tmp: Path) -> dict[str, str]:
    trace = tmp / "probe.jsonl"
    trace.write_text(json.dumps({"timestamp": 0, "input_length": 8, "output_length": 4, "hash_ids": [0]}) + "\n")
    sharegpt = tmp / "probe.json"
    turns = [{"from": "human", "value": "a b c d"}, {"from": "gpt", "value": "e f"}]
    sharegpt.write_text(json.dumps([{"id": "0", "conversations": turns}]))
    return {"trace": str(trace), "sharegpt-json": str(sharegpt)}


def readers(key: str, kind: Kind) -> dict[str, tuple[str, ...]]:
    """Where ``key`` is read, beside ``kind``, one setting varied at a time: the other sources
    (same arrival), the other arrivals (same source and lengths) and the other length families
    (same source and arrival) whose workloads read it. Empty where none does."""
    source, arrival, lengths = kind
    table = reads_by_kind()
    return {
        "source": tuple(
            dict.fromkeys(s for (s, a, _), r in table.items() if a == arrival and s != source and key in r)
        ),
        "arrival": tuple(
            a for (s, a, fam), r in table.items() if (s, fam) == (source, lengths) and a != arrival and key in r
        ),
        "lengths": tuple(
            fam for (s, a, fam), r in table.items() if (s, a) == (source, arrival) and fam != lengths and key in r
        ),
    }
