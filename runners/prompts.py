"""Deterministic prompt token ids, the same in every runner that computes tokens (``torch``,
``vllm-sched``, ``vllm``): a prefix group's shared tokens from ``default_rng([seed, 1, group])``,
the rest of the prompt from ``default_rng([seed, 2, request_id])``, ids in [1, vocab).

So every sample of a request has the same prompt and a group's members share their prefix,
which is what the prefix-caching policy's block keys assume (``PagedPolicy.key_of``). The range
starts at 1 because vLLM's runners always drew from there (``tests/test_vllm_sched.py`` pins it);
the ``torch`` runner drew from 0 before this module was shared, but nothing it records depends on
the ids' values, only on which prompts share them."""

from __future__ import annotations

import numpy as np

from ..harness.sim.sequence import Seq
from .base import Cell


class PromptIds:
    """Deterministic prompt token ids per request (see the module docstring)."""

    def __init__(self, cell: Cell) -> None:
        self.seed = cell.spec.workload.seed
        self.vocab = cell.spec.geometry.vocab_size
        df = cell.workload.requests
        grouped = df[df["prefix_group"] >= 0]
        self.groups = {
            int(g): self._draw([self.seed, 1, int(g)], int(n))
            for g, n in grouped.groupby("prefix_group")["prefix_len"].max().items()
        }
        self._last: tuple[int, list[int]] | None = None

    def _draw(self, key: list[int], size: int) -> list[int]:
        if size <= 0:
            return []
        return np.random.default_rng(key).integers(1, self.vocab, size=size).tolist()

    def of(self, seq: Seq) -> list[int]:
        if self._last is not None and self._last[0] == seq.request_id:
            return self._last[1]  # samples of one request share the whole prompt
        shared = min(seq.prefix_len, seq.prompt_len) if seq.prefix_group >= 0 else 0
        ids = self.groups[seq.prefix_group][:shared] if shared else []
        ids = ids + self._draw([self.seed, 2, seq.request_id], seq.prompt_len - shared)
        self._last = (seq.request_id, ids)
        return ids
