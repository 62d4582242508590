"""Two KV caches behind one interface: a contiguous arena and a paged block pool.

Neither cache decides anything: placement is the allocation policy's, made by the same code
the simulator runs (``seq.alloc_start`` / ``seq.allocated``, or ``seq.blocks``); the caches turn
those decisions into tensor indices:

- **contiguous** — one arena ``[layers, 2, budget_positions, kv_heads, head_dim]``;
  position p of a sequence lives at arena slot ``alloc_start + p``;
- **paged** — a pool ``[layers, 2, num_blocks, block_size, kv_heads, head_dim]``;
  position p lives in block ``blocks[p // block_size]`` at offset
  ``p % block_size``.

Both write new K/V with one ``index_copy_`` per layer and tensor into a flat view of their
storage, so they differ only in how a sequence's context is found. Reads come in two shapes:

- one sequence at a time (``plan_reads`` / ``contexts``, used for prefill
  chunks): the contiguous cache slices the sequence's range (a view, no copy);
  the paged cache gathers its blocks through the block table (one
  ``index_select`` per layer for the whole step) — the portable reference of
  what a paged-attention kernel does in place;
- all decoding sequences as one padded batch (``plan_batch`` /
  ``batch_contexts``): a ragged batch cannot be a view of either layout, so
  both gather — the contiguous cache each sequence's range position by
  position, the paged cache its blocks through a padded block table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from ...harness.sim.sequence import Seq

# Opaque to the caller: what one layout's plan_reads returns and its contexts takes back.
ReadPlan = Any


@runtime_checkable
class KVCache(Protocol):
    kind: str  # "contiguous" or "paged"
    backend: str  # attention_backend column
    bytes_per_position: int  # all layers, K and V
    flat: torch.Tensor  # [layers, 2, slots, kv_heads, head_dim] view of the storage

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor backing the whole cache."""

    def slots(self, seq: Seq, start: int, end: int) -> list[int]:
        """Flat slots of positions [start, end) of ``seq``, from its placement."""

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Scatter new K and V ([T, kv_heads, head_dim]) of ``layer`` to flat ``slots``."""

    def copy_out(self, slots: torch.Tensor) -> torch.Tensor:
        """All layers' K/V at ``slots``, on the host (swap out)."""

    def copy_in(self, slots: torch.Tensor, data: torch.Tensor) -> None:
        """Write ``copy_out``'s data back at new ``slots`` (swap in)."""

    def plan_reads(self, spans: list[tuple[Seq, int]]) -> ReadPlan:
        """What ``contexts`` needs to read each (sequence, context length) this step."""

    def contexts(self, layer: int, plan: ReadPlan) -> list[torch.Tensor]:
        """Per sequence, its [2, ctx, kv_heads, head_dim] K/V of ``layer``."""

    def plan_batch(self, spans: list[tuple[Seq, int]]) -> BatchRead:
        """What ``batch_contexts`` needs to read all (sequence, context length) as one padded batch."""

    def batch_contexts(self, layer: int, plan: BatchRead) -> torch.Tensor:
        """[2, B, L, kv_heads, head_dim] K/V of ``layer``; row b is valid where ``plan.mask`` is."""

    def allocated_bytes(self, holders: Iterable[Seq]) -> int:
        """Bytes of cache storage backing the positions the live sequences hold."""


@dataclasses.dataclass(frozen=True)
class BatchRead:
    """A padded read of B sequences' contexts: one gather per layer and tensor."""

    index: torch.Tensor  # positions (contiguous) or blocks (paged) to gather, B × per-row entries
    rows: int  # B
    length: int  # L, padded context length
    mask: torch.Tensor  # [B, 1, 1, L] bool: True where a position belongs to the sequence


def _mask(ctx: np.ndarray, length: int, device: torch.device) -> torch.Tensor:
    valid = np.arange(length)[None, :] < ctx[:, None]
    return torch.from_numpy(valid).to(device)[:, None, None, :]


def _check_placement(ok: bool, what: str, seq: Seq) -> None:
    if not ok:
        raise AssertionError(f"torch KV cache: {what} for {seq!r}")


