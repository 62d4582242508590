"""``kvbench workload make|show``.

Importing this module must stay cheap (the CLI imports every command module to
build its parser), so numpy/pandas load inside the command functions only.
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from pathlib import Path
from typing import Any

from ...harness.errors import KvbenchError
from ...harness.files import MAX_SUITE_BYTES, read_text_capped
from ...harness.records.safe_paths import nonempty_path, nonempty_text, output_file
from ...harness.spec.workload_spec import ARRIVALS, FIELD_KINDS, LENGTH_FAMILIES, SOURCES, WorkloadSpec
from .base import Command, OneLineParser

_TYPES = {"int": int, "float": float, "str": str}
_CHOICES = {"source": SOURCES, "arrival": ARRIVALS, "lengths": LENGTH_FAMILIES}
_HELP = {
    "source": "where lengths come from (default fixed)",
    "num_requests": "requests to generate (synthetic sources; default 100)",
    "duration_s": "with a rate: generate rate x duration_s requests instead of num_requests",
    "prompt_len": "fixed: prompt tokens (default 128)",
    "output_len": "fixed: output tokens (default 128)",
    "prompt_min": "uniform: smallest prompt, inclusive (default 1)",
    "prompt_max": "uniform: largest prompt, inclusive (default 512)",
    "output_min": "uniform: smallest output, inclusive (default 1)",
    "output_max": "uniform: largest output, inclusive (default 512)",
    "prompt_mean": "lognormal: mean prompt tokens (default 256)",
    "output_mean": "lognormal: mean output tokens (default 256)",
    "sigma": "lognormal: sigma of the underlying normal (default 1.0)",
    "path": "trace / sharegpt-json: the file (.csv, .parquet, .jsonl; .json for sharegpt-json)",
    "hash_block_size": "trace with hash_ids (Mooncake JSONL): tokens per hash id (default 512)",
    "num_sessions": "sessions: conversations to generate (default 16)",
    "turns": "sessions: requests per conversation (default 4)",
    "think_time_s": "sessions: seconds between an answer's end and the next turn (default 0)",
    "lengths": "sessions: length family of prompts, messages and answers (default fixed)",
    "message_len": "sessions, lengths fixed: tokens of each new user message (default 64)",
    "message_min": "sessions, lengths uniform: smallest new message, inclusive (default 1)",
    "message_max": "sessions, lengths uniform: largest new message, inclusive (default 128)",
    "message_mean": "sessions, lengths lognormal: mean new message tokens (default 64)",
    "limit": "trace / sharegpt-json: use the first N requests",
    "arrival": "arrival process (default batch: all at t=0)",
    "rate": "poisson / gamma: requests per second",
    "cv": "gamma: coefficient of variation of the gaps (default 1.0)",
    "time_scale": "trace arrivals: multiply the trace's times by this (default 1.0)",
    "prefix_groups": "number of groups sharing a prompt prefix (default 0)",
    "prefix_len": "tokens of prefix shared within each group",
    "n": "parallel samples per request (default 1)",
    "seed": "random seed (default 0)",
    "max_prompt_len": "clamp prompts to at most this many tokens",
    "max_output_len": "clamp outputs to at most this many tokens",
}
_METAVARS = {"int": "N", "float": "X", "str": "TEXT"}


def configure(parser: argparse.ArgumentParser) -> None:
    """``make`` and ``show`` under ``workload``."""
    actions = parser.add_subparsers(dest="workload_action", metavar="ACTION", parser_class=OneLineParser)
    parser.set_defaults(workload_parser=parser)  # for ``run``: no action given prints this parser's help

    make = actions.add_parser(
        "make",
        help="write a workload Parquet file and print its id",
        description="Build a workload from --suite's [workload] table and/or flags "
        "(flags win) and write it as Parquet.",
    )
    make.add_argument(
        "--out",
        required=True,
        type=nonempty_path,
        metavar="FILE.parquet",
        help="where to write the workload (a new file, or a regular file it replaces)",
    )
    make.add_argument(
        "--suite",
        type=nonempty_text,
        metavar="SUITE.toml",
        help="take [workload] and [memory].max_model_len from a suite",
    )
    spec_flags = make.add_argument_group("workload spec (see WorkloadSpec; each overrides the suite)")
    for name, (kind, _optional) in FIELD_KINDS.items():
        spec_flags.add_argument(
            "--" + name.replace("_", "-"),
            dest=f"spec_{name}",
            type=_TYPES[kind],
            default=None,
            choices=_CHOICES.get(name),
            help=_HELP[name],
            metavar=None if name in _CHOICES else ("FILE" if name == "path" else _METAVARS[kind]),
        )
    make.add_argument(
        "--max-model-len",
        type=int,
        metavar="N",
        help="drop requests with prompt_len + output_len > N (counted, reported)",
    )
    make.set_defaults(func=cmd_make)

    show = actions.add_parser(
        "show",
        help="summarise a workload file",
        description="Lengths, arrivals and tokens of a workload; raw KV bytes with a model.",
    )
    show.add_argument("file", type=nonempty_text, metavar="FILE", help="a workload Parquet file")
    model = show.add_mutually_exclusive_group()
    model.add_argument(
        "--model", type=nonempty_text, metavar="PRESET", help="model preset for raw KV bytes (e.g. opt-13b)"
    )
    model.add_argument(
        "--config", type=nonempty_text, metavar="config.json", help="Hugging Face config.json for raw KV bytes"
    )
    show.add_argument("--kv-dtype", metavar="DTYPE", help="KV cache dtype with --model/--config (default fp16)")
    show.add_argument("--json", action="store_true", help="print one JSON object")
    show.set_defaults(func=cmd_show)


def run(args: argparse.Namespace) -> int:
    """``kvbench workload`` without an action: its help on stderr, exit 2."""
    args.workload_parser.print_help(sys.stderr)
    return 2


def load_suite_workload(path: str | Path) -> tuple[dict[str, Any], int | None, list[str]]:
    """A suite's ``[workload]`` table, ``[memory].max_model_len`` and the ``[grid]`` keys that name spec fields."""
    p = Path(path)
    try:
        data = tomllib.loads(read_text_capped(p, "suite file", MAX_SUITE_BYTES, f"suite {p}"))
    except FileNotFoundError:
        raise KvbenchError(f"suite {p}: no such file") from None
    except OSError as exc:
        raise KvbenchError(f"suite {p}: cannot read ({exc.strerror or exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise KvbenchError(f"{p}: malformed TOML: {exc}") from None  # message carries line and column
    table = data.get("workload", {})
    if not isinstance(table, dict):
        raise KvbenchError(f"{p}: [workload] must be a table")
    memory = data.get("memory", {})
    if not isinstance(memory, dict):
        raise KvbenchError(f"{p}: [memory] must be a table")
    max_model_len = memory.get("max_model_len")
    if max_model_len is not None and (
        isinstance(max_model_len, bool) or not isinstance(max_model_len, int) or max_model_len < 1
    ):
        raise KvbenchError(f"{p}: [memory] max_model_len must be an integer >= 1, got {max_model_len!r}")
    grid = data.get("grid", {})
    grid_keys = [k for k in grid if k in FIELD_KINDS] if isinstance(grid, dict) else []
    return dict(table), max_model_len, grid_keys


def cmd_make(args: argparse.Namespace) -> int:
    from ...workloads.reads import build_noting_reads
    from ...workloads.table import write_workload
    from ..key_use import workload_key_why

    output_file(args.out, "--out")  # before building: a device, a FIFO or a folder is refused at once
    table: dict[str, Any] = {}
    max_model_len: int | None = None
    grid_keys: list[str] = []
    flags = {name: getattr(args, f"spec_{name}") for name in FIELD_KINDS if getattr(args, f"spec_{name}") is not None}
    if args.suite:
        table, max_model_len, grid_keys = load_suite_workload(args.suite)
        ignored = [k for k in grid_keys if k not in flags]
        if ignored:
            print(
                f"kvbench workload: note: {args.suite}: [grid] keys {', '.join(ignored)} are ignored here; "
                "the workload comes from [workload] and the flags",
                file=sys.stderr,
            )
        spec = WorkloadSpec.from_mapping({**table, **flags}, where=str(args.suite))
    else:
        spec = WorkloadSpec(**flags)
    if args.max_model_len is not None:
        max_model_len = args.max_model_len
    workload, read = build_noting_reads(spec, max_model_len)
    # As in a suite, a setting the build does not read is refused, not ignored: each flag, and each
    # [workload] key of a suite that sweeps none of them in [grid] (there a key may be another cell's).
    given = [(f"--{k.replace('_', '-')}", k) for k in flags]
    if args.suite and not grid_keys:
        given += [(f"{args.suite}: [workload] {k}", k) for k in table if k not in flags]
    for name, key in given:
        if key not in read:
            raise KvbenchError(f"{name} is not read: {workload_key_why(key, spec, read)}")
    out = write_workload(workload, args.out)
    if workload.dropped:
        total = workload.num_requests + workload.dropped
        print(
            f"kvbench workload: note: dropped {workload.dropped} of {total} requests with "
            f"prompt_len + output_len > max_model_len {max_model_len}",
            file=sys.stderr,
        )
    if workload.raised:
        print(
            f"kvbench workload: note: raised {workload.raised} sampled prompt(s) to prefix_len + 1 = "
            f"{spec.prefix_len + 1} tokens (each request computes a token of its own)",
            file=sys.stderr,
        )
    print(f"wrote        {out}")
    print(f"workload_id  {workload.workload_id}")
    print(f"requests     {workload.num_requests}")
    print(f"dropped      {workload.dropped}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from ...harness.spec.geometry import resolve_model
    from ...workloads.table import read_workload, summarize

    workload = read_workload(args.file)
    geometry = None
    if args.model is not None or args.config is not None:
        geometry = resolve_model(args.model, args.config)
    elif args.kv_dtype is not None:
        raise KvbenchError("--kv-dtype needs --model or --config")
    summary = summarize(workload, geometry, args.kv_dtype or "fp16")
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    else:
        print(format_summary(summary))
    return 0


def format_summary(s: dict[str, Any]) -> str:
    """Aligned plain text for ``summarize``'s dict."""
    from ...harness.spec.units import format_bytes

    def num(value: float) -> str:
        return f"{value:,.1f}"

    rows: list[tuple[str, str]] = [
        ("workload_id", s["workload_id"]),
        ("requests", f"{s['num_requests']:,} (dropped {s['dropped']:,})"),
    ]
    header = f"{'':>10} {'mean':>10} {'p50':>10} {'p90':>10} {'p99':>10} {'max':>10}"
    lengths = [header] + [
        f"{name:>10} " + " ".join(f"{num(s[name][k]):>10}" for k in ("mean", "p50", "p90", "p99", "max"))
        for name in ("prompt_len", "output_len")
    ]
    unit = "sessions/s" if "sessions" in s else "req/s"
    rate = "all at once" if s["rate_per_s"] is None else f"{s['rate_per_s']:.3f} {unit}"
    cv = "n/a" if s["burstiness_cv"] is None else f"{s['burstiness_cv']:.3f}"
    rows += [
        ("arrival span", f"{s['arrival_span_s']:.3f} s"),
        ("arrival rate", rate),
        ("burstiness", f"{cv} (CV of inter-arrival gaps)"),
        ("total tokens", f"{s['total_tokens']:,} (prompt + output) x n"),
        ("prefix groups", str(s["prefix_groups"])),
        ("max n", str(s["max_n"])),
    ]
    if "sessions" in s:
        rows.append(
            ("conversations", f"{s['sessions']:,} (up to {s['max_turns']} turns; rate and burstiness of starts)")
        )
    if "hash_ids" in s:
        rows.append(("hash ids", f"{s['hash_ids']['total']:,} ({s['hash_ids']['distinct']:,} distinct)"))
    if "model" in s:
        rows += [
            ("model", f"{s['model']} ({s['kv_dtype']}, {s['kv_bytes_per_token']:,} bytes/token)"),
            ("raw KV total", f"{format_bytes(s['raw_kv_bytes_total'])} ({s['raw_kv_bytes_total']:,} bytes)"),
            (
                "raw KV largest",
                f"{format_bytes(s['raw_kv_bytes_largest_request'])} "
                f"({s['raw_kv_bytes_largest_request']:,} bytes, one request)",
            ),
        ]
    rows.append(("spec", s["spec"]))
    width = max(len(label) for label, _ in rows)
    head = [f"{label:<{width}}  {value}" for label, value in rows[:2]]
    tail = [f"{label:<{width}}  {value}" for label, value in rows[2:]]
    return "\n".join(head + lengths + tail)


COMMAND = Command(
    "workload",
    help="make or inspect workload files",
    description="Make a workload file from a spec or suite, or summarise one.",
    configure=configure,
    run=run,
)
