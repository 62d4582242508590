"""Suite files (TOML) → validated run specs, one per grid cell.

A suite's settings live in the tables ``[model]``, ``[memory]``,
``[workload]`` (or several named ``[workloads.NAME]``), ``[scheduler]``,
``[parallel]`` and ``[run]``; every key name is unique across them, so ``[grid]`` can vary any
of them by name (``rate = [1.0, 2.0]``, ``kv_dtype = ["fp16", "fp8"]``,
``policy = [...]``), ``together = [{...}, {...}]`` in ``[grid]`` is one axis whose
values are sets of settings that change together (a model with its GPU count,
budget and GPU preset), and ``[runners.NAME]`` can override any of them for
one runner (the torch runner on a tiny model, say). A list in ``[grid]``
expands to the cartesian product; a typo anywhere is an error naming the key.
Each ``[grids.NAME]`` is one more grid over the suite's tables, run beside ``[grid]``
(a few cells of another model, say); ``[grid]`` and ``[runners.NAME]`` do not apply to it.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..harness.errors import KvbenchError, one_line
from ..harness.files import MAX_SUITE_BYTES, read_text_capped
from ..harness.spec.capabilities import (
    CONTIGUOUS_UNITS,
    RUNNER_FACTS,
    RUNNER_NAMES,
    TOKEN_TIME_RUNNERS,
    contiguous_unit_default,
    is_contiguous,
)
from ..harness.spec.cpu_tier import parse_cpu_offload
from ..harness.spec.names import path_component
from ..harness.spec.specs import (
    ARENAS,
    GPU_CLOCKS,
    OFFLOAD_POLICIES,
    MemorySpec,
    ModelSpec,
    RunSpec,
    SchedulerSpec,
    check_arena,
    check_offload_policy,
)
from ..harness.spec.units import parse_size
from ..harness.spec.workload_spec import FIELD_KINDS, WorkloadSpec

if TYPE_CHECKING:
    from ..harness.records.slo import Slo

MODEL_KEYS = ("preset", "config", "kv_dtype", "hybrid_kv")
MEMORY_KEYS = ("kv_budget", "max_model_len", "cpu_offload", "offload_policy")
# [parallel]: held by SchedulerSpec (its identity is the scheduler's), written in a table of its own.
PARALLEL_KEYS = ("tensor_parallel_size", "pipeline_parallel_size", "num_gpus")
SCHEDULER_KEYS = tuple(f.name for f in dataclasses.fields(SchedulerSpec) if f.name not in PARALLEL_KEYS)
RUN_KEYS = ("runner", "policy", "block_size", "page_bytes", "arena", "contiguous_unit", "repeat", "device")
WORKLOAD_KEYS = tuple(FIELD_KINDS)
TABLE_KEYS: dict[str, tuple[str, ...]] = {
    "model": MODEL_KEYS,
    "memory": MEMORY_KEYS,
    "scheduler": SCHEDULER_KEYS,
    "parallel": PARALLEL_KEYS,
    "run": RUN_KEYS,
    "workload": WORKLOAD_KEYS,
}
# [runners.serve] only: what the serve runner reads (runners.serve.runner.ServeSettings checks the values).
SERVE_KEYS = ("url", "startup_timeout_s", "metrics_interval_s", "request_timeout_s")
ALL_KEYS = frozenset(
    MODEL_KEYS + MEMORY_KEYS + SCHEDULER_KEYS + PARALLEL_KEYS + RUN_KEYS + WORKLOAD_KEYS + ("workload",)
)
TOP_KEYS = (
    "name",
    "description",
    "optional_runners",
    "repeats",
    "model",
    "memory",
    "workload",
    "workloads",
    "scheduler",
    "parallel",
    "run",
    "grid",
    "grids",
    "runners",
    "reference",
    "slo",
)

DEFAULTS: dict[str, Any] = {"runner": "sim", "policy": "paged", "block_size": 16}
# The [grid] axis whose values are tables of settings that change together.
TOGETHER = "together"

# Repeats of every cell: enough for any spread estimate.
MAX_REPEATS = 1000
# Cells of one suite, counted before any is built: each builds a workload and writes a run;
# a grid this large is a typo (an extra list, a repeat count off by zeros), not a plan.
MAX_CELLS = 100_000


@dataclasses.dataclass(frozen=True)
class Suite:
    name: str
    path: str
    settings: Mapping[str, Any]  # flat: every table's keys
    workloads: Mapping[str, Mapping[str, Any]]  # name → [workload] table
    grid: Mapping[str, tuple[Any, ...]]
    runner_overrides: Mapping[str, Mapping[str, Any]]
    optional_runners: tuple[str, ...] = ()
    repeats: int = 1
    reference: tuple[Mapping[str, Any], ...] = ()
    slo: Slo | None = None  # [slo]: the latency bounds capacity and goodput are read against
    named_workloads: bool = False  # [workloads.NAME] tables, not one [workload]
    # [grids.NAME]: more grids over the suite's tables, each without [grid] and [runners.*].
    grids: Mapping[str, Mapping[str, tuple[Any, ...]]] = dataclasses.field(default_factory=dict)
    # The table each of ``settings`` was written in ("model", "scheduler", ...).
    setting_tables: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def grid_runners(self, grid: Mapping[str, tuple[Any, ...]]) -> tuple[str, ...]:
        return tuple(grid.get("runner", (self.settings.get("runner", DEFAULTS["runner"]),)))

    def runners(self) -> tuple[str, ...]:
        """The runners of every grid, [grid]'s first."""
        found = self.grid_runners(self.grid) + tuple(r for g in self.grids.values() for r in self.grid_runners(g))
        return tuple(dict.fromkeys(found))

    def plans(
        self,
    ) -> Iterator[tuple[str, Mapping[str, tuple[Any, ...]], Mapping[str, Mapping[str, Any]]]]:
        """Each grid, by its table's name, with the runner overrides that apply to it: [grid] with
        [runners.*], then every [grids.NAME] alone."""
        yield "grid", self.grid, self.runner_overrides
        for name, grid in self.grids.items():
            yield f"grids.{name}", grid, {}

    def cells(self) -> Iterator[tuple[RunSpec, str]]:
        """Every (spec, workload name) of the grids, validated, without duplicates."""
        seen: set[str] = set()
        for spec, name, _ in self.planned():
            ident = spec.to_json()
            if ident not in seen:
                seen.add(ident)
                yield spec, name

    def planned(self) -> Iterator[tuple[RunSpec, str, Mapping[str, str]]]:
        """Every cell of the grids, duplicates included, as (spec, workload name, given): ``given``
        names the table each setting the suite states for this cell was written in (``[grid]``,
        ``[runners.vllm]``, ``[workloads.chat]``, ...), for ``app.key_use``."""
        for table, plan, overrides in self.plans():
            yield from self._grid_cells(table, plan, overrides)

    def _grid_cells(
        self, table: str, plan: Mapping[str, tuple[Any, ...]], overrides: Mapping[str, Mapping[str, Any]]
    ) -> Iterator[tuple[RunSpec, str, Mapping[str, str]]]:
        for runner in self.grid_runners(plan):
            settings = dict(DEFAULTS)
            settings.update(self.settings)
            origin = {k: f"[{t}]" for k, t in self.setting_tables.items()}
            grid = {k: v for k, v in plan.items() if k != "runner"}
            origin.update({k: f"[{table}]" for k in grid if k not in (TOGETHER, "workload")})
            for key, value in overrides.get(runner, {}).items():
                if isinstance(value, list):
                    grid[key] = tuple(value)
                else:
                    grid.pop(key, None)
                    settings[key] = value
                if key != "workload":  # which workloads it runs: not a setting of them
                    origin[key] = f"[runners.{runner}]"
            if "workload" not in grid:  # a runner's one workload, else every workload
                grid["workload"] = (settings["workload"],) if "workload" in settings else tuple(self.workloads)
            if self.repeats > 1 and "repeat" not in grid:
                grid["repeat"] = tuple(range(self.repeats))
            keys = list(grid)
            for combo in itertools.product(*(grid[k] for k in keys)):
                cell = dict(settings, runner=runner, **dict(zip(keys, combo)))
                together = cell.pop(TOGETHER, {})
                cell.update(together)
                name = cell["workload"]
                wl_table = self.workloads[name]
                given = {k: self.workload_table(name) for k in wl_table}
                given.update(origin)
                given.update((k, f"[{table}] {TOGETHER}") for k in together)
                # A workload's own sweeps: a list in [workloads.NAME] (rate = [0.5, 1, 2]) is a grid
                # axis of that workload alone (each dataset has its own range of rates).
                own = {k: v for k, v in wl_table.items() if isinstance(v, list)}
                for values in itertools.product(*own.values()):
                    yield self._spec(dict(cell, **dict(zip(own, values))), overrides), name, given

    def workload_table(self, name: str) -> str:
        """How the suite spells workload ``name``'s table."""
        return f"[workloads.{name}]" if self.named_workloads else "[workload]"

    def _serve_clock(self, s: Mapping[str, Any], overrides: Mapping[str, Mapping[str, Any]]) -> str:
        """A serve cell's clock: ``measured``, whatever the suite's other runners run on; a clock
        of another kind given in [runners.serve] itself is refused."""
        if "clock" in overrides.get("serve", {}) and s.get("clock") != SERVE_CLOCK:
            raise KvbenchError(
                f"[runners.serve] clock = {s.get('clock')!r}: a served engine is timed for real, so the serve "
                f'runner runs on clock = "{SERVE_CLOCK}" only (its cells take it without being told)'
            )
        return SERVE_CLOCK

    def _spec(self, s: dict[str, Any], overrides: Mapping[str, Mapping[str, Any]]) -> RunSpec:
        where = self.path
        try:
            wl_table = dict(self.workloads[s["workload"]])
            # Workload keys in the cell come from [grid] or [runners.NAME]: they win.
            wl_table.update({k: s[k] for k in WORKLOAD_KEYS if k in s})
            workload = WorkloadSpec.from_mapping(wl_table, where=where, table=self.workload_table(s["workload"]))
            model = ModelSpec(
                preset=s.get("preset") if s.get("config") is None else None,
                config=s.get("config"),
                kv_dtype=s.get("kv_dtype", ModelSpec.kv_dtype),
            )
            cpu_offload = parse_cpu_offload(s.get("cpu_offload", 0))
            offload_policy = s.get("offload_policy", MemorySpec.offload_policy)
            check_offload_policy(offload_policy, "[memory]")  # a typo is an error whatever the cell's tier
            if not cpu_offload:
                # The eviction policy is the CPU tier's: without a tier it is ignored (the spec keeps
                # the default, so no duplicate cells).
                offload_policy = OFFLOAD_POLICIES[0]
            memory = MemorySpec(
                kv_budget_bytes=parse_size(s["kv_budget"], "[memory] kv_budget")
                if "kv_budget" in s
                else MemorySpec.kv_budget_bytes,
                max_model_len=s.get("max_model_len", MemorySpec.max_model_len),
                cpu_offload_bytes=cpu_offload,
                offload_policy=offload_policy,
            )
            sched = {k: s[k] for k in SCHEDULER_KEYS + PARALLEL_KEYS if k in s}
            if s["runner"] == "serve":
                sched["clock"] = self._serve_clock(s, overrides)
            if sched.get("clock", SchedulerSpec.clock) != "profile":
                # A suite-wide profile does not concern a runner on another clock (an engine
                # timing its own steps beside sim on the profile): not part of its spec.
                sched.pop("clock_profile", None)
            if sched.get("clock", SchedulerSpec.clock) not in GPU_CLOCKS and self.settings.get("clock") in GPU_CLOCKS:
                # Likewise a suite-wide roofline's factor, for a runner that overrides the clock
                # (without a roofline anywhere, SchedulerSpec refuses it: a misplaced setting).
                sched.pop("roofline_scale", None)
            profile = sched.get("clock_profile")
            if isinstance(profile, str) and profile and not Path(profile).is_absolute():
                # Relative to the suite file, so a suite and its profile travel together.
                sched["clock_profile"] = str(Path(where).resolve().parent / profile)
            scheduler = SchedulerSpec(**sched)
            policy = s["policy"]
            grouped = not model.geometry().is_uniform_full  # vLLM's KV cache groups
            block_size = contiguous_block_size(s["runner"], policy, s["block_size"], s.get("contiguous_unit"), grouped)
            page_bytes = parse_size(s.get("page_bytes", RunSpec.page_bytes), "page_bytes")
            arena = s.get("arena", RunSpec.arena)
            check_arena(arena, "cell")  # a typo is an error whatever the cell's policy
            if not (isinstance(policy, str) and is_contiguous(policy)):
                # The arena places contiguous reservations only: a suite-wide arena is ignored by
                # the other policies (their specs keep the default, so no duplicate cells).
                arena = ARENAS[0]
            spec = RunSpec(
                runner=s["runner"],
                policy=policy,
                block_size=block_size,
                model=model,
                memory=memory,
                workload=workload,
                scheduler=scheduler,
                page_bytes=page_bytes,
                arena=arena,
                hybrid_kv=s.get("hybrid_kv", True),
                repeat=s.get("repeat", 0),
                device=s.get("device", "auto"),
                suite=self.name,
                **{f"serve_{k}": s[k] for k in SERVE_KEYS if k in s and s["runner"] == "serve"},
            )
            if policy == "virtual-contiguous":
                from ..harness.sim.policies import page_tokens

                spec = spec.replace(block_size=page_tokens(spec))
            return spec
        except KvbenchError as exc:
            msg = str(exc)
            raise KvbenchError(msg if msg.startswith(where) else f"{where}: {msg}") from None
        except TypeError as exc:
            raise KvbenchError(f"{where}: wrong type in a setting ({exc})") from None


