"""vLLM's KV cache groups and blocks for a model, as pure arithmetic.

``kv_layout`` takes the steps vLLM takes from every layer's ``KVCacheSpec`` to a
``KVCacheConfig`` (``vllm/v1/core/kv_cache_utils.py``; ``kv_cache_planning.py`` in
0.33): the Mamba block-size rule, the hybrid manager off (sliding and chunked layers
sized as full), groups of equal page size, one pool of block ids shared by every
group. docs/models.md ("KV cache groups") states each step with vLLM's function name.
Layer-outermost cache layouts are mirrored; the packing of block-outermost ones is not.
"""

from __future__ import annotations

import dataclasses
import math

from ..errors import KvbenchError
from .geometry import ModelGeometry
from .layer_kinds import CHUNKED, FULL, MLA, SLIDING, STATE_KINDS

# vLLM's own words when state layers cannot be sized as full attention (_promote_local_kv_cache_specs).
PROMOTE_FAILED = "Failed to promote local KV cache specs to one unified type."
# TRTLLM/FlashInfer MLA kernels need a block multiple of 128 beside a Mamba state (platforms/interface.py).
MLA_MAMBA_ALIGNMENT = 128


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclasses.dataclass(frozen=True)
class KVGroup:
    """One KV cache group: layers of one kind sharing one block table per request.

    ``layers`` are model layer indices; ``padding_layers`` the layers it lacks against the
    group size (vLLM pads counts so every group has as many layers). ``page_bytes`` is one
    layer's page (``block_size`` tokens, or one request's state) with vLLM's padding;
    ``real_page_bytes`` without. ``admission_blocks`` is vLLM's per-request admission cap
    for sliding and chunked groups (``max_admission_blocks_per_request``), else None."""

    kind: str
    layers: tuple[int, ...]
    padding_layers: int
    window: int
    block_size: int
    page_bytes: int
    real_page_bytes: int
    admission_blocks: int | None

    @property
    def is_state(self) -> bool:
        return self.kind in STATE_KINDS

    @property
    def bytes_per_block(self) -> int:
        """One block id's bytes in this group: a page in each of its layers."""
        return len(self.layers) * self.page_bytes

    def skipped_tokens(self, computed: int) -> int:
        """Tokens whose blocks vLLM frees (``get_num_skipped_tokens``): before the window, before
        the current chunk, or all but the last token's state."""
        if self.kind == SLIDING:
            return max(0, computed - self.window + 1)
        if self.kind == CHUNKED:
            return computed // self.window * self.window
        if self.is_state:
            return max(0, computed - 1)
        return 0

    def blocks_held(self, tokens: int) -> int:
        """Real blocks a request with ``tokens`` computed tokens holds in this group once vLLM has
        freed what it no longer needs (the null block stands in for the rest of its table)."""
        if tokens <= 0:
            return 0
        return cdiv(tokens, self.block_size) - self.skipped_tokens(tokens) // self.block_size


@dataclasses.dataclass(frozen=True)
class KVLayout:
    """A model's KV cache groups and the block pool they share, for one vLLM configuration.

    ``stage_bytes_per_block`` holds, per pipeline stage, one block id's bytes over that stage's
    layers; ``num_blocks`` is what the stage that binds allows. ``block_size`` is the attention
    block size after the Mamba rule; ``scheduler_block_size`` the LCM of the groups'."""

    hybrid: bool
    groups: tuple[KVGroup, ...]
    block_size: int
    scheduler_block_size: int
    stage_bytes_per_block: tuple[int, ...]
    mamba_cache_mode: str
    kv_bytes_per_token_by_kind: tuple[tuple[str, int], ...]
    state_bytes_per_request: int

    @property
    def bytes_per_block(self) -> int:
        """One block id's bytes across all groups (the largest group's pages; the largest stage)."""
        return max(self.stage_bytes_per_block)

    def num_blocks(self, budget_bytes: int) -> int:
        """Blocks the budget (one GPU's) holds: ``available_memory // bytes_per_block``, the least
        over pipeline stages. vLLM keeps one of them back as its null block."""
        return budget_bytes // self.bytes_per_block

    def blocks_per_request(self, tokens: int) -> int:
        """Block ids one request of ``tokens`` tokens holds across all groups (``KVGroup.blocks_held``)."""
        return sum(g.blocks_held(tokens) for g in self.groups)


