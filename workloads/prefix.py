"""Shared-prefix groups: requests whose prompts start with the same tokens.

With ``k`` groups and a prefix of ``p`` tokens, every request joins a group
round-robin in arrival order (request i -> group i mod k). Round-robin rather
than random: groups stay equal-sized (±1) and the assignment is
hand-checkable; the interleaving already mixes groups in the running batch,
which is what stresses prefix caching. Each request needs at least one token
of its own after the prefix (vLLM likewise never serves a whole prompt from
the prefix cache): a sampled prompt is raised to at least p + 1 tokens, as the
distribution's lower end; a length the user wrote down (a fixed ``prompt_len``,
a trace's rows) is never changed: one not longer than p is an error.
"""

from __future__ import annotations

import numpy as np

from ..harness.errors import KvbenchError

NO_GROUP = -1


def check_prompts_exceed_prefix(prompt_len: np.ndarray, prefix_len: int, where: str) -> None:
    """Refuse prompts read from a file that the shared prefix would cover whole."""
    if prefix_len <= 0:
        return
    short = int(np.count_nonzero(prompt_len <= prefix_len))
    if short:
        raise KvbenchError(
            f"{where}: {short:,} of the {prompt_len.size:,} prompts are not longer than prefix_len "
            f"({prefix_len}): every request needs a token of its own after the shared prefix"
        )


def raise_prompts_for_prefix(prompt_len: np.ndarray, prefix_len: int) -> np.ndarray:
    """Sampled prompts of at least ``prefix_len + 1`` tokens when a prefix is shared (unchanged when 0)."""
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
