"""Reading a Hugging Face ``config.json`` the way vLLM reads it.

The architecture named first in ``architectures`` decides how the layers are
read, as in vLLM, where each architecture's model file builds its own layers:
``vllm/model_executor/models/<family>.py`` (which layer gets a sliding window, a
chunked local window, MLA or a state), on top of the ``transformers`` config
class's defaults (``layer_types`` computed from a family's own spelling when the
file has none) and ``vllm/engine/arg_utils.py`` (a model-wide ``sliding_window``
applies to every layer only when no ``layer_types`` say otherwise). The text
part of a multimodal config (``text_config``) is the model. ``ARCHITECTURES``
lists what is read; a config without ``architectures``, or with one not listed,
is read as plain full attention only if it carries none of the fields that would
make its layers differ, and is refused otherwise: never a silent fallback.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import KvbenchError, one_line
from ..files import MIB, read_text_capped
from .layer_kinds import CHUNKED, FULL, GDN, MAMBA1, MAMBA2, MAX_WINDOW, MLA, SLIDING, StateGeometry, runs_of

# Real config.json files are a few KiB; one of megabytes is not a model's configuration.
MAX_CONFIG_BYTES = 16 * MIB

# transformers' defaults for the keys that shape the KV cache, per model_type, where a config
# file may leave them out (its config classes set them in __post_init__).
FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "mistral": {"sliding_window": 4096},
    "qwen2": {"max_window_layers": 28},
    "qwen3": {"max_window_layers": 28},
    "qwen2_moe": {"max_window_layers": 28},
    "qwen3_moe": {"max_window_layers": 28},
    "gemma2": {"sliding_window": 4096, "head_dim": 256, "num_key_value_heads": 4, "vocab_size": 256000},
    "gemma3_text": {"sliding_window": 4096, "head_dim": 256, "num_key_value_heads": 4, "vocab_size": 262208},
    "gpt_oss": {"sliding_window": 128, "head_dim": 64, "num_key_value_heads": 8, "vocab_size": 201088},
    "llama4_text": {"attention_chunk_size": 8192, "no_rope_layer_interval": 4},
    "qwen3_next": {"full_attention_interval": 4},
    "jamba": {
        "attn_layer_period": 8,
        "attn_layer_offset": 4,
        "mamba_expand": 2,
        "mamba_d_state": 16,
        "mamba_d_conv": 4,
    },
    "granitemoehybrid": {
        "mamba_n_heads": 128,
        "mamba_n_groups": 1,
        "mamba_d_state": 256,
        "mamba_d_head": "auto",
        "mamba_d_conv": 4,
        "mamba_expand": 2,
    },
}
# transformers renames these layer_types entries on load (configuration_utils._LEGACY_LAYER_TYPE_REMAP).
LEGACY_LAYER_TYPES: dict[str, str] = {"mamba": "linear_attention", "attention": "full_attention"}
# Model types vLLM runs with MLA (``ModelArchConvertor.is_deepseek_mla``), for the architectures read here.
MLA_MODEL_TYPES = ("deepseek_v2", "deepseek_v3", "kimi_k2")
# Keys that make a model's layers differ from plain full attention: a config whose architecture
# kvbench does not read is refused when it holds one of them.
NON_UNIFORM_KEYS = (
    "layer_types",
    "sliding_window",
    "kv_lora_rank",
    "attention_chunk_size",
    "attn_layer_period",
    "full_attention_interval",
    "mamba_d_state",
    "linear_num_key_heads",
    "layers_block_type",
)
WEIGHT_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16"}

# Sane upper bounds on a model's shape: several times the largest published decoders (Llama 3.1
# 405B: 126 layers, 128 heads, hidden 16,384, MLP 53,248; head sizes up to 256; vocabularies up
# to ~262k; MLA latents of 512 + 64), so a real model never trips them and a typo (an extra digit
# or three) does. ``ModelGeometry`` holds its fields to them; a config's keys are held to them as
# they are read (``CONFIG_BOUNDS``), before anything is built from them.
UPPER_BOUNDS: dict[str, int] = {
    "num_layers": 1024,
    "num_attention_heads": 1024,
    "num_kv_heads": 1024,
    "head_dim": 1024,
    "hidden_size": 131_072,
    "intermediate_size": 1_048_576,
    "vocab_size": 4_194_304,
    "kv_lora_rank": 16_384,
    "qk_rope_head_dim": 1024,
}
# Layer periods and offsets count layers; a window counts tokens (MAX_WINDOW); a state's sizes are
# Mamba's and the gated delta net's (real ones: kernel 4, 128 heads of 64, states of 16 to 256,
# expansion 2): heads and head sizes held to attention's bounds, the rest to 1,024 or 16,384.
_LAYERS, _HEADS, _HEAD = UPPER_BOUNDS["num_layers"], UPPER_BOUNDS["num_attention_heads"], UPPER_BOUNDS["head_dim"]


def _bounded(upper: int, field: str | None, *keys: str) -> dict[str, tuple[int, str | None]]:
    return {key: (upper, field) for key in keys}


# Every count a config's key gives, bounded: (the most it may be, the ModelGeometry field it
# becomes, if any). A key read without a bound here is a bug (``_Config.integer``).
CONFIG_BOUNDS: dict[str, tuple[int, str | None]] = {
    **_bounded(_LAYERS, "num_layers", "num_hidden_layers", "n_layer", "num_layers"),
    **_bounded(_HEADS, "num_attention_heads", "num_attention_heads", "n_head"),
    **_bounded(UPPER_BOUNDS["num_kv_heads"], "num_kv_heads", "num_key_value_heads"),
    **_bounded(UPPER_BOUNDS["hidden_size"], "hidden_size", "hidden_size", "n_embd", "d_model"),
    **_bounded(UPPER_BOUNDS["intermediate_size"], "intermediate_size", "intermediate_size", "ffn_dim", "n_inner"),
    **_bounded(UPPER_BOUNDS["vocab_size"], "vocab_size", "vocab_size"),
    **_bounded(_HEAD, "head_dim", "head_dim"),
    **_bounded(UPPER_BOUNDS["kv_lora_rank"], "kv_lora_rank", "kv_lora_rank"),
    **_bounded(UPPER_BOUNDS["qk_rope_head_dim"], "qk_rope_head_dim", "qk_rope_head_dim"),
    **_bounded(_HEAD, None, "qk_nope_head_dim"),
    **_bounded(
        _LAYERS,
        None,
        "max_window_layers",
        "sliding_window_pattern",
        "full_attention_interval",
        "no_rope_layer_interval",
        "attn_layer_period",
        "attn_layer_offset",
    ),
    **_bounded(MAX_WINDOW, None, "sliding_window", "attention_chunk_size"),
    **_bounded(_LAYERS, None, "linear_conv_kernel_dim", "mamba_d_conv", "mamba_expand", "mamba_n_groups"),
    **_bounded(_HEADS, None, "linear_num_key_heads", "linear_num_value_heads", "mamba_n_heads"),
    **_bounded(_HEAD, None, "linear_key_head_dim", "linear_value_head_dim", "mamba_d_head"),
    **_bounded(16_384, None, "mamba_d_state"),
}
FULL_ATTN, SLIDING_ATTN, LINEAR_ATTN = "full_attention", "sliding_attention", "linear_attention"


@dataclasses.dataclass(frozen=True)
class ConfigReading:
    """What a config.json says about a model's shape and KV, as vLLM reads it: ``fields`` are
    ``ModelGeometry``'s keyword arguments but its parameter count, which ``tied`` completes."""

    architecture: str | None
    tied: bool
    fields: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class _Layers:
    kinds: list[tuple[str, int]]  # (kind, window) per layer
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    state: StateGeometry | None = None
    head_dim: int | None = None  # where the family sizes its heads otherwise than head_dim / hidden ÷ heads


