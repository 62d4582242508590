"""The Ray executor: each cell is a Ray task.

Each task writes its own partitions straight into the output directory, as
the local executor's processes do, so the result is one dataset whatever ran
it. That directory must therefore be reachable at the same path from every
Ray node: the local disk for a single-machine Ray instance, a shared
filesystem (NFS, a mounted bucket) for a cluster. GPU runners ask Ray for one
GPU, CPU runners for one CPU.
"""

from __future__ import annotations

import importlib.util
import os
import socket
from collections.abc import Iterator

from ..harness.errors import KvbenchError
from ..harness.spec.capabilities import needs_gpu
from ..runners.base import Cell
from .cell import run_cell


def resources(cell: Cell) -> dict[str, float]:
    gpu = needs_gpu(cell.spec.runner, cell.spec.device)
    return {"num_cpus": 1, "num_gpus": 1 if gpu else 0}


# How long a cluster's head may take to accept a connection before kvbench gives up on it
# (Ray's own client retries for minutes against an address where nothing listens).
CONNECT_TIMEOUT_S = 10.0


def check_reachable(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Refuse, within ``timeout_s``, a ``host:port`` (or ``ray://host:port``) address where
    nothing accepts a connection. Other forms (``auto``, ``local``) are Ray's to resolve."""
    target = address.removeprefix("ray://")
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        return
    host = host.strip("[]") or "127.0.0.1"
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        cause = (
            f"no answer within {timeout_s:g} s"
            if isinstance(exc, TimeoutError)
            else (exc.strerror or type(exc).__name__)
        )
        raise KvbenchError(f"cannot start or reach Ray at {address}: {cause}") from None


def check_ray(address: str | None) -> None:
    """Before a sweep starts: Ray is installed, and the cluster address (if any) answers."""
    if importlib.util.find_spec("ray") is None:
        raise KvbenchError('Ray is not installed: pip install -e ".[ray]"')
    if address:
        check_reachable(address)


def run_on_ray(cells: list[Cell], address: str | None) -> Iterator[tuple[Cell, dict[str, object]]]:
    check_ray(address)
    import ray

    if not ray.is_initialized():
        kwargs: dict[str, object] = {"include_dashboard": False, "log_to_driver": False}
        if address:
            kwargs["address"] = address
        else:
            kwargs["num_cpus"] = os.cpu_count() or 1
        try:
            ray.init(**kwargs)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise KvbenchError(
                f"cannot start or reach Ray at {address or 'a local instance'}: {str(exc).splitlines()[0]}"
            ) from None
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
