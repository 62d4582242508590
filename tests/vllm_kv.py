"""vLLM's own KV cache arithmetic for a kvbench geometry: each layer's ``KVCacheSpec`` built with
vLLM's classes (state shapes and dtypes from the model class's own calculators on the config), and
vLLM's grouping and block split on them. The one difference between the builds (0.33 moved the
planning functions to ``kv_cache_planning`` and gives ``get_kv_cache_configs`` the global groups)
is kept in ``kv_cache_config``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from kvbench.harness.spec.geometry import ModelGeometry
from kvbench.harness.spec.layer_kinds import CHUNKED, FULL, GDN, MAMBA1, MAMBA2, MLA, SLIDING
from kvbench.runners.vllm import build as vllm_build

from tests.conftest import DATA

MODELS = DATA / "models"
NEUTRAL_MODEL = MODELS / "llama-3.1-8b-instruct"  # any local config.json: the specs come from the geometry
TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp8": "float8_e4m3fn"}


def vllm_config(
    model_dir: Path,
    *,
    max_model_len: int,
    block_size: int,
    hybrid: bool,
    prefix_caching: bool = False,
    max_num_batched_tokens: int = 2048,
    mamba_block_size: int | None = None,
    mamba_page_size_padded: int | None = None,
) -> Any:
    """A ``VllmConfig`` with the settings the arithmetic reads; the hybrid flag set after
    construction, as the platform resolves it there (notes: vllm-hybrid-kv.md)."""
    vllm_build.load()
    # Registered here, vLLM inspects the architecture in this process (where the CPU build's media
    # packages are hidden), not in a child.
    vllm_build.register_in_process(json.loads((model_dir / "config.json").read_text())["architectures"])
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig

    mc = ModelConfig(model=str(model_dir), skip_tokenizer_init=True, max_model_len=max_model_len, dtype="bfloat16")
    cc = CacheConfig(block_size=block_size, cache_dtype="auto", enable_prefix_caching=prefix_caching)
    sc = SchedulerConfig(
        max_num_seqs=64,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        is_encoder_decoder=False,
        enable_chunked_prefill=True,
        async_scheduling=False,
    )
    vc = VllmConfig(model_config=mc, cache_config=cc, scheduler_config=sc, device_config=DeviceConfig(device="cpu"))
    if vc.cache_config.kv_cache_layout is None:
        vc.cache_config.kv_cache_layout = "LBNHC"  # layer-outermost, as the engine core resolves it
    vc.scheduler_config.disable_hybrid_kv_cache_manager = not hybrid
    vc.cache_config.mamba_cache_mode = "align" if prefix_caching else "none"
    vc.cache_config.mamba_block_size = mamba_block_size or (block_size if prefix_caching else max_model_len)
    vc.cache_config.mamba_page_size_padded = mamba_page_size_padded
    return vc


def state_shapes_and_dtypes(vc: Any, architecture: str) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The model class's own ``get_mamba_state_shape_from_config`` / ``..._dtype_...`` on ``vc``."""
    vllm_build.register_in_process([architecture])
    from vllm import ModelRegistry

    cls = ModelRegistry.models[architecture].load_model_cls()
    return tuple(cls.get_mamba_state_shape_from_config(vc)), tuple(cls.get_mamba_state_dtype_from_config(vc))


def layer_specs(
    geometry: ModelGeometry,
    kv_dtype: str,
    *,
    block_size: int,
    vc: Any,
    state_config: Path | None = None,
    architecture: str | None = None,
    tensor_parallel_size: int = 1,
) -> dict[str, Any]:
    """Each layer's vLLM spec for ``geometry``: ``block_size`` is the attention block size vLLM
    runs (after its Mamba rule); state layers' block size and padding come from ``vc``."""
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
    heads = max(1, geometry.num_kv_heads // tensor_parallel_size)
    shapes: tuple[Any, ...] = ()
    dtypes: tuple[Any, ...] = ()
    if geometry.state is not None:
        assert state_config is not None and architecture is not None
        shapes, dtypes = state_shapes_and_dtypes(vc, architecture)
    mamba_types = {MAMBA1: M.MAMBA1, MAMBA2: M.MAMBA2, GDN: M.GDN_ATTN}
    common = dict(block_size=block_size, num_kv_heads=heads, head_size=geometry.head_dim, dtype=dtype)
    specs: dict[str, Any] = {}
    for i, (kind, window) in enumerate(geometry.per_layer()):
        name = f"model.layers.{i}.attn"
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
                cache_dtype_str="auto",
            )
        else:
            specs[name] = MambaSpec(
                shapes=shapes,
                dtypes=dtypes,
                block_size=vc.cache_config.mamba_block_size,
                page_size_padded=vc.cache_config.mamba_page_size_padded,
                mamba_type=mamba_types[kind],
                mamba_cache_mode=vc.cache_config.mamba_cache_mode,
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


def scheduler_block_size(kcc: Any, vc: Any) -> int:
    from vllm.v1.core import kv_cache_utils as U

    return int(U.resolve_kv_cache_block_sizes(kcc, vc)[0])


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
        layers = tuple(int(n.split(".")[2]) for n in g.layer_names)
        spec = g.kv_cache_spec
        out.append((kind_of(spec), layers, int(spec.block_size), int(spec.page_size_bytes)))
    return out


os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
