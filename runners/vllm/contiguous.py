"""Contiguous reservations inside vLLM's v1 engine, installed on a built scheduler.

vLLM admits a request only when ``KVCacheManager.allocate_slots`` returns blocks, and its
kernels read block tables of arbitrary ids, so a contiguous policy inside vLLM is a wrapper
around that one call (and ``free``) on the running instance: no fork, no copy of vLLM.

- At a request's first allocation, reserve every block it may need by the policy's rule
  (``harness.sim.policies.contiguous.RESERVATIONS``), rounded up to whole blocks, as one run
  of consecutive block ids placed by the simulator's arena (first-fit or buddy, over the usable
  ids 1..N; block 0 is vLLM's null block). No run fits: ``allocate_slots`` returns None and
  vLLM stops admitting, as when blocks run out.
- The run's blocks leave vLLM's free queue and take a reference, as
  ``BlockPool.get_new_blocks`` does; the first ``ceil(max_model_len / block_size)`` become the
  request's blocks, the rest (Pow2 or buddy rounding beyond the block table's width) are held
  here, counted as allocated in vLLM's pool and never written to.
- vLLM's own ``allocate_slots`` then allocates nothing, now or later, so a running request is
  never preempted for lack of blocks; ``free`` returns the held blocks and the run after vLLM
  frees the request's own.

Each request's ``placement`` (its first block, counted from the first usable block, and how
many runs of consecutive ids its blocks formed when freed) goes to the records. Prefix caching
and speculative decoding must be off; a model of KV cache groups takes a run per group
(``runners.vllm.grouped_contiguous``).
docs/runners.md ("Contiguous reservations inside vLLM") says why this is physically contiguous."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ...harness.errors import KvbenchError
from ...harness.sim.policies.arena import ARENA_TYPES
from ...harness.sim.policies.contiguous import RESERVATIONS, block_runs, cdiv


def check_hostable(scheduler: Any, policy: str) -> str:
    """Refuse, in one line, a scheduler whose settings a contiguous reservation cannot host; the
    refusals' prefix ("<policy> inside vLLM")."""
    where = f"{policy} inside vLLM"
    if scheduler.cache_config.enable_prefix_caching:
        raise KvbenchError(
            f"{where}: enable_prefix_caching is on; a contiguous reservation cannot share cached blocks "
            "(prefix caching runs with the paged-prefix policy)"
        )
    if getattr(scheduler, "num_lookahead_tokens", 0) or scheduler.vllm_config.speculative_config is not None:
        raise KvbenchError(f"{where}: speculative decoding is configured; its lookahead slots are not reserved")
    return where


def take_run(pool: Any, start: int, units: int) -> list[Any]:
    """vLLM's blocks of arena units [start, start + units) (block 0 is the null block), taken out of
    its free queue with a reference each, as ``BlockPool.get_new_blocks`` takes blocks."""
    blocks = pool.blocks[1 + start : 1 + start + units]
    queue, collector = pool.free_block_queue, getattr(pool, "metrics_collector", None)
    for block in blocks:
        if block.ref_cnt != 0 or block.is_null:
            raise KvbenchError(f"contiguous reservation: vLLM's block {block.block_id} is in use")
        queue.remove(block)
        block.ref_cnt += 1
        if collector:
            collector.on_block_allocated(block)
    return list(blocks)


class ContiguousReservations:
    """A contiguous policy installed on one vLLM scheduler (module docstring)."""

    def __init__(self, scheduler: Any, policy: str, arena: str, block_size: int, max_model_len: int) -> None:
        manager = scheduler.kv_cache_manager
        where = check_hostable(scheduler, policy)
        managers = manager.coordinator.single_type_managers
        if len(managers) != 1:
            raise KvbenchError(
                f"{where}: the model has {len(managers)} KV cache groups (a hybrid model); "
                "GroupedReservations reserves per group"
            )
        self.pool = manager.block_pool
        self.usable = len(self.pool.blocks) - 1  # block 0 is the null block
        self.rule = RESERVATIONS[policy]
        self.arena = ARENA_TYPES[arena](self.usable)
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.width = cdiv(max_model_len, block_size)  # entries in a block-table row
        self.req_blocks = managers[0].req_to_blocks
        self.held: dict[str, list[Any]] = {}  # request id -> reserved blocks beyond the block table
        self.start: dict[str, int] = {}  # request id -> its run's first arena unit
        self.units: dict[str, int] = {}  # request id -> blocks its run took
        self.placement: dict[str, tuple[int, int]] = {}  # request id -> (first block, runs) once freed
        allocate, free = manager.allocate_slots, manager.free

        def allocate_slots(request: Any, *args: Any, **kwargs: Any) -> Any:
            rid = request.request_id
            if self.req_blocks.get(rid):  # growth inside the reservation: vLLM finds its blocks there
                return allocate(request, *args, **kwargs)
            if not self._reserve(request):
                return None
            out = allocate(request, *args, **kwargs)
            if out is None:  # vLLM refused for a reason of its own: undo, as if nothing happened
                self._release(rid, self.req_blocks.pop(rid))
                del self.placement[rid]
            return out

        def free_request(request: Any) -> None:
            rid = request.request_id
            if rid not in self.start:
                free(request)
                return
            ids = [b.block_id for b in (*self.req_blocks.get(rid, ()), *self.held[rid])]
            free(request)
            self._release(rid, ())
            self.placement[rid] = (self.placement[rid][0], block_runs(ids))

        manager.allocate_slots = allocate_slots
        manager.free = free_request

    def reservation_units(self, request: Any) -> int:
        """Blocks the arena takes for ``request`` (its reservation in whole blocks, buddy-rounded)."""
        want = self.rule(request.num_prompt_tokens, request.max_tokens, self.max_model_len)
        return self.arena.footprint(cdiv(want, self.block_size))

    def _reserve(self, request: Any) -> bool:
        rid = request.request_id
        want = cdiv(self.rule(request.num_prompt_tokens, request.max_tokens, self.max_model_len), self.block_size)
        start = self.arena.allocate(want)
        if start < 0:
            return False
        took = self.arena.footprint(want)
        blocks = take_run(self.pool, start, took)
        self.req_blocks[rid].extend(blocks[: self.width])
        self.held[rid] = blocks[self.width :]
        self.start[rid] = start
        self.units[rid] = took
        self.placement[rid] = (start, 0)
        return True

    def _release(self, rid: str, blocks: Iterable[Any]) -> None:
        """Return ``rid``'s held blocks (and ``blocks``, when vLLM has not freed them) and its run."""
        held = self.held.pop(rid)
        rest = [*blocks, *held]
        if rest:
            self.pool.free_blocks(rest)
        self.arena.free(self.start.pop(rid), self.units.pop(rid))

    def held_blocks(self, rid: str) -> int:
        """Blocks ``rid`` holds beyond its block table."""
        return len(self.held.get(rid, ()))

    def external_positions(self, head: Any | None) -> int:
        """While ``head`` waits: free positions in runs too short for its reservation."""
        if head is None:
            return 0
        return self.arena.free_smaller_than(self.reservation_units(head)) * self.block_size
