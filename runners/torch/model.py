"""A small Llama-style decoder with seeded random weights, for the ``torch`` runner.

RMSNorm, rotary position embeddings (rotate-half, as Hugging Face Llama),
grouped-query attention and a SwiGLU MLP, shaped by a
``harness.spec.geometry.ModelGeometry``. Weights are drawn from an explicit
``torch.Generator`` on the CPU in fp32 (so CPU and CUDA get the same weights)
and scaled by 1/sqrt(fan-in), which keeps activations and logits of order one:
greedy decoding then has clear winners rather than near-ties.

The model does not own a KV cache. ``forward`` takes an ``attend`` callback
that receives one layer's rotated queries, keys and values for the step's new
tokens and returns the attention output; the torch runner's callback writes
K/V into a contiguous or a paged cache and reads each sequence's context
back (``runners.torch.kv``), and ``reference_logits`` uses plain causal
attention over a whole sequence, with no cache at all, as the oracle the
tests check both caches against.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ...harness.errors import KvbenchError
from ...harness.spec.capabilities import RUNNER_FACTS
from ...harness.spec.geometry import ModelGeometry, llama_param_count

ROPE_THETA = 10_000.0
RMS_EPS = 1e-5

# KV cache dtype name → torch storage dtype. int8 needs quantisation scales,
# which this reference runtime does not model.
KV_TORCH_DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp8": torch.float8_e4m3fn,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}
assert tuple(KV_TORCH_DTYPES) == RUNNER_FACTS["torch"].kv_dtypes, "harness/spec/capabilities.py disagrees"

# Attention = (layer index, q [T, heads, head_dim], k [T, kv_heads, head_dim], v) → [T, heads × head_dim]
Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def kv_storage_dtype(kv_dtype: str) -> torch.dtype:
    try:
        return KV_TORCH_DTYPES[kv_dtype]
    except KeyError:
        raise KvbenchError(
            f"torch runner: no {kv_dtype!r} KV cache (it needs quantisation scales); "
            f"supported: {', '.join(KV_TORCH_DTYPES)}"
        ) from None


def compute_dtype(kv_dtype: str, device: torch.device) -> torch.dtype:
    """The dtype the model computes in: the cache's own when it is a compute type the
    device handles well (fp32, bf16; fp16 on CUDA), fp32 on the CPU otherwise, bf16
    on CUDA for fp8 caches (values are cast on write and on read)."""
    storage = kv_storage_dtype(kv_dtype)
    if storage in (torch.float32, torch.bfloat16):
        return storage
    if device.type == "cuda":
        return torch.float16 if storage == torch.float16 else torch.bfloat16
    return torch.float32


def param_count(g: ModelGeometry) -> int:
    """Parameters of the decoder built here (untied embeddings), not the preset's published total."""
    return llama_param_count(
        g.num_layers,
        g.hidden_size,
        g.num_attention_heads,
        g.num_kv_heads,
        g.head_dim,
        g.intermediate_size,
        g.vocab_size,
    )


def layer_param_count(g: ModelGeometry) -> int:
    """Parameters of one decoder layer (attention, MLP, two norms)."""
    return param_count(g.replace(num_layers=2)) - param_count(g.replace(num_layers=1))


def scale_layers(g: ModelGeometry, num_layers: int) -> ModelGeometry:
    """The same preset with ``num_layers`` layers (KV bytes per token scale with it)."""
    scaled = g.replace(name=f"{g.name}-{num_layers}l", num_layers=num_layers)
    return scaled.replace(num_params=param_count(scaled))


@dataclasses.dataclass
class Layer:
    attn_norm: torch.Tensor  # [hidden]
    wqkv: torch.Tensor  # [(heads + 2 × kv_heads) × head_dim, hidden]
    wo: torch.Tensor  # [hidden, heads × head_dim]
    mlp_norm: torch.Tensor  # [hidden]
    w_gate_up: torch.Tensor  # [2 × intermediate, hidden]
    w_down: torch.Tensor  # [hidden, intermediate]


def rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    var = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(var + RMS_EPS)).to(x.dtype) * weight


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, rotate-half form. x [T, heads, head_dim]; cos/sin [T, head_dim]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


