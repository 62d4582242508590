"""Allocation policies, by name (a plain dict registry checked against ``Policy``)."""

from __future__ import annotations

from collections.abc import Callable

from ...errors import KvbenchError
from ...spec import capabilities
from ...spec.specs import ARENAS, RunSpec
from .arena import ARENA_TYPES
from .base import Policy
from .contiguous import ContiguousMax, ContiguousOracle, ContiguousPow2
from .counting_prefix import CountingPrefixPolicy
from .grouped import GroupedPagedPolicy
from .grouped_contiguous import GroupedContiguousPolicy
from .grouped_prefix import GroupedPrefixPolicy
from .paged import CountingPagedPolicy, PagedPolicy, PagedPrefixPolicy, VirtualContiguousPolicy
from .shared_prefix import SharedPrefixPolicy


def page_tokens(spec: RunSpec) -> int:
    """Token positions in one vAttention page: pages are per layer and per K/V tensor."""
    g = spec.geometry
    per_layer_tensor = spec.kv_bytes_per_token // (2 * g.num_layers)
    tokens = spec.page_bytes // per_layer_tensor
    if tokens < 1:
        raise KvbenchError(
            f"page_bytes {spec.page_bytes} holds no token position "
            f"({per_layer_tensor} bytes per token per layer tensor)"
        )
    return tokens


POLICIES: dict[str, Callable[[RunSpec], Policy]] = {
    "contiguous-max": lambda s: ContiguousMax(s.budget_positions, s.memory.max_model_len, s.arena, s.block_size),
    "contiguous-pow2": lambda s: ContiguousPow2(s.budget_positions, s.memory.max_model_len, s.arena, s.block_size),
    "contiguous-oracle": lambda s: ContiguousOracle(s.budget_positions, s.memory.max_model_len, s.arena, s.block_size),
    "paged": lambda s: PagedPolicy(s.budget_positions, s.block_size),
    "paged-prefix": lambda s: PagedPrefixPolicy(s.budget_positions, s.block_size),
    "virtual-contiguous": lambda s: VirtualContiguousPolicy(s.budget_positions, page_tokens(s)),
}
assert tuple(POLICIES) == capabilities.POLICIES, "harness/spec/capabilities.py and the policy registry disagree"
assert tuple(ARENA_TYPES) == ARENAS, "harness/spec/specs.py's ARENAS and the arena registry disagree"


# Variants without block ids, for callers that never read them (the sim's fast path): block counts,
# and prefix caching as counts and content keys.
COUNTING: dict[str, Callable[[RunSpec], Policy]] = {
    "paged": lambda s: CountingPagedPolicy(s.budget_positions, s.block_size),
    "paged-prefix": lambda s: SharedPrefixPolicy(s.budget_positions, s.block_size),
    "virtual-contiguous": lambda s: CountingPagedPolicy(s.budget_positions, page_tokens(s), "virtual-contiguous"),
}
# … and those exact only where no two sequences share a block (no shared prefixes, one sample each).
COUNTING_UNSHARED: dict[str, Callable[[RunSpec], Policy]] = {
    "paged-prefix": lambda s: CountingPrefixPolicy(s.budget_positions, s.block_size),
}


def make_policy(spec: RunSpec, block_ids: bool = True, shared: bool = True) -> Policy:
    """The spec's policy; ``block_ids=False`` allows a variant that keeps only counts, and
    ``shared=False`` (no two sequences of the workload share a block) one more. A model whose
    layers are not all full attention gets vLLM's KV cache groups (``GroupedPagedPolicy``; with
    prefix caching ``GroupedPrefixPolicy``; a run per group: ``GroupedContiguousPolicy``)."""
    if not spec.geometry.is_uniform_full:  # vLLM's KV cache groups (RunSpec admits LAYOUT_POLICIES)
        if capabilities.is_contiguous(spec.policy):
            return GroupedContiguousPolicy(spec.kv_use, spec.memory.max_model_len, spec.policy, spec.arena)
        kind = GroupedPrefixPolicy if spec.policy == "paged-prefix" else GroupedPagedPolicy
        grouped: Policy = kind(spec.kv_use, spec.memory.max_model_len)
        assert isinstance(grouped, Policy)
        return grouped
    try:
        factory = POLICIES[spec.policy]
    except KeyError:
        raise KvbenchError(f"unknown policy {spec.policy!r} (known: {', '.join(POLICIES)})") from None
    if not block_ids:
        counting = COUNTING if shared else {**COUNTING, **COUNTING_UNSHARED}
        factory = counting.get(spec.policy, factory)
    policy = factory(spec)
    assert isinstance(policy, Policy)
    return policy
