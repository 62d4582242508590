"""What a model's config.json may say before anything is built from it: every count bounded as it
is read (a list of 2**70 layers is never built), ``architectures`` a list of names, and a model
directory read for its config.json (or refused for lacking one), through the real command line."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from kvbench.harness.errors import KvbenchError
from kvbench.harness.spec.geometry import from_config_json
from kvbench.harness.spec.model_config import CONFIG_BOUNDS

from tests.conftest import DATA, LLAMA_CONFIG, SMALL, assert_one_line_error, kvbench

LLAMA: dict[str, Any] = {"architectures": ["LlamaForCausalLM"], **LLAMA_CONFIG, "num_hidden_layers": 4}
# Which form the simulator runs in is beside the point of a `kvbench run` here, and the Python
# form never adds a line to stderr (an edited, not reinstalled build would).
PURE = {"KVBENCH_PURE": "1"}
GPT2 = {"n_layer": 2, "n_head": 4, "n_embd": 256, "vocab_size": 1000}  # no architectures: read as full attention


def shipped(name: str) -> dict[str, Any]:
    return json.loads((DATA / "models" / name / "config.json").read_text())


def family(architecture: str, model_type: str, **keys: Any) -> dict[str, Any]:
    return {**LLAMA, "architectures": [architecture], "model_type": model_type, **keys}


# Each key CONFIG_BOUNDS bounds → a config whose architecture reads it (keys left out of it: the
# alias is the one read only where the usual spelling is absent).
BASES: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "num_hidden_layers": (LLAMA, ()),
    "n_layer": (GPT2, ()),
    "num_layers": (GPT2, ("n_layer",)),
    "num_attention_heads": (LLAMA, ()),
    "n_head": (GPT2, ()),
    "num_key_value_heads": (LLAMA, ()),
    "hidden_size": (LLAMA, ()),
    "n_embd": (GPT2, ()),
    "d_model": (GPT2, ("n_embd",)),
    "intermediate_size": (LLAMA, ()),
    "ffn_dim": (LLAMA, ("intermediate_size",)),
    "n_inner": (LLAMA, ("intermediate_size",)),
    "vocab_size": (LLAMA, ()),
    "head_dim": (LLAMA, ()),
    "kv_lora_rank": (shipped("tiny-dsv2"), ()),
    "qk_rope_head_dim": (shipped("tiny-dsv2"), ()),
    "qk_nope_head_dim": (shipped("tiny-dsv2"), ()),
    "max_window_layers": (family("Qwen2ForCausalLM", "qwen2"), ()),
    "sliding_window_pattern": (family("Gemma3ForCausalLM", "gemma3_text", sliding_window=64), ()),
    "full_attention_interval": (shipped("tiny-qwen3next"), ("layer_types",)),
    "no_rope_layer_interval": (family("Llama4ForCausalLM", "llama4_text"), ()),
    "attn_layer_period": (family("JambaForCausalLM", "jamba", attn_layer_period=2, attn_layer_offset=1), ()),
    "attn_layer_offset": (family("JambaForCausalLM", "jamba", attn_layer_period=2, attn_layer_offset=1), ()),
    "sliding_window": (LLAMA, ()),
    "attention_chunk_size": (family("Llama4ForCausalLM", "llama4_text"), ()),
    **{
        key: (shipped("tiny-qwen3next"), ())
        for key in (
            "linear_conv_kernel_dim",
            "linear_num_key_heads",
            "linear_num_value_heads",
            "linear_key_head_dim",
            "linear_value_head_dim",
        )
    },
    **{
        key: (shipped("tiny-granite4h"), ())
        for key in ("mamba_d_conv", "mamba_expand", "mamba_n_groups", "mamba_n_heads", "mamba_d_head", "mamba_d_state")
    },
}


def write(folder: Path, config: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.json"
    path.write_text(json.dumps(config))
    return path


def calc(model: Path | str, cwd: Path | None = None) -> Any:
    return kvbench("calc", "--block-size", "16", "--tokens", "35", "--model", model, "--budget", "10GiB", cwd=cwd)


# -- 1: counts bounded before anything is built from them ----------------------------------------


def test_every_bounded_key_has_a_case_here() -> None:
    assert set(BASES) == set(CONFIG_BOUNDS)


@pytest.mark.parametrize("key", list(CONFIG_BOUNDS))
@pytest.mark.parametrize("over", ["just", "far"])
def test_each_count_a_config_gives_is_bounded_as_it_is_read(tmp_path: Path, key: str, over: str) -> None:
    base, dropped = BASES[key]
    bound, _ = CONFIG_BOUNDS[key]
    value = bound + 1 if over == "just" else 2**70
    config = {k: v for k, v in base.items() if k not in dropped}
    path = write(tmp_path, {**config, key: value})
    with pytest.raises(KvbenchError) as info:
        from_config_json(path)
    message = str(info.value)
    assert f"{key} = {value} is beyond any real model" in message, message
    assert f"at most {bound:,}" in message and str(path) in message


@pytest.mark.parametrize("layers", [2**70, 2**62, 2**40, 10**7])
@pytest.mark.parametrize("architecture", ["LlamaForCausalLM", "GptOssForCausalLM", None])
def test_calc_refuses_absurd_layer_counts_in_one_line(tmp_path: Path, layers: int, architecture: str | None) -> None:
    config = {**LLAMA, "architectures": [architecture] if architecture else None, "num_hidden_layers": layers}
    path = write(tmp_path / "model", config)
    proc = calc(path.parent)
    assert proc.returncode == 2
    assert_one_line_error(proc, str(path), f"num_hidden_layers = {layers}", "beyond any real model", "at most 1,024")


def test_ten_million_layers_are_refused_at_once(tmp_path: Path) -> None:
    path = write(tmp_path, {**LLAMA, "num_hidden_layers": 10**7})
    start = time.perf_counter()
    with pytest.raises(KvbenchError, match="num_hidden_layers = 10000000"):
        from_config_json(path)
    assert time.perf_counter() - start < 0.5


def test_a_run_refuses_a_suite_whose_config_has_absurd_layers_and_writes_nothing(tmp_path: Path) -> None:
    write(tmp_path / "model", {**LLAMA, "num_hidden_layers": 2**70})
    suite = tmp_path / "suite.toml"
    suite.write_text(SMALL.replace('preset = "opt-13b"', f"config = {json.dumps(str(tmp_path / 'model'))}", 1))
    out = tmp_path / "out"
    proc = kvbench("run", suite, "--out", out, "--quiet", env=PURE)
    assert proc.returncode == 2
    assert_one_line_error(proc, "suite.toml", f"num_hidden_layers = {2**70}", "at most 1,024")
    assert not out.exists()


# -- 2: architectures is a list of names ---------------------------------------------------------


@pytest.mark.parametrize(
    ("architectures", "shown"),
    [
        ("LlamaForCausalLM", "'LlamaForCausalLM'"),
        ("GptOssForCausalLM", "'GptOssForCausalLM'"),
        ([1], "[1]"),
        (["LlamaForCausalLM", None], "['LlamaForCausalLM', None]"),
        ({"name": "LlamaForCausalLM"}, "{'name': 'LlamaForCausalLM'}"),
    ],
)
def test_architectures_must_be_a_list_of_names(tmp_path: Path, architectures: object, shown: str) -> None:
    # gpt-oss with a window: read as a string, it used to be refused as "a config without architectures"
    path = write(tmp_path, {**LLAMA, "architectures": architectures, "sliding_window": 128, "model_type": "gpt_oss"})
    proc = calc(path)
    assert proc.returncode == 2
    assert_one_line_error(proc, str(path), f"architectures must be a list of names, got {shown}")
    assert "without architectures" not in proc.stderr


@pytest.mark.parametrize("architectures", [None, []])
def test_no_architectures_is_still_read_as_plain_full_attention(tmp_path: Path, architectures: object) -> None:
    assert from_config_json(write(tmp_path, {**LLAMA, "architectures": architectures})).num_layers == 4


# -- 3: a model directory ------------------------------------------------------------------------


@pytest.mark.parametrize("spelling", ["bare", "relative", "absolute", "trailing-slash"])
def test_calc_reads_a_model_directorys_config_json(tmp_path: Path, spelling: str) -> None:
    write(tmp_path / "mymodel", LLAMA)
    model = {
        "bare": "mymodel",
        "relative": "./mymodel",
        "absolute": str(tmp_path / "mymodel"),
        "trailing-slash": "mymodel/",
    }[spelling]
    proc = calc(model, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    # LLAMA: 2 (K and V) × 4 layers × 2 KV heads × head dim 64 × 2 bytes
    assert "KV: 2,048 B/token" in proc.stdout


@pytest.mark.parametrize("spelling", ["bare", "relative", "absolute"])
def test_calc_says_a_directory_without_config_json_holds_none(tmp_path: Path, spelling: str) -> None:
    (tmp_path / "mymodel").mkdir()
    (tmp_path / "mymodel" / "weights.safetensors").write_text("")
    model = {"bare": "mymodel", "relative": "./mymodel", "absolute": str(tmp_path / "mymodel")}[spelling]
    proc = calc(model, cwd=tmp_path)
    assert proc.returncode == 2
    assert_one_line_error(proc, "mymodel: the directory holds no config.json")
    assert "preset" not in proc.stderr


def test_a_preset_name_still_names_the_preset_and_an_unknown_name_lists_them(tmp_path: Path) -> None:
    assert calc("tiny", cwd=tmp_path).returncode == 0
    proc = calc("gpt-5", cwd=tmp_path)
    assert_one_line_error(proc, "unknown model preset 'gpt-5'", "llama-mini")


def test_a_suites_config_naming_a_model_directory_reads_its_config_json(tmp_path: Path) -> None:
    write(tmp_path / "mymodel", LLAMA)
    suite = tmp_path / "suite.toml"
    suite.write_text(SMALL.replace('preset = "opt-13b"', 'config = "mymodel"', 1))
    proc = kvbench("run", suite, "--out", tmp_path / "out", cwd=tmp_path, env=PURE)
    assert proc.returncode == 0, proc.stderr
    # 12 GiB at LLAMA's 2,048 B a token
    assert "model mymodel" in proc.stdout and "(6,291,456 positions)" in proc.stdout
    assert "4 cell(s) run, 0 skipped, 0 failed" in proc.stderr


def test_a_suites_config_naming_a_directory_without_config_json_says_so(tmp_path: Path) -> None:
    (tmp_path / "mymodel").mkdir()
    suite = tmp_path / "suite.toml"
    suite.write_text(SMALL.replace('preset = "opt-13b"', 'config = "mymodel"', 1))
    out = tmp_path / "out"
    proc = kvbench("run", suite, "--out", out, "--quiet", cwd=tmp_path, env=PURE)
    assert proc.returncode == 2
    assert_one_line_error(proc, "suite.toml", "mymodel: the directory holds no config.json")
    assert not out.exists()
