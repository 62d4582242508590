"""What "the same work" and "the same cell" mean, said once (docs/design.md, "The one rule").

Run ids (``specs.RunSpec.run_id``), ``kvbench compare``'s matching, the report's comparison
groups and ``kvbench diverge``'s check all read these keys, so that they cannot drift apart:

- **work** (``WORK``): what every comparison holds fixed; runs that share it form one
  comparison group of the report;
- **cell** (``CELL``): on top of the work, what one comparison varies; runs that share work and
  cell are repetitions of one cell;
- **run** (``RUN``): the cell plus the repetition index: what a run id hashes.

Keys name run-row columns (``scheduler`` and ``page_bytes`` are derived from ``spec_json`` by
``reports.labels.with_keys``). Some keys count only where they mean something (``applies``),
and a key added after run ids were first written counts only away from its default
(``DEFAULTS``), so that every earlier run id stays the same; ``key_value`` says what a key is to
identity (None: not counted). Spec and row see a few keys differently, on purpose (the design
doc says which).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from .capabilities import DEVICE_RUNNERS, PAGE_SIZED_POLICIES, is_contiguous


@dataclasses.dataclass(frozen=True)
class Key:
    column: str  # the run-row column (or derived column) holding it
    label: str  # what a sentence calls it


WORK: tuple[Key, ...] = (
    Key("workload_id", "workload"),
    Key("kv_dtype", "KV precision"),
    Key("budget_bytes", "KV budget"),
    Key("model", "model"),  # sets bytes per token, hence positions for the same budget
    Key("max_model_len", "max_model_len"),  # what contiguous-max reserves; which requests are dropped
    Key("scheduler", "scheduler settings"),
)
CELL: tuple[Key, ...] = (
    Key("runner", "runner"),
    Key("policy", "policy"),
    Key("block_size", "block size"),
    Key("device", "device"),
    Key("page_bytes", "page size"),
    Key("arena", "arena"),  # contiguous policies: first-fit or buddy placement
    Key("serve_url", "server"),  # the serve runner attached to a running server: another server is another run
    # vLLM's hybrid KV cache manager on or off: null (not counted) for a model whose layers are all
    # full attention, where it changes nothing.
    Key("hybrid_kv", "hybrid KV cache manager"),
    # A CPU tier of KV memory (vLLM's native KV offloading): its bytes (0: none) and its eviction
    # policy (null without a tier).
    Key("cpu_offload_bytes", "CPU tier"),
    Key("offload_policy", "CPU tier policy"),
)
REPEAT = Key("repeat", "repetition")  # in the run id (each repetition is a run), never in a cell
RUN: tuple[Key, ...] = (*WORK, *CELL, REPEAT)

WORK_COLUMNS: tuple[str, ...] = tuple(k.column for k in WORK)
CELL_COLUMNS: tuple[str, ...] = tuple(k.column for k in CELL)
LABELS: dict[str, str] = {k.column: k.label for k in RUN}


# Scheduler settings split by what they change: the timing settings price each step in
# seconds; the others (max_num_seqs, max_num_batched_tokens, preemption, max_stall_steps)
# change which request runs when. Both belong to the work (with timed arrivals a clock changes
# who is waiting at each step), but a report deliberately sets runs on different clocks beside
# each other (an engine's measured steps beside sim on a profile fitted to them), so only a
# scheduling difference is called "not the same work" out loud.
TIMING_SETTINGS: tuple[str, ...] = (
    "clock",
    "gpu",
    "clock_profile_digest",
    "clock_profile_content",
    "clock_profile_path",
    "roofline_scale",
)

# Scheduler settings added after run ids were first written, left out of the identity at their
# default (what every earlier run did), as ``DEFAULTS`` does for run keys.
SCHEDULER_DEFAULTS: dict[str, object] = {"roofline_scale": 1.0, "tensor_parallel_size": 1, "pipeline_parallel_size": 1}

# Scheduler settings that are checks, not settings: never part of the identity (``num_gpus``: the
# GPUs a cell may use, which tensor × pipeline parallel size must fit).
SCHEDULER_CHECKS: tuple[str, ...] = ("num_gpus",)

# Names a run id hashes a key under, where it differs from the row's column (the model's shapes
# are hashed as ``geometry``): a run id is what resume matches, so the names it hashes are fixed.
RUN_ID_NAMES: dict[str, str] = {"model": "geometry"}

# Keys added to the identity after run ids were first written: their default is what every
# earlier run did, so a key at its default is left out (the run id stays what it was).
DEFAULTS: dict[str, object] = {
    "arena": "first-fit",
    "serve_url": None,
    "hybrid_kv": None,
    "cpu_offload_bytes": 0,
    "offload_policy": None,
}

# Geometry fields added after run ids were first written (layer kinds, MLA's latent, a state),
# left out of the model's identity at their default: every layer full attention, as every
# earlier geometry was (as ``dataclasses.asdict`` spells them).
GEOMETRY_DEFAULTS: dict[str, object] = {"layers": (), "kv_lora_rank": 0, "qk_rope_head_dim": 0, "state": None}


def applies(column: str, runner: str, policy: str) -> bool:
    """Whether ``column`` is part of the identity of a run of ``runner`` with ``policy``."""
    if column == "device":
        return runner in DEVICE_RUNNERS
    if column == "page_bytes":
        return policy in PAGE_SIZED_POLICIES
    if column == "arena":
        return is_contiguous(policy)
    if column == "serve_url":
        return runner == "serve"
    return True


def counts(column: str, runner: str, policy: str, value: Any) -> bool:
    """Whether ``column`` holding ``value`` is part of the identity: it applies, and it is not
    a key at its default (``DEFAULTS``; a null there reads as the default: rows written
    before the key existed)."""
    if not applies(column, runner, policy):
        return False
    return column not in DEFAULTS or (value is not None and value == value and value != DEFAULTS[column])


def key_value(column: str, runner: str, policy: str, value: Any) -> Any:
    """The value of ``column`` as identity sees it: ``value`` where it counts, else None (so a
    row of a paged run, a first-fit run and a row from before the arena existed agree)."""
    return value if counts(column, runner, policy, value) else None


def run_canonical(values: Mapping[str, Any]) -> dict[str, Any]:
    """What a run id hashes, from a value for every ``RUN`` column (the keys that do not apply
    to the runner or policy, and those at their ``DEFAULTS`` value, are left out)."""
    missing = [k.column for k in RUN if k.column not in values]
    if missing:
        raise ValueError(f"run identity: no value for {', '.join(missing)}")
    runner, policy = str(values["runner"]), str(values["policy"])
    return {
        RUN_ID_NAMES.get(k.column, k.column): values[k.column]
        for k in RUN
        if counts(k.column, runner, policy, values[k.column])
    }


def geometry_identity(fields: Mapping[str, Any]) -> dict[str, Any]:
    """A model geometry's fields (``dataclasses.asdict``) as identity sees them: the fields of
    ``GEOMETRY_DEFAULTS`` left out where they hold their default."""
    return {k: v for k, v in fields.items() if not (k in GEOMETRY_DEFAULTS and v == GEOMETRY_DEFAULTS[k])}


def canonical_json(value: Any) -> str:
    """The one JSON spelling identities are compared and hashed in."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def digest(value: Any) -> str:
    """16 hex digits of sha256 over ``canonical_json(value)``: a run id."""
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()[:16]


def content_digest(text: str) -> str:
    """16 hex digits of sha256 over a text as it is (a recorded profile document)."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def scheduler_identity(settings: Mapping[str, Any], profile: Mapping[str, str]) -> dict[str, Any]:
    """The scheduler settings with the profile file's path replaced by what identifies its
    content (``profile``: e.g. ``{"clock_profile_digest": ...}``; empty when there is no profile):
    a recalibrated file at the same path is another clock, a copy at another path the same."""
    sched = {
        k: v
        for k, v in settings.items()
        if k != "clock_profile"
        and k not in SCHEDULER_CHECKS
        and not (k in SCHEDULER_DEFAULTS and v == SCHEDULER_DEFAULTS[k])
    }
    if settings.get("clock_profile") is not None:
        sched.update(profile)
    return sched


def scheduling_part(scheduler: Mapping[str, Any]) -> dict[str, Any]:
    """The scheduler identity without its timing settings (``TIMING_SETTINGS``): what decides
    which request runs when."""
    return {k: v for k, v in scheduler.items() if k not in TIMING_SETTINGS}