# A served engine is timed for real: its cells take this clock without being told.
SERVE_CLOCK = "measured"


def contiguous_block_size(runner: object, policy: object, block_size: Any, unit: object, grouped: bool = False) -> Any:
    """A cell's block size: a contiguous cell counts its reservation in positions (block size 1) or,
    with ``contiguous_unit = "block"`` (the only unit the vLLM runners host), in whole blocks. On a
    model of KV cache groups (``grouped``) a reservation is whole blocks of each group: the unit is
    "block" unless told, and "position" is refused."""
    if unit is not None and unit not in CONTIGUOUS_UNITS:
        raise KvbenchError(f"cell: unknown contiguous_unit {unit!r} (known: {', '.join(CONTIGUOUS_UNITS)})")
    if not (isinstance(policy, str) and is_contiguous(policy) and runner in RUNNER_FACTS):
        return block_size  # RunSpec names an unknown runner or policy
    assert isinstance(runner, str)
    if grouped:
        if unit == "position":
            raise KvbenchError(
                'a model of KV cache groups reserves whole blocks of each group (contiguous_unit = "block"), '
                "not token positions"
            )
        return block_size
    unit = unit or contiguous_unit_default(runner)
    if unit not in RUNNER_FACTS[runner].contiguous_units:
        raise KvbenchError(
            f'{runner} reserves contiguous memory in whole blocks only (contiguous_unit = "block"), '
            f"not in token positions"
        )
    return 1 if unit == "position" else block_size