class _Config:
    """One config file's merged keys, with one-line errors that name the file and the key."""

    def __init__(self, path: Path, cfg: dict[str, Any]) -> None:
        self.path = path
        archs = cfg.get("architectures")
        if archs is not None and (not isinstance(archs, list) or not all(isinstance(a, str) for a in archs)):
            raise self.error(f"architectures must be a list of names, got {_brief(archs)}")
        self.architecture: str | None = archs[0] if archs else None
        text = cfg.get("text_config")
        merged = {k: v for k, v in cfg.items() if k != "text_config"}
        if isinstance(text, dict):
            merged.update(text)  # vLLM's hf_text_config: the text model's own keys win
        model_type = merged.get("model_type")
        self.model_type = model_type if isinstance(model_type, str) else None
        self.cfg = {**FAMILY_DEFAULTS.get(self.model_type or "", {}), **merged}

    def error(self, message: str) -> KvbenchError:
        return KvbenchError(f"{self.path}: {message}")

    def present(self, key: str) -> bool:
        return self.cfg.get(key) is not None

    def integer(self, *keys: str, default: int | None = None, minimum: int | None = 1) -> int:
        """The first of ``keys`` present, an integer of at least ``minimum`` (None: any; the
        geometry checks its own fields and says which) and at most its ``CONFIG_BOUNDS``."""
        for key in keys:
            value = self.cfg.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise self.error(f"{key} must be an integer, got {_brief(value)}")
            if minimum is not None and value < minimum:
                raise self.error(f"{key} must be at least {minimum}, got {_brief(value)}")
            upper, field = CONFIG_BOUNDS[key]
            if value > upper:
                what = f"{field}: at most {upper:,}" if field and field != key else f"at most {upper:,}"
                raise self.error(f"{key} = {_brief(value)} is beyond any real model ({what})")
            return value
        if default is None:
            raise self.error(f"missing key {keys[0]!r} (also tried: {', '.join(keys[1:]) or 'none'})")
        return default

    def window(self, key: str) -> int:
        """A window in tokens, 0 for none: null and 0 both mean none (vLLM reads a 0 window as none)."""
        return self.integer(key, default=0, minimum=0)

    def layer_types(self, allowed: dict[str, str], default: list[str]) -> list[str]:
        """``layer_types`` (or its alias ``layers_block_type``) as transformers loads it, each entry
        one of ``allowed`` (entry → what it is to kvbench): length and entries checked."""
        key = "layer_types" if "layer_types" in self.cfg else "layers_block_type"
        raw = self.cfg.get(key)
        if raw is None:
            return default
        if not isinstance(raw, list):
            raise self.error(f"{key} must be a list of layer kind names, got {_brief(raw)}")
        layers = self.integer("num_hidden_layers")
        if len(raw) != layers:  # before reading the entries: a list this long is no model's
            raise self.error(f"{key} has {len(raw)} entries but num_hidden_layers is {layers}")
        if not all(isinstance(v, str) for v in raw):
            raise self.error(f"{key} must be a list of layer kind names, got {_brief(raw)}")
        types = [LEGACY_LAYER_TYPES.get(str(v), str(v)) for v in raw]
        for i, v in enumerate(types):
            if v not in allowed:
                raise self.error(
                    f"{key}[{i}] = {raw[i]!r}: a layer kind kvbench does not model for {self.architecture} "
                    f"(it reads {', '.join(allowed)})"
                )
        return types

    def weight_dtype(self) -> str:
        """The model's dtype as vLLM's ``dtype="auto"`` resolves it (float32 and no dtype run as bf16)."""
        value = self.cfg.get("torch_dtype") or self.cfg.get("dtype")
        return WEIGHT_DTYPES.get(str(value), "bf16")

    def refuse_mla_fields(self) -> None:
        if self.present("kv_lora_rank"):
            raise self.error(
                f"kv_lora_rank is an MLA field and {self.architecture or 'a config without architectures'} is not "
                f"an MLA architecture (vLLM reads MLA for {', '.join(MLA_ARCHITECTURES)})"
            )


