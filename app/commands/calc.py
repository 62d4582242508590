"""``kvbench calc``: the seed's block arithmetic, and what fits a KV budget.

A 35-token sequence in 16-token blocks needs 3 blocks = 48 positions, 13 of
them unused (27.1%). With a model, dtype and budget it also says how many
sequences of each length fit contiguously at ``max_model_len`` versus paged.
With ``--tp`` / ``--pp`` the bytes per token are one rank's (its share of the KV
heads and of the layers) and the budget is one GPU's.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ...harness.errors import KvbenchError
from ...harness.records.safe_paths import nonempty_text
from ...harness.spec.feasibility import levers
from ...harness.spec.geometry import ModelGeometry, kv_dtype_bytes, resolve_model
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
    GPU budget under tensor / pipeline parallelism: every rank holds its slice of every sequence)."""
    per_token = geometry.kv_bytes_per_token(kv_dtype, tp, pp)
    positions = budget_bytes // per_token
    blocks = positions // row["block_size"]
    return {
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
    p.add_argument("--model", type=nonempty_text, help="preset name (see `kvbench doctor`) or a config.json path")
    p.add_argument("--kv-dtype", default="fp16")
    p.add_argument("--budget", help="KV budget such as 12GiB, 40GB or bytes (per GPU with --tp / --pp)")
    p.add_argument("--tp", type=int, default=1, metavar="N", help="tensor parallel size: KV heads split across N ranks")
    p.add_argument(
        "--pp", type=int, default=1, metavar="N", help="pipeline parallel size: layers split across N stages"
    )
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--workload", type=nonempty_text, help="a workload Parquet file: does its raw KV fit the budget?")
    p.add_argument("--json", action="store_true", help="print a JSON list of objects")


def _geometry(model: str) -> ModelGeometry:
    if model.endswith(".json") or "/" in model:
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
    if args.model or args.budget or args.workload:
        if not (args.model and args.budget):
            raise KvbenchError("--model and --budget go together (and --workload needs both)")
        geometry = _geometry(args.model)
        geometry.check_parallel(args.tp, args.pp)
        kv_dtype_bytes(args.kv_dtype)
        budget = parse_size(args.budget, "--budget")
        if args.max_model_len <= 0:
            raise KvbenchError(f"--max-model-len must be positive, got {args.max_model_len}")
        for r in rows:
            r.update(capacity(r, geometry, args.kv_dtype, budget, args.max_model_len, args.tp, args.pp))
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
    if "kv_bytes_per_token" in rows[0]:
        cols += [
            ("bytes_per_block", "bytes/block"),
            ("fit_contiguous_max", "fit contig@max"),
            ("fit_paged", "fit paged"),
        ]

    def fmt(k: str, v: Any) -> str:
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
        lines.insert(
            0,
            f"KV: {r['kv_bytes_per_token']:,} B/token{rank} ({format_bytes(r['kv_bytes_per_token'])}); "
            f"budget {format_bytes(r['budget_bytes'])}{gpu} = {r['budget_positions']:,} positions; "
            f"contiguous-max reserves {r['max_model_len']:,} positions per sequence",
        )
    return "\n".join(lines)


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
