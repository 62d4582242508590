"""What token ids each request's prompt holds and, in a conversation, what each answer holds.

One rule for every runner that sends tokens (``torch``, ``vllm-sched``, ``vllm``) and for the
prefix cache's block keys, so all of them see exactly the sharing the workload describes:

* plain requests: a prefix group's shared tokens from ``default_rng([seed, 1, group])``, the
  rest of the prompt from ``default_rng([seed, 2, request_id])``;
* hash-id traces: hash id ``h`` stands for ``default_rng([seed, 3, h])``'s
  ``hash_block_size`` ids; a prompt is its hash ids' blocks in order, the last cut to length;
* conversations: turn 0's prompt from ``default_rng([seed, 4, session, 0])``; turn k's is
  turn k−1's prompt, turn k−1's answer and a new message from
  ``default_rng([seed, 5, session, k])``; turn k's answer from
  ``default_rng([seed, 6, session, k])``.

Prompt ids lie in [1, vocab); answers in [3, vocab), never a model's BOS or EOS. Each
conversation is one array filled as far as its turns are asked for, so a turn's prompt is
a slice of it: no history is drawn twice.
"""

from __future__ import annotations

import numpy as np

from ..harness.errors import KvbenchError
from .table import Workload

FIRST_ANSWER_ID = 3  # answers are never BOS/EOS (ids 0..2 of the generated model config)
_ID_DTYPE = np.int32  # token ids stay far below 2**31; half the memory of int64


class _Conversation:
    """One conversation's tokens, filled turn by turn up to what has been asked for."""

    def __init__(self, rows: np.ndarray, prompt_len: np.ndarray, output_len: np.ndarray) -> None:
        self.rows = rows  # request ids, turn 0 first
        self.prompt_len = prompt_len[rows]
        self.output_len = output_len[rows]
        self.tokens = np.empty(int(self.prompt_len[-1] + self.output_len[-1]), dtype=_ID_DTYPE)
        self.filled = 0
        self.next_part = 0  # 2k: turn k's prompt part (its first prompt or new message); 2k+1: its answer