# Settings other tools have that kvbench expresses otherwise: why the key is unknown.
NOT_SETTINGS: dict[str, str] = {
    "enable_prefix_caching": 'prefix caching is the policy "paged-prefix" (paged with prefix caching), not a '
    "setting: the contiguous policies hold no prefix cache",
}


def _check_keys(table: Mapping[str, Any], allowed: tuple[str, ...] | frozenset[str], where: str, name: str) -> None:
    for key in table:
        if key not in allowed:
            why = f"; {NOT_SETTINGS[key]}" if key in NOT_SETTINGS else ""
            raise KvbenchError(f"{where}: unknown key {key!r} in [{name}]{why} (known: {', '.join(sorted(allowed))})")


def _check_scalars(table: Mapping[str, Any], where: str, name: str) -> None:
    """A setting of [model], [memory], [scheduler], [parallel] or [run] is one value: a list there
    is refused, not swept (the axes are [grid]'s, [runners.NAME]'s and a workload table's own)."""
    for key, value in table.items():
        if isinstance(value, (list, dict)):
            kind = "a list" if isinstance(value, list) else "a table"
            raise KvbenchError(
                f"{where}: [{name}] {key} must be one value, not {kind} ({value!r}); to sweep it, "
                f"write {key} = [...] in [grid]"
            )


