"""A CPU tier of KV memory: vLLM's native KV offloading (``--kv-offloading-size``, its
``OffloadingConnector`` with ``CPUOffloadingSpec``), which keeps copies of computed KV blocks in
host memory, keyed by their prefix-cache hashes, and loads them back where a prefix hits them.

Its size in a suite (``[memory] cpu_offload``; 0: no tier; its eviction policies are
``specs.OFFLOAD_POLICIES``) and its capacity in blocks as vLLM computes it
(``vllm/v1/kv_offload/cpu/spec.py``): the host bytes ÷ one block's bytes across every layer of
the rank, rounded up to whole pages of ``PAGE_BYTES`` (its ``BLOCK_SIZE_ALIGNMENT``,
``mmap.PAGESIZE``).
"""

from __future__ import annotations

from ..errors import KvbenchError
from .units import parse_size

# The page a CPU block is rounded up to: mmap.PAGESIZE on Linux x86-64, where vLLM's offloading
# runs. A constant, not this host's page size, so a cell's capacity is the same on every machine.
PAGE_BYTES = 4096


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def cpu_block_bytes(block_bytes: int) -> int:
    """One block's bytes in the CPU tier: ``block_bytes`` rounded up to whole pages."""
    return round_up(block_bytes, PAGE_BYTES)


def cpu_tier_blocks(cpu_bytes: int, block_bytes: int) -> int:
    """How many blocks of ``block_bytes`` (one block's KV across every layer of one rank) a CPU
    tier of ``cpu_bytes`` holds, as vLLM's ``CPUOffloadingSpec`` counts them:
    ``cpu_bytes // round_up(block_bytes, PAGE_BYTES)``."""
    if block_bytes <= 0:
        raise ValueError(f"block_bytes must be positive, got {block_bytes}")
    if cpu_bytes < 0:
        raise ValueError(f"cpu_bytes must not be negative, got {cpu_bytes}")
    return cpu_bytes // cpu_block_bytes(block_bytes)


def parse_cpu_offload(value: object, what: str = "[memory] cpu_offload") -> int:
    """A CPU tier's size in bytes, read as ``parse_size`` reads a KV budget (``"16GiB"``,
    ``"40GB"``, bytes), where a size of zero is no tier."""
    try:
        return parse_size(value, what, zero_ok=True)  # type: ignore[arg-type]  # what a suite holds
    except KvbenchError as exc:
        raise KvbenchError(f"{exc}; use 0 (no CPU tier) or a size such as '16GiB'") from None
