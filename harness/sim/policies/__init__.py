"""Allocation policies, by name: a registry of ``PolicyEntry`` (a plain dict checked against ``Policy``).

An entry is a policy as the simulator builds it: the reference implementation (block ids, run by
the step-by-step ``Scheduler``), whether the fast scheduler may drive it, and its fast twins (the
same decisions kept as counts). A policy that declares ``fast=False`` runs exact on the reference
loop, and its runs say so (``sim_path``). harness/sim/README.md says what ``fast=True`` promises
and lists the files a new policy touches.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ...errors import KvbenchError
from ...spec import capabilities
from ...spec.specs import ARENAS, RunSpec
from .arena import ARENA_TYPES
from .base import Policy
from .contiguous import ContiguousMax, ContiguousOracle, ContiguousPolicy, ContiguousPow2
from .counting_grouped import CountingGroupedPolicy
from .counting_grouped_prefix import CountingGroupedPrefixPolicy
from .counting_prefix import CountingPrefixPolicy
from .grouped import GroupedPagedPolicy
from .grouped_contiguous import GroupedContiguousPolicy
from .grouped_prefix import GroupedPrefixPolicy
from .paged import CountingPagedPolicy, PagedPolicy, PagedPrefixPolicy, VirtualContiguousPolicy
from .shared_prefix import SharedPrefixPolicy

Factory = Callable[[RunSpec], Policy]

# The two loops that schedule a sim run (a runs column, ``sim_path``).
FAST = "fast"
REFERENCE = "reference"


@dataclasses.dataclass(frozen=True)
class PolicyEntry:
    """A policy as the simulator builds it.

    ``fast``: the fast scheduler (``FastScheduler``) may drive the reference policy; it then
    keeps the reference's records exactly (harness/sim/README.md, "What the fast path assumes").
    ``counting``: a fast twin keeping counts, no block ids (used only on the fast path);
    ``counting_unshared``: one more, exact only where no two sequences share a block."""

    reference: Factory
    fast: bool
    counting: Factory | None = None
    counting_unshared: Factory | None = None

    def __post_init__(self) -> None:
        if not self.fast and (self.counting or self.counting_unshared):
            raise ValueError("a policy off the fast path has no fast twin to use")

    def build(self, spec: RunSpec, block_ids: bool, shared: bool) -> Policy:
        """The policy for a run: the reference, or (``block_ids=False``) a fast twin where one exists."""
        factory = self.reference
        if not block_ids:
            twin = self.counting_unshared if not shared and self.counting_unshared else self.counting
            factory = twin or factory
        policy = factory(spec)
        assert isinstance(policy, Policy)
        return policy


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


def _contiguous(kind: type[ContiguousPolicy]) -> Factory:
    return lambda s: kind(s.budget_positions, s.memory.max_model_len, s.arena, s.block_size)


# A model of full attention only.
POLICIES: dict[str, PolicyEntry] = {
    "contiguous-max": PolicyEntry(_contiguous(ContiguousMax), fast=True),
    "contiguous-pow2": PolicyEntry(_contiguous(ContiguousPow2), fast=True),
    "contiguous-oracle": PolicyEntry(_contiguous(ContiguousOracle), fast=True),
    "paged": PolicyEntry(
        lambda s: PagedPolicy(s.budget_positions, s.block_size),
        fast=True,
        counting=lambda s: CountingPagedPolicy(s.budget_positions, s.block_size),
    ),
    "paged-prefix": PolicyEntry(
        lambda s: PagedPrefixPolicy(s.budget_positions, s.block_size),
        fast=True,
        counting=lambda s: SharedPrefixPolicy(s.budget_positions, s.block_size),
        counting_unshared=lambda s: CountingPrefixPolicy(s.budget_positions, s.block_size),
    ),
    "virtual-contiguous": PolicyEntry(
        lambda s: VirtualContiguousPolicy(s.budget_positions, page_tokens(s)),
        fast=True,
        counting=lambda s: CountingPagedPolicy(s.budget_positions, page_tokens(s), "virtual-contiguous"),
    ),
}
assert tuple(POLICIES) == capabilities.POLICIES, "harness/spec/capabilities.py and the policy registry disagree"
assert tuple(ARENA_TYPES) == ARENAS, "harness/spec/specs.py's ARENAS and the arena registry disagree"


def _grouped_contiguous(s: RunSpec) -> Policy:
    return GroupedContiguousPolicy(s.kv_use, s.memory.max_model_len, s.policy, s.arena)


# A model whose layers are not all full attention: vLLM's KV cache groups (``RunSpec`` admits
# ``capabilities.LAYOUT_POLICIES`` there). The contiguous policies run a reservation per group,
# on the reference loop only.
GROUPED: dict[str, PolicyEntry] = {
    "paged": PolicyEntry(
        lambda s: GroupedPagedPolicy(s.kv_use, s.memory.max_model_len),
        fast=True,
        counting=lambda s: CountingGroupedPolicy(s.kv_use, s.memory.max_model_len),
    ),
    "paged-prefix": PolicyEntry(
        lambda s: GroupedPrefixPolicy(s.kv_use, s.memory.max_model_len),
        fast=True,
        counting=lambda s: CountingGroupedPrefixPolicy(s.kv_use, s.memory.max_model_len),
    ),
    **{
        p: PolicyEntry(_grouped_contiguous, fast=False)
        for p in capabilities.LAYOUT_POLICIES
        if capabilities.is_contiguous(p)
    },
}
assert tuple(sorted(GROUPED)) == tuple(sorted(capabilities.LAYOUT_POLICIES)), (
    "the grouped registry and LAYOUT_POLICIES disagree"
)


def policy_entry(spec: RunSpec) -> PolicyEntry:
    """The registry entry of the spec's policy, over the spec's layout."""
    table = POLICIES if spec.geometry.is_uniform_full else GROUPED
    try:
        return table[spec.policy]
    except KeyError:
        raise KvbenchError(f"unknown policy {spec.policy!r} (known: {', '.join(table)})") from None


def make_policy(spec: RunSpec, block_ids: bool = True, shared: bool = True) -> Policy:
    """The spec's policy; ``block_ids=False`` allows a fast twin that keeps only counts, and
    ``shared=False`` (no two sequences of the workload share a block) one more. A model whose
    layers are not all full attention gets vLLM's KV cache groups (``GROUPED``)."""
    return policy_entry(spec).build(spec, block_ids, shared)
