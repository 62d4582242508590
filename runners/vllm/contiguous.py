"""Contiguous reservations inside vLLM's v1 engine, installed on a built scheduler.

vLLM's scheduler admits a request only when ``KVCacheManager.allocate_slots`` returns
blocks, and its kernels read block tables of arbitrary ids. So a contiguous policy inside
vLLM is a wrapper around that one call on the running instance (no fork, no copy of vLLM):

- at a request's first allocation (it holds no blocks), reserve every block it may need,
  by the policy's rule (``harness.sim.policies.contiguous.RESERVATIONS``: max_model_len,
  prompt + the next power of two of the output, or prompt + output), rounded up to whole
  blocks, as one run of consecutive physical block ids placed by the same arena the
  simulator uses (first-fit or buddy, over the usable block ids 1..N; block 0 is vLLM's
  null block). No run that fits: ``allocate_slots`` returns None and vLLM stops admitting,
  first come first served, as it does when blocks run out;
- the run's blocks leave vLLM's free queue and take a reference, as ``BlockPool.get_new_blocks``
  does; the first ``ceil(max_model_len / block_size)`` of them (the block table's width)
  become the request's blocks, and the rest (Pow2 or buddy rounding beyond the width) are
  held here, out of the free queue and out of the block table, so they count as allocated
  in vLLM's own pool and are never written to;
- then vLLM's own ``allocate_slots`` runs: the reservation covers every token the request
  will hold, so it allocates nothing, now or later, and a running request is never preempted
  for lack of blocks;
- ``KVCacheManager.free`` (finish or preemption) returns the held blocks to the free queue
  and the run to the arena, after vLLM frees the request's own blocks.

A run of consecutive block ids is one contiguous stretch of each layer's KV tensor (their
layout puts the block index outermost), so this is a physically contiguous allocation
running vLLM's scheduler, model runner and kernels unchanged. What each request held is
kept per request (``placement``: its first block, counted from the first usable block, and
how many runs of consecutive ids its blocks formed when it was freed), for the records.

Prefix caching must be off (a cache hit would share blocks wherever they lie), speculative
decoding too (lookahead slots), and the model must have one KV cache group.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ...harness.errors import KvbenchError
from ...harness.sim.policies.arena import ARENA_TYPES
from ...harness.sim.policies.contiguous import RESERVATIONS, cdiv


def block_runs(ids: Iterable[int]) -> int:
    """Maximal runs of consecutive ids in ``ids``, in the order given (1 for one contiguous run)."""
    runs = 0
    last = None
    for i in ids:
        if last is None or i != last + 1:
            runs += 1
        last = i
    return runs


class ContiguousReservations:
    """A contiguous policy installed on one vLLM scheduler (module docstring)."""

    def __init__(self, scheduler: Any, policy: str, arena: str, block_size: int, max_model_len: int) -> None:
        manager = scheduler.kv_cache_manager
        where = f"{policy} inside vLLM"
        if scheduler.cache_config.enable_prefix_caching:
            raise KvbenchError(
                f"{where}: enable_prefix_caching is on; a contiguous reservation cannot share cached blocks "
                "(prefix caching runs with the paged-prefix policy)"
            )
        if getattr(scheduler, "num_lookahead_tokens", 0) or scheduler.vllm_config.speculative_config is not None:
            raise KvbenchError(f"{where}: speculative decoding is configured; its lookahead slots are not reserved")
        managers = manager.coordinator.single_type_managers
        if len(managers) != 1:
            raise KvbenchError(
                f"{where}: the model has {len(managers)} KV cache groups (a hybrid model); "
                "a contiguous reservation spans one group"
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
        blocks = self.pool.blocks[1 + start : 1 + start + took]
        queue, collector = self.pool.free_block_queue, getattr(self.pool, "metrics_collector", None)
        for block in blocks:
            if block.ref_cnt != 0 or block.is_null:
                raise KvbenchError(f"contiguous reservation: vLLM's block {block.block_id} is in use")
            queue.remove(block)
            block.ref_cnt += 1
            if collector:
                collector.on_block_allocated(block)
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
