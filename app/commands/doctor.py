"""``kvbench doctor``: what this machine can run, and the presets kvbench knows."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ...harness.records.provenance import provenance
from .base import Command

if TYPE_CHECKING:
    from ...harness.sim.policies import PolicyEntry


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--gpu",
        action="store_true",
        help="GPU smoke test: a small preset through vllm and torch on CUDA, then the decomposition",
    )


def runner_status() -> dict[str, str | None]:
    from ...runners import RUNNERS, availability

    return {name: availability(name) for name in RUNNERS}


def _where(runner: str, reason: str | None) -> str:
    """Which vLLM build the full engine would run, and on what device."""
    if runner != "vllm" or reason is not None:
        return ""
    from ...runners.vllm.build import installed_build

    build = installed_build()
    return "" if build is None else f" ({build.distribution} {build.version}: the engine runs on {build.device})"


def _paths(table: Mapping[str, PolicyEntry]) -> str:
    """'fast: a, b; reference: c' for one layout's registry."""
    from ...harness.sim.policies import FAST, REFERENCE

    by_path = {path: [n for n, e in table.items() if e.fast == (path == FAST)] for path in (FAST, REFERENCE)}
    return "; ".join(f"{path}: {', '.join(names)}" for path, names in by_path.items() if names)


def run(args: argparse.Namespace) -> int:
    if args.gpu:
        from ..gpu_smoke import run_smoke

        return run_smoke()
    from ...harness.clock.model import GPU_PRESETS
    from ...harness.spec.geometry import PRESETS

    prov = provenance()
    for key in ("kvbench_version", "python_version", "torch_version", "vllm_version", "git_sha", "host"):
        print(f"{key:16} {prov.get(key)}")
    from ...harness.sim import FORM

    print(f"{'simulator':16} {FORM.describe()}")  # compiled (mypyc) or Python, and why
    print("runners:")
    for name, reason in runner_status().items():
        print(f"  {name:12} {'available' if reason is None else 'unavailable: ' + reason}{_where(name, reason)}")
    from ...harness.spec.capabilities import RUNNER_FACTS

    print("policies each runner hosts (contiguous reservations counted in):")
    for name, facts in RUNNER_FACTS.items():
        units = " or ".join(f"{u}s" for u in facts.contiguous_units)
        print(f"  {name:12} {', '.join(facts.policies)} ({units})")
    from ...harness.sim.policies import GROUPED, POLICIES

    print("sim's loop per policy (fast: the fast path, record for record the reference's; reference: the step loop):")
    for layout, table in (("full attention", POLICIES), ("KV cache groups", GROUPED)):
        print(f"  {layout:16} {_paths(table)}")
    print("model presets (KV bytes per token at fp16, every attention layer as full attention; layer kinds):")
    for g in PRESETS.values():
        kinds = ", ".join(f"{g.layer_count(k)} {k}" for k in g.kinds)
        state = f"; state {g.state_bytes_per_request():,} B per request" if g.state is not None else ""
        print(
            f"  {g.name:14} layers {g.num_layers:3}  kv heads {g.num_kv_heads:3}  head dim {g.head_dim:4}  "
            f"{g.kv_bytes_per_token('fp16'):>9,} B  ({kinds}{state})"
        )
    print("gpu presets (roofline clock): " + ", ".join(GPU_PRESETS))
    return 0


COMMAND = Command(
    "doctor",
    help="what this machine can run; known presets",
    description="Versions, devices, which runners are available here, and presets.",
    configure=configure,
    run=run,
)
