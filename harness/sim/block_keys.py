"""Content keys of KV blocks: a full block is identified by its tokens and every token before it.

vLLM's prefix cache keys a full block by a chained hash — the parent block's hash and this
block's token ids — so two sequences share a cached block exactly when their token ids agree
from position 0 to the block's end, whatever made them agree (a shared system prompt, the
earlier turns of a conversation, a trace's hash ids, chance). ``BlockKeys`` gives the same
identity without a hash: each distinct (parent key, block tokens) pair is interned once and
numbered, so equal keys mean equal content, with no collisions to reason about. One
``BlockKeys`` per run, shared by all its sequences.
"""

from __future__ import annotations

import numpy as np

NO_PARENT = -1


class BlockKeys:
    """Interned chained block keys (module docstring)."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._ids: dict[tuple[int, bytes], int] = {}

    def chain(self, tokens: np.ndarray) -> list[int]:
        """The keys of every full block of ``tokens`` (a sequence's token ids from position 0)."""
        bs = self.block_size
        full = len(tokens) // bs
        data = np.ascontiguousarray(tokens[: full * bs], dtype=np.int64).tobytes()
        width = bs * 8
        ids = self._ids
        keys: list[int] = []
        parent = NO_PARENT
        for i in range(full):
            k = (parent, data[i * width : (i + 1) * width])
            parent = ids.get(k, -2)
            if parent == -2:
                parent = ids[k] = len(ids)
            keys.append(parent)
        return keys

    def __len__(self) -> int:
        """Distinct block contents seen so far."""
        return len(self._ids)
