"""KV cache groups and blocks (``harness/spec/kv_layout.py``) against vLLM's own arithmetic on
the installed build: each layer's ``KVCacheSpec`` made with vLLM's classes, vLLM's grouping and
block split run on them, for real config.json files (tests/data/models) and the small ones; then
vLLM's whole engine on CPU with dummy weights, whose engine core's ``kv_cache_config`` must be
the layout kvbench computes for the same budget."""

from __future__ import annotations

import importlib.util
import json
from typing import Any

import pytest
from kvbench.harness.errors import KvbenchError
from kvbench.harness.spec.geometry import ModelGeometry, from_config_json, preset
from kvbench.harness.spec.kv_layout import KVLayout, kv_layout
from kvbench.harness.spec.layer_kinds import STATE_KINDS

from tests.conftest import DATA

MODELS = DATA / "models"
HAVE_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed")
GIB = 2**30


# -- kvbench's arithmetic on its own ----------------------------------------------------------


@pytest.mark.parametrize("name", ["opt-13b", "llama-3-8b", "llama-mini", "tiny"])
@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 1), (1, 2)])
def test_a_uniform_model_reduces_to_bytes_per_token_times_block_size(name: str, tp: int, pp: int) -> None:
    g = preset(name)
    if g.num_kv_heads % tp or g.num_layers < pp:
        pytest.skip("split not valid for this preset")
    for bs in (1, 16, 32):
        layout = kv_layout(g, "fp16", bs, max_model_len=2048, tensor_parallel_size=tp, pipeline_parallel_size=pp)
        budget = 3 * GIB + 12345
        assert layout.num_blocks(budget) == budget // (g.kv_bytes_per_token("fp16", tp, pp) * bs)
        assert len(layout.groups) == 1 and layout.scheduler_block_size == bs
        assert layout.blocks_per_request(35) == -(-35 // bs)


def test_gpt_oss_20b_holds_about_half_of_the_all_full_figure_at_4096_tokens() -> None:
    g = from_config_json(MODELS / "gpt-oss-20b" / "config.json")
    on = kv_layout(g, "bf16", 16, max_model_len=8192)
    off = kv_layout(g, "bf16", 16, max_model_len=8192, hybrid=False)
    assert [grp.kind for grp in on.groups] == ["sliding", "full"] and len(off.groups) == 1
    held_on = on.blocks_per_request(4096) * on.bytes_per_block
    held_off = off.blocks_per_request(4096) * off.bytes_per_block
    assert held_off == 4096 * g.kv_bytes_per_token("bf16") == 4096 * 49_152
    # 12 full layers hold every token; 12 sliding layers hold the 128-token window (9 blocks of 16).
    assert held_on == (256 + 8) * 12 * 16 * 2048
    assert 0.5 < held_on / held_off < 0.52


def test_state_layers_with_the_hybrid_manager_off_are_refused_with_vllms_reason() -> None:
    g = from_config_json(MODELS / "qwen3-next-80b-a3b" / "config.json")
    with pytest.raises(KvbenchError, match="Failed to promote local KV cache specs to one unified type"):
        kv_layout(g, "bf16", 16, max_model_len=4096, hybrid=False)


def test_a_sliding_layer_frees_blocks_that_leave_its_window() -> None:
    g = ModelGeometry("sw", 2, 4, 1, 64, 256, 512, 1000, 1_000_000, layers=())
    g = g.replace(layers=(_run("sliding", 1, 64), _run("full", 1)))
    layout = kv_layout(g, "bf16", 16, max_model_len=4096)
    sliding = layout.groups[0]
    # 497 tokens: 433 have left the 64-token window; 27 of the 32 blocks hold only such tokens.
    assert sliding.skipped_tokens(497) == 434 and sliding.blocks_held(497) == 32 - 27
    assert sliding.admission_blocks == -(-(64 - 1 + 2048) // 16) + 1


def _run(kind: str, count: int, window: int = 0) -> Any:
    from kvbench.harness.spec.layer_kinds import LayerRun

    return LayerRun(kind, count, window)


# -- against vLLM's arithmetic ---------------------------------------------------------------

# (config directory, architecture for the state calculator or None, kvbench kernel block)
REAL = ["deepseek-v3", "deepseek-v2-lite", "gpt-oss-20b", "llama-3.1-8b-instruct", "llama-3.1-70b-instruct"]
REAL += ["llama-4-scout-17b-16e-instruct", "mistral-7b-v0.1", "qwen3-next-80b-a3b"]
TINY = ["tiny-gemma2", "tiny-gemma3", "tiny-mistral", "tiny-dsv2", "tiny-qwen3next", "tiny-granite4h"]


def vllm_layout(
    name: str, g: ModelGeometry, layout: KVLayout, kv_dtype: str, hybrid: bool, pp: int, budget: int, **kw: Any
) -> tuple[Any, Any]:
    """vLLM's scheduler KVCacheConfig and VllmConfig for the same model and settings."""
    from tests import vllm_kv

    directory = MODELS / name
    arch = json.loads((directory / "config.json").read_text())["architectures"][0]
    state = g.state is not None
    state_group = next((grp for grp in layout.groups if grp.kind in STATE_KINDS), None)
    vc = vllm_kv.vllm_config(
        directory if state else vllm_kv.NEUTRAL_MODEL,
        max_model_len=kw["max_model_len"],
        block_size=layout.block_size,
        hybrid=hybrid,
        max_num_batched_tokens=kw.get("max_num_batched_tokens", 2048),
        mamba_page_size_padded=state_group.page_bytes
        if state_group and state_group.page_bytes != state_group.real_page_bytes
        else None,
    )
    specs = vllm_kv.layer_specs(
        g, kv_dtype, block_size=layout.block_size, vc=vc, state_config=directory if state else None, architecture=arch
    )
    names = list(specs)
    workers = [{n: specs[n] for n in names[s.start : s.stop]} for s in g.stage_layers(pp)]
    return vllm_kv.kv_cache_config(vc, workers, budget), vc


def compare(name: str, kv_dtype: str = "bf16", hybrid: bool = True, pp: int = 1, block_size: int = 16) -> KVLayout:
    from tests import vllm_kv

    g = vllm_kv.as_platform_keeps_state(from_config_json(MODELS / name / "config.json"), MODELS / name)
    kw = dict(max_model_len=4096, max_num_batched_tokens=2048)
    layout = kv_layout(g, kv_dtype, block_size, hybrid=hybrid, pipeline_parallel_size=pp, **kw)
    budget = 64 * GIB + 4321
    kcc, vc = vllm_layout(name, g, layout, kv_dtype, hybrid, pp, budget, **kw)
    # The scheduler's config is the first stage's: each group holds that stage's layers.
    first = g.stage_layers(pp)[0]
    ours = [
        (grp.kind, tuple(i for i in grp.layers if i in first), grp.block_size, grp.page_bytes) for grp in layout.groups
    ]
    assert vllm_kv.groups_of(kcc) == ours
    assert kcc.num_blocks == layout.num_blocks(budget)
    assert vllm_kv.scheduler_block_size(kcc, vc) == layout.scheduler_block_size
    vc.parallel_config.pipeline_parallel_size = pp  # vLLM keeps one step in flight per stage
    for grp, vg in zip(layout.groups, kcc.kv_cache_groups):
        cap = getattr(vg.kv_cache_spec, "max_admission_blocks_per_request", None)
        if grp.admission_blocks is not None and cap is not None:
            assert cap(vc.max_in_flight_tokens, vc.model_config.max_model_len) == grp.admission_blocks
    return layout


@needs_vllm
@pytest.mark.parametrize("name", REAL + TINY)
def test_groups_pages_and_blocks_are_vllms(name: str) -> None:
    compare(name)
    g = from_config_json(MODELS / name / "config.json")
    if g.state is None:
        compare(name, hybrid=False)
        compare(name, kv_dtype="fp8")


@needs_vllm
@pytest.mark.parametrize("name", ["gpt-oss-20b", "llama-4-scout-17b-16e-instruct", "tiny-gemma3", "deepseek-v2-lite"])
def test_pipeline_stages_share_vllms_groups_and_the_smallest_pool(name: str) -> None:
    compare(name, pp=2)
    compare(name, pp=3)


@needs_vllm
def test_state_shapes_are_those_of_vllms_calculators() -> None:
    from tests import vllm_kv

    for name, arch in (
        ("qwen3-next-80b-a3b", "Qwen3NextForCausalLM"),
        ("tiny-granite4h", "GraniteMoeHybridForCausalLM"),
    ):
        g = vllm_kv.as_platform_keeps_state(from_config_json(MODELS / name / "config.json"), MODELS / name)
        assert g.state is not None
        vc = vllm_kv.vllm_config(MODELS / name, max_model_len=4096, block_size=16, hybrid=True)
        shapes, dtypes = vllm_kv.state_shapes_and_dtypes(vc, arch)
        assert tuple(tuple(s) for s in shapes) == g.state.shapes()
        names = {"bfloat16": "bf16", "float32": "fp32"}
        assert [names[str(d).removeprefix("torch.")] for d in dtypes] == [g.state.conv_dtype, g.state.temporal_dtype]
        assert g.state.conv_dtype == "bf16"  # the model's dtype, whatever the platform


# -- against vLLM's engine on CPU -------------------------------------------------------------


def _engine_reason() -> str | None:
    if not HAVE_VLLM:
        return "vLLM is not installed"
    from kvbench.runners.vllm import engine as vllm_engine

    return vllm_engine.VllmRunner().unavailable()


ENGINE_REASON = _engine_reason()
ENGINE_BUDGET = 16 * 2**20
# tiny config → (block size, hybrid manager): CPU attention runs blocks of 32; its MLA backend 16.
ENGINE_CASES = {
    "tiny-gemma2": (32, True),
    "tiny-gemma3": (32, True),
    "tiny-gemma3-off": (32, False),
    "tiny-mistral": (32, True),
    "tiny-dsv2": (16, True),
    "tiny-qwen3next": (32, True),
    "tiny-granite4h": (32, True),
}


@pytest.fixture(scope="module")
def engine_configs() -> dict[str, Any]:
    """Each tiny model's engine core ``kv_cache_config`` (a CPU engine, dummy weights), started once."""
    if ENGINE_REASON is not None:
        pytest.skip(f"the vLLM engine cannot run here: {ENGINE_REASON}")
    from kvbench.runners.vllm import build as vllm_build
    from kvbench.runners.vllm import engine as vllm_engine

    vllm_build.load()
    from vllm.engine.arg_utils import EngineArgs

    out: dict[str, Any] = {}
    for case, (block, hybrid) in ENGINE_CASES.items():
        args = EngineArgs(
            model=str(MODELS / case.removesuffix("-off")),
            skip_tokenizer_init=True,
            load_format="dummy",
            dtype="bfloat16",
            max_model_len=512,
            kv_cache_memory_bytes=ENGINE_BUDGET,
            block_size=block,
            enforce_eager=True,
            max_num_seqs=16,
            max_num_batched_tokens=512,
            enable_prefix_caching=False,
            disable_hybrid_kv_cache_manager=not hybrid,
            seed=0,
        )
        handle = vllm_engine.make_engine(args)
        try:
            kcc = handle.scheduler.kv_cache_config
            out[case] = (kcc, handle.scheduler.block_size)
        finally:
            handle.close()
    return out


@pytest.mark.parametrize("case", list(ENGINE_CASES))
def test_the_cpu_engines_kv_cache_config_is_kvbenchs_layout(engine_configs: dict[str, Any], case: str) -> None:
    from tests import vllm_kv

    block, hybrid = ENGINE_CASES[case]
    model = MODELS / case.removesuffix("-off")
    g = vllm_kv.as_platform_keeps_state(from_config_json(model / "config.json"), model)
    layout = kv_layout(
        g, "bf16", block, hybrid=hybrid, max_model_len=512, max_num_batched_tokens=512, kernel_block_size=block
    )
    kcc, scheduler_block = engine_configs[case]
    assert vllm_kv.groups_of(kcc) == [(grp.kind, grp.layers, grp.block_size, grp.page_bytes) for grp in layout.groups]
    assert kcc.num_blocks == layout.num_blocks(ENGINE_BUDGET)
    assert scheduler_block == layout.scheduler_block_size
