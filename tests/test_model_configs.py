"""Model geometry from a model's own config.json, read as vLLM reads it: layer kinds (sliding,
chunked, MLA, state), the presets of today's models against their shipped configs, run ids that
do not move for full-attention models, ``kvbench calc`` on the issue's examples, and bad configs
refused in one line through the real command line."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from kvbench.harness.errors import KvbenchError
from kvbench.harness.spec.geometry import PRESETS, from_config_json, preset
from kvbench.harness.spec.layer_kinds import LayerRun, StateGeometry
from kvbench.harness.spec.specs import MemorySpec, ModelSpec, RunSpec, SchedulerSpec
from kvbench.harness.spec.workload_spec import WorkloadSpec

from tests.conftest import DATA, assert_one_line_error, kvbench

MODELS = DATA / "models"
WID = "w0123456789abcdef"


def cfg(name: str) -> Path:
    return MODELS / name / "config.json"


def spec(model: ModelSpec) -> RunSpec:
    return RunSpec(
        runner="sim",
        policy="paged",
        block_size=16,
        model=model,
        memory=MemorySpec(),
        workload=WorkloadSpec(),
        scheduler=SchedulerSpec(),
    )


# -- run ids -----------------------------------------------------------------------------------

# Computed on main before geometry knew layer kinds (commit 301068b): full-attention models keep them.
PINNED_PRESET_IDS = {
    "opt-13b": "a57e87f0cad95ffd",
    "opt-66b": "50145874e1729b94",
    "opt-175b": "4edb21984e936529",
    "llama-2-7b": "c3129ef34c6d79f1",
    "llama-2-13b": "9fefa2890b1f1f1e",
    "llama-3-8b": "5f3fd3d6400c5c4a",
    "llama-3-70b": "1f7acf028ce9eec9",
    "mistral-7b": "c4c4707ff3088f6a",
    "qwen2.5-7b": "c7c984ebe302e001",
    "tiny": "f407989169dcc8fc",
    "llama-mini": "6f6717c5850a60bd",
}
PINNED_CONFIG_IDS = {"llama-3.1-8b-instruct": "e042208ab5ba0fe2", "llama-3.1-70b-instruct": "7d6a13d370b215c0"}


@pytest.mark.parametrize("name", list(PINNED_PRESET_IDS))
def test_a_full_attention_presets_run_id_did_not_change(name: str) -> None:
    assert spec(ModelSpec(preset=name)).run_id(WID) == PINNED_PRESET_IDS[name]


@pytest.mark.parametrize("name", list(PINNED_CONFIG_IDS))
def test_a_full_attention_config_files_run_id_did_not_change(name: str) -> None:
    assert spec(ModelSpec(preset=None, config=str(cfg(name)))).run_id(WID) == PINNED_CONFIG_IDS[name]


def test_new_geometry_fields_enter_identity_only_away_from_full_attention() -> None:
    from kvbench.harness.spec import identity

    plain = identity.geometry_identity(dataclasses.asdict(preset("llama-3-8b")))
    assert not {"layers", "kv_lora_rank", "qk_rope_head_dim", "state"} & set(plain)
    mla = identity.geometry_identity(dataclasses.asdict(preset("deepseek-v3")))
    assert mla["kv_lora_rank"] == 512 and mla["layers"] == ({"kind": "mla", "count": 61, "window": 0},)
    # An all-full run list is the default spelling: the same geometry, the same identity.
    g = preset("llama-3-8b")
    assert g.replace(layers=(LayerRun("full", 32),)) == g


def test_a_model_that_is_not_all_full_attention_runs_only_where_kv_cache_groups_are_kept() -> None:
    spec(ModelSpec(preset="gpt-oss-20b"))  # sim, paged: vLLM's KV cache groups
    with pytest.raises(KvbenchError, match="12 sliding, 12 full layers.*runner torch.*kvbench calc"):
        spec(ModelSpec(preset="gpt-oss-20b")).replace(runner="torch")
    with pytest.raises(KvbenchError, match="policy virtual-contiguous sizes every layer as full attention"):
        spec(ModelSpec(preset="gpt-oss-20b")).replace(policy="virtual-contiguous")
    spec(ModelSpec(preset="gpt-oss-20b")).replace(policy="contiguous-max")  # a run per KV cache group
    with pytest.raises(KvbenchError, match="runner vllm does not reserve contiguous-max per KV cache group.*sim"):
        spec(ModelSpec(preset="gpt-oss-20b")).replace(policy="contiguous-max", runner="vllm")


def test_hybrid_kv_off_for_a_model_with_state_layers_is_vllms_refusal() -> None:
    with pytest.raises(KvbenchError, match="Failed to promote local KV cache specs to one unified type"):
        spec(ModelSpec(preset="qwen3-next-80b", kv_dtype="bf16")).replace(hybrid_kv=False)


# -- presets against their configs -----------------------------------------------------------

PRESET_CONFIGS = {
    "deepseek-v3": "deepseek-v3",
    "gpt-oss-20b": "gpt-oss-20b",
    "qwen3-next-80b": "qwen3-next-80b-a3b",
    "llama-3.1-8b": "llama-3.1-8b-instruct",
    "llama-3.1-70b": "llama-3.1-70b-instruct",
}


@pytest.mark.parametrize("name", list(PRESET_CONFIGS))
def test_a_preset_is_its_shipped_config_read(name: str) -> None:
    # Parameter counts differ on purpose: presets carry the published totals.
    read = from_config_json(cfg(PRESET_CONFIGS[name]))
    assert dataclasses.replace(PRESETS[name], name="", num_params=1) == dataclasses.replace(read, name="", num_params=1)


def test_the_issues_bytes_per_token() -> None:
    assert preset("deepseek-v3").kv_bytes_per_token("bf16") == 61 * 576 * 2 == 70_272
    assert preset("gpt-oss-20b").kv_bytes_per_token("bf16") == 24 * 2 * 8 * 64 * 2 == 49_152
    # MLA's latent is on every tensor-parallel rank, whole; its pipeline stages split the layers.
    assert preset("deepseek-v3").kv_bytes_per_token("bf16", 8) == 70_272
    assert preset("deepseek-v3").kv_bytes_per_token("bf16", 1, 2) == 31 * 1152  # get_pp_indices: 30 + 31
    # State layers keep bytes per request, not per token: attention layers only.
    g = preset("qwen3-next-80b")
    assert g.kv_bytes_per_token("bf16") == 12 * 2 * 2 * 256 * 2
    # gated delta net per layer: conv (3, 128·16·2 + 128·32) + recurrent (32, 128, 128), bf16.
    assert g.state_bytes_per_request() == 36 * (3 * 8192 + 32 * 128 * 128) * 2


# -- reading configs --------------------------------------------------------------------------

# config file → (layer runs as (kind, count, window), MLA latent, state kind)
READ = {
    "deepseek-v3": ([("mla", 61, 0)], (512, 64), None),
    "deepseek-v2-lite": ([("mla", 27, 0)], (512, 64), None),
    "gpt-oss-20b": ([("sliding", 1, 128), ("full", 1, 0)] * 12, (0, 0), None),
    "llama-3.1-8b-instruct": ([], (0, 0), None),
    "mistral-7b-v0.1": ([("sliding", 32, 4096)], (0, 0), None),
    # Llama-4 Scout: no_rope_layers [] reads as the default, every fourth layer NoPE (full attention).
    "llama-4-scout-17b-16e-instruct": ([("chunked", 3, 8192), ("full", 1, 0)] * 12, (0, 0), None),
    "qwen3-next-80b-a3b": ([("gdn", 3, 0), ("full", 1, 0)] * 12, (0, 0), "gdn"),
    "tiny-gemma2": ([("sliding", 1, 64), ("full", 1, 0)] * 2, (0, 0), None),
    "tiny-gemma3": ([("sliding", 5, 64), ("full", 1, 0)], (0, 0), None),
    "tiny-granite4h": ([("mamba2", 3, 0), ("full", 1, 0)], (0, 0), "mamba2"),
}


@pytest.mark.parametrize("name", list(READ))
def test_a_config_reads_as_vllm_lays_out_its_layers(name: str) -> None:
    runs, latent, state = READ[name]
    g = from_config_json(cfg(name))
    assert [(r.kind, r.count, r.window) for r in g.layers] == runs
    assert (g.kv_lora_rank, g.qk_rope_head_dim) == latent
    assert (g.state.kind if g.state else None) == state


LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_size": 256,
    "intermediate_size": 512,
    "vocab_size": 1000,
}
SLIDE, FULLA = "sliding_attention", "full_attention"

# changes to LLAMA → the runs read
FAMILY_SPELLINGS: dict[str, tuple[dict[str, Any], list[tuple[str, int, int]]]] = {
    "llama_model_wide_window": ({"sliding_window": 32}, [("sliding", 4, 32)]),
    "llama_layer_types": (
        {"sliding_window": 32, "layer_types": [SLIDE, FULLA] * 2},
        [("sliding", 1, 32), ("full", 1, 0)] * 2,
    ),
    "llama_window_null": ({"sliding_window": None}, []),
    "llama_window_zero_is_none": ({"sliding_window": 0}, []),
    # transformers' MistralConfig: no sliding_window key means 4096.
    "mistral_default_window": (
        {"architectures": ["MistralForCausalLM"], "model_type": "mistral"},
        [("sliding", 4, 4096)],
    ),
    "qwen2_without_use_sliding_window": (
        {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "sliding_window": 4096},
        [],
    ),
    "qwen2_sliding_everywhere": (
        {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "sliding_window": 64,
            "use_sliding_window": True,
            "max_window_layers": 0,
        },
        [("sliding", 4, 64)],
    ),
    "gemma2_default_alternation": (
        {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "sliding_window": 64},
        [("sliding", 1, 64), ("full", 1, 0)] * 2,
    ),
    "gemma3_pattern": (
        {
            "architectures": ["Gemma3ForCausalLM"],
            "model_type": "gemma3_text",
            "sliding_window": 64,
            "sliding_window_pattern": 2,
        },
        [("sliding", 1, 64), ("full", 1, 0)] * 2,
    ),
    "gemma3_text_config": (
        {
            "architectures": ["Gemma3ForConditionalGeneration"],
            "model_type": "gemma3",
            "text_config": {"model_type": "gemma3_text", "num_hidden_layers": 6, "sliding_window": 16, "head_dim": 64},
        },
        [("sliding", 5, 16), ("full", 1, 0)],
    ),
    "gpt_oss_even_layers_slide": (
        {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss"},
        [("sliding", 1, 128), ("full", 1, 0)] * 2,
    ),
    "jamba_period_and_offset": (
        {"architectures": ["JambaForCausalLM"], "model_type": "jamba", "attn_layer_period": 2, "attn_layer_offset": 1},
        [("mamba1", 1, 0), ("full", 1, 0)] * 2,
    ),
    "llama4_no_rope_layers": (
        {
            "architectures": ["Llama4ForCausalLM"],
            "model_type": "llama4_text",
            "attention_chunk_size": 64,
            "no_rope_layers": [1, 0, 1, 1],
        },
        [("chunked", 1, 64), ("full", 1, 0), ("chunked", 2, 64)],
    ),
}


@pytest.mark.parametrize("case", list(FAMILY_SPELLINGS))
def test_each_familys_own_spelling_of_its_layers(tmp_path: Path, case: str) -> None:
    changes, runs = FAMILY_SPELLINGS[case]
    p = tmp_path / "config.json"
    p.write_text(json.dumps({**LLAMA, **changes}))
    assert [(r.kind, r.count, r.window) for r in from_config_json(p).layers] == runs


def test_a_geometry_refuses_fields_that_contradict_its_layers() -> None:
    g = preset("tiny")  # 2 layers
    with pytest.raises(KvbenchError, match="kv_lora_rank = 512 with no MLA layers"):
        g.replace(kv_lora_rank=512, qk_rope_head_dim=64)
    with pytest.raises(KvbenchError, match="hold 3 layers, not num_layers"):
        g.replace(layers=(LayerRun("full", 1), LayerRun("sliding", 2, 8)))
    with pytest.raises(KvbenchError, match="state layers"):
        g.replace(layers=(LayerRun("full", 1), LayerRun("mamba2", 1)))
    state = StateGeometry("gdn", conv_kernel=4, num_k_heads=3, num_v_heads=3, head_k_dim=8, head_v_dim=8)
    with pytest.raises(KvbenchError, match="tensor_parallel_size 2 does not divide the state's"):
        g.replace(layers=(LayerRun("full", 1), LayerRun("gdn", 1)), state=state).check_parallel(2)


# -- through the command line -----------------------------------------------------------------


def calc(*args: str, tokens: int = 4096) -> dict[str, Any]:
    proc = kvbench("calc", "--block-size", "16", "--tokens", str(tokens), "--budget", "10GiB", "--json", *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)[0]


def test_calc_prices_deepseek_v3_as_vllm_stores_its_latent() -> None:
    r = calc("--model", str(cfg("deepseek-v3")), "--kv-dtype", "bf16")
    assert r["kv_bytes_per_token"] == 70_272 and r["kv_bytes_per_token_by_kind"] == {"mla": 70_272}
    assert [g["kind"] for g in r["groups"]] == ["mla"] and r["fit_paged_hybrid"] == r["fit_paged_hybrid_off"]


def test_calc_on_gpt_oss_20b_holds_about_half_at_4096_tokens() -> None:
    r = calc("--model", "gpt-oss-20b", "--kv-dtype", "bf16")
    held = sum(g["blocks_held"] * g["page_bytes"] * g["layers"] for g in r["groups"])
    assert 0.5 < held / (4096 * r["kv_bytes_per_token"]) < 0.52
    assert r["fit_paged_hybrid"] == 103 and r["fit_paged_hybrid_off"] == 53
    text = kvbench("calc", "--block-size", "16", "--tokens", "4096", "--budget", "10GiB", "--model", "gpt-oss-20b")
    assert "12 sliding (window 128), 12 full" in text.stdout and "8 + 256 blocks" in text.stdout


def test_calc_says_why_a_state_model_has_no_hybrid_off_figure() -> None:
    r = calc("--model", "qwen3-next-80b")
    assert r["fit_paged_hybrid_off"] is None and "Failed to promote" in r["hybrid_off_refused"]
    assert r["state_bytes_per_request"] == preset("qwen3-next-80b").state_bytes_per_request()


def test_calc_keeps_its_output_for_a_full_attention_model() -> None:
    r = calc("--model", "llama-3-8b")
    assert "groups" not in r and r["fit_paged"] == (10 * 2**30 // 131_072 // 16) // 256


def test_a_window_longer_than_max_model_len_is_taken_as_vllm_takes_it() -> None:
    # vLLM neither clamps nor refuses it: the sliding group holds every token, as full attention
    # would, and admits cdiv(max_model_len, block) + 1 blocks a request (SlidingWindowSpec).
    from kvbench.harness.spec.kv_layout import kv_layout

    layout = kv_layout(from_config_json(cfg("mistral-7b-v0.1")), "bf16", 16, max_model_len=2048)
    (group,) = layout.groups
    assert (group.kind, group.window, group.admission_blocks) == ("sliding", 4096, 2048 // 16 + 1)
    assert group.blocks_held(2048) == 128
    r = calc("--model", str(cfg("mistral-7b-v0.1")), "--max-model-len", "2048", tokens=2048)
    assert r["fit_paged_hybrid"] == r["fit_paged_hybrid_off"]


# changes to LLAMA → words the one line must hold (besides the file's path)
BAD = {
    "unknown_layer_kind": (
        {"layer_types": [SLIDE, "conv", FULLA, FULLA]},
        ("layer_types[1] = 'conv'", "does not model"),
    ),
    "layer_types_too_short": ({"layer_types": [FULLA] * 3}, ("layer_types has 3 entries", "num_hidden_layers is 4")),
    "mla_fields_on_llama": ({"kv_lora_rank": 512, "qk_rope_head_dim": 64}, ("kv_lora_rank", "not an MLA architecture")),
    "mla_fields_without_architecture": (
        {"architectures": None, "kv_lora_rank": 512},
        ("kv_lora_rank", "not an MLA architecture"),
    ),
    "sliding_on_an_unknown_architecture": (
        {"architectures": ["FancyForCausalLM"], "sliding_window": 64},
        ("sliding_window", "'FancyForCausalLM'", "does not know"),
    ),
    "negative_window": ({"sliding_window": -8}, ("sliding_window", "at least 0")),
    "deepseek_without_latent": (
        {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3"},
        ("kv_lora_rank is missing",),
    ),
    "qwen2_mixing_kinds": (
        {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "layer_types": [SLIDE, FULLA, FULLA, FULLA],
            "sliding_window": 64,
            "use_sliding_window": True,
        },
        ("mixes sliding and full", "refuses"),
    ),
    "qwen3_next_with_a_sliding_layer": (
        {
            "architectures": ["Qwen3NextForCausalLM"],
            "model_type": "qwen3_next",
            "layer_types": [SLIDE, FULLA, FULLA, FULLA],
        },
        ("layer_types[0] = 'sliding_attention'", "Qwen3NextForCausalLM"),
    ),
    "granite_state_tp_does_not_divide": (
        {
            "architectures": ["GraniteMoeHybridForCausalLM"],
            "model_type": "granitemoehybrid",
            "layer_types": ["mamba", "mamba", "mamba", "attention"],
            "mamba_n_heads": 3,
            "mamba_d_head": 8,
            "mamba_expand": 2,
        },
        ("tensor_parallel_size 2",),
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_model_config_is_one_line_exit_2_and_nothing_written(tmp_path: Path, case: str) -> None:
    changes, needles = BAD[case]
    p = tmp_path / "config.json"
    p.write_text(json.dumps({**LLAMA, **changes}))
    args = ["calc", "--block-size", "16", "--tokens", "35", "--model", str(p), "--budget", "1GiB"]
    if case == "granite_state_tp_does_not_divide":
        args += ["--tp", "2"]
    before = sorted(tmp_path.iterdir())
    proc = kvbench(*args, cwd=tmp_path)
    assert proc.returncode == 2
    named = () if case == "granite_state_tp_does_not_divide" else (str(p),)  # a split, not the file
    assert_one_line_error(proc, *named, *needles)
    assert sorted(tmp_path.iterdir()) == before


def test_a_suite_with_a_hybrid_model_is_refused_before_any_run(tmp_path: Path) -> None:
    suite = (Path(__file__).resolve().parents[1] / "suites" / "example.toml").read_text()
    p = tmp_path / "suite.toml"
    suite = suite.replace('preset = "opt-13b"', 'preset = "gpt-oss-20b"', 1)
    p.write_text(suite.replace('"paged"]', '"paged", "virtual-contiguous"]', 1))
    out = tmp_path / "out"
    proc = kvbench("run", str(p), "--out", str(out), "--quiet")
    assert_one_line_error(proc, "gpt-oss-20b", "full attention")
    assert not out.exists()
