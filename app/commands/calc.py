"""``kvbench calc``: the seed's block arithmetic, and what fits a KV budget.

A 35-token sequence in 16-token blocks needs 3 blocks = 48 positions, 13 of
them unused (27.1%). With a model, dtype and budget it also says how many
sequences of each length fit contiguously at ``max_model_len`` versus paged.
With ``--tp`` / ``--pp`` the bytes per token are one rank's (its share of the KV
heads and of the layers) and the budget is one GPU's. A model whose layers are not
all full attention (sliding window, chunked, MLA, state layers) also gets its bytes
per token per layer kind, its state per request, the KV cache groups vLLM forms
with its hybrid KV cache manager on, and what fits paged with the manager on and
off (``harness/spec/kv_layout.py``). With ``--cpu-offload SIZE`` it also says how many of the
model's blocks a CPU tier of KV memory of that size holds, as vLLM's KV offloading counts them
(``harness/spec/cpu_tier.py``).
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from ...harness.errors import KvbenchError
from ...harness.records.safe_paths import nonempty_text
from ...harness.spec.cpu_tier import PAGE_BYTES, cpu_block_bytes, cpu_tier_blocks, parse_cpu_offload
from ...harness.spec.feasibility import levers
from ...harness.spec.geometry import PRESETS, ModelGeometry, kv_dtype_bytes, resolve_model
from ...harness.spec.kv_layout import KVLayout, kv_layout
from ...harness.spec.layer_kinds import CHUNKED, STATE_KINDS
from ...harness.spec.units import format_bytes, parse_size
from .base import Command


def block_arithmetic(block_size: int, tokens: int) -> dict[str, Any]:
    if block_size <= 0:
        raise KvbenchError(f"--block-size must be a positive integer, got {block_size}")
    if tokens <= 0:
        raise KvbenchError(f"--tokens must be a positive integer, got {tokens}")
    blocks = -(-tokens // block_size)
    allocated = blocks * block_size
    unused = allocated - tokens
    return {
        "block_size": block_size,
        "tokens": tokens,
        "blocks": blocks,
        "allocated_positions": allocated,
        "unused_positions": unused,
        "waste_fraction": unused / allocated,
    }


def capacity(
    row: dict[str, Any],
    geometry: ModelGeometry,
    kv_dtype: str,
    budget_bytes: int,
    max_model_len: int,
    tp: int = 1,
    pp: int = 1,
) -> dict[str, Any]:
    """Budget figures and how many such sequences fit, contiguous-max vs paged (per rank and per
    GPU budget under tensor / pipeline parallelism: every rank holds its slice of every sequence).
    ``kv_bytes_per_token`` sizes every attention layer as full attention; a model with other
    layer kinds gets ``layout_fit``'s figures beside."""
    per_token = geometry.kv_bytes_per_token(kv_dtype, tp, pp)
    positions = budget_bytes // per_token
    blocks = positions // row["block_size"]
    out = {
        "tensor_parallel_size": tp,
        "pipeline_parallel_size": pp,
        "kv_heads_per_rank": geometry.kv_heads_per_rank(tp),
        "layers_per_rank": geometry.layers_per_stage(pp),
        "kv_bytes_per_token": per_token,
        "bytes_per_block": per_token * row["block_size"],
        "budget_bytes": budget_bytes,
        "budget_positions": positions,
        "budget_blocks": blocks,
        "max_model_len": max_model_len,
        "fit_contiguous_max": positions // max_model_len,
        "fit_paged": blocks // row["blocks"],
    }
    if not geometry.is_uniform_full:
        out.update(layout_fit(row, geometry, kv_dtype, budget_bytes, max_model_len, tp, pp))
    return out


def cpu_tier(
    row: dict[str, Any], geometry: ModelGeometry, kv_dtype: str, cpu_bytes: int, max_model_len: int
) -> dict[str, Any]:
    """How many blocks of ``row``'s block size a CPU tier of ``cpu_bytes`` holds (vLLM's KV
    offloading: each block rounded up to whole pages), and how many tokens of every layer that
    is. Over vLLM's KV cache groups (its hybrid manager on) a block is one group's (each group
    stores its own), so a token position takes a block per group."""
    bs = row["block_size"]
    groups = 1
    block = geometry.kv_bytes_per_token(kv_dtype) * bs
    if not geometry.is_uniform_full:
        layout = kv_layout(geometry, kv_dtype, bs, max_model_len=max_model_len, prefix_caching=True)
        groups, block = len(layout.groups), layout.bytes_per_block
    blocks = cpu_tier_blocks(cpu_bytes, block)
    return {
        "cpu_offload_bytes": cpu_bytes,
        "cpu_block_bytes": cpu_block_bytes(block),
        "cpu_blocks": blocks,
        "cpu_groups": groups,
        "cpu_tokens": blocks // groups * bs,
    }


