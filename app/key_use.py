"""Every key of a suite is used or refused: a setting no cell reads is an error, not a no-op.

A key is used when at least one cell it was given to reads it. What a cell reads is derived,
not listed by source: a workload's keys are the fields its build read (``workloads.reads``);
a cell's other keys are all read but those that ``unread`` finds do not apply to its runner,
policy, clock or model, by the same rules its identity uses (``harness.spec.identity.applies``).
The refusal names the key, the table it was written in, what it belongs to and what the
cell reads instead.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..harness.errors import KvbenchError
from ..harness.spec import identity
from ..harness.spec.capabilities import DEVICE_RUNNERS, PAGE_SIZED_POLICIES, POLICY_FACTS, is_contiguous
from ..harness.spec.specs import GPU_CLOCKS, RunSpec
from ..harness.spec.workload_spec import FIELD_KINDS, WorkloadSpec


def unread(spec: RunSpec) -> dict[str, str]:
    """The suite keys outside the workload that ``spec``'s cell does not read, each with why."""
    runner, policy, clock = spec.runner, spec.policy, spec.scheduler.clock
    out: dict[str, str] = {}
    if not identity.applies("device", runner, policy):
        out["device"] = f"runner {runner} does not choose a device (runners that do: {', '.join(DEVICE_RUNNERS)})"
    if not identity.applies("page_bytes", runner, policy):
        out["page_bytes"] = (
            f"policy {policy} has no pages of bytes (policies that do: {', '.join(PAGE_SIZED_POLICIES)}); "
            f"it reads block_size"
        )
    if not is_contiguous(policy):
        contiguous = ", ".join(p for p in POLICY_FACTS if is_contiguous(p))
        for key in ("arena", "contiguous_unit"):
            out[key] = f"policy {policy} makes no contiguous reservation (policies that do: {contiguous})"
    if spec.geometry.is_uniform_full:
        model = spec.model.preset or spec.model.config
        out["hybrid_kv"] = (
            f"every layer of model {model} is full attention, where vLLM's hybrid KV cache manager changes "
            f"nothing (it is read for a model of sliding-window, MLA or state layers)"
        )
    if not spec.memory.cpu_offload_bytes:
        out["offload_policy"] = "the cell has no CPU tier (cpu_offload is 0), whose eviction policy it is"
    if clock not in GPU_CLOCKS:
        for key in ("gpu", "roofline_scale"):
            out[key] = f'clock "{clock}" does not price steps on a GPU (read with clock = "roofline" or "tables")'
    if clock != "profile":
        out["clock_profile"] = f'clock "{clock}" reads no profile (read with clock = "profile")'
    if runner == "serve" and spec.serve_url is not None:
        out["startup_timeout_s"] = "the serve runner attached to a running server (url) starts none to wait for"
    if spec.model.config is not None:
        out["preset"] = "the cell's model is its config, which is read instead of a preset"
    return out


def _workload_kind(spec: WorkloadSpec) -> tuple[str, str, str]:
    return spec.source, spec.arrival, spec.lengths if spec.source == "sessions" else "fixed"


class KeyUse:
    """Which (table, key) pairs a suite gave its cells, and whether any cell read each."""

    def __init__(self) -> None:
        # (table, key) not yet read by a cell it was given to: why the first such cell does not
        self._unused: dict[tuple[str, str], str] = {}
        self._used: set[tuple[str, str]] = set()

    def note(self, spec: RunSpec, given: Mapping[str, str], workload_read: frozenset[str]) -> None:
        """One cell: ``given`` maps each key the suite stated for it to its table; the cell reads
        ``workload_read`` of the workload's fields and every other key ``unread`` does not name."""
        other = unread(spec)
        for key, table in given.items():
            pair = (table, key)
            if pair in self._used:
                continue
            if key in FIELD_KINDS:
                why = None if key in workload_read else workload_key_why(key, spec.workload, workload_read)
            else:
                why = other.get(key)
            if why is None:
                self._used.add(pair)
                self._unused.pop(pair, None)
            elif pair not in self._unused:
                self._unused[pair] = why

    def check(self, where: str) -> None:
        """Refuse, in one line, the first key no cell read."""
        for (table, key), why in self._unused.items():
            raise KvbenchError(f"{where}: {table} {key} is not read by any cell: {why}")


def workload_key_why(key: str, spec: WorkloadSpec, read: frozenset[str]) -> str:
    """Why a workload of ``spec``'s kind does not read ``key``: whose key it is, and what this
    workload reads instead."""
    from ..workloads.reads import readers

    kind = _workload_kind(spec)
    source, arrival, lengths = kind
    where = readers(key, kind)
    subject = f'source "{source}"'
    if where["source"]:
        belongs = f"sources that do: {_names(where['source'])}"
    elif where["arrival"]:
        subject = f'arrival "{arrival}"'
        belongs = f"arrivals that do: {_names(where['arrival'])}"
    elif where["lengths"]:
        subject = f'lengths "{lengths}"'
        belongs = f"length families that do: {_names(where['lengths'])}"
    else:
        belongs = "no workload of this source and arrival reads it"
    stem = key.split("_")[0]
    related = [k for k in FIELD_KINDS if k in read and k.split("_")[0] == stem and k != key]
    instead = f"; it reads {' and '.join(related)} instead" if related else ""
    return f"{subject} does not read it ({belongs}){instead}"


def _names(values: tuple[str, ...]) -> str:
    return ", ".join(values)
