"""Model KV geometry: presets, Hugging Face ``config.json`` files, and KV arithmetic.

Everything kvbench knows about a model is what sizes its KV cache (layers and
what each keeps, KV heads, head dim, MLA's latent, state layers' shapes) plus
what a time model and the torch runner need (hidden size, MLP width,
vocabulary, parameter count for weight bytes). How a ``config.json`` is read
is ``model_config.py``; how vLLM groups the layers into KV cache groups and
blocks is ``kv_layout.py``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ..errors import KvbenchError
from . import identity
from .layer_kinds import (
    ATTENTION_KINDS,
    FULL,
    GDN,
    MLA,
    SLIDING,
    STATE_KINDS,
    LayerRun,
    StateGeometry,
    merged,
    runs_of,
)
from .model_config import UPPER_BOUNDS, read_config_json  # the bounds a config's keys are read against too

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


@dataclasses.dataclass(frozen=True)
class ModelGeometry:
    """The shape of a decoder-only transformer, as far as its KV cache and cost go.

    ``layers`` are runs of consecutive layers of one kind (``layer_kinds.py``); empty means
    every layer is full attention, the one layout the fields after it leave at their
    defaults (``identity.GEOMETRY_DEFAULTS``: such a model's run ids are what they were
    before the kinds existed). MLA layers keep one latent of ``kv_lora_rank +
    qk_rope_head_dim``; state layers keep ``state`` per request. ``num_kv_heads`` and
    ``head_dim`` size the other attention layers (and, for MLA, the attention FLOPs).
    """

    name: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    num_params: int  # for weight bytes in the roofline time model
    layers: tuple[LayerRun, ...] = ()
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    state: StateGeometry | None = None

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
        self._check_layers()

    def _check_layers(self) -> None:
        # Runs are counted and merged as runs: never spelled out layer by layer before their
        # total is checked against num_layers (itself bounded above).
        runs = merged(self.layers)
        if all(r.kind == FULL for r in runs):
            runs = ()  # every layer full attention: the default spelling, whatever was given
        object.__setattr__(self, "layers", runs)  # neighbours of one kind merged: one spelling per layout
        if runs and sum(r.count for r in runs) != self.num_layers:
            raise KvbenchError(
                f"model {self.name!r}: its layer runs hold {sum(r.count for r in runs)} layers, not num_layers "
                f"({self.num_layers})"
            )
        kinds = {r.kind for r in runs}
        for field in ("kv_lora_rank", "qk_rope_head_dim"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= UPPER_BOUNDS[field]:
                raise KvbenchError(
                    f"model {self.name!r}: {field} must be a whole number up to {UPPER_BOUNDS[field]:,}, got {value!r}"
                )
            if (MLA in kinds) != (value > 0):
                raise KvbenchError(
                    f"model {self.name!r}: {field} = {value} " + ("with no MLA layers" if value else "for MLA layers")
                )
        states = kinds & set(STATE_KINDS)
        have = {self.state.kind} if self.state is not None else set()
        if states != have:
            raise KvbenchError(
                f"model {self.name!r}: state layers {sorted(states) or 'none'} but a state of {sorted(have) or 'none'}"
            )

    # -- layers -------------------------------------------------------------------------------
    def per_layer(self) -> tuple[tuple[str, int], ...]:
        """(kind, window) of every layer, in order."""
        if not self.layers:
            return ((FULL, 0),) * self.num_layers
        return tuple((r.kind, r.window) for r in self.layers for _ in range(r.count))

    @property
    def kinds(self) -> tuple[str, ...]:
        """The layer kinds present, in order of first appearance."""
        return tuple(dict.fromkeys(kind for kind, _ in self.per_layer()))

    @property
    def is_uniform_full(self) -> bool:
        """Every layer full attention: the layout kvbench's runners and policies price."""
        return not self.layers

    def layer_count(self, kind: str) -> int:
        return sum(1 for k, _ in self.per_layer() if k == kind)

    def stage_layers(self, pipeline_parallel_size: int = 1) -> tuple[range, ...]:
        """The layers of each pipeline stage, as vLLM's ``get_pp_indices`` splits them: ``layers //
        pp`` each, the remainder one layer each to the stages just before the last."""
        pp = pipeline_parallel_size
        sizes = [self.num_layers // pp] * pp
        for i in range(2, self.num_layers % pp + 2):
            sizes[-i] += 1
        bounds = [sum(sizes[:i]) for i in range(pp + 1)]
        return tuple(range(bounds[i], bounds[i + 1]) for i in range(pp))

    def layer_bytes_per_token(self, kind: str, kv_dtype: str, tensor_parallel_size: int = 1) -> int:
        """One layer's KV bytes per token on one rank: K and V of its rank's KV heads, or MLA's one
        latent (the same on every rank); 0 for a state layer."""
        if kind in STATE_KINDS:
            return 0
        if kind == MLA:
            return (self.kv_lora_rank + self.qk_rope_head_dim) * kv_dtype_bytes(kv_dtype)
        return 2 * self.kv_heads_per_rank(tensor_parallel_size) * self.head_dim * kv_dtype_bytes(kv_dtype)

    def kv_bytes_per_token_by_kind(
        self, kv_dtype: str, tensor_parallel_size: int = 1, pipeline_parallel_size: int = 1
    ) -> dict[str, int]:
        """Each attention kind's bytes per token over its layers, in the stage whose KV per token
        is largest (the one whose budget binds; the whole model at pipeline parallel size 1)."""
        per_layer = self.per_layer()
        best: dict[str, int] = {}
        for stage in self.stage_layers(pipeline_parallel_size):
            totals: dict[str, int] = {}
            for i in stage:
                kind = per_layer[i][0]
                if kind in ATTENTION_KINDS:
                    totals[kind] = totals.get(kind, 0) + self.layer_bytes_per_token(
                        kind, kv_dtype, tensor_parallel_size
                    )
            if sum(totals.values()) > sum(best.values()) or not best:
                best = totals
        return best

    def state_bytes_per_request(self, tensor_parallel_size: int = 1, pipeline_parallel_size: int = 1) -> int:
        """Bytes of state one request keeps in its state layers on one rank (the stage with the most)."""
        if self.state is None:
            return 0
        per_layer = self.per_layer()
        layers = max(
            sum(1 for i in s if per_layer[i][0] in STATE_KINDS) for s in self.stage_layers(pipeline_parallel_size)
        )
        return layers * self.state.bytes_per_layer(tensor_parallel_size)

    def kv_bytes_per_token(self, kv_dtype: str, tensor_parallel_size: int = 1, pipeline_parallel_size: int = 1) -> int:
        """KV bytes per token with every attention layer sized as full attention for every token
        (vLLM's view with its hybrid KV cache manager off): 2 (K and V) × layers × KV heads × head
        dim × bytes per element, an MLA layer's one latent in place of K and V; state layers, kept
        per request, are not counted. Of the whole model at tensor and pipeline parallel size 1,
        else of one rank (``kv_heads_per_rank``, an MLA latent on every rank, and the stage whose KV
        is largest). ``kv_layout.py`` has what the hybrid manager keeps."""
        if self.is_uniform_full:
            layers = self.layers_per_stage(pipeline_parallel_size)
            heads = self.kv_heads_per_rank(tensor_parallel_size)
            return 2 * layers * heads * self.head_dim * kv_dtype_bytes(kv_dtype)
        return sum(self.kv_bytes_per_token_by_kind(kv_dtype, tensor_parallel_size, pipeline_parallel_size).values())

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
        divide evenly across ranks (or, fewer than the ranks, be replicated evenly), and a state's
        sharded dimensions; PP at most the layers."""
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
        if self.state is not None:
            try:
                self.state.shapes(tp)
            except KvbenchError as exc:
                raise KvbenchError(f"model {self.name!r}: {exc}") from None

    def weight_bytes(self, dtype_bytes: int = 2) -> int:
        return self.num_params * dtype_bytes

    def identity(self) -> dict[str, Any]:
        """Its fields as run identity sees them (``identity.geometry_identity``)."""
        return identity.geometry_identity(dataclasses.asdict(self))

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
    runs: tuple[LayerRun, ...] = (),
    **latent_or_state: Any,
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
        layers=runs,
        **latent_or_state,
    )


def _alternating(layers: int, period: int, kind: str, window: int) -> tuple[LayerRun, ...]:
    """``kind`` (with ``window``) on every layer but each ``period``-th, which is full attention."""
    return runs_of([(FULL, 0) if (i + 1) % period == 0 else (kind, window) for i in range(layers)])


# Qwen3-Next-80B-A3B's gated delta net (its config's linear_* keys), bf16 like its weights.
QWEN3_NEXT_STATE = StateGeometry(GDN, conv_kernel=4, num_k_heads=16, num_v_heads=32, head_k_dim=128, head_v_dim=128)


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
        # Today's layouts, as their config.json files are read (tests/data/models holds those
        # shipped as test data; tests/test_model_configs.py checks each preset against its file).
        _preset("llama-3.1-8b", 32, 32, 8, 4096, 14336, 128256, 8_030_000_000),
        _preset("llama-3.1-70b", 80, 64, 8, 8192, 28672, 128256, 70_554_000_000),
        # MLA: 61 layers of one 512 + 64 latent; 128 heads of 128 + 64 for the attention FLOPs.
        _preset(
            "deepseek-v3",
            61,
            128,
            128,
            7168,
            18432,
            129280,
            671_000_000_000,
            192,
            runs=(LayerRun(MLA, 61),),
            kv_lora_rank=512,
            qk_rope_head_dim=64,
        ),
        # Sliding window 128 on the even layers, full attention on the odd ones (gpt_oss.py).
        _preset(
            "gpt-oss-20b", 24, 64, 8, 2880, 2880, 201088, 20_910_000_000, 64, runs=_alternating(24, 2, SLIDING, 128)
        ),
        _preset(
            "gpt-oss-120b", 36, 64, 8, 2880, 2880, 201088, 116_830_000_000, 64, runs=_alternating(36, 2, SLIDING, 128)
        ),
        # Five sliding (window 1024) to one full attention layer.
        _preset(
            "gemma-3-27b",
            62,
            32,
            16,
            5376,
            21504,
            262208,
            27_000_000_000,
            128,
            runs=_alternating(62, 6, SLIDING, 1024),
        ),
        # Three gated-delta-net layers to one full attention layer.
        _preset(
            "qwen3-next-80b",
            48,
            16,
            2,
            2048,
            5120,
            151936,
            80_000_000_000,
            256,
            runs=_alternating(48, 4, GDN, 0),
            state=QWEN3_NEXT_STATE,
        ),
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
    """A geometry from a Hugging Face ``config.json`` (or a model directory), read as vLLM reads
    it (``model_config.py``)."""
    r = read_config_json(path)
    p = Path(path) / "config.json" if Path(path).is_dir() else Path(path)
    f = r.fields
    shape = (f["num_layers"], f["hidden_size"], f["num_attention_heads"], f["num_kv_heads"], f["head_dim"])
    params = llama_param_count(*shape, f["intermediate_size"], f["vocab_size"], r.tied)
    try:
        return ModelGeometry(**f, num_params=params)
    except KvbenchError as exc:  # name the file, not just the model inside it
        raise KvbenchError(f"{p}: {exc}") from None


def resolve_model(preset_name: str | None = None, config: str | Path | None = None) -> ModelGeometry:
    """A geometry from exactly one of a preset name or a ``config.json`` path."""
    if (preset_name is None) == (config is None):
        raise KvbenchError("model: give exactly one of 'preset' or 'config'")
    return preset(preset_name) if preset_name is not None else from_config_json(config)  # type: ignore[arg-type]