def _check_workload_names(values: Any, workloads: Mapping[str, Any], where: str, table: str) -> None:
    for v in values:
        if not isinstance(v, str) or v not in workloads:
            raise KvbenchError(f"{where}: {table} workload {v!r} is not defined (defined: {', '.join(workloads)})")


def _check_together(values: tuple[Any, ...], grid_table: Mapping[str, Any], where: str, name: str) -> None:
    """``[grid] together`` (or a ``[grids.NAME]``'s, ``name`` its table): tables of single settings
    (no lists, no runner or workload), none of them also an axis of that grid."""
    allowed = ALL_KEYS - {"runner", "workload"}
    for i, table in enumerate(values):
        if not isinstance(table, dict) or not table:
            raise KvbenchError(f"{where}: [{name}] {TOGETHER} #{i + 1} must be a table of settings, got {table!r}")
        for key in table:
            if key not in allowed:
                raise KvbenchError(
                    f"{where}: unknown key {key!r} in [{name}] {TOGETHER} #{i + 1} "
                    f"(known: {', '.join(sorted(allowed))})"
                )
        for key, value in table.items():
            if isinstance(value, list):
                raise KvbenchError(f"{where}: [{name}] {TOGETHER} #{i + 1}: {key} must be one value, not a list")
            if key in grid_table:
                raise KvbenchError(
                    f"{where}: {key} is set both in [{name}] {TOGETHER} and as a [{name}] axis: set it in one place"
                )