def _paged_fit(layout: KVLayout, budget_bytes: int, tokens: int) -> int:
    return layout.num_blocks(budget_bytes) // layout.blocks_per_request(tokens)


def layout_fit(
    row: dict[str, Any], geometry: ModelGeometry, kv_dtype: str, budget_bytes: int, max_model_len: int, tp: int, pp: int
) -> dict[str, Any]:
    """For a model whose layers are not all full attention: bytes per token per kind, state per
    request, vLLM's KV cache groups with the hybrid manager on, and sequences of ``tokens`` that
    fit paged with it on and off (off: refused for state layers, with vLLM's reason).
    Contiguous-max reserves ``max_model_len`` positions in every attention layer and a state."""
    tokens = row["tokens"]
    kw: dict[str, Any] = dict(max_model_len=max_model_len, tensor_parallel_size=tp, pipeline_parallel_size=pp)
    on = kv_layout(geometry, kv_dtype, row["block_size"], hybrid=True, **kw)
    state = on.state_bytes_per_request
    out: dict[str, Any] = {
        "layer_kinds": {kind: geometry.layer_count(kind) for kind in geometry.kinds},
        "kv_bytes_per_token_by_kind": dict(on.kv_bytes_per_token_by_kind),
        "state_bytes_per_request": state,
        "groups": [
            {
                "kind": g.kind,
                "layers": len(g.layers),
                "padding_layers": g.padding_layers,
                "window": g.window,
                "block_size": g.block_size,
                "page_bytes": g.page_bytes,
                "blocks_held": g.blocks_held(tokens),
            }
            for g in on.groups
        ],
        "hybrid_bytes_per_block": on.bytes_per_block,
        "hybrid_block_size": on.block_size,
        "scheduler_block_size": on.scheduler_block_size,
        "hybrid_num_blocks": on.num_blocks(budget_bytes),
        "fit_contiguous_max": budget_bytes // (max_model_len * geometry.kv_bytes_per_token(kv_dtype, tp, pp) + state),
        "fit_paged_hybrid": _paged_fit(on, budget_bytes, tokens),
        # vLLM turns its hybrid manager off by default with chunked local attention (config/vllm.py).
        "vllm_default_hybrid": CHUNKED not in geometry.kinds,
    }
    try:
        off = kv_layout(geometry, kv_dtype, row["block_size"], hybrid=False, **kw)
        out["fit_paged_hybrid_off"] = _paged_fit(off, budget_bytes, tokens)
    except KvbenchError as exc:
        out["fit_paged_hybrid_off"] = None
        out["hybrid_off_refused"] = str(exc)
    out["fit_paged"] = out["fit_paged_hybrid"] if out["vllm_default_hybrid"] else out["fit_paged_hybrid_off"]
    return out


def workload_fit(
    path: str, geometry: ModelGeometry, kv_dtype: str, budget_bytes: int, tp: int = 1, pp: int = 1
) -> dict[str, Any]:
    """Does the workload's raw KV fit: all requests at full length, and its largest one? (One
    rank's KV against one GPU's budget under tensor / pipeline parallelism.)"""
    from ...workloads import read_workload

    w = read_workload(path)
    total, largest = w.raw_kv_bytes(geometry, kv_dtype, tp, pp)
    out: dict[str, Any] = {
        "workload": str(path),
        "workload_id": w.workload_id,
        "raw_kv_bytes": total,
        "largest_request_kv_bytes": largest,
        "budget_bytes": budget_bytes,
        "all_fit": total <= budget_bytes,
        "largest_fits": largest <= budget_bytes,
    }
    if total > budget_bytes:
        out["shortfall_bytes"] = total - budget_bytes
        out["levers"] = levers(geometry, kv_dtype, total, budget_bytes, tensor_parallel_size=tp)
    return out


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--block-size", type=int, action="append", required=True, metavar="N")
    p.add_argument("--tokens", type=int, action="append", required=True, metavar="N")
    p.add_argument(
        "--model",
        type=nonempty_text,
        help="preset name (see `kvbench doctor`), a config.json path or a model directory holding one",
    )
    p.add_argument("--kv-dtype", default="fp16")
    p.add_argument("--budget", help="KV budget such as 12GiB, 40GB or bytes (per GPU with --tp / --pp)")
    p.add_argument("--tp", type=int, default=1, metavar="N", help="tensor parallel size: KV heads split across N ranks")
    p.add_argument(
        "--pp", type=int, default=1, metavar="N", help="pipeline parallel size: layers split across N stages"
    )
    p.add_argument(
        "--max-model-len",
        type=int,
        help="what contiguous-max reserves per sequence (default: 2048, or the largest --tokens if longer)",
    )
    p.add_argument("--workload", type=nonempty_text, help="a workload Parquet file: does its raw KV fit the budget?")
    p.add_argument(
        "--cpu-offload",
        metavar="SIZE",
        help="a CPU tier of KV memory such as 16GiB (vLLM's --kv-offloading-size): how many of the model's "
        "blocks it holds (with --model and --budget)",
    )
    p.add_argument("--json", action="store_true", help="print a JSON list of objects")


