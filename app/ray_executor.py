"""The Ray executor: each cell is a Ray task.

Each task writes its own partitions straight into the output directory, as
the local executor's processes do, so the result is one dataset whatever ran
it. That directory must therefore be reachable at the same path from every
Ray node: the local disk for a single-machine Ray instance, a shared
filesystem (NFS, a mounted bucket) for a cluster. GPU runners ask Ray for one
GPU, CPU runners for one CPU.
"""

from __future__ import annotations

import os
from typing import Iterator

from ..harness.capabilities import needs_gpu
from ..harness.errors import KvbenchError
from ..runners.base import Cell
from .cell import run_cell


def resources(cell: Cell) -> dict[str, float]:
    gpu = needs_gpu(cell.spec.runner, cell.spec.device)
    return {"num_cpus": 1, "num_gpus": 1 if gpu else 0}


def run_on_ray(cells: list[Cell], address: str | None) -> Iterator[tuple[Cell, dict[str, object]]]:
    try:
        import ray
    except ImportError:
        raise KvbenchError('Ray is not installed: pip install -e ".[ray]"') from None
    if not ray.is_initialized():
        kwargs: dict[str, object] = {"include_dashboard": False, "log_to_driver": False}
        if address:
            kwargs["address"] = address
        else:
            kwargs["num_cpus"] = os.cpu_count() or 1
        try:
            ray.init(**kwargs)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise KvbenchError(f"cannot start or reach Ray at {address or 'a local instance'}: "
                               f"{str(exc).splitlines()[0]}") from None
    task = ray.remote(run_cell)
    pending = {task.options(**resources(cell)).remote(cell): cell for cell in cells}
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1)
        ref = done[0]
        cell = pending.pop(ref)
        try:
            row = ray.get(ref)
        except ray.exceptions.RayTaskError as exc:
            # A cell's StorageError (the shared results directory full or gone) ends the sweep
            # with its own line, as it does under the local executor, not Ray's traceback.
            if isinstance(exc.cause, KvbenchError):
                for other in pending:
                    ray.cancel(other, force=True)
                raise exc.cause from None
            raise
        yield cell, row