def _parse_grid(
    grid_table: Mapping[str, Any], workloads: Mapping[str, Any], where: str, name: str
) -> dict[str, tuple[Any, ...]]:
    """A ``[grid]`` table (or a ``[grids.NAME]``, ``name`` its table): every key an axis, one
    value an axis of one."""
    _check_keys(grid_table, ALL_KEYS | {TOGETHER}, where, name)
    grid: dict[str, tuple[Any, ...]] = {}
    for key, value in grid_table.items():
        values = tuple(value) if isinstance(value, list) else (value,)
        if not values:
            raise KvbenchError(f"{where}: [{name}] {key} is an empty list")
        if key == "workload":
            _check_workload_names(values, workloads, where, f"[{name}]")
        if key == TOGETHER:
            _check_together(values, grid_table, where, name)
        grid[key] = values
    return grid


def _parse_grids(
    doc: Mapping[str, Any], workloads: Mapping[str, Any], where: str
) -> dict[str, dict[str, tuple[Any, ...]]]:
    """``[grids.NAME]`` tables: grids beside ``[grid]``, each stating at least one setting."""
    grids: dict[str, dict[str, tuple[Any, ...]]] = {}
    for gname, table in _table(doc, "grids", where).items():
        if not isinstance(table, dict):
            raise KvbenchError(f"{where}: [grids.{gname}] must be a table")
        if not table:
            raise KvbenchError(
                f"{where}: [grids.{gname}] is empty: a grid beside [grid] states what its cells run "
                f"(runner, model, policy, ...)"
            )
        grids[gname] = _parse_grid(table, workloads, where, f"grids.{gname}")
    if "grids" in doc and not grids:
        raise KvbenchError(f"{where}: [grids] holds no grid (write [grids.NAME] tables)")
    return grids


def _table(doc: Mapping[str, Any], name: str, where: str) -> dict[str, Any]:
    value = doc.get(name, {})
    if not isinstance(value, dict):
        raise KvbenchError(f"{where}: [{name}] must be a table")
    return dict(value)