def _brief(value: object) -> str:
    """A config's value for a one-line error, cut short: the start of a long list (without
    writing all of it out first), a number of thousands of digits by its length."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**24:
        return f"a {len(str(abs(value)))}-digit number"
    if isinstance(value, list) and len(value) > 8:
        return one_line(repr(value[:8]))[:-1][:72] + f", ... ({len(value):,} entries)]"
    text = one_line(repr(value))
    return text if len(text) <= 80 else text[:77] + "..."


def _uniform_window(c: _Config, per_layer: bool) -> _Layers:
    """Decoders with one attention spec for every layer (Llama, Mistral, Qwen2/3, Mixtral, OPT):
    a model-wide sliding window applies to all layers when no layer_types say otherwise; llama.py
    also honours a per-layer ``layer_types`` (``per_layer``); Qwen2's model refuses a mix."""
    c.refuse_mla_fields()
    layers = c.integer("num_hidden_layers")
    window = c.window("sliding_window")
    if c.model_type in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe") and not c.cfg.get("use_sliding_window"):
        window = 0  # transformers drops the window unless use_sliding_window
    default = None
    if c.model_type in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe"):
        first = c.integer("max_window_layers", minimum=0)
        default = [SLIDING_ATTN if window and i >= first else FULL_ATTN for i in range(layers)]
    types = c.layer_types({FULL_ATTN: FULL, SLIDING_ATTN: SLIDING}, default or [])
    if not types or all(t == SLIDING_ATTN for t in types):
        return _Layers([(SLIDING, window) if window else (FULL, 0)] * layers)
    if not per_layer and len(set(types)) > 1:
        raise c.error(
            f"layer_types mixes sliding and full attention, which vLLM's {c.architecture} refuses "
            f"(max_window_layers must equal num_hidden_layers)"
        )
    return _Layers([(SLIDING, window) if t == SLIDING_ATTN and window else (FULL, 0) for t in types])