@dataclasses.dataclass(frozen=True)
class _Spec:
    """One layer's spec: what vLLM compares to group layers."""

    kind: str
    window: int
    block_size: int
    page_bytes: int  # as padded
    real_page_bytes: int

    def resized(self, page_bytes: int) -> _Spec:
        """This spec with ``page_bytes`` pages: a larger block where the page divides it, else
        padded (a state page is always padded; an MLA page cannot be)."""
        if page_bytes == self.page_bytes:
            return self
        if self.kind not in STATE_KINDS and page_bytes % self.page_bytes == 0:
            ratio = page_bytes // self.page_bytes
            return dataclasses.replace(
                self, block_size=self.block_size * ratio, page_bytes=page_bytes, real_page_bytes=page_bytes
            )
        if self.kind == MLA:
            raise KvbenchError(
                f"vLLM cannot make an MLA page of {self.page_bytes:,} B match {page_bytes:,} B "
                "(unify_kv_cache_spec_page_size pads only non-MLA attention and state pages)"
            )
        return dataclasses.replace(self, page_bytes=page_bytes)


def _mamba_block_size(
    geometry: ModelGeometry, kv_dtype: str, block_size: int, tp: int, kernel_block_size: int
) -> tuple[int, int]:
    """vLLM's attention block size beside state layers, and the state page padded to match it."""
    assert geometry.state is not None
    state_page = geometry.state.bytes_per_layer(tp)
    per_token = geometry.layer_bytes_per_token(MLA if MLA in geometry.kinds else FULL, kv_dtype, tp)
    align = max(kernel_block_size, block_size)
    if MLA in geometry.kinds:
        align = max(align, MLA_MAMBA_ALIGNMENT)
    attn = align * cdiv(state_page, align * per_token)
    attn = kernel_block_size * cdiv(attn, kernel_block_size)
    block_size = max(block_size, attn)
    return block_size, max(state_page, block_size * per_token)


