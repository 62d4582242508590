"""The simulator's CPU tier (``harness.sim.offload.cpu_tier``) against vLLM's own
``CPUOffloadingManager``, LRU and ARC, under the same random operations: every lookup, every
store's keys (or its refusal), the tier's content after every operation.

The agreement tests (``tests/runners/test_agreement_offload.py``) hold whole runs equal; this pins
the store itself on operation sequences the runs rarely reach (a full tier with pinned chunks,
stores refused, ghost-list hits), on the vLLM installed here with that release's rules.
"""

from __future__ import annotations

import random

import pytest

pytest.importorskip("vllm")

from kvbench.harness.sim.offload.cpu_tier import HIT, MISS, PENDING, CpuTier, RequestAccess  # noqa: E402
from kvbench.harness.sim.offload.rules import mirrored_rules  # noqa: E402
from kvbench.runners.vllm import build  # noqa: E402

build.load()  # the CPU build's import guard (its CUDA torchvision cannot load)

from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key  # noqa: E402
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager  # noqa: E402

RESULTS = {LookupResult.HIT: HIT, LookupResult.HIT_PENDING: PENDING, LookupResult.MISS: MISS}
BLOCK = 16


def vkey(key: int) -> bytes:
    return make_offload_key(key.to_bytes(8, "big"), 0)


class Request:
    """One request on both sides: its keys (a shared prefix, then its own), its vLLM context."""

    def __init__(self, rid: int, keys: list[int]) -> None:
        self.keys = keys
        self.access = RequestAccess(keys)
        self.ctx = ReqContext(req_id=str(rid))
        for i, k in enumerate(keys):
            self.ctx.set_offload_key_position(vkey(k), (i + 1) * BLOCK)


@pytest.mark.parametrize("policy", ["lru", "arc"])
@pytest.mark.parametrize("seed", range(6))
def test_cpu_tier_matches_vllm(policy: str, seed: int) -> None:
    rng = random.Random(seed)
    capacity = rng.choice([8, 16, 40])
    ours = CpuTier(capacity, policy, mirrored_rules())
    theirs = CPUOffloadingManager(num_chunks=capacity, cache_policy=policy)
    prefixes = [list(range(p * 1000, p * 1000 + rng.randint(2, 12))) for p in range(4)]
    universe: set[int] = set()
    live: list[Request] = []
    stores: list[list[int]] = []  # in flight
    loads: list[list[int]] = []  # in flight
    for step in range(400):
        if len(live) < 5 or rng.random() < 0.05:
            rid = len(universe) + step * 7
            own = list(range(10**6 + rid * 100, 10**6 + rid * 100 + rng.randint(1, 10)))
            req = Request(rid, rng.choice(prefixes) + own)
            theirs.on_new_request(req.ctx)
            live.append(req)
            universe.update(req.keys)
        req = rng.choice(live)
        op = rng.random()
        if op < 0.4:  # store a stretch of its keys
            a = rng.randrange(len(req.keys))
            keys = req.keys[a : a + rng.randint(1, 6)]
            got = ours.prepare_store(keys, req.access)
            out = theirs.prepare_store([vkey(k) for k in keys], req.ctx)
            assert (got is None) == (out is None), (step, keys)
            if got is not None and out is not None:
                assert [vkey(k) for k in got] == list(out.keys_to_store), step
                if got:
                    stores.append(got)
        elif op < 0.6 and stores:  # a store completes
            keys = stores.pop(rng.randrange(len(stores)))
            ours.complete_store(keys)
            theirs.complete_store([vkey(k) for k in keys], req.ctx)
        elif op < 0.75:  # a load of its readable prefix run
            run = []
            for k in req.keys:
                if ours.lookup(k) != HIT:
                    break
                run.append(k)
            if run:
                ours.prepare_load(run, req.access)
                theirs.prepare_load([vkey(k) for k in run], req.ctx)
                loads.append(run)
        elif op < 0.85 and loads:  # a load completes
            keys = loads.pop(rng.randrange(len(loads)))
            ours.complete_load(keys)
            theirs.complete_load([vkey(k) for k in keys], req.ctx)
        elif op < 0.95 and len(live) > 1:  # the request finishes
            live.remove(req)
            ours.on_request_finished(req.access)
            theirs.on_request_finished(req.ctx)
        for k in universe:
            assert ours.lookup(k) == RESULTS[theirs.lookup(vkey(k), req.ctx)], (step, k)
    assert ours.evicted > capacity  # the tier filled and turned over
