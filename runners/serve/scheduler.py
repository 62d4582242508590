"""kvbench's ``--scheduler-cls`` for a ``vllm serve`` it starts: vLLM's own v1 ``Scheduler``,
unchanged in what it decides, that writes one JSON line per step to the file named by
``KVBENCH_SERVE_STEPS``.

It is loaded inside the server's engine core process, so it imports only vLLM's scheduler and
kvbench's readers of it (``runners.vllm.readings``): the same ``read_schedule`` /
``read_occupancy`` the in-process runners call, at the same sampling point (right after
``schedule()`` returns, before the model runs), and the same contiguous reservations
(``runners.vllm.contiguous``), installed from ``KVBENCH_SERVE_POLICY``, ``_ARENA`` and
``_MAX_MODEL_LEN``. After the step's outputs are applied (``update_from_output``) it adds which
requests got a token and which finished, so ``runners.serve.runner`` rebuilds every step row with
``runners.vllm.steps`` exactly as the ``vllm`` runner does.

Holding (``KVBENCH_SERVE_HOLD_FOR=N``, docs/runners.md "Batch arrivals"): no step runs until N
requests have reached the scheduler; then they are taken in the workload's order.

Lines: a header ``{"pool": blocks, "block_bytes": B}``, then per step ``{"t0", "t1"`` (wall
clock at ``schedule()`` and after the outputs), ``"sched"`` [[id, new tokens, computed, blocks]],
``"admitted"`` [[id, hit tokens]], ``"preempted"``, ``"tokens"``, ``"occ"`` (the fields of
``readings.Occupancy``), ``"got"``, ``"fin"``, ``"npre"`` {id: preemptions} of the finished,
``"evicted"`` (cached blocks evicted so far), ``"reuse"`` (new reuse distances: [steps,
seconds]), ``"placed"`` {id: [first block, runs]} of freed contiguous requests}``. Ids are
vLLM's engine request ids; ``engine_id`` maps them to kvbench's.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from collections.abc import Iterator, Mapping
from typing import Any

from ..vllm.contiguous import ContiguousReservations
from ..vllm.readings import CacheWatcher, read_occupancy, read_schedule, request_blocks

STEPS_ENV = "KVBENCH_SERVE_STEPS"
HOLD_ENV = "KVBENCH_SERVE_HOLD_FOR"
POLICY_ENV = "KVBENCH_SERVE_POLICY"
ARENA_ENV = "KVBENCH_SERVE_ARENA"
MAX_MODEL_LEN_ENV = "KVBENCH_SERVE_MAX_MODEL_LEN"
CONTIGUOUS_POLICIES = ("contiguous-max", "contiguous-pow2", "contiguous-oracle")
# The completions request id kvbench sends is "kvb<request_id>"; vLLM's engine id is
# "[<sample>_]cmpl-kvb<request_id>-<prompt index>-<random>" (the sample prefix only when n > 1).
REQUEST_ID_PREFIX = "kvb"
_ENGINE_ID = re.compile(rf"^(?:(\d+)_)?cmpl-{REQUEST_ID_PREFIX}(\d+)-")


def engine_id(rid: str) -> tuple[int, int] | None:
    """(kvbench request id, sample) of one of vLLM's engine request ids; None for another client's."""
    m = _ENGINE_ID.match(rid)
    if m is None:
        return None
    return int(m.group(2)), int(m.group(1) or 0)


class _FinalLen(Mapping[str, int]):
    """Request id -> prompt + output tokens, read from the scheduler's live requests."""

    def __init__(self, requests: Mapping[str, Any]) -> None:
        self._requests = requests

    def __getitem__(self, rid: str) -> int:
        req = self._requests[rid]
        return int(req.num_prompt_tokens + req.max_tokens)

    def __iter__(self) -> Iterator[str]:
        return iter(self._requests)

    def __len__(self) -> int:
        return len(self._requests)


def _identity(rid: str) -> Any:
    return rid


_CLASS: list[type] = []


def __getattr__(name: str) -> Any:
    """``KvbenchScheduler``, built on first use: vLLM is imported only by whoever asks for it (the
    server's engine core), never by importing this module (kvbench's own process reads its
    constants)."""
    if name != "KvbenchScheduler":
        raise AttributeError(name)
    if not _CLASS:
        _CLASS.append(_build())
    return _CLASS[0]


