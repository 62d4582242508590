"""vLLM's native KV offloading (a CPU tier) in ``vllm-sched``: the real ``OffloadingConnector``
built by vLLM's own ``Scheduler`` from ``CacheConfig.kv_offloading_size``, its scheduler half
(``OffloadingConnectorScheduler``, ``CPUOffloadingManager``, LRU or ARC) unpatched, and one seam:
its worker half, which copies blocks on CUDA streams, stood in for by ``StandInWorker``.

The stand-in completes each job by the simulator's rule (``harness.sim.offload.transfers``) and
reports it exactly as the GPU worker does (``offloading/worker.py``): ``completed_jobs`` of an
``OffloadingWorkerMetadata`` for loads and stores, ``finished_recving`` for loads, no
``finished_sending`` (stores never hold a request's blocks).
"""

from __future__ import annotations

import json
from typing import Any

from ...harness.errors import KvbenchError
from ...harness.sim.offload.transfers import TransferQueue, link_bytes_per_s
from ...harness.spec.specs import RunSpec

# Why a CPU tier cannot run in vLLM's engine on a CPU device.
NEEDS_GPU = (
    "vLLM's offloading connector copies KV blocks on CUDA or XPU streams only (the worker half, "
    "CPUOffloadingSpec.get_worker, refuses other platforms): the engine runs a CPU tier on a GPU; "
    "vllm-sched and sim run it here"
)


def engine_settings(spec: RunSpec) -> dict[str, Any]:
    """``EngineArgs`` keywords for the spec's CPU tier (none without one): its size, and the
    eviction policy in the connector's extra config (vLLM adds its size to that config)."""
    if not spec.memory.cpu_offload_bytes:
        return {}
    from vllm.config import KVTransferConfig

    extra = {"eviction_policy": spec.memory.offload_policy}
    return {**offload_settings(spec), "kv_transfer_config": KVTransferConfig(kv_connector_extra_config=extra)}


def server_flags(spec: RunSpec) -> list[str]:
    """The ``vllm serve`` flags for the spec's CPU tier (none without one)."""
    if not spec.memory.cpu_offload_bytes:
        return []
    settings = offload_settings(spec)
    extra = json.dumps({"kv_connector_extra_config": {"eviction_policy": spec.memory.offload_policy}})
    return [
        "--kv-offloading-size",
        repr(settings["kv_offloading_size"]),
        "--kv-offloading-backend",
        settings["kv_offloading_backend"],
        "--kv-transfer-config",
        extra,
    ]


def offload_settings(spec: RunSpec) -> dict[str, Any]:
    """``CacheConfig`` keywords for the spec's CPU tier (none without one): vLLM takes its size in GiB."""
    size = spec.memory.cpu_offload_bytes
    if not size:
        return {}
    return {"kv_offloading_size": size / 2**30, "kv_offloading_backend": "native"}


def configure(spec: RunSpec, vllm_config: Any) -> None:
    """The connector's settings beyond its size: the eviction policy (vLLM's extra config)."""
    if spec.memory.cpu_offload_bytes:
        transfer = vllm_config.kv_transfer_config
        if transfer is None or transfer.kv_connector != "OffloadingConnector":
            raise KvbenchError("vLLM did not configure its OffloadingConnector for kv_offloading_size")
        transfer.kv_connector_extra_config["eviction_policy"] = spec.memory.offload_policy


class StandInWorker:
    """The worker half of vLLM's offloading connector, on the simulator's transfer rule; it also
    reads what the records need from the connector vLLM built (``sched.connector``)."""

    def __init__(self, sched: Any, spec: RunSpec) -> None:
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import OffloadingWorkerMetadata
        from vllm.v1.outputs import KVConnectorOutput
        from vllm.v1.request import RequestStatus

        self._Meta, self._Output, self._waiting = OffloadingWorkerMetadata, KVConnectorOutput, RequestStatus
        connector = sched.connector
        if connector is None:
            raise KvbenchError("vLLM's scheduler built no KV connector for kv_offloading_size")
        self.sched = sched
        self.scheduler_half = connector.connector_scheduler
        self.manager = self.scheduler_half.manager
        capacity = self.manager._num_chunks
        if capacity != spec.cpu_blocks:
            raise KvbenchError(
                f"vLLM's CPU tier holds {capacity:,} blocks where kvbench computes {spec.cpu_blocks:,}; "
                "unsupported vLLM offloading layout"
            )
        self.block_bytes = spec.block_bytes
        self.queue: TransferQueue[str] = TransferQueue(link_bytes_per_s(spec.scheduler))
        self.now = 0.0  # the run's clock at the step's start (the driving engine sets it)
        self.steps = 0  # steps run so far
        self.values = (0, 0, 0, 0)  # the last step's CPU-tier columns (``read``)
        self.cpu_hit_tokens: dict[int, int] = {}  # by request index: tokens vLLM asked the tier to load
        original = connector.update_state_after_alloc

        def counted(request: Any, blocks: Any, num_external_tokens: int) -> None:
            if num_external_tokens:
                idx = int(request.request_id)
                self.cpu_hit_tokens[idx] = self.cpu_hit_tokens.get(idx, 0) + num_external_tokens
            original(request, blocks, num_external_tokens)

        connector.update_state_after_alloc = counted  # measurement only: it calls vLLM's own

    def read(self, out: Any) -> None:
        """The step's CPU-tier columns (``values``), right after ``schedule()``: blocks held in the
        tier, blocks whose store and load were issued this step, requests waiting for a load."""
        meta = out.kv_connector_metadata
        manager = self.manager
        held = manager._num_allocated_chunks - len(manager._free_list)
        stored = sum(len(job.src_spec.block_ids) for job in meta.store_jobs.values())
        loaded = sum(len(job.dst_spec.block_ids) for job in meta.load_jobs.values())
        waiting_status = self._waiting.WAITING_FOR_REMOTE_KVS
        waiting = sum(1 for r in self.sched.kv_holding_waiting if r.status == waiting_status)
        self.values = (held, stored, loaded, waiting)

    def step(self, out: Any) -> Any:
        """The worker's ``KVConnectorOutput`` for this step's ``SchedulerOutput`` (the step began
        at ``now``)."""
        meta = out.kv_connector_metadata
        bb = self.block_bytes
        done, received = self.queue.step(
            self.steps,
            self.now,
            meta.jobs_to_flush or (),
            [(jid, len(job.src_spec.block_ids) * bb) for jid, job in meta.store_jobs.items()],
            [(jid, len(job.dst_spec.block_ids) * bb, job.req_id) for jid, job in meta.load_jobs.items()],
        )
        self.steps += 1
        worker_meta = self._Meta()
        for jid in done:
            worker_meta.mark_completed(jid)
        return self._Output(
            finished_recving=set(received) or None,
            kv_connector_worker_meta=worker_meta if worker_meta.completed_jobs else None,
        )
