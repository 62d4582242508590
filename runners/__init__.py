"""Runners by name (a plain dict registry checked against the ``Runner`` protocol).

Runner modules are imported lazily: ``torch`` and ``vllm`` are heavy, and a
machine without vLLM must still run the simulator.
"""

from __future__ import annotations

import importlib

from ..harness.errors import KvbenchError
from ..harness.spec.capabilities import RUNNER_NAMES
from ..harness.spec.specs import RunSpec
from .base import Runner

RUNNERS: dict[str, str] = {  # module relative to this package : class
    "sim": ".sim:SimRunner",
    "vllm-sched": ".vllm.sched:VllmSchedRunner",
    "torch": ".torch.runner:TorchRunner",
    "vllm": ".vllm.engine:VllmRunner",
    "serve": ".serve.runner:ServeRunner",
}
assert tuple(RUNNERS) == RUNNER_NAMES, "harness/spec/capabilities.py and the runner registry disagree"


def get_runner(name: str) -> Runner:
    try:
        target = RUNNERS[name]
    except KeyError:
        raise KvbenchError(f"unknown runner {name!r} (known: {', '.join(RUNNERS)})") from None
    module_name, cls_name = target.split(":")
    module = importlib.import_module(module_name, __name__)
    runner = getattr(module, cls_name)()
    assert isinstance(runner, Runner), f"{target} does not implement Runner"
    return runner


def availability(name: str) -> str | None:
    """None when runner ``name`` runs here, else why not: the runner's own reason, or the error
    that names it unknown. One probe for ``run``, ``doctor`` and each cell."""
    try:
        return get_runner(name).unavailable()
    except KvbenchError as exc:
        return str(exc)


def cell_skip(spec: RunSpec) -> str | None:
    """Why an optional runner's cell cannot run here though the runner can (None: it can): a CPU
    tier in vLLM's engine on its CPU build."""
    if spec.runner in ("vllm", "serve") and spec.memory.cpu_offload_bytes and not spec.serve_url:
        from .vllm import build
        from .vllm.offload import NEEDS_GPU

        installed = build.installed_build()
        if installed is not None and installed.device == "cpu":
            return NEEDS_GPU
    return None