def parse_suite(text: str, where: str) -> Suite:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise KvbenchError(f"{where}: malformed TOML ({exc})") from None
    except (ValueError, RecursionError) as exc:  # a 5,000-digit number; arrays nested past the stack
        raise KvbenchError(f"{where}: malformed TOML ({one_line(str(exc)).split(';')[0]})") from None
    _check_keys(doc, TOP_KEYS, where, "top level")
    settings: dict[str, Any] = {}
    setting_tables: dict[str, str] = {}
    for name in ("model", "memory", "scheduler", "parallel", "run"):
        table = _table(doc, name, where)
        _check_keys(table, TABLE_KEYS[name], where, name)
        _check_scalars(table, where, name)
        settings.update(table)
        setting_tables.update(dict.fromkeys(table, name))
    if "workload" in doc and "workloads" in doc:
        raise KvbenchError(f"{where}: give either [workload] or [workloads.NAME] tables, not both")
    if "workloads" in doc:
        workloads = {}
        for wname, table in _table(doc, "workloads", where).items():
            if not isinstance(table, dict):
                raise KvbenchError(f"{where}: [workloads.{wname}] must be a table")
            _check_keys(table, WORKLOAD_KEYS, where, f"workloads.{wname}")
            for key, value in table.items():
                if isinstance(value, list) and not value:
                    raise KvbenchError(f"{where}: [workloads.{wname}] {key} is an empty list")
            workloads[wname] = table
        if not workloads:
            raise KvbenchError(f"{where}: [workloads] holds no workload")
    else:
        table = _table(doc, "workload", where)
        _check_keys(table, WORKLOAD_KEYS, where, "workload")
        workloads = {"default": table}
    base = Path(where).resolve().parent
    for table in workloads.values():
        # A relative trace path is read relative to the suite file when it exists there.
        path = table.get("path")
        if isinstance(path, str) and not Path(path).is_absolute() and (base / path).exists():
            table["path"] = str((base / path).resolve())
    grid = _parse_grid(_table(doc, "grid", where), workloads, where, "grid")
    grids = _parse_grids(doc, workloads, where)
    overrides: dict[str, dict[str, Any]] = {}
    for runner, table in _table(doc, "runners", where).items():
        if runner not in RUNNER_NAMES:
            raise KvbenchError(
                f"{where}: [runners.{runner}]: unknown runner {runner!r} (known: {', '.join(RUNNER_NAMES)})"
            )
        if not isinstance(table, dict):
            raise KvbenchError(f"{where}: [runners.{runner}] must be a table")
        _check_keys(
            table,
            (ALL_KEYS - {"runner"}) | (set(SERVE_KEYS) if runner == "serve" else set()),
            where,
            f"runners.{runner}",
        )
        for key, value in table.items():
            if isinstance(value, list) and not value:
                raise KvbenchError(f"{where}: [runners.{runner}] {key} is an empty list")
        if "workload" in table:
            value = table["workload"]
            _check_workload_names(
                value if isinstance(value, list) else [value], workloads, where, f"[runners.{runner}]"
            )
        overrides[runner] = table
    for wname, table in workloads.items():
        for key, value in table.items():
            if isinstance(value, list) and any(key in t for t in (grid, *overrides.values(), *grids.values())):
                raise KvbenchError(
                    f"{where}: {key} is swept both in [workloads.{wname}] and in [grid], [grids.*] or "
                    f"[runners.*]: sweep it in one place"
                )
    optional = doc.get("optional_runners", [])
    if not isinstance(optional, list) or not all(isinstance(r, str) and r in RUNNER_NAMES for r in optional):
        raise KvbenchError(
            f"{where}: optional_runners must be a list of runner names (known: "
            f"{', '.join(RUNNER_NAMES)}), got {optional!r}"
        )
    repeats = doc.get("repeats", 1)
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise KvbenchError(f"{where}: repeats must be a positive integer, got {repeats!r}")
    if repeats > MAX_REPEATS:
        raise KvbenchError(f"{where}: repeats = {repeats} is more than the limit of {MAX_REPEATS:,}")
    name = doc.get("name", Path(where).stem)
    if not isinstance(name, str) or not name:
        raise KvbenchError(f"{where}: name must be a non-empty string")
    # The name is the default results directory's last component: it must not be a path.
    path_component(name, f"{where}: name" if "name" in doc else f"{where}: name (from the file name; set name = ...)")
    suite = Suite(
        name=name,
        path=where,
        settings=settings,
        workloads=workloads,
        grid=grid,
        runner_overrides=overrides,
        optional_runners=tuple(optional),
        repeats=repeats,
        reference=_references(doc, where),
        slo=_slo(doc, where),
        named_workloads="workloads" in doc,
        grids=grids,
        setting_tables=setting_tables,
    )
    runs = suite.runners()
    for runner in runs:
        if runner not in RUNNER_NAMES:
            raise KvbenchError(f"{where}: unknown runner {runner!r} (known: {', '.join(RUNNER_NAMES)})")
    if suite.slo is not None and "itl" in suite.slo.metrics:
        blind = [r for r in dict.fromkeys(runs) if r not in TOKEN_TIME_RUNNERS]
        if blind:
            raise KvbenchError(
                f"{where}: [slo] bounds itl (the gaps between successive tokens), which runner {blind[0]} "
                f"cannot produce: it records no per-token times (runners that do: "
                f"{', '.join(TOKEN_TIME_RUNNERS) or 'none yet'})"
            )
    ruled = suite.grid_runners(suite.grid)  # [runners.*] apply to [grid]'s cells only
    for runner in overrides:
        if runner not in ruled:
            elsewhere = (
                "; [runners.*] apply to [grid]'s cells only: a [grids.NAME] states its own settings"
                if runner in runs
                else ""
            )
            raise KvbenchError(
                f"{where}: [runners.{runner}] configures runner {runner}, which [grid] does not "
                f"run (it runs: {', '.join(dict.fromkeys(ruled))}){elsewhere}"
            )
    cells = count_cells(suite)
    if cells > MAX_CELLS:
        raise KvbenchError(
            f"{where}: the grid expands to {_count(cells)} cells (runners x the lists of [grid], "
            f"[runners.*] and [workloads.*] x repeats), more than the limit of {MAX_CELLS:,}"
        )
    return suite


