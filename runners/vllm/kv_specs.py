"""vLLM's KV cache config for a kvbench geometry, built as vLLM's engine builds it: one
``KVCacheSpec`` per layer, then vLLM's own grouping and block split (``get_kv_cache_configs``,
``generate_scheduler_kv_cache_config``) over them. The one difference between the builds (0.33
moved the planning functions to ``kv_cache_planning`` and gives ``get_kv_cache_configs`` the
global groups) is kept in ``kv_cache_config``. Import only after ``build.load()``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...harness.spec.geometry import ModelGeometry
from ...harness.spec.layer_kinds import CHUNKED, FULL, GDN, MAMBA1, MAMBA2, MLA, SLIDING, STATE_DTYPE_BYTES

TORCH_DTYPES = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "fp32": "float32",
    "fp8": "float8_e4m3fn",
    "fp8_e4m3": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2",
}
_STATE_TORCH = {name: TORCH_DTYPES[name] for name in STATE_DTYPE_BYTES}


def layer_name(index: int) -> str:
    return f"model.layers.{index}.attn"


def layer_index(name: str) -> int:
    return int(name.split(".")[2])


def state_shapes_and_dtypes(geometry: ModelGeometry, tp: int = 1) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """A state layer's tensor shapes and dtypes, from kvbench's mirror of vLLM's calculator."""
    import torch

    assert geometry.state is not None
    conv, temporal = geometry.state.shapes(tp)
    state = geometry.state
    return (conv, temporal), (
        getattr(torch, _STATE_TORCH[state.conv_dtype]),
        getattr(torch, _STATE_TORCH[state.temporal_dtype]),
    )


def layer_specs(
    geometry: ModelGeometry,
    kv_dtype: str,
    *,
    block_size: int,
    vc: Any,
    state: tuple[Sequence[Any], Sequence[Any]] | None = None,
    tensor_parallel_size: int = 1,
    cache_dtype: str = "auto",
) -> dict[str, Any]:
    """Each layer's vLLM spec for ``geometry``: ``block_size`` is the attention block size vLLM
    runs (after its Mamba rule); state layers' block size and padding come from ``vc``'s cache
    config; ``state`` is their (shapes, dtypes), kvbench's own when not given."""
    import torch
    from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum as M
    from vllm.v1.kv_cache_interface import (
        ChunkedLocalAttentionSpec,
        FullAttentionSpec,
        MambaSpec,
        MLAAttentionSpec,
        SlidingWindowSpec,
    )

    dtype = getattr(torch, TORCH_DTYPES[kv_dtype])
    heads = geometry.kv_heads_per_rank(tensor_parallel_size)
    shapes: Sequence[Any] = ()
    dtypes: Sequence[Any] = ()
    if geometry.state is not None:
        shapes, dtypes = state if state is not None else state_shapes_and_dtypes(geometry, tensor_parallel_size)
    mamba_types = {MAMBA1: M.MAMBA1, MAMBA2: M.MAMBA2, GDN: M.GDN_ATTN}
    common = dict(block_size=block_size, num_kv_heads=heads, head_size=geometry.head_dim, dtype=dtype)
    cc = vc.cache_config
    specs: dict[str, Any] = {}
    for i, (kind, window) in enumerate(geometry.per_layer()):
        name = layer_name(i)
        if kind == FULL:
            specs[name] = FullAttentionSpec(**common)
        elif kind == SLIDING:
            specs[name] = SlidingWindowSpec(**common, sliding_window=window)
        elif kind == CHUNKED:
            specs[name] = ChunkedLocalAttentionSpec(**common, attention_chunk_size=window)
        elif kind == MLA:
            specs[name] = MLAAttentionSpec(
                block_size=block_size,
                num_kv_heads=1,
                head_size=geometry.kv_lora_rank + geometry.qk_rope_head_dim,
                dtype=dtype,
                cache_dtype_str=cache_dtype,
            )
        else:
            specs[name] = MambaSpec(
                shapes=tuple(shapes),
                dtypes=tuple(dtypes),
                block_size=cc.mamba_block_size,
                page_size_padded=cc.mamba_page_size_padded,
                mamba_type=mamba_types[kind],
                mamba_cache_mode=cc.mamba_cache_mode,
            )
    return specs


def kv_cache_config(vc: Any, workers: list[dict[str, Any]], budget: int) -> Any:
    """vLLM's scheduler ``KVCacheConfig`` for per-worker (pipeline stage) specs and a per-GPU budget."""
    from vllm.v1.core import kv_cache_utils as U

    try:
        from vllm.v1.core import kv_cache_planning as P
    except ImportError:  # 0.32: the planning functions live in kv_cache_utils
        P = None
    if P is not None:
        groups = P.get_global_kv_cache_groups(vc, [dict(w) for w in workers])
        cfgs = P.get_kv_cache_configs(vc, [dict(w) for w in workers], [budget] * len(workers), groups)
    else:
        cfgs = U.get_kv_cache_configs(vc, [dict(w) for w in workers], [budget] * len(workers))
    return U.generate_scheduler_kv_cache_config(cfgs)


def block_sizes(kcc: Any, vc: Any) -> tuple[int, int]:
    """(scheduler block size, hash block size) vLLM resolves for a ``KVCacheConfig``."""
    from vllm.v1.core import kv_cache_utils as U

    scheduler, hashing = U.resolve_kv_cache_block_sizes(kcc, vc)
    return int(scheduler), int(hashing)


def kind_of(spec: Any) -> str:
    """kvbench's name for a vLLM spec's kind."""
    from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum as M
    from vllm.v1.kv_cache_interface import (
        ChunkedLocalAttentionSpec,
        FullAttentionSpec,
        MambaSpec,
        MLAAttentionSpec,
        SlidingWindowSpec,
    )

    if isinstance(spec, MLAAttentionSpec):
        return MLA
    if isinstance(spec, FullAttentionSpec):
        return FULL
    if isinstance(spec, SlidingWindowSpec):
        return SLIDING
    if isinstance(spec, ChunkedLocalAttentionSpec):
        return CHUNKED
    assert isinstance(spec, MambaSpec), type(spec)
    return {M.MAMBA1: MAMBA1, M.MAMBA2: MAMBA2, M.GDN_ATTN: GDN}[spec.mamba_type]


def groups_of(kcc: Any) -> list[tuple[str, tuple[int, ...], int, int]]:
    """(kind, layer indices, block size, page bytes) of each group of a ``KVCacheConfig``."""
    out = []
    for g in kcc.kv_cache_groups:
        spec = g.kv_cache_spec
        out.append(
            (kind_of(spec), tuple(map(layer_index, g.layer_names)), int(spec.block_size), int(spec.page_size_bytes))
        )
    return out
