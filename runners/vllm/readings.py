"""What both vLLM runners read from a vLLM scheduler right after ``schedule()``, in kvbench's terms:
the step's decisions (``StepOut``), the allocation state (``Occupancy``), and the prefix cache's
evictions and reuse distances (``CacheWatcher``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from ...harness.spec.kv_shared_use import NULL_BLOCK, measure_shared
from ...harness.spec.kv_use import KVUse
from .contiguous import ContiguousReservations
from .grouped_contiguous import GroupedReservations


@dataclasses.dataclass
class StepOut:
    """What vLLM's ``schedule()`` decided, in kvbench's terms (keys are sequence indices)."""

    scheduled: list[tuple[int, int, int, int]]  # (seq index, new tokens, computed after step, blocks held)
    admitted: list[tuple[int, int]]  # (seq index, prefix-hit tokens at admission)
    preempted: list[int]
    scheduled_tokens: int
    handle: Any  # the SchedulerOutput, for ``execute``


@dataclasses.dataclass(frozen=True)
class Occupancy:
    """Allocation state after ``schedule()``, before the step's outputs are applied."""

    running: int
    waiting: int
    allocated_blocks: int
    computed_tokens: int  # Σ num_computed_tokens of running requests
    held_blocks: int  # Σ blocks per running request (shared blocks counted per holder)
    internal_positions: int  # Σ max(0, blocks × block_size − final length)
    external_positions: int | None = None  # contiguous: free positions in runs too short for the waiting head
    cached_free_blocks: int = 0  # free blocks still holding a content hash (prefix caching)
    # KV cache groups (harness.spec.kv_use): used positions measured by the layout (bytes-equivalent),
    # and each group's (real blocks, used bytes); None for a model of full attention only.
    used_positions: int | None = None
    groups: tuple[tuple[int, int], ...] | None = None


@dataclasses.dataclass(frozen=True)
class VllmStep:
    """One scheduler step of a vLLM runner, read at the simulator's sampling point.

    ``schedule`` and ``occupancy`` are read right after ``schedule()``;
    ``got``/``finished`` after the step's outputs are applied.
    """

    schedule: StepOut
    occupancy: Occupancy
    got: list[int]  # sequences that received a token
    finished: list[int]  # sequences that finished
    wall_s: float | None = None  # measured step time (the engine), None for the mocked model
    kv_bytes: int | None = None  # bytes of the allocated blocks in real KV tensors (the engine)


class CacheWatcher:
    """Watches a block pool with prefix caching: the cached blocks it evicts for reuse (vLLM
    counts them only with KV events on), and how long each cached free block a hit takes back
    had waited since its free (the reuse distance, in steps and seconds of kvbench's clock:
    ``now`` is moved at every step), as ``harness.sim.policies.paged.ReuseLedger`` does."""

    def __init__(self, pool: Any) -> None:
        self.count = 0
        self.now: tuple[int, float] = (0, 0.0)
        self.freed_at: dict[int, tuple[int, float]] = {}
        self.steps: list[int] = []
        self.seconds: list[float] = []
        evict, free, touch = pool._maybe_evict_cached_block, pool.free_blocks, pool.touch

        def counting(block: Any) -> bool:
            evicted = evict(block)
            if evicted:
                self.count += 1
                self.freed_at.pop(block.block_id, None)
            return evicted

        def freeing(ordered_blocks: Iterable[Any]) -> None:
            blocks = list(ordered_blocks)
            free(blocks)
            for b in blocks:
                if b.ref_cnt == 0 and b.block_hash is not None:
                    self.freed_at[b.block_id] = self.now

        def touching(blocks: Any) -> None:
            for b in blocks:
                if b.ref_cnt == 0 and b.block_id in self.freed_at:
                    step, t_s = self.freed_at.pop(b.block_id)
                    self.steps.append(self.now[0] - step)
                    self.seconds.append(self.now[1] - t_s)
            touch(blocks)

        pool._maybe_evict_cached_block = counting
        pool.free_blocks = freeing
        pool.touch = touching


def cached_free_block_count(pool: Any) -> int:
    """Free blocks still holding a content hash in vLLM's prefix cache (evictable, hit-able)."""
    if not pool.enable_caching:
        return 0
    free = 0
    for v in pool.cached_block_hash_to_block._cache.values():
        if isinstance(v, dict):
            free += sum(1 for b in v.values() if b.ref_cnt == 0)
        elif v.ref_cnt == 0:
            free += 1
    return free


def request_blocks(scheduler: Any) -> dict[str, list[Any]]:
    """The scheduler's request id -> blocks map (one KV cache group: kvbench's models have one)."""
    return scheduler.kv_cache_manager.coordinator.single_type_managers[0].req_to_blocks