def _build() -> type:
    from vllm.v1.core.sched.scheduler import Scheduler

    class KvbenchScheduler(Scheduler):
        """vLLM's ``Scheduler`` with kvbench's step readings (module docstring)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            path = os.environ.get(STEPS_ENV)
            self._out = open(path, "w", encoding="utf-8", buffering=1) if path else None  # noqa: SIM115
            self._hold_for = int(os.environ.get(HOLD_ENV, "0") or 0)
            self._req_blocks = request_blocks(self)
            self._final_len = _FinalLen(self.requests)
            self._usable = self.kv_cache_config.num_blocks - 1  # block 0 is vLLM's null block
            caching = self.cache_config.enable_prefix_caching
            self._cache = CacheWatcher(self.kv_cache_manager.block_pool) if caching else None
            self._reuse_seen = 0
            self._steps_done = 0
            policy = os.environ.get(POLICY_ENV, "")
            self._reservations = None
            if policy in CONTIGUOUS_POLICIES:
                self._reservations = ContiguousReservations(
                    self,
                    policy,
                    os.environ.get(ARENA_ENV, "first-fit"),
                    self.block_size,
                    int(os.environ[MAX_MODEL_LEN_ENV]),
                )
            self._live: dict[str, Any] = {}
            self._pending: dict[str, Any] | None = None
            block_bytes = sum(
                g.kv_cache_spec.page_size_bytes * len(g.layer_names) for g in self.kv_cache_config.kv_cache_groups
            )
            self._write({"pool": self.kv_cache_config.num_blocks, "block_bytes": block_bytes})

        def _write(self, record: dict[str, Any]) -> None:
            if self._out is not None:
                self._out.write(json.dumps(record, separators=(",", ":")) + "\n")

        def add_request(self, request: Any) -> None:
            super().add_request(request)
            self._live[request.request_id] = request

        def has_requests(self) -> bool:
            if self._hold_for:
                if len(self._live) < self._hold_for:
                    return False  # the engine core waits for input: no step until the batch is here
                self._hold_for = 0
                held = sorted(self.waiting, key=lambda r: engine_id(r.request_id) or (1 << 62, 0))
                self.waiting.remove_requests(held)
                for req in held:
                    self.waiting.add_request(req)
            return super().has_requests()

        def schedule(self, *args: Any, **kwargs: Any) -> Any:
            t0 = time.time()
            if self._cache is not None:
                self._cache.now = (self._steps_done, t0)
            out = super().schedule(*args, **kwargs)
            step = read_schedule(out, self.requests, self._req_blocks, _identity, self._reservations)
            occ = read_occupancy(
                self, self._req_blocks, self._final_len, self.block_size, self._usable, self._reservations
            )
            self._pending = {
                "t0": t0,
                "sched": step.scheduled,
                "admitted": step.admitted,
                "preempted": step.preempted,
                "tokens": step.scheduled_tokens,
                "occ": dataclasses.asdict(occ),
            }
            return out

        def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
            outputs = super().update_from_output(scheduler_output, model_runner_output)
            record, self._pending = self._pending, None
            if record is None:
                return outputs
            got: list[str] = []
            fin: list[str] = []
            for engine_outputs in outputs.values():
                for o in engine_outputs.outputs:
                    if o.new_token_ids:
                        got.append(o.request_id)
                    if o.finish_reason is not None:
                        fin.append(o.request_id)
            npre: dict[str, int] = {}
            placed: dict[str, list[int]] = {}
            for rid in fin:
                req = self._live.pop(rid, None)
                if req is not None:
                    npre[rid] = int(req.num_preemptions)
                if self._reservations is not None and rid in self._reservations.placement:
                    placed[rid] = list(self._reservations.placement[rid])
            reuse: list[list[float]] = []
            if self._cache is not None:
                new = slice(self._reuse_seen, len(self._cache.steps))
                reuse = [[s, t] for s, t in zip(self._cache.steps[new], self._cache.seconds[new])]
                self._reuse_seen = len(self._cache.steps)
            record.update(
                t1=time.time(),
                got=got,
                fin=fin,
                npre=npre,
                evicted=self._cache.count if self._cache is not None else 0,
                reuse=reuse,
                placed=placed,
            )
            self._steps_done += 1
            self._write(record)
            return outputs

        def finish_requests(self, request_ids: Any, finished_status: Any) -> Any:
            result = super().finish_requests(request_ids, finished_status)
            ids = [request_ids] if isinstance(request_ids, str) else list(request_ids or ())
            for rid in ids:
                if rid in self._live and rid not in self.requests:
                    self._live.pop(rid, None)  # aborted (the client went away): never a finished row
            return result

        def shutdown(self) -> None:
            try:
                super().shutdown()
            finally:
                if self._out is not None:
                    self._out.close()
                    self._out = None

    return KvbenchScheduler
