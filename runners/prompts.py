"""Deterministic prompt token ids, the same in every runner that computes tokens (``torch``,
``vllm-sched``, ``vllm``): what ``workloads.content.Content`` says each request's prompt holds
(a prefix group's shared tokens, a hash-id trace's blocks, a conversation's history), ids in
[1, vocab).

So every sample of a request has the same prompt and requests share exactly the tokens the
workload says they share, which is what the prefix-caching policy's block keys assume. Id 0 is
left out (``tests/runners/test_vllm_sched.py`` pins the range); what a runner records depends only on which
prompts share tokens, never on the ids' values."""

from __future__ import annotations

from ..harness.sim.sequence import Seq
from ..workloads.content import Content
from .base import Cell


class PromptIds:
    """Deterministic prompt token ids per request (see the module docstring)."""

    def __init__(self, cell: Cell) -> None:
        spec = cell.spec.workload
        self.content = Content(cell.workload, spec.seed, cell.spec.geometry.vocab_size, spec.hash_block_size)
        self._last: tuple[int, list[int]] | None = None

    def of(self, seq: Seq) -> list[int]:
        if self._last is not None and self._last[0] == seq.request_id:
            return self._last[1]  # samples of one request share the whole prompt
        ids = self.content.prompt_ids(seq.request_id)
        self._last = (seq.request_id, ids)
        return ids