def _gemma(pattern_key: str | None) -> Callable[[_Config], _Layers]:
    """Gemma-2 (sliding on even layers) and Gemma-3 (five sliding to one full, or
    ``sliding_window_pattern``): per-layer windows from ``layer_types``."""

    def read(c: _Config) -> _Layers:
        c.refuse_mla_fields()
        if c.cfg.get("use_bidirectional_attention"):
            raise c.error("use_bidirectional_attention: an encoder-only Gemma keeps no KV cache for vLLM to page")
        layers = c.integer("num_hidden_layers")
        period = c.integer(pattern_key, default=6) if pattern_key else 2
        default = [SLIDING_ATTN if (i + 1) % period else FULL_ATTN for i in range(layers)]
        window = c.window("sliding_window")
        types = c.layer_types({FULL_ATTN: FULL, SLIDING_ATTN: SLIDING}, default)
        return _Layers([(SLIDING, window) if t == SLIDING_ATTN and window else (FULL, 0) for t in types])

    return read


def _gpt_oss(c: _Config) -> _Layers:
    """vLLM's gpt_oss.py slides the even layers, whatever ``layer_types`` says (checked all the same)."""
    c.refuse_mla_fields()
    layers = c.integer("num_hidden_layers")
    c.layer_types({FULL_ATTN: FULL, SLIDING_ATTN: SLIDING}, [])
    window = c.window("sliding_window")
    return _Layers([(SLIDING, window) if i % 2 == 0 and window else (FULL, 0) for i in range(layers)])


