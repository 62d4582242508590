"""What the fast path reads of a policy over vLLM's KV cache groups: ``CountingGroupedPolicy``
(``paged``) and ``CountingGroupedPrefixPolicy`` (``paged-prefix``) both offer it, and
``harness.sim.grouped_stretch`` runs either."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from ...spec.kv_layout import KVGroup
from ...spec.kv_use import KVUse
from ..sequence import Seq


class GroupCounts(Protocol):
    """A policy over KV cache groups whose step measures are running totals (``sums``: per twin
    set a used-bytes line's constant and slope and its real blocks, last the internal bytes)
    and whose requests act only where ``reach`` says."""

    @property
    def groups(self) -> Sequence[KVGroup]: ...

    @property
    def use(self) -> KVUse: ...

    @property
    def num_blocks(self) -> int: ...

    @property
    def budget_positions(self) -> int: ...

    @property
    def needs_run_order(self) -> bool: ...  # block ids: a step's acts in running order

    steps: int  # steps measured so far
    sums: list[int]
    twin_of: list[int]  # per group: its twin set
    last_groups: list[tuple[int, int]]
    evictions: int
    # Since a waiting request's admission need was worked out, it may have moved anyhow where
    # ``admission_epoch`` moves; else it may have grown where ``admission_grown`` moves, and
    # fallen by no more than ``admission_slack`` grew.
    admission_epoch: int
    admission_grown: int
    admission_slack: int

    def free_blocks(self) -> int: ...

    def cached_free_blocks(self) -> int: ...

    def external_frag(self, head_of_line: Seq | None) -> int: ...

    def reach(self, seq: Seq) -> int: ...

    def act(self, seq: Seq) -> int: ...

    def crossing_need(self, seqs: Iterable[Seq]) -> int: ...

    def acts_need(self, seqs: Iterable[Seq]) -> tuple[int, int]: ...

    def admission_blocks(self, seq: Seq, num_tokens: int, must_fit: int) -> int: ...

    def resync(self) -> None: ...


def measure_sums(policy: GroupCounts) -> tuple[int, int]:
    """``measure_use`` from the running totals: the next step measured, its per-group (blocks,
    used bytes) kept in ``last_groups``; (used, internal) in the layout's positions."""
    policy.steps = at = policy.steps + 1
    tot = policy.sums
    per = [(tot[k + 2], tot[k] + tot[k + 1] * at) for k in range(0, len(tot) - 1, 3)]
    policy.last_groups = groups = [per[k] for k in policy.twin_of]
    unit = policy.use.unit
    return sum(u for _, u in groups) // unit, tot[-1] // unit