class Content:
    """Every request's prompt ids and every conversation turn's scripted answer."""

    def __init__(self, workload: Workload, seed: int, vocab_size: int, hash_block_size: int) -> None:
        if vocab_size < FIRST_ANSWER_ID + 1:
            raise KvbenchError(f"token content: vocab_size must be at least {FIRST_ANSWER_ID + 1}, got {vocab_size}")
        if hash_block_size < 1:
            raise KvbenchError(f"token content: hash_block_size must be >= 1, got {hash_block_size}")
        self.seed = int(seed)
        self.vocab = int(vocab_size)
        self.block = int(hash_block_size)
        r = workload.requests
        self.prompt_len = r["prompt_len"].to_numpy()
        self.output_len = r["output_len"].to_numpy()
        self.prefix_group = r["prefix_group"].to_numpy()
        self.prefix_len = r["prefix_len"].to_numpy()
        grouped = r[r["prefix_group"] >= 0]
        self.groups = {
            int(g): self._draw((self.seed, 1, int(g)), int(n), 1)
            for g, n in grouped.groupby("prefix_group")["prefix_len"].max().items()
        }
        self.hash_ids = workload.hash_ids
        self._blocks: dict[int, np.ndarray] = {}
        if self.hash_ids is not None:
            self._check_hash_ids()
        sessions = workload.sessions
        self.session_of: np.ndarray | None = None
        self.turn: np.ndarray | None = None
        self._conversations: dict[int, _Conversation] = {}
        self._rows_of: dict[int, np.ndarray] = {}
        if sessions is not None:
            self.session_of, self.turn = sessions.session_id, sessions.turn
            order = np.lexsort((sessions.turn, sessions.session_id))
            ends = np.flatnonzero(np.diff(sessions.session_id[order])) + 1
            for rows in np.split(order, ends):
                self._rows_of[int(sessions.session_id[rows[0]])] = rows

    def _check_hash_ids(self) -> None:
        assert self.hash_ids is not None
        counts = np.fromiter((ids.size for ids in self.hash_ids), dtype=np.int64, count=len(self.hash_ids))
        needed = -(-self.prompt_len // self.block)
        bad = np.flatnonzero(counts != needed)
        if bad.size:
            i = int(bad[0])
            raise KvbenchError(
                f"token content: request {i} has {int(counts[i])} hash ids for a prompt of {int(self.prompt_len[i])} "
                f"tokens, which at hash_block_size {self.block} needs {int(needed[i])}"
            )

    def _draw(self, key: tuple[int, ...], size: int, low: int) -> np.ndarray:
        if size <= 0:
            return np.zeros(0, dtype=_ID_DTYPE)
        return np.random.default_rng(list(key)).integers(low, self.vocab, size=size).astype(_ID_DTYPE)

    def _hash_block(self, h: int) -> np.ndarray:
        block = self._blocks.get(h)
        if block is None:  # traces reuse ids heavily: draw each block once
            block = self._blocks[h] = self._draw((self.seed, 3, h), self.block, 1)
        return block

    def _check_request(self, request_id: int) -> int:
        if isinstance(request_id, bool) or not 0 <= request_id < self.prompt_len.size:
            raise KvbenchError(f"token content: no request {request_id!r} (the workload has {self.prompt_len.size})")
        return int(request_id)

    def prompt_array(self, request_id: int) -> np.ndarray:
        """``prompt_ids`` as an int64 array."""
        i = self._check_request(request_id)
        length = int(self.prompt_len[i])
        if self.session_of is not None:
            conversation = self._filled(i, length)
            return conversation.tokens[:length].astype(np.int64)
        if self.hash_ids is not None:
            blocks = [self._hash_block(int(h)) for h in self.hash_ids[i].tolist()]
            return np.concatenate(blocks)[:length].astype(np.int64)
        group = int(self.prefix_group[i])
        shared = min(int(self.prefix_len[i]), length) if group >= 0 else 0
        own = self._draw((self.seed, 2, i), length - shared, 1)
        if not shared:
            return own.astype(np.int64)
        return np.concatenate([self.groups[group][:shared], own]).astype(np.int64)

    def prompt_ids(self, request_id: int) -> list[int]:
        """Exactly ``prompt_len`` ids, each in [1, vocab_size)."""
        return self.prompt_array(request_id).tolist()

    def answer_array(self, request_id: int) -> np.ndarray | None:
        """``answer_ids`` as an int64 array."""
        i = self._check_request(request_id)
        if self.session_of is None:
            return None
        start = int(self.prompt_len[i])
        end = start + int(self.output_len[i])
        return self._filled(i, end).tokens[start:end].astype(np.int64)

    def answer_ids(self, request_id: int) -> list[int] | None:
        """A conversation turn's scripted answer (``output_len`` ids in [3, vocab_size)); None
        for a request outside a conversation (its answer is whatever the model samples)."""
        answer = self.answer_array(request_id)
        return None if answer is None else answer.tolist()

    def _filled(self, request_id: int, upto: int) -> _Conversation:
        """The request's conversation, its tokens filled at least to position ``upto``."""
        assert self.session_of is not None
        session = int(self.session_of[request_id])
        conversation = self._conversations.get(session)
        if conversation is None:
            conversation = _Conversation(self._rows_of[session], self.prompt_len, self.output_len)
            self._conversations[session] = conversation
        c = conversation
        while c.filled < upto:
            turn, is_answer = divmod(c.next_part, 2)
            if is_answer:
                part = self._draw((self.seed, 6, session, turn), int(c.output_len[turn]), FIRST_ANSWER_ID)
            elif turn == 0:
                part = self._draw((self.seed, 4, session, 0), int(c.prompt_len[0]), 1)
            else:
                part = self._draw((self.seed, 5, session, turn), int(c.prompt_len[turn]) - c.filled, 1)
            c.tokens[c.filled : c.filled + part.size] = part
            c.filled += part.size
            c.next_part += 1
        return c
