"""The workload spec: what to generate or read, validated on construction.

Pure Python on purpose (no numpy/pandas): the CLI builds its ``--flags`` from
``FIELD_KINDS`` at parser-registration time, which must stay cheap.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any

from ..errors import KvbenchError

SOURCES: tuple[str, ...] = (
    "fixed",
    "uniform",
    "lognormal",
    "sharegpt",
    "alpaca",
    "sharegpt-quantiles",
    "alpaca-quantiles",
    "trace",
    "sharegpt-json",
    "sessions",
)
# Length families a ``sessions`` workload draws its prompts, messages and answers from
# (``lengths``): the synthetic sources.
LENGTH_FAMILIES: tuple[str, ...] = (
    "fixed",
    "uniform",
    "lognormal",
    "sharegpt",
    "alpaca",
    "sharegpt-quantiles",
    "alpaca-quantiles",
)
# Sources whose requests come from a file (``path``); ``num_requests`` does not
# apply to them, ``limit`` does.
FILE_SOURCES: tuple[str, ...] = ("trace", "sharegpt-json")
ARRIVALS: tuple[str, ...] = ("batch", "poisson", "gamma", "trace")
RATE_ARRIVALS: tuple[str, ...] = ("poisson", "gamma")
# Requests in one workload: far beyond any benchmark (a day of a busy service at 100 req/s is
# 8.6 million), and small enough that the table of lengths and times fits in memory.
MAX_REQUESTS = 10_000_000

# Field name -> (kind, optional). Drives type checks in ``from_mapping`` and the
# CLI flags, so both accept exactly the same things.
FIELD_KINDS: dict[str, tuple[str, bool]] = {
    "source": ("str", False),
    "num_requests": ("int", False),
    "prompt_len": ("int", False),
    "output_len": ("int", False),
    "prompt_min": ("int", False),
    "prompt_max": ("int", False),
    "output_min": ("int", False),
    "output_max": ("int", False),
    "prompt_mean": ("float", False),
    "output_mean": ("float", False),
    "sigma": ("float", False),
    "path": ("str", True),
    "limit": ("int", True),
    "arrival": ("str", False),
    "rate": ("float", True),
    "duration_s": ("float", True),
    "cv": ("float", False),
    "time_scale": ("float", False),
    "prefix_groups": ("int", False),
    "prefix_len": ("int", False),
    "n": ("int", False),
    "seed": ("int", False),
    "max_prompt_len": ("int", True),
    "max_output_len": ("int", True),
    "hash_block_size": ("int", False),
    "num_sessions": ("int", False),
    "turns": ("int", False),
    "think_time_s": ("float", False),
    "lengths": ("str", False),
    "message_len": ("int", False),
    "message_min": ("int", False),
    "message_max": ("int", False),
    "message_mean": ("float", False),
}
# Fields added after workload files and records were first written: ``to_json`` leaves them
# out while they hold their defaults, so every earlier spec keeps its JSON byte for byte.
LATER_FIELDS: tuple[str, ...] = (
    "hash_block_size",
    "num_sessions",
    "turns",
    "think_time_s",
    "lengths",
    "message_len",
    "message_min",
    "message_max",
    "message_mean",
)

_KIND_WORDS = {"int": "an integer", "float": "a number", "str": "a string"}


def _kind_ok(kind: str, value: object) -> bool:
    # bool is an int subclass in Python; `num_requests = true` is a mistake, not 1.
    if isinstance(value, bool):
        return False
    if kind == "int":
        return isinstance(value, int)
    if kind == "float":
        return isinstance(value, (int, float))
    return isinstance(value, str)


@dataclasses.dataclass(frozen=True)
class WorkloadSpec:
    """Everything that determines a workload; the same spec always builds the same table
    (docs/workloads.md describes every field).

    Lengths: ``fixed``, ``uniform``, ``lognormal``, the ``sharegpt``/``alpaca`` lognormal fits,
    the ``sharegpt-quantiles``/``alpaca-quantiles`` tables, a ``trace`` file or ``sharegpt-json``
    at ``path`` (file sources take their request count from the file, first ``limit`` rows);
    ``max_prompt_len``/``max_output_len`` clamp lengths. Arrivals: ``batch`` (all at 0),
    ``poisson``/``gamma`` at ``rate`` req/s (gamma gaps with coefficient of variation ``cv``),
    ``trace`` (the file's own times × ``time_scale``). Prefix: ``prefix_groups`` groups sharing
    their first ``prefix_len`` tokens; ``n`` samples per request. Hash-id traces (Mooncake's
    JSONL form): each hash id stands for ``hash_block_size`` tokens. Conversations
    (``sessions``): ``num_sessions`` sessions of ``turns`` turns, each turn sent
    ``think_time_s`` after the previous answer ends, its prompt the whole conversation so far
    plus a new message (``message_*`` or the ``lengths`` family's prompt lengths).
    """

    source: str = "fixed"
    num_requests: int = 100
    prompt_len: int = 128
    output_len: int = 128
    prompt_min: int = 1
    prompt_max: int = 512
    output_min: int = 1
    output_max: int = 512
    prompt_mean: float = 256.0
    output_mean: float = 256.0
    sigma: float = 1.0
    path: str | None = None
    limit: int | None = None
    arrival: str = "batch"
    rate: float | None = None
    # With a rate: generate rate × duration_s requests (instead of num_requests), so that every
    # point of a rate sweep covers the same span of arrivals: an overloaded rate then shows its
    # growing queue alike at every rate, instead of a short run hiding it.
    duration_s: float | None = None
    cv: float = 1.0
    time_scale: float = 1.0
    prefix_groups: int = 0
    prefix_len: int = 0
    n: int = 1
    seed: int = 0
    max_prompt_len: int | None = None
    max_output_len: int | None = None
    hash_block_size: int = 512
    num_sessions: int = 16
    turns: int = 4
    think_time_s: float = 0.0
    lengths: str = "fixed"
    message_len: int = 64
    message_min: int = 1
    message_max: int = 128
    message_mean: float = 64.0

    def __post_init__(self) -> None:
        for name, (kind, optional) in FIELD_KINDS.items():
            value = getattr(self, name)
            if value is None and optional:
                continue
            if not _kind_ok(kind, value):
                raise KvbenchError(f"workload: {name} must be {_KIND_WORDS[kind]}, got {value!r}")
            if kind == "float":
                if not math.isfinite(value):
                    raise KvbenchError(f"workload: {name} must be finite, got {value!r}")
                # Normalise ints to floats so equal specs have equal JSON (1 vs 1.0).
                object.__setattr__(self, name, float(value))
        self._validate()

    def _validate(self) -> None:
        if self.source not in SOURCES:
            raise KvbenchError(f"workload: unknown source {self.source!r} (known: {', '.join(SOURCES)})")
        if self.arrival not in ARRIVALS:
            raise KvbenchError(f"workload: unknown arrival {self.arrival!r} (known: {', '.join(ARRIVALS)})")
        if self.lengths not in LENGTH_FAMILIES:
            raise KvbenchError(f"workload: unknown lengths {self.lengths!r} (known: {', '.join(LENGTH_FAMILIES)})")
        for name in (
            "num_requests",
            "prompt_len",
            "output_len",
            "prompt_min",
            "output_min",
            "n",
            "hash_block_size",
            "num_sessions",
            "turns",
            "message_len",
            "message_min",
        ):
            _at_least(name, getattr(self, name), 1)
        for name in ("limit", "max_prompt_len", "max_output_len"):
            if getattr(self, name) is not None:
                _at_least(name, getattr(self, name), 1)
        for name in ("prefix_groups", "prefix_len", "seed"):
            _at_least(name, getattr(self, name), 0)
        for name in ("num_requests", "limit", "num_sessions"):
            if getattr(self, name) is not None and getattr(self, name) > MAX_REQUESTS:
                raise KvbenchError(
                    f"workload: {name} = {getattr(self, name)} is more than the limit of "
                    f"{MAX_REQUESTS:,} requests in a workload"
                )
        if self.prompt_max < self.prompt_min:
            raise KvbenchError(f"workload: prompt_max ({self.prompt_max}) is below prompt_min ({self.prompt_min})")
        if self.output_max < self.output_min:
            raise KvbenchError(f"workload: output_max ({self.output_max}) is below output_min ({self.output_min})")
        if self.message_max < self.message_min:
            raise KvbenchError(f"workload: message_max ({self.message_max}) is below message_min ({self.message_min})")
        if self.think_time_s < 0:
            raise KvbenchError(f"workload: think_time_s must be >= 0, got {self.think_time_s!r}")
        for name in ("prompt_mean", "output_mean", "message_mean", "cv", "time_scale"):
            if getattr(self, name) <= 0:
                raise KvbenchError(f"workload: {name} must be > 0, got {getattr(self, name)!r}")
        if self.sigma < 0:
            raise KvbenchError(f"workload: sigma must be >= 0, got {self.sigma!r}")
        if self.source in FILE_SOURCES and not self.path:
            raise KvbenchError(f"workload: source {self.source!r} needs a path")
        # Parameters another source/arrival would use (path with source fixed, rate with
        # arrival batch) are valid in a spec: a suite's [grid] may vary source or arrival over
        # one shared [workload] table. A suite refuses a key that none of its cells' builds
        # reads (app.key_use); the content id ignores what a build does not read.
        if self.rate is not None and self.rate <= 0:
            raise KvbenchError(f"workload: rate must be > 0 (requests/s), got {self.rate!r}")
        if self.arrival in RATE_ARRIVALS and self.rate is None:
            raise KvbenchError(f"workload: arrival {self.arrival!r} needs rate > 0 (requests/s), got None")
        if self.duration_s is not None:
            if not self.duration_s > 0:
                raise KvbenchError(f"workload: duration_s must be > 0 (seconds of arrivals), got {self.duration_s!r}")
            if self.arrival not in RATE_ARRIVALS:
                raise KvbenchError(
                    f"workload: duration_s needs a rate arrival ({', '.join(RATE_ARRIVALS)}), not {self.arrival!r}"
                )
            if self.source in FILE_SOURCES:
                raise KvbenchError(
                    f"workload: duration_s sets how many requests to generate; source "
                    f"{self.source!r} reads them from a file (use limit)"
                )
            assert self.rate is not None  # a rate arrival has one (checked above)
            if self.rate * self.duration_s > MAX_REQUESTS:
                raise KvbenchError(
                    f"workload: rate * duration_s = {self.rate:g} * {self.duration_s:g} = "
                    f"{self.rate * self.duration_s:.4g} requests, more than the limit of "
                    f"{MAX_REQUESTS:,} requests in a workload"
                )
        if self.source == "sessions":
            self._validate_sessions()
        if self.arrival == "trace" and self.source != "trace":
            raise KvbenchError(f"workload: arrival 'trace' needs source 'trace' (timestamps), not {self.source!r}")
        if (self.prefix_groups > 0) != (self.prefix_len > 0):
            raise KvbenchError(
                f"workload: prefix_groups ({self.prefix_groups}) and prefix_len ({self.prefix_len}) "
                "must both be > 0 or both 0"
            )
        if self.source == "fixed" and self.prefix_len > 0 and self.prefix_len >= self.prompt_len:
            raise KvbenchError(
                f"workload: prefix_len ({self.prefix_len}) must be below prompt_len ({self.prompt_len}): every "
                "request needs a token of its own after the shared prefix"
            )
        if self.max_prompt_len is not None and self.prefix_len >= self.max_prompt_len:
            raise KvbenchError(
                f"workload: prefix_len ({self.prefix_len}) must be below max_prompt_len ({self.max_prompt_len})"
            )

    def _validate_sessions(self) -> None:
        if self.n != 1:
            raise KvbenchError(
                f"workload: source 'sessions' takes n = 1 (each turn is one conversation's next request), got {self.n}"
            )
        if self.prefix_groups > 0:
            raise KvbenchError(
                "workload: source 'sessions' shares each conversation's history already; "
                f"set prefix_groups = 0 (got {self.prefix_groups})"
            )
        if self.session_count * self.turns > MAX_REQUESTS:
            raise KvbenchError(
                f"workload: sessions * turns = {self.session_count} * {self.turns} is more than the limit of "
                f"{MAX_REQUESTS:,} requests in a workload"
            )

    @property
    def session_count(self) -> int:
        """Conversations a ``sessions`` source generates: ``num_sessions``, or ⌈rate × duration_s⌉."""
        if self.duration_s is not None and self.rate is not None:
            return max(1, math.ceil(self.rate * self.duration_s))
        return self.num_sessions

    @property
    def request_count(self) -> int:
        """Requests a synthetic source generates: ``num_requests``, or ⌈rate × duration_s⌉."""
        if self.duration_s is not None and self.rate is not None:
            return max(1, math.ceil(self.rate * self.duration_s))
        return self.num_requests

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any], where: str, table: str = "[workload]") -> WorkloadSpec:
        """A spec from a TOML ``[workload]`` table (or any mapping); errors name ``where`` and the
        ``table`` (``[workloads.NAME]`` in a suite of named workloads)."""
        known = ", ".join(FIELD_KINDS)
        for key in d:
            if key not in FIELD_KINDS:
                raise KvbenchError(f"{where}: unknown key {key!r} in {table} (known: {known})")
        for key, value in d.items():
            kind, optional = FIELD_KINDS[key]
            if value is None and optional:
                continue
            if not _kind_ok(kind, value):
                raise KvbenchError(f"{where}: {table} {key} must be {_KIND_WORDS[kind]}, got {value!r}")
        try:
            return cls(**dict(d))
        except KvbenchError as exc:
            message = str(exc).removeprefix("workload: ")
            raise KvbenchError(f"{where}: {table} {message}") from None

    @classmethod
    def from_json(cls, text: str, where: str) -> WorkloadSpec:
        """Inverse of ``to_json``."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise KvbenchError(f"{where}: malformed workload spec JSON at column {exc.colno}") from None
        if not isinstance(data, dict):
            raise KvbenchError(f"{where}: workload spec JSON must be an object")
        return cls.from_mapping(data, where)

    def to_json(self) -> str:
        """Canonical JSON: sorted keys, no whitespace; every field but a ``LATER_FIELDS`` one
        at its default (so a spec that uses none of them reads as it always did)."""
        data = dataclasses.asdict(self)
        for field in dataclasses.fields(self):
            if field.name in LATER_FIELDS and data[field.name] == field.default:
                del data[field.name]
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    def replace(self, **changes: Any) -> WorkloadSpec:
        return dataclasses.replace(self, **changes)


def _at_least(name: str, value: int, low: int) -> None:
    if value < low:
        raise KvbenchError(f"workload: {name} must be >= {low}, got {value!r}")