class DecoderModel:
    """Seeded random weights of a Llama-style decoder; forward over flat token batches."""

    def __init__(
        self,
        geometry: ModelGeometry,
        *,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        seed: int = 0,
        max_positions: int = 4096,
    ) -> None:
        g = geometry
        if g.head_dim % 2:
            raise KvbenchError(f"torch runner: head_dim {g.head_dim} must be even for rotary embeddings")
        self.geometry = g
        self.dtype = dtype
        self.device = torch.device(device)
        gen = torch.Generator(device="cpu").manual_seed(seed)

        def draw(*shape: int, fan_in: int | None = None) -> torch.Tensor:
            t = torch.randn(*shape, generator=gen, dtype=torch.float32)
            if fan_in is not None:
                t.mul_(1.0 / math.sqrt(fan_in))
            return t.to(device=self.device, dtype=dtype)

        def ones(n: int) -> torch.Tensor:
            return torch.ones(n, device=self.device, dtype=dtype)

        hd, nh, nkv, hidden, inter = (
            g.head_dim,
            g.num_attention_heads,
            g.num_kv_heads,
            g.hidden_size,
            g.intermediate_size,
        )
        self.embed = draw(g.vocab_size, hidden)
        self.layers = [
            Layer(
                attn_norm=ones(hidden),
                wqkv=draw((nh + 2 * nkv) * hd, hidden, fan_in=hidden),
                wo=draw(hidden, nh * hd, fan_in=nh * hd),
                mlp_norm=ones(hidden),
                w_gate_up=draw(2 * inter, hidden, fan_in=hidden),
                w_down=draw(hidden, inter, fan_in=inter),
            )
            for _ in range(g.num_layers)
        ]
        self.final_norm = ones(hidden)
        self.lm_head = draw(g.vocab_size, hidden, fan_in=hidden)
        inv_freq = 1.0 / (ROPE_THETA ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        angles = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        self.cos = angles.cos().to(device=self.device, dtype=dtype)
        self.sin = angles.sin().to(device=self.device, dtype=dtype)
        self.max_positions = max_positions

    @property
    def weight_bytes(self) -> int:
        tensors = [self.embed, self.lm_head, self.final_norm]
        for layer in self.layers:
            tensors += dataclasses.astuple(layer)
        return sum(t.numel() * t.element_size() for t in tensors)

    def forward(
        self, tokens: torch.Tensor, positions: torch.Tensor, attend: Attend, sample_rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        """fp32 logits of the rows ``sample_rows`` (all rows when None) of a flat token batch.

        ``tokens`` and ``positions`` are [T] int64 on the model's device; ``attend``
        is called once per layer, in order, with that layer's new q/k/v.
        """
        g = self.geometry
        nh, nkv, hd = g.num_attention_heads, g.num_kv_heads, g.head_dim
        T = tokens.shape[0]
        cos, sin = self.cos[positions], self.sin[positions]
        x = self.embed[tokens]
        for i, layer in enumerate(self.layers):
            h = rms_norm(x, layer.attn_norm)
            qkv = F.linear(h, layer.wqkv)
            q, k, v = qkv.split((nh * hd, nkv * hd, nkv * hd), dim=-1)
            q = rotate(q.view(T, nh, hd), cos, sin)
            k = rotate(k.view(T, nkv, hd), cos, sin)
            attn = attend(i, q, k, v.view(T, nkv, hd))
            x = x + F.linear(attn, layer.wo)
            h = rms_norm(x, layer.mlp_norm)
            gate, up = F.linear(h, layer.w_gate_up).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, layer.w_down)
        if sample_rows is not None:
            x = x[sample_rows]
        return F.linear(rms_norm(x, self.final_norm), self.lm_head).float()

    @torch.inference_mode()
    def reference_logits(self, token_ids: list[int]) -> torch.Tensor:
        """Logits at every position of one sequence, by plain causal attention and no cache."""
        tokens = torch.tensor(token_ids, dtype=torch.long, device=self.device)
        positions = torch.arange(len(token_ids), device=self.device)

        def attend(_layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            o = F.scaled_dot_product_attention(
                q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True, enable_gqa=True
            )
            return o.transpose(0, 1).reshape(q.shape[0], -1)

        return self.forward(tokens, positions, attend)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One sequence's attention: q [n, heads, hd] for its last n positions over k/v [ctx, kv_heads, hd].

    Query i sits at position ctx − n + i and sees keys 0 … ctx − n + i.
    """
    n, ctx = q.shape[0], k.shape[0]
    qt, kt, vt = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
    if n == 1:
        o = F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
    elif n == ctx:
        o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=True)
    else:
        rows = torch.arange(ctx - n, ctx, device=q.device)[:, None]
        mask = torch.arange(ctx, device=q.device)[None, :] <= rows
        o = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, enable_gqa=True)
    return o.transpose(0, 1).reshape(n, -1)


def decode_attention(q: torch.Tensor, kv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """B decoding sequences at once: q [B, heads, hd] over padded kv [2, B, L, kv_heads, hd].

    ``mask`` [B, 1, 1, L] marks each row's real context; the query is its last position.
    """
    k, v = kv[0].transpose(1, 2), kv[1].transpose(1, 2)  # [B, kv_heads, L, hd]
    o = F.scaled_dot_product_attention(q[:, :, None, :], k, v, attn_mask=mask, enable_gqa=True)
    return o.reshape(q.shape[0], -1)