class GroupTables(Mapping[str, list[Any]]):
    """Every KV cache group's block tables (each group manager's ``req_to_blocks``), read as one
    table per request holding its real blocks across groups (the null block left out)."""

    def __init__(self, scheduler: Any) -> None:
        self.tables: list[Mapping[str, list[Any]]] = [
            m.req_to_blocks for m in scheduler.kv_cache_manager.coordinator.single_type_managers
        ]

    def __getitem__(self, rid: str) -> list[Any]:
        if not any(rid in t for t in self.tables):
            raise KeyError(rid)
        return [b for t in self.tables for b in t.get(rid, ()) if not b.is_null]

    def __iter__(self) -> Iterator[str]:
        return iter({rid for t in self.tables for rid in t})

    def __len__(self) -> int:
        return len({rid for t in self.tables for rid in t})

    def lengths(self, rid: str) -> tuple[list[int], list[int]]:
        """Per group: the request's table length and its real blocks."""
        tables = [t.get(rid, ()) for t in self.tables]
        return [len(b) for b in tables], [sum(1 for x in b if not x.is_null) for b in tables]

    def ids(self, rid: str) -> list[list[int]]:
        """Per group: the request's block ids (the null block's is ``NULL_BLOCK``)."""
        return [[NULL_BLOCK if b.is_null else b.block_id for b in t.get(rid, ())] for t in self.tables]


def _external(
    scheduler: Any, waiting: int, reservations: ContiguousReservations | GroupedReservations | None
) -> int | None:
    """Contiguous reservations' external fragmentation for the waiting head; None for paging."""
    if reservations is None:
        return None
    return reservations.external_positions(next(iter(scheduler.waiting), None) if waiting else None)


def read_group_occupancy(
    scheduler: Any,
    tables: GroupTables,
    final_len: Mapping[str, int],
    use: KVUse,
    reservations: GroupedReservations | None = None,
) -> Occupancy:
    """The allocation state right after ``schedule()`` over KV cache groups: as ``read_occupancy``,
    with used and internal positions from the layout's one formula (``KVUse.measure``). A
    contiguous request's tables are its whole runs (``GroupedReservations``), which must hold
    every real block vLLM's tables give it."""
    requests = []
    held = 0
    for req in scheduler.running:
        rid = req.request_id
        lengths, reals = tables.lengths(rid)
        if reservations is not None:
            units = reservations.units(rid)
            assert all(r <= u for r, u in zip(reals, units)), (rid, reals, units)
            lengths = reals = units
        held += sum(reals)
        requests.append((req.num_computed_tokens, final_len[rid], lengths, reals))
    pool = scheduler.kv_cache_manager.block_pool
    if pool.enable_caching:  # a block shared between requests counts once (``kv_shared_use``)
        ids = [
            (req.num_computed_tokens, final_len[req.request_id], tables.ids(req.request_id))
            for req in scheduler.running
        ]
        used, internal, groups = measure_shared(use, ids)
    else:
        used, internal, groups = use.measure(requests)
    running, waiting = scheduler.get_request_counts()
    return Occupancy(
        running=running,
        waiting=waiting,
        allocated_blocks=pool.num_gpu_blocks - 1 - pool.get_num_free_blocks(),
        computed_tokens=sum(r[0] for r in requests),
        held_blocks=held,
        internal_positions=internal // use.unit,
        external_positions=_external(scheduler, waiting, reservations),
        cached_free_blocks=cached_free_block_count(pool),
        used_positions=used // use.unit,
        groups=tuple(groups),
    )


def read_schedule(
    out: Any,
    requests: Mapping[str, Any],
    req_blocks: Mapping[str, list[Any]],
    index_of: Callable[[str], int],
    reservations: ContiguousReservations | GroupedReservations | None = None,
) -> StepOut:
    """What ``schedule()`` returned, in kvbench's terms, read right after it (before any output)."""
    scheduled = []
    for rid, n in out.num_scheduled_tokens.items():
        held = len(req_blocks.get(rid, ())) + (reservations.held_blocks(rid) if reservations else 0)
        scheduled.append((index_of(rid), n, requests[rid].num_computed_tokens, held))
    new_ids = [r.req_id for r in out.scheduled_new_reqs]
    new_ids.extend(out.scheduled_cached_reqs.resumed_req_ids)
    admitted = [(index_of(rid), requests[rid].num_computed_tokens - out.num_scheduled_tokens[rid]) for rid in new_ids]
    preempted = [index_of(rid) for rid in out.preempted_req_ids]
    return StepOut(scheduled, admitted, preempted, out.total_num_scheduled_tokens, out)


def read_occupancy(
    scheduler: Any,
    req_blocks: Mapping[str, list[Any]],
    final_len: Mapping[str, int],
    block_size: int,
    usable_blocks: int,
    reservations: ContiguousReservations | None = None,
) -> Occupancy:
    """The allocation state right after ``schedule()``, before the step's outputs are applied."""
    computed = held = internal = 0
    for req in scheduler.running:
        rid = req.request_id
        computed += req.num_computed_tokens
        nb = len(req_blocks.get(rid, ())) + (reservations.held_blocks(rid) if reservations else 0)
        held += nb
        extra = nb * block_size - final_len[rid]
        if extra > 0:
            internal += extra
    running, waiting = scheduler.get_request_counts()
    free = scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
    return Occupancy(
        running=running,
        waiting=waiting,
        allocated_blocks=usable_blocks - free,
        computed_tokens=computed,
        held_blocks=held,
        internal_positions=internal,
        external_positions=_external(scheduler, waiting, reservations),
        cached_free_blocks=cached_free_block_count(scheduler.kv_cache_manager.block_pool),
    )
