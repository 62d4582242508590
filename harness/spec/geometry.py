"""Model KV geometry: presets, Hugging Face ``config.json`` files, and KV arithmetic.

Everything kvbench knows about a model is what sizes its KV cache (layers,
KV heads, head dim) plus what a time model and the torch runner need (hidden
size, MLP width, vocabulary, parameter count for weight bytes).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from ..errors import KvbenchError, one_line
from ..files import MIB, read_text_capped

# Bytes per element of each supported KV cache dtype. fp8 means e4m3, the
# format vLLM's "fp8" cache dtype resolves to.
KV_DTYPE_BYTES: dict[str, int] = {
    "fp32": 4,
    "fp16": 2,
    "bf16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "int8": 1,
}


# Real config.json files are a few KiB; one of megabytes is not a model's configuration.
MAX_CONFIG_BYTES = 16 * MIB

# Sane upper bounds: several times the largest published decoders (Llama 3.1 405B: 126
# layers, 128 heads, hidden 16,384, MLP 53,248; head sizes up to 256; vocabularies up to
# ~262k), so a real model never trips them and a typo (an extra digit or three) does.
UPPER_BOUNDS: dict[str, int] = {
    "num_layers": 1024,
    "num_attention_heads": 1024,
    "num_kv_heads": 1024,
    "head_dim": 1024,
    "hidden_size": 131_072,
    "intermediate_size": 1_048_576,
    "vocab_size": 4_194_304,
}


@dataclasses.dataclass(frozen=True)
class ModelGeometry:
    """The shape of a decoder-only transformer, as far as its KV cache and cost go."""

    name: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    num_params: int  # for weight bytes in the roofline time model

    def __post_init__(self) -> None:
        for field in (
            "num_layers",
            "num_attention_heads",
            "num_kv_heads",
            "head_dim",
            "hidden_size",
            "intermediate_size",
            "vocab_size",
            "num_params",
        ):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise KvbenchError(f"model {self.name!r}: {field} must be a positive integer, got {value!r}")
            upper = UPPER_BOUNDS.get(field)
            if upper is not None and value > upper:
                raise KvbenchError(
                    f"model {self.name!r}: {field} = {value} is beyond any real model (at most {upper:,})"
                )
        if self.num_attention_heads % self.num_kv_heads:
            raise KvbenchError(
                f"model {self.name!r}: num_attention_heads ({self.num_attention_heads}) is not a multiple "
                f"of num_kv_heads ({self.num_kv_heads})"
            )

    def kv_bytes_per_token(self, kv_dtype: str, tensor_parallel_size: int = 1, pipeline_parallel_size: int = 1) -> int:
        """2 (K and V) × layers × KV heads × head dim × bytes per element: of the whole model at
        tensor and pipeline parallel size 1, else of one rank (``kv_heads_per_rank`` ×
        ``layers_per_stage``: the stage with the most layers, the one whose budget binds)."""
        layers = self.layers_per_stage(pipeline_parallel_size)
        heads = self.kv_heads_per_rank(tensor_parallel_size)
        return 2 * layers * heads * self.head_dim * kv_dtype_bytes(kv_dtype)

    def kv_heads_per_rank(self, tensor_parallel_size: int = 1) -> int:
        """KV heads one tensor-parallel rank holds: split evenly across ranks, or, with fewer KV
        heads than ranks, one replicated head per rank (vLLM's rule: ``max(1, kv_heads // tp)``)."""
        return max(1, self.num_kv_heads // tensor_parallel_size)

    def layers_per_stage(self, pipeline_parallel_size: int = 1) -> int:
        """Layers of the largest pipeline stage: vLLM splits ``layers // pp`` to each stage and
        gives the remainder one layer each to stages before the last, so the largest holds
        ⌈layers / pp⌉."""
        return -(-self.num_layers // pipeline_parallel_size)

    def check_parallel(self, tensor_parallel_size: int, pipeline_parallel_size: int = 1) -> None:
        """Refuse a split vLLM refuses: TP must divide the attention heads, and the KV heads must
        divide evenly across ranks (or, fewer than the ranks, be replicated evenly); PP at most
        the layers."""
        tp, pp = tensor_parallel_size, pipeline_parallel_size
        for field, value in (("tensor_parallel_size", tp), ("pipeline_parallel_size", pp)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise KvbenchError(f"{field} must be a positive integer, got {value!r}")
        if self.num_attention_heads % tp:
            raise KvbenchError(
                f"model {self.name!r}: tensor_parallel_size {tp} does not divide its "
                f"{self.num_attention_heads} attention heads"
            )
        kv = self.num_kv_heads
        if (kv >= tp and kv % tp) or (kv < tp and tp % kv):
            raise KvbenchError(
                f"model {self.name!r}: tensor_parallel_size {tp} neither divides its {kv} KV heads "
                f"nor is a multiple of them (replication)"
            )
        if pp > self.num_layers:
            raise KvbenchError(
                f"model {self.name!r}: pipeline_parallel_size {pp} is more than its {self.num_layers} layers"
            )

    def weight_bytes(self, dtype_bytes: int = 2) -> int:
        return self.num_params * dtype_bytes

    def replace(self, **changes: Any) -> ModelGeometry:
        return dataclasses.replace(self, **changes)


def kv_dtype_bytes(kv_dtype: str) -> int:
    try:
        return KV_DTYPE_BYTES[kv_dtype]
    except KeyError:
        raise KvbenchError(f"unknown kv_dtype {kv_dtype!r} (known: {', '.join(KV_DTYPE_BYTES)})") from None


def llama_param_count(
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    intermediate: int,
    vocab: int,
    tied: bool = False,
) -> int:
    """Parameters of a Llama-style decoder (q/k/v/o, SwiGLU MLP, two norms a layer)."""
    attn = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
    mlp = 3 * hidden * intermediate
    per_layer = attn + mlp + 2 * hidden
    embed = vocab * hidden * (1 if tied else 2)
    return layers * per_layer + embed + hidden


def _preset(
    name: str,
    layers: int,
    heads: int,
    kv_heads: int,
    hidden: int,
    intermediate: int,
    vocab: int,
    params: int | None = None,
    head_dim: int | None = None,
) -> ModelGeometry:
    hd = head_dim or hidden // heads
    return ModelGeometry(
        name=name,
        num_layers=layers,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=hd,
        hidden_size=hidden,
        intermediate_size=intermediate,
        vocab_size=vocab,
        num_params=params or llama_param_count(layers, hidden, heads, kv_heads, hd, intermediate, vocab),
    )


# Published architectures; parameter counts are the published totals.
PRESETS: dict[str, ModelGeometry] = {
    g.name: g
    for g in (
        _preset("opt-13b", 40, 40, 40, 5120, 20480, 50272, 12_853_000_000),
        _preset("opt-66b", 64, 72, 72, 9216, 36864, 50272, 65_700_000_000),
        # facebook/opt-175b's published configuration (the OPT paper, Table 1): 96 layers, 96
        # heads of 128, hidden 12,288, MLP 49,152; about 175B parameters.
        _preset("opt-175b", 96, 96, 96, 12288, 49152, 50272, 175_000_000_000),
        _preset("llama-2-7b", 32, 32, 32, 4096, 11008, 32000, 6_738_000_000),
        _preset("llama-2-13b", 40, 40, 40, 5120, 13824, 32000, 13_016_000_000),
        _preset("llama-3-8b", 32, 32, 8, 4096, 14336, 128256, 8_030_000_000),
        _preset("llama-3-70b", 80, 64, 8, 8192, 28672, 128256, 70_554_000_000),
        _preset("mistral-7b", 32, 32, 8, 4096, 14336, 32000, 7_242_000_000),
        _preset("qwen2.5-7b", 28, 28, 4, 3584, 18944, 152064, 7_616_000_000),
        # Small enough for the torch runner on two CPU cores.
        _preset("tiny", 2, 4, 2, 64, 128, 256),
        # Small, and shaped for vLLM's CPU attention backend (head size 64): the full engine on CPU
        # beside the torch runner on the same geometry.
        _preset("llama-mini", 3, 4, 2, 256, 512, 2048),
    )
}


def preset(name: str) -> ModelGeometry:
    try:
        return PRESETS[name]
    except KeyError:
        raise KvbenchError(f"unknown model preset {name!r} (known: {', '.join(PRESETS)})") from None


def from_config_json(path: str | Path) -> ModelGeometry:
    """Read a Hugging Face ``config.json`` (Llama/Mistral/Qwen/OPT-style keys)."""
    p = Path(path)
    if "\x00" in str(p):  # the OS cannot take it; Path would raise ValueError further on
        raise KvbenchError(f"{str(p)!r}: a config path cannot hold a NUL character")
    if p.is_dir():
        p = p / "config.json"
    try:
        cfg = json.loads(read_text_capped(p, "config.json", MAX_CONFIG_BYTES))
    except FileNotFoundError:
        raise KvbenchError(f"{p}: no such config.json") from None
    except json.JSONDecodeError as exc:
        raise KvbenchError(f"{p}: malformed JSON at line {exc.lineno} column {exc.colno}") from None
    except (ValueError, RecursionError) as exc:  # a 5,000-digit number; arrays nested past the stack
        raise KvbenchError(f"{p}: malformed JSON ({one_line(str(exc)).split(';')[0] or type(exc).__name__})") from None
    if not isinstance(cfg, dict):
        raise KvbenchError(f"{p}: config.json must hold a JSON object")
    cfg = dict(cfg.get("text_config") or {}, **{k: v for k, v in cfg.items() if k != "text_config"})

    def get(*keys: str, default: object = None) -> object:
        for key in keys:
            if key in cfg and cfg[key] is not None:
                return cfg[key]
        if default is None:
            raise KvbenchError(f"{p}: missing key {keys[0]!r} (also tried: {', '.join(keys[1:]) or 'none'})")
        return default

    def integer(value: object, key: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise KvbenchError(f"{p}: {key} must be an integer, got {value!r}")
        return value

    layers = integer(get("num_hidden_layers", "n_layer", "num_layers"), "num_hidden_layers")
    heads = integer(get("num_attention_heads", "n_head"), "num_attention_heads")
    hidden = integer(get("hidden_size", "n_embd", "d_model"), "hidden_size")
    kv_heads = integer(get("num_key_value_heads", default=heads), "num_key_value_heads")
    if heads <= 0 or hidden <= 0:
        raise KvbenchError(f"{p}: num_attention_heads and hidden_size must be positive")
    if cfg.get("head_dim") is not None:
        # Honoured as given: some models (Gemma, Qwen3) have heads × head_dim ≠ hidden_size.
        head_dim = integer(cfg["head_dim"], "head_dim")
    elif hidden % heads:
        raise KvbenchError(
            f"{p}: hidden_size {hidden} is not a multiple of num_attention_heads {heads} "
            f"(head size {hidden / heads:g}); give head_dim if the model's differs"
        )
    else:
        head_dim = hidden // heads
    intermediate = integer(get("intermediate_size", "ffn_dim", "n_inner", default=4 * hidden), "intermediate_size")
    vocab = integer(get("vocab_size", default=32000), "vocab_size")
    tied = bool(cfg.get("tie_word_embeddings", False))
    name = str(cfg.get("_name_or_path") or p.parent.name or "config")
    try:
        return ModelGeometry(
            name=name,
            num_layers=layers,
            num_attention_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            hidden_size=hidden,
            intermediate_size=intermediate,
            vocab_size=vocab,
            num_params=llama_param_count(layers, hidden, heads, kv_heads, head_dim, intermediate, vocab, tied),
        )
    except KvbenchError as exc:  # name the file, not just the model inside it
        raise KvbenchError(f"{p}: {exc}") from None


def resolve_model(preset_name: str | None = None, config: str | Path | None = None) -> ModelGeometry:
    """A geometry from exactly one of a preset name or a ``config.json`` path."""
    if (preset_name is None) == (config is None):
        raise KvbenchError("model: give exactly one of 'preset' or 'config'")
    return preset(preset_name) if preset_name is not None else from_config_json(config)  # type: ignore[arg-type]