def _layer_specs(
    geometry: ModelGeometry,
    kv_dtype: str,
    block_size: int,
    max_model_len: int,
    tp: int,
    kernel_block_size: int,
    prefix_caching: bool,
) -> tuple[list[_Spec], int]:
    """Each layer's spec, and the attention block size after the Mamba rule."""
    state_page = padded_state = 0
    if geometry.state is not None:
        state_page = geometry.state.bytes_per_layer(tp)
        padded_state = state_page
        if any(kind not in STATE_KINDS for kind in geometry.kinds):
            block_size, padded_state = _mamba_block_size(geometry, kv_dtype, block_size, tp, kernel_block_size)
    # A sliding layer takes the largest kernel block the backend runs within the primary page.
    sliding_block = max(kernel_block_size, block_size // kernel_block_size * kernel_block_size)
    state_block = block_size if prefix_caching else max_model_len
    specs = []
    for kind, window in geometry.per_layer():
        if kind in STATE_KINDS:
            specs.append(_Spec(kind, 0, state_block, padded_state, state_page))
            continue
        bs = sliding_block if kind == SLIDING else block_size
        page = bs * geometry.layer_bytes_per_token(kind, kv_dtype, tp)
        specs.append(_Spec(kind, window, bs, page, page))
    return specs, block_size


def _promote(specs: list[_Spec]) -> list[_Spec]:
    """The hybrid manager off: sliding and chunked layers sized as full attention where the model
    has full attention (MLA counts), and one spec for all layers, or vLLM's refusal."""
    if len(set(specs)) == 1:
        return specs
    full = [s for s in specs if s.kind in (FULL, MLA)]
    if full and any(s.kind in (SLIDING, CHUNKED) for s in specs):
        bs = full[0].block_size
        specs = [
            _Spec(FULL, 0, bs, bs * s.page_bytes // s.block_size, bs * s.page_bytes // s.block_size)
            if s.kind in (SLIDING, CHUNKED)
            else s
            for s in specs
        ]
    if len(set(specs)) != 1:
        kinds = ", ".join(dict.fromkeys(s.kind for s in specs))
        raise KvbenchError(
            f"with the hybrid KV cache manager off vLLM refuses a model of {kinds} layers: "
            f'"{PROMOTE_FAILED}" (state layers cannot be sized as full attention)'
        )
    return specs


def _groups(specs: list[_Spec]) -> list[tuple[_Spec, tuple[int, ...], int]]:
    """(spec, layers, padding layers) per group, in vLLM's order: one group for one spec, else
    equal pages, then layers of each spec split into groups of the common size."""
    if len(set(specs)) == 1:
        return [(specs[0], tuple(range(len(specs))), 0)]
    page = max(s.page_bytes for s in specs)
    specs = [s.resized(page) for s in specs]
    buckets: dict[_Spec, list[int]] = {}
    for i, s in enumerate(specs):
        buckets.setdefault(s, []).append(i)
    sizes = [len(v) for v in buckets.values()]
    size = max(sizes) if max(sizes) < min(sizes) * 1.5 else min(sizes)
    out = []
    for spec, layers in buckets.items():
        n = cdiv(len(layers), size)
        for i in range(n):
            group = tuple(layers[i::n])
            out.append((spec, group, size - len(group)))
    return out


def kv_layout(
    geometry: ModelGeometry,
    kv_dtype: str,
    block_size: int,
    *,
    max_model_len: int,
    hybrid: bool = True,
    max_num_batched_tokens: int = 2048,
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    prefix_caching: bool = False,
    kernel_block_size: int = 1,
) -> KVLayout:
    """The KV cache groups and block pool vLLM forms for ``geometry``.

    ``hybrid`` is vLLM's hybrid KV cache manager (``not disable_hybrid_kv_cache_manager``).
    ``kernel_block_size`` is the attention backend's smallest kernel block, which a block size
    is a multiple of (32 for vLLM's CPU attention; 1 leaves the block size as given).
    ``max_num_batched_tokens`` (per step; one step in flight per pipeline stage) bounds what
    sliding and chunked groups admit. One-line ``KvbenchError`` where vLLM refuses."""
    tp, pp = tensor_parallel_size, pipeline_parallel_size
    for name, value in (
        ("block_size", block_size),
        ("max_model_len", max_model_len),
        ("kernel_block_size", kernel_block_size),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise KvbenchError(f"{name} must be a positive integer, got {value!r}")
    geometry.check_parallel(tp, pp)
    specs, attn_block = _layer_specs(
        geometry, kv_dtype, block_size, max_model_len, tp, kernel_block_size, prefix_caching
    )
    if not hybrid:
        specs = _promote(specs)
    in_flight = pp * max_num_batched_tokens
    groups = []
    for spec, layers, padding in _groups(specs):
        cap = None
        if spec.kind == SLIDING:
            cap = cdiv(min(spec.window - 1 + in_flight, max_model_len), spec.block_size) + 1
        elif spec.kind == CHUNKED:
            cap = cdiv(min(spec.window + in_flight, max_model_len), spec.block_size)
        groups.append(
            KVGroup(
                spec.kind, layers, padding, spec.window, spec.block_size, spec.page_bytes, spec.real_page_bytes, cap
            )
        )
    stages = geometry.stage_layers(pp)
    stage_bytes = tuple(max(g.page_bytes * sum(1 for i in g.layers if i in stage) for g in groups) for stage in stages)
    scheduler_block = attn_block if len(groups) == 1 else math.lcm(*(g.block_size for g in groups))
    return KVLayout(
        hybrid=hybrid,
        groups=tuple(groups),
        block_size=attn_block,
        scheduler_block_size=scheduler_block,
        stage_bytes_per_block=stage_bytes,
        mamba_cache_mode="align" if prefix_caching else "none",
        kv_bytes_per_token_by_kind=tuple(geometry.kv_bytes_per_token_by_kind(kv_dtype, tp, pp).items()),
        state_bytes_per_request=geometry.state_bytes_per_request(tp, pp),
    )