# Index kernels (index_copy_, index_select) lack fp8 on the CPU: move fp8 bytes as uint8.
_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def raw(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself, or its bytes as uint8 when it is fp8 (same storage, same shape)."""
    return t.view(torch.uint8) if t.dtype in _FP8 else t


def cooked(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Inverse of ``raw`` for a tensor of cache dtype ``dtype``."""
    return t.view(dtype) if dtype in _FP8 else t


class _FlatCache:
    flat: torch.Tensor
    bytes_per_position: int

    @property
    def nbytes(self) -> int:
        return self.flat.numel() * self.flat.element_size()

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Scatter the step's new K and V ([T, kv_heads, head_dim]) to their slots."""
        dest = raw(self.flat[layer])
        dtype = self.flat.dtype
        dest[0].index_copy_(0, slots, raw(k.to(dtype)))
        dest[1].index_copy_(0, slots, raw(v.to(dtype)))

    def copy_out(self, slots: torch.Tensor) -> torch.Tensor:
        """[layers, 2, n, kv_heads, head_dim] at ``slots``, on the host (swap out)."""
        return cooked(raw(self.flat).index_select(2, slots), self.flat.dtype).to("cpu")

    def copy_in(self, slots: torch.Tensor, data: torch.Tensor) -> None:
        """Write swapped-out K/V back at new ``slots`` (swap in)."""
        raw(self.flat).index_copy_(2, slots, raw(data.to(self.flat.device)))


class ContiguousKVCache(_FlatCache):
    kind = "contiguous"
    backend = "torch-contiguous"

    def __init__(
        self,
        num_layers: int,
        num_positions: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.arena = torch.zeros(num_layers, 2, num_positions, kv_heads, head_dim, dtype=dtype, device=device)
        self.flat = self.arena
        self.num_positions = num_positions
        self.device = device
        self.bytes_per_position = num_layers * 2 * kv_heads * head_dim * self.arena.element_size()

    def slots(self, seq: Seq, start: int, end: int) -> list[int]:
        _check_placement(seq.alloc_start >= 0 and end <= seq.allocated, f"positions up to {end} not reserved", seq)
        base = seq.alloc_start
        return list(range(base + start, base + end))

    def plan_reads(self, spans: list[tuple[Seq, int]]) -> list[tuple[int, int]]:
        return [(seq.alloc_start, ctx) for seq, ctx in spans]

    def contexts(self, layer: int, plan: list[tuple[int, int]]) -> list[torch.Tensor]:
        arena = self.arena[layer]
        return [arena[:, start : start + ctx] for start, ctx in plan]

    def plan_batch(self, spans: list[tuple[Seq, int]]) -> BatchRead:
        """Row b reads its range ``alloc_start + [0, L)``, clamped to its last position."""
        starts = np.fromiter((s.alloc_start for s, _ in spans), dtype=np.int64, count=len(spans))
        ctx = np.fromiter((c for _, c in spans), dtype=np.int64, count=len(spans))
        length = int(ctx.max())
        index = starts[:, None] + np.minimum(np.arange(length)[None, :], ctx[:, None] - 1)
        return BatchRead(
            torch.from_numpy(index.reshape(-1)).to(self.device), len(spans), length, _mask(ctx, length, self.device)
        )

    def batch_contexts(self, layer: int, plan: BatchRead) -> torch.Tensor:
        arena = self.arena[layer]  # [2, positions, kv_heads, hd]
        out = cooked(raw(arena).index_select(1, plan.index), arena.dtype)
        return out.view(2, plan.rows, plan.length, *arena.shape[2:])

    def allocated_bytes(self, holders: Iterable[Seq]) -> int:
        return sum(s.allocated for s in holders) * self.bytes_per_position


class PagedKVCache(_FlatCache):
    kind = "paged"
    backend = "torch-gather"

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.pool = torch.zeros(num_layers, 2, num_blocks, block_size, kv_heads, head_dim, dtype=dtype, device=device)
        self.flat = self.pool.view(num_layers, 2, num_blocks * block_size, kv_heads, head_dim)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.bytes_per_position = num_layers * 2 * kv_heads * head_dim * self.pool.element_size()
        self.device = device

    @property
    def bytes_per_block(self) -> int:
        return self.block_size * self.bytes_per_position

    def slots(self, seq: Seq, start: int, end: int) -> list[int]:
        bs, blocks = self.block_size, seq.blocks
        _check_placement(end <= len(blocks) * bs, f"positions up to {end} not backed by blocks", seq)
        return [blocks[p // bs] * bs + p % bs for p in range(start, end)]

    def plan_reads(self, spans: list[tuple[Seq, int]]) -> tuple[torch.Tensor, list[tuple[int, int]]]:
        """One block table for the whole step: every sequence's blocks, concatenated."""
        bs = self.block_size
        table: list[int] = []
        where: list[tuple[int, int]] = []
        for seq, ctx in spans:
            where.append((len(table) * bs, ctx))
            table.extend(seq.blocks[: -(-ctx // bs)])
        return torch.tensor(table, dtype=torch.long).to(self.device, non_blocking=True), where

    def contexts(self, layer: int, plan: tuple[torch.Tensor, list[tuple[int, int]]]) -> list[torch.Tensor]:
        table, where = plan
        pool = self.pool[layer]
        gathered = cooked(raw(pool).index_select(1, table), pool.dtype).flatten(
            1, 2
        )  # [2, Σ blocks × bs, kv_heads, hd]
        return [gathered[:, off : off + ctx] for off, ctx in where]

    def plan_batch(self, spans: list[tuple[Seq, int]]) -> BatchRead:
        """A padded block table: row b's blocks, the last one repeated up to the widest row."""
        bs = self.block_size
        ctx = np.fromiter((c for _, c in spans), dtype=np.int64, count=len(spans))
        nblocks = -(-ctx // bs)
        width = int(nblocks.max())
        table = np.empty((len(spans), width), dtype=np.int64)
        for b, (seq, _) in enumerate(spans):
            n = int(nblocks[b])
            table[b, :n] = seq.blocks[:n]
            table[b, n:] = seq.blocks[n - 1]
        length = width * bs
        return BatchRead(
            torch.from_numpy(table.reshape(-1)).to(self.device), len(spans), length, _mask(ctx, length, self.device)
        )

    def batch_contexts(self, layer: int, plan: BatchRead) -> torch.Tensor:
        pool = self.pool[layer]  # [2, blocks, block_size, kv_heads, hd]
        out = cooked(raw(pool).index_select(1, plan.index), pool.dtype)
        return out.view(2, plan.rows, plan.length, *pool.shape[3:])

    def allocated_bytes(self, holders: Iterable[Seq]) -> int:
        blocks: set[int] = set()
        for s in holders:
            blocks.update(s.blocks)  # a block shared by several sequences is one block of memory
        return len(blocks) * self.bytes_per_block