def _geometry(model: str) -> ModelGeometry:
    """A preset by its name; otherwise a config.json, or a model directory holding one (a name
    that is neither a preset nor a path that exists is taken for a mistyped preset)."""
    if model not in PRESETS and (model.endswith(".json") or "/" in model or os.path.lexists(model)):
        return resolve_model(config=model)
    return resolve_model(preset_name=model)


def run(args: argparse.Namespace) -> int:
    rows = [block_arithmetic(b, t) for b in args.block_size for t in args.tokens]
    fit = None
    for flag, value in (("--tp", args.tp), ("--pp", args.pp)):
        if value <= 0:
            raise KvbenchError(f"{flag} must be a positive integer, got {value}")
    if (args.tp > 1 or args.pp > 1) and not args.model:
        raise KvbenchError("--tp and --pp need --model and --budget (they split a model's KV across GPUs)")
    cpu = None
    if args.cpu_offload is not None:
        cpu = parse_cpu_offload(args.cpu_offload, "--cpu-offload")
        if not cpu:
            raise KvbenchError(f"--cpu-offload {args.cpu_offload} is no CPU tier; give a size such as 16GiB")
        if not args.model:
            raise KvbenchError("--cpu-offload needs --model and --budget (it counts the model's KV blocks)")
        if args.tp > 1 or args.pp > 1:
            raise KvbenchError(
                "--cpu-offload is counted at --tp 1 and --pp 1 (kvbench mirrors vLLM's CPU tier of one rank)"
            )
    if args.model or args.budget or args.workload:
        if not (args.model and args.budget):
            raise KvbenchError("--model and --budget go together (and --workload needs both)")
        geometry = _geometry(args.model)
        geometry.check_parallel(args.tp, args.pp)
        kv_dtype_bytes(args.kv_dtype)
        budget = parse_size(args.budget, "--budget")
        longest = max(args.tokens)
        if args.max_model_len is None:
            args.max_model_len = max(2048, longest)
        if args.max_model_len <= 0:
            raise KvbenchError(f"--max-model-len must be positive, got {args.max_model_len}")
        if longest > args.max_model_len:
            raise KvbenchError(
                f"--tokens {longest} is longer than --max-model-len {args.max_model_len}: no such sequence is admitted"
            )
        for r in rows:
            r.update(capacity(r, geometry, args.kv_dtype, budget, args.max_model_len, args.tp, args.pp))
            if cpu:
                r.update(cpu_tier(r, geometry, args.kv_dtype, cpu, args.max_model_len))
        if args.workload:
            fit = workload_fit(args.workload, geometry, args.kv_dtype, budget, args.tp, args.pp)
    if args.json:
        print(json.dumps(rows + ([fit] if fit else []), indent=2))
        return 0
    print(render(rows))
    if fit:
        print(render_fit(fit))
    return 0


def render(rows: list[dict[str, Any]]) -> str:
    cols = [
        ("block_size", "block"),
        ("tokens", "tokens"),
        ("blocks", "blocks"),
        ("allocated_positions", "allocated"),
        ("unused_positions", "unused"),
        ("waste_fraction", "waste"),
    ]
    layout = "groups" in rows[0]
    if "kv_bytes_per_token" in rows[0]:
        cols += [("bytes_per_block", "bytes/block"), ("fit_contiguous_max", "fit contig@max")]
        if layout:
            cols += [("fit_paged_hybrid_off", "fit paged, hybrid off"), ("fit_paged_hybrid", "fit paged, hybrid on")]
        else:
            cols += [("fit_paged", "fit paged")]

    def fmt(k: str, v: Any) -> str:
        if v is None:
            return "refused"
        if k == "waste_fraction":
            return f"{100 * v:.1f}%"
        if k == "bytes_per_block":
            return format_bytes(v)
        return f"{v:,}"

    table = [[label for _, label in cols]] + [[fmt(k, r[k]) for k, _ in cols] for r in rows]
    widths = [max(len(t[i]) for t in table) for i in range(len(cols))]
    lines = ["  ".join(v.rjust(w) for v, w in zip(t, widths)) for t in table]
    r = rows[0]
    if "kv_bytes_per_token" in r:
        tp, pp = r["tensor_parallel_size"], r["pipeline_parallel_size"]
        rank = (
            f" per rank (TP {tp} × PP {pp}: {r['kv_heads_per_rank']} KV heads × {r['layers_per_rank']} layers per rank)"
            if tp * pp > 1
            else ""
        )
        gpu = " per GPU" if rank else ""
        view = " with every attention layer sized as full attention (vLLM's hybrid KV cache manager off)"
        lines[:0] = [
            f"KV: {r['kv_bytes_per_token']:,} B/token{rank}{view if layout else ''} "
            f"({format_bytes(r['kv_bytes_per_token'])}); "
            f"budget {format_bytes(r['budget_bytes'])}{gpu} = {r['budget_positions']:,} positions; "
            f"contiguous-max reserves {r['max_model_len']:,} positions per sequence",
            *(render_layout(r) if layout else []),
        ]
    if "cpu_blocks" in r:
        lines += render_cpu_tier(rows)
    return "\n".join(lines)