def count_cells(suite: Suite) -> int:
    """How many cells ``Suite.cells`` expands to, duplicates included, computed as it expands
    them but without expanding: per runner, the product of the lengths of its axes, with the
    workload axis weighted by each workload's own sweeps."""
    total = 0
    for _, plan, overrides in suite.plans():
        for runner in suite.grid_runners(plan):
            grid = {k: len(v) for k, v in plan.items() if k != "runner"}
            workloads = plan.get("workload")
            for key, value in overrides.get(runner, {}).items():
                if isinstance(value, list):
                    grid[key] = len(value)
                    if key == "workload":
                        workloads = tuple(value)
                else:
                    grid.pop(key, None)
                    if key == "workload":
                        workloads = (value,)
            if workloads is None:
                workloads = tuple(suite.workloads)
            grid.pop("workload", None)
            if suite.repeats > 1 and "repeat" not in grid:
                grid["repeat"] = suite.repeats
            sweeps = sum(
                math.prod(len(v) for v in suite.workloads[w].values() if isinstance(v, list)) for w in workloads
            )
            total += math.prod(grid.values()) * sweeps
    return total


def _count(n: int) -> str:
    """A count for one line: exact while short, else its order of magnitude."""
    return f"{n:,}" if n < 10**15 else f"about 10^{len(str(n)) - 1}"


def load_suite(path: str | Path) -> Suite:
    """A suite file, or a shipped suite by name (``paper-block-size``) when no such file exists.

    A regular file wins over a shipped suite's name; anything else by that name (the results
    directory ``kvbench run example --out example`` made) does not hide the shipped suite."""
    p = Path(path)
    shipped = shipped_suites()
    if str(path) in shipped and not p.is_file():
        p = shipped[str(path)]
    try:
        text = read_text_capped(p, "suite file", MAX_SUITE_BYTES)
    except FileNotFoundError:
        raise KvbenchError(f"{p}: no such suite file (shipped suites: {', '.join(sorted(shipped))})") from None
    return parse_suite(text, str(p))


def shipped_suites() -> dict[str, Path]:
    """The suites installed with kvbench, by name (the file name without .toml)."""
    return {p.stem: p for p in sorted(default_suite_path().parent.glob("*.toml"))}


def default_suite_path() -> Path:
    """The embedded default suite: package data of ``kvbench.suites``, in a clone and installed alike."""
    from .. import suites

    return Path(suites.__file__).resolve().parent / "default.toml"


# References and SLOs are read by modules that load pyarrow and pandas, so they are imported
# only for a suite that has them: a command line the parser refuses stays quick to refuse.
def _references(doc: Mapping[str, Any], where: str) -> tuple[dict[str, Any], ...]:
    if "reference" not in doc:
        return ()
    from ..harness.records.reference import parse_references

    return tuple(parse_references(doc["reference"], where))


def _slo(doc: Mapping[str, Any], where: str) -> Slo | None:
    if "slo" not in doc:
        return None
    from ..harness.records.slo import parse_slo

    return parse_slo(_table(doc, "slo", where), where)
