"""Shared-prefix groups: requests whose prompts start with the same tokens.

With ``k`` groups and a prefix of ``p`` tokens, every request joins a group
round-robin in arrival order (request i -> group i mod k). Round-robin rather
than random: groups stay equal-sized (±1) and the assignment is
hand-checkable; the interleaving already mixes groups in the running batch,
which is what stresses prefix caching. Every prompt is raised to at least
p + 1 tokens, so each request has at least one token of its own to compute
(vLLM likewise never serves a whole prompt from the prefix cache).
"""

from __future__ import annotations

import numpy as np

NO_GROUP = -1


def raise_prompts_for_prefix(prompt_len: np.ndarray, prefix_len: int) -> np.ndarray:
    """Prompts of at least ``prefix_len + 1`` tokens when a prefix is shared (unchanged when 0)."""
    if prefix_len <= 0:
        return prompt_len
    return np.maximum(prompt_len, prefix_len + 1).astype(np.int64)


def assign_prefix_groups(count: int, groups: int, prefix_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(prefix_group, prefix_len) columns for ``count`` requests in arrival order.

    ``groups == 0`` means no sharing: group -1 and prefix length 0 everywhere.
    """
    if groups <= 0 or prefix_len <= 0:
        return np.full(count, NO_GROUP, dtype=np.int64), np.zeros(count, dtype=np.int64)
    group = np.arange(count, dtype=np.int64) % groups
    return group, np.full(count, prefix_len, dtype=np.int64)