def _deepseek(c: _Config) -> _Layers:
    """DeepSeek-V2/V3 (and Kimi-K2): every layer MLA, one latent of kv_lora_rank + qk_rope_head_dim."""
    if c.model_type not in MLA_MODEL_TYPES:
        raise c.error(
            f"model_type {c.model_type!r}: vLLM runs {c.architecture} with MLA only for model types "
            f"{', '.join(MLA_MODEL_TYPES)}"
        )
    if not c.present("kv_lora_rank"):
        raise c.error(f"kv_lora_rank is missing: kvbench reads {c.architecture} as MLA, which needs it")
    rank = c.integer("kv_lora_rank")
    rope = c.integer("qk_rope_head_dim")
    nope = c.integer("qk_nope_head_dim", default=0, minimum=0)
    layers = c.integer("num_hidden_layers")
    return _Layers([(MLA, 0)] * layers, kv_lora_rank=rank, qk_rope_head_dim=rope, head_dim=nope + rope)


def _qwen3_next(c: _Config) -> _Layers:
    """Qwen3-Next: gated-delta-net (linear attention) layers and full attention every
    ``full_attention_interval``-th layer."""
    c.refuse_mla_fields()
    layers = c.integer("num_hidden_layers")
    every = c.integer("full_attention_interval")
    default = [LINEAR_ATTN if (i + 1) % every else FULL_ATTN for i in range(layers)]
    types = c.layer_types({FULL_ATTN: FULL, LINEAR_ATTN: GDN}, default)
    dtype = c.weight_dtype()
    state = StateGeometry(
        GDN,
        conv_kernel=c.integer("linear_conv_kernel_dim"),
        num_k_heads=c.integer("linear_num_key_heads"),
        num_v_heads=c.integer("linear_num_value_heads"),
        head_k_dim=c.integer("linear_key_head_dim"),
        head_v_dim=c.integer("linear_value_head_dim"),
        conv_dtype=dtype,
        temporal_dtype=dtype,
    )
    return _Layers([(GDN, 0) if t == LINEAR_ATTN else (FULL, 0) for t in types], state=state)