def render_cpu_tier(rows: list[dict[str, Any]]) -> list[str]:
    """A line per block size: the blocks and tokens a CPU tier holds."""
    firsts = {r["block_size"]: r for r in rows}
    lines = []
    for bs, r in firsts.items():
        groups = r["cpu_groups"]
        each = f"one KV cache group's, {r['cpu_block_bytes']:,} B" if groups > 1 else f"{r['cpu_block_bytes']:,} B each"
        per = f" ({groups} groups a token)" if groups > 1 else ""
        lines.append(
            f"CPU tier {format_bytes(r['cpu_offload_bytes'])}: {r['cpu_blocks']:,} blocks of {bs:,} tokens "
            f"({each}, in whole {PAGE_BYTES:,}-B pages) = {r['cpu_tokens']:,} tokens{per}"
        )
    return lines


def render_layout(r: dict[str, Any]) -> list[str]:
    """The lines that say how a model with other layer kinds than full attention is kept."""
    by_kind = r["kv_bytes_per_token_by_kind"]
    windows = {g["kind"]: g["window"] for g in r["groups"] if g["window"]}
    kinds = ", ".join(
        f"{n} {k}" + (f" (window {windows[k]:,})" if k in windows else "") for k, n in r["layer_kinds"].items()
    )
    lines = [f"layers: {kinds}; KV per token: " + ", ".join(f"{k} {b:,} B" for k, b in by_kind.items())]
    if r["state_bytes_per_request"]:
        states = ", ".join(k for k in r["layer_kinds"] if k in STATE_KINDS)
        lines.append(
            f"state: {r['state_bytes_per_request']:,} B ({format_bytes(r['state_bytes_per_request'])}) per request "
            f"in its {states} layers, whatever its length"
        )
    shapes: dict[tuple[str, int, int, int], int] = {}
    for g in r["groups"]:
        key = (g["kind"], g["layers"], g["page_bytes"], g["block_size"])
        shapes[key] = shapes.get(key, 0) + 1
    groups = "; ".join(
        f"{n} × {kind} of {layers} layers, {format_bytes(page)} pages of {bs:,} tokens"
        for (kind, layers, page, bs), n in shapes.items()
    )
    lines.append(
        f"hybrid manager on: {len(r['groups'])} KV cache group{'s' if len(r['groups']) > 1 else ''} ({groups}); "
        f"one block id = "
        f"{format_bytes(r['hybrid_bytes_per_block'])} across them, {r['hybrid_num_blocks']:,} in the budget; "
        f"scheduler block {r['scheduler_block_size']:,}; a {r['tokens']:,}-token request holds "
        + " + ".join(str(g["blocks_held"]) for g in r["groups"])
        + " blocks"
    )
    if r.get("hybrid_off_refused"):
        lines.append(f"hybrid manager off: {r['hybrid_off_refused']}")
    if not r["vllm_default_hybrid"]:
        lines.append("vLLM's default for this model: hybrid manager off (it turns it off for chunked local attention)")
    return lines


def render_fit(fit: dict[str, Any]) -> str:
    lines = [
        f"workload {fit['workload_id']}: raw KV {format_bytes(fit['raw_kv_bytes'])} for all requests at full "
        f"length, largest request {format_bytes(fit['largest_request_kv_bytes'])}; budget "
        f"{format_bytes(fit['budget_bytes'])}"
    ]
    if fit["all_fit"]:
        lines.append("fits: every request can be resident at once")
    else:
        lines.append(
            f"does not fit all at once: short by {format_bytes(fit['shortfall_bytes'])} "
            f"(requests will queue or be preempted)"
        )
        if not fit["largest_fits"]:
            lines.append("infeasible: the largest request alone exceeds the budget")
        lines.extend(f"  lever: {lv}" for lv in fit["levers"])
    return "\n".join(lines)


COMMAND = Command(
    "calc",
    help="block arithmetic and KV budget capacity",
    description="Blocks, allocated and unused positions for token counts and block "
    "sizes; with a model, dtype and budget, what fits.",
    configure=configure,
    run=run,
)
