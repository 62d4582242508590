"""Every sequence's token ids, block by block, as the content keys prefix caching matches on.

The prompt's ids are ``workloads.content``'s (the ids ``vllm-sched``, ``vllm`` and ``torch``
send). The output's are the mocked model's (``sampled_token``, what ``vllm-sched`` samples),
or a conversation turn's scripted answer (which ``vllm-sched``'s mocked model samples for
it). From them ``harness.sim.block_keys`` gives each full block its chained content key, so
kvbench's prefix cache shares a block exactly when vLLM's would: whatever makes two
sequences' tokens agree from position 0 to the block's end.
"""

from __future__ import annotations

import numpy as np

from ..harness.sim.block_keys import BlockKeys
from ..harness.sim.sequence import Seq
from .base import Cell
from .prompts import PromptIds

FIRST_SAMPLED_ID = 3  # mocked samples are never BOS/EOS


def sampled_token(seq_index: int, position: int, vocab_size: int) -> int:
    """The mocked model's token for ``seq_index`` at ``position``: deterministic, never a stop id."""
    span = vocab_size - FIRST_SAMPLED_ID
    return FIRST_SAMPLED_ID + (seq_index * 1_000_003 + position * 7_919) % span


def sampled_tokens(seq_index: int, start: int, count: int, vocab_size: int) -> np.ndarray:
    """``sampled_token`` at positions ``start`` … ``start + count − 1``, at once."""
    span = vocab_size - FIRST_SAMPLED_ID
    positions = np.arange(start, start + count, dtype=np.int64)
    return FIRST_SAMPLED_ID + (seq_index * 1_000_003 + positions * 7_919) % span


class SequenceTokens:
    """Each sequence's whole token ids: its prompt, then the tokens it will be given."""

    def __init__(self, cell: Cell) -> None:
        self.prompts = PromptIds(cell)
        self.vocab = cell.spec.geometry.vocab_size

    def answer(self, seq: Seq) -> np.ndarray | None:
        """A conversation turn's scripted answer (what the mocked model samples for it)."""
        return self.prompts.content.answer_array(seq.request_id)

    def output(self, seq: Seq) -> np.ndarray:
        answer = self.answer(seq)
        if answer is not None:
            return answer
        return sampled_tokens(seq.index, seq.prompt_len, seq.output_len, self.vocab)

    def of(self, seq: Seq) -> np.ndarray:
        prompt = self.prompts.content.prompt_array(seq.request_id)
        return np.concatenate([prompt, self.output(seq)])


def assign_block_keys(cell: Cell, seqs: list[Seq], block_size: int) -> None:
    """Set every sequence's ``block_keys``: the content key of each full block of its tokens."""
    tokens = SequenceTokens(cell)
    keys = BlockKeys(block_size)
    for seq in seqs:
        seq.block_keys = keys.chain(tokens.of(seq))
