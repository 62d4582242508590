"""vLLM's own KV cache arithmetic for a kvbench geometry: each layer's ``KVCacheSpec`` built with
vLLM's classes (state shapes and dtypes from the model class's own calculators on the config), and
vLLM's grouping and block split on them. The one difference between the builds (0.33 moved the
planning functions to ``kv_cache_planning`` and gives ``get_kv_cache_configs`` the global groups)
is kept in ``kv_cache_config``."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from kvbench.harness.spec.geometry import ModelGeometry
from kvbench.runners.vllm import build as vllm_build
from kvbench.runners.vllm import kv_specs

from tests.conftest import DATA

MODELS = DATA / "models"
NEUTRAL_MODEL = MODELS / "llama-3.1-8b-instruct"  # any local config.json: the specs come from the geometry


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


# vLLM's names of the state dtypes, as kvbench names them.
_STATE_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def as_platform_keeps_state(geometry: ModelGeometry, model_dir: Path) -> ModelGeometry:
    """``geometry`` with the temporal state in the dtype this platform keeps it in. kvbench's
    arithmetic is vLLM's with ``mamba_ssm_cache_dtype`` "auto" (the model's dtype), as on a GPU;
    vLLM's CPU platform sets float32 instead on a CPU with AVX-512 BF16 whose state its accelerated
    GDN kernel does not take (``vllm/platforms/cpu.py``), so the comparison asks what it chose."""
    if geometry.state is None:
        return geometry
    vc = vllm_config(model_dir, max_model_len=4096, block_size=16, hybrid=True)
    chosen = vc.cache_config.mamba_ssm_cache_dtype
    if chosen == "auto":
        return geometry
    state = dataclasses.replace(geometry.state, temporal_dtype=_STATE_DTYPES[chosen])
    return geometry.replace(state=state)


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
    """Each layer's vLLM spec for ``geometry`` (``runners.vllm.kv_specs.layer_specs``), state
    shapes and dtypes from the model class's own calculators on ``vc``."""
    state = None
    if geometry.state is not None:
        assert state_config is not None and architecture is not None
        state = state_shapes_and_dtypes(vc, architecture)
    return kv_specs.layer_specs(
        geometry, kv_dtype, block_size=block_size, vc=vc, state=state, tensor_parallel_size=tensor_parallel_size
    )


def scheduler_block_size(kcc: Any, vc: Any) -> int:
    return kv_specs.block_sizes(kcc, vc)[0]


kv_cache_config = kv_specs.kv_cache_config
kind_of = kv_specs.kind_of
groups_of = kv_specs.groups_of


os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