def _granite_hybrid(c: _Config) -> _Layers:
    """Granite-4.0-H (GraniteMoeHybrid): Mamba-2 layers and attention layers by ``layer_types``;
    attention heads of hidden_size ÷ num_attention_heads, as vLLM's granitemoehybrid.py sizes them."""
    c.refuse_mla_fields()
    layers = c.integer("num_hidden_layers")
    types = c.layer_types({FULL_ATTN: FULL, LINEAR_ATTN: MAMBA2}, [LINEAR_ATTN] * layers)
    hidden = c.integer("hidden_size")
    inner = c.integer("mamba_expand") * hidden
    heads = c.integer("mamba_n_heads")
    head = inner // heads if c.cfg.get("mamba_d_head") == "auto" else c.integer("mamba_d_head")
    dtype = c.weight_dtype()
    state = StateGeometry(
        MAMBA2,
        conv_kernel=c.integer("mamba_d_conv"),
        intermediate_size=inner,
        state_size=c.integer("mamba_d_state"),
        n_groups=c.integer("mamba_n_groups"),
        num_heads=heads,
        head_dim=head,
        conv_dtype=dtype,
        temporal_dtype=dtype,
    )
    kinds = [(MAMBA2, 0) if t == LINEAR_ATTN else (FULL, 0) for t in types]
    return _Layers(kinds, state=state, head_dim=hidden // c.integer("num_attention_heads"))


def _jamba(c: _Config) -> _Layers:
    """Jamba: attention on layer i when i % attn_layer_period == attn_layer_offset, Mamba(-1) elsewhere."""
    c.refuse_mla_fields()
    layers = c.integer("num_hidden_layers")
    period = c.integer("attn_layer_period")
    offset = c.integer("attn_layer_offset", minimum=0)
    if offset >= period:
        raise c.error(f"attn_layer_offset ({offset}) must be smaller than attn_layer_period ({period})")
    hidden = c.integer("hidden_size")
    dtype = c.weight_dtype()
    state = StateGeometry(
        MAMBA1,
        conv_kernel=c.integer("mamba_d_conv"),
        intermediate_size=c.integer("mamba_expand") * hidden,
        state_size=c.integer("mamba_d_state"),
        conv_dtype=dtype,
        temporal_dtype=dtype,
    )
    kinds = [(FULL, 0) if i % period == offset else (MAMBA1, 0) for i in range(layers)]
    return _Layers(kinds, state=state, head_dim=hidden // c.integer("num_attention_heads"))


def _llama4(c: _Config) -> _Layers:
    """Llama-4: chunked local attention (``attention_chunk_size``) on the layers that use RoPE
    (``no_rope_layers[i]`` = 1; every fourth layer is NoPE by default), full attention on the rest."""
    c.refuse_mla_fields()
    layers = c.integer("num_hidden_layers")
    chunk = c.window("attention_chunk_size")
    interval = c.integer("no_rope_layer_interval")
    rope = c.cfg.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(layers)]
    if not isinstance(rope, list) or len(rope) != layers or not all(v in (0, 1) for v in rope):
        raise c.error(f"no_rope_layers must hold one 0 or 1 per layer ({layers}), got {_brief(rope)}")
    return _Layers([(CHUNKED, chunk) if r and chunk else (FULL, 0) for r in rope])


# Architecture → how vLLM lays out its layers (the model file named in the comment).
ARCHITECTURES: dict[str, Callable[[_Config], _Layers]] = {
    "LlamaForCausalLM": lambda c: _uniform_window(c, per_layer=True),  # llama.py
    "LLaMAForCausalLM": lambda c: _uniform_window(c, per_layer=True),  # llama.py
    "InternLM3ForCausalLM": lambda c: _uniform_window(c, per_layer=True),  # llama.py
    "MistralForCausalLM": lambda c: _uniform_window(c, per_layer=True),  # mistral.py (llama.py's layers)
    "MixtralForCausalLM": lambda c: _uniform_window(c, per_layer=False),  # mixtral.py
    "Qwen2ForCausalLM": lambda c: _uniform_window(c, per_layer=False),  # qwen2.py
    "Qwen2MoeForCausalLM": lambda c: _uniform_window(c, per_layer=False),  # qwen2_moe.py
    "Qwen3ForCausalLM": lambda c: _uniform_window(c, per_layer=False),  # qwen3.py
    "Qwen3MoeForCausalLM": lambda c: _uniform_window(c, per_layer=False),  # qwen3_moe.py
    "OPTForCausalLM": lambda c: _uniform_window(c, per_layer=False),  # opt.py
    "Gemma2ForCausalLM": _gemma(None),  # gemma2.py
    "Gemma3ForCausalLM": _gemma("sliding_window_pattern"),  # gemma3.py
    "Gemma3ForConditionalGeneration": _gemma("sliding_window_pattern"),  # gemma3_mm.py: its text model
    "GptOssForCausalLM": _gpt_oss,  # gpt_oss.py
    "DeepseekV2ForCausalLM": _deepseek,  # deepseek_v2.py
    "DeepseekV3ForCausalLM": _deepseek,  # deepseek_v2.py
    "Qwen3NextForCausalLM": _qwen3_next,  # qwen3_next.py
    "GraniteMoeHybridForCausalLM": _granite_hybrid,  # granitemoehybrid.py
    "JambaForCausalLM": _jamba,  # jamba.py
    "Llama4ForCausalLM": _llama4,  # llama4.py
    "Llama4ForConditionalGeneration": _llama4,  # mllama4.py: its text model
}
MLA_ARCHITECTURES = tuple(a for a, r in ARCHITECTURES.items() if r is _deepseek)


def _generic(c: _Config) -> _Layers:
    """A config whose architecture kvbench does not read: plain full attention, if nothing in it
    says otherwise."""
    for key in NON_UNIFORM_KEYS:
        value = c.cfg.get(key)
        if value is None or value == 0:
            continue
        if key == "layer_types" and isinstance(value, list) and all(v in (FULL_ATTN, "attention") for v in value):
            continue
        if key == "kv_lora_rank":
            c.refuse_mla_fields()
        raise c.error(
            f"{key} on {'architecture ' + repr(c.architecture) if c.architecture else 'a config without architectures'}"
            f": kvbench does not know how vLLM lays out this model's layers (it reads {', '.join(ARCHITECTURES)})"
        )
    return _Layers([(FULL, 0)] * c.integer("num_hidden_layers", "n_layer", "num_layers"))


def load_json(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """The config file (a model directory's config.json) and its JSON object, or a one-line error."""
    p = Path(path)
    if "\x00" in str(p):  # the OS cannot take it; Path would raise ValueError further on
        raise KvbenchError(f"{str(p)!r}: a config path cannot hold a NUL character")
    folder = p.is_dir()
    if folder:
        p = p / "config.json"
    try:
        cfg = json.loads(read_text_capped(p, "config.json", MAX_CONFIG_BYTES))
    except FileNotFoundError:
        if folder:
            raise KvbenchError(f"{p.parent}: the directory holds no config.json") from None
        raise KvbenchError(f"{p}: no such config.json") from None
    except json.JSONDecodeError as exc:
        raise KvbenchError(f"{p}: malformed JSON at line {exc.lineno} column {exc.colno}") from None
    except (ValueError, RecursionError) as exc:  # a 5,000-digit number; arrays nested past the stack
        raise KvbenchError(f"{p}: malformed JSON ({one_line(str(exc)).split(';')[0] or type(exc).__name__})") from None
    if not isinstance(cfg, dict):
        raise KvbenchError(f"{p}: config.json must hold a JSON object")
    return p, cfg


def read_config_json(path: str | Path) -> ConfigReading:
    """Read a Hugging Face ``config.json`` (or a model directory holding one) as vLLM would."""
    p, raw = load_json(path)
    c = _Config(p, raw)
    layers = c.integer("num_hidden_layers", "n_layer", "num_layers", minimum=None)
    heads = c.integer("num_attention_heads", "n_head", minimum=None)
    hidden = c.integer("hidden_size", "n_embd", "d_model", minimum=None)
    if heads <= 0 or hidden <= 0:
        raise c.error("num_attention_heads and hidden_size must be positive")
    kv_heads = c.integer("num_key_value_heads", default=heads, minimum=None)
    reader = ARCHITECTURES.get(c.architecture or "", _generic)
    read = reader(c) if layers > 0 else _Layers([])
    if read.head_dim is not None:
        head_dim = read.head_dim
    elif c.present("head_dim"):
        # Honoured as given: some models (Gemma, Qwen3) have heads × head_dim ≠ hidden_size.
        head_dim = c.integer("head_dim", minimum=None)
    elif hidden % heads:
        raise c.error(
            f"hidden_size {hidden} is not a multiple of num_attention_heads {heads} "
            f"(head size {hidden / heads:g}); give head_dim if the model's differs"
        )
    else:
        head_dim = hidden // heads
    return ConfigReading(
        architecture=c.architecture,
        tied=bool(c.cfg.get("tie_word_embeddings", False)),
        fields=dict(
            name=str(c.cfg.get("_name_or_path") or p.parent.name or "config"),
            num_layers=layers,
            num_attention_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            hidden_size=hidden,
            intermediate_size=c.integer("intermediate_size", "ffn_dim", "n_inner", default=4 * hidden, minimum=None),
            vocab_size=c.integer("vocab_size", default=32000, minimum=None),
            layers=runs_of(read.kinds),
            kv_lora_rank=read.kv_lora_rank,
            qk_rope_head_dim=read.qk_rope_head_dim,
            state=read.state,
        ),
    )
