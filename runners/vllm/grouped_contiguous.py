"""Contiguous reservations inside vLLM's scheduler for a model of KV cache groups.

The rule is the simulator's (``harness.sim.policies.grouped_contiguous``): at a request's first
allocation, per group, one run of consecutive block ids (``group_blocks``), placed in group order
by the same arena over the pool's usable ids; no run fits: ``allocate_slots`` returns None and
vLLM stops admitting. The runs leave vLLM's free queue (``take_run``) and are held here until the
request is freed. vLLM's own per-group managers still decide which positions need a block: each
manager's ``block_pool`` is a ``_RunPool`` that serves the request being allocated from its own
run of that group, and takes back into the run what the manager frees (a sliding group's blocks
that left the window), so a sliding group's run is a ring and nothing returns to the free queue
before the request ends. A reserved request needs no block of the pool: the coordinator's count
of blocks to allocate is 0 for it, so vLLM never refuses or preempts it.

Installed on the built instances (``allocate_slots``, ``free``, the coordinator's
``get_num_blocks_to_allocate``, each manager's ``block_pool``), as ``ContiguousReservations``.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import Any

from ...harness.errors import KvbenchError
from ...harness.sim.policies.arena import ARENA_TYPES
from ...harness.sim.policies.contiguous import RESERVATIONS, block_runs, group_blocks, place_runs
from ...harness.spec.kv_layout import KVLayout
from ...harness.spec.kv_use import KVUse
from .contiguous import check_hostable, take_run


class _RunPool:
    """One group manager's view of vLLM's block pool: the request being allocated draws from its run."""

    def __init__(self, pool: Any, owner: GroupedReservations, group: int) -> None:
        self._pool = pool
        self._owner = owner
        self._group = group

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)

    def get_new_blocks(self, num_blocks: int) -> list[Any]:
        rid = self._owner.current
        if rid is None or rid not in self._owner.spare:
            return self._pool.get_new_blocks(num_blocks)
        return self._owner.take(rid, self._group, num_blocks)

    def free_blocks(self, ordered_blocks: Iterable[Any]) -> None:
        rest = self._owner.give_back(ordered_blocks)
        if rest:
            self._pool.free_blocks(rest)


class GroupedReservations:
    """A contiguous policy installed on a vLLM scheduler over KV cache groups (module docstring)."""

    def __init__(self, scheduler: Any, policy: str, arena: str, layout: KVLayout, use: KVUse, max_model_len: int):
        where = check_hostable(scheduler, policy)
        manager = scheduler.kv_cache_manager
        managers = manager.coordinator.single_type_managers
        if len(managers) != len(layout.groups):
            raise KvbenchError(
                f"{where}: vLLM has {len(managers)} KV cache groups, kvbench's layout {len(layout.groups)}"
            )
        self.pool = manager.block_pool
        self.groups = layout.groups
        self.use = use
        self.rule = RESERVATIONS[policy]
        self.max_model_len = max_model_len
        self.arena = ARENA_TYPES[arena](len(self.pool.blocks) - 1)  # block 0 is the null block
        self.tables = [m.req_to_blocks for m in managers]
        self.runs: dict[str, list[tuple[int, int]]] = {}  # request id -> (first unit, units) per group
        self.spare: dict[str, list[list[tuple[int, Any]]]] = {}  # request id -> per group, its unused blocks
        self.owner: dict[int, tuple[str, int]] = {}  # block id -> (request id, group) while reserved
        self.placement: dict[str, tuple[int, int]] = {}  # request id -> (first block, runs) once freed
        self.current: str | None = None  # the request ``allocate_slots`` is serving
        for i, m in enumerate(managers):
            m.block_pool = _RunPool(self.pool, self, i)
        allocate, free, count = manager.allocate_slots, manager.free, manager.coordinator.get_num_blocks_to_allocate

        def allocate_slots(request: Any, *args: Any, **kwargs: Any) -> Any:
            rid = request.request_id
            new = rid not in self.runs
            if new and not self._reserve(request):
                return None
            self.current = rid
            try:
                out = allocate(request, *args, **kwargs)
            finally:
                self.current = None
            if out is None and new:  # vLLM refused for a reason of its own: undo, as if nothing happened
                self._release(rid)
                del self.placement[rid]
            return out

        def blocks_to_allocate(*args: Any, **kwargs: Any) -> int:
            rid = kwargs["request_id"] if "request_id" in kwargs else args[0]
            return 0 if rid in self.runs else int(count(*args, **kwargs))

        def free_request(request: Any) -> None:
            free(request)
            if request.request_id in self.runs:
                self._release(request.request_id)

        manager.allocate_slots = allocate_slots
        manager.free = free_request
        manager.coordinator.get_num_blocks_to_allocate = blocks_to_allocate

    def wants(self, request: Any) -> tuple[int, ...]:
        """Blocks ``request``'s reservation asks of each group (before the arena's rounding)."""
        return group_blocks(self.groups, self.rule(request.num_prompt_tokens, request.max_tokens, self.max_model_len))

    def _reserve(self, request: Any) -> bool:
        rid = request.request_id
        runs = place_runs(self.arena, self.wants(request))
        if runs is None:
            return False
        spare = []
        for i, (start, units) in enumerate(runs):
            blocks = take_run(self.pool, start, units)
            for b in blocks:
                self.owner[b.block_id] = (rid, i)
            spare.append([(b.block_id, b) for b in blocks])  # sorted by id: a heap already
        self.runs[rid] = runs
        self.spare[rid] = spare
        ids = (u for start, units in runs for u in range(start, start + units))
        self.placement[rid] = (runs[0][0], block_runs(ids))
        return True

    def take(self, rid: str, group: int, n: int) -> list[Any]:
        """``n`` unused blocks of ``rid``'s run in ``group``, lowest ids first (they keep the
        reference the reservation took)."""
        heap = self.spare[rid][group]
        if n > len(heap):
            raise KvbenchError(f"contiguous reservation: request {rid}'s run in KV cache group {group} is exhausted")
        return [heapq.heappop(heap)[1] for _ in range(n)]

    def give_back(self, blocks: Iterable[Any]) -> list[Any]:
        """Put the reserved ones of ``blocks`` back into their runs; the others, to free in the pool."""
        rest = []
        for b in blocks:
            owner = None if b.is_null else self.owner.get(b.block_id)
            if owner is None:
                rest.append(b)
            else:
                heapq.heappush(self.spare[owner[0]][owner[1]], (b.block_id, b))
        return rest

    def _release(self, rid: str) -> None:
        """Return ``rid``'s runs to the pool and the arena; vLLM must have given back every block."""
        runs, spare = self.runs.pop(rid), self.spare.pop(rid)
        blocks = [b for heap in spare for _, b in heap]
        if len(blocks) != sum(units for _, units in runs):
            raise KvbenchError(f"contiguous reservation: request {rid} freed with blocks still in vLLM's tables")
        for b in blocks:
            del self.owner[b.block_id]
        self.pool.free_blocks(blocks)
        for start, units in runs:
            self.arena.free(start, units)

    def units(self, rid: str) -> list[int]:
        """Per group, the blocks ``rid``'s run holds (its whole reservation)."""
        return [units for _, units in self.runs[rid]]

    def held_blocks(self, rid: str) -> int:
        """Blocks ``rid`` holds beyond its real blocks in vLLM's tables."""
        if rid not in self.runs:
            return 0
        return sum(len(heap) for heap in self.spare[rid])

    def external_positions(self, head: Any | None) -> int:
        """While ``head`` waits: free positions in ranges smaller than every run it needs."""
        if head is None:
            return 0
        need = min(self.arena.footprint(n) for n in self.wants(head))
        return self.use.positions(self.arena.free_smaller_than(need))
